"""Chirps: a procedural audio-like task on spectrograms, whose label is the order of two events.

A spectrogram has ``BANDS`` frequency rows (row 0 the highest band) and ``length`` time columns
(``data.image_size``), one channel. Each holds two chirps, one rising and one falling: a line
that moves one band per time step over ``duration`` steps, two rows thick, on noise. The label
says which comes first: ``rise-first`` or ``fall-first`` (``CLASSES``).

Why order in time is the signal: both chirps are in every spectrogram, and their durations,
bands, loudness and the two time slots they fill are drawn before the label and independently
of it; the label only says which chirp fills the earlier slot. So a bag of patches, or patches
that know only their band, are at chance: the time order is the one cue.

Time extrapolation: the chirps' shapes do not depend on ``length`` (durations ``MIN_DURATION``
to ``MAX_DURATION`` steps at any length), so a longer clip is the same events in a longer
recording, farther apart on average. Evaluating at ``eval.sizes`` longer than the trained
``image_size`` tests whether an encoding carries "earlier than" to distances it never saw.
Items are made on access (``procedural.py``); nothing is downloaded.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from posenc_cli.data.images.procedural import ProceduralImages
from posenc_cli.errors import UsageError

CLASSES = ["rise-first", "fall-first"]
BANDS = 16  # frequency rows, the same at every length
MIN_DURATION, MAX_DURATION = 4, 8  # time steps of one chirp; it moves one band per step
GAP = 2  # at least this many empty steps between the two chirps
NOISE_STD = 0.05


def check_length(length: int) -> None:
    if length < 2 * MAX_DURATION + GAP:
        raise UsageError(
            f"data.image_size: chirps needs at least {2 * MAX_DURATION + GAP} time steps for two "
            f"chirps and the gap between them, got {length}"
        )


class ChirpSpectrograms(ProceduralImages):
    """``count`` spectrograms ``(1, BANDS, length)`` of one split, made on access."""

    classes = CLASSES
    name = "chirps"

    def __init__(self, count, length, seed, split, transform=None) -> None:
        super().__init__(count, seed, split, transform)
        check_length(length)
        self.length = length

    def slots(self, rng: np.random.Generator, durations: np.ndarray) -> tuple[int, int]:
        """Starts of the earlier and the later slot, uniform over the pairs that fit with at
        least ``GAP`` steps between them: the earlier start weighted by how many later starts
        it leaves, then the later one uniform among those."""
        first, second = int(durations[0]), int(durations[1])
        earliest_second = np.arange(self.length - first - second - GAP + 1) + first + GAP
        choices = self.length - second - earliest_second + 1  # later starts left by each start
        a = int(rng.choice(len(choices), p=choices / choices.sum()))
        return a, int(rng.integers(earliest_second[a], self.length - second + 1))

    def draw(self, rng: np.random.Generator, label: int) -> Tensor:
        durations = rng.integers(MIN_DURATION, MAX_DURATION + 1, size=2)  # earlier, later slot
        loudness = rng.uniform(0.6, 1.0, size=2)
        floor = float(rng.uniform(0.0, 0.2))
        lowest = [int(rng.integers(0, BANDS - int(d) - 1)) for d in durations]  # top row reach
        starts = self.slots(rng, durations)
        rising_first = label == 0
        image = floor + rng.normal(0.0, NOISE_STD, size=(1, BANDS, self.length))
        for slot in range(2):
            rising = rising_first == (slot == 0)
            d, start, low = int(durations[slot]), starts[slot], lowest[slot]
            for step in range(d):
                band = low + (d - 1 - step if rising else step)  # rising: row falls, pitch rises
                image[0, band : band + 2, start + step] = loudness[slot]
        return torch.from_numpy(np.clip(image, 0.0, 1.0).astype(np.float32))
