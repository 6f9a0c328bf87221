"""The layers the README's Architecture section names, checked on the source: a module may
import only its own layer and the ones below it. Read with ``ast``, so a lazy import inside a
function counts as much as one at the top."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "posenc_cli"
BASE = {"errors", "params"}  # what every layer may use: the one-line error and field checks

# layer -> the posenc_cli subpackages and modules it may import besides itself and BASE
BELOW = {
    "kernels": set(),
    "encodings": {"kernels"},
    "models": {"kernels", "encodings"},
    "runs": set(),  # the run plumbing every task shares knows no task, recipe or plot
}
TOP = {"commands", "cli", "__main__"}  # the verbs: only they may import each other


def imports_of(path: Path) -> set[str]:
    """The posenc_cli parts a module imports: ``posenc_cli.encodings.rope`` -> ``encodings``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        found |= {n.split(".")[1] for n in names if n.startswith("posenc_cli.")}
    return found


def modules() -> list[tuple[str, Path]]:
    return [(p.relative_to(PACKAGE).parts[0].removesuffix(".py"), p) for p in PACKAGE.rglob("*.py")]


@pytest.mark.parametrize("layer", sorted(BELOW))
def test_a_lower_layer_imports_only_what_lies_below_it(layer):
    allowed = BELOW[layer] | BASE | {layer}
    wrong = {
        str(path.relative_to(PACKAGE)): sorted(imports_of(path) - allowed)
        for part, path in modules()
        if part == layer and imports_of(path) - allowed
    }
    assert not wrong, f"{layer} reaches above itself: {wrong}"


def test_only_the_command_line_imports_the_commands():
    wrong = sorted(
        str(path.relative_to(PACKAGE))
        for part, path in modules()
        if part not in TOP and imports_of(path) & TOP
    )
    assert not wrong, f"these import the command line: {wrong}"


def test_the_check_reads_lazy_imports(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "def f():\n    from posenc_cli.runs.lock import hold\n    import posenc_cli.cli\n"
    )
    assert imports_of(module) == {"runs", "cli"}
