"""TensorFlow Datasets prepared on disk (or in a bucket), read as TFRecord file sources: nothing loaded into memory.

Record counts come from the data set's metadata (``shard_lengths``): no pass over the data
before training. Nothing is ever downloaded: a data set that is not prepared gives an
error naming the fix. Data sets stored as ArrayRecord are read by index instead
(``IndexedSource``: an exact global shuffle, synchronous strategies only).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import numpy as np

from tfdist.errors import DataError

log = logging.getLogger("tfdist")


def builder(name: str, *, data_dir: str | None = None) -> Any:
    import tensorflow_datasets as tfds

    try:
        return tfds.builder(name, data_dir=data_dir)
    except Exception as e:  # tfds raises DatasetNotFoundError and friends
        raise DataError(f"unknown TensorFlow Datasets name; received 'tfds:{name}' ({type(e).__name__}: "
                        f"{str(e).splitlines()[0][:160]}). Fix: check the name with tfds.list_builders(), "
                        "or set TFDS_DATA_DIR to the directory where it is prepared.") from None


def _supervised(b, name: str) -> tuple[str, str]:
    keys = b.info.supervised_keys
    if not keys or len(keys) != 2 or not all(isinstance(k, str) for k in keys):
        raise DataError(
            f"TensorFlow Datasets '{name}' has no (input, label) supervised keys; received supervised_keys={keys!r}. "
            "Fix: pass tfdist.TFRecordSource(files, parse_fn) with your own parse_fn."
        )
    return keys[0], keys[1]


def num_classes(b, name: str) -> int | None:
    import tensorflow_datasets as tfds

    label = b.info.features[_supervised(b, name)[1]]
    return int(label.num_classes) if isinstance(label, tfds.features.ClassLabel) else None


def _scale(x):
    import tensorflow as tf

    if x.dtype.is_integer:
        return tf.cast(x, tf.float32) / float(np.iinfo(x.dtype.as_numpy_dtype).max)
    return tf.cast(x, tf.float32) if x.dtype != tf.float32 else x


def parse_fn(b, name: str) -> Callable:
    """``serialized -> (x, y)`` with the data set's own decoders; integer inputs scaled to [0, 1]."""
    import tensorflow as tf

    x_key, y_key = _supervised(b, name)
    features = b.info.features
    x_info, y_info = features[x_key], features[y_key]
    signature = (tf.TensorSpec(x_info.shape, x_info.dtype), tf.TensorSpec(y_info.shape, y_info.dtype))

    def one(serialized):
        example = features.deserialize_example(serialized)
        return example[x_key], example[y_key]

    def parse(serialized):
        x, y = tf.map_fn(one, serialized, fn_output_signature=signature)
        return _scale(x), y

    return parse


def _file_format(b) -> str:
    fmt = getattr(b.info, "file_format", None)
    return str(getattr(fmt, "value", fmt) or "tfrecord").lower()


def source(name: str, split: str, *, data_dir: str | None = None, cache_dir: str | None = None, b=None):
    """The ``split`` of a prepared TFDS data set as a ``TFRecordSource`` (or a stream for ArrayRecord data)."""
    from tfdist.data.files import TFRecordSource

    b = b or builder(name, data_dir=data_dir)
    if split not in (b.info.splits or {}):
        raise DataError(f"TensorFlow Datasets '{name}' has no split {split!r}; received splits "
                        f"{sorted(b.info.splits or {})}. Fix: prepare the data set (`tfds build {name}`).")
    info = b.info.splits[split]
    instructions = list(info.file_instructions)
    if not instructions:
        raise _not_prepared(name, b)
    files = [str(fi.filename) for fi in instructions]
    counts = [int(fi.take if fi.take is not None and fi.take >= 0 else fi.examples_in_shard) for fi in instructions]
    if any(fi.skip for fi in instructions):  # a sub-split: tfdist reads whole files
        raise DataError(f"tfdist reads whole TFDS splits; received tfds:{name} split {split!r}. Fix: use a whole split.")
    import tensorflow as tf

    missing = [f for f in files if not tf.io.gfile.exists(f)]
    if missing:
        raise _not_prepared(name, b)
    fmt = _file_format(b)
    if fmt == "array_record":
        return indexed(name, split, b)
    if fmt != "tfrecord":
        from tfdist.data.stream import StreamSource

        log.warning("TensorFlow Datasets '%s' is stored as %s, which tfdist cannot read by block or by index; "
                    "reading it in order as a stream. Fix: prepare it with file_format='tfrecord'", name, fmt)
        ds = b.as_dataset(split=split, as_supervised=True, shuffle_files=False)
        return StreamSource(ds.map(lambda x, y: (_scale(x), y)))
    return TFRecordSource(files, parse_fn(b, name), record_counts=counts, cache_dir=cache_dir,
                          num_classes=num_classes(b, name), name=f"tfds:{name}[{split}]")


def indexed(name: str, split: str, b):
    """An ArrayRecord split read by index (``tfds.data_source``): an exact global shuffle, synchronous strategies only."""
    from tfdist.data.indexed import IndexedSource

    try:
        random_access = b.as_data_source(split=split)
    except Exception as e:  # array_record missing or the files unreadable
        raise DataError(f"cannot read TensorFlow Datasets '{name}' [{split}] by index ({type(e).__name__}: "
                        f"{str(e).splitlines()[0][:160]}). Fix: pip install array_record, or prepare it with "
                        "file_format='tfrecord'.") from None
    x_key, y_key = _supervised(b, name)
    info = b.info.splits[split]
    identity = [[str(fi.filename).rsplit("/", 1)[-1], int(fi.examples_in_shard)] for fi in info.file_instructions]
    return IndexedSource(random_access, x_key=x_key, y_key=y_key, name=f"tfds:{name}[{split}]",
                         num_classes=num_classes(b, name), identity=identity)


def _not_prepared(name: str, b) -> DataError:
    return DataError(
        f"TensorFlow Datasets '{name}' is not prepared in {b.data_dir!r}; received data='tfds:{name}'. "
        f"Fix: run `tfds build {name}` where the network is reachable, then copy the data directory here "
        "(or set TFDS_DATA_DIR)."
    )


def load(name: str, *, data_dir: str | None = None, cache_dir: str | None = None):
    """``(train, validation)`` of a prepared data set: ``train`` and its ``validation`` (else ``test``) split."""
    b = builder(name, data_dir=data_dir)
    splits = list(b.info.splits.keys()) if b.info.splits else []
    if not splits:
        raise _not_prepared(name, b)
    train_split = "train" if "train" in splits else splits[0]
    val_split = next((s for s in ("validation", "test") if s in splits and s != train_split), None)
    train = source(name, train_split, data_dir=data_dir, cache_dir=cache_dir, b=b)
    val = source(name, val_split, data_dir=data_dir, cache_dir=cache_dir, b=b) if val_split else None
    return train, val
