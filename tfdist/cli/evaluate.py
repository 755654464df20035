"""``tfdist evaluate``: a trained model file's loss and metrics on a data set, under any strategy."""

from __future__ import annotations

import argparse
import json

from tfdist.cli import _inference


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
    _, out = _inference.add_arguments(
        parser, data_help="'digits' or 'tfds:NAME' (their held-out split: validation, else test; default digits), an "
        ".npz (its x_val and y_val, else x and y), a folder of images in one subfolder per class (every "
        "image), or TFRecord files with --features (every record)")
    out.add_argument("--json", default=None, metavar="PATH", help="also write the metrics as JSON (chief only)")
    parser.set_defaults(func=run_command)


def run_command(args: argparse.Namespace) -> int:
    loaded = _inference.load(args, outputs={"--json": args.json})
    if loaded is None:
        return 0
    cluster, strategy, model = loaded
    from tfdist import data as data_mod
    from tfdist.training import evaluate

    source = _inference.read_data(args, model, data_mod.load_to_evaluate)
    metrics = evaluate(model, source, **_inference.options(args, cluster))
    if cluster.is_chief:
        shown = "; ".join(f"{key} {value:.4f}" for key, value in metrics.items())
        print(f"tfdist evaluate: {shown} ({_inference.describe(source, strategy)})", flush=True)
        if args.json:
            _inference.write_output(args.json, json.dumps(dict(metrics, examples=source.num_examples), indent=2))
    return 0
