"""`benchmarks/gpu.py` has never had a GPU to run on: its measuring loop is run here on the
CPU, so the one run a lent device allows does not fail on the script itself."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rich.console import Console

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu.py"


def load():
    spec = importlib.util.spec_from_file_location("gpu_benchmark", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_measuring_loop_gives_a_ratio_per_encoding_and_records_failures(monkeypatch):
    bench = load()
    build = bench.layer_step

    def failing(name, *args):  # one encoding that cannot be built at all, as an OOM would
        if name == "t5":
            raise RuntimeError("out of memory\nsecond line")
        return build(name, *args)

    monkeypatch.setattr(bench, "layer_step", failing)
    results = bench.measure(["none", "alibi", "t5"], [64, 128], batch=1, heads=2, head_dim=8,
                            rounds=2, repeats=1, device="cpu")  # fmt: skip
    assert set(results) == {64, 128}
    assert results[64]["batch"] == 16 and results[128]["batch"] == 8  # the same tokens
    row = results[128]["encodings"]
    assert row["none"]["ratio"] == pytest.approx(1.0)
    assert row["alibi"]["seconds"] > 0 and row["alibi"]["ratio"] > 0
    assert row["t5"] == {"failed": "out of memory"}
    console = Console(record=True, width=120)
    console.print(bench.ratio_table(results, ["none", "alibi", "t5"], [64, 128], "cpu"))
    text = console.export_text()
    assert "N=128 (B=8)" in text and "1.00x" in text and "failed" in text


def test_a_failed_none_leaves_the_others_their_seconds(monkeypatch):
    bench = load()
    build = bench.layer_step

    def failing(name, *args):
        if name == "none":
            raise RuntimeError("out of memory")
        return build(name, *args)

    monkeypatch.setattr(bench, "layer_step", failing)
    results = bench.measure(["none", "alibi"], [64], 1, 2, 8, 1, 1, device="cpu")
    assert results[64]["encodings"]["alibi"]["ratio"] is None
    console = Console(record=True, width=120)
    console.print(bench.ratio_table(results, ["none", "alibi"], [64], "cpu"))
    assert " ms" in console.export_text()


def test_every_one_d_encoding_takes_a_causal_step_on_the_cpu():
    bench = load()
    from posenc_cli.encodings import ENCODINGS

    for name in (n for n in ENCODINGS if ENCODINGS[n].dims == 1):
        bench.layer_step(name, 1, 2, 8, 32, "cpu")()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the message is for a machine without CUDA")
def test_without_a_gpu_it_says_so_and_exits_2():
    done = subprocess.run([sys.executable, str(BENCH)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "needs a CUDA GPU" in done.stderr
    assert "Traceback" not in done.stderr
