"""The deterministic order: a run's data is a pure function of (seed, epoch, step).

Every random choice of the data path is a stateless function of a key derived here from
the run's seed, the epoch and a purpose (blocks, windows, examples): nothing depends on how
far a pipeline has read, which is what lets a resumed run start at any step in O(1).
The stateless random ops may change between TensorFlow versions (the run metadata records
``tensorflow_version``).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from tfdist.data.batching import BatchSizes
from tfdist.errors import BatchSizeError

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

# Names the way orders are computed; recorded in checkpoints (``data_order``) and changed with it.
ORDER_VERSION = "index-shuffle-1"
# Purposes folded into the keys, so that two uses of one (seed, epoch) never share a stream.
EXAMPLES, BLOCKS, WINDOWS, BATCHES = 1, 2, 3, 4
_MASK63 = (1 << 63) - 1


@dataclasses.dataclass(frozen=True)
class DataPlan:
    """What the input pipelines need to produce the examples of any step.

    ``layout`` is the source's own arrangement of the data (``None`` for in-memory arrays
    and streams; a ``files.Layout`` for file sources); ``order_record()`` is what a checkpoint
    records so that a resume rebuilds the same order. ``continuous`` (a stream with
    ``steps_per_epoch`` given): epochs read the stream on where the last one stopped, as Keras
    reads it, instead of each epoch being one pass from its start.
    """

    sizes: BatchSizes
    steps_per_epoch: int
    epochs: int
    seed: int
    shuffle: bool = True
    layout: Any = None
    continuous: bool = False

    @property
    def total_steps(self) -> int:
        return self.steps_per_epoch * self.epochs

    def order_record(self) -> dict:
        """How this run orders its data (the order's version, shuffling, a file layout): recorded in
        every checkpoint, passed back to ``make_plan`` on resume, and compared on resume."""
        order = {"order": ORDER_VERSION, "shuffle": self.shuffle}
        if self.layout is not None:
            order.update(self.layout.as_dict())
        if self.continuous:  # absent otherwise: the records of runs before it existed stay equal
            order["stream"] = "continuous"
        return order


def key(seed: int, epoch, purpose: int, *parts) -> "tf.Tensor":
    """A stateless RNG key (int64 [2]) for ``purpose`` in ``epoch``, refined by ``parts``."""
    import tensorflow as tf

    k = tf.stack([tf.constant(int(seed) & _MASK63, tf.int64), tf.cast(epoch, tf.int64) * 16 + purpose])
    for part in parts:
        k = tf.cast(tf.random.experimental.stateless_fold_in(k, tf.cast(part, tf.int64), alg="philox"), tf.int64)
    return k


def permuted(positions, size, k) -> "tf.Tensor":
    """Where ``positions`` (int64) land in a seeded permutation of ``[0, size)``, without building it.

    ``index_shuffle`` is applied twice with two keys: once leaves neighbouring outputs
    correlated (r = +0.54 between the images of i and i + 1).
    """
    import tensorflow as tf

    top = tf.cast(size, tf.int64) - 1
    k1 = tf.cast(tf.random.experimental.stateless_fold_in(k, 1, alg="philox"), tf.int64)
    k2 = tf.cast(tf.random.experimental.stateless_fold_in(k, 2, alg="philox"), tf.int64)
    once = tf.random.experimental.index_shuffle(tf.cast(positions, tf.int64), k1, top)
    return tf.random.experimental.index_shuffle(once, k2, top)


def example_order(num_examples: int, seed: int, epoch, shuffle: bool, positions) -> "tf.Tensor":
    """The examples at ``positions`` of epoch ``epoch``'s order of ``num_examples`` examples."""
    import tensorflow as tf

    positions = tf.cast(positions, tf.int64)
    if not shuffle:
        return positions
    return permuted(positions, num_examples, key(seed, epoch, EXAMPLES))


def batch_order(num_batches: int, batch_size: int, seed: int, epoch, shuffle: bool, positions) -> "tf.Tensor":
    """The examples at ``positions`` of epoch ``epoch`` when a source is read by whole batches
    (``PyDatasetSource``): the batches in a seeded permutation, each batch's rows in order."""
    import tensorflow as tf

    positions = tf.cast(positions, tf.int64)
    if not shuffle:
        return positions
    batches = permuted(positions // batch_size, num_batches, key(seed, epoch, BATCHES))
    return batches * batch_size + positions % batch_size


def epoch_permutation(num_examples: int, seed: int, epoch, shuffle: bool) -> "tf.Tensor":
    """The whole order of one epoch (for tests and benchmarks; pipelines never build it)."""
    import tensorflow as tf

    return example_order(num_examples, seed, epoch, shuffle, tf.range(num_examples, dtype=tf.int64))


@dataclasses.dataclass(frozen=True)
class PipelineSlice:
    """This input pipeline's part of every global batch: ``[offset, offset + length)``."""

    pipelines: int
    pipeline_id: int
    offset: int
    length: int
    local_replicas: int


def pipeline_slice(sizes: BatchSizes, input_context) -> PipelineSlice:
    """The slice of every global batch that the pipeline of ``input_context`` feeds (synchronous strategies)."""
    pipelines = input_context.num_input_pipelines if input_context else 1
    pipeline_id = input_context.input_pipeline_id if input_context else 0
    if sizes.num_replicas % pipelines:
        raise BatchSizeError(
            f"{sizes.num_replicas} replicas cannot be split evenly over {pipelines} workers. "
            "Fix: give every worker the same number of devices."
        )
    local_replicas = sizes.num_replicas // pipelines
    length = local_replicas * sizes.per_replica_batch_size
    return PipelineSlice(pipelines, pipeline_id, pipeline_id * length, length, local_replicas)


def steps_of_epoch(epoch, *, steps_per_epoch: int, first_step: int, stop_step: int | None, stride: int = 1):
    """``(begin, end)`` steps within ``epoch`` (int64 tensors) that a pipeline reads.

    ``first_step`` is the pipeline's first global step; with ``stride`` > 1 (parameter
    servers) it reads every ``stride``-th step from there, and ``begin`` is aligned to that.
    """
    import tensorflow as tf

    spe = tf.constant(steps_per_epoch, tf.int64)
    epoch = tf.cast(epoch, tf.int64)
    first = tf.constant(first_step, tf.int64)
    begin = tf.maximum(first, epoch * spe)
    begin += tf.math.floormod(first - begin, stride)
    end = (epoch + 1) * spe if stop_step is None else tf.minimum((epoch + 1) * spe, stop_step)
    return begin - epoch * spe, tf.maximum(end, begin) - epoch * spe
