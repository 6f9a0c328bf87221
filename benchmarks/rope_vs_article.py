"""posenc's RoPE against the RoPE function printed in the source article (section 3.3).

The article's code is not copied into this repository: it is read from the seed file at run time.
That file is a single line (its line breaks were lost), so the ```python block that holds
``def RoPE`` has its statement breaks and indentation restored from Python's tokenizer before it
is executed as the baseline. The restoration handles what the article prints (imports and flat
function bodies); anything else fails to compile and the script says so.

Checks that both give the same rotation (the article: interleaved pairs, base 10000), then times
both with ``torch.utils.benchmark.Timer`` on the CPU (median of each round; each row keeps its
best round). q and k are laid out as the attention module hands them over: a ``(B, N, H, d)``
projection viewed as ``(B, H, N, d)``. "no cache" recomputes the cos/sin tables every call.

    python benchmarks/rope_vs_article.py [--format json] [--seed-file PATH]

Exit status: 0 when the outputs agree, 1 when they do not, 2 when the seed file is missing or its
code cannot be restored.
"""

from __future__ import annotations

import argparse
import io
import json
import keyword
import re
import sys
import tokenize
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils import benchmark

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from posenc_cli.encodings.rope import RotaryEmbedding, apply_rotary  # noqa: E402

SEED = REPO / ".." / "shared" / "seeds" / "001_5e8abc8f15d8aaad.txt"

# Keywords that continue an expression rather than start a statement.
_CONTINUES = {"as", "in", "is", "and", "or", "not", "if", "else", "for", "lambda"}
_TOP_LEVEL = {"import", "from", "def", "class"}


def article_block(text: str, marker: str = "def RoPE") -> str:
    """The ```python fenced block of ``text`` that contains ``marker``."""
    for block in re.findall(r"```python(.*?)```", text, flags=re.S):
        if marker in block:
            return block.strip()
    raise ValueError(f"no ```python block containing {marker!r}")


def restore_lines(code: str) -> str:
    """Put back the line breaks and indentation of flat Python code flattened onto one line.

    A statement starts where two operands meet with no operator between them at bracket depth 0
    (``... .unsqueeze(-1) ids = ...``), and after the colon that ends a ``def`` header.
    """
    tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    if any(t.type == tokenize.COMMENT for t in tokens):
        raise ValueError("the code has a comment, which hides the rest of the flattened line")
    starts: list[int] = [0]
    depth, prev, header = 0, None, False
    for tok in tokens:
        if tok.type not in (tokenize.NAME, tokenize.NUMBER, tokenize.STRING, tokenize.OP):
            continue
        col = tok.start[1]
        operand_end = prev is not None and (
            prev.type in (tokenize.NUMBER, tokenize.STRING)
            or (prev.type == tokenize.NAME and not keyword.iskeyword(prev.string))
            or prev.string in ("True", "False", "None")
            or prev.string in (")", "]", "}")
        )
        if depth == 0 and prev is not None:
            if header and prev.string == ":":
                starts.append(col)
                header = False
            elif operand_end and tok.type == tokenize.NAME and tok.string not in _CONTINUES:
                starts.append(col)
        if tok.string in ("(", "[", "{"):
            depth += 1
        elif tok.string in (")", "]", "}"):
            depth -= 1
        if depth == 0 and tok.string in ("def", "class") and col in starts:
            header = True
        prev = tok
    lines, indent = [], ""
    for a, b in zip(starts, starts[1:] + [len(code)], strict=True):
        statement = code[a:b].strip()
        if statement.split(" ", 1)[0] in _TOP_LEVEL:
            indent = ""
        lines.append(indent + statement)
        if statement.startswith(("def ", "class ")):
            indent = "    "
    return "\n".join(lines) + "\n"


def load_article_rope(seed_file: Path) -> Callable[[torch.Tensor, torch.Tensor], Any]:
    """Execute the article's RoPE block into a fresh namespace and return its ``RoPE``."""
    source = restore_lines(article_block(seed_file.read_text(encoding="utf-8")))
    namespace: dict[str, Any] = {"__name__": "article_rope"}
    exec(compile(source, f"{seed_file.name}:RoPE", "exec"), namespace)  # the baseline, by design
    return namespace["RoPE"]


def attention_layout(B: int, H: int, N: int, d: int, seed: int) -> torch.Tensor:
    """Random ``(B, H, N, d)`` viewed from a ``(B, N, H, d)`` tensor, as Attention.split_heads."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(B, N, H, d, generator=gen).transpose(1, 2)


def float64_reference(x: torch.Tensor) -> torch.Tensor:
    """Interleaved RoPE in float64: the accuracy both float32 versions are held against."""
    N, d = x.shape[-2:]
    angle = torch.arange(N, dtype=torch.float64)[:, None] * 10000.0 ** (
        -torch.arange(0, d, 2, dtype=torch.float64) / d
    )  # (N, d/2)
    a, b = x.double()[..., 0::2], x.double()[..., 1::2]
    out = torch.empty(x.shape, dtype=torch.float64)
    out[..., 0::2] = a * angle.cos() - b * angle.sin()
    out[..., 1::2] = b * angle.cos() + a * angle.sin()
    return out


def median_ms(fn: Callable[[], Any], threads: int, min_run_time: float) -> float:
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=threads)
    return timer.blocked_autorange(min_run_time=min_run_time).median * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed-file", type=Path, default=SEED)
    parser.add_argument("--format", choices=["table", "json"], default="table")
    parser.add_argument("--shape", type=int, nargs=4, default=[8, 8, 1024, 64], metavar="B H N d")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--min-run-time", type=float, default=0.5, help="seconds per timing")
    parser.add_argument("--rounds", type=int, default=7, help="rounds; each row keeps its best")
    args = parser.parse_args(argv)

    if not args.seed_file.is_file():
        print(f"seed file not found: {args.seed_file} (pass --seed-file PATH)", file=sys.stderr)
        return 2
    try:
        article_rope = load_article_rope(args.seed_file)
    except (ValueError, SyntaxError, KeyError, tokenize.TokenError) as err:
        print(f"cannot restore the article's RoPE from {args.seed_file}: {err}", file=sys.stderr)
        return 2

    torch.set_num_threads(args.threads)
    B, H, N, d = args.shape
    q, k = attention_layout(B, H, N, d, 0), attention_layout(B, H, N, d, 1)
    pos = torch.arange(N)
    inter = RotaryEmbedding(layout="interleaved", heads=H, head_dim=d)
    half = RotaryEmbedding(layout="half", heads=H, head_dim=d)

    with torch.no_grad():
        ours_q, ours_k = inter.rotate(q, k, pos, pos)
        theirs_q, theirs_k = article_rope(q, k)
        ref_q, ref_k = float64_reference(q), float64_reference(k)
    diff = max((ours_q - theirs_q).abs().max().item(), (ours_k - theirs_k).abs().max().item())
    ours_err = max((ours_q - ref_q).abs().max().item(), (ours_k - ref_k).abs().max().item())
    theirs_err = max((theirs_q - ref_q).abs().max().item(), (theirs_k - ref_k).abs().max().item())
    # The article forms angles in float32: at position N the angle itself is off by up to
    # N * eps32, so the two may differ by about that times |x|, not by float32 rounding alone.
    eps = torch.finfo(torch.float32).eps
    tolerance = 4 * eps * max(N, 1) * max(q.abs().max().item(), k.abs().max().item())
    agree = diff <= tolerance and ours_err <= 16 * eps * q.abs().max().item()

    rows = {
        "article RoPE": lambda: article_rope(q, k),
        "posenc interleaved": lambda: inter.rotate(q, k, pos, pos),
        "posenc half": lambda: half.rotate(q, k, pos, pos),
        "posenc interleaved, no cache": lambda: (
            apply_rotary(q, pos, inter.inv_freq),
            apply_rotary(k, pos, inter.inv_freq),
        ),
    }
    # Rows alternate over the rounds so that a burst of load elsewhere on the machine hits all of
    # them alike; each row keeps its least disturbed round.
    times = {name: float("inf") for name in rows}
    with torch.no_grad():
        for _ in range(args.rounds):
            for name, fn in rows.items():
                times[name] = min(times[name], median_ms(fn, args.threads, args.min_run_time))
    base = times["article RoPE"]
    result = {
        "shape": [B, H, N, d],
        "threads": args.threads,
        "rounds": args.rounds,
        "torch": torch.__version__,
        "max_abs_diff_vs_article": diff,
        "tolerance": tolerance,
        "max_abs_err_vs_float64": {"posenc": ours_err, "article": theirs_err},
        "outputs_agree": agree,
        "median_ms": times,
        "ratio_vs_article": {name: t / base for name, t in times.items()},
    }
    if args.format == "json":
        print(json.dumps(result, indent=2))
    else:
        print(f"RoPE on q and k, (B, H, N, d) = {tuple(args.shape)}, CPU, {args.threads} threads")
        print(f"max |posenc - article| = {diff:.3g} (tolerance {tolerance:.3g})")
        print(f"max error vs float64: posenc {ours_err:.3g}, article {theirs_err:.3g}")
        print(f"{'':30} {'median ms':>10} {'ratio':>8}   (best of {args.rounds} rounds)")
        for name, t in times.items():
            print(f"{name:30} {t:10.2f} {t / base:8.3f}")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
