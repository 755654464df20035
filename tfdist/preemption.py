"""Preemption: SIGTERM and SIGUSR1 become a request to save at the current step and exit.

Slurm sends SIGUSR1 (with ``--signal=USR1@GRACE``) before a time limit; Kubernetes and
most schedulers send SIGTERM and wait a grace period before SIGKILL. The handler only
sets a flag; the training callback saves at the end of the current step and the process
exits with ``tfdist.env.EXIT_PREEMPTED`` (75), which tells ``tfdist launch`` to restart.
"""

from __future__ import annotations

import logging
import signal
import threading
import time

log = logging.getLogger("tfdist")

SIGNALS = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGUSR1", None)) if s is not None)


class Preempted(Exception):
    """Raised by the training callback after the preemption checkpoint is written."""

    def __init__(self, step: int, signal_name: str):
        super().__init__(f"preempted by {signal_name}: saved at step {step}")
        self.step = step
        self.signal_name = signal_name


class PreemptionWatcher:
    """Installs the signal handlers while training runs; ``requested`` tells whether one came."""

    def __init__(self):
        self._event = threading.Event()
        self.signal_name: str | None = None
        self.received_at: float | None = None
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def _handle(self, signum, frame):
        if not self._event.is_set():
            self.signal_name = signal.Signals(signum).name
            self.received_at = time.monotonic()
            log.warning("%s received: saving at the end of the current step, then exiting", self.signal_name)
        self._event.set()

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        else:
            log.warning("tfdist.fit runs outside the main thread: SIGTERM/SIGUSR1 cannot be caught for preemption")
        return self

    def __exit__(self, *exc):
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()
        return False


def any_worker(strategy, flags: list[bool]) -> list[bool]:
    """For each flag, whether it is set on any worker (one small all-reduce).

    Every worker must call this at the same step: a save is a collective under
    multi_worker_mirrored, so all workers must agree to save together.
    """
    import tensorflow as tf

    local = tf.constant([1 if f else 0 for f in flags], tf.int32)
    values = strategy.experimental_distribute_values_from_function(lambda ctx: local)
    total = strategy.reduce(tf.distribute.ReduceOp.SUM, values, axis=None)
    return [bool(v > 0) for v in total.numpy()]
