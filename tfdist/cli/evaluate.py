"""``tfdist evaluate``: a trained model file's loss and metrics on a data set, under any strategy."""

from __future__ import annotations

import argparse
import json

from tfdist.cli import _args, _quiet


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "evaluate",
        help="evaluate a trained model file (.keras) on a data set, every example once",
        description="Loads a Keras model file (what tfdist train writes as OUTPUT_DIR/model.keras, or "
        "tfdist.save_model) with the Keras that wrote it, under the strategy the cluster calls for, and "
        "prints its loss and metrics on --data: each replica evaluates its own part, every example counts once. "
        "Run the same command on every task of a cluster (tfdist launch does it). "
        "Exit codes: 0 done, 2 bad input, 76 a peer was lost.",
    )
    parser.add_argument("model", metavar="MODEL", help="the model file (.keras), on any TensorFlow filesystem, "
                        "e.g. runs/tfdist/model.keras")
    data = parser.add_argument_group("data")
    data.add_argument("--data", default="digits", metavar="DATA", nargs="+",
                      help="'digits' or 'tfds:NAME' (their held-out split: validation, else test; default digits), an "
                      ".npz (its x_val and y_val, else x and y), a folder of images in one subfolder per class (every "
                      "image), or TFRecord files with --features (every record)")
    data.add_argument("--features", default=None, metavar="SPEC",
                      help="how to parse TFRecord --data: a JSON feature spec or tfds:NAME (as for tfdist train)")
    data.add_argument("--image-size", type=_args.image_size, default=None, metavar="HxW",
                      help="the size the images of a --data folder are resized to (default: the model's input size)")
    data.add_argument("--batch-size", type=_args.positive_int, default=None, help="global batch (default 32 per replica)")
    data.add_argument("--per-replica-batch-size", type=_args.positive_int, default=None, help="batch per replica")
    out = parser.add_argument_group("output")
    out.add_argument("--json", default=None, metavar="PATH", help="also write the metrics as JSON (chief only)")
    out.add_argument("--verbose", type=int, choices=[0, 1, 2], default=None,
                     help="Keras verbosity (default: 1 on a terminal, else 2)")
    dist = parser.add_argument_group("distribution")
    dist.add_argument("--strategy", default="auto", help="auto, one_device, mirrored, multi_worker_mirrored, "
                      "central_storage, parameter_server (the chief evaluates alone)")
    dist.add_argument("--cpu-devices", type=_args.positive_int, default=None, metavar="N",
                      help="split the CPU into N logical devices (GPU stand-ins)")
    parser.set_defaults(func=run_command)


def run_command(args: argparse.Namespace) -> int:
    from tfdist import cluster as cluster_mod
    from tfdist import storage
    from tfdist.training import export

    cluster = cluster_mod.detect()  # an invalid TF_CONFIG fails here, before TensorFlow starts
    export.check_name(args.model, what="MODEL", reading=True)
    _quiet.import_tensorflow()
    storage.check_supported(args.model, what="MODEL")
    if args.json:
        storage.check_supported(args.json, what="--json")
    from tfdist import data as data_mod
    from tfdist import strategy as strategy_mod
    from tfdist.startup import serve
    from tfdist.training import evaluate
    from tfdist.training.evaluation import image_size_of

    devices = strategy_mod.split_cpu(args.cpu_devices) if args.cpu_devices else None
    if not strategy_mod.trains_here(args.strategy, cluster):  # a parameter-server job's workers and ps
        serve(cluster)
        return 0
    strategy = strategy_mod.make_strategy(args.strategy, cluster=cluster, devices=devices)
    model = export.load_model(args.model, strategy=strategy, what="MODEL")
    source = data_mod.load_to_evaluate(_args.one_or_files(args.data, "--data"), features=args.features,
                                       image_size=args.image_size, model_image_size=image_size_of(model))
    metrics = evaluate(model, source, batch_size=args.batch_size, per_replica_batch_size=args.per_replica_batch_size,
                       verbose=args.verbose if args.verbose is not None else "auto", cluster=cluster)
    if cluster.is_chief:
        shown = "; ".join(f"{key} {value:.4f}" for key, value in metrics.items())
        print(f"tfdist evaluate: {shown} ({source.num_examples} examples; strategy "
              f"{strategy_mod.name_of(strategy)}, {strategy.num_replicas_in_sync} replica(s))", flush=True)
        if args.json:
            storage.makedirs(storage.dirname(storage.absolute(args.json)))
            storage.write_atomic(args.json, json.dumps(dict(metrics, examples=source.num_examples), indent=2))
    return 0
