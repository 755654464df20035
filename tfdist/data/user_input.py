"""One worker's input from a user's own pipeline: a plain iterator whose position is saved beside every checkpoint.

Every worker writes its own position (``checkpoint.layout.input_state_dir``) at the step of
every checkpoint, before the checkpoint: a checkpoint on disk has its positions. A resume
restores the position of its step; no element is read again. Where none fits (the worker
count changed under ``file`` or ``fn`` mode, or the pipeline's state cannot be saved), the
resume skips the steps before it, reading them again, and a warning says so. A restored
iterator runs the pipeline it was saved from (TensorFlow keeps the dataset's graph with it).
"""

from __future__ import annotations

import logging
import uuid

from tfdist import storage
from tfdist.checkpoint import layout
from tfdist.data.user_pipeline import FILE, FIX_HIDDEN, FN, SLICE, WorkerPipeline, part_of
from tfdist.errors import describe

log = logging.getLogger("tfdist")

_WHAT_CHANGES = {FILE: "each worker now reads other files", FN: "each worker now reads another shard of dataset_fn",
                 SLICE: "each worker now reads the whole pipeline, which the saved positions do not fit"}
"""What a worker reads differently, by its mode, when no saved position fits a new worker count."""


class WorkerInput:
    """What tfdist's Keras 3 loop reads from a user pipeline on this worker.

    ``iter()`` gives the object itself. ``next()``, traced inside the loop's train function,
    reads one step's elements from the worker's iterator and gives each local replica its part.

    Args:
      pipeline: this worker's ``WorkerPipeline``.
      strategy: the run's strategy.
      directory: the run's checkpoint directory (shared by the workers), or None.
      start_step: the global step the run starts from.
      keep: checkpoints kept; positions are kept for one more.
    """

    def __init__(self, pipeline: WorkerPipeline, strategy, *, directory: str | None, start_step: int, keep: int = 3):
        self.pipeline = pipeline
        self._strategy = strategy
        self._keep = keep
        self.state_dir = (layout.input_state_dir(directory, mode=pipeline.mode, workers=pipeline.workers,
                                                 worker=pipeline.worker) if directory is not None else None)
        reason = pipeline.source.hidden_state()
        self.resumable = reason is None
        if reason is not None:
            log.warning("the pipeline uses %s, whose state TensorFlow cannot save: a resumed run skips the steps before "
                        "its position (reading them again) and the Python state starts anew, so it may not read what "
                        "the interrupted run would have. %s", reason, FIX_HIDDEN)
        self.restored_from: str | None = None
        self.iterator = self._iterator(directory, start_step)

    # --- reading -------------------------------------------------------------------------------
    def __iter__(self):
        return self

    def __next__(self):
        local = self.pipeline.local_replicas
        if self.pipeline.per_step == 1:
            batch = self.pipeline.slice_of(self.iterator.get_next())
            parts = [batch] if local == 1 else [part_of(batch, i, local) for i in range(local)]
        else:
            parts = [self.iterator.get_next() for _ in range(local)]
        if local == 1:
            return parts[0]
        first = self.pipeline.worker * local
        return self._strategy.experimental_distribute_values_from_function(
            lambda context: parts[context.replica_id_in_sync_group - first])

    # --- position ------------------------------------------------------------------------------
    def _iterator(self, directory: str | None, start_step: int):
        import tensorflow as tf

        pipeline = self.pipeline
        pipeline.rewind()
        if start_step == 0:
            return pipeline.iterator
        if self.resumable and directory is not None:
            for prefix in self._positions(directory, start_step):
                try:
                    tf.train.Checkpoint(it=pipeline.iterator).read(prefix).assert_consumed()
                except (AssertionError, ValueError, tf.errors.OpError) as e:
                    log.warning("the pipeline position %s cannot be restored (%s)", prefix, describe(e))
                    pipeline.rewind()
                    continue
                self.restored_from = prefix
                log.info("the pipeline resumes at step %d from its saved position %s", start_step, prefix)
                return pipeline.iterator
        log.warning("the pipeline skips the %d step(s) before step %d, reading them again (time grows with the "
                    "position)", start_step, start_step)
        return iter(pipeline.dataset.skip(start_step * pipeline.per_step))

    def _positions(self, directory: str, step: int) -> list[str]:
        """The saved positions this worker may restore at ``step``, best first; warns when none fits."""
        own = layout.input_state_prefix(self.state_dir, step)
        if step in layout.input_state_steps(self.state_dir):
            return [own]
        others = [d for d in layout.input_state_dirs(directory) if step in layout.input_state_steps(d)]
        owners = {d: layout.input_state_owner(d) for d in others}
        if self.pipeline.mode == SLICE:  # every worker's position is the whole pipeline's
            same = [d for d in others if owners[d] is not None and owners[d][0] == SLICE]
            if same:
                log.info("the pipeline was read by %d worker(s) at step %d, now by %d: each keeps its slice of the "
                         "same global batches", owners[same[0]][1], step, self.pipeline.workers)
                return [layout.input_state_prefix(d, step) for d in same]
        if others:
            was = sorted({f"{o[1]} worker(s) in {o[0]} mode" for o in owners.values() if o is not None})
            log.warning(
                "the pipeline was saved at step %d by %s, and this run has %d worker(s) in %s mode: %s, so the "
                "steps from here see other examples than the interrupted run would have", step, ", ".join(was),
                self.pipeline.workers, self.pipeline.mode, _WHAT_CHANGES[self.pipeline.mode])
        else:
            log.warning("no saved pipeline position for step %d in %s", step, directory)
        return []

    def save(self, step: int) -> None:
        """Writes this worker's position after ``step`` steps, atomically (the index file last); every worker calls it."""
        import tensorflow as tf

        if not self.resumable or self.state_dir is None:
            return
        prefix = layout.input_state_prefix(self.state_dir, step)
        temporary = f"{prefix}.tmp-{uuid.uuid4().hex[:8]}"
        storage.makedirs(self.state_dir)
        try:
            tf.train.Checkpoint(it=self.iterator).write(temporary)
        except (tf.errors.UnimplementedError, tf.errors.FailedPreconditionError, tf.errors.InvalidArgumentError) as e:
            for path in layout.checkpoint_files(temporary):
                storage.remove(path)
            self.resumable = False
            log.warning("the pipeline's position cannot be saved (%s): a resumed run skips the steps before its "
                        "position, reading them again. %s", describe(e), FIX_HIDDEN)
            return
        for path in layout.checkpoint_files(temporary):  # data files first, the index last
            storage.rename(path, prefix + path[len(temporary):])
        self._prune(step)

    def _prune(self, step: int) -> None:
        """Removes positions older than the ``keep + 1`` newest."""
        steps = [s for s in layout.input_state_steps(self.state_dir) if s <= step]
        for old in steps[: max(0, len(steps) - self._keep - 1)]:
            for path in layout.checkpoint_files(layout.input_state_prefix(self.state_dir, old)):
                storage.remove(path)

    def state_bytes(self, step: int) -> int:
        """Bytes of the position saved at ``step`` (what the pipeline's state adds to a checkpoint)."""
        return sum(storage.size(p) for p in layout.checkpoint_files(layout.input_state_prefix(self.state_dir, step)))


def replaying_input(pipeline: WorkerPipeline, strategy, *, start_step: int):
    """The worker's pipeline as a distributed dataset for a ``fit`` that reads datasets only (tf_keras').

    Such a ``fit`` reads ahead of its steps, so no position is saved: a resume skips the steps
    before it, reading them again, and a warning says so. Each local replica gets its part of
    every worker batch, as ``WorkerInput`` gives it."""
    import tensorflow as tf

    log.warning("tf_keras' fit reads a user pipeline ahead of its steps, so its position is not saved: a resumed run "
                "skips the steps before its position, reading them again (time grows with the position). Fix: build "
                "the model with Keras 3 (import keras) for an exact resume in constant time")
    local = pipeline.local_replicas

    def make(context=None):
        dataset = pipeline.dataset.skip(start_step * pipeline.per_step)
        if pipeline.mode == SLICE and pipeline.workers > 1:
            dataset = dataset.map(tf.autograph.experimental.do_not_convert(lambda *element: pipeline.slice_of(
                element if len(element) > 1 else element[0])))
        if pipeline.per_step == 1 and local > 1:  # one element a replica, each its part of the worker batch
            parts = tf.autograph.experimental.do_not_convert(
                lambda *element: tf.data.Dataset.range(local).map(
                    lambda i: part_of(element if len(element) > 1 else element[0], i, local)))
            dataset = dataset.flat_map(parts)
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        return dataset.with_options(options)

    return strategy.distribute_datasets_from_function(make)


__all__ = ["WorkerInput", "replaying_input"]
