"""A TensorBoard profile of chosen training steps, written by the chief (``fit(profile_steps=...)``).

The profile goes where the run's ``TensorBoard`` callback writes, under ``LOG_DIR/train``, as
Keras' own ``TensorBoard(profile_batch=...)`` puts it: TensorBoard's Profile tab shows it.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

from tfdist import _checks
from tfdist.errors import ModelError
from tfdist.training.callback_state import keras_class

log = logging.getLogger("tfdist")

_FIX = "pass the first and last global step to profile, e.g. profile_steps=(10, 20) (--profile-steps 10,20)"


def check_steps(profile_steps: Any, callbacks: Sequence[Any] | None) -> tuple[int, int] | None:
    """``(first, last)``, the global steps (from 1) to profile; an int profiles one step. Refuses
    steps that cannot be profiled, and steps without a TensorBoard in ``callbacks`` to write to."""
    if profile_steps is None:
        return None
    steps = (profile_steps, profile_steps) if _checks.is_int(profile_steps) else profile_steps
    if (not isinstance(steps, (tuple, list)) or len(steps) != 2 or not all(_checks.is_int(s) for s in steps)
            or not 1 <= steps[0] <= steps[1]):
        raise ModelError(f"Invalid `profile_steps`; received profile_steps={profile_steps!r}. Fix: {_FIX}, the "
                         "first at least 1 and not after the last.")
    if tensorboard_of(callbacks) is None:
        raise ModelError(f"profile_steps={profile_steps!r} writes a TensorBoard profile into the log directory of a "
                         "TensorBoard callback; received none in callbacks. Fix: add keras.callbacks.TensorBoard("
                         "log_dir=...) to callbacks (tfdist train has one).")
    return int(steps[0]), int(steps[1])


def tensorboard_of(callbacks: Sequence[Any] | None) -> Any:
    """The first TensorBoard callback (either Keras) in ``callbacks``, or None."""
    return next((cb for cb in callbacks or () if keras_class(cb, ("TensorBoard",))), None)


def profiler(profile_steps: tuple[int, int] | None, callbacks: Sequence[Any] | None, *, steps_per_epoch: int,
             start_step: int, is_chief: bool) -> list:
    """The callback that profiles ``profile_steps`` (checked by :func:`check_steps`) on the chief,
    writing into the log directory of the TensorBoard in ``callbacks``; an empty list elsewhere,
    or without steps left to profile."""
    if profile_steps is None or not is_chief:
        return []
    first, last = profile_steps
    if last <= start_step:
        log.info("profile_steps=(%d, %d): the run resumes after step %d, past them; nothing is profiled", first, last,
                 start_step)
        return []
    from tfdist import storage

    log_dir = storage.join(str(tensorboard_of(callbacks).log_dir), "train")  # where Keras' own profile_batch writes
    return [_profiler_class()(log_dir, first=max(first, start_step + 1), last=last, steps_per_epoch=steps_per_epoch)]


def _profiler_class() -> type:
    from tfdist.callbacks import either_keras_callback

    class StepProfiler(either_keras_callback()):
        """Starts TensorFlow's profiler before global step ``first`` and stops it after ``last``."""

        def __init__(self, log_dir: str, *, first: int, last: int, steps_per_epoch: int):
            super().__init__()
            self.log_dir, self.first, self.last, self.steps_per_epoch = log_dir, first, last, steps_per_epoch
            self._epoch = 0
            self._running = False
            self._done = False

        def on_epoch_begin(self, epoch, logs=None):
            self._epoch = epoch

        def _step(self, batch: int) -> int:
            return self._epoch * self.steps_per_epoch + batch + 1

        def on_train_batch_begin(self, batch, logs=None):
            if not self._running and not self._done and self.first <= self._step(batch) <= self.last:
                import tensorflow as tf

                tf.profiler.experimental.start(self.log_dir)
                self._running = True
                log.info("profiling steps %d to %d into %s", self._step(batch), self.last, self.log_dir)

        def on_train_batch_end(self, batch, logs=None):
            if self._running and self._step(batch) >= self.last:
                self._stop()

        def on_train_end(self, logs=None):
            self.close()

        def close(self) -> None:
            """Stops a profile still running (training ended early, or failed)."""
            if self._running:
                self._stop()

        def _stop(self) -> None:
            import tensorflow as tf

            tf.profiler.experimental.stop()
            self._running, self._done = False, True
            log.info("profile written to %s (TensorBoard: its Profile tab)", self.log_dir)

    return StepProfiler
