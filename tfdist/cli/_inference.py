"""What ``tfdist evaluate`` and ``tfdist predict`` share: the model file, the data and the
distribution arguments, and loading the model under the strategy the cluster calls for."""

from __future__ import annotations

import argparse
from typing import Any

from tfdist.cli import _args


def add_arguments(parser: argparse.ArgumentParser, *, data_help: str) -> tuple[Any, Any]:
    """Adds MODEL and the data and distribution groups; returns the (data, output) groups for the
    command's own arguments."""
    parser.add_argument("model", metavar="MODEL", help="the model file (.keras), on any TensorFlow filesystem, "
                        "e.g. runs/tfdist/model.keras")
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help="import MODULE before loading the model: the module that defines and registers its "
                        "custom layers, losses or metrics (on PYTHONPATH or in the current directory; repeatable)")
    data = parser.add_argument_group("data")
    data.add_argument("--data", default="digits", metavar="DATA", nargs="+", help=data_help)
    data.add_argument("--features", default=None, metavar="SPEC",
                      help="how to parse TFRecord --data: a JSON file of the feature spec, or tfds:NAME (as for tfdist train)")
    data.add_argument("--image-size", type=_args.image_size, default=None, metavar="HxW",
                      help="the size the images of a --data folder are resized to (default: the model's input size)")
    data.add_argument("--batch-size", type=_args.positive_int, default=None, help="global batch (default 32 per replica)")
    data.add_argument("--per-replica-batch-size", type=_args.positive_int, default=None, help="batch per replica")
    out = parser.add_argument_group("output")
    out.add_argument("--verbose", type=int, choices=[0, 1, 2], default=None,
                     help="Keras verbosity (default: 1 on a terminal, else 2)")
    dist = parser.add_argument_group("distribution")
    dist.add_argument("--strategy", default="auto", help="auto, one_device, mirrored, multi_worker_mirrored, "
                      "central_storage, parameter_server (the chief runs the model alone)")
    dist.add_argument("--cpu-devices", type=_args.positive_int, default=None, metavar="N",
                      help="split the CPU into N logical devices (GPU stand-ins)")
    return data, out


def load(args: argparse.Namespace, *, outputs: dict[str, str | None]) -> tuple[Any, Any, Any] | None:
    """``(cluster, strategy, model)``: the model of ``args.model`` loaded in the scope of the
    strategy the cluster calls for; None on a parameter-server job's workers and ps, which have
    served the chief when this returns. ``outputs`` (``{flag: path}``) are checked first."""
    from tfdist import cluster as cluster_mod
    from tfdist import storage
    from tfdist.cli import _quiet
    from tfdist.training import export

    cluster = cluster_mod.detect()  # an invalid TF_CONFIG fails here, before TensorFlow starts
    export.check_name(args.model, what="MODEL", reading=True)
    _quiet.import_tensorflow()
    storage.check_supported(args.model, what="MODEL")
    storage.check_output_files(outputs, writer=cluster.is_chief)  # the chief writes them, before any work
    from tfdist import strategy as strategy_mod
    from tfdist.startup import serve

    devices = strategy_mod.split_cpu(args.cpu_devices) if args.cpu_devices else None
    _import_modules(args.imports)
    if not strategy_mod.trains_here(args.strategy, cluster):  # a parameter-server job's workers and ps
        serve(cluster)
        return None
    strategy = strategy_mod.make_strategy(args.strategy, cluster=cluster, devices=devices)
    return cluster, strategy, export.load_model(args.model, strategy=strategy, what="MODEL")


def _import_modules(names: list[str]) -> None:
    """Imports the ``--import`` modules (custom Keras classes register themselves on import)."""
    import importlib
    import os
    import sys

    from tfdist.errors import ModelError

    if names and "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would find it
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise ModelError(f"--import cannot import {name!r}: {e}. Fix: name a module on PYTHONPATH or in the "
                             "current directory, e.g. --import my_layers for ./my_layers.py.") from None


def read_data(args: argparse.Namespace, model: Any, load: Any) -> Any:
    """The source of ``--data``, as ``load`` (``data.load_to_evaluate`` or ``load_to_predict``)
    reads it; a folder's images at the model's input size unless ``--image-size``."""
    from tfdist.training.evaluation import image_size_of

    return load(_args.one_or_files(args.data, "--data"), features=args.features, image_size=args.image_size,
                model_image_size=image_size_of(model))


def options(args: argparse.Namespace, cluster: Any) -> dict[str, Any]:
    """The keyword arguments of ``tfdist.evaluate`` and ``tfdist.predict`` the flags give."""
    return dict(batch_size=args.batch_size, per_replica_batch_size=args.per_replica_batch_size,
                verbose=args.verbose if args.verbose is not None else "auto", cluster=cluster)


def describe(source: Any, strategy: Any) -> str:
    """``"360 examples; strategy mirrored, 2 replica(s)"``."""
    return (f"{source.num_examples} examples; strategy {strategy.name}, "
            f"{strategy.num_replicas_in_sync} replica(s)")


def write_output(path: str, payload: str | bytes) -> None:
    """Writes a command's output file atomically, on any filesystem, making its folder."""
    from tfdist import storage

    storage.makedirs(storage.dirname(storage.absolute(path)))
    storage.write_atomic(path, payload)
