"""What tfdist does around the steps of any training loop: counts global steps, saves when due,
answers preemption, records the history.

The controller knows nothing of Keras: a loop reports its step and epoch boundaries to it
(``callback.TrainingCallback`` does so from inside tf_keras' ``fit``). Every worker of a
synchronous cluster reports the same boundaries, so saves -- collectives under
multi_worker_mirrored -- happen at the same steps everywhere.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

from tfdist.checkpoint import Checkpointer, CheckpointOptions
from tfdist.progress import Progress
from tfdist.training.faults import Faults
from tfdist.training.preemption import Preemption


@dataclasses.dataclass(frozen=True)
class Position:
    """A global step as (epoch, step within the epoch); ``steps_per_epoch`` optimizer steps an epoch."""

    global_step: int
    steps_per_epoch: int

    @property
    def epoch(self) -> int:
        return self.global_step // self.steps_per_epoch

    @property
    def step_in_epoch(self) -> int:
        return self.global_step % self.steps_per_epoch

    @property
    def mid_epoch(self) -> bool:
        """True when the position is inside an epoch, not at its start."""
        return self.step_in_epoch != 0


class SavePolicy:
    """When a step's state is saved besides epoch ends: every N steps (the same step on every
    worker) and every S seconds (a clock: under multi-worker it must be agreed on).

    A loop that runs several steps per call (``steps_per_execution``) reports only the last
    of them: a save is due when the steps since the last report crossed a multiple of N."""

    def __init__(self, options: CheckpointOptions, checkpointer: Checkpointer):
        self._every = options.save_every_steps
        self._seconds = options.save_every_seconds
        self._checkpointer = checkpointer

    def due(self, step: int, *, previous: int) -> tuple[bool, bool]:
        """(by step count, by time) for the state after ``step`` (the last report was ``previous``)."""
        by_steps = bool(self._every and step // self._every > previous // self._every)
        by_time = bool(self._seconds and time.monotonic() - self._checkpointer.last_save_time >= self._seconds)
        return by_steps, by_time


class Controller:
    """Counts global steps, saves when due, stops for preemption, records each epoch's logs.

    Args:
      steps_per_epoch, total_steps: the run's shape.
      start_step: the global step the run starts (or resumes) at.
      checkpointer: None without a checkpoint directory.
      save_policy: when to save between epoch ends (None without checkpoints).
      preemption: the preemption unit (signals, and agreement between workers).
      history: the per-epoch logs of the run so far (earlier runs included); appended to.
      faults: fault injection for tests and drills.
      before_save: called before every save (parameter servers: let scheduled steps land).
      callback_state: the user's callbacks' state, saved with every checkpoint and put back
        at ``on_train_begin`` (``training.callback_state``); None without checkpoints.
    """

    def __init__(
        self,
        *,
        steps_per_epoch: int,
        total_steps: int,
        start_step: int,
        checkpointer: Checkpointer | None,
        save_policy: SavePolicy | None,
        preemption: Preemption,
        history: list[dict],
        faults: Faults,
        before_save: Callable[[], Any] | None = None,
        callback_state: Any = None,
    ):
        self.steps_per_epoch = steps_per_epoch
        self.total_steps = total_steps
        self.start = Position(start_step, steps_per_epoch)
        self.checkpointer = checkpointer
        self.save_policy = save_policy
        self.preemption = preemption
        self.history = history
        self.faults = faults
        self.before_save = before_save
        self.callback_state = callback_state
        self.global_step = start_step
        self.epoch = self.start.epoch
        self.steps_run = 0
        self.train_seconds = 0.0
        self._t0: float | None = None
        self._preempt_at_epoch_end = False
        self._progress = Progress()

    # --- events ---------------------------------------------------------------------------
    def on_train_begin(self) -> None:
        """After the user's callbacks saw ``on_train_begin`` (which resets their state)."""
        if self.callback_state is not None:
            self.callback_state.restore()
        self._t0 = time.monotonic()

    def on_epoch_begin(self, epoch: int, *, resumed_mid_epoch: bool = False) -> None:
        """After the loop reset the metrics, before the user's callbacks' ``on_epoch_begin``.
        ``resumed_mid_epoch``: the loop starts inside this epoch; the saved accumulators are put
        back, and the callbacks see the learning rate the epoch began with."""
        self.epoch = epoch
        if resumed_mid_epoch and self.checkpointer is not None:
            self.checkpointer.restore_metrics()
        if self.callback_state is not None:
            self.callback_state.before_epoch_begin(resumed_mid_epoch=resumed_mid_epoch)

    def after_epoch_begin(self) -> None:
        """After the user's callbacks' ``on_epoch_begin``: a resumed epoch goes on with the
        checkpoint's learning rate, whatever they set."""
        if self.callback_state is not None:
            self.callback_state.after_epoch_begin()

    def on_step_end(self, step: int) -> None:
        """After global step ``step`` (counted from the start of the run) finished."""
        previous = self.global_step
        self.steps_run += step - previous
        self.global_step = step
        self._progress.trained(step)  # tells `tfdist launch` that a restart may get further
        self.faults.fire("kill_at_step", step)
        self.faults.fire("term_at_step", step)
        self.faults.fire("stop_at_step", step)
        self.faults.fire("int_at_step", step)
        end_of_epoch = step % self.steps_per_epoch == 0
        by_steps = by_time = False
        if self.save_policy is not None and not end_of_epoch:  # an epoch's last step is saved at epoch end
            by_steps, by_time = self.save_policy.due(step, previous=previous)
        preempt, by_time = self.preemption.check(step, timed=by_time, boundary=by_steps or end_of_epoch)
        if preempt and end_of_epoch:
            self._preempt_at_epoch_end = True  # let the epoch validate and record itself first
        elif by_steps or by_time or preempt:
            self.save()
            if preempt:
                self._stop_preempted(step)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any], *, stopping: bool = False) -> None:
        """``logs``: the epoch's metrics as Python numbers (scalars are recorded). ``stopping``:
        a callback ended the run here (EarlyStopping): this save is its last, and marks it complete,
        so that a run interrupted before its end (preempted at this step, killed) does not train on."""
        self.history.append({k: float(v) for k, v in logs.items() if _is_scalar(v)})
        complete = self.global_step >= self.total_steps or stopping
        self.save(complete=complete)
        if complete:
            return
        if not self._preempt_at_epoch_end:  # a signal during the validation stops at this save, not a step later
            self._preempt_at_epoch_end, _ = self.preemption.check(self.global_step, timed=False, boundary=True)
        if self._preempt_at_epoch_end:
            self._stop_preempted(self.global_step)

    def on_train_end(self, *, stopped_early: bool) -> None:
        """``stopped_early``: a callback ended the run (EarlyStopping): it is complete as it is."""
        self.train_seconds = time.monotonic() - (self._t0 or time.monotonic())
        if not stopped_early or self.checkpointer is None:
            return
        if self.checkpointer.last_saved_step != self.global_step:
            self.save(complete=True)
        else:  # the epoch's end was saved before the callback decided to stop
            self.checkpointer.mark_complete(history=self.history)

    # --- actions --------------------------------------------------------------------------
    def save(self, *, complete: bool = False) -> None:
        """Saves the state after the current global step (every worker calls it at the same step)."""
        if self.checkpointer is None:
            return
        if self.before_save is not None:
            self.before_save()
        position = Position(self.global_step, self.steps_per_epoch)
        self.checkpointer.save(
            global_step=position.global_step,
            epoch=position.epoch,
            step_in_epoch=position.step_in_epoch,
            history=self.history,
            complete=complete,
            callbacks=self.callback_state.capture() if self.callback_state is not None else None,
        )
        self.faults.fire("kill_after_save", self.global_step)

    def _stop_preempted(self, step: int) -> None:
        if self.checkpointer is not None:
            self.checkpointer.sync()
        self.preemption.stop(step, saved=self.checkpointer is not None)


def _is_scalar(value: Any) -> bool:
    import numpy as np

    return np.ndim(value) == 0
