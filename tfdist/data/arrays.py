"""In-memory examples ``(x, y)``: NumPy arrays addressed by index, never copied into a graph needlessly."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from tfdist.errors import DataError

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

# Under parameter servers the dataset function is traced once and its graph sent to every
# worker, arrays included; a graph cannot hold a tensor above 2 GiB, and a few hundred MB
# already make every worker slow to start. Larger data belongs in files (TFRecordSource).
MAX_EMBEDDED_BYTES = 64 << 20


def scaled(x: np.ndarray) -> np.ndarray:
    """Features as float32: integers (e.g. uint8 pixels) divided by their type's maximum, floats kept."""
    if np.issubdtype(x.dtype, np.integer):
        return (x.astype(np.float32) / float(np.iinfo(x.dtype).max)).astype(np.float32)
    return x.astype(np.float32, copy=False)


def hash_arrays(*arrays: np.ndarray) -> str:
    """A short content hash (at most ~64 MB of each array is read, evenly strided)."""
    digest = hashlib.sha256()
    for array in arrays:
        array = np.ascontiguousarray(array)
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        flat = array.reshape(-1).view(np.uint8) if array.size else np.zeros(0, np.uint8)
        stride = max(1, flat.size // (64 << 20))
        digest.update(flat[::stride].tobytes())
    return digest.hexdigest()[:16]


class ArraySource:
    """In-memory examples ``(x, y)``, addressable by index."""

    index_addressable = True

    def __init__(self, x: Any, y: Any, *, name: str = "arrays"):
        self.x = np.asarray(x)
        self.y = np.asarray(y)
        if self.x.ndim == 0 or self.y.ndim == 0 or len(self.x) != len(self.y):
            raise DataError(
                f"`data` must be (x, y) with one label per example; received x of shape {self.x.shape} and "
                f"y of shape {self.y.shape}. Fix: pass arrays with the same first dimension."
            )
        if len(self.x) == 0:
            raise DataError(f"`data` is empty; received {name} with 0 examples. Fix: pass at least one batch of examples.")
        for label, array in (("x", self.x), ("y", self.y)):
            if array.dtype == object:
                raise DataError(
                    f"`data` {label} must be a numeric array; received an array of Python objects from {name}. "
                    f"Fix: convert {label} to a numeric dtype (np.asarray({label}, np.float32))."
                )
        self.name = name
        self._fingerprint: str | None = None

    @property
    def num_examples(self) -> int:
        return len(self.x)

    @property
    def example_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    @property
    def nbytes(self) -> int:
        return int(self.x.nbytes + self.y.nbytes)

    @property
    def example_bytes(self) -> int:
        """Bytes of one example and its label."""
        return int(self.x[:1].nbytes + self.y[:1].nbytes)

    def fingerprint(self) -> str:
        if self._fingerprint is None:
            self._fingerprint = hash_arrays(self.x, self.y)
        return self._fingerprint

    def gather_fn(self, *, embed: bool = False) -> Callable[["tf.Tensor"], tuple]:
        """``indices -> (x[indices], y[indices])`` for a dataset function.

        In-process pipelines (every synchronous strategy) gather from the NumPy arrays through
        ``tf.numpy_function``: no copy of the data, nothing in the graph. ``embed=True``
        (parameter servers: the graph runs in other processes) puts the arrays into the graph
        as constants, and refuses arrays above ``MAX_EMBEDDED_BYTES``.
        """
        import tensorflow as tf

        x_spec = tf.TensorSpec((None, *self.x.shape[1:]), tf.as_dtype(self.x.dtype))
        y_spec = tf.TensorSpec((None, *self.y.shape[1:]), tf.as_dtype(self.y.dtype))
        if embed:
            if self.nbytes > MAX_EMBEDDED_BYTES:
                raise DataError(
                    f"in-memory data of {self.nbytes / 2**20:.0f} MiB is too large to send to parameter-server "
                    f"workers inside the dataset function (limit {MAX_EMBEDDED_BYTES >> 20} MiB); received {self.name}. "
                    "Fix: write it as TFRecord files and pass tfdist.TFRecordSource(files, parse_fn), "
                    "or use a synchronous strategy."
                )
            x, y = tf.constant(self.x), tf.constant(self.y)
            return lambda idx: (tf.gather(x, idx), tf.gather(y, idx))
        xs, ys = self.x, self.y

        def gather(idx):
            bx, by = tf.numpy_function(lambda i: (xs[i], ys[i]), [idx], (x_spec.dtype, y_spec.dtype), stateful=False)
            bx.set_shape(idx.shape.concatenate(x_spec.shape[1:]))
            by.set_shape(idx.shape.concatenate(y_spec.shape[1:]))
            return bx, by

        return gather

    def sample(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        return self.x[:count], self.y[:count]
