"""`posenc profile` limits: the memory estimate and its refusal, Ctrl-C that always ends a
profile, --device naming itself, and options that do not apply to the target."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time

import pytest
import torch

from posenc_cli import memory_budget as mb
from posenc_cli.errors import UsageError
from posenc_cli.interrupts import GRACE_S, hard_interrupt
from posenc_cli.profiling.budget import PROBE_TOKENS, check_sizes, probe, size_for_tokens
from posenc_cli.profiling.memory import peak_bytes
from posenc_cli.profiling.sweep import make_step
from posenc_cli.profiling.workloads import LayerWorkload
from posenc_cli.runs.device import pick_device
from tests.helpers import run

CPU = torch.device("cpu")
GB = 10**9


# --- the estimator ------------------------------------------------------------------------


def test_fit_growth_recovers_a_quadratic_and_never_goes_negative():
    xs = [512, 768, 1024]
    exact = mb.fit_growth(xs, [7 + 3 * x + 0.5 * x * x for x in xs])
    assert exact(10**6) == pytest.approx(7 + 3e6 + 0.5e12, rel=1e-6)
    # falling data would need a negative term: the fit stays flat instead of shrinking
    falling = mb.fit_growth(xs, [300.0, 200.0, 100.0])
    assert (falling.coefficients >= 0).all() and falling(10**6) >= falling(512) > 0


def test_fit_traces_extrapolates_every_moment_not_only_the_small_peak():
    """At small sizes the peak is a linear activation (2000 x); at large ones an N^2 map."""
    xs = [64, 128, 256]
    traces = [[2000 * x, 4 * x * x] for x in xs]  # the first moment is the peak at all three
    assert all(t[0] > t[1] for t in traces)
    assert mb.fit_growth(xs, [max(t) for t in traces])(10**5) == pytest.approx(2e8)  # too low
    assert mb.fit_traces(xs, traces)(10**5) == pytest.approx(4e10, rel=1e-6)
    # traces of different lengths (another code path): the peaks alone are fitted
    assert mb.fit_traces([1, 2], [[5], [5, 10]])(2) == pytest.approx(10)


def test_alibi_estimate_matches_the_measured_peak_at_a_larger_size():
    workload = LayerWorkload(dim=16, heads=2)
    probes = [size_for_tokens(lambda n: n, t) for t in PROBE_TOKENS]
    footprint = probe(workload.subject, "alibi", probes, "forward", 1, CPU)
    subject = workload.subject("alibi", 2048)
    measured = peak_bytes(make_step(subject, subject.inputs(2048, 1, CPU), "forward"), CPU)
    assert footprint.peak(2048) == pytest.approx(measured, rel=0.05)
    # no (H, N, N) tensor: the bias comes a block of 256 queries at a time
    assert footprint.peak.coefficients[:, 2].max() < 0.05 * 2 * 4


def test_largest_fitting_and_the_one_line_refusal():
    need = lambda n: float(n * n)  # noqa: E731
    assert mb.largest_fitting(need, 1e6, 10**9) == 1000
    assert mb.largest_fitting(need, 0.5, 10) == 0
    mb.refuse_size("--length 1000", 1000, "positions", need, free=int(1e6 / mb.USABLE_SHARE))
    with pytest.raises(UsageError) as refused:
        mb.refuse_size("--length 5000: x", 5000, "positions", need, free=int(1e6))
    message = str(refused.value)
    assert message == (
        "--length 5000: x needs about 25 MB at 5000 positions, this machine has 1.0 MB free; "
        "the largest that fits is about 890 positions"  # sqrt(0.8e6) = 894, two figures
    )
    assert mb.about(52381) == 52000 and mb.human_bytes(7.5e12) == "7.5 TB"


def test_available_memory_falls_back_to_sysconf(monkeypatch):
    assert mb.available_bytes() > 0
    monkeypatch.setattr("builtins.open", lambda *a, **k: (_ for _ in ()).throw(OSError("no")))
    expected = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert mb.available_bytes() == pytest.approx(expected, rel=0.2)


def test_check_sizes_refuses_past_the_largest_that_fits():
    workload = LayerWorkload(dim=16, heads=2)
    args = {"unit": "tokens", "option": "--lengths", "mode": "forward", "batch": 1}
    with pytest.raises(UsageError) as refused:
        check_sizes(workload.subject, ["sandwich"], [256, 2_000_000], device=CPU, free=GB, **args)
    message = str(refused.value)
    largest = int(re.search(r"largest that fits is about (\d+) tokens", message).group(1))
    assert message.startswith("--lengths 2000000: sandwich needs about")
    assert 50_000 < largest < 2_000_000  # about 6.5 kB a token: the bias comes block by block
    check_sizes(workload.subject, ["sandwich"], [largest], device=CPU, free=GB, **args)


# --- the command --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, words",
    [
        (
            ["--layer", "attention", "--dim", "16", "--heads", "2", "--compare", "sandwich"],
            "sandwich",
        ),
        # T5 measured again past its kernel switch needs little; the causal mask of none does
        (
            ["quickstart", "model.dim=16", "model.heads=2", "model.depth=1", "--compare", "t5"],
            "none",
        ),
    ],
)
def test_a_size_that_cannot_fit_is_refused_before_it_runs(capsys, args, words):
    code, out, err = run(capsys, "profile", *args, "--lengths", "64,100000000")
    assert code == 2 and out == "" and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert f"--lengths 100000000: {words} needs about" in err
    assert "at 100000000 tokens" in err and "the largest that fits is about" in err


def test_image_sizes_are_refused_in_px(capsys):
    code, _, err = run(capsys, "profile", "image/base", "model.depth=1", "--sizes", "100000")
    assert code == 2 and "--sizes 100000: learned2d needs about" in err and "at 100000 px" in err
    assert re.search(r"largest that fits is about \d+ px", err)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible here")
def test_device_cuda_without_a_gpu_names_the_option(capsys):
    code, _, err = run(capsys, "profile", "--layer", "attention", "--device", "cuda")
    assert code == 2 and err.startswith("error: --device: cuda was asked for")
    with pytest.raises(UsageError, match=r"^train\.device: cuda"):
        pick_device("cuda")


@pytest.mark.parametrize(
    "options, named",
    [
        (["--dim", "16"], "--dim"),
        (["--heads", "2"], "--heads"),
        (["--window", "7"], "--window"),
        (["--dim", "16", "--heads", "2"], "--dim and --heads"),
    ],
)
def test_layer_options_with_a_recipe_are_an_error(capsys, options, named):
    code, _, err = run(capsys, "profile", "quickstart", *options)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith(f"error: {named}: ") and "--layer attention" in err


# --- Ctrl-C -------------------------------------------------------------------------------


def current_wakeup_fd() -> int:
    fd = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(fd)
    return fd


def test_hard_interrupt_reports_and_restores_the_previous_state(capsys):
    before = current_wakeup_fd()
    with pytest.raises(KeyboardInterrupt), hard_interrupt("interrupted: test"):
        assert current_wakeup_fd() != before
        raise KeyboardInterrupt
    assert current_wakeup_fd() == before
    assert capsys.readouterr().err == "interrupted: test\n"
    with hard_interrupt("unused"):
        pass
    assert current_wakeup_fd() == before


@pytest.mark.slow
def test_ctrl_c_ends_a_profile_inside_one_long_op():
    """The sweep's first step is a (16 x 1024) x 4096 x 12288 matmul on one thread: seconds in
    C++, where Python's own handler cannot run (without the watchdog the process ended 6.3 s
    after this SIGINT here). It must end within the grace all the same. Sizes up to 1024
    tokens skip the memory probes, which keeps the test short."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TTY_INTERACTIVE": "1", "TTY_COMPATIBLE": "1"}
    command = [sys.executable, "-m", "posenc_cli", "profile", "--layer", "attention"]
    command += ["--dim", "4096", "--heads", "1", "--lengths", "1024", "--batch", "16"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    seen = b""
    deadline = time.monotonic() + 90
    try:
        while b"none @ 1024" not in seen:  # the live progress bar: the step is starting
            ready, _, _ = select.select([proc.stderr], [], [], max(0, deadline - time.monotonic()))
            chunk = os.read(proc.stderr.fileno(), 4096) if ready else b""
            assert chunk, f"no progress bar: {seen.decode(errors='replace')[-500:]}"
            seen += chunk
        time.sleep(2.5)  # past the first counting mode's imports, into the matmul
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, rest = proc.communicate(timeout=GRACE_S + 20)
        waited = time.monotonic() - sent
    finally:
        proc.kill()
        proc.wait()
    err = (seen + rest).decode(errors="replace")
    assert proc.returncode == 130, err[-500:]
    assert "interrupted: profile stopped; nothing was written" in err
    assert "Traceback" not in err and waited < GRACE_S + 3


def test_dilation_without_a_window_is_refused(capsys):
    code, out, err = run(capsys, "profile", "--layer", "attention", "--dilation", "2")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith("error: --dilation 2: dilates a --window")


def test_ctrl_c_handled_inside_an_exec_of_source_text_still_exits_130(tmp_path):
    """A Ctrl-C that lands in an ``exec`` of text (dataclasses builds its methods so, during an
    import) was handled, yet CPython ended a ``python -m`` process by SIGINT at exit (status -2)
    unless the CLI clears that memory first."""
    (tmp_path / "boom.py").write_text(
        "from posenc_cli import cli\n"
        "cli.app.command('boom')(lambda: exec('raise KeyboardInterrupt'))\n"
        "cli.main(['boom'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "boom"], capture_output=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 130, done.stderr.decode(errors="replace")[-500:]
    assert b"Traceback" not in done.stderr
