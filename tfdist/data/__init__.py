"""The data path: batch arithmetic, data sources, and a deterministic, resumable order.

A run's data is a pure function of (seed, epoch, step), so a resumed run reads exactly the
batches the uninterrupted run would have read, and reaches its position in bounded time.

Sources (what ``fit`` accepts as ``data``):

* ``ArraySource``    -- in-memory NumPy arrays (``(x, y)`` or ``(x, y, sample_weight)``, each part
  one array or a dict/list of arrays; ``digits``, ``.npz``). Epoch ``e`` visits the examples
  in a permutation seeded by ``(seed, e)``, computed per position
  (``index_shuffle``) without building it; global step ``t`` takes positions
  ``[t * G, (t + 1) * G)``. Synchronous strategies gather from the arrays in place; under
  parameter servers the arrays travel inside the dataset function, so they are limited to
  ``arrays.MAX_EMBEDDED_BYTES`` (64 MiB): larger data belongs in files.
* ``TFRecordSource`` -- TFRecord files of any size on any TensorFlow filesystem, and
  ``tfds:NAME`` (a prepared TFDS data set, read through the same machinery). The files are
  cut into blocks of ~2 MiB that each epoch shuffles and deals to ``S`` streams; replica
  ``r`` reads only its streams, so each worker reads 1/W of the bytes; records are shuffled
  within windows of ``K`` blocks; resuming opens one window per stream, whatever the step;
  every worker runs the same number of steps. ``S`` is recorded in the checkpoint, and the
  examples of every step stay the same when the replica count changes (see ``files``).
  Record counts and byte offsets are scanned once and cached in a small index file.
* ``IndexedSource``  -- a random-access source (``tfds:NAME`` stored as ArrayRecord, through
  ``tfds.data_source``): the arrays' exact global shuffle, each batch read by index through
  ``tf.numpy_function``; synchronous strategies only.
* ``PyDatasetSource`` -- a Keras ``PyDataset`` (``keras.utils.Sequence``) or tf_keras ``Sequence``:
  batches read by index through ``tf.numpy_function``; epoch ``e`` visits its whole batches in a
  permutation seeded by ``(seed, e)``, rows in order (``pydataset``); synchronous strategies only.
* ``ImageFolderSource`` -- image files in one folder per class (Keras' ``image_dataset_from_directory``
  listing and decoding): the arrays' exact global shuffle over the files, each batch read and
  decoded by TensorFlow ops in the pipeline, under every strategy, from any filesystem (``images``).
* ``UserPipeline``   -- the user's own pipeline, as Keras and tf.distribute take it: a batched
  ``tf.data.Dataset`` of global batches, or a ``dataset_fn(input_context)`` of per-replica batches.
  Each worker builds its own pipeline (by file when it reads files: 1/W of the bytes), reads it
  with a plain iterator, and saves its position beside every checkpoint (``user_pipeline``,
  ``user_input``): a resume reads on from there, whatever the step.
* ``StreamSource``   -- any ``tf.data.Dataset`` of unbatched ``(x, y)`` (or ``(x, y, sample_weight)``):
  the fallback. Every worker reads all of it, resuming replays the epoch up to the position,
  and an unknown length costs a counting pass (a warning says so, and names the file source
  as the fix).

Modules: ``batching`` (BatchSizes; no TensorFlow), ``class_weights`` (Keras' ``class_weight``, applied
in the pipeline), ``order`` (DataPlan, seeded keys and
permutations), ``arrays``, ``indexed``, ``pydataset``, ``images``, ``files`` (layout, streams, windows), ``records`` (TFRecord index
and offset reads), ``stream``, ``user_pipeline`` and ``user_input`` (a user's own pipeline), ``tfds``, ``features`` (JSON feature specs), ``pipeline`` (what
``fit`` calls), ``loading`` (named data).

What ``fit`` calls, in order: ``load``/``as_source`` -> ``BatchSizes.resolve`` ->
``make_plan`` (steps per epoch, the file layout; ``plan.order_record()`` goes into the
checkpoint) -> ``dataset_fn(source, plan, start_step=..., stop_step=...)`` for
``distribute_datasets_from_function`` -> ``validation_input``.
"""

from tfdist.data.arrays import MAX_EMBEDDED_BYTES, ArraySource, check_validation_split, inputs_of
from tfdist.data.batching import DEFAULT_PER_REPLICA_BATCH, BatchSizes
from tfdist.data.class_weights import ClassWeights
from tfdist.data.files import Layout, TFRecordSource
from tfdist.data.images import ImageFolderSource, check_labelled, check_same_classes
from tfdist.data.indexed import IndexedSource
from tfdist.data.loading import (as_source, load, load_digits, load_npz, load_to_evaluate, load_to_predict, num_classes,
                                 unlabelled, with_labels)
from tfdist.data.order import DataPlan
from tfdist.data.pydataset import PyDatasetSource
from tfdist.data.pipeline import (dataset_fn, make_plan, read_failure, steps_per_epoch_for, validation_dataset,
                                  validation_input)
from tfdist.data.stream import DEFAULT_SHUFFLE_BUFFER, StreamSource
from tfdist.data.user_input import WorkerInput
from tfdist.data.user_pipeline import UserPipeline, WorkerPipeline

__all__ = [
    "ArraySource",
    "BatchSizes",
    "ClassWeights",
    "DataPlan",
    "DEFAULT_PER_REPLICA_BATCH",
    "DEFAULT_SHUFFLE_BUFFER",
    "ImageFolderSource",
    "IndexedSource",
    "Layout",
    "MAX_EMBEDDED_BYTES",
    "PyDatasetSource",
    "StreamSource",
    "TFRecordSource",
    "UserPipeline",
    "WorkerInput",
    "WorkerPipeline",
    "as_source",
    "check_labelled",
    "check_same_classes",
    "check_validation_split",
    "inputs_of",
    "dataset_fn",
    "load",
    "load_digits",
    "load_npz",
    "load_to_evaluate",
    "load_to_predict",
    "make_plan",
    "num_classes",
    "read_failure",
    "steps_per_epoch_for",
    "unlabelled",
    "validation_dataset",
    "validation_input",
    "with_labels",
]
