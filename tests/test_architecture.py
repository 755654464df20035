"""The package's shape: no import cycle, one owner of the checkpoint layout, a CLI that needs no TensorFlow to start."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "tfdist"


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _top_level_imports(name: str) -> set[str]:
    """The tfdist modules ``name`` imports when it is imported (not inside functions)."""
    tree = ast.parse(MODULES[name].read_text())
    package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If):  # `if TYPE_CHECKING:` blocks are not run
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            for alias in node.names:  # `from pkg import submodule` imports the submodule
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return {m for m in found if m in MODULES and m != name}


def test_the_package_has_no_import_cycle():
    graph = {name: _top_level_imports(name) for name in MODULES}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                if not all(m.startswith(nxt + ".") or m == nxt for m in cycle[1:-1]):  # a package importing its own module
                    pytest.fail(f"import cycle: {' -> '.join(cycle)}")
            elif state.get(nxt) is None:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)


# Literals that only the checkpoint layout module may spell: file names and metadata keys.
_LAYOUT_LITERALS = re.compile(
    r"""["'](\.tfdist\.json|ckpt-|progress/|\.index|_temp|global_step|step_in_epoch|saved_at|checkpoints|"""
    r"""/\.ATTRIBUTES/VARIABLE_VALUE)["']"""
)


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n != "tfdist.checkpoint.layout"))
def test_only_the_layout_module_knows_checkpoint_names_and_metadata_keys(name):
    source = MODULES[name].read_text()
    hits = [m.group(0) for m in _LAYOUT_LITERALS.finditer(source)]
    assert not hits, f"{name} spells {hits}: ask tfdist.checkpoint.layout instead"
