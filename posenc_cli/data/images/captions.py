"""Captions: a procedural text + image task, a one-word caption and a direction scene; the
label says whether the caption is true.

The scene is the direction task's (``direction.py``): a square and a plus-shaped cross, the
relation of the cross to the square drawn uniformly from left, right, above and below, before the
label and independently of it. The caption is one word of ``WORDS``, the same four: a ``true``
item (label 1) names the scene's relation, a ``false`` one (label 0) one of the other three,
uniformly. So the word alone, and the scene alone, say nothing about the label; only reading
both does, and reading the scene needs the patches' places.

The caption reaches the model as word ids next to the image; the ViT embeds them as tokens after
the class token (``models/clip_layout.py`` gives them positions: counted in front of the image on
every axis, by M-RoPE's rule, for N-D encodings; prefix tokens for 2D ones; the flattened index
for 1D ones).

A first form with three-word captions (``cross left-of square``, where word order decides) sat
at chance for every encoding tried (irpe_nd and t5, 8,000 scenes, 12 and 24 epochs, class token
or mean read): the training loss never left ln 2. One word is the form the issue names.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from posenc_cli.data.images.direction import CLASSES as RELATIONS
from posenc_cli.data.images.direction import geometry, make_scene, render
from posenc_cli.data.images.procedural import ProceduralImages

CLASSES = ["false", "true"]
WORDS = list(RELATIONS)  # the caption: where the cross lies from the square
CAPTION_LENGTH = 1


def encode(caption: tuple[str, ...]) -> Tensor:
    return torch.tensor([WORDS.index(w) for w in caption], dtype=torch.long)


class CaptionedScenes(ProceduralImages):
    """``count`` (scene, caption) pairs of one split: items ``((image, word ids), label)``."""

    classes = CLASSES
    words = WORDS
    name = "captions"

    def __init__(self, count, image_size, seed, split, transform=None) -> None:
        super().__init__(count, seed, split, transform)
        self.geometry = geometry(image_size)

    def draw(self, rng: np.random.Generator, label: int) -> Tensor:
        return self.pair(rng, label)[0]

    def pair(self, rng: np.random.Generator, label: int) -> tuple[Tensor, tuple[str, ...]]:
        relation = int(rng.integers(len(RELATIONS)))  # drawn before the caption, label-free
        scene = make_scene(rng, self.geometry, relation)
        image = render(scene, self.geometry.image_size, rng)
        if label == 1:
            return image, (RELATIONS[relation],)
        others = [r for r in RELATIONS if r != RELATIONS[relation]]
        return image, (others[int(rng.integers(len(others)))],)

    def __getitem__(self, index: int) -> tuple[tuple[Tensor, Tensor], int]:
        label = index % len(CLASSES)
        image, caption = self.pair(self.rng(index), label)
        if self.transform is not None:
            image = self.transform(image)
        return (image, encode(caption)), label
