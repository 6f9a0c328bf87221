"""The process-group helpers without a process group: collectives are monkeypatched."""

from __future__ import annotations

import torch

from posenc_cli.runs import distributed
from posenc_cli.runs.distributed import World


def test_a_collective_tensor_lives_where_the_backend_takes_it(monkeypatch):
    monkeypatch.setattr(distributed.dist, "get_backend", lambda: "nccl")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert distributed.collective_device() == torch.device("cuda", 1)  # NCCL: CUDA only
    monkeypatch.setattr(distributed.dist, "get_backend", lambda: "gloo")
    assert distributed.collective_device() == torch.device("cpu")


def test_every_rank_gets_rank_0s_flag(monkeypatch):
    sent = []

    def broadcast(t, src):
        assert src == 0
        sent.append(t.device)
        t.fill_(1)  # what rank 0 said

    monkeypatch.setattr(distributed.dist, "get_backend", lambda: "gloo")
    monkeypatch.setattr(distributed.dist, "broadcast", broadcast)
    assert World(rank=1, size=2).broadcast_flag(False) is True
    assert sent == [torch.device("cpu")]
    assert World().broadcast_flag(False) is False  # alone: no collective at all
    assert len(sent) == 1
