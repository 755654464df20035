"""tfdist: distributed Keras training on TensorFlow in one call, resumable at the exact step.

The public API is loaded lazily, so that ``import tfdist`` (and the CLI's ``--help``) does
not import TensorFlow.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from tfdist import _signals
from tfdist import env as _env
from tfdist import errors as _errors
from tfdist._version import __version__
from tfdist.errors import (
    BatchSizeError,
    CheckpointError,
    CheckpointMismatchError,
    ClusterConfigError,
    DataError,
    LaunchError,
    ModelError,
    PeerUnavailableError,
    PlanError,
    StorageError,
    StrategyError,
    TfdistError,
)

_signals.install()  # before anything slow: a preemption signal from here on exits 75, never by its default action

_LAZY = {
    "fit": "tfdist.training",
    "evaluate": "tfdist.training",
    "predict": "tfdist.training",
    "CheckpointOptions": "tfdist.checkpoint.checkpointer",
    "StrategyOptions": "tfdist.strategy",
    "make_strategy": "tfdist.strategy",
    "Strategy": "tfdist.strategy_kinds",
    "split_cpu": "tfdist.strategy",
    "detect_cluster": ("tfdist.cluster", "detect"),
    "ClusterSpec": "tfdist.cluster",
    "plan": "tfdist.planning",
    "Plan": "tfdist.planning",
    "TFRecordSource": "tfdist.data.files",
    "ImageFolderSource": "tfdist.data.images",
    "save_model": "tfdist.training.export",
    "load_model": "tfdist.training.export",
    "export": "tfdist.training.export",
    "is_chief": "tfdist.callbacks",
    "task_role": "tfdist.callbacks",
    "run_evaluator": "tfdist.training.evaluator",
}

__all__ = [
    "__version__",
    "fit",
    "evaluate",
    "predict",
    "CheckpointOptions",
    "StrategyOptions",
    "make_strategy",
    "Strategy",
    "split_cpu",
    "detect_cluster",
    "ClusterSpec",
    "plan",
    "Plan",
    "TFRecordSource",
    "ImageFolderSource",
    "save_model",
    "load_model",
    "export",
    "is_chief",
    "task_role",
    "run_evaluator",
    "callbacks",
    "tracking",
    "TfdistError",
    "ClusterConfigError",
    "StrategyError",
    "BatchSizeError",
    "DataError",
    "ModelError",
    "CheckpointError",
    "StorageError",
    "CheckpointMismatchError",
    "PeerUnavailableError",
    "PlanError",
    "LaunchError",
]

if _env.in_cluster():  # bad input must not be restarted in vain, a lost peer must be
    _errors.install_task_hook()

if TYPE_CHECKING:  # pragma: no cover
    from tfdist.cluster import ClusterSpec
    from tfdist.cluster import detect as detect_cluster
    from tfdist.data.files import TFRecordSource
    from tfdist.data.images import ImageFolderSource
    from tfdist.training import evaluate, fit, predict
    from tfdist.callbacks import is_chief, task_role
    from tfdist.training.evaluator import run_evaluator
    from tfdist.checkpoint.checkpointer import CheckpointOptions
    from tfdist.training.export import export, load_model, save_model
    from tfdist.planning import Plan, plan
    from tfdist.strategy import StrategyOptions, make_strategy, split_cpu
    from tfdist.strategy_kinds import Strategy


_SUBMODULES = ("callbacks", "tracking")
"""Modules of the public API reached as attributes (``tfdist.callbacks.chief_only``)."""


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"tfdist.{name}")
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'tfdist' has no attribute {name!r}")
    module_name, attr = target if isinstance(target, tuple) else (target, name)
    value = getattr(importlib.import_module(module_name), attr)
    globals()[name] = value
    return value
