"""The text task: a small causal LM (or a bidirectional classifier) on a generated algorithmic
task or a character corpus. ``schema`` holds its recipe sections, ``train`` its step loop and
``evaluate`` the scoring per length; the backbone is ``models/text.py`` and the data
``data/``, which other layers (profiling) use too."""
