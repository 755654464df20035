"""The data path: batch-size arithmetic, data sources, and a deterministic, resumable order.

A run's data is a pure function of (seed, epoch, step): epoch ``e`` visits the examples in
the order of a permutation seeded by ``(seed, e)``, and global step ``t`` of that epoch
takes positions ``[t * G, (t + 1) * G)`` of it, where ``G`` is the global batch. Resuming at
step ``t`` therefore starts a ``Dataset.range`` at ``t`` -- O(1), however far into the
epoch the run was -- instead of replaying the pipeline with ``skip()``.

Each input pipeline (one per worker) builds only the slice of every global batch that its
own replicas consume; replica ``r`` gets positions ``[r * B, (r + 1) * B)`` of the batch.

Sources:
  * ``ArraySource``   -- in-memory arrays (NumPy tuples, ``digits``, ``.npz``, TFDS splits
    read into memory): index-addressable, O(1) resume.
  * ``StreamSource``  -- any user ``tf.data.Dataset`` of unbatched examples. It must
    produce the same elements in the same order every time it is iterated; tfdist shuffles
    it with a buffer seeded by (seed, epoch). Resuming skips batches: O(position).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from tfdist.errors import BatchSizeError, DataError

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

log = logging.getLogger("tfdist")

DEFAULT_PER_REPLICA_BATCH = 32
DEFAULT_SHUFFLE_BUFFER = 10_000


# --- batch sizes ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BatchSizes:
    """global batch = grad_accum_steps x replicas x micro batch (per replica, per micro step)."""

    global_batch_size: int
    micro_batch_size: int
    num_replicas: int
    grad_accum_steps: int = 1

    def __post_init__(self):
        for name in ("global_batch_size", "micro_batch_size", "num_replicas", "grad_accum_steps"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise BatchSizeError(f"Invalid `{name}`; received {name}={value!r}. Fix: use a positive integer.")
        product = self.grad_accum_steps * self.num_replicas * self.micro_batch_size
        if product != self.global_batch_size:
            raise BatchSizeError(
                f"global batch {self.global_batch_size} != grad_accum_steps {self.grad_accum_steps} x replicas "
                f"{self.num_replicas} x micro batch {self.micro_batch_size} = {product}. "
                "Fix: give only one of batch_size and per_replica_batch_size."
            )

    @property
    def per_replica_batch_size(self) -> int:
        """Examples one replica consumes per optimizer step (all its micro batches)."""
        return self.grad_accum_steps * self.micro_batch_size

    @classmethod
    def resolve(
        cls,
        *,
        num_replicas: int,
        batch_size: int | None = None,
        per_replica_batch_size: int | None = None,
        grad_accum_steps: int = 1,
    ) -> "BatchSizes":
        """Fills in the batch size that was not given; raises BatchSizeError if they do not divide.

        ``batch_size`` is the global batch of one optimizer step; ``per_replica_batch_size``
        is the micro batch one replica computes at a time.
        """
        for name, value in (("batch_size", batch_size), ("per_replica_batch_size", per_replica_batch_size),
                            ("grad_accum_steps", grad_accum_steps)):
            if value is not None and (not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1):
                raise BatchSizeError(f"Invalid `{name}`; received {name}={value!r}. Fix: use a positive integer.")
        divisor = num_replicas * grad_accum_steps
        if batch_size is None:
            micro = per_replica_batch_size or DEFAULT_PER_REPLICA_BATCH
            return cls(micro * divisor, micro, num_replicas, grad_accum_steps)
        if batch_size % divisor:
            lower = max(divisor, batch_size // divisor * divisor)
            raise BatchSizeError(
                f"batch_size={batch_size} is not divisible by replicas x grad_accum_steps = "
                f"{num_replicas} x {grad_accum_steps} = {divisor}. "
                f"Fix: use a multiple of {divisor}, e.g. {lower} or {lower + divisor}, or pass per_replica_batch_size."
            )
        micro = batch_size // divisor
        if per_replica_batch_size is not None and per_replica_batch_size != micro:
            raise BatchSizeError(
                f"batch_size={batch_size} and per_replica_batch_size={per_replica_batch_size} disagree: with "
                f"{num_replicas} replica(s) and grad_accum_steps={grad_accum_steps} the micro batch is {micro}. "
                "Fix: pass only one of them."
            )
        return cls(batch_size, micro, num_replicas, grad_accum_steps)

    def describe(self) -> str:
        accum = f" x {self.grad_accum_steps} accumulation steps" if self.grad_accum_steps > 1 else ""
        return (
            f"global batch {self.global_batch_size} = {self.num_replicas} replica(s) x micro batch "
            f"{self.micro_batch_size}{accum}"
        )


# --- sources ---------------------------------------------------------------------------------


def _hash_arrays(*arrays: np.ndarray) -> str:
    digest = hashlib.sha256()
    for array in arrays:
        array = np.ascontiguousarray(array)
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        flat = array.reshape(-1).view(np.uint8) if array.size else np.zeros(0, np.uint8)
        stride = max(1, flat.size // (64 << 20))  # hash at most ~64 MB per array
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
        self.name = name
        self._fingerprint: str | None = None

    @property
    def num_examples(self) -> int:
        return len(self.x)

    @property
    def example_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    def fingerprint(self) -> str:
        if self._fingerprint is None:
            self._fingerprint = _hash_arrays(self.x, self.y)
        return self._fingerprint

    def gather_fn(self) -> Callable[["tf.Tensor"], tuple]:
        import tensorflow as tf

        x = tf.constant(self.x)
        y = tf.constant(self.y)
        return lambda idx: (tf.gather(x, idx), tf.gather(y, idx))

    def sample(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        return self.x[:count], self.y[:count]


class StreamSource:
    """A user ``tf.data.Dataset`` of unbatched ``(x, y)`` examples, read in order."""

    index_addressable = False

    def __init__(self, dataset: "tf.data.Dataset", *, shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER):
        import tensorflow as tf

        spec = dataset.element_spec
        if not (isinstance(spec, tuple) and len(spec) in (2, 3)):
            raise DataError(
                f"a tf.data.Dataset for tfdist must yield (x, y) pairs; received elements of spec {spec}. "
                "Fix: map it to (features, label) tuples, unbatched."
            )
        if spec[0].shape.rank is not None and spec[0].shape.rank > 0 and spec[0].shape[0] is None:
            raise DataError(
                f"the dataset looks batched (x has shape {spec[0].shape}); tfdist batches it itself. "
                "Fix: pass the dataset before .batch(), or call .unbatch() on it."
            )
        self.dataset = dataset
        self.name = "tf.data.Dataset"
        self.shuffle_buffer = shuffle_buffer
        cardinality = int(dataset.cardinality())
        self._num_examples = cardinality if cardinality >= 0 else None
        self._infinite = cardinality == tf.data.INFINITE_CARDINALITY

    @property
    def num_examples(self) -> int | None:
        return self._num_examples

    @property
    def example_shape(self) -> tuple[int | None, ...]:
        return tuple(self.dataset.element_spec[0].shape)

    def fingerprint(self) -> str:
        first = next(iter(self.dataset.take(1).as_numpy_iterator()))
        spec = repr(self.dataset.element_spec).encode()
        return hashlib.sha256(spec + _hash_arrays(*[np.asarray(a) for a in first]).encode()).hexdigest()[:16]

    def count_batches(self, global_batch: int) -> int:
        if self._infinite:
            raise DataError(
                "the dataset is infinite, so an epoch has no end; received a dataset with INFINITE cardinality. "
                "Fix: pass steps_per_epoch."
            )
        log.info("counting the batches of the dataset (its length is unknown); pass steps_per_epoch to skip this")
        return int(self.dataset.batch(global_batch, drop_remainder=True).reduce(np.int64(0), lambda n, _: n + 1))

    def sample(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        x, y = next(iter(self.dataset.map(lambda *e: e[:2]).batch(count).take(1).as_numpy_iterator()))
        return x, y


# --- the resumable order ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DataPlan:
    """What the input pipelines need to produce the examples of any step."""

    sizes: BatchSizes
    steps_per_epoch: int
    epochs: int
    seed: int
    shuffle: bool = True

    @property
    def total_steps(self) -> int:
        return self.steps_per_epoch * self.epochs


def _epoch_permutation(num_examples: int, seed: int, epoch, shuffle: bool):
    import tensorflow as tf

    positions = tf.range(num_examples, dtype=tf.int64)
    if not shuffle:
        return positions
    key = tf.stack([tf.constant(seed, tf.int64), tf.cast(epoch, tf.int64)])
    return tf.random.experimental.stateless_shuffle(positions, seed=key)


def _pipeline_slice(sizes: BatchSizes, input_context) -> tuple[int, int, int]:
    """(offset, length, replicas) of this input pipeline's part of every global batch."""
    pipelines = input_context.num_input_pipelines if input_context else 1
    pipeline_id = input_context.input_pipeline_id if input_context else 0
    if sizes.num_replicas % pipelines:
        raise BatchSizeError(
            f"{sizes.num_replicas} replicas cannot be split evenly over {pipelines} workers. "
            "Fix: give every worker the same number of devices."
        )
    local_replicas = sizes.num_replicas // pipelines
    length = local_replicas * sizes.per_replica_batch_size
    return pipeline_id * length, length, local_replicas


def dataset_fn(
    source: ArraySource | StreamSource,
    plan: DataPlan,
    *,
    start_step: int,
    stop_step: int | None = None,
    parameter_server: bool = False,
) -> Callable[[Any], "tf.data.Dataset"]:
    """A ``dataset_fn(input_context)`` for ``distribute_datasets_from_function``.

    Synchronous strategies: every input pipeline yields, for each global step from
    ``start_step`` to ``stop_step``, one per-replica batch per local replica -- its slice of
    the global batch. Parameter servers (``parameter_server=True``): each worker runs whole
    steps, so worker ``w`` of ``W`` yields the global batches of steps ``start_step + w``,
    ``+ W``, ... forever (the coordinator decides how many it runs).
    """
    import tensorflow as tf

    spe, sizes = plan.steps_per_epoch, plan.sizes
    stop = None if parameter_server else stop_step
    last_epoch = (stop - 1) // spe if stop is not None else None

    def make(input_context=None):
        if parameter_server:
            offset, length, local_replicas = 0, sizes.global_batch_size, sizes.num_replicas
            step_stride = input_context.num_input_pipelines if input_context else 1
            step_offset = input_context.input_pipeline_id if input_context else 0
        else:
            offset, length, local_replicas = _pipeline_slice(sizes, input_context)
            step_stride, step_offset = 1, 0
        per_replica = sizes.per_replica_batch_size
        first_step = start_step + step_offset
        first_epoch = first_step // spe
        epochs = tf.data.Dataset.range(first_epoch, last_epoch + 1 if last_epoch is not None else 2**62)

        def steps_of(epoch):
            begin = tf.maximum(tf.cast(first_step, tf.int64), epoch * spe)
            # Align to this worker's residue class of steps (stride > 1 under parameter servers).
            begin += tf.math.floormod(first_step - begin, step_stride)
            end = (epoch + 1) * spe if stop is None else tf.minimum((epoch + 1) * spe, stop)
            return tf.data.Dataset.range(begin - epoch * spe, end - epoch * spe, step_stride)

        if isinstance(source, ArraySource):
            gather = source.gather_fn()

            def epoch_dataset(epoch):
                order = _epoch_permutation(source.num_examples, plan.seed, epoch, plan.shuffle)

                def step_indices(step):
                    start = step * sizes.global_batch_size + offset
                    return tf.reshape(order[start : start + length], [local_replicas, per_replica])

                return steps_of(epoch).map(step_indices).unbatch()

            ds = epochs.flat_map(epoch_dataset).map(gather, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        else:
            stream = source.dataset.map(lambda *e: tuple(e[:2]))

            def epoch_dataset(epoch: int):  # a Python int: shuffle seeds must be Python values
                shuffled = stream
                if plan.shuffle:
                    shuffled = stream.shuffle(source.shuffle_buffer, seed=plan.seed * 1_000_003 + epoch,
                                              reshuffle_each_iteration=False)
                batches = shuffled.repeat().batch(sizes.global_batch_size, drop_remainder=True).take(spe)
                begin = max(first_step, epoch * spe)
                begin += (first_step - begin) % step_stride
                end = (epoch + 1) * spe if stop is None else min((epoch + 1) * spe, stop)
                batches = batches.skip(begin - epoch * spe)  # O(position): the documented cost of a stream
                batches = batches.take(max(0, end - begin)).shard(step_stride, 0)
                return batches.map(
                    lambda x, y: (
                        tf.reshape(x[offset : offset + length], tf.concat([[local_replicas, per_replica], tf.shape(x)[1:]], 0)),
                        tf.reshape(y[offset : offset + length], tf.concat([[local_replicas, per_replica], tf.shape(y)[1:]], 0)),
                    )
                ).unbatch()

            # Parameter servers run on past the end: cycle through the run's epochs again.
            final = last_epoch if last_epoch is not None else first_epoch + plan.epochs - 1
            ds = epoch_dataset(first_epoch)
            for epoch in range(first_epoch + 1, final + 1):
                ds = ds.concatenate(epoch_dataset(epoch))
            if last_epoch is None:
                ds = ds.repeat()
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        options.deterministic = True
        return ds.with_options(options).prefetch(tf.data.AUTOTUNE)

    return make


def steps_per_epoch_for(source: ArraySource | StreamSource, sizes: BatchSizes, steps_per_epoch: int | None) -> int:
    """Optimizer steps in one epoch: given, or whole global batches in the data."""
    if steps_per_epoch is not None:
        if not isinstance(steps_per_epoch, int) or isinstance(steps_per_epoch, bool) or steps_per_epoch < 1:
            raise BatchSizeError(
                f"Invalid `steps_per_epoch`; received steps_per_epoch={steps_per_epoch!r}. Fix: use a positive integer."
            )
        return steps_per_epoch
    if source.num_examples is None:
        steps = source.count_batches(sizes.global_batch_size)
    else:
        steps = source.num_examples // sizes.global_batch_size
    if steps < 1:
        raise BatchSizeError(
            f"the global batch {sizes.global_batch_size} is larger than the data ({source.num_examples} examples). "
            "Fix: use a smaller batch_size or more data."
        )
    dropped = (source.num_examples or 0) - steps * sizes.global_batch_size
    if dropped > 0:
        log.info(
            "%d example(s) per epoch do not fill a global batch and are left out of that epoch "
            "(a different set each epoch when shuffling)", dropped,
        )
    return steps


def validation_dataset(source: ArraySource | StreamSource, batch_size: int) -> "tf.data.Dataset":
    """A batched validation dataset, sharded by data (safe for in-memory and file sources)."""
    import tensorflow as tf

    if isinstance(source, ArraySource):
        ds = tf.data.Dataset.from_tensor_slices((source.x, source.y))
    else:
        ds = source.dataset.map(lambda *e: tuple(e[:2]))
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return ds.batch(batch_size).with_options(options).prefetch(tf.data.AUTOTUNE)


# --- loading named data ---------------------------------------------------------------------


def _scaled(x: np.ndarray) -> np.ndarray:
    if np.issubdtype(x.dtype, np.integer):
        return (x.astype(np.float32) / float(np.iinfo(x.dtype).max)).astype(np.float32)
    return x.astype(np.float32, copy=False)


def _split(x: np.ndarray, y: np.ndarray, validation_fraction: float) -> tuple[ArraySource, ArraySource]:
    order = np.random.RandomState(0).permutation(len(x))  # fixed: the split never depends on the run's seed
    cut = len(x) - int(round(len(x) * validation_fraction))
    return ArraySource(x[order[:cut]], y[order[:cut]], name="train"), ArraySource(x[order[cut:]], y[order[cut:]], name="validation")


def load_digits(validation_fraction: float = 0.2) -> tuple[ArraySource, ArraySource]:
    """scikit-learn's 8x8 handwritten digits (1,797 images, bundled: nothing is downloaded)."""
    from sklearn.datasets import load_digits as sk_load_digits

    bunch = sk_load_digits()
    x = (bunch.images.astype(np.float32) / 16.0)[..., None]
    return _split(x, bunch.target.astype(np.int32), validation_fraction)


def load_npz(path: str, validation_fraction: float = 0.2) -> tuple[ArraySource, ArraySource | None]:
    try:
        with np.load(path) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except (OSError, ValueError) as e:
        raise DataError(f"cannot read the .npz file; received data={path!r} ({e}). Fix: pass an existing .npz file.") from None
    if "x" not in arrays or "y" not in arrays:
        raise DataError(
            f"the .npz file must hold arrays named x and y; received {path!r} with {sorted(arrays)}. "
            "Fix: save it with np.savez(path, x=..., y=...) (and optionally x_val=..., y_val=...)."
        )
    x = _scaled(arrays["x"])
    if "x_val" in arrays and "y_val" in arrays:
        return ArraySource(x, arrays["y"], name=path), ArraySource(_scaled(arrays["x_val"]), arrays["y_val"], name=path)
    return _split(x, arrays["y"], validation_fraction)


def load_tfds(name: str, *, data_dir: str | None = None) -> tuple[ArraySource, ArraySource | None]:
    """A TensorFlow Datasets data set, read from its local data directory into memory.

    Nothing is downloaded: a data set that is not prepared gives an error naming the fix.
    """
    import tensorflow_datasets as tfds

    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except Exception as e:  # tfds raises DatasetNotFoundError and friends
        raise DataError(f"unknown TensorFlow Datasets name; received 'tfds:{name}' ({e}). Fix: check the name with tfds.list_builders().") from None
    splits = list(builder.info.splits.keys()) if builder.info.splits else []
    train_split = "train" if "train" in splits or not splits else splits[0]
    val_split = next((s for s in ("validation", "test") if s in splits), None)

    def read(split):
        try:
            ds = tfds.load(name, split=split, data_dir=data_dir, as_supervised=True, download=False)
        except (AssertionError, tfds.core.registered.DatasetNotFoundError, FileNotFoundError) as e:
            raise DataError(
                f"TensorFlow Datasets '{name}' is not prepared in {builder.data_dir!r}; received data='tfds:{name}' "
                f"({type(e).__name__}). Fix: run `tfds build {name}` where the network is reachable, then copy the "
                "data directory here (or set TFDS_DATA_DIR)."
            ) from None
        # Read in large batches (batch_size=-1 reads it in one op, which aborts on some builders).
        xs, ys = zip(*tfds.as_numpy(ds.batch(8192)))
        return _scaled(np.concatenate(xs)), np.concatenate(ys)

    train = ArraySource(*read(train_split), name=f"tfds:{name}[{train_split}]")
    val = ArraySource(*read(val_split), name=f"tfds:{name}[{val_split}]") if val_split else None
    return train, val


def load(spec: str) -> tuple[ArraySource, ArraySource | None]:
    """Resolves the CLI's ``--data``: ``digits``, ``tfds:NAME`` or a path to an ``.npz``."""
    if spec == "digits":
        return load_digits()
    if spec.startswith("tfds:"):
        return load_tfds(spec[len("tfds:"):])
    if spec.endswith(".npz"):
        return load_npz(spec)
    raise DataError(f"unknown data; received data={spec!r}. Fix: use 'digits', 'tfds:NAME' or a path to an .npz file.")


def as_source(data: Any) -> ArraySource | StreamSource:
    """Turns what the user passed as ``data`` into a source."""
    import tensorflow as tf

    if isinstance(data, (ArraySource, StreamSource)):
        return data
    if isinstance(data, str):
        return load(data)[0]
    if isinstance(data, tf.data.Dataset):
        return StreamSource(data)
    if isinstance(data, (tuple, list)) and len(data) == 2:
        return ArraySource(data[0], data[1])
    raise DataError(
        f"unsupported `data`; received {type(data).__name__}. Fix: pass (x, y) NumPy arrays, an unbatched "
        "tf.data.Dataset of (x, y), or a name such as 'digits' or 'tfds:mnist'."
    )
