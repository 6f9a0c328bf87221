"""``posenc profile``: counts against analytic formulas, the memory tracker on known
allocations, growth exponents, the JSON schema and one-line errors."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from posenc_cli.models.text import TextModel
from posenc_cli.profiling.flops import count_ops
from posenc_cli.profiling.memory import LiveTensorBytes, peak_bytes
from posenc_cli.profiling.sweep import Sweep, fit_exponent, make_step
from posenc_cli.profiling.workloads import LayerWorkload, near_square
from tests.helpers import run

CPU = torch.device("cpu")


@pytest.mark.parametrize("causal", [False, True])
def test_tiny_transformer_flops_equal_the_analytic_count(causal):
    """Per layer 12 N d^2 + 2 N^2 d MACs (4 projections, a 4x MLP, two attention matmuls),
    plus the head; a causal mask is not discounted (PyTorch's formulas do not)."""
    N, d, depth, vocab, classes = 24, 32, 3, 11, 5
    model = TextModel(
        kind="lm" if causal else "classify",
        vocab_size=vocab,
        num_classes=classes,
        dim=d,
        depth=depth,
        heads=4,
        mlp_ratio=4.0,
        dropout=0.0,
        mem_len=0,
        encoding="none",
        encoding_params={},
    ).eval()
    tokens = torch.randint(0, vocab, (1, N))
    with torch.no_grad():
        counts = count_ops(lambda: model(tokens))
    head = N * d * vocab if causal else d * classes  # the classifier pools before its head
    assert counts.macs == depth * (12 * N * d * d + 2 * N * N * d) + head


def test_fused_attention_is_counted_on_the_cpu():
    B, H, N, M, d = 2, 3, 16, 20, 8
    q = torch.randn(B, H, N, d)
    k, v = torch.randn(B, H, M, d), torch.randn(B, H, M, d)
    counts = count_ops(lambda: F.scaled_dot_product_attention(q, k, v))
    assert counts.flops == 2 * (2 * B * H * N * M * d)  # q k^T and a v, 2 FLOPs per MAC
    mask = torch.zeros(1, 1, N, M)
    counts = count_ops(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    assert counts.elementwise == B * H * N * M  # the additive mask, once per logit


def test_training_step_of_a_matmul_model_costs_three_forwards():
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 8))
    x = torch.randn(5, 16, requires_grad=True)
    forward = count_ops(lambda: net(x)).flops
    train = count_ops(lambda: net(x).sum().backward()).flops
    assert forward == 2 * 5 * (16 * 32 + 32 * 8)
    assert train == 3 * forward


def test_elementwise_and_gathers_count_output_elements():
    a, b = torch.randn(7, 5), torch.randn(7, 5)
    table, ids = torch.randn(10, 4), torch.randint(0, 10, (6,))
    counts = count_ops(lambda: (a * b + a, table[ids], torch.gather(a, 1, ids[:5, None] % 5)))
    assert counts.flops == 0
    assert counts.elementwise == 2 * 35 + 5  # a * b, + a, and the % 5 on five ids
    assert counts.gathers == 6 * 4 + 5


def test_encoding_adds_what_its_hooks_compute():
    """iRPE contextual on keys adds q . r_b for every bucket: H * N * d * buckets MACs."""
    workload = LayerWorkload(dim=32, heads=4)
    sweep = Sweep(workload.subject, ["irpe", "alibi"], [64], time_it=False)
    results = {r.encoding: r for r in sweep.run()}
    irpe, alibi = results["irpe"].points[0], results["alibi"].points[0]
    buckets = (2 * 3 + 1) ** 2 + 1  # product method, beta = int(2 * 1.9) = 3, one prefix bucket
    assert irpe.encoding_flops == 2 * 4 * 64 * 8 * buckets
    assert alibi.encoding_flops == 0 and alibi.encoding_elementwise > 0
    assert results["irpe"].encoding_parameters == 8 * buckets  # shared head: (1, d, buckets)


def test_live_tensor_bytes_follows_allocations_and_frees():
    def allocate():
        a = torch.empty(1000, dtype=torch.float32)  # 4000 bytes
        view = a[:10]  # a view: no new storage
        b = torch.empty(500, dtype=torch.float32)  # 2000
        del a, view
        c = torch.empty(2000, dtype=torch.float32)  # 8000, after a is gone
        return b, c

    tracker = LiveTensorBytes()
    with tracker:
        kept = allocate()
    assert tracker.peak == 2000 + 8000
    assert tracker.live == 10000
    del kept
    assert tracker.live == 0


def test_memory_exponents_of_full_blocked_and_window_attention():
    """A materialised (N, N) bias grows memory ~N^2; a content-free bias asked for block by
    block, and 7 x 7 windows, grow it ~N. Up to 2048 tokens: XL's peak holds about five (N, N)
    floats there and three from 3072 on (both quadratic), so a fit across that step reads low."""
    sizes = [512, 1024, 2048]
    full = LayerWorkload(dim=8, heads=1).subject("xl")  # its q-dependent (H, N, N) term
    blocked = LayerWorkload(dim=8, heads=1).subject("sandwich")
    window = LayerWorkload(dim=8, heads=1, window=7).subject("irpe")
    for subject, low, high in ((full, 1.8, 2.1), (blocked, 0.9, 1.1), (window, 0.9, 1.1)):
        peaks = [
            peak_bytes(make_step(subject, subject.inputs(n, 1, CPU), "train"), CPU) for n in sizes
        ]
        assert low < fit_exponent(sizes, peaks) < high


def test_fit_exponent_recovers_a_power_law_and_uses_the_upper_sizes():
    sizes = [64, 128, 256, 512]
    assert fit_exponent(sizes, [3 * n**1.5 for n in sizes]) == pytest.approx(1.5)
    mixed = [1000 * n + n**2 for n in sizes]  # linear at small N, the square shows later
    assert fit_exponent(sizes, mixed) > math.log(mixed[1] / mixed[0]) / math.log(2)
    assert fit_exponent([10], [1.0]) is None


def test_near_square_grids():
    assert near_square(512) == (16, 32)
    assert near_square(1024) == (32, 32)
    assert near_square(7) == (1, 7)


def test_sweep_records_an_encoding_that_cannot_run_and_goes_on():
    workload = LayerWorkload(dim=16, heads=2, fit_tables=False)  # swin's table covers 14 x 14
    results = {
        r.encoding: r for r in Sweep(workload.subject, ["swin"], [64, 256], time_it=False).run()
    }
    first, second = results["swin"].points
    assert first.error is None and first.peak_bytes > 0
    assert "swin" in second.error and second.flops is None


JSON_KEYS = {
    "schema",
    "target",
    "mode",
    "batch",
    "sizes",
    "size_unit",
    "device",
    "threads",
    "torch",
    "memory_method",
    "timing",
    "selection",
    "results",
}
RESULT_KEYS = {
    "encoding",
    "parameters",
    "encoding_parameters",
    "points",
    "time_exponent",
    "memory_exponent",
}
POINT_KEYS = {
    "size",
    "tokens",
    "flops",
    "macs",
    "forward_flops",
    "train_flops",
    "elementwise",
    "gathers",
    "encoding_flops",
    "encoding_elementwise",
    "encoding_gathers",
    "peak_bytes",
    "time_median_s",
    "time_iqr_s",
    "time_ratio",
    "memory_ratio",
    "error",
}
FAST = ("--rounds", "1", "--min-time", "0.001")


def test_layer_profile_json_schema_is_stable(capsys, tmp_path):
    code, out, _ = run(
        capsys,
        "profile",
        "--layer", "attention", "--dim", "16", "--heads", "2",
        "--compare", "rope,t5", "--lengths", "16,32", "--mode", "train",
        "--format", "json", "--out", str(tmp_path / "p"), *FAST,
    )  # fmt: skip
    assert code == 0
    doc = json.loads(out)
    assert doc["schema"] == "posenc.profile/1" and set(doc) == JSON_KEYS
    assert [r["encoding"] for r in doc["results"]] == ["none", "rope", "t5"]
    for result in doc["results"]:
        assert set(result) == RESULT_KEYS
        assert [p["size"] for p in result["points"]] == [16, 32]
        for point in result["points"]:
            assert set(point) == POINT_KEYS and point["flops"] > 0 and point["time_median_s"] > 0
            assert point["flops"] == point["train_flops"] > point["forward_flops"] > 0
    assert json.loads((tmp_path / "p" / "profile.json").read_text()) == doc
    for stem in ("time", "memory", "flops"):
        assert (tmp_path / "p" / f"{stem}.png").read_bytes()[:4] == b"\x89PNG"


def test_compare_all_fills_the_selection_table(capsys):
    code, out, _ = run(
        capsys,
        "profile", "--layer", "attention", "--dim", "16", "--heads", "2",
        "--compare", "all", "--lengths", "16", *FAST,
    )  # fmt: skip
    assert code == 0
    assert "selection table" in out and "excellent" in out and "deberta" in out


def test_profile_of_a_recipe_swaps_the_encoding(capsys):
    code, out, _ = run(
        capsys,
        "profile", "quickstart", "model.dim=16", "model.heads=2", "model.depth=1",
        "--compare", "alibi,learned", "--lengths", "8,16", "--format", "json", *FAST,
    )  # fmt: skip
    assert code == 0
    doc = json.loads(out)
    params = {r["encoding"]: r["encoding_parameters"] for r in doc["results"]}
    assert params["alibi"] == 0 and params["learned"] > 0
    assert "quickstart" in doc["target"]


@pytest.mark.parametrize(
    "args, words",
    [
        (["--layer", "attention", "--lengths", "0"], "--lengths"),
        (["--layer", "attention", "--compare", "rop"], "rope"),
        (["--layer", "attention", "--window", "7", "--compare", "rope"], "--window"),
        (["--layer", "attention", "--sequence"], "--sequence"),
        (["--layer", "attention", "--window", "7", "--sequence", "--compare", "swin"], "swin"),
        (["--layer", "attention", "--dim", "30", "--heads", "4"], "--dim"),
        (["quickstart", "model.dim=-4"], "model.dim"),
        (["quickstart", "--compare", "irpe"], "irpe"),
        (["--layer", "mlp"], "--layer"),
        ([], "recipe"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, args, words):
    code, out, err = run(capsys, "profile", *args, *FAST)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and words in err
