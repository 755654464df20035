"""Checkpoints: what is saved, asynchronous atomic saves, compatibility, restore and fallback.

A checkpoint ``ckpt-<global step>`` holds the model weights, the optimizer (slots and
iterations), the progress counters (global step, epoch, step in epoch; the data position
follows from them and the seed), the state of every random layer's generator, and the
epoch's metric accumulators (per replica). ``ckpt-<step>.tfdist.json`` beside it records the run it
belongs to (strategy, replicas, batch sizes, seed, data and model fingerprints, versions)
and the history so far.

Atomicity comes from ``tf.train.CheckpointManager``: shards are written to a temporary
directory and merged, and the ``checkpoint`` state file, which names the latest
checkpoint, is rewritten (temp file + rename) only after the data is complete.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from typing import Any

from tfdist.errors import CheckpointError, CheckpointMismatchError

log = logging.getLogger("tfdist")

METADATA_SUFFIX = ".tfdist.json"
FORMAT = 1
# Keys that must match for a resume to continue the same run.
_MUST_MATCH = ("global_batch_size", "data_fingerprint", "model_fingerprint", "seed", "shuffle")


@dataclasses.dataclass(frozen=True)
class CheckpointOptions:
    """Where and when to save, and how to resume.

    Attributes:
      directory: where the chief keeps its checkpoints (must be readable by every worker).
      save_every_steps: also save every N global steps (None: only at epoch ends).
      save_every_seconds: also save when this many seconds passed since the last save.
      keep: how many recent checkpoints to keep.
      keep_every_hours: additionally keep one checkpoint every H hours.
      async_save: write in the background (TensorFlow's async checkpointing).
      resume: continue from the latest checkpoint in ``directory`` if there is one.
      allow_changes: resume even if the global batch size, model or data differ.
    """

    directory: str
    save_every_steps: int | None = None
    save_every_seconds: float | None = None
    keep: int = 3
    keep_every_hours: float | None = None
    async_save: bool = True
    resume: bool = True
    allow_changes: bool = False

    def __post_init__(self):
        if not isinstance(self.directory, (str, os.PathLike)) or not str(self.directory):
            raise CheckpointError(
                f"Invalid `checkpoint_dir`; received checkpoint_dir={self.directory!r}. Fix: pass a directory path."
            )
        object.__setattr__(self, "directory", os.fspath(self.directory))
        checks = (
            ("save_every_steps", self.save_every_steps, int, "a positive number of steps"),
            ("save_every_seconds", self.save_every_seconds, (int, float), "a positive number of seconds"),
            ("keep", self.keep, int, "a positive number of checkpoints"),
            ("keep_every_hours", self.keep_every_hours, (int, float), "a positive number of hours"),
        )
        for name, value, kind, what in checks:
            if value is None and name != "keep":
                continue
            if isinstance(value, bool) or not isinstance(value, kind) or value <= 0:
                raise CheckpointError(f"Invalid `{name}`; received {name}={value!r}. Fix: use {what}.")


def model_fingerprint(model) -> str:
    """A hash of the model's structure: layer classes and weight shapes and dtypes, in order.

    Names are left out: Keras numbers them per process (dense, dense_1, ...)."""
    digest = hashlib.sha256()
    for layer in model._flatten_layers(include_self=False):
        shapes = ",".join(f"{tuple(w.shape)}:{w.dtype.name}" for w in layer.weights)
        digest.update(f"{type(layer).__name__}[{shapes}];".encode())
    return digest.hexdigest()[:16]


class _ReplicaMetrics:
    """Each replica's own metric accumulators, so that a resumed epoch reports the same metrics.

    Under mirrored and multi_worker_mirrored a metric's variables are on-read-synchronized:
    every replica accumulates its own partial sum, and reading adds them up. A plain
    checkpoint keeps only that sum and restores ``sum / replicas`` into every replica, which
    changes the order of the float additions that follow (the resumed epoch's loss then
    differs in its last bits). This keeps every replica's value, gathered from all workers,
    in a ``[replicas, ...]`` variable per metric variable, and puts each row back into its
    own replica. It is used only when the replica count matches the checkpoint's; otherwise
    the summed values are restored.
    """

    def __init__(self, model):
        import tensorflow as tf

        self.strategy = model.distribute_strategy
        self.replicas = self.strategy.num_replicas_in_sync
        self.variables = [v for metric in model.metrics for v in metric.variables]
        self.module = tf.Module(name="replica_metrics")
        self.shadows = []
        with tf.init_scope():
            for j, variable in enumerate(self.variables):
                shadow = tf.Variable(tf.zeros([self.replicas, *variable.shape], variable.dtype), trainable=False,
                                     name=f"replica_metric_{j}")
                setattr(self.module, self.key(j), shadow)
                self.shadows.append(shadow)
        strategy, variables = self.strategy, self.variables

        @tf.function
        def gather():
            # In replica context an on-read variable reads as this replica's own value.
            local = strategy.run(lambda: [tf.expand_dims(tf.identity(v), 0) for v in variables])
            return [strategy.gather(value, axis=0) for value in local]

        @tf.function
        def scatter():
            def assign():
                replica = tf.distribute.get_replica_context().replica_id_in_sync_group
                for variable, shadow in zip(variables, self.shadows):
                    variable.assign(tf.gather(shadow, replica))

            strategy.run(assign)

        self._gather, self._scatter = gather, scatter

    def key(self, j: int) -> str:
        return f"r{self.replicas}_v{j}"  # a checkpoint of another replica count does not match

    @staticmethod
    def needed(model) -> bool:
        import tensorflow as tf

        return any(
            isinstance(v, tf.distribute.DistributedValues) and v.synchronization == tf.VariableSynchronization.ON_READ
            for metric in model.metrics for v in metric.variables
        )

    def capture(self) -> None:
        """Copies every replica's accumulators into the checkpointed variables (a collective
        under multi_worker_mirrored: every worker calls it at the same step)."""
        for shadow, value in zip(self.shadows, self._gather()):
            shadow.assign(value)

    def restore(self, path: str) -> bool:
        """Puts each replica's accumulators back from the (already restored) variables, if
        ``path`` holds them for this replica count; False otherwise."""
        import tensorflow as tf

        names = {name for name, _ in tf.train.list_variables(path)}
        if self.variables and not any(f"replica_metrics/{self.key(0)}/" in name for name in names):
            return False
        self._scatter()
        return True


class _Counters:
    """The step counters that are part of every checkpoint."""

    def __init__(self):
        import tensorflow as tf

        self.module = tf.Module(name="progress")
        self.module.global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        self.module.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
        self.module.step_in_epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="step_in_epoch")

    def set(self, *, global_step: int, epoch: int, step_in_epoch: int) -> None:
        self.module.global_step.assign(global_step)
        self.module.epoch.assign(epoch)
        self.module.step_in_epoch.assign(step_in_epoch)

    @property
    def global_step(self) -> int:
        return int(self.module.global_step.numpy())


@dataclasses.dataclass(frozen=True)
class ResumePoint:
    path: str
    global_step: int
    metadata: dict


def _write_json_atomic(path: str, data: dict) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True, default=float)
    os.replace(tmp, path)


def read_metadata(prefix: str) -> dict | None:
    try:
        with open(prefix + METADATA_SUFFIX) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


_STATE_LINE = re.compile(r'^(model_checkpoint_path|all_model_checkpoint_paths):\s*"((?:[^"\\]|\\.)*)"\s*$')


def checkpoint_paths(directory: str) -> list[str]:
    """The complete checkpoints of ``directory``, oldest first, as the atomic ``checkpoint``
    state file names them (read as text: listing needs no TensorFlow)."""
    try:
        with open(os.path.join(directory, "checkpoint")) as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    latest, paths = None, []
    for line in lines:
        match = _STATE_LINE.match(line.strip())
        if match:
            path = match.group(2).encode().decode("unicode_escape")
            path = path if os.path.isabs(path) else os.path.join(directory, path)
            if match.group(1) == "model_checkpoint_path":
                latest = path
            else:
                paths.append(path)
    return paths or ([latest] if latest else [])


def latest_metadata(directory: str) -> dict | None:
    """The metadata of the newest complete checkpoint in ``directory``, if any."""
    paths = checkpoint_paths(directory) if os.path.isdir(directory) else []
    return read_metadata(paths[-1]) if paths else None


def refuse_to_start_over(directory: str, *, what: str = "resume=False") -> None:
    """Raises CheckpointError if ``directory`` already holds checkpoints: a fresh run there
    would let the retention policy delete them."""
    paths = checkpoint_paths(directory) if os.path.isdir(directory) else []
    if paths:
        raise CheckpointError(
            f"{what} was given but {directory!r} holds {len(paths)} checkpoint(s) of an earlier run (latest "
            f"{os.path.basename(paths[-1])}); received {what}. Fix: use another checkpoint directory, or resume; "
            "tfdist never overwrites or deletes a run's checkpoints to start over."
        )


def checkpoint_files(prefix: str) -> list[str]:
    return sorted(glob.glob(glob.escape(prefix) + ".index") + glob.glob(glob.escape(prefix) + ".data-*"))


class Checkpointer:
    """Saves and restores one run's state. Every worker of a cluster must create one and call
    ``save`` at the same steps; only the chief's checkpoints are kept."""

    def __init__(
        self,
        *,
        options: CheckpointOptions,
        model,
        generators: dict[str, Any],
        is_chief: bool,
        task_name: str,
        run_metadata: dict,
    ):
        import tensorflow as tf

        self.options = options
        self.model = model
        self.counters = _Counters()
        self.is_chief = is_chief
        self.run_metadata = dict(run_metadata)
        self._metrics = tf.Module(name="metrics")
        for i, metric in enumerate(model.metrics):
            setattr(self._metrics, f"m{i}_{metric.name}", metric)
        rng = tf.Module(name="rng")
        for key, generator in generators.items():
            setattr(rng, f"g_{key}", generator)
        parameter_server = isinstance(model.distribute_strategy, tf.distribute.experimental.ParameterServerStrategy)
        self._replica_metrics = (
            _ReplicaMetrics(model) if not parameter_server and _ReplicaMetrics.needed(model) else None
        )
        extra = {"replica_metrics": self._replica_metrics.module} if self._replica_metrics else {}
        self.root = tf.train.Checkpoint(
            model=model, optimizer=model.optimizer, progress=self.counters.module, rng=rng, metrics=self._metrics,
            **extra,
        )
        self._metrics_root = tf.train.Checkpoint(metrics=self._metrics)
        if not options.resume:  # every worker, so that none waits in a collective for a chief that refused
            refuse_to_start_over(options.directory)
        if is_chief:
            self.directory = options.directory
            self._check_writable(self.directory)
        else:  # tf.distribute: non-chief workers save too, to a place that is thrown away
            self.directory = tempfile.mkdtemp(prefix=f"tfdist-{task_name.replace(':', '-')}-")
        self.manager = tf.train.CheckpointManager(
            self.root,
            self.directory,
            max_to_keep=options.keep if is_chief else 1,
            keep_checkpoint_every_n_hours=options.keep_every_hours if is_chief else None,
            checkpoint_name="ckpt",
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

    # --- writing -------------------------------------------------------------------------
    @staticmethod
    def _check_writable(directory: str) -> None:
        try:
            os.makedirs(directory, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=directory, prefix=".tfdist-write-test-"):
                pass
        except OSError as e:
            raise CheckpointError(
                f"the checkpoint directory is not writable; received checkpoint_dir={directory!r} ({e.strerror}). "
                "Fix: choose a directory you can write to, or fix its permissions."
            ) from None

    def _written(self, save_path: str) -> None:
        if self._save_started is not None:
            self.last_written_at = time.perf_counter()
            self.last_write_seconds = self.last_written_at - self._save_started
            log.debug("%s written in %.3f s", save_path, self.last_write_seconds)

    def sync(self) -> None:
        """Waits for a background save; raises CheckpointError if it failed."""
        try:
            self.root.sync()
        except Exception as e:  # the async writer re-raises whatever failed in its thread
            raise CheckpointError(
                f"writing a checkpoint to {self.options.directory!r} failed: {type(e).__name__}: {e}. "
                "Fix: check free space and permissions; the earlier checkpoints are intact."
            ) from e

    def save(self, *, global_step: int, epoch: int, step_in_epoch: int, history: list[dict], complete: bool = False) -> str | None:
        """Saves the state after ``global_step`` steps (asynchronously unless disabled)."""
        if self.last_saved_step == global_step and not complete:
            return None
        self.sync()  # one save in flight at a time; surfaces the previous save's error
        self.counters.set(global_step=global_step, epoch=epoch, step_in_epoch=step_in_epoch)
        if self._replica_metrics is not None:
            self._replica_metrics.capture()
        metadata = dict(
            self.run_metadata,
            format=FORMAT,
            global_step=global_step,
            epoch=epoch,
            step_in_epoch=step_in_epoch,
            complete=complete,
            history=history,
            saved_at=time.time(),
        )
        if self.is_chief:
            self._quarantine_existing(global_step)
        self._save_started, self.last_write_seconds, self.last_written_at = time.perf_counter(), None, None
        try:
            path = self.manager.save(checkpoint_number=global_step, options=self._save_options)
        except Exception as e:
            raise CheckpointError(
                f"saving a checkpoint to {self.directory!r} failed: {type(e).__name__}: {e}. "
                "Fix: check free space and permissions; the earlier checkpoints are intact."
            ) from e
        if self.is_chief:
            _write_json_atomic(path + METADATA_SUFFIX, metadata)
            self._remove_orphan_metadata(keep=path)
        self.last_save_time = time.monotonic()
        self.last_saved_step = global_step
        return path

    def _quarantine_existing(self, step: int) -> None:
        """Moves aside an existing ``ckpt-<step>`` (e.g. a corrupt one resume skipped) instead of overwriting it."""
        prefix = os.path.join(self.directory, f"ckpt-{step}")
        files = checkpoint_files(prefix)
        if not files:
            return
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for path in files + [prefix + METADATA_SUFFIX]:
            if os.path.exists(path):
                os.replace(path, f"{path}.replaced-{stamp}")
        log.warning("an earlier ckpt-%d was kept as ckpt-%d.*.replaced-%s before saving the new one", step, step, stamp)

    def _remove_orphan_metadata(self, *, keep: str) -> None:
        """Removes the metadata of checkpoints the manager deleted (``keep``: the save in flight)."""
        for meta in glob.glob(os.path.join(glob.escape(self.directory), "ckpt-*" + METADATA_SUFFIX)):
            prefix = meta[: -len(METADATA_SUFFIX)]
            if prefix != keep and not checkpoint_files(prefix):
                os.remove(meta)

    def close(self) -> None:
        """Waits for the last save and removes a non-chief worker's throw-away directory."""
        try:
            self.sync()
        finally:
            if not self.is_chief:
                shutil.rmtree(self.directory, ignore_errors=True)
        if self.is_chief and self.last_saved_step is not None:
            self._remove_orphan_metadata(keep="")

    # --- reading -------------------------------------------------------------------------
    def _check_compatible(self, path: str, metadata: dict | None) -> None:
        if metadata is None:
            raise CheckpointMismatchError(
                f"{path!r} has no tfdist metadata ({os.path.basename(path)}{METADATA_SUFFIX}); received a checkpoint "
                "tfdist did not write. Fix: use an empty checkpoint_dir; the directory was left untouched."
            )
        differences = [
            f"{key}: checkpoint {metadata.get(key)!r}, this run {self.run_metadata.get(key)!r}"
            for key in _MUST_MATCH
            if metadata.get(key) != self.run_metadata.get(key)
        ]
        if differences and not self.options.allow_changes:
            raise CheckpointMismatchError(
                f"the checkpoint in {self.options.directory!r} belongs to a different run ({'; '.join(differences)}). "
                "Fix: use another checkpoint_dir, or pass allow_changes=True (--allow-changes) to continue "
                "deliberately; the checkpoints were left untouched."
            )
        if differences:
            log.warning("resuming despite changes (allow_changes): %s", "; ".join(differences))

    def restore(self) -> ResumePoint | None:
        """Restores the newest good checkpoint; a corrupt one is skipped with a warning."""
        import tensorflow as tf

        if not self.options.resume:
            return None
        self.sync()
        paths = checkpoint_paths(self.options.directory)
        if not paths:
            return None
        # The newest checkpoint decides which run the directory belongs to.
        self._check_compatible(paths[-1], read_metadata(paths[-1]))
        for path in reversed(paths):
            metadata = read_metadata(path)
            try:
                self._check_compatible(path, metadata)
                self.root.restore(path).assert_existing_objects_matched()
            except CheckpointMismatchError:
                raise
            except (tf.errors.OpError, AssertionError, ValueError, IndexError, OSError) as e:  # IndexError: truncated file
                log.warning("checkpoint %s cannot be read (%s: %s); falling back to the previous one",
                            path, type(e).__name__, str(e).splitlines()[0][:200])
                continue
            point = ResumePoint(path=path, global_step=self.counters.global_step, metadata=metadata)
            self.resumed_from = point
            self.last_saved_step = point.global_step
            return point
        raise CheckpointError(
            f"no checkpoint in {self.options.directory!r} can be read; received {len(paths)} corrupt checkpoint(s). "
            "Fix: inspect them with `tfdist ckpt verify`, or start a fresh run in another directory."
        )

    def restore_metrics(self) -> None:
        """Restores the epoch's metric accumulators of the checkpoint resumed from (after Keras reset them)."""
        if self.resumed_from is None:
            return
        if self._replica_metrics is not None and self._replica_metrics.restore(self.resumed_from.path):
            return
        self._metrics_root.restore(self.resumed_from.path).expect_partial()
