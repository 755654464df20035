"""``tfdist predict``: a trained model file's outputs for every example of a data set, in the
order of the examples, written to a ``.csv``, ``.npy`` or ``.npz`` file."""

from __future__ import annotations

import argparse
from typing import Any

from tfdist.cli import _inference

FORMATS = (".csv", ".npy", ".npz")


def _output_file(text: str) -> str:
    if not text.lower().endswith(FORMATS) or text.rstrip("/") != text:
        raise argparse.ArgumentTypeError(f"expected a file name ending in {', '.join(FORMATS)}; received {text!r}")
    return text


def _class_names(text: str) -> str:
    if not text.strip(", "):
        raise argparse.ArgumentTypeError(f"expected names separated by commas, or a folder of class subfolders; "
                                         f"received {text!r}")
    return text


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "predict",
        help="write a trained model file's (.keras) outputs for every example of a data set",
        description="Loads a Keras model file (what tfdist train writes as OUTPUT_DIR/model.keras, or "
        "tfdist.save_model) with the Keras that wrote it, under the strategy the cluster calls for, and writes its "
        "outputs for every example of --data, in order, to --output: .csv (one row per example: its image's path or "
        "its index, the class with the largest output, then the outputs), .npy (the outputs) or .npz (the outputs, "
        "and the images' paths). Run the same command on every task of a cluster (tfdist launch does it); the chief "
        "writes the file. Exit codes: 0 done, 2 bad input, 76 a peer was lost.",
    )
    _, out = _inference.add_arguments(
        parser, data_help="'digits' or 'tfds:NAME' (their held-out split: validation, else test; default digits), an "
        ".npz (its x: no labels needed), a folder of images (every image at any depth: no class subfolders needed), "
        "or TFRecord files with --features (every record)")
    out.add_argument("--output", required=True, type=_output_file, metavar="PATH",
                     help="the file to write (chief only), on any TensorFlow filesystem: .csv, .npy or .npz")
    out.add_argument("--softmax", action="store_true",
                     help="write softmax probabilities instead of the raw outputs (for a model that outputs logits, as "
                     "tfdist train's models do)")
    out.add_argument("--class-names", type=_class_names, default=None, metavar="NAMES|FOLDER",
                     help="the classes, in the order the model numbers them, for the .csv's class column and header: "
                     "names separated by commas, or the training images' folder (its class subfolders, sorted)")
    parser.set_defaults(func=run_command)


def run_command(args: argparse.Namespace) -> int:
    loaded = _inference.load(args, outputs={"--output": args.output})
    if loaded is None:
        return 0
    cluster, strategy, model = loaded
    from tfdist import data as data_mod
    from tfdist.training import predict

    names = _resolve_class_names(args.class_names)
    _check_fits(model, args.output, names)  # before predicting
    source = _inference.read_data(args, model, data_mod.load_to_predict)
    outputs = predict(model, source, **_inference.options(args, cluster))
    if cluster.is_chief:
        if args.softmax:
            outputs = _map(_softmax, outputs)
        paths = source.paths() if isinstance(source, data_mod.ImageFolderSource) else None
        _inference.write_output(args.output, encode(outputs, args.output, paths=paths, class_names=names))
        print(f"tfdist predict: wrote {args.output} ({_inference.describe(source, strategy)})", flush=True)
    return 0


def _resolve_class_names(text: str | None) -> tuple[str, ...] | None:
    """``"cat,dog"`` -> ``("cat", "dog")``; a folder -> its class subfolders, as ImageFolderSource numbers them."""
    if text is None:
        return None
    import tensorflow as tf

    from tfdist.errors import DataError

    if tf.io.gfile.isdir(text):
        from tfdist.data.images import class_names_of

        return class_names_of(text)
    if "," not in text and ("/" in text or "\\" in text):
        raise DataError(f"--class-names names no folder; received --class-names={text!r}. Fix: pass the training "
                        "images' folder (its class subfolders), or names separated by commas.")
    names = tuple(name.strip() for name in text.split(","))
    if len(set(names)) != len(names):
        raise DataError(f"--class-names names a class twice; received --class-names={text!r}. Fix: name each class "
                        "once, in the order the model numbers them.")
    return names


def _output_shapes(model) -> list[tuple]:
    return [tuple(output.shape) for output in getattr(model, "outputs", None) or []]


def _check_fits(model, path: str, class_names: tuple[str, ...] | None) -> None:
    """Refuses, before predicting, an output file that cannot hold the model's outputs."""
    from tfdist.errors import ModelError

    shapes = _output_shapes(model)
    if not shapes:  # a subclassed model declares none: encode checks what it returns
        return
    suffix = path.lower()[-4:]
    if suffix in (".npy", ".csv") and len(shapes) != 1:
        raise ModelError(f"a {suffix} file holds one output; received --output {path!r} for a model with "
                         f"{len(shapes)} outputs. Fix: name an .npz file (one array per output).")
    if suffix == ".csv" and len(shapes[0]) > 2:
        raise ModelError(f"a .csv file holds one row of numbers per example; received --output {path!r} for outputs "
                         f"of shape {shapes[0]}. Fix: name an .npy or .npz file.")
    if class_names is not None:
        width = shapes[0][-1] if len(shapes) == 1 and len(shapes[0]) == 2 else None
        if width != len(class_names):
            raise ModelError(f"--class-names names one class per output of a classifier; received "
                             f"{len(class_names)} names ({', '.join(class_names[:5])}"
                             f"{', ...' if len(class_names) > 5 else ''}) for outputs of shape "
                             f"{', '.join(str(s) for s in shapes)}. Fix: name {width or 'one per output'} classes, "
                             "in the order the model numbers them, or leave --class-names out.")


def _map(fn, outputs: Any) -> Any:
    if isinstance(outputs, dict):
        return {key: fn(value) for key, value in outputs.items()}
    if isinstance(outputs, (list, tuple)):
        return [fn(value) for value in outputs]
    return fn(outputs)


def _softmax(values):
    import numpy as np

    shifted = values.astype(np.float64) - values.max(axis=-1, keepdims=True)
    exp = np.exp(shifted)
    return (exp / exp.sum(axis=-1, keepdims=True)).astype(values.dtype)


def encode(outputs: Any, path: str, *, paths: list[str] | None = None,
           class_names: tuple[str, ...] | None = None) -> bytes | str:
    """The content of ``path`` (``.csv``, ``.npy`` or ``.npz``, by its suffix) holding ``outputs``
    (what ``tfdist.predict`` returns), one row per example; ``paths`` name the examples (images)."""
    import io

    import numpy as np

    suffix = path.lower()[-4:]
    if suffix in (".csv", ".npy") and not isinstance(outputs, np.ndarray):
        from tfdist.errors import ModelError

        raise ModelError(f"a {suffix} file holds one output; received --output {path!r} for a model with "
                         f"{len(outputs)} outputs. Fix: name an .npz file (one array per output).")
    if suffix == ".csv":
        return _csv(outputs, paths=paths, class_names=class_names)
    buffer = io.BytesIO()
    if suffix == ".npy":
        np.save(buffer, outputs, allow_pickle=False)
    else:
        if isinstance(outputs, dict):
            arrays = {str(key): value for key, value in outputs.items()}
        elif isinstance(outputs, (list, tuple)):
            arrays = {f"output_{i}": value for i, value in enumerate(outputs)}
        else:
            arrays = {"outputs": outputs}
        if paths is not None:
            arrays["paths"] = np.array(paths)
        np.savez(buffer, **arrays)
    return buffer.getvalue()


def _csv(outputs, *, paths: list[str] | None, class_names: tuple[str, ...] | None) -> str:
    """One row per example: its path or index; with several columns, the class of the largest
    output (its name or number); then the outputs, as the shortest text of each float32."""
    import csv
    import io

    values = outputs.reshape(len(outputs), -1)
    header = ["path" if paths is not None else "index"]
    classes = values.shape[1] > 1
    if classes:
        names = class_names if class_names is not None else tuple(str(i) for i in range(values.shape[1]))
        header += ["class", *(f"output_{name}" for name in names)]
        best = [names[i] for i in values.argmax(axis=1)]
    else:
        header += ["output"]
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(header)
    for i, row in enumerate(values):
        writer.writerow([paths[i] if paths is not None else i, *([best[i]] if classes else []), *(str(v) for v in row)])
    return text.getvalue()
