"""``tfdist train``: the main job -- a built-in model or the user's own on a data set, under any strategy, resumable."""

from __future__ import annotations

import argparse
import json

from tfdist.cli import _args, _quiet

DEFAULT_OUTPUT_DIR = "runs/tfdist"
DEFAULT_LEARNING_RATE = 2e-3


def _class_weight(text: str) -> dict[int, float]:
    """``0=1,1=5.5`` -> ``{0: 1.0, 1: 5.5}``."""
    weights = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        try:
            if not sep or int(key) < 0 or not float(value) >= 0 or float(value) == float("inf") or int(key) in weights:
                raise ValueError
            weights[int(key)] = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected CLASS=WEIGHT pairs separated by commas (class >= 0, each once, weight >= 0), e.g. 0=1,1=5; "
                f"received {text!r}") from None
    return weights


def register(subparsers) -> None:
    from tfdist.models import DEFAULT_KERAS, DEFAULT_MODEL, KERAS_VERSIONS, MODELS

    parser = subparsers.add_parser(
        "train",
        help="train a built-in model or your own (default: a small CNN on the bundled digits data)",
        description="Trains a built-in model, or your own (--model MODULE:FUNCTION), with tfdist.fit under the "
        "strategy the cluster calls for. "
        "Run the same command on every task of a cluster (tfdist launch does it). Checkpoints go to "
        "OUTPUT_DIR/checkpoints; running the same command again resumes at the exact step. "
        "Exit codes: 0 done, 2 bad input, 75 preempted (saved; restart to resume), 76 a peer was lost, "
        "130 Ctrl-C (the step it came in is saved; run again to resume).",
    )
    model = parser.add_argument_group("model and data")
    model.add_argument("--model", default=DEFAULT_MODEL, type=_args.model_name, metavar="MODEL",
                       help=f"a built-in model ({', '.join(sorted(MODELS))}; default {DEFAULT_MODEL}), or "
                       "MODULE:FUNCTION, your function that builds and returns a compiled Keras model, e.g. "
                       "my_pkg.models:build (a module on PYTHONPATH or in the current directory; it gets input_shape "
                       "and num_classes of the data if it has such parameters)")
    model.add_argument("--keras", default=None, choices=KERAS_VERSIONS,
                       help="build the model with Keras 3 (TensorFlow's default Keras, `import keras`) or 2 (tf_keras); "
                       f"default {DEFAULT_KERAS}, or the Keras your --model module imports")
    model.add_argument("--data", default="digits", metavar="DATA", nargs="+",
                       help="'digits' (bundled, default), 'tfds:NAME' (prepared in TFDS_DATA_DIR), a path to an .npz "
                       "with x and y, a folder of images in one subfolder per class (as Keras' "
                       "image_dataset_from_directory reads; a fixed fifth of the files validates), or TFRecord files with "
                       "--features: paths or a glob, quoted or expanded by the shell (e.g. DIR/train-*.tfrecord; several "
                       "files are read in sorted order, as a glob's matches)")
    model.add_argument("--image-size", type=_args.image_size, default=None, metavar="HxW",
                       help="the size every image of a --data folder is resized to, e.g. 180x180 (default 256x256)")
    model.add_argument("--features", default=None, metavar="SPEC",
                       help="how to parse TFRecord --data: a JSON file of the feature spec (x, y, num_classes; see tfdist.data.features) "
                       "or tfds:NAME (that data set's features)")
    model.add_argument("--validation-data", default=None, metavar="FILES", nargs="+",
                       help="TFRecord validation files (paths or a glob, quoted or not), parsed with --features; or, "
                       "for a folder of images, the folder of validation images")
    model.add_argument("--validation-freq", type=_args.positive_int, default=1, metavar="N",
                       help="validate after every N-th epoch (default 1)")
    model.add_argument("--class-weight", type=_class_weight, default=None, metavar="C=W,...",
                       help="weigh training examples by class, e.g. 0=1,1=5 (classes left out weigh 1)")
    model.add_argument("--learning-rate", type=_args.positive_float, default=None,
                       help=f"Adam learning rate of a built-in model (default {DEFAULT_LEARNING_RATE})")
    model.add_argument("--mixed-precision", choices=["mixed_float16", "mixed_bfloat16"], default=None, help="Keras mixed-precision policy")

    run = parser.add_argument_group("training")
    run.add_argument("--epochs", type=_args.positive_int, default=15, help="epochs (default 15)")
    run.add_argument("--batch-size", type=_args.positive_int, default=None, help="global batch per optimizer step (default 32 per replica)")
    run.add_argument("--per-replica-batch-size", type=_args.positive_int, default=None, help="micro batch per replica")
    run.add_argument("--grad-accum-steps", type=_args.positive_int, default=1, help="micro batches accumulated per optimizer step")
    run.add_argument("--steps-per-epoch", type=_args.positive_int, default=None, help="optimizer steps per epoch (default: the whole data)")
    run.add_argument("--seed", type=_args.seed, default=0,
                     help=f"seed of Python, NumPy, TensorFlow and the data order, 0 to {_args.MAX_SEED} (default 0)")
    run.add_argument("--deterministic", action="store_true", help="turn on TensorFlow's op determinism")
    run.add_argument("--output-dir", default=DEFAULT_OUTPUT_DIR, help=f"TensorBoard logs and checkpoints (default {DEFAULT_OUTPUT_DIR})")
    run.add_argument("--summary-json", default=None, metavar="PATH", help="write the run's summary as JSON (chief only)")
    saving = run.add_mutually_exclusive_group()
    saving.add_argument("--save-model", default=None, metavar="PATH",
                        help="when the run is complete, write the trained model as a Keras file (by the chief; default "
                        "OUTPUT_DIR/model.keras; load it with keras.models.load_model)")
    saving.add_argument("--no-save-model", action="store_true", help="do not write the trained model")
    run.add_argument("--export-savedmodel", default=None, metavar="DIR",
                     help="when the run is complete, also write the trained model as a SavedModel for serving (by the "
                     "chief; TensorFlow Serving, Vertex AI, TFLite read it), e.g. OUTPUT_DIR/serving/1")
    run.add_argument("--mlflow", nargs="?", const="", default=None, metavar="URI",
                     help="log the run to MLflow once, from the chief: its options, per-epoch metrics and summary; a "
                     "resumed run continues the same MLflow run (default URI: file:OUTPUT_DIR/mlruns; needs "
                     "pip install 'tfdist[mlflow]')")
    run.add_argument("--profile-steps", type=_args.step_range, default=None, metavar="FIRST,LAST",
                     help="write a TensorBoard profile of these global steps (from 1), by the chief, e.g. 10,20 "
                     "(OUTPUT_DIR/tensorboard/train/plugins/profile; TensorBoard's Profile tab)")
    run.add_argument("--verbose", type=int, choices=[0, 1, 2], default=None, help="Keras verbosity (default: 1 on a terminal, else 2)")

    dist = parser.add_argument_group("distribution")
    dist.add_argument("--strategy", default="auto", help="auto, one_device, mirrored, multi_worker_mirrored, central_storage, parameter_server")
    dist.add_argument("--cpu-devices", type=_args.positive_int, default=None, metavar="N", help="split the CPU into N logical devices (GPU stand-ins)")
    dist.add_argument("--all-reduce", default="auto", help="auto|ring|nccl (multi-worker); auto|nccl|hierarchical_copy|reduce_to_one (mirrored)")
    dist.add_argument("--bytes-per-pack", type=int, default=0, help="gradient bytes per all-reduce pack (0: TensorFlow decides)")
    dist.add_argument("--collective-timeout", type=_args.positive_float, default=None, metavar="S", help="fail a collective that takes longer than S seconds")

    ckpt = parser.add_argument_group("checkpointing")
    ckpt.add_argument("--checkpoint-dir", default=None, help="default OUTPUT_DIR/checkpoints")
    ckpt.add_argument("--save-every-steps", type=_args.positive_int, default=None, metavar="N", help="also save every N steps")
    ckpt.add_argument("--save-every-seconds", type=_args.positive_float, default=None, metavar="S", help="also save every S seconds")
    ckpt.add_argument("--keep", type=_args.positive_int, default=3, help="recent checkpoints kept (default 3)")
    ckpt.add_argument("--keep-every-hours", type=_args.positive_float, default=None, metavar="H", help="also keep one checkpoint every H hours")
    ckpt.add_argument("--sync-save", action="store_true", help="save synchronously (default: in the background)")
    ckpt.add_argument("--no-resume", action="store_true", help="do not resume; refuses to run if checkpoints exist")
    ckpt.add_argument("--allow-changes", action="store_true", help="resume even if batch size, model or data changed")
    parser.set_defaults(func=run_command)


def _callbacks(args: argparse.Namespace, keras: str, log_dir: str, cluster) -> list:
    """TensorBoard, and with --mlflow the MLflow logger (the run's options as its parameters)."""
    from tfdist import models

    callbacks = [models.keras_module(keras).callbacks.TensorBoard(log_dir=log_dir)]
    if args.mlflow is not None:
        from tfdist import tracking

        options = {key: value for key, value in sorted(vars(args).items()) if key not in ("func", "command", "mlflow")}
        callbacks.append(tracking.MLflowLogger(args.mlflow or tracking.default_uri(args.output_dir),
                                               params=dict(options, keras=keras), cluster=cluster))
    return callbacks


def _step(summary) -> str:
    total = summary.epochs * summary.steps_per_epoch
    if summary.global_step <= total:
        return f"step {summary.global_step}/{total}"
    return f"step {summary.global_step} (a complete run, past the {total} steps of --epochs {summary.epochs})"


def _summary_line(summary) -> str:
    parts = [
        f"strategy {summary.strategy} ({summary.num_replicas} replica(s), {summary.num_workers} worker(s)"
        + (f", all-reduce {summary.all_reduce})" if summary.all_reduce else ")"),
        f"global batch {summary.global_batch_size}",
        _step(summary),
    ]
    if summary.final_loss is not None:
        parts.append(f"loss {summary.final_loss:.4f}")
    if summary.val_accuracy is not None:
        parts.append(f"val_accuracy {summary.val_accuracy:.4f}")
    if summary.examples_per_sec:
        parts.append(f"{summary.examples_per_sec:,.0f} examples/s")
    parts.append(f"{summary.wall_seconds:.1f} s")
    return "; ".join(parts)


def _check_outputs(cluster, outputs: dict[str, str | None], checkpoint_dir: str) -> None:
    """Refuses, before training, a file the chief could not write when the run is complete, or
    that would be written among the checkpoints (over the state file, say)."""
    from tfdist import storage
    from tfdist.errors import StorageError

    for flag, path in outputs.items():
        if path is not None and (storage.dirname(storage.absolute(path)).rstrip("/")
                                 == storage.absolute(checkpoint_dir).rstrip("/")):
            raise StorageError(f"{flag} would be written among the run's checkpoints; received {flag}={path!r} in "
                               f"{checkpoint_dir!r}. Fix: name a file outside the checkpoint directory.")
    storage.check_output_files(outputs, writer=cluster.is_chief)


def _export_dir(cluster, path: str | None, checkpoint_dir: str) -> None:
    """Refuses, before training, a --export-savedmodel directory among the checkpoints, or one the chief
    could not write (a file, or a directory of other files, in the way)."""
    if path is None:
        return
    from tfdist import storage
    from tfdist.errors import StorageError
    from tfdist.training import export

    absolute, checkpoints = storage.absolute(path).rstrip("/"), storage.absolute(checkpoint_dir).rstrip("/")
    if absolute == checkpoints or absolute.startswith(checkpoints + "/") or checkpoints.startswith(absolute + "/"):
        raise StorageError(f"--export-savedmodel would be written among the run's checkpoints; received "
                           f"--export-savedmodel={path!r} and checkpoints in {checkpoint_dir!r}. Fix: name a "
                           "directory outside the checkpoint directory, e.g. OUTPUT_DIR/serving/1.")
    if cluster.is_chief:
        export.check_export_path(path)


def _model_builder(args: argparse.Namespace, train, num_classes: int, keras: str):
    """The function ``fit`` calls to build the model: a built-in one, or the user's --model MODULE:FUNCTION."""
    from tfdist import data as data_mod
    from tfdist import models

    if args.model in models.MODELS:
        pixels = isinstance(train, data_mod.ImageFolderSource)  # 0-255: the model rescales them first

        def builder():
            # Called by fit once the strategy exists: reading a file source's example shape runs
            # TensorFlow ops, which must not start before a multi-worker strategy is created.
            return models.builder(args.model, input_shape=train.example_shape, num_classes=num_classes,
                                  learning_rate=args.learning_rate or DEFAULT_LEARNING_RATE, keras=keras,
                                  rescale=1 / 255 if pixels else None)()

        builder.__name__ = f"build_{args.model}"
        return builder
    function = _user_function(args.model)

    def build_users():
        return models.user_builder(function, name=args.model, input_shape=train.example_shape, num_classes=num_classes,
                                   keras=keras)()

    build_users.__name__ = function.__name__
    return build_users


def _user_function(spec: str):
    """The function that ``--model MODULE:FUNCTION`` names (the module on PYTHONPATH or in the
    current directory, as ``python -m`` finds it)."""
    import importlib
    import os
    import sys

    from tfdist.errors import ModelError

    module, _, name = spec.partition(":")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        function = getattr(importlib.import_module(module), name, None)
    except ImportError as e:
        raise ModelError(f"--model cannot import {module!r}: {e}. Fix: name a module on PYTHONPATH or in the current "
                         "directory, e.g. --model my_models:build for ./my_models.py.") from None
    if not callable(function):
        raise ModelError(f"--model names no function {name!r} in module {module!r}; received --model {spec}. Fix: "
                         f"name a function of {module} that builds and returns a compiled Keras model.")
    return function


def run_command(args: argparse.Namespace) -> int:
    from tfdist import cluster as cluster_mod

    cluster = cluster_mod.detect()  # an invalid TF_CONFIG fails here, before TensorFlow starts
    from tfdist import storage
    from tfdist.training import export
    from tfdist.training.preemption import DeferredSignals, PreemptedAfterTheEnd

    model_path = None if args.no_save_model else args.save_model or storage.join(args.output_dir, "model" + export.SUFFIX)
    if model_path is not None:
        export.check_name(model_path)
    tf = _quiet.import_tensorflow()
    storage.check_supported(args.output_dir, what="--output-dir")
    storage.check_kept(args.output_dir, what="--output-dir")
    from tfdist.checkpoint import refuse_a_checkpoint_prefix

    refuse_a_checkpoint_prefix(args.output_dir, what="--output-dir")  # before anything creates it
    if args.checkpoint_dir:
        storage.check_kept(args.checkpoint_dir, what="--checkpoint-dir")
        refuse_a_checkpoint_prefix(args.checkpoint_dir, what="--checkpoint-dir")
    if cluster.is_chief:  # name a directory that cannot be written with its flag (its files go there)
        storage.check_writable(args.output_dir, what="--output-dir")
        if args.checkpoint_dir:
            storage.check_writable(args.checkpoint_dir, what="--checkpoint-dir")
    if model_path is not None:
        storage.check_supported(model_path, what="--save-model")  # save_model checks again, as `path`: fail first
    from tfdist.checkpoint import layout

    checkpoint_dir = args.checkpoint_dir or layout.checkpoint_dir_of(args.output_dir)
    if not args.checkpoint_dir and (storage.exists(layout.state_path(args.output_dir))
                                    or layout.found_checkpoints(args.output_dir)):
        from tfdist.errors import StorageError

        raise StorageError(f"--output-dir is a checkpoint directory (it holds ckpt-* files), not a run's output "
                           f"directory; received --output-dir={args.output_dir!r}. Fix: pass the folder above it "
                           f"({storage.dirname(storage.absolute(args.output_dir))!r}) to resume that run.")
    if args.checkpoint_dir:  # else it is under --output-dir, on the filesystem just checked
        storage.check_supported(checkpoint_dir, what="--checkpoint-dir")
    _check_outputs(cluster, {"--save-model": model_path, "--summary-json": args.summary_json}, checkpoint_dir)
    _export_dir(cluster, args.export_savedmodel, checkpoint_dir)
    from tfdist import models

    if args.learning_rate is not None and args.model not in models.MODELS:
        import logging

        logging.getLogger("tfdist").warning("--learning-rate applies to built-in models; --model %s compiles its own "
                                            "optimizer, and its learning rate is used", args.model)
    keras = args.keras or (models.DEFAULT_KERAS if args.model in models.MODELS
                           else models.keras_of_function(_user_function(args.model)) or models.DEFAULT_KERAS)
    if args.no_resume:
        from tfdist.checkpoint import refuse_to_start_over

        refuse_to_start_over(checkpoint_dir, what="--no-resume")
    devices = None
    if args.cpu_devices:
        from tfdist.strategy import split_cpu

        devices = split_cpu(args.cpu_devices)
    from tfdist import data as data_mod
    from tfdist.checkpoint import CheckpointOptions
    from tfdist.strategy import StrategyOptions
    from tfdist.training import fit

    # The record index of read-only data directories is cached next to the checkpoints.
    train, validation = data_mod.load(_args.one_or_files(args.data, "--data"), features=args.features,
                                      validation=_args.one_or_files(args.validation_data, "--validation-data"),
                                      cache_dir=checkpoint_dir, image_size=args.image_size)
    num_classes = data_mod.num_classes(train, validation)
    builder = _model_builder(args, train, num_classes, keras)
    if cluster.task_type == cluster_mod.EVALUATOR:
        from tfdist.training.evaluator import run_evaluator

        run_evaluator(builder, validation or train, checkpoint_dir=checkpoint_dir,
                      log_dir=storage.join(args.output_dir, "tensorboard", "eval"))
        return 0

    log_dir = storage.join(args.output_dir, "tensorboard")
    from tfdist.strategy import trains_here

    serves = not trains_here(args.strategy, cluster)  # a parameter-server job's workers and ps run no callbacks
    try:
        history = fit(
            builder,
            train,
            epochs=args.epochs,
            batch_size=args.batch_size,
            per_replica_batch_size=args.per_replica_batch_size,
            steps_per_epoch=args.steps_per_epoch,
            strategy=args.strategy,
            validation_data=validation,
            validation_freq=args.validation_freq,
            callbacks=[] if serves else _callbacks(args, keras, log_dir, cluster),
            profile_steps=None if serves else args.profile_steps,
            seed=args.seed,
            deterministic=args.deterministic,
            verbose=args.verbose if args.verbose is not None else "auto",
            grad_accum_steps=args.grad_accum_steps,
            class_weight=args.class_weight,
            mixed_precision=args.mixed_precision,
            checkpoint_dir=checkpoint_dir,
            save_every_steps=args.save_every_steps,
            checkpoint_options=CheckpointOptions(
                save_every_seconds=args.save_every_seconds, keep=args.keep, keep_every_hours=args.keep_every_hours,
                async_save=not args.sync_save, resume=not args.no_resume, allow_changes=args.allow_changes,
            ),
            devices=devices,
            strategy_options=StrategyOptions(
                all_reduce=args.all_reduce, bytes_per_pack=args.bytes_per_pack,
                collective_timeout=args.collective_timeout,
            ),
            cluster=cluster,
        )
    except PreemptedAfterTheEnd as late:  # the run is complete and saved: its model file is written all the same
        history = late.history
    if history is None:  # a ps or worker task of a parameter-server cluster, stopped
        return 0
    summary = history.tfdist
    with DeferredSignals():  # a SIGTERM now waits for the model file: the run is complete
        if model_path is not None:
            export.save_model(history.model, model_path, cluster=cluster)
        if args.export_savedmodel is not None:
            export.export(history.model, args.export_savedmodel, cluster=cluster)
        if cluster.is_chief:
            print(f"tfdist train: {_summary_line(summary)}", flush=True)
            if args.summary_json:
                record = summary.as_dict()
                record["tensorflow"] = tf.__version__
                parent = storage.dirname(storage.absolute(args.summary_json))
                storage.makedirs(parent)
                storage.write_atomic(args.summary_json, json.dumps(record, indent=2))
    return 0
