"""Preemption: SIGTERM and SIGUSR1 become a request to save at the current step and exit;
Ctrl-C (SIGINT) a request to save there and stop.

Slurm sends SIGUSR1 (with ``--signal=USR1@GRACE``) before a time limit; Kubernetes and
most schedulers send SIGTERM and wait a grace period before SIGKILL. The handler only
sets a flag; the training callback saves at the end of the current step and the process
exits with ``tfdist.env.EXIT_PREEMPTED`` (75), which tells ``tfdist launch`` to restart.

Ctrl-C in a terminal, or a notebook's interrupt, is answered the same way, except that
``fit`` then raises the ``KeyboardInterrupt`` of :func:`interrupted`: nothing trained since
the last save is lost, and the next ``fit`` resumes at that step. The first Ctrl-C puts
the previous handler back, so a second one interrupts at once, as Python's own does.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time

from tfdist import _signals, env
from tfdist.strategy_kinds import wrap

log = logging.getLogger("tfdist")

SIGNALS = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGUSR1", None)) if s is not None)
"""The preemption signals: save, then exit with ``EXIT_PREEMPTED``."""
INTERRUPT = signal.SIGINT
INTERRUPT_NAME = "SIGINT"


class Preempted(Exception):
    """Raised by the training callback after the preemption checkpoint is written."""

    def __init__(self, step: int, signal_name: str, *, saved: bool = True):
        where = (f"saved at step {step}" if saved
                 else f"stopped at step {step}, not saved (no checkpoint_dir): a restart trains from the start")
        super().__init__(f"preempted by {signal_name}: {where}")
        self.step = step
        self.signal_name = signal_name
        self.saved = saved


class PreemptedAfterTheEnd(SystemExit):
    """What ``fit`` raises when a preemption signal came after the run's last step: the exit
    with ``EXIT_PREEMPTED`` it promised (a restart finds the run complete). ``history`` is what
    ``fit`` would have returned, so that a caller that catches it (``tfdist train``, which then
    writes the model file) loses nothing."""

    def __init__(self, history):
        super().__init__(env.EXIT_PREEMPTED)
        self.history = history


def interrupted(step: int, *, saved: bool, complete: bool = False, elsewhere: bool = False) -> KeyboardInterrupt:
    """What ``fit`` raises when Ctrl-C (SIGINT) stopped it at a step boundary, after that step
    was saved: a ``KeyboardInterrupt`` whose message says where, with ``step`` (the global step
    it stopped after) and ``saved`` as attributes.

    Its type is exactly ``KeyboardInterrupt``, not a subclass: Python exits by SIGINT (status
    130 in a shell, which stops a shell loop) only for an uncaught ``KeyboardInterrupt`` itself;
    a subclass would exit with 1, as if the program had handled the Ctrl-C. ``elsewhere``:
    the Ctrl-C reached another worker of the job."""
    if complete:
        what = f"after the run completed at step {step}"
    elif saved:
        what = f"at step {step}, saved there: running again resumes at that step"
    else:
        what = f"at step {step}, not saved (no checkpoint_dir)"
    error = KeyboardInterrupt(f"interrupted by {INTERRUPT_NAME}{' on another worker' if elsewhere else ''} {what}")
    error.step, error.saved = step, saved
    return error


def _at_once() -> KeyboardInterrupt:
    return KeyboardInterrupt("interrupted by Ctrl-C (SIGINT) while already stopping: stopped at once, without saving "
                             "the current step; running again resumes from the last checkpoint")


class _SignalHandlers:
    """Signal handlers installed for a ``with`` block; the previous ones come back at its end. By
    default the block's ``_on_signal`` answers the preemption signals (in the main thread only,
    where Python runs handlers)."""

    def __init__(self):
        self._previous: dict[int, object] = {}

    def _on_signal(self, signum, frame):
        raise NotImplementedError

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._install(sig, self._on_signal)
        return self

    def _install(self, sig: int, handler) -> None:
        self._previous[sig] = signal.signal(sig, handler)

    def __exit__(self, *exc):
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()
        return False


class SetupSignals(_SignalHandlers):
    """While ``fit`` sets up (strategy, model, restore, datasets: nothing trained yet that a save
    could keep), a preemption signal ends the task at once with ``EXIT_PREEMPTED``, so that it is
    restarted, instead of being lost or waiting for the first step. ``PreemptionWatcher`` takes
    over when training begins."""

    def _on_signal(self, signum, frame):
        _signals.exit_preempted(signum, "before training began")


class DeferredSignals(_SignalHandlers):
    """After training, while the caller writes what a complete run produced (``tfdist train``'s
    model file and summary): a preemption signal is noted instead of killing the process half-way
    through the write (exit 143, the write's scratch files left behind); ``received`` names it.
    The run is complete and saved, so the write finishes and the process ends as it would have."""

    def __init__(self):
        super().__init__()
        self.received: str | None = None

    def _on_signal(self, signum, frame):
        if self.received is None:
            self.received = signal.Signals(signum).name
            log.warning("%s received after the run completed: finishing writing its results, then exiting",
                        self.received)


class PreemptionWatcher(_SignalHandlers):
    """Installs the signal handlers while training runs; ``requested`` tells whether one came."""

    def __init__(self):
        super().__init__()
        self._event = threading.Event()
        self.signal_name: str | None = None
        self.received_at: float | None = None
        self._warned = False

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    @property
    def interrupted(self) -> bool:
        """Whether the request is Ctrl-C's (stop) rather than a preemption's (exit to be restarted)."""
        return self.signal_name == INTERRUPT_NAME

    def _on_signal(self, signum, frame):
        if not self._event.is_set():
            self.signal_name = signal.Signals(signum).name
            self.received_at = time.monotonic()
            log.warning("%s received: saving at the end of the current step, then exiting", self.signal_name)
        self._event.set()

    def _handle_interrupt(self, signum, frame):
        # The handler stays until the block ends (no swap of handlers that a quick second Ctrl-C
        # could run into), and the flag is set before anything else.
        if self._event.is_set():  # already stopping (a first Ctrl-C, or a preemption): stop now
            previous = self._previous.get(INTERRUPT)
            if callable(previous) and previous is not signal.default_int_handler:
                return previous(signum, frame)  # the handler the program had answers the second one
            raise _at_once()
        self.signal_name = INTERRUPT_NAME
        self.received_at = time.monotonic()
        self._event.set()
        if sys.stdout.isatty():  # end the progress bar's line, which Keras rewrites in place
            sys.stdout.write("\n")
            sys.stdout.flush()
        log.warning("Ctrl-C (SIGINT): saving at the end of the current step, then stopping; press Ctrl-C again to "
                    "stop at once (losing the steps since the last save)")

    def __enter__(self):
        super().__enter__()
        if threading.current_thread() is threading.main_thread():
            if signal.getsignal(INTERRUPT) is not signal.SIG_IGN:  # an ignored Ctrl-C stays ignored
                self._install(INTERRUPT, self._handle_interrupt)
        elif not self._warned:  # entered again while the last save is written: said once
            self._warned = True
            log.warning("tfdist.fit runs outside the main thread: SIGTERM/SIGUSR1 cannot be caught for preemption")
        return self


AGREE_PERIOD_SECONDS = 1.0
"""How often the workers of a multi-worker job compare their flags (about once a second)."""
MAX_AGREE_INTERVAL = 10_000


def sum_over_workers(strategy, values: list[int]) -> list[int]:
    """Each value summed over the workers: the strategy's ``sum_over_workers``. Every worker must
    call it at the same step."""
    return wrap(strategy).sum_over_workers(values)


def agree_interval(*, steps: int, seconds: float, period: float = AGREE_PERIOD_SECONDS) -> int:
    """Steps until the next agreement, so that agreements come about every ``period`` seconds."""
    if steps <= 0 or seconds <= 0:
        return 1
    return int(min(MAX_AGREE_INTERVAL, max(1, period * steps / seconds)))


class Agreement:
    """Lets the workers of a multi-worker job act together on flags only some of them see.

    A preemption signal may reach one worker, and time-based saves depend on each worker's
    clock; but a save is a collective under multi_worker_mirrored, so every worker must
    decide to save at the same step. The workers compare their flags with one small
    all-reduce at agreed steps, about once every ``period`` seconds (an all-reduce per step
    would cost a quarter of a small model's step): the chief proposes the next agreement
    step from the measured step time, in the same all-reduce. Between agreements no worker
    acts on its flags, so a signal is answered within about ``period`` seconds.

    Steps are not all alike (saves, validation, a slow input pipeline at first), so the
    interval at most doubles from one agreement to the next, and callers also agree at the
    steps where every worker pauses anyway (a save by step count, an epoch's end): an
    estimate made on a few fast steps cannot postpone a signal past them.
    """

    def __init__(self, strategy, *, is_chief: bool, period: float | None = None):
        self._strategy = wrap(strategy)
        self._is_chief = is_chief
        self._period = AGREE_PERIOD_SECONDS if period is None else period
        self._next_step: int | None = None  # None: at the first step
        self._last: tuple[int, float] | None = None
        self._interval = 1

    def due(self, step: int) -> bool:
        return self._next_step is None or step >= self._next_step

    def agree(self, step: int, flags: list[bool]) -> list[bool]:
        """For each flag, whether any worker has it set. Call it on every worker at the same
        steps: those where ``due(step)``, and any others all workers choose alike."""
        now = time.monotonic()
        proposal = 0
        if self._is_chief:
            proposal = 1 if self._last is None else min(2 * self._interval, agree_interval(
                steps=step - self._last[0], seconds=now - self._last[1], period=self._period))
        *totals, interval = sum_over_workers(self._strategy, [1 if f else 0 for f in flags] + [proposal])
        self._interval = max(1, interval)
        self._next_step = step + self._interval
        self._last = (step, now)
        return [total > 0 for total in totals]


class Preemption:
    """Answers a preemption request at a step boundary, in the way of Orbit's
    ``save_checkpoint_if_preempted``: decide (together, under multi-worker), then the caller
    saves, then ``stop`` raises ``Preempted`` (``KeyboardInterrupt`` for Ctrl-C).

    ``agreement`` is given when several processes run the steps: a save is then a
    collective, so flags that can differ between workers (a signal, a clock) are acted on
    only at agreed steps, by every worker together.
    """

    def __init__(self, *, watcher: PreemptionWatcher, agreement: Agreement | None = None):
        self.watcher = watcher
        self.agreement = agreement
        self._as_interrupt = False  # stop as Ctrl-C: one came (anywhere, when agreed) and no preemption

    def check(self, step: int, *, timed: bool, boundary: bool = False) -> tuple[bool, bool]:
        """(stop, timed): whether to stop (for preemption or Ctrl-C) and whether a timed save is
        due, as every worker sees it at ``step``. ``boundary``: a step where every worker pauses
        anyway (the same on all of them): the workers agree there too."""
        requested = self.watcher.requested
        if self.agreement is None:
            self._as_interrupt = self.watcher.interrupted
            return requested, timed
        if not (boundary or self.agreement.due(step)):
            return False, False
        interrupt = requested and self.watcher.interrupted
        preempt, interrupt, timed = self.agreement.agree(step, [requested and not interrupt, interrupt, timed])
        # A Ctrl-C on any worker stops every worker as Ctrl-C does, unless one was preempted:
        # then the job is to be restarted, and every worker exits with EXIT_PREEMPTED.
        self._as_interrupt = interrupt and not preempt
        return preempt or interrupt, timed

    def stop(self, step: int, *, saved: bool) -> None:
        """Raises Preempted, or for Ctrl-C a KeyboardInterrupt (call it after the state of ``step``
        is saved; ``saved``: whether there is a checkpoint to resume from)."""
        if self._as_interrupt:
            raise interrupted(step, saved=saved, elsewhere=not self.watcher.interrupted)
        raise Preempted(step, self.watcher.signal_name or "another worker's signal", saved=saved)
