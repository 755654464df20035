"""A user's ``tf.data.Dataset`` of unbatched ``(x, y)`` (or ``(x, y, sample_weight)``): the fallback source, with its costs stated."""

from __future__ import annotations

import hashlib
import logging
from typing import TYPE_CHECKING, Any

import numpy as np

from tfdist.data.arrays import hash_arrays
from tfdist.errors import DataError

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

log = logging.getLogger("tfdist")

DEFAULT_SHUFFLE_BUFFER = 10_000
FINGERPRINT_ELEMENTS = 64

COSTS = (
    "data is a tf.data.Dataset, which tfdist can only read in order: every worker reads and decodes the whole "
    "stream (input work does not shrink with more workers), resuming replays the stream up to the position (from the "
    "epoch's start; with steps_per_epoch, which reads the stream on across epochs as Keras does, from the pass's "
    "start, or the run's for a stream of unknown length), a dataset of unknown length without steps_per_epoch is "
    "counted with a full pass, and it must yield the same elements in the same order on every pass and in every "
    "process. Fix: write the data as TFRecord files and pass "
    "tfdist.TFRecordSource(files, parse_fn) (each worker reads 1/W of the bytes, resume in constant time)"
)


class StreamSource:
    """A user ``tf.data.Dataset`` of unbatched ``(x, y)`` or ``(x, y, sample_weight)`` examples, read in order."""

    index_addressable = False

    def __init__(self, dataset: "tf.data.Dataset", *, shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER):
        import tensorflow as tf

        spec = dataset.element_spec
        if not (isinstance(spec, tuple) and len(spec) in (2, 3)):
            raise DataError(
                f"a tf.data.Dataset for tfdist must yield (x, y) or (x, y, sample_weight) tuples; received elements of "
                f"spec {spec}. Fix: map it to (features, label) tuples, unbatched."
            )
        components = tf.nest.flatten(spec)
        if all(c.shape.rank is not None and c.shape.rank > 0 and c.shape[0] is None for c in components):
            first = components[0]
            raise DataError(
                f"the dataset looks batched (x has shape {first.shape}, and every other part a first dimension of "
                "unknown size too); tfdist batches it itself. Fix: pass the dataset before .batch() or "
                ".padded_batch(), or call .unbatch() on it."
            )
        # Elements of other shapes from one to the next (variable-length sequences): padded batches.
        self._padded = any(c.shape.rank is None or None in c.shape.as_list() for c in components)
        self.dataset = dataset
        self.name = "tf.data.Dataset"
        self.shuffle_buffer = shuffle_buffer
        cardinality = int(dataset.cardinality())
        self._num_examples = cardinality if cardinality >= 0 else None
        self._infinite = cardinality == tf.data.INFINITE_CARDINALITY
        self._fingerprint: str | None = None

    @property
    def num_examples(self) -> int | None:
        return self._num_examples

    def batch(self, dataset: "tf.data.Dataset", size: int, *, drop_remainder: bool = False) -> "tf.data.Dataset":
        """``dataset`` (of this source's elements) in batches of ``size``; elements whose shapes vary
        (variable-length sequences) are padded with zeros to the longest of their batch, as
        ``padded_batch`` does."""
        if self._padded:
            return dataset.padded_batch(size, drop_remainder=drop_remainder)
        return dataset.batch(size, drop_remainder=drop_remainder)

    @property
    def example_shape(self) -> Any:
        import tensorflow as tf

        return tf.nest.map_structure(lambda s: tuple(s.shape), self.dataset.element_spec[0])

    def fingerprint(self) -> str:
        """Element spec, length and the first ``FINGERPRINT_ELEMENTS`` elements (a full hash would be
        a full pass). Read twice: a dataset whose passes differ is refused, since a resumed run
        could not read what the interrupted one would have read."""
        if self._fingerprint is None:
            first, second = self._first_elements_hash(), self._first_elements_hash()
            if first != second:
                raise DataError(
                    "the dataset yields other elements on each pass (a shuffle() reshuffles on each pass unless "
                    "reshuffle_each_iteration=False, and random augmentation draws anew), so a resumed run could not "
                    f"read the batches the interrupted one would have; received a tf.data.Dataset whose first "
                    f"{FINGERPRINT_ELEMENTS} elements differ between two passes. Fix: leave shuffling to tfdist "
                    "(fit(..., shuffle=True, seed=...)) or pass shuffle(..., seed=S, reshuffle_each_iteration=False), "
                    "augment with stateless random ops (tf.random.stateless_*, keyed by the example), or train "
                    "without checkpoint_dir."
                )
            self._fingerprint = first
        return self._fingerprint

    def _first_elements_hash(self) -> str:
        import tensorflow as tf

        digest = hashlib.sha256(repr(self.dataset.element_spec).encode() + repr(self._num_examples).encode())
        for element in self.dataset.take(FINGERPRINT_ELEMENTS).as_numpy_iterator():
            digest.update(hash_arrays(*[np.asarray(a) for a in tf.nest.flatten(element)]).encode())
        return digest.hexdigest()[:16]

    def count_batches(self, global_batch: int) -> int:
        if self._infinite:
            raise DataError(
                "the dataset is infinite, so an epoch has no end; received a dataset with INFINITE cardinality. "
                "Fix: pass steps_per_epoch."
            )
        log.info("counting the batches of the dataset (its length is unknown): a full pass; pass steps_per_epoch to skip it")
        return int(self.dataset.map(lambda *_: 0).batch(global_batch, drop_remainder=True)
                   .reduce(np.int64(0), lambda n, _: n + 1))

    def sample(self, count: int) -> tuple:
        """The first ``count`` examples, batched: ``(x, y)`` or ``(x, y, sample_weight)``."""
        return next(iter(self.batch(self.dataset, count).take(1).as_numpy_iterator()))
