"""Examples read by index from a random-access data source (``tfds.data_source`` over ArrayRecord): exact global shuffle.

The order is the in-memory arrays' one (a seeded permutation of all examples, computed per
position), but every batch is read from the files through ``tf.numpy_function``: nothing is
held in memory. Python runs in the input pipeline, so this source serves the synchronous
strategies only; under parameter servers (the pipeline runs in other processes) it is refused.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Callable, Sequence

import numpy as np

from tfdist.data.arrays import scaled
from tfdist.errors import DataError


class IndexedSource:
    """``(x, y)`` examples of a random-access source: ``source[i]`` is a dict holding ``x_key`` and ``y_key``."""

    index_addressable = True

    def __init__(self, source: Any, *, x_key: str, y_key: str, name: str, num_classes: int | None = None,
                 identity: Sequence = ()):
        self.source = source
        self.x_key, self.y_key = x_key, y_key
        self.name = name
        self.num_classes = num_classes
        self._identity = list(identity)
        self._num_examples = len(source)
        if self._num_examples == 0:
            raise DataError(f"`data` is empty; received {name} with 0 examples. Fix: prepare the data set again.")
        first = self._read(np.array([0]))
        self._x_spec = (first[0].dtype, first[0].shape[1:])
        self._y_spec = (first[1].dtype, first[1].shape[1:])

    def _read(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        items = self.source.__getitems__([int(i) for i in indices]) if hasattr(self.source, "__getitems__") else [
            self.source[int(i)] for i in indices]
        if not items:  # a replica past the end of its validation part: an empty batch of the same types
            return np.zeros((0, *self._x_spec[1]), self._x_spec[0]), np.zeros((0, *self._y_spec[1]), self._y_spec[0])
        x = np.stack([np.asarray(item[self.x_key]) for item in items])
        y = np.stack([np.asarray(item[self.y_key]) for item in items])
        return scaled(x), y.astype(np.int64) if np.issubdtype(y.dtype, np.integer) else y

    @property
    def num_examples(self) -> int:
        return self._num_examples

    @property
    def example_shape(self) -> tuple[int, ...]:
        return tuple(self._x_spec[1])

    @property
    def example_bytes(self) -> int:
        """Bytes of one example and its label, as read."""
        return int(sum(np.dtype(dtype).itemsize * int(np.prod(shape)) for dtype, shape in (self._x_spec, self._y_spec)))

    def fingerprint(self) -> str:
        """The data set's identity (name, split, files and their lengths) and its first and last examples."""
        digest = hashlib.sha256(json.dumps([self.name, self._num_examples, self._identity]).encode())
        for i in (0, self._num_examples - 1):
            x, y = self._read(np.array([i]))
            digest.update(x.tobytes() + y.tobytes())
        return digest.hexdigest()[:16]

    def gather_fn(self, *, embed: bool = False) -> Callable:
        import tensorflow as tf

        if embed:
            raise DataError(
                f"{self.name} is read by index through Python (tf.numpy_function), which parameter-server workers "
                "cannot run. Fix: use a synchronous strategy, or prepare the data set as TFRecord "
                "(file_format='tfrecord') to read it with the file source."
            )
        (x_dtype, x_shape), (y_dtype, y_shape) = self._x_spec, self._y_spec  # what _read returns

        def gather(idx):
            x, y = tf.numpy_function(self._read, [idx], (tf.as_dtype(x_dtype), tf.as_dtype(y_dtype)), stateful=False)
            x.set_shape(idx.shape.concatenate(x_shape))
            y.set_shape(idx.shape.concatenate(y_shape))
            return x, y

        return gather

    def sample(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        return self._read(np.arange(min(count, self._num_examples)))
