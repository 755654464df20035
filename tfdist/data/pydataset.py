"""A Keras ``PyDataset`` (Keras 3; ``keras.utils.Sequence``) or tf_keras ``Sequence``: batches read by index.

Such a dataset is a Python object whose ``dataset[i]`` returns batch ``i`` -- ``(x, y)`` or
``(x, y, sample_weight)`` -- typically read and decoded from files. tfdist addresses its
examples by position: example ``k`` is row ``k % B`` of batch ``k // B`` (``B``, the batch
size, is read from batch 0). Epoch ``e`` visits the whole batches in a permutation seeded by
``(seed, e)`` (``shuffle=False``: in order), rows in their order, so a step's examples are
whole batches, each batch is read once, and a resumed run reads exactly the batches the
uninterrupted run would have read, in constant time. A last, smaller batch is left out of
training (every step has the same global batch) and kept for validation.

Batches are read through ``tf.numpy_function`` in tf.data's threads, at most ``workers`` at a
time (the dataset's own setting; 1 unless given, as in Keras). tfdist orders the batches
itself, so it does not call the dataset's ``on_epoch_begin``/``on_epoch_end`` (a reshuffle
there could not be replayed after a restart; a warning says so when they are overridden).
Synchronous strategies only: under parameter servers the pipeline runs in other processes.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import threading
from typing import Any, Callable

import numpy as np

from tfdist.data.arrays import _as_arrays, _named, inputs_of, numpy_gather
from tfdist.errors import DataError

log = logging.getLogger("tfdist")

CACHED_BATCHES = 4
"""Batches kept after a read: a step (or a validation batch) that starts in one batch and ends
in the next reads each once."""

_BASES = (("keras", "PyDataset"), ("tf_keras", "Sequence"), ("keras", "Sequence"))


def is_pydataset(data: Any) -> bool:
    """Whether ``data`` is a Keras ``PyDataset``/``Sequence`` (either Keras), without importing Keras."""
    return any(cls.__module__.split(".")[0] == package and cls.__name__ == name
               for cls in type(data).__mro__ for package, name in _BASES)


def _overrides(dataset: Any, method: str) -> bool:
    """Whether the user's class defines ``method`` itself (not only Keras' base class)."""
    for cls in type(dataset).__mro__:
        if method in vars(cls):
            return cls.__module__.split(".")[0] not in ("keras", "tf_keras")
    return False


class PyDatasetSource:
    """The examples of a Keras ``PyDataset`` or ``Sequence``, addressable by position (see the module)."""

    index_addressable = True

    def __init__(self, dataset: Any, *, name: str | None = None):
        self.dataset = dataset
        self.name = name or type(dataset).__name__
        kind = type(dataset).__name__
        length = self._length()
        if length == 0:
            raise DataError(f"`data` is empty; received the {kind} {self.name!r} with 0 batches. "
                            "Fix: give it at least one batch.")
        self.num_batches = length
        self.failure: BaseException | None = None  # the first error of a read in tf.data's threads
        self._lock = threading.Lock()
        self._cache: collections.OrderedDict[int, list[np.ndarray]] = collections.OrderedDict()
        self._readers = threading.BoundedSemaphore(self._workers())
        first = self._fetch(0)
        self._element = first
        self._leaves = _flatten(first)
        self._paths = _flatten(_named(first if isinstance(first, tuple) else (first,), ("x", "y", "sample_weight")))
        self.batch_size = len(self._leaves[0])
        self._cache[0] = self._leaves
        last_size = len(self._batch(length - 1)[0])  # checked against batch 0: only the last may be smaller
        self.full_batches = length if last_size == self.batch_size else length - 1
        self._num_examples = (length - 1) * self.batch_size + last_size
        for method in ("on_epoch_begin", "on_epoch_end"):
            if _overrides(dataset, method):
                log.warning(
                    "%s.%s is not called: tfdist orders the batches itself (a seeded shuffle of the batch order "
                    "each epoch, restored exactly on resume; shuffle=False keeps the dataset's order), and a change "
                    "made there could not be replayed after a restart", type(dataset).__name__, method)
        if getattr(dataset, "use_multiprocessing", False):
            log.info("%s: use_multiprocessing is not used; tfdist reads its batches in threads, %d at a time "
                     "(its workers)", self.name, self._workers())
        self._fingerprint: str | None = None

    # --- the dataset ---------------------------------------------------------------------------
    def _length(self) -> int:
        try:
            length = getattr(self.dataset, "num_batches", None)
            if length is None and hasattr(type(self.dataset), "__len__"):
                length = len(self.dataset)
        except (NotImplementedError, TypeError) as e:
            raise DataError(f"the number of batches of {self.name!r} is unknown ({type(e).__name__}: {e}). "
                            "Fix: define __len__ (or the num_batches property) on it.") from None
        if length is None:
            raise DataError(
                f"{self.name!r} has no length (num_batches is None: an endless dataset), so no epoch or position in it "
                "can be named. Fix: define __len__ (or num_batches), or pass a tf.data.Dataset with steps_per_epoch."
            )
        if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 0:
            raise DataError(f"the length of {self.name!r} must be a whole number of batches; received {length!r}. "
                            "Fix: return an int from __len__ (or num_batches).")
        return int(length)

    def _workers(self) -> int:
        try:
            workers = getattr(self.dataset, "workers", 1)
        except AttributeError:
            workers = 1
        return workers if isinstance(workers, int) and workers > 0 else 1

    def _fetch(self, index: int) -> tuple:
        """Batch ``index`` as the dataset returns it, as a tuple of nests of arrays."""
        with self._readers:
            item = self.dataset[index]
        if isinstance(item, tuple) and len(item) in (2, 3):
            element = tuple(_as_arrays(part) for part in item)
        elif isinstance(item, (np.ndarray, dict)) or isinstance(item, tuple) and len(item) == 1:
            element = _as_arrays(item)  # x alone, as Keras hands it to train_step (a 1-tuple stays one)
        else:
            raise DataError(
                f"{self.name}[{index}] must return x, (x, y) or (x, y, sample_weight); received "
                f"{type(item).__name__}{f' of length {len(item)}' if isinstance(item, (tuple, list)) else ''}. "
                "Fix: return a tuple of the batch's inputs, labels (and weights), or the inputs alone."
            )
        leaves = _flatten(element)
        paths = _flatten(_named(element if isinstance(element, tuple) else (element,), ("x", "y", "sample_weight")))
        if any(leaf.ndim == 0 for leaf in leaves) or len({len(leaf) for leaf in leaves}) != 1:
            shapes = ", ".join(f"{path} of shape {leaf.shape}" for path, leaf in zip(paths, leaves))
            raise DataError(f"{self.name}[{index}] must hold one row per example in every array; received {shapes}. "
                            "Fix: return arrays with the same first dimension.")
        for path, leaf in zip(paths, leaves):
            if leaf.dtype == object:
                raise DataError(f"{self.name}[{index}] {path} must be a numeric or string array; received an array of "
                                "Python objects. Fix: return np.asarray(..., np.float32) (or of equal-length rows).")
        return element

    def _batch(self, index: int) -> list[np.ndarray]:
        """Batch ``index``'s arrays (flattened, in batch 0's dtypes), from the cache or read now."""
        with self._lock:
            if index in self._cache:
                self._cache.move_to_end(index)
                return self._cache[index]
        element = self._fetch(index)
        leaves = _flatten(element)
        self._check_like_first(index, element, leaves)
        leaves = [leaf.astype(first.dtype, copy=False) for leaf, first in zip(leaves, self._leaves)]
        with self._lock:
            self._cache[index] = leaves
            while len(self._cache) > CACHED_BATCHES:
                self._cache.popitem(last=False)
        return leaves

    def _check_like_first(self, index: int, element: tuple, leaves: list[np.ndarray]) -> None:
        import tensorflow as tf

        try:
            tf.nest.assert_same_structure(element, self._element)
        except (ValueError, TypeError):
            raise DataError(f"{self.name}[{index}] differs in structure from batch 0; received "
                            f"{_structure(element)}, batch 0 is {_structure(self._element)}. "
                            "Fix: return the same parts from every batch.") from None
        size = len(leaves[0])
        for path, leaf, first in zip(self._paths, leaves, self._leaves):
            if leaf.shape[1:] != first.shape[1:]:
                raise DataError(f"{self.name}[{index}] {path} has examples of shape {leaf.shape[1:]}, batch 0's have "
                                f"{first.shape[1:]}: tfdist reads a PyDataset by example position (a step may join "
                                "rows of several batches), so its examples have one shape. Fix: pad every batch to one "
                                "length in __getitem__ (keras.utils.pad_sequences(..., maxlen=N)), or pass a tf.data "
                                "Dataset of unbatched examples, which tfdist pads per batch.")
        if size != self.batch_size and not (index == self.num_batches - 1 and size < self.batch_size):
            raise DataError(f"{self.name}[{index}] holds {size} examples, batch 0 holds {self.batch_size}. "
                            "Fix: give every batch the same size (only the last may be smaller).")

    # --- what the pipeline reads ---------------------------------------------------------------
    def _read(self, positions: np.ndarray) -> list[np.ndarray]:
        """``_gather`` in tf.data's threads: an error is kept (``failure``) to be raised as itself by fit."""
        try:
            return self._gather(positions)
        except Exception as e:
            with self._lock:
                if self.failure is None:
                    self.failure = e
            raise

    def _gather(self, positions: np.ndarray) -> list[np.ndarray]:
        """The examples at ``positions`` (row ``k % B`` of batch ``k // B``), each batch read once."""
        positions = np.asarray(positions, np.int64).reshape(-1)
        batches, rows = np.divmod(positions, self.batch_size)
        out = [np.empty((len(positions), *leaf.shape[1:]), leaf.dtype) for leaf in self._leaves]
        for index in np.unique(batches):
            where = np.nonzero(batches == index)[0]
            for target, leaf in zip(out, self._batch(int(index))):
                target[where] = leaf[rows[where]]
        return out

    @property
    def num_examples(self) -> int:
        """Every example, the last smaller batch's included (validation reads them all)."""
        return self._num_examples

    @property
    def training_examples(self) -> int:
        """The examples of the whole batches: what an epoch of training orders."""
        return self.full_batches * self.batch_size

    @property
    def example_shape(self) -> Any:
        import tensorflow as tf

        return tf.nest.map_structure(lambda a: tuple(a.shape[1:]), inputs_of(self._element))

    @property
    def example_bytes(self) -> int:
        return int(sum(leaf[:1].nbytes for leaf in self._leaves))

    def example_order(self, seed: int, epoch, shuffle: bool, positions) -> "Any":
        """The examples at ``positions`` of epoch ``epoch``: whole batches in a seeded order, rows in order."""
        from tfdist.data import order as order_mod

        return order_mod.batch_order(self.full_batches, self.batch_size, seed, epoch, shuffle, positions)

    def fingerprint(self) -> str:
        """The class, its length and batch size, and each array's dtype and example shape -- not the
        contents: a ``__getitem__`` that augments at random returns other values in every process,
        and its run must still resume."""
        if self._fingerprint is None:
            identity = [type(self.dataset).__module__, type(self.dataset).__qualname__, self.num_batches,
                        self.batch_size, self._num_examples, self._paths,
                        [[leaf.dtype.str, list(leaf.shape[1:])] for leaf in self._leaves]]
            self._fingerprint = hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:16]
        return self._fingerprint

    def gather_fn(self, *, embed: bool = False) -> Callable:
        if embed:
            raise DataError(
                f"{self.name} is a Python dataset read through tf.numpy_function, which parameter-server workers "
                "cannot run. Fix: use a synchronous strategy, or write the data as TFRecord files and pass "
                "tfdist.TFRecordSource(files, parse_fn)."
            )
        return numpy_gather(self._read, self._element, self._leaves)

    def sample(self, count: int) -> tuple:
        """The first ``count`` examples, structured as the dataset's batches."""
        import tensorflow as tf

        rows = self._gather(np.arange(min(count, self._num_examples)))
        return tf.nest.pack_sequence_as(self._element, rows)

    def failure_of(self, error: BaseException) -> BaseException | None:
        """The dataset's own error, if TensorFlow's ``error`` wraps it: fit raises it (its type,
        message and traceback) instead."""
        failure = self.failure
        if failure is not None and f"{type(failure).__name__}: " in str(error):
            failure.add_note(f"(raised by {self.name} in tfdist's input pipeline; TensorFlow's error was "
                             f"{type(error).__name__})")
            return failure
        return None


def _flatten(element: Any) -> list:
    import tensorflow as tf

    return tf.nest.flatten(element)


def _structure(element: tuple) -> str:
    import tensorflow as tf

    return str(tf.nest.map_structure(lambda _: "array", element))
