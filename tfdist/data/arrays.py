"""In-memory examples ``(x, y)`` or ``(x, y, sample_weight)``: NumPy arrays (one per part, or a dict
or list of them) addressed by index, never copied into a graph needlessly."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from tfdist import _checks
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
        if array.dtype == object:  # strings (see _strings_as_text): their bytes, each with its length
            array = np.frombuffer(b"".join(len(v).to_bytes(8, "little") + v for v in array.reshape(-1)), np.uint8)
        array = np.ascontiguousarray(array)
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        flat = array.reshape(-1).view(np.uint8) if array.size else np.zeros(0, np.uint8)
        stride = max(1, flat.size // (64 << 20))
        digest.update(flat[::stride].tobytes())
    return digest.hexdigest()[:16]


def _as_arrays(value: Any) -> Any:
    """``value`` as a nest of NumPy arrays: dicts and lists/tuples of arrays are several inputs (as
    Keras reads them); anything else (an array, a tensor, a list of numbers, NumPy's included) is one array.
    A list of arrays becomes a tuple: tf.data reads a list in an element as one tensor to stack
    (which fails for arrays of different shapes), a tuple as several."""
    if isinstance(value, dict):
        return {key: _as_arrays(v) for key, v in value.items()}
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, dict) or getattr(v, "ndim", 0) >= 1
                                                          for v in value):
        return tuple(_as_arrays(v) for v in value)
    return np.asarray(value)


def numpy_gather(read: Callable[[np.ndarray], list], element: Any, leaves: list[np.ndarray]) -> Callable:
    """``indices -> element's nest of rows``: ``read(indices)`` run in Python (``tf.numpy_function``),
    returning one array per leaf of ``element`` in ``leaves``' dtypes and example shapes."""
    import tensorflow as tf

    dtypes = [tf.as_dtype(leaf.dtype) for leaf in leaves]

    def gather(idx):
        rows = tf.numpy_function(read, [idx], dtypes, stateful=False)
        for row, leaf in zip(rows, leaves):
            row.set_shape(idx.shape.concatenate(leaf.shape[1:]))
        return tf.nest.pack_sequence_as(element, rows)

    return gather


def _named(element: tuple, parts: tuple[str, ...]) -> tuple:
    """``element``'s structure holding each array's name, e.g. ``x['image']`` (for messages)."""

    def walk(value: Any, name: str) -> Any:
        if isinstance(value, dict):
            return {key: walk(v, f"{name}[{key!r}]") for key, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(walk(v, f"{name}[{i}]") for i, v in enumerate(value))
        return name

    return tuple(walk(value, part) for value, part in zip(element, parts))


def check_validation_split(fraction: Any) -> None:
    """Refuses a ``validation_split`` that is not a fraction strictly between 0 and 1."""
    if not (_checks.is_real(fraction) and 0 < fraction < 1):
        raise DataError(f"Invalid `validation_split`; received validation_split={fraction!r}. "
                        "Fix: pass a fraction between 0 and 1 (e.g. 0.2), or 0 for none.")


def split_point(count: int, fraction: Any, *, name: str, unit: str) -> int:
    """Keras' ``validation_split`` of ``count`` items: how many come before the held-out last
    ``fraction``; refuses a fraction that leaves either part empty (``unit``: what an item is)."""
    check_validation_split(fraction)
    cut = int(np.floor(count * (1.0 - fraction)))  # as Keras
    if cut == 0 or cut == count:
        part = "training" if cut == 0 else "validation"
        raise DataError(f"validation_split={fraction!r} of {count} {unit}s leaves no {part} {unit}s; received {name}. "
                        f"Fix: pass a fraction that leaves both parts at least one {unit}.")
    return cut


def _element(x: Any, y: Any, sample_weight: Any) -> Any:
    """One example's structure as Keras' ``fit`` passes it to ``train_step``: ``x`` alone when
    there are no labels (a tuple or list of inputs as ``(x,)``), else ``(x, y[, sample_weight])``."""
    if y is None:
        return (x,) if isinstance(x, (tuple, list)) else x
    return (x, y) if sample_weight is None else (x, y, sample_weight)


def inputs_of(element: Any) -> Any:
    """The inputs ``x`` of an element or batch: the first part of a tuple (``(x, y)``, or ``(x,)``
    holding a tuple of inputs), else the element itself (``x`` alone)."""
    return element[0] if isinstance(element, tuple) else element


def _strings_as_text(path: str, leaf: np.ndarray, name: str) -> np.ndarray:
    """``leaf``, with an array of Python objects that are all strings (a pandas column) as an array
    of UTF-8 bytes, which TensorFlow reads as ``tf.string``; other objects are refused."""
    if leaf.dtype != object:
        return leaf
    flat = leaf.reshape(-1)
    if flat.size and all(isinstance(v, (str, bytes)) for v in flat):
        return np.array([v.encode() if isinstance(v, str) else v for v in flat], dtype=object).reshape(leaf.shape)
    kinds = sorted({type(v).__name__ for v in flat[:1000]} - {"str", "bytes"})
    raise DataError(
        f"`data` {path} must be numbers or strings; received an array of Python objects ({', '.join(kinds)}) "
        f"from {name}. Fix: convert it to a numeric dtype (np.asarray(..., np.float32)), or to strings (.astype(str))."
    )


class ArraySource:
    """In-memory examples ``(x, y)``, ``(x, y, sample_weight)``, or ``x`` alone, addressable by index.

    ``x`` (and ``y``) may be one array or a dict, list or tuple of arrays (a model with several
    inputs or outputs); every array holds one row per example. ``sample_weight``, optional,
    weighs each example's loss and metrics (Keras' third element). Without ``y`` an element is
    ``x`` itself (a tuple of inputs becomes ``(x,)``), as Keras' ``fit(x)`` hands it to
    ``train_step``: autoencoders, VAEs, GANs. Arrays of Python strings (pandas' object
    columns) become string tensors.
    """

    index_addressable = True

    def __init__(self, x: Any, y: Any = None, sample_weight: Any = None, *, name: str = "arrays"):
        import tensorflow as tf

        self.x = _as_arrays(x)
        self.y = None if y is None else _as_arrays(y)
        self.sample_weight = None if sample_weight is None else _as_arrays(sample_weight)
        self.name = name
        if self.y is None and self.sample_weight is not None:
            raise DataError(f"`sample_weight` needs labels; received sample_weight without y from {name}. "
                            "Fix: pass (x, y, sample_weight), or leave sample_weight out.")
        self.labels_given = self.y is not None
        self._element = _element(self.x, self.y, self.sample_weight)
        self._paths: list[str] = tf.nest.flatten(_named(self._parts(), ("x", "y", "sample_weight")))
        self._leaves: list[np.ndarray] = [_strings_as_text(path, leaf, name)
                                          for path, leaf in zip(self._paths, tf.nest.flatten(self._element))]
        self._element = tf.nest.pack_sequence_as(self._element, self._leaves)
        if self.labels_given:
            self.x, self.y = self._element[:2]
        else:
            self.x = self._element[0] if isinstance(self.x, (tuple, list)) else self._element
        shapes = ", ".join(f"{path} of shape {leaf.shape}" for path, leaf in zip(self._paths[:6], self._leaves))
        if len(self._leaves) > 6:
            shapes += f", ... ({len(self._leaves)} arrays in all)"
        if any(leaf.ndim == 0 for leaf in self._leaves) or len({len(leaf) for leaf in self._leaves}) != 1:
            raise DataError(
                f"`data` must be x, (x, y) or (x, y, sample_weight) with one row per example in every array; received "
                f"{shapes}. Fix: pass arrays with the same first dimension."
            )
        if len(self._leaves[0]) == 0:
            raise DataError(f"`data` is empty; received {name} with 0 examples. Fix: pass at least one batch of examples.")
        self._fingerprint: str | None = None

    def _parts(self) -> tuple:
        """``(x,)``, ``(x, y)`` or ``(x, y, sample_weight)``: the parts given, for names in messages."""
        return tuple(part for part in (self.x, self.y, self.sample_weight) if part is not None)

    @property
    def num_examples(self) -> int:
        return len(self._leaves[0])

    @property
    def example_shape(self) -> Any:
        """The shape of one example's ``x`` (a nest of shapes for several inputs)."""
        import tensorflow as tf

        return tf.nest.map_structure(lambda a: tuple(a.shape[1:]), self.x)

    @property
    def nbytes(self) -> int:
        return int(sum(leaf.nbytes for leaf in self._leaves))

    @property
    def example_bytes(self) -> int:
        """Bytes of one example: its inputs, label and weight."""
        return int(sum(leaf[:1].nbytes for leaf in self._leaves))

    def fingerprint(self) -> str:
        if self._fingerprint is None:
            digest = hash_arrays(*self._leaves)
            if self._paths != ["x", "y"]:  # one x and one y hash as they always have: their runs resume
                digest = hashlib.sha256(f"{digest}{self._paths}".encode()).hexdigest()[:16]
            self._fingerprint = digest
        return self._fingerprint

    def gather_fn(self, *, embed: bool = False) -> Callable[["tf.Tensor"], tuple]:
        """``indices -> (x[indices], y[indices][, sample_weight[indices]])`` for a dataset function.

        In-process pipelines (every synchronous strategy) gather from the NumPy arrays through
        ``tf.numpy_function``: no copy of the data, nothing in the graph. ``embed=True``
        (parameter servers: the graph runs in other processes) puts the arrays into the graph
        as constants, and refuses arrays above ``MAX_EMBEDDED_BYTES``.
        """
        import tensorflow as tf

        element, leaves = self._element, self._leaves
        if embed:
            if self.nbytes > MAX_EMBEDDED_BYTES:
                raise DataError(
                    f"in-memory data of {self.nbytes / 2**20:.0f} MiB is too large to send to parameter-server "
                    f"workers inside the dataset function (limit {MAX_EMBEDDED_BYTES >> 20} MiB); received {self.name}. "
                    "Fix: write it as TFRecord files and pass tfdist.TFRecordSource(files, parse_fn), "
                    "or use a synchronous strategy."
                )
            constants = [tf.constant(leaf) for leaf in leaves]
            return lambda idx: tf.nest.pack_sequence_as(element, [tf.gather(c, idx) for c in constants])
        return numpy_gather(lambda i: [leaf[i] for leaf in leaves], element, leaves)

    def split(self, fraction: float) -> tuple["ArraySource", "ArraySource"]:
        """Keras' ``validation_split``: (the first examples, the last ``fraction`` of them), taken
        before any shuffling, sample weights included."""
        import tensorflow as tf

        cut = split_point(self.num_examples, fraction, name=self.name, unit="example")
        halves = [tf.nest.map_structure(lambda a, s=s: a[s], self._parts()) for s in (slice(None, cut), slice(cut, None))]
        return (ArraySource(*halves[0], name=f"{self.name}[:{cut}]"),
                ArraySource(*halves[1], name=f"{self.name}[{cut}:]"))

    def sample(self, count: int) -> Any:
        """The first ``count`` examples, structured as the batches are: ``(x, y)``, ``(x, y, sample_weight)``
        or ``x`` alone."""
        import tensorflow as tf

        return tf.nest.map_structure(lambda a: a[:count], self._element)
