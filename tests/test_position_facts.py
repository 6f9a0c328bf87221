"""The facts about positions and masks that choose the attention module's paths."""

from __future__ import annotations

import torch

from posenc_cli.kernels.positions import increasing, padded_on_the_right


def test_position_facts_for_dropping_a_key_mask():
    assert increasing(torch.tensor([0, 3, 4])) and not increasing(torch.tensor([0, 4, 4]))
    assert not increasing(torch.zeros(3, 2))  # an image grid is no sequence
    assert padded_on_the_right(torch.tensor([[1, 1, 0], [1, 1, 1]]))
    assert not padded_on_the_right(torch.tensor([[1, 0, 1]]))
    assert not padded_on_the_right(torch.tensor([[0, 1, 1]]))
