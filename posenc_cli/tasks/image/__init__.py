"""The image task: DeiT-style ViTs on timm. ``schema`` holds its recipe sections, ``train`` the
epoch loop and ``evaluate`` the scoring per image side and shift; the backbone is
``models/vit.py`` and the data ``data/images/``."""
