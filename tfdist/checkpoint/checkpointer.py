"""Saving and restoring one run's state: asynchronous atomic saves, compatibility, restore and fallback.

A checkpoint of global step ``t`` holds the model weights, the optimizer (slots and
iterations), the progress counters (global step, epoch, step in epoch; the data position
follows from them and the seed), the state of every random layer's generator, the epoch's
metric accumulators, and each replica's own value of every on-read variable (see
``replicas``). Its metadata records the run it belongs to (``layout.RunMetadata``) and the
history so far.

Atomicity comes from ``tf.train.CheckpointManager``: shards are written to a temporary
directory and merged, and the ``checkpoint`` state file, which names the latest
checkpoint, is rewritten (temp file + rename) only after the data is complete.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any, Mapping, Sequence

from tfdist import _checks, _logs, _signals, storage
from tfdist._compat import tensorflow as tf_compat
from tfdist._compat import tracking
from tfdist.checkpoint import layout, ownership
from tfdist.checkpoint.replicas import ReplicaValues, aggregate_saved
from tfdist.errors import (
    CheckpointError, CheckpointIOError, CheckpointMismatchError, CheckpointTakenOverError, describe,
)

log = logging.getLogger("tfdist")


@dataclasses.dataclass(frozen=True)
class CheckpointOptions:
    """Where and when [`fit`][tfdist.fit] saves, what it keeps, and how it resumes.

    Pass it as ``fit(..., checkpoint_dir=DIR, checkpoint_options=tfdist.CheckpointOptions(...))``.
    ``fit``'s own ``checkpoint_dir`` and ``save_every_steps`` fill the fields left unset here.
    The options check their values when they are made.

    Attributes:
      directory: The directory of the checkpoints: a local path or a URL of any TensorFlow
        filesystem, such as ``gs://bucket/run``. Every worker must read it. Defaults to None:
        ``fit``'s ``checkpoint_dir``.
      save_every_steps: Also save every N global steps. Defaults to None: ``fit``'s
        ``save_every_steps``, else at epoch ends only.
      save_every_seconds: Also save when this many seconds have passed since the last save.
        Defaults to None.
      keep: How many recent checkpoints to keep. Defaults to 3.
      keep_every_hours: Also keep one checkpoint every this many hours. Defaults to None.
      async_save: Write checkpoints in the background. Training waits only while the variables
        are copied. Defaults to True.
      resume: Continue from the latest checkpoint in ``directory``. Defaults to True. False
        refuses a directory that already holds checkpoints.
      allow_changes: Resume a checkpoint whose batch size, model, data, seed, class weights or
        precision differ. Defaults to False: such a checkpoint is refused.

    Raises:
      CheckpointError: A value is of the wrong type or out of range.

    Examples:
        ```python
        import tfdist

        options = tfdist.CheckpointOptions(keep=5, save_every_seconds=600, allow_changes=True)
        print(options.keep, options.async_save)   # 5 True
        ```
    """

    directory: str | None = None
    save_every_steps: int | None = None
    save_every_seconds: float | None = None
    keep: int = 3
    keep_every_hours: float | None = None
    async_save: bool = True
    resume: bool = True
    allow_changes: bool = False

    def __post_init__(self):
        if self.directory is not None:
            if not isinstance(self.directory, (str, os.PathLike)) or not str(self.directory):
                raise CheckpointError(f"Invalid `checkpoint_dir`; received checkpoint_dir={self.directory!r}. "
                                      "Fix: pass a directory path.")
            object.__setattr__(self, "directory", os.fspath(self.directory))
        _checks.check_optional_int("save_every_steps", self.save_every_steps, error=CheckpointError)
        _checks.check_number("save_every_seconds", self.save_every_seconds, error=CheckpointError, unit="seconds",
                             allow_none=True)
        _checks.check_int("keep", self.keep, error=CheckpointError, fix="use a positive number of checkpoints.")
        _checks.check_number("keep_every_hours", self.keep_every_hours, error=CheckpointError, unit="hours",
                             allow_none=True)
        for flag in ("async_save", "resume", "allow_changes"):
            if not isinstance(getattr(self, flag), bool):
                raise CheckpointError(f"Invalid `{flag}`; received {flag}={getattr(self, flag)!r}. "
                                      "Fix: pass True or False.")


class _Counters:
    """The step counters that are part of every checkpoint."""

    def __init__(self):
        import tensorflow as tf

        self.module = tf.Module(name=layout.PROGRESS)
        for name in layout.COUNTERS:
            setattr(self.module, name, tf.Variable(0, dtype=tf.int64, trainable=False, name=name))

    def set(self, *, global_step: int, epoch: int, step_in_epoch: int) -> None:
        self.module.global_step.assign(global_step)
        self.module.epoch.assign(epoch)
        self.module.step_in_epoch.assign(step_in_epoch)

    @property
    def global_step(self) -> int:
        return int(self.module.global_step.numpy())


@dataclasses.dataclass(frozen=True)
class ResumePoint:
    """The checkpoint a run resumed from: its prefix, its global step and its metadata."""

    path: str
    global_step: int
    metadata: layout.Metadata


def refuse_to_start_over(directory: str, *, what: str = "resume=False") -> None:
    """Raises CheckpointError if ``directory`` already holds checkpoints: a fresh run there
    would let the retention policy delete them."""
    paths = layout.checkpoint_paths(directory)
    if paths:
        raise CheckpointError(
            f"{what} was given but {directory!r} holds {len(paths)} checkpoint(s) of an earlier run (latest "
            f"{storage.basename(paths[-1])}); received {what}. Fix: use another checkpoint directory, or resume; "
            "tfdist never overwrites or deletes a run's checkpoints to start over."
        )


def refuse_a_checkpoint_prefix(directory: str, *, what: str = "checkpoint_dir") -> None:
    """Raises CheckpointError if ``directory`` names a checkpoint (``DIR/ckpt-40``) rather than
    the directory of the run: a fresh run would start there from step 0, without a word. Call
    it before anything creates ``directory``."""
    if storage.exists(layout.index_path(directory)) and not storage.isdir(directory):
        raise CheckpointError(
            f"{what} names a checkpoint, not a directory; received {what}={directory!r} "
            f"({storage.basename(directory)}.index is there). Fix: pass its directory "
            f"({storage.dirname(directory)}); to resume from this checkpoint rather than the latest, name it in the "
            "state file `checkpoint` there (see docs/ckpt.md, 'Roll back to an earlier checkpoint')."
        )


@dataclasses.dataclass(frozen=True)
class TrainingState:
    """What a checkpoint holds besides the progress counters, as the model's Keras adapter
    (``training.keras2`` / ``training.keras3``) names it.

    Attributes:
      model, optimizer: saved as TensorFlow tracks them.
      random_state: the random layers' state (tf.random.Generator objects, or seed variables).
      metrics: the epoch's metric accumulators (metric objects, or their variables).
      replica_state: distributed variables whose replicas hold their own values (e.g.
        BatchNormalization's moving statistics), metrics excluded; put back at restore.
      replica_metrics: the metrics' distributed variables; put back when the resumed epoch starts.
      global_random_state: random state outside the model that its layers draw from (Keras 3's
        global seed generator: ``keras.random`` calls without a seed), restored when the
        checkpoint has it (a checkpoint of an earlier tfdist does not, and still resumes).
      one_replica_saved: the variables of ``replica_state`` as they are under any strategy (in
        its order), if a checkpoint saves each as one replica's value rather than as the
        aggregate (Keras 3's BatchNormalization statistics): a run that cannot put each
        replica's own value back (another replica count) sets them to the aggregate.
    """

    model: Any
    optimizer: Any
    random_state: Mapping[str, Any]
    metrics: Mapping[str, Any]
    replica_state: Sequence[Any] = ()
    replica_metrics: Sequence[Any] = ()
    one_replica_saved: Sequence[Any] = ()
    global_random_state: Mapping[str, Any] = dataclasses.field(default_factory=dict)


class Checkpointer:
    """Saves and restores one run's state. Every worker of a cluster must create one and call
    ``save`` at the same steps (a save may be a collective); only the chief's checkpoints are kept."""

    def __init__(
        self,
        *,
        options: CheckpointOptions,
        state: TrainingState,
        strategy,
        is_chief: bool,
        task_name: str,
        run_metadata: layout.RunMetadata,
        callback_arrays: Any = None,
    ):
        import tensorflow as tf

        self.options = options
        self.strategy = strategy
        self.counters = _Counters()
        self.is_chief = is_chief
        self.run_metadata = run_metadata
        self._metrics = tf.Module(name=layout.METRICS)
        for key, metric in state.metrics.items():
            setattr(self._metrics, key, metric)
        rng = tf.Module(name=layout.RNG)
        for key, generator in state.random_state.items():
            setattr(rng, f"g_{key}", generator)
        # Each replica's own values: the model's and optimizer's (BatchNormalization's moving
        # statistics...) are put back at restore, the metrics' when the loop starts the resumed
        # epoch (it resets them first).
        self._replica_state = ReplicaValues.of(strategy, state.replica_state, name=layout.REPLICA_STATE)
        self._replica_metrics = ReplicaValues.of(strategy, state.replica_metrics, name=layout.REPLICA_METRICS)
        self._one_replica_saved = list(state.one_replica_saved)
        children = {
            layout.MODEL: tracking.model_state(state.model), layout.OPTIMIZER: state.optimizer,
            layout.PROGRESS: self.counters.module, layout.RNG: rng, layout.METRICS: self._metrics,
        }
        # The per-replica values and the callbacks' arrays (training.callback_state) are saved with
        # the rest but restored on their own: a checkpoint without them (of another replica count,
        # or the callbacks changed) still resumes.
        extra = {group.name: group.module for group in self._replica_groups}
        self._global_rng = None
        if state.global_random_state:
            self._global_rng = tf.Module(name=layout.RNG_GLOBAL)
            for key, variable in state.global_random_state.items():
                setattr(self._global_rng, f"g_{key}", variable)
            extra[layout.RNG_GLOBAL] = self._global_rng
        self._callback_arrays = callback_arrays
        self.callback_arrays_restored = False
        self.root = tf.train.Checkpoint(**children, **extra,
                                        **({layout.CALLBACKS: callback_arrays} if callback_arrays else {}))
        self._restore_root = tf.train.Checkpoint(**children)
        self._metrics_root = tf.train.Checkpoint(**{layout.METRICS: self._metrics})
        refuse_a_checkpoint_prefix(options.directory)
        if not options.resume:  # every worker, so that none waits in a collective for a chief that refused
            refuse_to_start_over(options.directory)
        self._created_at = time.time()  # what the checkpoint directory holds from before is not this run's writing
        self._rolled_back = False  # the state file named an earlier checkpoint than the last it listed
        if is_chief:
            self.directory = options.directory
            storage.check_writable(self.directory)
            self._set_aside_unreadable_state()
            if options.resume:
                self._roll_back()
                self._forget_missing()
        else:  # tf.distribute: non-chief workers save too, to a local place that is thrown away
            self.directory = storage.task_scratch_dir(purpose="ckpt", task_name=task_name,
                                                      key=storage.absolute(options.directory))
        self.manager = tf.train.CheckpointManager(
            self.root,
            self.directory,
            max_to_keep=options.keep if is_chief else 1,
            keep_checkpoint_every_n_hours=options.keep_every_hours if is_chief else None,
            checkpoint_name=layout.CHECKPOINT_NAME,
        )
        # The callback runs when a save's files are complete (in the writer thread when async),
        # before the manager lists the checkpoint and deletes the oldest one.
        self._save_options = tf.train.CheckpointOptions(
            enable_async=options.async_save, experimental_write_callbacks=[self._written]
        )
        self.last_save_time = time.monotonic()
        self._save_started: float | None = None
        self.last_write_seconds: float | None = None
        """Seconds from the last ``save()`` call until its files were complete (not counting
        the deletion of checkpoints past ``keep``); ``last_written_at`` is that moment
        (``time.perf_counter()``)."""
        self.last_written_at: float | None = None
        self.last_saved_step: int | None = None
        self.resumed_from: ResumePoint | None = None
        self._writer: ownership.Writer | None = None  # the chief's claim on the directory, from restore()
        self._taken_over = False  # another run claimed the directory since: this one writes nothing more
        self._in_flight: int | None = None  # the step of the last save started, until sync() saw it end
        self._written_step: int | None = None  # the step of the last save whose files were completed
        # A save a kill interrupted before the state file listed it, found as the run starts:
        # the one checkpoint this run may save over (``_quarantine_existing``).
        self._unconfirmed = self._unconfirmed_own_save() if is_chief else None
        self.before_save: list = []
        """Functions of the global step called by every worker before each save is started
        (``data.user_input``: each worker's pipeline position, written beside the checkpoint)."""

    # --- writing -------------------------------------------------------------------------
    def _written(self, save_path: str) -> None:
        if self._save_started is not None:
            self.last_written_at = time.perf_counter()
            self.last_write_seconds = self.last_written_at - self._save_started
            log.debug("%s written in %.3f s", save_path, self.last_write_seconds)
        step = layout.step_of(save_path)
        if self.is_chief and self._writer is not None:  # before the manager lists it and deletes old ones
            try:
                self._check_writer(step)
            except CheckpointTakenOverError:
                # A save in flight when another run took over (this run was frozen): its files go, unless
                # that run lists the step; raising here skips the manager's listing and deletions.
                listed = {storage.basename(p) for p in layout.checkpoint_paths(self.directory, listed_only=True)}
                if storage.basename(save_path) not in listed:
                    for path in layout.checkpoint_files(save_path):
                        storage.remove(path)
                raise
        self._written_step = step

    def sync(self) -> None:
        """Waits for a background save; raises CheckpointError if it failed.

        TensorFlow's ``Checkpoint.sync`` waits but does not raise what failed in its writer
        thread: it keeps the error for the next save, or prints it at exit and lets the process
        end with 0 -- a run whose last save failed would report success. So the failure is
        taken here: TensorFlow's kept error, else the absence of ``_written``'s confirmation."""
        step, self._in_flight = self._in_flight, None
        try:
            self.root.sync()
            failure = tf_compat.take_async_error(self.root)
        except Exception as e:  # noqa: BLE001 -- reported below, whatever it is
            failure = e
        if failure is None and step is not None and self._written_step != step:
            failure = RuntimeError(f"the background write of step {step} ended without completing its files")
        if isinstance(failure, CheckpointTakenOverError):  # raised by _written in the writer thread
            raise failure
        if failure is not None:
            if self.is_chief and self._writer is not None and step is not None:
                # A run frozen mid-save wakes up after another took over, which removed the save's
                # temporary files as an interrupted write's: the takeover is what to say.
                self._check_writer(step)
            raise _save_failed(self.options.directory, failure) from failure

    def save(self, *, global_step: int, epoch: int, step_in_epoch: int, history: list[dict], complete: bool = False,
             callbacks: Mapping[str, Any] | None = None) -> str | None:
        """Saves the state after ``global_step`` steps (asynchronously unless disabled).
        Every worker must call it at the same step. ``callbacks``: the callbacks' state for the metadata."""
        if self.last_saved_step == global_step and not complete:
            return None
        self.sync()  # one save in flight at a time; surfaces the previous save's error
        self._check_writer(global_step)
        self.counters.set(global_step=global_step, epoch=epoch, step_in_epoch=step_in_epoch)
        for group in self._replica_groups:
            group.capture()
        metadata = layout.Metadata.of(self.run_metadata, global_step=global_step, epoch=epoch,
                                      step_in_epoch=step_in_epoch, complete=complete, history=history,
                                      callbacks=callbacks)
        if self.is_chief:
            self._quarantine_existing(global_step)
        for write in self.before_save:
            write(global_step)
        self._save_started, self.last_write_seconds, self.last_written_at = time.perf_counter(), None, None
        self._in_flight = global_step
        try:
            path = self.manager.save(checkpoint_number=global_step, options=self._save_options)
        except CheckpointTakenOverError:  # raised by _written (synchronous saves)
            self._in_flight = None
            raise
        except Exception as e:
            self._in_flight = None
            if _is_storage_error(e):
                raise _save_failed(self.directory, e) from e
            raise _state_not_saved(self.directory, e, async_save=self.options.async_save) from e
        copy = tf_compat.async_copy_function(self.root)
        if copy is not None:  # each fit has its own writer, whose copy is traced once
            _logs.without_retracing_warning(copy)
        if self.is_chief:
            try:
                layout.write_metadata(path, metadata)
            except OSError as e:  # e.g. the filesystem turned read-only, or filled up, meanwhile
                raise _save_failed(self.directory, e) from e
            self._remove_orphan_metadata(keep=path)
        self.last_save_time = time.monotonic()
        self.last_saved_step = global_step
        return path

    def mark_complete(self, *, history: list[dict]) -> None:
        """Marks the last checkpoint saved as the end of the run (a callback stopped it early):
        its metadata is rewritten, its tensors are left as they are. Every worker may call it;
        only the chief writes."""
        if self.last_saved_step is None or not self.is_chief:
            return
        self.sync()
        self._check_writer(self.last_saved_step)
        prefix = layout.prefix_for(self.directory, self.last_saved_step)
        saved = layout.read_metadata(prefix)
        if saved is not None:
            try:
                layout.write_metadata(prefix, layout.Metadata.of(
                    self.run_metadata, global_step=saved.global_step, epoch=saved.epoch,
                    step_in_epoch=saved.step_in_epoch, complete=True, history=history, callbacks=saved.callbacks,
                ))
            except OSError as e:
                raise _save_failed(self.directory, e) from e

    def _check_writer(self, step: int) -> None:
        """The chief stops before writing ``step`` if another run has claimed the directory since it did."""
        if not self.is_chief:
            return
        if self._writer is None:
            self._writer = ownership.claim(self.directory)
            return
        try:
            ownership.check(self.directory, self._writer, step=step)
        except CheckpointTakenOverError:
            self._taken_over = True
            raise

    def _quarantine_existing(self, step: int) -> None:
        """Moves aside an existing checkpoint of ``step`` (e.g. a corrupt one resume skipped)
        instead of overwriting it -- unless it is this run's own save that was never confirmed."""
        prefix = layout.prefix_for(self.directory, step)
        files = layout.checkpoint_files(prefix)
        if not files:
            return
        paths = [p for p in files + [layout.metadata_path(prefix)] if storage.exists(p)]
        if self._unconfirmed is not None and storage.basename(prefix) == storage.basename(self._unconfirmed):
            for path in paths:
                storage.remove(path)
            log.info("removed %s: this run's save of that step, never listed (the process ended while it was being "
                     "written), is being made again", storage.basename(prefix))
            return
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for path in paths:
            storage.rename(path, layout.replaced_name(path, stamp))
        log.warning("an earlier %s was kept as %s.*.replaced-%s before saving the new one",
                    storage.basename(prefix), storage.basename(prefix), stamp)

    def _unconfirmed_own_save(self) -> str | None:
        """The save of this run that a kill interrupted before the state file listed it, as the
        run starts: the only checkpoint later than every one the state file lists, recorded by
        the same run (its metadata's must-match fields and Keras are this run's). Resume goes on
        from an earlier checkpoint, so nothing depends on it, and keeping a copy of it at every
        such kill would fill the disk of a job preempted often: the run saves over it. A listed
        one (corrupt, skipped by resume), one of another run, one of several past the listed
        ones, any past a state file rolled back by hand (``_roll_back``) or after a run whose
        record says it ended cleanly (no save of it was cut short: an operator wrote the state
        file), or any without a state file that lists checkpoints is set aside instead. None if
        there is none."""
        listed = layout.checkpoint_paths(self.directory, listed_only=True)
        steps = [layout.step_of(p) for p in listed]
        if not steps or None in steps or self._rolled_back:
            return None
        writer = ownership.current(self.directory)
        if writer is not None and writer.ended_at is not None:  # the last run ended: no save of it was cut short
            return None
        # With its index, or without (killed while TensorFlow renamed its data into place, before
        # the index): its metadata is written as soon as the save starts.
        saves = [layout.strip_file_suffix(meta) for meta in layout.metadata_files(self.directory)]
        later = [p for p in saves if (layout.step_of(p) or 0) > max(steps)]
        if len(later) != 1:  # one save is in flight at a time: a kill leaves one
            return None
        saved = layout.read_metadata(later[0])
        if saved is None or self.run_metadata.differences(saved) or self.run_metadata.keras_difference(saved):
            return None
        return later[0]

    def _roll_back(self) -> None:
        """A state file edited so that ``model_checkpoint_path`` names an earlier checkpoint than
        the last of its list rolls the run back to it: the state file is written again to list the
        checkpoints up to that one (as TensorFlow's manager would have), before the manager reads it,
        so that its retention never deletes the later ones; they stay on disk, and a save of one of
        their steps moves the old files aside (``*.replaced-<stamp>``)."""
        kept = layout.unlisted_latest(self.directory)
        if kept is not None:
            name = storage.basename(kept)
            raise CheckpointError(
                f"the state file of {self.directory!r} names {name} as its latest checkpoint, but does not list it "
                f"(keep_every_hours kept it; the manager stops listing those); received model_checkpoint_path {name}. "
                f"Fix: to go on from it, copy its files ({name}.*) into an empty directory and pass that as the "
                "checkpoint_dir (a run resumes from the checkpoints it finds there); or name one of the listed "
                "checkpoints. Nothing was changed."
            )
        later = layout.rolled_back(self.directory)
        self._rolled_back = bool(later)
        if not later:
            return
        paths = layout.checkpoint_paths(self.directory, listed_only=True)
        log.warning("the state file of %s names %s as its latest checkpoint, before %s: rolling the run back to it. "
                    "The later checkpoints stay on disk, unlisted; a save of one of their steps moves it aside "
                    "(*.replaced-<time>)", self.directory, storage.basename(paths[-1]),
                    ", ".join(storage.basename(p) for p in later))
        layout.write_state(self.directory, paths)

    def _forget_missing(self) -> None:
        """A state file that lists checkpoints whose files are gone (deleted by hand, e.g. to roll
        back) is written again without them, before the manager reads it: resume goes on from the
        newest listed one still there, as from a corrupt one. Listing none still there, it is
        moved aside, and the checkpoints found beside it are what resume reads."""
        listed = layout.checkpoint_paths(self.directory, listed_only=True)
        present = _present(listed)
        if len(present) == len(listed):
            return
        gone = ", ".join(storage.basename(p) for p in listed if p not in present)
        if present:
            log.warning("the state file of %s lists %s, whose files are gone: it now lists the checkpoints up to %s",
                        self.directory, gone, storage.basename(present[-1]))
            layout.write_state(self.directory, present)
            return
        log.warning("the state file of %s lists only checkpoints whose files are gone (%s): kept as %s",
                    self.directory, gone, self._set_aside_state())

    def _set_aside_unreadable_state(self) -> None:
        """Moves aside a state file that names no checkpoint (emptied, damaged, written over),
        which TensorFlow's manager cannot read; the checkpoints beside it are what resume reads."""
        state = layout.state_path(self.directory)
        if storage.exists(state) and not layout.checkpoint_paths(self.directory, listed_only=True):
            log.warning("the state file %s names no checkpoint (damaged or written over): kept as %s", state,
                        self._set_aside_state())

    def _set_aside_state(self) -> str:
        """Renames the state file to ``checkpoint.replaced-<stamp>``; returns that name."""
        state = layout.state_path(self.directory)
        aside = layout.replaced_name(state, time.strftime("%Y%m%d-%H%M%S"))
        storage.rename(state, aside)
        return storage.basename(aside)

    def _remove_orphan_metadata(self, *, keep: str) -> None:
        """Removes the metadata of checkpoints the manager deleted (``keep``: the save in flight)."""
        for meta in layout.metadata_files(self.directory):
            prefix = layout.strip_file_suffix(meta)
            if prefix != keep and not layout.checkpoint_files(prefix):
                storage.remove(meta)

    def _remove_interrupted_writes(self, listed: list[str]) -> None:
        """Removes what writes killed before this run began left in the checkpoint directory
        (``layout.interrupted_writes``: a save's ``ckpt-<step>_temp/``, as large as a checkpoint,
        and temporary files; the data and metadata of a checkpoint older than the ``listed`` ones
        whose deletion by the retention policy was killed after its index went). They are never
        a complete checkpoint, and nothing would ever remove them: a step saved again replaces
        its own, but saves every N seconds fall on other steps.
        What changed after this run began (another process may still be writing) is left."""
        from tfdist.planning.units import format_bytes

        removed, kept = [], []
        for path in layout.interrupted_writes(self.directory, listed=listed):
            is_dir = storage.isdir(path)
            changes = [storage.mtime(p) for p in [path] + (
                [storage.join(path, name) for name in storage.listdir(path)] if is_dir else [])]
            known = [t for t in changes if t is not None]
            if not known or max(known) >= self._created_at:
                kept.append(storage.basename(path))
                continue
            size = storage.size(path)
            if is_dir:
                storage.rmtree(path)
            else:
                storage.remove(path)
            removed.append(f"{storage.basename(path)}{'/' if is_dir else ''} ({format_bytes(size)})")
        if removed:
            log.info("removed what %d interrupted write(s) left in %s: %s", len(removed), self.directory,
                     ", ".join(removed))
        if kept:
            log.info("left %s in %s: changed since this run began (or of unknown age), it may be another "
                     "process's write in flight", ", ".join(kept), self.directory)

    def close(self) -> None:
        """Waits for the last save; removes a non-chief worker's throw-away directory, or marks
        the chief's record as the directory's writer as ended (``ownership``)."""
        if self._in_flight is not None:
            _signals.hold("final_save")
        try:
            self.sync()
        finally:
            tf_compat.end_async_writer(self.root)
            if not self.is_chief:
                storage.rmtree(self.directory)
            elif self._writer is not None:
                ownership.release(self.directory, self._writer)
                self._writer = None
        if self.is_chief and self.last_saved_step is not None and not self._taken_over:
            self._remove_orphan_metadata(keep="")

    # --- reading -------------------------------------------------------------------------
    def _check_compatible(self, path: str, metadata: layout.Metadata | None) -> None:
        if metadata is None:
            raise CheckpointMismatchError(
                f"{path!r} has no tfdist metadata ({storage.basename(layout.metadata_path(path))}); received a "
                "checkpoint tfdist did not write. Fix: use an empty checkpoint_dir; the directory was left untouched."
            )
        keras = self.run_metadata.keras_difference(metadata)
        if keras:  # another object graph: no checkpoint of the directory can be restored
            saved = metadata.raw["keras"]
            raise CheckpointMismatchError(
                f"the checkpoint in {self.options.directory!r} was written by another Keras ({keras}); tf_keras and "
                f"Keras 3 save different objects. Fix: train with {saved} ({'--keras 3' if saved == 'keras' else '--keras 2'}"
                " on the command line), or use another checkpoint_dir; the checkpoints were left untouched."
            )
        precision = self.run_metadata.precision_difference(metadata)
        if precision and "mixed_float16" in precision and self.run_metadata.keras == "keras":
            raise CheckpointMismatchError(  # Keras 3's optimizer then holds other variables: nothing restores
                f"the checkpoint in {self.options.directory!r} was written in {precision[0]}, this run is in "
                f"{precision[1]}; under Keras 3 mixed_float16's optimizer holds a loss scale that the other does not, "
                f"so no checkpoint can move between them. Fix: {layout.precision_fix(precision[0])}, or use another "
                "checkpoint_dir; the checkpoints were left untouched."
            )
        differences = self.run_metadata.differences(metadata)
        if differences and not self.options.allow_changes:
            raise CheckpointMismatchError(
                f"the checkpoint in {self.options.directory!r} belongs to a different run ({'; '.join(differences)}). "
                "Fix: use another checkpoint_dir, or pass checkpoint_options=tfdist.CheckpointOptions(allow_changes=True) "
                "(--allow-changes) to continue "
                "deliberately; the checkpoints were left untouched."
            )
        if differences:
            log.warning("resuming despite changes (allow_changes): %s", "; ".join(differences))

    def restore(self) -> ResumePoint | None:
        """Restores the newest good checkpoint; a corrupt one is skipped with a warning."""
        self.sync()
        listed = layout.checkpoint_paths(self.options.directory, listed_only=True) if self.options.resume else []
        if not self.is_chief:  # a listed checkpoint deleted by hand is not there to resume from (the chief
            listed = _present(listed)  # wrote the state file again without it: _forget_missing)
        paths = listed or (layout.found_checkpoints(self.options.directory) if self.options.resume else [])
        if paths and not listed:
            log.warning("%s has no readable state file `checkpoint`: resuming from the checkpoints found beside it "
                        "(newest %s)", self.options.directory, storage.basename(paths[-1]))
        described = [p for p in paths if storage.exists(layout.metadata_path(p))]
        if described and described[-1] != paths[-1]:  # tfdist's, whose save failed before its metadata was written
            log.warning("%s has no tfdist metadata, unlike %s before it (its save failed before writing it): resuming "
                        "from the newest checkpoint with metadata", ", ".join(
                            storage.basename(p) for p in paths[paths.index(described[-1]) + 1:]),
                        storage.basename(described[-1]))
            paths = paths[:paths.index(described[-1]) + 1]
        if paths:  # the newest checkpoint decides which run the directory belongs to
            self._check_compatible(paths[-1], layout.read_metadata(paths[-1]))
        if self.is_chief:  # this run's directory: what killed writes left can go
            self._remove_interrupted_writes(listed)
        point = self._restore_newest(paths, listed=bool(listed)) if paths else None
        if self.is_chief:  # this run writes the directory now (a run refused above leaves the record alone)
            self._writer = ownership.claim(self.directory)
        return point

    def _restore_newest(self, paths: list[str], *, listed: bool) -> ResumePoint:
        """Restores the newest of ``paths`` this run can read; raises if it can read none."""
        import tensorflow as tf

        mismatched: list[str] = []  # read, but holding other objects than this run's (e.g. another model)
        for path in reversed(paths):
            metadata = layout.read_metadata(path)
            try:
                if path != paths[-1]:  # the newest was checked above
                    self._check_compatible(path, metadata)
                _signals.hold("restore")
                status = self._restore_root.restore(path)
                # What the checkpoint has and this run does not restore here -- the per-replica
                # values and the callbacks' arrays, restored below -- is left out on purpose (and
                # no warning about it when a checkpoint of other objects is refused).
                status.expect_partial()
                status.assert_existing_objects_matched()
            except CheckpointMismatchError:
                raise
            except (AssertionError, ValueError) as e:  # objects or shapes other than this run's
                tf_compat.expect_partial_after(e)
                log.warning("checkpoint %s does not match this run's model and optimizer (%s); falling back to the "
                            "previous one", path, describe(e))
                mismatched.append(describe(e))
                continue
            except (tf.errors.OpError, IndexError, OSError) as e:  # IndexError: a truncated file
                tf_compat.expect_partial_after(e)
                if _other_dtype(e):  # e.g. a checkpoint from before tfdist recorded the precision, in another one
                    log.warning("checkpoint %s holds variables of other dtypes than this run's model and optimizer "
                                "(%s); falling back to the previous one", path, describe(e))
                    mismatched.append(f"{describe(e)}; another mixed_precision?")
                    continue
                log.warning("checkpoint %s cannot be read (%s); falling back to the previous one", path, describe(e))
                continue
            self._restore_replica_state(path, metadata)
            self._restore_callback_arrays(path)
            self._restore_global_rng(path)
            if self.is_chief and not listed:  # the directory names its latest checkpoint again (the others stay
                layout.write_state(self.directory, [path])  # unlisted, so that no retention deletes them)
            point = ResumePoint(path=path, global_step=self.counters.global_step, metadata=metadata)
            self.resumed_from = point
            self.last_saved_step = point.global_step
            return point
        if len(mismatched) == len(paths):  # not a damage a restart or an older checkpoint could get past
            raise CheckpointMismatchError(
                f"the checkpoints in {self.options.directory!r} hold other variables than this run's model and optimizer; "
                f"received {len(paths)} checkpoint(s) that do not match ({mismatched[0]}). Fix: build the model and "
                "optimizer the run was saved with, or use another checkpoint_dir; the checkpoints were left untouched."
            )
        raise CheckpointIOError(
            f"no checkpoint in {self.options.directory!r} can be read; received {len(paths) - len(mismatched)} corrupt "
            f"checkpoint(s){f' and {len(mismatched)} of other variables' if mismatched else ''}. "
            "Fix: inspect them with `tfdist ckpt verify`, or start a fresh run in another directory."
        )

    def _restore_callback_arrays(self, path: str) -> None:
        """Restores the callbacks' arrays if the checkpoint has them (``callback_arrays_restored``)."""
        import tensorflow as tf

        if self._callback_arrays is None:
            return
        self.callback_arrays_restored = False
        try:
            status = tf.train.Checkpoint(**{layout.CALLBACKS: self._callback_arrays}).restore(path)
            status.expect_partial()
            status.assert_existing_objects_matched()
        except (AssertionError, ValueError) as e:  # saved without them, or for another model
            log.debug("the callbacks' arrays were not restored from %s: %s", path, describe(e))
            return
        self.callback_arrays_restored = True

    def _restore_global_rng(self, path: str) -> None:
        """Restores ``global_random_state`` if the checkpoint has it."""
        import tensorflow as tf

        if self._global_rng is not None:
            tf.train.Checkpoint(**{layout.RNG_GLOBAL: self._global_rng}).restore(path).expect_partial()

    @property
    def _replica_groups(self) -> list[ReplicaValues]:
        return [g for g in (self._replica_state, self._replica_metrics) if g is not None]

    def _restore_replica_state(self, path: str, metadata: layout.Metadata) -> None:
        """Puts each replica's own values back; after a topology change, their aggregate, and says so."""
        if self._replica_state is not None and self._replica_state.restore(path):
            return
        replicas = self.strategy.num_replicas_in_sync
        saved = metadata.run_value("num_replicas")
        if isinstance(saved, int) and saved > 1:  # the checkpoint may hold one replica's values: aggregate them
            aggregate_saved(self._one_replica_saved, path, name=layout.REPLICA_STATE, saved_replicas=saved)
        if saved is not None and saved != replicas:
            log.info(
                "the checkpoint was saved by %s replica%s, this run has %d: same step and data order; every replica "
                "starts from the aggregate of the saved per-replica values (e.g. the mean of BatchNormalization's "
                "moving statistics)", saved, "" if saved == 1 else "s", replicas,
            )

    def restore_metrics(self) -> None:
        """Restores the epoch's metric accumulators of the checkpoint resumed from (after Keras reset them)."""
        if self.resumed_from is None:
            return
        if self._replica_metrics is not None and self._replica_metrics.restore(self.resumed_from.path):
            return
        self._metrics_root.restore(self.resumed_from.path).expect_partial()


def _other_dtype(error: BaseException) -> bool:
    """A restore that failed on a variable saved in another dtype (not damage: another run's variables)."""
    import tensorflow as tf

    return isinstance(error, tf.errors.InvalidArgumentError) and "does not equal original dtype" in str(error)


def _is_storage_error(error: BaseException) -> bool:
    """True for an error of the files or the storage (TensorFlow's runtime errors, the OS's);
    False for one of the state being saved (a ValueError while tracing its copy, say)."""
    import tensorflow as tf

    return isinstance(error, (OSError, tf.errors.OpError))


def _state_not_saved(directory: str, error: BaseException, *, async_save: bool) -> CheckpointError:
    """The error of a save that failed on the training state, before any file was written: a
    restart would fail the same way, and the storage is not at fault."""
    if async_save:
        what = "the training state could not be copied to host memory for the background write"
        fix = ("save synchronously (checkpoint_options=CheckpointOptions(async_save=False), or --sync-save), "
               "which copies nothing first, and report the model whose variables caused it")
    else:
        what = "the training state could not be serialized"
        fix = "keep the object the error names out of the model's attributes, or make it a tf.Variable"
    return CheckpointError(
        f"saving a checkpoint to {directory!r} failed before anything was written: {what} "
        f"({describe(error, limit=300)}); the storage is not at fault. Fix: {fix}. The earlier checkpoints are unchanged."
    )


def _save_failed(directory: str, error: BaseException) -> CheckpointIOError:
    return CheckpointIOError(
        f"saving a checkpoint to {directory!r} failed: {describe(error, limit=300)}. Fix: check free space, "
        "permissions and that the directory is still there; this save did not change the earlier checkpoints."
    )


def _present(paths: list[str]) -> list[str]:
    """The checkpoints of ``paths`` whose index file is there."""
    return [path for path in paths if storage.exists(layout.index_path(path))]
