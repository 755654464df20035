"""Private parts of TensorFlow that tfdist reaches: asynchronous checkpoints, restores, kernels, readers.

Checked on TensorFlow 2.17.1 and 2.21.0. TensorFlow is imported inside the functions.
"""

from __future__ import annotations

from typing import Any

from tfdist._compat import missing, private, require

# The attribute of a tf.train.Checkpoint that holds its AsyncCheckpointHelper (None before the first async save).
_ASYNC = "_async_checkpointer_impl"


def _async_helper(checkpoint: Any, entry: str) -> Any:
    """The ``AsyncCheckpointHelper`` of ``checkpoint``, or None before its first asynchronous save."""
    return private(checkpoint, _ASYNC, entry)


def take_async_error(checkpoint: Any) -> BaseException | None:
    """The error TensorFlow's background writer kept for the next save of ``checkpoint``, removed
    so that it is reported once; None when the last writes succeeded.

    Reaches ``Checkpoint._async_checkpointer_impl._async_error``. TensorFlow's public ``sync()``
    raises that error, but also waits for the write: tfdist must read it without waiting.
    """
    helper = _async_helper(checkpoint, "tensorflow.take_async_error")
    if helper is None:
        return None
    error = private(helper, "_async_error", "tensorflow.take_async_error")
    if error is not None:
        helper._async_error = None
    return error


def async_copy_function(checkpoint: Any) -> Any:
    """The ``tf.function`` that copies ``checkpoint``'s variables to host memory before a
    background write, or None before its first asynchronous save.

    Reaches ``AsyncCheckpointHelper._copy_to_cpu``; no public API names it. tfdist silences its
    retracing warning: each ``fit`` has its own writer, whose copy is traced once.
    """
    helper = _async_helper(checkpoint, "tensorflow.async_copy_function")
    return None if helper is None else private(helper, "_copy_to_cpu", "tensorflow.async_copy_function")


def end_async_writer(checkpoint: Any) -> None:
    """Ends TensorFlow's background writer thread of ``checkpoint``, after its last write.

    Reaches ``AsyncCheckpointHelper._join_async_save_thread`` and ``_async_save_thread``, and
    clears ``Checkpoint._async_checkpointer_impl``. TensorFlow ends the thread only at exit,
    and ``atexit`` keeps the helper, the model and its host copies alive until then. A later
    save on ``checkpoint`` starts a new writer.
    """
    import atexit

    entry = "tensorflow.end_async_writer"
    helper = _async_helper(checkpoint, entry)
    if helper is None:
        return
    join = private(helper, "_join_async_save_thread", entry)
    atexit.unregister(join)
    if private(helper, "_async_save_thread", entry) is not None:
        join()  # the last save was waited for by sync(): this only ends the idle thread
    setattr(checkpoint, _ASYNC, None)


def expect_partial_after(error: BaseException) -> None:
    """Marks the restore that raised ``error`` as partial on purpose, as ``status.expect_partial()``
    would: no page of "unrestored values" warnings when its coordinator is collected.

    Reaches the ``_CheckpointRestoreCoordinator`` in the locals of the frames ``error`` passed
    through (recognised by its ``expect_partial_attr``). A restore that raises returns no status,
    so no public API can mark it. Finding no coordinator changes nothing but the warnings.
    """
    traceback = error.__traceback__
    while traceback is not None:
        for value in list(traceback.tb_frame.f_locals.values()):
            if hasattr(value, "expect_partial_attr"):
                value.expect_partial = True
        traceback = traceback.tb_next


def omit_retracing_warning(function: Any) -> Any:
    """``function``, a ``tf.function``, without TensorFlow's "excessive retracing" warning.

    Sets ``Function._omit_frequent_tracing_warning``, the flag TensorFlow's own library code uses.
    TensorFlow counts traces by the code, not the object: tfdist's functions, made once per
    ``fit``, were otherwise reported as a retracing loop in a notebook's later fits.
    """
    require(function, "_omit_frequent_tracing_warning", "tensorflow.omit_retracing_warning")
    function._omit_frequent_tracing_warning = True
    return function


def nccl_kernels_registered() -> bool:
    """Whether this TensorFlow build has a kernel for ``NcclAllReduce``; starts no runtime.

    Reaches ``tensorflow.python.framework.kernels``: no public API lists registered kernels.
    When the lookup itself fails, it answers True: NCCL is then tried.
    """
    try:
        from tensorflow.python.framework import kernels
    except ImportError:
        raise missing("tensorflow.nccl_kernels_registered", "tensorflow.python.framework.kernels") from None
    try:
        return bool(kernels.get_registered_kernels_for_op("NcclAllReduce").kernel)
    except Exception:  # noqa: BLE001 -- the registry could not answer: let NCCL be tried
        return True


def slurm_resolver_module() -> Any:
    """TensorFlow's Slurm cluster resolver module (``expand_hostlist``, ``expand_tasks_per_node``).

    Reaches ``tensorflow.python.distribute.cluster_resolver.slurm_cluster_resolver``: its
    public class reads ``SLURM_*`` itself and needs ``scontrol``; tfdist needs the parsers.
    """
    try:
        from tensorflow.python.distribute.cluster_resolver import slurm_cluster_resolver
    except ImportError:
        raise missing("tensorflow.slurm_resolver_module",
                      "tensorflow.python.distribute.cluster_resolver.slurm_cluster_resolver") from None
    return slurm_cluster_resolver


def tfrecord_offset_reader(read_buffer: int) -> Any:
    """A dataset class reading TFRecords from a byte offset, or None if this TensorFlow lacks the op.

    Reaches ``gen_dataset_ops.tf_record_dataset_v2`` and ``dataset_ops.DatasetSource``. The op
    takes ``byte_offsets``; the public ``TFRecordDataset`` does not expose them. Its kernel
    cannot serialize itself (a top-level instance breaks the graph rewrites at iterator creation:
    "3 inputs specified of 4"), so make it only inside ``interleave`` functions. Without the op,
    callers skip records from the file's start instead.
    """
    try:
        from tensorflow.python.data.ops import dataset_ops
        from tensorflow.python.framework import tensor_spec
        from tensorflow.python.ops import gen_dataset_ops
    except ImportError:  # pragma: no cover
        return None
    if not hasattr(gen_dataset_ops, "tf_record_dataset_v2"):  # pragma: no cover
        return None
    import tensorflow as tf

    class TFRecordsAt(dataset_ops.DatasetSource):
        def __init__(self, filename, byte_offset):
            variant = gen_dataset_ops.tf_record_dataset_v2(
                tf.reshape(filename, [1]), "", tf.constant(read_buffer, tf.int64),
                tf.reshape(tf.cast(byte_offset, tf.int64), [1]),
            )
            dataset_ops.DatasetSource.__init__(self, variant)  # not super(): AutoGraph may convert this

        @property
        def element_spec(self):
            return tensor_spec.TensorSpec([], tf.string)

    return TFRecordsAt
