"""A user's own tf.data pipeline (a batched dataset or a ``dataset_fn``): read per worker, resumed exactly.

Two forms, as Keras and ``tf.distribute`` take them:

* a **batched** ``tf.data.Dataset`` whose batch is the global batch, with ``(x,)``, ``(x, y)`` or
  ``(x, y, sample_weight)`` elements (or ``x`` alone), finite or repeated;
* a **``dataset_fn(input_context)``** returning per-replica batches, as
  ``strategy.distribute_datasets_from_function`` calls it.

Each worker builds its own pipeline. A batched dataset that reads files is split by file
(``file`` mode: each worker reads 1/W of the files and takes G/W examples a step); one that
does not is read whole by every worker, which keeps its slice of every global batch (``slice``
mode: the same examples per global step at any worker count). A ``dataset_fn`` shards as the
user wrote it (``fn`` mode). The worker's batch is split among its local replicas.

Each worker iterates its pipeline with a plain ``tf.data`` iterator, endlessly repeated.
Its state (the position, shuffle buffers included) is written beside every checkpoint, by
every worker, before the checkpoint itself. A resume restores it: no element is read again,
whatever the step. A pipeline whose state TensorFlow cannot save (``tf.py_function``,
``Dataset.from_generator``, stateful random ops) trains with a warning; its resume skips the
batches before the position, reading them again.
"""

from __future__ import annotations

import hashlib
import logging
import re
import uuid
from typing import TYPE_CHECKING, Any, Callable

from tfdist.errors import BatchSizeError, DataError

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

log = logging.getLogger("tfdist")

BATCHED, FUNCTION = "batched", "dataset_fn"
FILE, SLICE, FN = "file", "slice", "fn"
"""How a worker's pipeline is made: its files, its slice of every batch, or the user's function."""

# Dataset ops that batch their input, and the one that undoes it.
_BATCHING = frozenset({
    "BatchDataset", "BatchDatasetV2", "PaddedBatchDataset", "PaddedBatchDatasetV2", "ParallelBatchDataset",
    "MapAndBatchDataset", "ExperimentalMapAndBatchDataset", "DenseToSparseBatchDataset",
    "ExperimentalDenseToSparseBatchDataset", "RebatchDataset", "RebatchDatasetV2", "GroupByWindowDataset",
    "ExperimentalGroupByWindowDataset", "BucketBySequenceLengthDataset",
})
_DATASET_OP = re.compile(r"Dataset(V\d+)?$")
_UNBATCHING = frozenset({"UnbatchDataset", "ExperimentalUnbatchDataset"})
# Ops whose state lives in Python, out of reach of an iterator checkpoint.
_HIDDEN_STATE = {"EagerPyFunc": "tf.py_function", "PyFunc": "tf.numpy_function", "PyFuncStateless": "tf.numpy_function",
                 "GeneratorDataset": "Dataset.from_generator",
                 # Stateful random ops restart their sequence in a new process (tf.random.stateless_* do not).
                 **{op: "stateful random ops (tf.random.uniform...)" for op in (
                     "RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal", "RandomShuffle",
                     "Multinomial", "RandomGamma", "RandomPoisson", "RandomPoissonV2", "ParameterizedTruncatedNormal")}}
FIX_HIDDEN = ("Fix: use TensorFlow ops in the pipeline (tf.data readers, Dataset.map with tf ops, stateless random "
               "ops), or write the data as TFRecord files")


def _graph(dataset: "tf.data.Dataset"):
    """The dataset's GraphDef (its ops and function library), through the public raw op."""
    import tensorflow as tf

    serialized = tf.raw_ops.DatasetToGraphV2(input_dataset=tf.data.experimental.to_variant(dataset),
                                             external_state_policy=1, strip_device_assignment=True)  # 1: ignore
    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(serialized.numpy())
    return graph


def is_batched(dataset: "tf.data.Dataset") -> bool:
    """Whether the last batching op before the dataset's end is a batch, not an unbatch (read from its graph).

    A graph TensorFlow cannot serialize (a constant above 2 GiB) is judged by its element spec:
    batched if every component's first dimension is unknown."""
    import tensorflow as tf

    try:
        graph = _graph(dataset)
    except (tf.errors.OpError, ValueError):
        specs = tf.nest.flatten(dataset.element_spec)
        return all(s.shape.rank and s.shape[0] is None for s in specs)
    nodes = {node.name: node for node in graph.node}

    def input_dataset(node):  # the first input that is a dataset (the `_Retval` names the end)
        inputs = [nodes.get(name.split(":")[0]) for name in node.input if not name.startswith("^")]
        return next((n for n in inputs if n is not None and _DATASET_OP.search(n.op)), None)

    node = next((input_dataset(n) for n in graph.node if n.op == "_Retval"), None)
    while node is not None:
        if node.op in _BATCHING:
            return True
        if node.op in _UNBATCHING:
            return False
        node = input_dataset(node)
    return False


def hidden_state(dataset: "tf.data.Dataset") -> str | None:
    """What in the pipeline keeps state TensorFlow cannot save (``tf.py_function``...), or None (also when its
    graph cannot be serialized: the position's save then says what fails)."""
    import tensorflow as tf

    try:
        graph = _graph(dataset)
    except (tf.errors.OpError, ValueError):
        return None
    ops = [node.op for node in graph.node]
    ops += [node.op for function in graph.library.function for node in function.node_def]
    found = {_HIDDEN_STATE[op] for op in ops if op in _HIDDEN_STATE}
    if "Dataset.from_generator" in found:  # which calls its generator through a tf.numpy_function
        found.discard("tf.numpy_function")
    found = sorted(found)
    return " and ".join(found) or None


def _as_tuple(element: Any) -> tuple:
    """A dataset element as Keras unpacks it: a tuple stays, anything else is ``(x,)``."""
    return tuple(element) if isinstance(element, tuple) else (element,)


class UserPipeline:
    """A user's own ``tf.data`` pipeline: a batched dataset of global batches, or a ``dataset_fn(input_context)``.

    ``bind(strategy)`` makes this worker's pipeline (``WorkerPipeline``); the sample and
    the global batch come from its first element.

    Args:
      dataset: a batched ``tf.data.Dataset`` whose every batch is one global batch.
      dataset_fn: a function of a ``tf.distribute.InputContext`` returning a dataset of
        per-replica batches (give one of ``dataset`` and ``dataset_fn``).

    Raises:
      DataError: neither or both are given, or the dataset is not batched.
    """

    index_addressable = False
    labelled = True

    def __init__(self, dataset: "tf.data.Dataset | None" = None, *,
                 dataset_fn: Callable[[Any], "tf.data.Dataset"] | None = None):
        if (dataset is None) == (dataset_fn is None):
            raise DataError("a user pipeline is a batched dataset or a dataset_fn; received "
                            f"{'both' if dataset is not None else 'neither'}. Fix: pass one of them.")
        if dataset_fn is not None and not _takes_one_argument(dataset_fn):
            raise DataError(f"a dataset_fn takes the input context; received {_name_of(dataset_fn)}, which takes no "
                            "argument. Fix: def dataset_fn(input_context): ... (as distribute_datasets_from_function "
                            "calls it), or pass the dataset it returns.")
        if dataset is not None and not is_batched(dataset):
            raise DataError(f"the dataset is not batched; received elements of spec {dataset.element_spec}. Fix: "
                            "call .batch(global_batch) on it, or pass it unbatched as data (tfdist then batches it).")
        self.dataset = dataset
        self.dataset_fn = dataset_fn
        self.form = BATCHED if dataset is not None else FUNCTION
        self.name = "tf.data.Dataset (batched)" if dataset is not None else f"dataset_fn {_name_of(dataset_fn)}"
        self.num_examples = None
        self.worker: WorkerPipeline | None = None
        self._sample: tuple | None = None

    def bind(self, strategy) -> "WorkerPipeline":
        """This worker's pipeline under ``strategy`` (made once)."""
        if self.worker is None or self.worker.strategy is not strategy:
            self.worker = WorkerPipeline(self, strategy)
        return self.worker

    def call(self, context) -> "tf.data.Dataset":
        """``dataset_fn(context)``, checked to be a dataset."""
        dataset = self.dataset_fn(context)
        if not hasattr(dataset, "element_spec"):
            raise DataError(f"dataset_fn must return a tf.data.Dataset; received {type(dataset).__name__} from "
                            f"{self.name}. Fix: return a dataset of per-replica batches.")
        return dataset

    def _bound(self) -> "WorkerPipeline":
        if self.worker is None:
            raise ValueError("bind(strategy) the pipeline first")
        return self.worker

    def sample(self, count: int) -> Any:
        """The first ``count`` examples of this worker's first batch (fewer if it is smaller), structured as
        the batches (``x`` alone stays alone); read on its own when the pipeline is not bound to a strategy
        (data to evaluate)."""
        import tensorflow as tf

        if self.worker is not None:
            first, spec = self.worker.first, self.worker.dataset.element_spec
        else:
            dataset = self.dataset if self.dataset is not None else self.call(tf.distribute.InputContext())
            if self._sample is None:
                self._sample = _first_element(dataset, self.name)
            first, spec = self._sample, dataset.element_spec
        rows = tf.nest.map_structure(lambda a: a[:count], first)
        return rows if isinstance(spec, tuple) else rows[0]  # x alone, as train_step receives it

    @property
    def example_shape(self) -> Any:
        import numpy as np
        import tensorflow as tf

        return tf.nest.map_structure(lambda a: tuple(np.shape(a)[1:]), self.sample(1)[0])

    def fingerprint(self) -> str:
        """The form and element structure (a hash of the data would be a pass over it)."""
        spec = self.dataset.element_spec if self.dataset is not None else self._bound().unrepeated.element_spec
        text = f"{self.form}|{spec!r}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def hidden_state(self) -> str | None:
        """What in the pipeline keeps state TensorFlow cannot save, or None."""
        return self._bound().hidden


def _takes_one_argument(fn: Any) -> bool:
    import inspect

    try:
        inspect.signature(fn).bind(None)
    except TypeError:
        return False
    except ValueError:  # a builtin without a signature: it is tried
        return True
    return True


def _name_of(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def check_sizes(source: UserPipeline, *, num_replicas: int, batch_size: int | None,
                per_replica_batch_size: int | None, grad_accum_steps: int) -> int:
    """The global batch of ``source``; a ``batch_size`` that disagrees with the pipeline's batches is refused."""
    global_batch = source._bound().global_batch
    if batch_size is not None and batch_size != global_batch:
        raise BatchSizeError(f"the pipeline's batches hold {global_batch} examples a step; received batch_size="
                             f"{batch_size}. Fix: leave batch_size out (the pipeline's batch is the global batch), or "
                             "batch the dataset with it.")
    if per_replica_batch_size is not None and per_replica_batch_size * num_replicas * grad_accum_steps != global_batch:
        raise BatchSizeError(f"the pipeline's batches hold {global_batch} examples a step, which {num_replicas} "
                             f"replica(s) x grad_accum_steps={grad_accum_steps} do not split into micro batches of "
                             f"per_replica_batch_size={per_replica_batch_size}. Fix: leave per_replica_batch_size out.")
    divisor = num_replicas * grad_accum_steps
    if global_batch % divisor:
        raise BatchSizeError(f"the pipeline's batches hold {global_batch} examples, which replicas x grad_accum_steps "
                             f"= {divisor} do not divide. Fix: batch it by a multiple of {divisor}.")
    return global_batch


def check_strategy(source: UserPipeline, *, coordinated: bool) -> None:
    """Parameter servers run steps on workers in no fixed order: a pipeline position cannot be saved there."""
    if coordinated:
        raise DataError(
            f"a user's own tf.data pipeline cannot train under parameter_server; received {source.name}. Fix: use "
            "multi_worker_mirrored (strategy='multi_worker_mirrored'), or tfdist.TFRecordSource(files, parse_fn), "
            "which parameter servers read in a resumable order."
        )


# --- the pipeline of one worker ---------------------------------------------------------------
def input_context_of(strategy) -> "tf.distribute.InputContext":
    """This worker's ``InputContext``, as ``distribute_datasets_from_function`` gives it."""
    import tensorflow as tf

    contexts = []

    def record(context):
        contexts.append(context)
        return tf.data.Dataset.range(1)

    strategy.distribute_datasets_from_function(record)
    return contexts[0] if contexts else tf.distribute.InputContext(num_replicas_in_sync=strategy.num_replicas_in_sync)


def _autoshard_files(dataset: "tf.data.Dataset", workers: int, index: int) -> "tf.data.Dataset":
    """``dataset`` reading only its ``index``-th share of the files, as tf.distribute's FILE auto-shard rewrites it."""
    import tensorflow as tf

    specs = tf.nest.flatten(tf.data.experimental.get_structure(dataset))
    variant = tf.raw_ops.AutoShardDataset(
        input_dataset=tf.data.experimental.to_variant(dataset), num_workers=workers, index=index,
        auto_shard_policy=int(tf.data.experimental.AutoShardPolicy.FILE),
        output_types=[s.dtype for s in specs], output_shapes=[s.shape for s in specs])
    return tf.data.experimental.from_variant(variant, tf.data.experimental.get_structure(dataset))


def part_of(element: Any, part: int, parts: int) -> Any:
    """The ``part``-th of ``parts`` near-equal slices of every tensor of a batch (a short batch gives short slices)."""
    import tensorflow as tf

    def one(t):
        size = tf.shape(t, out_type=tf.int64)[0]
        share = -(-size // parts)
        begin = tf.minimum(size, part * share)
        return t[begin:tf.minimum(size, begin + share)]

    return tf.nest.map_structure(one, element)


class WorkerPipeline:
    """One worker's pipeline of a ``UserPipeline``: the dataset it reads, how it is split, what a step takes.

    Its iterator is made once, here, and its first element read and put back: reading it
    again from a new iterator would draw new shuffle seeds, and the first epoch would not be
    the one Keras' ``fit`` reads.

    Attributes:
      mode: ``file``, ``slice`` or ``fn`` (see the module).
      dataset: the worker's dataset, repeated without end; ``iterator`` reads it.
      per_step: elements one step takes (1 worker batch, or one batch per local replica).
      local_replicas: the replicas of this worker, which share its elements.
      global_batch: examples of one step, all workers together.
      first: the first element read (a global batch in ``slice`` mode), as NumPy arrays in a tuple.
      context: the worker's ``InputContext``; strategy: the run's strategy.
    """

    def __init__(self, source: UserPipeline, strategy):
        import tensorflow as tf

        self.source = source
        self.strategy = strategy
        self.context = context = input_context_of(strategy)
        self.workers, self.worker = context.num_input_pipelines, context.input_pipeline_id
        self.local_replicas = max(1, context.num_replicas_in_sync // max(1, self.workers))
        if source.form == FUNCTION:
            self.mode, self.per_step = FN, self.local_replicas
            self._start(source.call(context))
            self.global_batch = _batch_size(self.first) * context.num_replicas_in_sync
            return
        self.per_step = 1
        if self.workers > 1:
            try:  # by file: the worker's first batch holds the global batch of its own files
                self.global_batch = _static_batch(source.dataset) or _batch_size(
                    _first_element(_autoshard_files(source.dataset, self.workers, self.worker), source.name))
                self.mode = FILE
                self._start(_autoshard_files(source.dataset, self.workers, self.worker).rebatch(
                    self.global_batch // self.workers))
                return
            except (tf.errors.InvalidArgumentError, tf.errors.NotFoundError):
                log.info("the pipeline does not read at least %d files, so every worker reads all of it and keeps its "
                         "slice of every batch (input work does not shrink with workers). Fix: read the data from %d "
                         "or more files (TFRecordDataset(files))", self.workers, self.workers)
        # Every worker iterates the whole pipeline, so that any worker's position is every worker's (a new
        # worker count restores it); ``slice_of`` takes the worker's part of each batch after the iterator.
        self.mode = SLICE
        self._start(source.dataset)
        self.global_batch = _batch_size(self.first)

    def slice_of(self, batch: Any) -> Any:
        """This worker's part of a batch its iterator read (all of it, unless in ``slice`` mode with workers)."""
        return part_of(batch, self.worker, self.workers) if self.mode == SLICE and self.workers > 1 else batch

    def _start(self, dataset: "tf.data.Dataset") -> None:
        """Makes the worker's endless dataset and its iterator, reads the first element and puts it back."""
        import numpy as np
        import tensorflow as tf

        self.finite = int(dataset.cardinality()) != int(tf.data.INFINITE_CARDINALITY)
        self._length: int | None = None  # elements in one pass, once known
        if self.finite and self.per_step > 1:  # each pass ends on a whole step, so that epochs stay aligned
            count = self._pass_length(dataset)
            self._length = count // self.per_step * self.per_step
            if self._length < count:
                log.info("%d per-replica batch(es) of every pass do not fill a step of %d replicas and are left out",
                         count - self._length, self.per_step)
                dataset = dataset.take(self._length)
        options = tf.data.Options()  # state outside the pipeline (a variable, a random op) is named by hidden_state
        options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
        self.unrepeated = dataset = dataset.with_options(options)
        self.dataset = dataset.repeat() if self.finite else dataset
        self.iterator = iter(self.dataset)
        self.hidden = hidden_state(dataset)
        self.initial = _position(self.iterator) if self.hidden is None else None
        try:
            self.first = _as_tuple(tf.nest.map_structure(np.asarray, next(self.iterator)))
        except StopIteration:
            raise DataError(f"the pipeline is empty; received {self.source.name} yielding no batch on worker "
                            f"{self.worker}. Fix: check its files and filters.") from None
        self.rewind()

    def rewind(self) -> None:
        """Puts the iterator back at the pipeline's start (a new iterator where its state cannot be saved)."""
        import tensorflow as tf

        if self.initial is not None:
            tf.train.Checkpoint(it=self.iterator).read(self.initial).assert_consumed()
        else:
            self.iterator = iter(self.dataset)

    def as_dict(self) -> dict:
        """What a checkpoint records of it (``DataPlan.order_record``): the form, not the worker count."""
        return {"pipeline": self.source.form}

    def steps(self) -> int | None:
        """Steps in one pass of this worker's pipeline: known, or None for an endless one."""
        if not self.finite:
            return None
        if self._length is None:
            self._length = self._pass_length(self.unrepeated)
        return self._length // self.per_step

    def _pass_length(self, dataset: "tf.data.Dataset") -> int:
        """Elements in one pass of ``dataset``: its cardinality, else counted (a pass over this worker's part)."""
        import tensorflow as tf

        count = int(dataset.cardinality())
        if count >= 0:
            return count
        log.info("counting the batches of the pipeline (its length is unknown): one pass over this worker's part; "
                 "pass steps_per_epoch to skip it")
        count = int(dataset.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1))
        if hasattr(self, "initial"):
            self.rewind()  # the count drew shuffle seeds; the iterator's saved start holds the first ones
        return count


def _position(iterator) -> str | None:
    """The iterator's state written to memory (``ram://``), or None where TensorFlow cannot save it."""
    import tensorflow as tf

    try:
        path = tf.train.Checkpoint(it=iterator).write(f"ram://tfdist-input/{uuid.uuid4().hex}/start")
        tf.train.Checkpoint(it=iterator).read(path).assert_consumed()  # some ops fail only when read back
        return path
    except (tf.errors.UnimplementedError, tf.errors.FailedPreconditionError, tf.errors.InvalidArgumentError):
        return None


def _first_element(dataset: "tf.data.Dataset", name: str) -> tuple:
    import numpy as np
    import tensorflow as tf

    for element in dataset.take(1):
        return _as_tuple(tf.nest.map_structure(np.asarray, element))
    raise DataError(f"the pipeline is empty; received {name} yielding no batch. Fix: check its files and filters.")


def _static_batch(dataset: "tf.data.Dataset") -> int | None:
    """The batch size a dataset's element spec fixes (``drop_remainder=True``), or None."""
    import tensorflow as tf

    sizes = {spec.shape[0] if spec.shape.rank else None for spec in tf.nest.flatten(dataset.element_spec)}
    return sizes.pop() if len(sizes) == 1 and None not in sizes else None


def _batch_size(element: tuple) -> int:
    import numpy as np
    import tensorflow as tf

    return int(np.shape(tf.nest.flatten(element)[0])[0])


def agreed_min(strategy, value: int) -> int:
    """The smallest of every worker's ``value`` (an all-gather under multi-worker strategies)."""
    import tensorflow as tf

    per_replica = strategy.experimental_distribute_values_from_function(lambda _: tf.constant([value], tf.int64))
    return int(tf.reduce_min(strategy.gather(per_replica, axis=0)))


def steps_per_epoch(source: UserPipeline, pipeline: WorkerPipeline, strategy, given: int | None) -> int:
    """Steps in one epoch: given, else one pass of the pipeline (the fewest any worker has)."""
    if given is not None:
        return given
    steps = pipeline.steps()
    if steps is None:
        raise DataError(f"the pipeline never ends, so an epoch has no end; received {source.name}, repeated. "
                        "Fix: pass steps_per_epoch.")
    steps = agreed_min(strategy, steps) if pipeline.workers > 1 else steps
    if steps < 1:
        raise BatchSizeError(f"the pipeline holds no whole step for a worker; received {source.name}. Fix: use more "
                             "data or a smaller batch.")
    return steps
