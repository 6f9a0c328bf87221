"""An honest proxy for implementation complexity: how much code an encoding is, and which
attention path it forces.

- Lines: the non-blank, non-comment, non-docstring lines of the encoding's class plus the
  module-level functions it calls (followed to their closure), so three encodings that share a
  module are not charged each other's code.
- Attention path, from the hooks the class overrides (``encodings/base.py``): ``fused`` when it
  only changes the input or rotates q and k (the fused SDPA kernel still runs), ``bias`` when it
  adds an ``(N, N)`` logit term (SDPA with a dense mask), ``own`` when it needs attention of its
  own (a value term, or ``attend``).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Literal

from posenc_cli.encodings import encoding_class
from posenc_cli.encodings.base import HOOKS, PositionEncoding

Path_ = Literal["fused", "bias", "blocked", "own"]
OWN = ("value", "attend", "window_value")
BIAS = ("bias", "window_bias")


def overridden_hooks(cls: type[PositionEncoding]) -> list[str]:
    return [h for h in HOOKS if getattr(cls, h) is not getattr(PositionEncoding, h)]


def attention_path(cls: type[PositionEncoding]) -> Path_:
    hooks = set(overridden_hooks(cls))
    if hooks & set(OWN):
        return "own"
    # class-level flags only: iRPE's content_free is a property of its mode (contextual default)
    if cls.__dict__.get("content_free") is True or cls.__dict__.get("pairwise_content") is True:
        return "blocked"
    if hooks & set(BIAS):
        return "bias"
    return "fused"


def code_lines(source: str) -> int:
    """Lines that are code: not blank, not a comment, not inside a docstring."""
    tree = ast.parse(textwrap.dedent(source))
    docs: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                docs.update(range(body[0].lineno, body[0].end_lineno + 1))
    lines = textwrap.dedent(source).splitlines()
    return sum(
        1
        for number, line in enumerate(lines, 1)
        if line.strip() and not line.strip().startswith("#") and number not in docs
    )


def encoding_lines(name: str) -> int:
    """The class's code lines plus those of the module functions it reaches."""
    cls = encoding_class(name)
    module = inspect.getmodule(cls)
    tree = ast.parse(inspect.getsource(module))
    functions = {
        node.name: ast.get_source_segment(inspect.getsource(module), node)
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
    }
    sources = [inspect.getsource(cls)]
    seen: set[str] = set()
    while True:
        called = {
            n.id
            for src in sources
            for n in ast.walk(ast.parse(textwrap.dedent(src)))
            if isinstance(n, ast.Name) and n.id in functions
        } - seen
        if not called:
            break
        seen |= called
        sources += [functions[f] for f in sorted(called)]
    return sum(code_lines(src) for src in sources)
