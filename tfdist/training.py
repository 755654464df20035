"""``tfdist.fit`` (module ``tfdist.training``): strategy -> model in scope -> data -> restore -> Keras fit -> summary."""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import time
from typing import Any, Sequence

import numpy as np

from tfdist import checkpoint as ckpt_mod
from tfdist import data as data_mod
from tfdist import env
from tfdist import keras_model
from tfdist import strategy as strategy_mod
from tfdist.cluster import EVALUATOR, ClusterSpec, detect
from tfdist.errors import DataError, ModelError, PeerUnavailableError
from tfdist.faults import Faults
from tfdist.preemption import Agreement, Preempted, PreemptionWatcher

log = logging.getLogger("tfdist")


@dataclasses.dataclass(frozen=True)
class FitSummary:
    """What a run did; ``fit`` attaches it to the returned History as ``history.tfdist``."""

    strategy: str
    num_replicas: int
    num_workers: int
    global_batch_size: int
    per_replica_batch_size: int
    micro_batch_size: int
    grad_accum_steps: int
    epochs: int
    steps_per_epoch: int
    global_step: int
    start_step: int
    resumed_from: str | None
    completed: bool
    final_loss: float | None
    val_accuracy: float | None
    examples_per_sec: float | None
    wall_seconds: float
    checkpoint_dir: str | None
    seed: int

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


class _StartAt:
    """Tells tf_keras' fit loop the (epoch, step) to start at, through the hook its own
    BackupAndRestore uses (``model._training_state``)."""

    def __init__(self, epoch: int, step: int):
        self.epoch, self.step = epoch, step

    def maybe_load_initial_counters_from_ckpt(self, steps_per_epoch, initial_epoch, mode=None):
        return self.epoch, self.step


def _training_callback_class():
    import tf_keras
    from tf_keras.src.utils import tf_utils

    class TrainingCallback(tf_keras.callbacks.Callback):
        """Counts global steps, resumes mid-epoch, saves, and answers preemption."""

        def __init__(self, *, plan, start_step, checkpointer, checkpoint_options, watcher, agreement, history,
                     faults):
            super().__init__()
            # Batch logs are never read here, so tf_keras may pass them unresolved: this is
            # what lets the batch hooks (step-level saves) run under ParameterServerStrategy.
            self._supports_tf_logs = True
            self._plan = plan
            self._start_step = start_step
            self._ckpt = checkpointer
            self._options = checkpoint_options
            self._watcher = watcher
            self._agreement = agreement
            self._preempt_at_epoch_end = False
            self.history = history  # per-epoch logs, earlier runs included
            self._faults = faults
            self.global_step = start_step
            self._epoch = start_step // plan.steps_per_epoch
            self._steps_run = 0
            self._train_seconds = 0.0
            self._t0 = None

        def on_train_begin(self, logs=None):
            spe = self._plan.steps_per_epoch
            if self._start_step % spe:
                self.model._training_state = _StartAt(self._start_step // spe, self._start_step % spe)
            self._t0 = time.monotonic()

        def on_epoch_begin(self, epoch, logs=None):
            self._epoch = epoch
            if self.model._training_state is not None and isinstance(self.model._training_state, _StartAt):
                self.model._training_state = None
                if self._ckpt is not None:
                    self._ckpt.restore_metrics()  # Keras has just reset them

        def _save(self, *, complete=False):
            if self._ckpt is None:
                return
            if getattr(self.model, "_cluster_coordinator", None) is not None:
                self.model._cluster_coordinator.join()  # parameter servers: let scheduled steps land
            spe = self._plan.steps_per_epoch
            self._ckpt.save(
                global_step=self.global_step,
                epoch=self.global_step // spe,
                step_in_epoch=self.global_step % spe,
                history=self.history,
                complete=complete,
            )
            self._faults.fire("kill_after_save", self.global_step)

        def on_train_batch_end(self, batch, logs=None):
            spe = self._plan.steps_per_epoch
            step = self._epoch * spe + batch + 1
            self._steps_run += step - self.global_step
            self.global_step = step
            self._faults.fire("kill_at_step", step)
            self._faults.fire("term_at_step", step)
            preempt = self._watcher.requested
            due = timed = False
            if self._ckpt is not None and step % spe:  # an epoch's last step is saved at epoch end
                every = self._options.save_every_steps
                due = bool(every and step % every == 0)  # the same step on every worker
                seconds = self._options.save_every_seconds
                timed = bool(seconds and time.monotonic() - self._ckpt.last_save_time >= seconds)
            if self._agreement is not None:
                # A save is a collective: flags that can differ between workers (a signal, a
                # clock) are acted on only at agreed steps, by every worker together.
                agreed = self._agreement.due(step)
                preempt, timed = self._agreement.agree(step, [preempt, timed]) if agreed else (False, False)
            if preempt and not step % spe:
                self._preempt_at_epoch_end = True  # let the epoch validate and record itself first
            elif due or timed or preempt:
                self._save()
                if preempt:
                    self._stop_preempted(step)

        def _stop_preempted(self, step):
            if self._ckpt is not None:
                self._ckpt.sync()
            raise Preempted(step, self._watcher.signal_name or "another worker's signal")

        def on_epoch_end(self, epoch, logs=None):
            logs = tf_utils.sync_to_numpy_or_python_type(logs or {})
            self.history.append({k: float(v) for k, v in logs.items() if np.ndim(v) == 0})
            complete = self.global_step >= self._plan.total_steps
            self._save(complete=complete)
            if self._preempt_at_epoch_end and not complete:
                self._stop_preempted(self.global_step)

        def on_train_end(self, logs=None):
            self._train_seconds = time.monotonic() - (self._t0 or time.monotonic())
            if self.model.stop_training and self._ckpt is not None and self._ckpt.last_saved_step != self.global_step:
                self._save(complete=True)

    return TrainingCallback


def _set_seed(seed: int | None, deterministic: bool) -> int:
    import tensorflow as tf
    import tf_keras

    if seed is None:
        seed = random.SystemRandom().randrange(2**31)
        log.info("seed %d (pass seed= to make the run reproducible)", seed)
    tf_keras.utils.set_random_seed(seed)
    if deterministic:
        tf.config.experimental.enable_op_determinism()
    return seed


def _peer_errors():
    import tensorflow as tf

    return (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.DeadlineExceededError, tf.errors.CancelledError)


def _history(previous: list[dict], history=None):
    """A Keras History holding every epoch of the run, earlier runs included."""
    import tf_keras

    merged = tf_keras.callbacks.History()
    merged.epoch = list(range(len(previous)))
    for logs in previous:
        for key, value in logs.items():
            merged.history.setdefault(key, []).append(value)
    if history is not None:
        merged.model = history.model
        merged.params = history.params
    return merged


def fit(
    model: Any,
    data: Any,
    *,
    epochs: int = 1,
    batch_size: int | None = None,
    per_replica_batch_size: int | None = None,
    steps_per_epoch: int | None = None,
    strategy: Any = "auto",
    validation_data: Any = None,
    callbacks: Sequence[Any] | None = None,
    seed: int | None = None,
    deterministic: bool = False,
    verbose: int | str = "auto",
    shuffle: bool = True,
    grad_accum_steps: int = 1,
    mixed_precision: str | None = None,
    checkpoint_dir: str | None = None,
    save_every_steps: int | None = None,
    save_every_seconds: float | None = None,
    keep: int = 3,
    keep_every_hours: float | None = None,
    async_save: bool = True,
    resume: bool = True,
    allow_changes: bool = False,
    devices: Sequence[str] | None = None,
    all_reduce: str = "auto",
    bytes_per_pack: int = 0,
    collective_timeout: float | None = None,
    cluster: ClusterSpec | None = None,
):
    """Trains ``model`` on ``data`` with the strategy the cluster calls for; returns Keras' History.

    Every process of a cluster runs the same call. On the ``ps`` and ``worker`` tasks of a
    parameter-server cluster it serves until stopped; everywhere else it trains.

    Args:
      model: a function that builds and compiles a tf_keras model (called inside the
        strategy's scope), or a compiled tf_keras Sequential or functional model.
      data: ``(x, y)`` NumPy arrays, an unbatched ``tf.data.Dataset`` of ``(x, y)``, or a
        name: ``"digits"``, ``"tfds:NAME"``, or a path to an ``.npz`` with ``x`` and ``y``.
      batch_size: the global batch of one optimizer step. per_replica_batch_size: the micro
        batch. Give one; global = grad_accum_steps x replicas x micro batch.
      checkpoint_dir: enables checkpoints (every ``save_every_steps`` steps / every
        ``save_every_seconds`` seconds, at each epoch end and at the end) and, with
        ``resume``, continues from the latest one at the exact step and batch.

    On SIGTERM or SIGUSR1 the state is saved at the current step and the process exits
    with code 75 (``tfdist.env.EXIT_PREEMPTED``); running the same call again resumes.
    """
    import tensorflow as tf
    import tf_keras

    wall_start = time.monotonic()
    cluster = detect() if cluster is None else cluster
    if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1:
        raise DataError(f"Invalid `epochs`; received epochs={epochs!r}. Fix: use a positive integer.")
    if isinstance(grad_accum_steps, bool) or not isinstance(grad_accum_steps, int) or grad_accum_steps < 1:
        raise DataError(f"Invalid `grad_accum_steps`; received grad_accum_steps={grad_accum_steps!r}. Fix: use a positive integer.")
    keras_model.check_argument(model)
    if cluster.task_type == EVALUATOR:
        raise ModelError(
            "tfdist.fit does not train on the evaluator task; received task evaluator:0. "
            "Fix: run `tfdist train` there (it evaluates each new checkpoint), or leave the evaluator out."
        )
    if not isinstance(strategy, tf.distribute.Strategy):
        choice = strategy_mod.resolve_name(strategy, cluster)
        if choice.name == strategy_mod.PARAMETER_SERVER and not cluster.is_chief:
            strategy_mod.serve(cluster)  # ps and worker tasks: serve until stopped
            return None
    for cb in callbacks or ():
        if isinstance(cb, tf_keras.callbacks.BackupAndRestore):
            raise ModelError(
                "BackupAndRestore conflicts with tfdist's own checkpoints; received it in callbacks. "
                "Fix: remove it and pass checkpoint_dir= (tfdist resumes at the exact batch)."
            )
    recorded = (ckpt_mod.latest_metadata(checkpoint_dir) or {}) if checkpoint_dir is not None and resume else {}
    if seed is None:
        seed = recorded.get("seed")  # continue the run's own order
    seed = _set_seed(seed, deterministic)
    strat = strategy_mod.make_strategy(
        strategy,
        cluster=cluster,
        devices=devices,
        all_reduce=all_reduce,
        bytes_per_pack=bytes_per_pack,
        collective_timeout=collective_timeout,
    )
    name = strategy_mod.name_of(strat)
    parameter_server = name == strategy_mod.PARAMETER_SERVER
    multi_worker = name == strategy_mod.MULTI_WORKER_MIRRORED and cluster.num_workers > 1
    # Tasks that run training steps (under parameter servers the chief only coordinates).
    num_workers = len(cluster.jobs.get("worker", ())) if parameter_server else max(cluster.num_workers, 1)
    is_chief = cluster.is_chief

    # Data.
    if isinstance(data, str):
        source, default_val = data_mod.load(data)
        if validation_data is None:
            validation_data = default_val
    else:
        source = data_mod.as_source(data)
    sizes = data_mod.BatchSizes.resolve(
        num_replicas=strat.num_replicas_in_sync,
        batch_size=batch_size,
        per_replica_batch_size=per_replica_batch_size,
        grad_accum_steps=grad_accum_steps,
    )
    plan = data_mod.make_plan(source, sizes, steps_per_epoch=steps_per_epoch, epochs=epochs, seed=seed, shuffle=shuffle,
                              parameter_server=parameter_server, num_workers=num_workers, recorded=recorded)
    spe = plan.steps_per_epoch
    log.info("%s; %d steps per epoch, %d epoch(s)", sizes.describe(), spe, epochs)

    # Model.
    built = keras_model.resolve(model, strat, precision=mixed_precision or "float32")
    if parameter_server and grad_accum_steps > 1:
        raise ModelError(
            f"gradient accumulation is not supported under parameter_server; received grad_accum_steps={grad_accum_steps}. "
            "Fix: use a synchronous strategy, or a larger per-worker batch instead."
        )
    keras_model.install_grad_accumulation(built, grad_accum_steps)
    keras_model.build_state(built, source.sample(sizes.micro_batch_size))
    generators = keras_model.random_generators(built)

    # Checkpoints.
    checkpointer = None
    checkpoint_options = None
    start_step = 0
    previous_history: list[dict] = []
    if checkpoint_dir is not None:
        checkpoint_options = ckpt_mod.CheckpointOptions(
            directory=checkpoint_dir,
            save_every_steps=save_every_steps,
            save_every_seconds=save_every_seconds,
            keep=keep,
            keep_every_hours=keep_every_hours,
            async_save=async_save,
            resume=resume,
            allow_changes=allow_changes,
        )
        run_metadata = {
            "strategy": name,
            "num_replicas": strat.num_replicas_in_sync,
            "num_workers": num_workers,
            "global_batch_size": sizes.global_batch_size,
            "micro_batch_size": sizes.micro_batch_size,
            "grad_accum_steps": sizes.grad_accum_steps,
            "steps_per_epoch": spe,
            "epochs": epochs,
            "seed": seed,
            "shuffle": shuffle,
            "data_fingerprint": source.fingerprint(),
            "model_fingerprint": ckpt_mod.model_fingerprint(built),
            "tfdist_version": __import__("tfdist").__version__,
            "tensorflow_version": tf.__version__,
            **plan.metadata(),
        }
        checkpointer = ckpt_mod.Checkpointer(
            options=checkpoint_options,
            model=built,
            generators=generators,
            is_chief=is_chief,
            task_name=cluster.task_name,
            run_metadata=run_metadata,
        )
        point = checkpointer.restore()
        if point is not None:
            start_step = point.global_step
            previous_history = list(point.metadata.get("history", []))
            # A complete run is done, unless it is asked for more epochs than it ran.
            done = point.metadata.get("complete") and (
                start_step >= plan.total_steps or point.metadata.get("epochs") == epochs
            )
            log.info("resuming from %s: global step %d (epoch %d, step %d of %d)", point.path, start_step,
                     start_step // spe, start_step % spe, spe)
            if done:
                log.info("the run in %s is already complete at step %d; nothing to train", checkpoint_dir, start_step)
                checkpointer.close()
                history = _history(previous_history)
                history.tfdist = _summary(name, strat, num_workers, sizes, plan, start_step, start_step, point.path, True,
                                          previous_history, 0, 0.0, time.monotonic() - wall_start, checkpoint_dir, seed)
                return history

    # Datasets.
    if parameter_server:
        dataset = tf_keras.utils.experimental.DatasetCreator(
            data_mod.dataset_fn(source, plan, start_step=start_step, parameter_server=True)
        )
    else:
        dataset = strat.distribute_datasets_from_function(
            data_mod.dataset_fn(source, plan, start_step=start_step, stop_step=plan.total_steps)
        )
    val_dataset = validation_steps = None
    if validation_data is not None:
        val_dataset, validation_steps = data_mod.validation_input(
            data_mod.as_source(validation_data), sizes, strategy=strat, parameter_server=parameter_server
        )

    # Fit.
    quiet = not is_chief and not env.flag(env.TFDIST_VERBOSE_WORKERS)
    if verbose == "auto":
        verbose = 0 if quiet else (1 if os.isatty(1) else 2)
    elif quiet:
        verbose = 0
    callback = _training_callback_class()(
        plan=plan,
        start_step=start_step,
        checkpointer=checkpointer,
        checkpoint_options=checkpoint_options,
        watcher=PreemptionWatcher(),
        agreement=Agreement(strat, is_chief=is_chief) if multi_worker else None,
        history=previous_history,
        faults=Faults(task_name=cluster.task_name),
    )
    start_epoch = start_step // spe
    history = None
    try:
        with callback._watcher:
            if start_step < plan.total_steps:
                history = built.fit(
                    dataset,
                    epochs=epochs,
                    initial_epoch=start_epoch,
                    steps_per_epoch=spe,
                    validation_data=val_dataset,
                    validation_steps=validation_steps,
                    callbacks=[callback, *(callbacks or [])],
                    verbose=verbose,
                )
    except Preempted as e:
        log.warning("%s; exiting with code %d so the run is restarted", e, env.EXIT_PREEMPTED)
        if checkpointer is not None:
            checkpointer.close()
        raise SystemExit(env.EXIT_PREEMPTED)
    except _peer_errors() as e:
        if cluster.num_workers > 1 or parameter_server:
            raise PeerUnavailableError(
                f"a peer of {cluster.task_name} was lost during training ({type(e).__name__}: "
                f"{str(e).splitlines()[0][:200]}). Fix: restart every task (tfdist launch does it); the run resumes "
                "from its last checkpoint."
            ) from e
        raise
    if checkpointer is not None:
        checkpointer.close()
    merged = _history(callback.history, history)
    steps_run = callback.global_step - start_step
    merged.tfdist = _summary(name, strat, num_workers, sizes, plan, callback.global_step, start_step,
                             checkpointer.resumed_from.path if checkpointer and checkpointer.resumed_from else None,
                             callback.global_step >= plan.total_steps, callback.history, steps_run,
                             callback._train_seconds, time.monotonic() - wall_start, checkpoint_dir, seed)
    return merged


def _summary(name, strat, num_workers, sizes, plan, global_step, start_step, resumed_from, completed, history,
             steps_run, train_seconds, wall_seconds, checkpoint_dir, seed) -> FitSummary:
    last = history[-1] if history else {}
    accuracy_key = next((k for k in ("val_accuracy", "val_sparse_categorical_accuracy", "val_acc") if k in last), None)
    return FitSummary(
        strategy=name,
        num_replicas=strat.num_replicas_in_sync,
        num_workers=num_workers,
        global_batch_size=sizes.global_batch_size,
        per_replica_batch_size=sizes.per_replica_batch_size,
        micro_batch_size=sizes.micro_batch_size,
        grad_accum_steps=sizes.grad_accum_steps,
        epochs=plan.epochs,
        steps_per_epoch=plan.steps_per_epoch,
        global_step=global_step,
        start_step=start_step,
        resumed_from=resumed_from,
        completed=completed,
        final_loss=last.get("loss"),
        val_accuracy=last.get(accuracy_key) if accuracy_key else None,
        examples_per_sec=(steps_run * sizes.global_batch_size / train_seconds) if train_seconds > 0 and steps_run else None,
        wall_seconds=wall_seconds,
        checkpoint_dir=checkpoint_dir,
        seed=seed,
    )
