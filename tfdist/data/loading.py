"""Named data: ``digits``, ``.npz`` files, ``tfds:NAME``, TFRecord globs; and what ``fit`` accepts as ``data``."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from tfdist.data.arrays import ArraySource, scaled
from tfdist.data.files import TFRecordSource
from tfdist.data.images import ImageFolderSource
from tfdist.data.indexed import IndexedSource
from tfdist.data.pydataset import PyDatasetSource, is_pydataset
from tfdist.data.stream import StreamSource
from tfdist.data.user_pipeline import UserPipeline, is_batched
from tfdist.errors import DataError

DATA_FORMS = ("'digits', 'tfds:NAME', a path to an .npz file, a folder of images in class subfolders, or a "
              "TFRecord glob with a feature spec")
DEFAULT_IMAGE_SIZE = (256, 256)
"""Every image is resized to this unless told otherwise (Keras' default)."""
IMAGE_VALIDATION_FRACTION = 0.2


def _split(x: np.ndarray, y: np.ndarray, validation_fraction: float, name: str) -> tuple[ArraySource, ArraySource]:
    order = np.random.RandomState(0).permutation(len(x))  # fixed: the split never depends on the run's seed
    cut = len(x) - int(round(len(x) * validation_fraction))
    return (ArraySource(x[order[:cut]], y[order[:cut]], name=f"{name}[train]"),
            ArraySource(x[order[cut:]], y[order[cut:]], name=f"{name}[validation]"))


DIGITS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "digits.csv.gz")
"""The 1,797 8x8 digits scikit-learn bundles, shipped with tfdist (``digits.NOTICE`` beside it)."""


def load_digits(validation_fraction: float = 0.2) -> tuple[ArraySource, ArraySource]:
    """The 8x8 handwritten digits bundled with tfdist (1,797 images, 10 classes; nothing is downloaded).

    They are scikit-learn's ``load_digits()`` data, read from tfdist's own copy of its file.

    Args:
      validation_fraction: The share held out for validation, chosen by a fixed permutation.

    Returns:
      ``(train, validation)`` sources: ``x`` of shape ``(n, 8, 8, 1)`` in ``[0, 1]`` (float32),
      ``y`` the labels (int32).
    """
    rows = np.loadtxt(DIGITS_FILE, delimiter=",", dtype=np.float32)
    x = (rows[:, :-1].reshape(-1, 8, 8) / 16.0)[..., None]
    return _split(x, rows[:, -1].astype(np.int32), validation_fraction, "digits")


def _read_npz(path: str) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file on any TensorFlow filesystem (``gs://bucket/data.npz``)."""
    import io
    import zipfile

    from tfdist import storage

    try:
        with np.load(io.BytesIO(storage.read_bytes(path)) if storage.is_url(path) else path,
                     allow_pickle=False) as archive:
            if not hasattr(archive, "files"):
                raise ValueError("a single array, not an archive of named arrays")
            return {key: archive[key] for key in archive.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise DataError(f"cannot read the .npz file; received data={path!r} ({type(e).__name__}: "
                        f"{str(e).splitlines()[0][:120] if str(e) else 'empty'}). Fix: pass an .npz file written by "
                        "np.savez(path, x=..., y=...).") from None


def _check_rows(key: str, a: np.ndarray, path: str) -> None:
    if a.ndim == 0 or not (np.issubdtype(a.dtype, np.number) or a.dtype == bool):
        raise DataError(f"{key} in the .npz file must be a numeric array with one row per example; received "
                        f"{key} of dtype {a.dtype} and shape {a.shape} in {path!r}. Fix: save numeric arrays.")


def load_npz(path: str, validation_fraction: float = 0.2) -> tuple[ArraySource, ArraySource | None]:
    """``x`` and ``y`` (and optionally ``x_val``, ``y_val``) of an ``.npz`` file; every defect is a DataError."""
    arrays = _read_npz(path)
    if "x" not in arrays or "y" not in arrays:
        raise DataError(
            f"the .npz file must hold arrays named x and y; received {path!r} with {sorted(arrays)}. "
            "Fix: save it with np.savez(path, x=..., y=...) (and optionally x_val=..., y_val=...); for a model "
            "that trains without labels (a GAN, an autoencoder), call tfdist.fit(build, x) in a script, which "
            "`tfdist launch` runs on every task."
        )
    if ("x_val" in arrays) != ("y_val" in arrays):
        given = "x_val" if "x_val" in arrays else "y_val"
        raise DataError(f"the .npz file holds {given} without its pair; received {path!r} with {sorted(arrays)}. "
                        "Fix: save both x_val and y_val, or neither.")
    pairs = [("x", "y")] + ([("x_val", "y_val")] if "x_val" in arrays else [])
    for xk, yk in pairs:
        x, y = arrays[xk], arrays[yk]
        for key, a in ((xk, x), (yk, y)):
            _check_rows(key, a, path)
        if len(x) != len(y):
            raise DataError(f"{xk} and {yk} in the .npz file differ in length; received {xk} with {len(x)} rows and "
                            f"{yk} with {len(y)} in {path!r}. Fix: save one label per example.")
        if len(x) == 0:
            raise DataError(f"{xk} in the .npz file is empty; received {path!r}. Fix: save at least one example.")
    if "x_val" in arrays and arrays["x_val"].shape[1:] != arrays["x"].shape[1:]:
        raise DataError(f"x_val and x in the .npz file differ in example shape; received {arrays['x_val'].shape[1:]} and "
                        f"{arrays['x'].shape[1:]} in {path!r}. Fix: save validation examples shaped like the training ones.")
    x = scaled(arrays["x"])
    if not validation_fraction and "x_val" not in arrays:  # all of it, nothing held out
        return ArraySource(x, arrays["y"], name=path), None
    if "x_val" in arrays:
        return ArraySource(x, arrays["y"], name=path), ArraySource(scaled(arrays["x_val"]), arrays["y_val"], name=path)
    if len(x) < 2:
        raise DataError(f"the .npz file holds {len(x)} example, too few to split off validation data; received {path!r}. "
                        "Fix: save more examples, or x_val and y_val.")
    return _split(x, arrays["y"], validation_fraction, path)


def load_files(pattern: str | list[str], features: str, *, validation: str | list[str] | None = None,
               cache_dir: str | None = None):
    """TFRecord files parsed with a feature spec: a JSON file, or ``tfds:NAME`` (that data set's features)."""
    from tfdist.data import features as features_mod

    if features.startswith("tfds:"):
        from tfdist.data import tfds as tfds_mod

        name = features[len("tfds:"):]
        b = tfds_mod.builder(name)
        parse, classes = tfds_mod.parse_fn(b, name), tfds_mod.num_classes(b, name)
    else:
        spec = features_mod.check_spec(features_mod.read_spec(features), where=features)
        parse, classes = features_mod.parse_fn_from_spec(spec, where=features), spec.get("num_classes")
    train = TFRecordSource(pattern, parse, cache_dir=cache_dir, num_classes=classes)
    val = TFRecordSource(validation, parse, cache_dir=cache_dir, num_classes=classes) if validation else None
    return train, val


def load_images(directory: str, *, validation: str | None = None,
                image_size: tuple[int, int] | None = None) -> tuple[ImageFolderSource, ImageFolderSource]:
    """A folder of images in class subfolders: (training, validation), the validation images from
    their own folder (the same classes) or a fixed fifth of the files (``ImageFolderSource.split``)."""
    train = ImageFolderSource(directory, image_size=image_size or DEFAULT_IMAGE_SIZE)
    if validation is None:
        return train.split(IMAGE_VALIDATION_FRACTION)
    return train, ImageFolderSource(validation, image_size=train.image_size, class_names=train.class_names)


def names_a_data_set(spec: str) -> bool:
    """Whether ``--data`` names a whole data set (``digits``, ``tfds:NAME``, an ``.npz``), not TFRecord files."""
    return spec == "digits" or spec.startswith("tfds:") or spec.endswith(".npz")


def _names_a_folder(spec: Any, features: str | None) -> bool:
    """Whether ``--data`` names a folder (of images): one path, no feature spec, not a data set name."""
    if not (isinstance(spec, str) and spec and features is None and not names_a_data_set(spec)):
        return False
    import tensorflow as tf

    return tf.io.gfile.isdir(spec)


def _needs_features(received: str) -> DataError:
    return DataError(f"TFRecord data needs a feature spec; received {received} without one. Fix: pass --features "
                     "spec.json (or --features tfds:NAME); in Python, tfdist.TFRecordSource(files, parse_fn).")


def load(spec: str | list[str], *, features: str | None = None, validation: str | list[str] | None = None,
         cache_dir: str | None = None, image_size: tuple[int, int] | None = None) -> tuple[Any, Any]:
    """Resolves the CLI's ``--data``: ``digits``, ``tfds:NAME``, a path to an ``.npz``, a folder of
    images in class subfolders, or TFRecord files.

    TFRecord files (a path, a glob, or a list of paths) need ``features``: a JSON feature spec (see
    ``tfdist.data.features``) or ``tfds:NAME``; ``validation`` names validation files (or, for
    images, the folder of validation images). ``image_size`` applies to images only.
    """
    folder = _names_a_folder(spec, features)
    if image_size is not None and not folder:
        raise DataError(f"an image size applies to a folder of images only; received data={spec!r} with image size "
                        f"{image_size[0]}x{image_size[1]}. Fix: drop the image size, or pass a folder of images in "
                        "class subfolders.")
    if isinstance(spec, (list, tuple)) and spec and all(isinstance(p, str) for p in spec):  # TFRecord files
        if features is None:
            raise _needs_features(f"{len(spec)} files")
        return load_files(list(spec), features, validation=validation, cache_dir=cache_dir)
    if not isinstance(spec, str) or not spec:
        raise DataError(f"unknown data; received data={spec!r}. Fix: use {DATA_FORMS}.")
    if features is None and validation is None:
        if spec == "digits":
            return load_digits()
        if spec.startswith("tfds:"):
            from tfdist.data import tfds as tfds_mod

            name = spec[len("tfds:"):]
            if not name:
                raise DataError("no data set name; received data='tfds:'. Fix: write tfds:NAME, e.g. tfds:mnist.")
            return tfds_mod.load(name, cache_dir=cache_dir)
        if spec.endswith(".npz"):
            return load_npz(spec)
    elif names_a_data_set(spec):
        given = "--features" if features is not None else "--validation-data"
        raise DataError(f"{given} applies to TFRecord files only; received data={spec!r} with {given}. "
                        f"Fix: drop {given}, or pass TFRecord files as the data.")
    if features is None:
        import tensorflow as tf

        if folder:
            if isinstance(validation, list):
                raise DataError(f"validation images are one folder; received {len(validation)} paths. Fix: pass the "
                                "folder of validation images in class subfolders.")
            return load_images(spec, validation=validation, image_size=image_size)
        looks_like_files = any(c in spec for c in "*?[") or tf.io.gfile.exists(spec)
        if looks_like_files:
            raise _needs_features(f"data={spec!r}")
        raise DataError(f"unknown data; received data={spec!r}. Fix: use {DATA_FORMS}.")
    return load_files(spec, features, validation=validation, cache_dir=cache_dir)


def load_to_evaluate(spec: str | list[str], *, features: str | None = None, image_size: tuple[int, int] | None = None,
                     model_image_size: tuple[int, int] | None = None) -> Any:
    """What evaluating ``spec`` (``tfdist evaluate --data``, or a name passed to ``tfdist.evaluate``)
    reads: the held-out split of a named data set (``digits``, ``tfds:NAME``: its validation, else
    test split; an ``.npz``: its ``x_val`` and ``y_val``), else all of it (an ``.npz`` without them,
    every image of a folder, every record of TFRecord files).

    ``image_size`` is the user's (a folder only, as for ``load``); a folder's images are otherwise
    resized to ``model_image_size`` (the model's input), else to the default size."""
    if isinstance(spec, str) and features is None and image_size is None and names_a_data_set(spec):
        train, held_out = load_npz(spec, validation_fraction=0) if spec.endswith(".npz") else load(spec)
        if held_out is None and not spec.endswith(".npz"):
            raise DataError(f"{spec} has no validation or test split prepared; received data={spec!r}. Fix: prepare "
                            "one, or pass the examples to evaluate (arrays, files, or a folder of images).")
        return held_out if held_out is not None else train
    if _names_a_folder(spec, features):  # every image, none held out
        return ImageFolderSource(spec, image_size=image_size or model_image_size or DEFAULT_IMAGE_SIZE)
    return load(spec, features=features, image_size=image_size)[0]  # files; or the error load gives


def load_to_predict(spec: str | list[str], *, features: str | None = None, image_size: tuple[int, int] | None = None,
                    model_image_size: tuple[int, int] | None = None) -> Any:
    """What predicting ``spec`` (``tfdist predict --data``) reads; no labels are needed: an
    ``.npz``'s ``x`` (every row), every image under a folder at any depth (``labels=None``: no
    class subfolders needed), else what ``load_to_evaluate`` reads (a named data set's held-out
    split, every record of TFRecord files)."""
    if isinstance(spec, str) and spec.endswith(".npz") and features is None and image_size is None:
        arrays = _read_npz(spec)
        if "x" not in arrays:
            raise DataError(f"the .npz file must hold the inputs as an array named x; received {spec!r} with "
                            f"{sorted(arrays)}. Fix: save it with np.savez(path, x=...).")
        _check_rows("x", arrays["x"], spec)
        return unlabelled(scaled(arrays["x"]), name=spec)
    if _names_a_folder(spec, features):
        return ImageFolderSource(spec, labels=None, image_size=image_size or model_image_size or DEFAULT_IMAGE_SIZE)
    return load_to_evaluate(spec, features=features, image_size=image_size, model_image_size=model_image_size)


def unlabelled(x: Any, *, name: str = "arrays") -> ArraySource:
    """Inputs without labels (an array, or a dict, list or tuple of arrays), as a source whose
    labels are zeros, which a predict step ignores."""
    import tensorflow as tf

    if not all(isinstance(leaf, np.ndarray) for leaf in tf.nest.flatten(x)):
        x = np.asarray(x)  # numbers in nested lists: one array
    return ArraySource(x, np.zeros(len(tf.nest.flatten(x)[0]), np.int32), name=name)


def as_source(data: Any) -> Any:
    """Turns what the user passed as ``data`` into a source."""
    import tensorflow as tf

    if isinstance(data, (ArraySource, ImageFolderSource, IndexedSource, PyDatasetSource, StreamSource, TFRecordSource,
                         UserPipeline)):
        return data
    if isinstance(data, str):
        return load(data)[0]
    if isinstance(data, tf.data.Dataset):
        return UserPipeline(data) if is_batched(data) else StreamSource(data)
    if isinstance(data, tf.distribute.DistributedDataset):
        raise DataError("tfdist distributes the data itself; received a tf.distribute.DistributedDataset. Fix: pass the "
                        "dataset before strategy.experimental_distribute_dataset, or the dataset_fn(input_context) "
                        "given to distribute_datasets_from_function.")
    if callable(data) and not is_pydataset(data) and not isinstance(data, type):
        return UserPipeline(dataset_fn=data)
    if is_pydataset(data):
        return PyDatasetSource(data)
    if isinstance(data, (tuple, list)) and len(data) in (2, 3):
        return ArraySource(*data)
    if isinstance(data, np.ndarray) or isinstance(data, dict) or isinstance(data, tuple) and len(data) == 1:
        return ArraySource(data[0] if isinstance(data, tuple) else data)  # x alone, as Keras' fit(x)
    raise DataError(
        f"unsupported `data`; received {type(data).__name__}"
        f"{f' of length {len(data)}' if isinstance(data, (tuple, list)) else ''}. Fix: pass (x, y) or "
        "(x, y, sample_weight) NumPy arrays (or x alone, for a model that needs no labels), tfdist.TFRecordSource(files, parse_fn), tfdist.ImageFolderSource(directory), "
        "a keras.utils.PyDataset (Sequence) with __len__, a tf.data.Dataset (batched: your own pipeline; unbatched: tfdist "
        "batches it), a dataset_fn(input_context), or a name such as 'digits' or 'tfds:mnist'."
    )


def with_labels(x: Any, y: Any) -> tuple:
    """Keras' ``fit(x, y)``/``evaluate(x, y)``: ``(x, y)``, for arrays only (any other data holds its own labels)."""
    # A name, a tfdist source, a tf.data.Dataset, a Keras PyDataset.
    if isinstance(x, str) or callable(getattr(x, "fingerprint", None)) or hasattr(x, "element_spec") or is_pydataset(x):
        raise DataError(f"`y` is given with data that holds its own labels; received data of type {type(x).__name__}. "
                        "Fix: leave y out, or pass arrays as x: fit(model, x, y) or evaluate(model, x, y).")
    return x, y


def num_classes(train: Any, validation: Any = None) -> int:
    """The number of classes of labelled data: the largest label + 1 (arrays), else what the source declares."""
    if isinstance(train, ArraySource):
        labels = [s.y for s in (train, validation) if isinstance(s, ArraySource)]
        nested = [y for y in labels if not isinstance(y, np.ndarray)]
        if nested:
            raise DataError("the number of classes of labels in several arrays is undefined; received y as "
                            f"{'a dict' if isinstance(nested[0], dict) else 'a list or tuple'} of arrays. "
                            "Fix: pass one label array, shape (N,).")
        for y in labels:
            flat = y.reshape(len(y), -1)
            integral = np.issubdtype(y.dtype, np.integer) or (
                np.issubdtype(y.dtype, np.floating) and np.all(np.isfinite(y)) and np.all(np.floor(y) == y))
            if flat.shape[1] != 1 or not integral or y.min() < 0:
                raise DataError(
                    f"the labels must be class numbers 0, 1, ... (one integer per example); received y of dtype {y.dtype}, "
                    f"shape {y.shape}, smallest {y.min().item()!r}. Fix: save y as non-negative integers, shape (N,)."
                )
        return int(max(int(y.max()) for y in labels)) + 1
    classes = getattr(train, "num_classes", None)
    if classes is None:
        raise DataError(
            f"the number of classes of {getattr(train, 'name', 'the data')!r} is unknown; received no num_classes. "
            'Fix: add "num_classes": N to the feature spec (or use a TFDS data set whose label is a ClassLabel).'
        )
    return int(classes)
