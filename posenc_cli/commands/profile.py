"""``posenc profile``: FLOPs, memory and latency of encodings, and how they grow with size."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import torch
import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from posenc_cli.commands.common import CompareFormat, console, int_list, reject_options
from posenc_cli.errors import UsageError
from posenc_cli.tasks import task_of

DEFAULT_LENGTHS = [128, 256, 512, 1024]
DEFAULT_DIM, DEFAULT_HEADS = 256, 4  # --layer attention
INTERRUPTED = "interrupted: profile stopped; nothing was written"


def resolve_encodings(compare: str | None, default: str, compatible: list[str], check) -> list[str]:
    """The encodings to measure; ``check(name)`` raises the target's own reason for a misfit."""
    from posenc_cli.encodings import encoding_class

    if compare is None:
        return [default]
    if compare.strip() == "all":
        return compatible
    names = [n.strip() for n in compare.split(",") if n.strip()]
    if not names:
        raise UsageError("--compare: name encodings separated by commas, or all")
    for name in names:
        encoding_class(name)  # unknown names get the registry's one-line answer
        check(name)
        if name not in compatible:
            raise UsageError(
                f"--compare: {name!r} does not fit this target; choose from {', '.join(compatible)}"
            )
    return names


def build_workload(
    target: str | None,
    overrides: list[str],
    layer: str | None,
    dim: int | None,
    heads: int | None,
    window: int | None,
    dilation: int | None = None,
    form: str | None = None,
    stride: int | None = None,
    global_tokens: int | None = None,
    sequence: bool = False,
):
    from posenc_cli.encodings import ENCODINGS
    from posenc_cli.models import linear_form
    from posenc_cli.profiling.workloads import (
        LayerWorkload,
    )

    if layer is not None:
        if layer != "attention":
            raise UsageError(f"--layer {layer!r}: the only layer is 'attention'")
        if target is not None or overrides:
            raise UsageError("--layer attention takes no recipe; drop the recipe or --layer")
        if window is not None and (window < 1 or window % 2 == 0):
            raise UsageError(f"--window {window}: give an odd number of patches, e.g. 7")
        if sequence and window is None:
            raise UsageError("--sequence lays a --window's pattern on a sequence: give --window")
        if dilation is not None and (dilation < 1 or window is None):
            raise UsageError(
                f"--dilation {dilation}: dilates a --window, give both (e.g. --window 7 "
                "--dilation 2), dilation >= 1"
            )
        if stride is not None and (stride < 1 or window is None):
            raise UsageError(
                f"--stride {stride}: adds a lattice to a --window, give both (e.g. --window 7 "
                "--stride 7), stride >= 1"
            )
        if global_tokens is not None and (global_tokens < 0 or window is None):
            raise UsageError(
                f"--global-tokens {global_tokens}: global patches beside a --window, give both "
                "(e.g. --window 7 --global-tokens 16), count >= 0"
            )
        workload = LayerWorkload(
            dim=DEFAULT_DIM if dim is None else dim,
            heads=DEFAULT_HEADS if heads is None else heads,
            window=window,
            dilation=dilation or 1,
            form=form or "softmax",
            stride=stride,
            global_tokens=global_tokens or 0,
            sequence=sequence,
        )
        if form not in (None, "softmax", "linear"):
            raise UsageError(f"--form {form!r}: choose softmax or linear")
        if form == "linear":
            if window is not None:
                raise UsageError("--form linear has no window: drop --window or --form")
            compatible = [n for n, c in ENCODINGS.items() if linear_form.supports_class(c)]
            return workload, "none", compatible
        if window is not None:
            dims = 1 if sequence else 2
            compatible = [n for n, c in ENCODINGS.items() if c.dims == dims or n == "none"]
        else:
            compatible = list(ENCODINGS)
        return workload, "none", compatible
    if target is None:
        raise UsageError("give a recipe or a run directory, or --layer attention")
    reject_options(
        {
            "--dim": dim,
            "--heads": heads,
            "--window": window,
            "--dilation": dilation,
            "--stride": stride,
            "--global-tokens": global_tokens,
            "--form": form,
        },
        "for --layer attention only; a recipe's model is set with overrides such as model.dim=128",
    )
    from posenc_cli.config import load_recipe

    path = Path(target)
    if path.is_dir():
        if not (path / "recipe.yaml").is_file():
            raise UsageError(f"{target}: not a run directory (no recipe.yaml); give a recipe")
        target = str(path / "recipe.yaml")
    recipe = load_recipe(target, [*overrides, "sweep=null"])
    workload, compatible = task_of(recipe.kind).call("workload", recipe, [*overrides, "sweep=null"])
    return workload, recipe.encoding.name, compatible


def profile_command(
    target: Annotated[
        str | None,
        typer.Argument(help="Recipe file, shipped name (text/base) or run directory."),
    ] = None,
    overrides: Annotated[
        list[str] | None, typer.Argument(help="Dotted KEY=VALUE overrides, e.g. model.dim=128.")
    ] = None,
    lengths: Annotated[
        str | None, typer.Option("--lengths", help="Sequence lengths, e.g. 256,512,1024.")
    ] = None,
    sizes_px: Annotated[
        str | None, typer.Option("--sizes", help="Image recipes: sides in px, e.g. 224,384.")
    ] = None,
    batch: Annotated[int, typer.Option("--batch", help="Batch size.")] = 1,
    mode: Annotated[
        str, typer.Option("--mode", help="forward (inference) or train (forward + backward).")
    ] = "forward",
    compare: Annotated[
        str | None,
        typer.Option("--compare", help="Encodings side by side (ENC,ENC,...) or all."),
    ] = None,
    layer: Annotated[
        str | None, typer.Option("--layer", help="attention: one attention layer, no recipe.")
    ] = None,
    dim: Annotated[
        int | None, typer.Option("--dim", help="--layer: model width (default 256).")
    ] = None,
    heads: Annotated[
        int | None, typer.Option("--heads", help="--layer: attention heads (default 4).")
    ] = None,
    window: Annotated[
        int | None, typer.Option("--window", help="--layer: local k x k window attention.")
    ] = None,
    dilation: Annotated[
        int | None,
        typer.Option("--dilation", help="--layer --window: slots this many patches apart."),
    ] = None,
    stride: Annotated[
        int | None,
        typer.Option(
            "--stride", help="--layer --window: add the k x k lattice of slots this far apart."
        ),
    ] = None,
    global_tokens: Annotated[
        int | None,
        typer.Option(
            "--global-tokens", help="--layer --window: the first patches see and are seen by all."
        ),
    ] = None,
    sequence: Annotated[
        bool,
        typer.Option(
            "--sequence", help="--layer --window: the pattern on a 1D sequence, not a patch grid."
        ),
    ] = False,
    form: Annotated[
        str | None,
        typer.Option("--form", help="--layer: softmax (default) or linear attention."),
    ] = None,
    rounds: Annotated[int, typer.Option("--rounds", help="Interleaved timing rounds.")] = 5,
    min_time: Annotated[float, typer.Option("--min-time", help="Seconds per timed block.")] = 0.15,
    device: Annotated[str, typer.Option("--device", help="auto, cpu or cuda.")] = "auto",
    format: Annotated[
        CompareFormat, typer.Option("--format", help="table, json or md.")
    ] = CompareFormat.table,
    out: Annotated[
        Path | None, typer.Option("--out", help="Folder for profile.json and log-log PNGs.")
    ] = None,
) -> None:
    """Measure what encodings cost (parameters, FLOPs, peak memory, latency) over sizes.

    Example: posenc profile --layer attention --compare all --lengths 256,512,1024,2048
    """
    from posenc_cli.interrupts import hard_interrupt
    from posenc_cli.profiling.budget import check_sizes
    from posenc_cli.profiling.memory import MEMORY_METHOD
    from posenc_cli.profiling.report import (
        cost_table,
        document,
        markdown,
        ratio_table,
        selection_rows,
        selection_table,
        speed_table,
        write_plots,
    )
    from posenc_cli.profiling.sweep import Sweep
    from posenc_cli.runs.checkpoint import atomic_write_json
    from posenc_cli.runs.device import pick_device

    if mode not in ("forward", "train"):
        raise UsageError(f"--mode {mode!r}: choose forward or train")
    if rounds < 1 or min_time <= 0:
        raise UsageError("--rounds must be >= 1 and --min-time > 0")
    if device not in ("auto", "cpu", "cuda"):
        raise UsageError(f"--device {device!r}: choose auto, cpu or cuda")
    if out is not None and out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: is a file; give a folder for profile.json and the plots")
    workload, default, compatible = build_workload(
        target, list(overrides or []), layer, dim, heads, window, dilation, form, stride,
        global_tokens, sequence,
    )  # fmt: skip
    image = not layer and task_of(workload.recipe.kind).profile_unit == "px"
    if image and lengths is not None:
        raise UsageError("an image recipe is profiled over --sizes (sides in px), not --lengths")
    if not image and sizes_px is not None:
        raise UsageError("--sizes is for image recipes; profile sequences over --lengths")
    sizes = int_list(sizes_px if image else lengths, "--sizes" if image else "--lengths")
    if sizes is None and image:
        sizes = list(getattr(workload.recipe.eval, "sizes", [])) or [
            workload.recipe.data.image_size
        ]
    elif sizes is None:
        sizes = DEFAULT_LENGTHS if layer else list(workload.recipe.eval.lengths)
    if layer and global_tokens and global_tokens > min(sizes):
        raise UsageError(
            f"--global-tokens {global_tokens} exceeds the shortest --lengths, {min(sizes)} "
            f"tokens; give at most {min(sizes)} or profile longer inputs"
        )
    encodings = resolve_encodings(compare, default, compatible, workload.check)
    dev = pick_device(device, "--device")
    sweep = Sweep(
        workload.subject,
        encodings,
        sizes,
        mode=mode,  # type: ignore[arg-type]
        batch=batch,
        device=dev,
        rounds=rounds,
        min_time=min_time,
    )
    names = set(encodings) | {"none"}
    err = Console(stderr=True)
    # measuring may sit for minutes in one C++ op; Ctrl-C must end it all the same
    with hard_interrupt(INTERRUPTED):
        check_sizes(
            workload.subject,
            encodings,
            sizes,
            unit="px" if image else "tokens",
            option="--sizes" if image else "--lengths",
            mode=sweep.mode,
            batch=batch,
            device=dev,
        )
        with Progress(
            TextColumn("[bold]profile"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=err,
        ) as progress:
            bar = progress.add_task("", total=len(sizes) * (len(names) + 1))
            results = sweep.run(lambda what: progress.update(bar, advance=1, description=what))
            progress.update(bar, completed=len(sizes) * (len(names) + 1))

    meta = {
        "target": workload.label,
        "mode": mode,
        "batch": batch,
        "sizes": sizes,
        "size_unit": "px" if image else "tokens",
        "device": str(dev),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "memory_method": MEMORY_METHOD[dev.type],
        "timing": f"median of {rounds} interleaved rounds of {min_time}s blocks",
        "selection": selection_rows(results, sizes)
        if compare and compare.strip() == "all"
        else None,
    }
    doc = document(meta, results)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out / "profile.json", doc)
        write_plots(results, out, workload.label, "tokens N")
    if format is CompareFormat.json:
        print(json.dumps(doc, indent=2))
        return
    if format is CompareFormat.md:
        print(markdown(results, meta["selection"]))
        return
    title = f"{workload.label}, {mode}, batch {batch}, {dev}"
    console.print(cost_table(results, title))
    console.print(speed_table(results))
    if len(sizes) > 1:
        console.print(ratio_table(results, sizes, meta["size_unit"]))
    if meta["selection"]:
        console.print(selection_table(meta["selection"]))
    if out is not None:
        console.print(f"wrote {out / 'profile.json'} and log-log plots in {out}")
