"""Captions: a procedural text + image task, a short caption and a direction scene; the label
says whether the caption is true.

The scene is the direction task's (``direction.py``): a square and a plus-shaped cross, the
relation of the cross to the square drawn uniformly from left, right, above and below, before the
label and independently of it. The caption is three words, ``SUBJECT RELATION OBJECT`` over the
vocabulary ``WORDS``: ``cross left-of square`` and ``square right-of cross`` say the same thing.
For every scene exactly two of the eight captions are true; a ``true`` item (label 1) takes one of
them, a ``false`` item (label 0) one of the other six, uniformly.

Why word order and the layout of the scene are both needed: ``square left-of cross`` and ``cross
left-of square`` hold the same words and only one is true, so a model that reads the caption as
a bag of words is capped below 100 %, and so is one that cannot place the patches (the scene's
relation is the direction task's signal). The caption reaches the model as word ids next to the
image; the ViT embeds them as tokens after the class token (``models/clip_layout.py`` gives them
positions: counted in front of the image on every axis, by M-RoPE's rule, for N-D encodings;
prefix tokens for 2D ones; the flattened index for 1D ones).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from posenc_cli.data.images.direction import CLASSES as RELATIONS
from posenc_cli.data.images.direction import geometry, make_scene, render
from posenc_cli.data.images.procedural import ProceduralImages

CLASSES = ["false", "true"]
WORDS = ["square", "cross", "left-of", "right-of", "above", "below"]
CAPTION_LENGTH = 3
# the word for "the cross is <relation> the square", and the one for the converse
RELATION_WORD = {"left": "left-of", "right": "right-of", "above": "above", "below": "below"}
CONVERSE = {"left-of": "right-of", "right-of": "left-of", "above": "below", "below": "above"}
CAPTIONS = [
    (subject, relation, "cross" if subject == "square" else "square")
    for subject in ("cross", "square")
    for relation in ("left-of", "right-of", "above", "below")
]


def true_captions(relation: str) -> list[tuple[str, str, str]]:
    """The two captions that describe a scene whose cross is ``relation`` of the square."""
    word = RELATION_WORD[relation]
    return [("cross", word, "square"), ("square", CONVERSE[word], "cross")]


def encode(caption: tuple[str, ...]) -> Tensor:
    return torch.tensor([WORDS.index(w) for w in caption], dtype=torch.long)


class CaptionedScenes(ProceduralImages):
    """``count`` (scene, caption) pairs of one split: items ``((image, word ids), label)``."""

    classes = CLASSES
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
        right = true_captions(RELATIONS[relation])
        pool = right if label == 1 else [c for c in CAPTIONS if c not in right]
        return image, pool[int(rng.integers(len(pool)))]

    def __getitem__(self, index: int) -> tuple[tuple[Tensor, Tensor], int]:
        label = index % len(CLASSES)
        image, caption = self.pair(self.rng(index), label)
        if self.transform is not None:
            image = self.transform(image)
        return (image, encode(caption)), label
