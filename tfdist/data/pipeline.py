"""The input pipelines fit builds: the plan of a run's data, training datasets, validation datasets."""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any, Callable

from tfdist import _checks
from tfdist.data import order as order_mod
from tfdist.data.arrays import ArraySource
from tfdist.data.indexed import IndexedSource
from tfdist.data.batching import BatchSizes
from tfdist.data.class_weights import ClassWeights
from tfdist.data.files import TFRecordSource
from tfdist.data.images import ImageFolderSource
from tfdist.data.order import DataPlan
from tfdist.data.pydataset import PyDatasetSource
from tfdist.data.stream import COSTS, StreamSource
from tfdist.data import user_pipeline
from tfdist.data.user_pipeline import UserPipeline
from tfdist.errors import BatchSizeError, DataError

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

log = logging.getLogger("tfdist")

Source = Any  # ArraySource | ImageFolderSource | IndexedSource | PyDatasetSource | StreamSource | TFRecordSource
_INDEXED = (ArraySource, ImageFolderSource, IndexedSource, PyDatasetSource)  # read by index, in a (seed, epoch)-order


def _trained_examples(source: Source) -> int | None:
    """The examples an epoch orders: all of them, or a Python dataset's whole batches."""
    return source.training_examples if isinstance(source, PyDatasetSource) else source.num_examples


def _example_order(source: Source, plan: DataPlan, epoch, positions) -> "tf.Tensor":
    """The examples at ``positions`` of ``epoch``: a permutation of all of them, or of whole batches."""
    if isinstance(source, PyDatasetSource):
        return source.example_order(plan.seed, epoch, plan.shuffle, positions)
    return order_mod.example_order(source.num_examples, plan.seed, epoch, plan.shuffle, positions)


def _check_steps(steps_per_epoch) -> None:
    _checks.check_int("steps_per_epoch", steps_per_epoch, error=BatchSizeError)


def steps_per_epoch_for(source: Source, sizes: BatchSizes, steps_per_epoch: int | None, *, layout=None,
                        per_worker: bool = False) -> int:
    """Optimizer steps in one epoch: given, or the whole global batches in the data.

    A given ``steps_per_epoch`` may not exceed what the data holds (streams excepted: they
    are repeated). File sources count per stream (``layout``): every worker gets the same.
    """
    if steps_per_epoch is not None:
        _check_steps(steps_per_epoch)
    if isinstance(source, UserPipeline):
        return user_pipeline.steps_per_epoch(source, layout, layout.strategy, steps_per_epoch)
    if isinstance(source, StreamSource):
        return steps_per_epoch if steps_per_epoch is not None else _whole(source.count_batches(sizes.global_batch_size)
                                                                          if source.num_examples is None else
                                                                          source.num_examples // sizes.global_batch_size,
                                                                          source, sizes, per_worker)
    if isinstance(source, TFRecordSource):
        layout = layout or source.layout(num_replicas=sizes.num_replicas)
        available = source.steps_per_epoch(layout, sizes.global_batch_size, parameter_server=per_worker)
        unit = layout.streams if per_worker else 1
    else:
        available, unit = _trained_examples(source) // sizes.global_batch_size, 1
    available = _whole(available, source, sizes, per_worker)
    if steps_per_epoch is None:
        return available
    if steps_per_epoch > available:
        raise BatchSizeError(
            f"steps_per_epoch={steps_per_epoch} exceeds the {available} whole global batches of "
            f"{sizes.global_batch_size} that the data holds per epoch ({source.num_examples} examples). "
            f"Fix: pass steps_per_epoch <= {available}, or leave it out."
        )
    if steps_per_epoch % unit:
        raise BatchSizeError(
            f"under parameter_server a file source's steps_per_epoch must be a multiple of its {unit} streams; received "
            f"steps_per_epoch={steps_per_epoch}. Fix: use {max(unit, steps_per_epoch // unit * unit)}, or leave it out."
        )
    return steps_per_epoch


def _whole(steps: int, source: Source, sizes: BatchSizes, per_worker: bool) -> int:
    if steps < 1:
        raise BatchSizeError(
            f"the global batch {sizes.global_batch_size} is larger than the data ({source.num_examples} examples"
            f"{', per stream' if isinstance(source, TFRecordSource) else ''}). Fix: use a smaller batch_size or more data."
        )
    return steps


def make_plan(
    source: Source,
    sizes: BatchSizes,
    *,
    steps_per_epoch: int | None,
    epochs: int,
    seed: int,
    shuffle: bool = True,
    per_worker: bool = False,
    num_workers: int = 1,
    recorded_order: dict | None = None,
    strategy=None,
) -> DataPlan:
    """The run's ``DataPlan``; ``recorded_order`` is the latest checkpoint's ``order_record()``
    (a resume keeps its data order, e.g. the number of streams of a file source). A user's own
    pipeline needs the ``strategy``: its layout is this worker's pipeline (``WorkerPipeline``).
    ``per_worker``: each worker reads whole steps of its own (the strategy's ``per_worker_input``)."""
    layout = None
    if isinstance(source, UserPipeline):
        if strategy is None:
            raise ValueError("a user pipeline's plan needs the strategy (make_plan(..., strategy=...))")
        layout = source.bind(strategy)
    elif isinstance(source, TFRecordSource):
        layout = source.layout(num_replicas=sizes.num_replicas, num_workers=num_workers,
                               parameter_server=per_worker, recorded=recorded_order)
        if not per_worker and layout.streams % sizes.num_replicas and sizes.num_replicas % layout.streams == 0:
            log.info("%d replicas share the data's %d stream(s): each reads whole streams and keeps its part "
                     "(same examples per step as the recorded run, more bytes read)", sizes.num_replicas, layout.streams)
    elif isinstance(source, StreamSource):
        log.warning("%s", COSTS)
    spe = steps_per_epoch_for(source, sizes, steps_per_epoch, layout=layout, per_worker=per_worker)
    used = spe * sizes.global_batch_size
    if source.num_examples and used < source.num_examples and steps_per_epoch is None:
        if isinstance(source, PyDatasetSource):
            log.info("%d example(s) of %s are left out of every epoch: %s", source.num_examples - used, source.name,
                     "its last batch is smaller" if source.training_examples == used else
                     f"its {source.full_batches} batches of {source.batch_size} do not fill whole global batches")
        else:
            log.info("%d example(s) per epoch do not fill a global batch%s and are left out of that epoch "
                     "(a different set each epoch when shuffling)", source.num_examples - used,
                     f" (per stream: {layout.streams} streams)" if layout is not None else "")
    # A stream with steps_per_epoch is read on from epoch to epoch; a resume keeps what its run did.
    continuous = isinstance(source, StreamSource) and (
        recorded_order.get("stream") == "continuous" if recorded_order is not None else steps_per_epoch is not None)
    return DataPlan(sizes=sizes, steps_per_epoch=spe, epochs=epochs, seed=seed, shuffle=shuffle, layout=layout,
                    continuous=continuous)


def dataset_fn(
    source: Source,
    plan: DataPlan,
    *,
    start_step: int,
    stop_step: int | None = None,
    per_worker: bool = False,
    class_weight: ClassWeights | None = None,
) -> Callable[[Any], "tf.data.Dataset"]:
    """A ``dataset_fn(input_context)`` for ``distribute_datasets_from_function``.

    Synchronous strategies: every input pipeline yields, for each global step from
    ``start_step`` to ``stop_step``, one per-replica batch per local replica -- its slice of
    the global batch -- consecutive elements going to its local replicas in order. Where each
    worker reads steps of its own (``per_worker=True``, the strategy's ``per_worker_input``:
    parameter servers), each worker runs whole steps, so worker ``w`` of ``W``
    yields the global batches of steps ``start_step + w``, ``+ W``, ... forever (the
    coordinator decides how many it runs). ``class_weight`` weighs each example by its class.
    The dataset's functions are traced without autograph: they hold no tensor-dependent Python
    control flow. Converting them costs about half a second of CPU at the start of every run.
    """
    import tensorflow as tf

    if isinstance(source, TFRecordSource):
        if plan.layout is None:
            raise ValueError("a file source needs a plan made by make_plan (plan.layout is None)")
        inner = source.dataset_fn(plan, start_step=start_step, stop_step=stop_step, parameter_server=per_worker)
    elif isinstance(source, _INDEXED):
        inner = _array_dataset_fn(source, plan, start_step=start_step, stop_step=stop_step,
                                  per_worker=per_worker)
    else:
        inner = _stream_dataset_fn(source, plan, start_step=start_step, stop_step=stop_step,
                                   per_worker=per_worker)

    @tf.autograph.experimental.do_not_convert  # graph building only: no tensor-dependent Python control flow
    def make(input_context=None):
        ds = inner(input_context)
        if class_weight is not None:
            ds = ds.map(class_weight.weigh, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        return _finish(ds)

    return make


READ_BYTES = 4 << 20
"""An in-memory or indexed source's pipeline reads about this many bytes at once (whole steps)."""
MAX_STEPS_PER_READ = 32


def steps_per_read(step_bytes: int) -> int:
    """How many steps' examples one read gathers: ``READ_BYTES`` worth, 1 to ``MAX_STEPS_PER_READ``."""
    return max(1, min(MAX_STEPS_PER_READ, READ_BYTES // max(1, step_bytes)))


def _unflatten(t: "tf.Tensor", indices: "tf.Tensor") -> "tf.Tensor":
    """``t`` (one row per flattened index) in the shape of ``indices`` followed by a row's shape."""
    import tensorflow as tf

    out = tf.reshape(t, tf.concat([tf.shape(indices, out_type=tf.int32), tf.shape(t)[1:]], 0))
    out.set_shape(indices.shape.concatenate(t.shape[1:]))
    return out


def _finish(ds: "tf.data.Dataset") -> "tf.data.Dataset":
    import tensorflow as tf

    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    options.deterministic = True
    return ds.with_options(options).prefetch(tf.data.AUTOTUNE)


def _input_part(sizes, input_context, per_worker: bool) -> tuple[int, int, int, int, int]:
    """(offset, length, local replicas) of the global batch this pipeline makes, and its (stride, offset) in steps.

    Under parameter servers every worker's pipeline makes whole global batches of every
    ``num_input_pipelines``-th step; elsewhere each pipeline makes its replicas' slice of every step.
    """
    if per_worker:
        stride = input_context.num_input_pipelines if input_context else 1
        step_offset = input_context.input_pipeline_id if input_context else 0
        return 0, sizes.global_batch_size, sizes.num_replicas, stride, step_offset
    part = order_mod.pipeline_slice(sizes, input_context)
    return part.offset, part.length, part.local_replicas, 1, 0


def _array_dataset_fn(source: Source, plan: DataPlan, *, start_step, stop_step, per_worker):
    import tensorflow as tf

    spe, sizes = plan.steps_per_epoch, plan.sizes
    stop = None if per_worker else stop_step
    last_epoch = (stop - 1) // spe if stop is not None else None

    def make(input_context=None):
        offset, length, local_replicas, stride, step_offset = _input_part(sizes, input_context, per_worker)
        first_step = start_step + step_offset
        per_replica = sizes.per_replica_batch_size
        gather = source.gather_fn(embed=per_worker)
        epochs = tf.data.Dataset.range(first_step // spe, last_epoch + 1 if last_epoch is not None else 2**62)

        def epoch_dataset(epoch):
            begin, end = order_mod.steps_of_epoch(epoch, steps_per_epoch=spe, first_step=first_step, stop_step=stop,
                                                  stride=stride)

            def step_indices(step):
                positions = step * sizes.global_batch_size + offset + tf.range(length, dtype=tf.int64)
                examples = _example_order(source, plan, epoch, positions)
                return tf.reshape(examples, [local_replicas, per_replica])

            return tf.data.Dataset.range(begin, end, stride).map(step_indices)

        # Several steps' examples in one read: fewer Python calls (tf.numpy_function takes the GIL
        # from the training loop's thread), each step's examples unchanged.
        steps = steps_per_read(source.example_bytes * length)

        batches = steps * local_replicas  # per-replica batches of one read

        def read(indices):  # [steps, local replicas, per replica] -> [steps x local replicas, per replica, ...]
            rows = tf.reshape(indices, [-1, per_replica])  # the epoch's last read may hold fewer steps
            examples = tf.nest.map_structure(lambda t: _unflatten(t, rows), gather(tf.reshape(indices, [-1])))
            # One read of one batch needs no unbatch (each unbatch copies every example).
            return examples if batches > 1 else tf.nest.map_structure(lambda t: t[0], examples)

        ds = epochs.flat_map(epoch_dataset).batch(steps)
        ds = ds.map(read, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        return ds.unbatch() if batches > 1 else ds

    return make


def _stream_dataset_fn(source: StreamSource, plan: DataPlan, *, start_step, stop_step, per_worker):
    """Each epoch one pass of the stream from its start (shuffled with the epoch's seed), or, with
    ``plan.continuous``, the passes one after another, each step taking the next global batch."""
    import tensorflow as tf

    spe, sizes = plan.steps_per_epoch, plan.sizes
    stop = None if per_worker else stop_step
    last_epoch = (stop - 1) // spe if stop is not None else None
    seed = plan.seed * 1_000_003

    def make(input_context=None):
        offset, length, local_replicas, step_stride, step_offset = _input_part(sizes, input_context, per_worker)
        per_replica = sizes.per_replica_batch_size
        first_step = start_step + step_offset
        stream = source.dataset

        def cut(*element):
            return tf.nest.map_structure(lambda t: tf.reshape(
                t[offset:offset + length], tf.concat([[local_replicas, per_replica], tf.shape(t)[1:]], 0)), element)

        def one_pass(number):  # a Python int (epoch) or an int64 tensor (pass)
            if not plan.shuffle:
                return stream
            return _shuffled(stream, source.shuffle_buffer, seed=seed + number)

        if plan.continuous:
            return _read_on(one_pass, source, sizes.global_batch_size, first_step=first_step,
                            stop_step=stop, stride=step_stride).map(cut).unbatch()

        def epoch_dataset(epoch: int):
            batches = source.batch(one_pass(epoch).repeat(), sizes.global_batch_size, drop_remainder=True).take(spe)
            begin = max(first_step, epoch * spe)
            begin += (first_step - begin) % step_stride
            end = (epoch + 1) * spe if stop is None else min((epoch + 1) * spe, stop)
            batches = batches.skip(begin - epoch * spe)  # O(position): the documented cost of a stream
            batches = batches.take(max(0, end - begin)).shard(step_stride, 0)
            return batches.map(cut).unbatch()

        # Parameter servers run on past the end: cycle through the run's epochs again.
        first_epoch = first_step // spe
        final = last_epoch if last_epoch is not None else first_epoch + plan.epochs - 1
        ds = epoch_dataset(first_epoch)
        for epoch in range(first_epoch + 1, final + 1):
            ds = ds.concatenate(epoch_dataset(epoch))
        if last_epoch is None:
            ds = ds.repeat()
        return ds

    return make


def _shuffled(stream: "tf.data.Dataset", buffer: int, *, seed) -> "tf.data.Dataset":
    """``stream.shuffle(buffer, seed=seed)`` once, for a Python or a tensor ``seed``.

    TensorFlow pairs the op seed with the graph's global seed and compares the pair with (0, 0)
    in Python, which fails for a tensor op seed when the global seed is 0 (``tf.random.set_seed(0)``,
    or a run with ``seed=0``): the pass numbers of a stream read on across epochs are tensors.
    That global seed is set aside for this op, which then pairs with the default graph seed, as
    with no global seed (a global seed of 0 failed before, so no order it gave is changed)."""
    import tensorflow as tf

    graph = tf.compat.v1.get_default_graph()
    saved = graph.seed
    if tf.is_tensor(seed) and saved is not None and saved % (2**31 - 1) == 0:
        graph.seed = None
    try:
        return stream.shuffle(buffer, seed=seed, reshuffle_each_iteration=False)
    finally:
        graph.seed = saved


def _read_on(one_pass, source: StreamSource, global_batch: int, *, first_step: int, stop_step: int | None,
             stride: int) -> "tf.data.Dataset":
    """The global batches of steps ``first_step``, ``+ stride``, ... (to ``stop_step``) of the
    stream's passes read one after another: step ``s`` holds elements ``[s x G, (s + 1) x G)``.
    A stream of known length starts at the pass that holds the first step's elements and skips
    to them; another one skips from its start (O(position): the documented cost of a stream)."""
    import tensorflow as tf

    num_examples = source.num_examples
    before = first_step * global_batch
    first_pass = before // num_examples if num_examples else 0
    passes = tf.data.Dataset.range(first_pass, 2**62).flat_map(one_pass)
    batches = source.batch(passes.skip(before - first_pass * (num_examples or 0)), global_batch, drop_remainder=True)
    if stop_step is not None:
        batches = batches.take(max(0, stop_step - first_step))
    return batches.shard(stride, 0)


# --- validation ----------------------------------------------------------------------------------


def validation_dataset(source: Source, batch_size: int, *, embed: bool = False) -> "tf.data.Dataset":
    """Every validation example once, in order, in batches of ``batch_size`` (one process reads it all).

    ``embed``: the dataset will run in other processes (parameter servers): arrays go into its graph.
    """
    import tensorflow as tf

    if isinstance(source, _INDEXED):
        gather = source.gather_fn(embed=embed)
        n = source.num_examples
        ds = tf.data.Dataset.range(0, n, batch_size).map(tf.autograph.experimental.do_not_convert(
            lambda i: gather(tf.range(i, tf.minimum(i + batch_size, n)))))
    elif isinstance(source, TFRecordSource):  # tfdist's functions without autograph, as in training (parse_fn has it)
        records = tf.autograph.experimental.do_not_convert(source.records_dataset)(0, source.num_records)
        ds = records.batch(batch_size).map(tf.autograph.experimental.do_not_convert(source._parse),
                                           num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        # Its length, known from the file index: Keras 3's evaluate warns "ran out of data" without it.
        ds = ds.apply(tf.data.experimental.assert_cardinality(-(-source.num_records // batch_size)))
    else:
        ds = source.batch(source.dataset, batch_size)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return ds.with_options(options).prefetch(tf.data.AUTOTUNE)


def validation_input(source: Source, sizes: BatchSizes, *, strategy, per_worker: bool = False):
    """``(validation_data, validation_steps)`` for Keras ``fit`` under ``strategy``.

    In-memory and file sources under synchronous strategies: a distributed dataset in which
    replica ``r`` of ``M`` evaluates the contiguous ``r``-th ``1/M`` of the examples, so each
    worker reads only its part. Every replica runs the same number of steps; a replica whose
    part ran out gets empty batches (they add nothing to Keras' loss and metric sums, which
    are weighted by batch size), so the metrics are those of the whole set. Streams: one
    dataset that each worker reads whole (auto-sharded by data). ``per_worker`` (parameter
    servers): a function that makes each worker's own copy, repeated (the Keras adapter hands it to the
    workers); the step count covers the set once (approximate: which batches a worker
    evaluates depends on scheduling).
    """
    import tensorflow as tf

    batch = sizes.global_batch_size // sizes.grad_accum_steps
    if per_worker:
        return (lambda: validation_dataset(source, batch, embed=True).repeat()), max(1, -(-(source.num_examples or batch) // batch))
    if isinstance(source, StreamSource):
        return validation_dataset(source, batch), None
    if isinstance(source, UserPipeline):  # as Keras' fit distributes it: auto-sharded, each batch split
        if source.dataset is not None:
            return source.dataset, None
        return strategy.distribute_datasets_from_function(source.dataset_fn), None
    replicas, micro = sizes.num_replicas, sizes.micro_batch_size
    n = source.num_examples
    bounds = [r * n // replicas for r in range(replicas + 1)]
    steps = max(-(-(bounds[r + 1] - bounds[r]) // micro) for r in range(replicas))

    @tf.autograph.experimental.do_not_convert  # graph building only: no tensor-dependent Python control flow
    def make(input_context=None):
        part = order_mod.pipeline_slice(sizes, input_context)
        first = part.pipeline_id * part.local_replicas
        per_replica = [_replica_batches(source, bounds[r], bounds[r + 1], micro, steps)
                       for r in range(first, first + part.local_replicas)]
        ds = _interleave(per_replica, steps)
        if isinstance(source, TFRecordSource):
            ds = ds.map(source._parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        else:
            ds = ds.map(source.gather_fn(), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        return _finish(ds)

    return strategy.distribute_datasets_from_function(make), steps


def _interleave(per_replica: list, steps: int) -> "tf.data.Dataset":
    """Step by step, one element of each replica's dataset, in replica order.

    ``choose_from_datasets`` runs no function: a ``Dataset.from_tensors`` inside a ``flat_map``
    would count as a stateful op to tf.data's determinism rewrite, which then makes the whole
    pipeline sequential under ``deterministic=True`` (its parallel map and its prefetch) and
    logs a C++ error line ("NodeDef mentions attribute use_unbounded_threadpool")."""
    import tensorflow as tf

    if len(per_replica) == 1:
        return per_replica[0]
    choice = tf.data.Dataset.range(len(per_replica)).repeat(steps)
    return tf.data.Dataset.choose_from_datasets(per_replica, choice, stop_on_empty_dataset=True)


def _replica_batches(source: Source, begin: int, end: int, micro: int, steps: int) -> "tf.data.Dataset":
    """``steps`` batches of what replica reads (indices or serialized records), empty ones after its part ends."""
    import tensorflow as tf

    if isinstance(source, TFRecordSource):
        ds = source.records_dataset(begin, end).batch(micro)
        empty = tf.zeros([0], tf.string)
    else:
        ds = tf.data.Dataset.range(begin, end).batch(micro)
        empty = tf.zeros([0], tf.int64)
    have = -(-(end - begin) // micro)
    return ds.concatenate(tf.data.Dataset.from_tensors(empty).repeat(steps - have))


def read_failure(error: BaseException, *sources: Any) -> BaseException | None:
    """The user's error behind TensorFlow's ``error`` from an input pipeline, if a source can name
    it (``failure_of``): a Python dataset's own exception; an image file that cannot be decoded.
    ``None``: raise ``error`` itself."""
    import tensorflow as tf

    if not isinstance(error, tf.errors.OpError):
        return None
    for source in sources:
        failure_of = getattr(source, "failure_of", None)
        failure = failure_of(error) if failure_of is not None else None
        if failure is not None:
            return failure
    return _label_out_of_range(error, [source for source in sources if source is not None])


# TensorFlow's sparse cross-entropy on a label it has no class for (CPU; a GPU gives NaN instead).
_LABEL_RANGE = re.compile(r"Received a label value of (-?\d+) which is outside the valid range of \[0, (\d+)\)")
# The same, as the gather inside it reports it (graph functions): only where that gather is the loss's.
_LABEL_GATHER = re.compile(r"indices\[\d+\] = (-?\d+) is not in \[0, (\d+)\)")
_SPARSE_LOSS = re.compile(r"SparseSoftmaxCrossEntropy|sparse_categorical_crossentropy")


def _label_out_of_range(error: BaseException, sources: list) -> DataError | None:
    """Bad data, not a failure a restart could fix: a label outside the model's classes."""
    text = str(error)
    found = _LABEL_RANGE.search(text) or (_LABEL_GATHER.search(text) if _SPARSE_LOSS.search(text) else None)
    if found is None:
        return None
    label, classes = int(found.group(1)), int(found.group(2))
    names = " or ".join(repr(getattr(source, "name", type(source).__name__)) for source in sources) or "the data"
    return DataError(f"a label is not one of the model's classes 0 to {classes - 1}; received label {label} in {names}. "
                     f"Fix: number the classes from 0 (labels 1 to {classes}: subtract 1), or give the model one output "
                     "per class of the data.")
