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


# --- private TensorFlow and Keras parts: only tfdist._compat reaches them --------------------------------------

_COMPAT = "tfdist._compat"
_PRIVATE_MODULES = ("tensorflow.python", "keras.src", "tf_keras.src")
# Private names of the standard library that tfdist uses: not TensorFlow's or Keras'.
_STDLIB_PRIVATE = {"_exit", "_option_string_actions"}
# Private names of TensorFlow and Keras that tfdist reaches (through _compat): refused outside
# _compat on any object, `self` included (a subclass of a Keras class could set them).
_KNOWN_TF_KERAS_PRIVATE = {
    "_async_checkpointer_impl", "_async_error", "_copy_to_cpu", "_join_async_save_thread", "_async_save_thread",
    "_omit_frequent_tracing_warning", "_flatten_layers", "_distribute_strategy", "_distribution_strategy",
    "_exclude_from_weight_decay", "_exclude_from_weight_decay_pattern", "_exclude_from_weight_decay_names", "_var_key",
    "_create_all_weights", "_learning_rate", "_hyper", "_compile_config", "_compile_loss", "_compile_metrics",
    "_symbolic_build", "_moments", "_copy_trackable_to_cpu", "_get_compile_args", "_steps_per_execution",
    "_jit_compile", "_is_graph_network", "_cluster_coordinator", "_random_generator", "_generator", "_rng_type",
    "_current_learning_rate", "_training_state", "_train_counter", "_supports_tf_logs", "_built",
    "_chief_worker_only", "_trackable_children", "_lookup_dependency", "_SEED_GENERATOR",
}
# Reaching into another module's frames (to find TensorFlow's objects there) is _compat's job too.
_FRAME_ATTRIBUTES = {"f_locals", "tb_frame"}


def _private(name: object) -> bool:
    return isinstance(name, str) and name.startswith("_") and not name.startswith("__")


def _own_private_names(trees) -> set[str]:
    """The private names tfdist defines outside _compat: functions, classes, module and class
    names, ``self._x`` attributes, arguments and import aliases."""
    names: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _on_self(node):
                names.add(node.attr)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.alias):
                names.add((node.asname or node.name).split(".")[-1])
    return {n for n in names if _private(n)}


def _on_self(node: ast.Attribute) -> bool:
    return isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")


def _local_functions(tree) -> set[str]:
    return {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def private_reaches(tree: ast.AST, own: set[str]) -> list[str]:
    """Where ``tree`` imports TensorFlow's or Keras' private modules, touches their private
    attributes, rebinds a method of an object it does not own, or walks frames."""
    found = []
    functions = _local_functions(tree)
    modules = {(a.asname or a.name).split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    for node in ast.walk(tree):
        where = f"line {getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            found += [f"{where}: import {a.name}" for a in node.names if a.name.startswith(_PRIVATE_MODULES)]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(_PRIVATE_MODULES):
            found.append(f"{where}: from {node.module} import ...")
        elif isinstance(node, ast.Attribute):
            name = node.attr
            if name in _FRAME_ATTRIBUTES or name in _KNOWN_TF_KERAS_PRIVATE or name == "__internal__":
                found.append(f"{where}: {ast.unparse(node)}")
            elif _private(name) and not _on_self(node) and (
                    isinstance(node.ctx, ast.Store) or name not in own | _STDLIB_PRIVATE):
                found.append(f"{where}: {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) >= 2:
            text = node.args[1].value if isinstance(node.args[1], ast.Constant) else None
            if node.func.id in ("getattr", "hasattr", "setattr", "delattr") and _private(text) and (
                    text in _KNOWN_TF_KERAS_PRIVATE or text not in own or node.func.id in ("setattr", "delattr")):
                found.append(f"{where}: {ast.unparse(node)}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "__setattr__" \
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "object" \
                and not (node.args and isinstance(node.args[0], ast.Name) and node.args[0].id == "self"):
            found.append(f"{where}: {ast.unparse(node)} (rebinds past the object's own __setattr__)")
        if isinstance(node, ast.Assign):  # obj.method = a local function: rebinding someone else's method
            rebinds = isinstance(node.value, ast.Lambda) or (
                isinstance(node.value, ast.Name) and node.value.id in functions)
            for target in node.targets:
                if rebinds and isinstance(target, ast.Attribute) and not _on_self(target) and not (
                        isinstance(target.value, ast.Name) and target.value.id in modules):  # sys.excepthook
                    found.append(f"{where}: {ast.unparse(target)} = {ast.unparse(node.value)} (rebinds a method)")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                node.value.startswith(tuple(m + "." for m in _PRIVATE_MODULES)):  # importlib.import_module("...")
            found.append(f"{where}: {node.value!r}")
    return found


_OUTSIDE_COMPAT = sorted(n for n in MODULES if n != _COMPAT and not n.startswith(_COMPAT + "."))
_OWN = _own_private_names(ast.parse(MODULES[n].read_text()) for n in _OUTSIDE_COMPAT)


@pytest.mark.parametrize("name", _OUTSIDE_COMPAT)
def test_only_compat_reaches_private_tensorflow_and_keras(name):
    hits = private_reaches(ast.parse(MODULES[name].read_text()), _OWN)
    assert not hits, f"{name} reaches private TensorFlow/Keras parts: {hits}. Fix: add an entry to tfdist._compat"


def test_tfdist_defines_none_of_the_known_tensorflow_and_keras_private_names():
    assert not (_OWN & _KNOWN_TF_KERAS_PRIVATE), sorted(_OWN & _KNOWN_TF_KERAS_PRIVATE)


def test_every_known_private_name_is_reached_by_compat():
    """The list names what _compat really reaches: a name no entry uses any more is dropped from it."""
    compat = "".join(MODULES[n].read_text() for n in MODULES if n.startswith(_COMPAT))
    assert not [n for n in _KNOWN_TF_KERAS_PRIVATE if n not in compat]


@pytest.mark.parametrize("source", [
    "from tensorflow.python.framework import kernels",
    "import keras.src.random",
    "x = importlib.import_module('tf_keras.src.engine')",
    "model._symbolic_build(data_batch=b)",
    "getattr(model, '_compile_loss', None)",
    "strategy._tfdist_name = 'x'",
    "setattr(strategy, '_tfdist_name', 'x')",
    "v = layer._some_new_private",
    "base = tf.__internal__.tracking.Trackable",
    "self._supports_tf_logs = True",
    "def f(v):\n    def add(x):\n        return x\n    v.assign_add = add",
    "object.__setattr__(tracker, 'update_state', f)",
    "tb.tb_frame.f_locals",
])
def test_the_private_reach_check_catches(source):
    assert private_reaches(ast.parse(source), _OWN)


@pytest.mark.parametrize("source", [
    "self._cache = {}",
    "os._exit(2)",
    "source._parse(x)",
    "model.built = False",
    "object.__setattr__(self, 'devices', ())",
    "import sys\ndef f():\n    def hook(*a):\n        pass\n    sys.excepthook = hook",
    "value = obj.public_name",
])
def test_the_private_reach_check_leaves_tfdist_own_names_alone(source):
    assert not private_reaches(ast.parse(source), _OWN | {"_cache", "_parse"})


# --- strategy names: only the strategy modules compare them ------------------------------------------------------

_STRATEGY_NAMES = {"one_device", "mirrored", "multi_worker_mirrored", "central_storage", "parameter_server"}
_STRATEGY_NAME_CONSTANTS = {"ONE_DEVICE", "MIRRORED", "MULTI_WORKER_MIRRORED", "CENTRAL_STORAGE", "PARAMETER_SERVER"}
# Where names are defined and resolved: the registry, the auto rule and each kind's class.
_NAMING_MODULES = ("tfdist.strategy", "tfdist.strategy_kinds")


def _names_a_strategy(node: ast.AST) -> bool:
    """True for a strategy name's literal or constant, or a tuple, list or set holding one."""
    if isinstance(node, ast.Constant):
        return node.value in _STRATEGY_NAMES
    if isinstance(node, ast.Name):
        return node.id in _STRATEGY_NAME_CONSTANTS
    if isinstance(node, ast.Attribute):
        return node.attr in _STRATEGY_NAME_CONSTANTS
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_a_strategy(element) for element in node.elts)
    return False


def strategy_name_comparisons(tree: ast.AST) -> list[str]:
    """Where ``tree`` compares something with a strategy name (``==``, ``!=``, ``in``, ``not in``)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn))
                                                 for op in node.ops):
            if any(_names_a_strategy(operand) for operand in (node.left, *node.comparators)):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n not in _NAMING_MODULES and not n.startswith(_COMPAT)))
def test_no_module_but_the_strategy_ones_branches_on_a_strategy_name(name):
    hits = strategy_name_comparisons(ast.parse(MODULES[name].read_text()))
    assert not hits, (f"{name} compares strategy names: {hits}. Fix: ask the strategy object "
                      "(tfdist.strategy_kinds.Strategy) what its kind means, e.g. strategy.coordinated")


@pytest.mark.parametrize("source", [
    "if name == 'parameter_server': pass",
    "x = kind != \"central_storage\"",
    "x = name in (strategy_mod.ONE_DEVICE, strategy_mod.PARAMETER_SERVER)",
    "x = strategy_mod.name_of(s) == strategy_mod.CENTRAL_STORAGE",
    "x = MIRRORED == name",
    "x = name not in ['mirrored']",
])
def test_the_strategy_name_check_catches(source):
    assert strategy_name_comparisons(ast.parse(source))


@pytest.mark.parametrize("source", [
    "x = strategy.coordinated",
    "x = kind is strategy_mod.KINDS.get(name)",
    "log.info('under parameter_server')",
    "x = name == 'auto'",
])
def test_the_strategy_name_check_leaves_other_code_alone(source):
    assert not strategy_name_comparisons(ast.parse(source))
