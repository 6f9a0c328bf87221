"""Object detection: a DETR-lite model, Hungarian matching, losses, data and COCO evaluation."""
