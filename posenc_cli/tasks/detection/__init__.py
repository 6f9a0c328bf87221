"""The detection task: a DETR-lite model, Hungarian matching, losses, data and COCO evaluation,
with ``schema``, ``train`` and ``evaluate`` as every task has. Its model and data live here
rather than in ``models/`` and ``data/`` because nothing but this task uses them."""
