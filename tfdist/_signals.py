"""Preemption signals outside training: from ``import tfdist`` on, SIGTERM and SIGUSR1 exit with 75.

``fit`` answers these signals itself while it trains: it saves the step it is at and exits
with ``EXIT_PREEMPTED`` (see ``tfdist.training.preemption``). Before that (importing
TensorFlow, start-up, restore, the first trace) and after it, no step is in progress. The
last checkpoint is then the state a restart resumes from, so the process exits at once with
``EXIT_PREEMPTED``: ``tfdist launch`` and the Slurm recipe's script restart it. The signal's
default action would kill it instead (exit 143 or 138), which they do not restart.

``install`` runs as the first statement of ``import tfdist``, so it covers ``tfdist train``
and a user's script from that line on. It replaces only a signal's default action: a handler
the program set stays. Nothing here imports TensorFlow.

``hold`` is a test hook (``TFDIST_TEST_HOLD``): it stops a task at a named moment of its life
until a signal comes, so that a test signals it there without racing a timer.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

from tfdist import env
from tfdist.env import EXIT_PREEMPTED

PREEMPTION_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGUSR1") if hasattr(signal, name))
"""The signals that ask a task to save and exit to be restarted."""


def exit_preempted(signum: int, when: str) -> None:
    """Ends the process at once with ``EXIT_PREEMPTED`` after one line on stderr.

    At once, as a SIGKILL would (which every state of a run survives): an exception raised in a
    signal handler would surface inside whatever TensorFlow call runs, mangled by its bindings.

    Args:
      signum: the signal received.
      when: where the process was, e.g. ``"before training began"``.
    """
    try:
        sys.stdout.flush()
        sys.stderr.write(f"tfdist: {signal.Signals(signum).name} received {when}: exiting with code "
                         f"{EXIT_PREEMPTED} (no step in progress to save; a restart resumes from the last "
                         "checkpoint)\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # a closed stream must not keep the process alive
        pass
    os._exit(EXIT_PREEMPTED)


def _outside_training(signum, frame) -> None:
    exit_preempted(signum, "while tfdist was not training")


def install() -> None:
    """Makes SIGTERM and SIGUSR1 exit with ``EXIT_PREEMPTED`` where their action is the default.

    Only in the main thread (where Python runs handlers), and only over ``SIG_DFL``: a handler the
    program set, or an ignored signal, stays as it is."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in PREEMPTION_SIGNALS:
        if signal.getsignal(signum) is signal.SIG_DFL:
            signal.signal(signum, _outside_training)



HOLD_MOMENTS = ("restore", "first_trace", "final_save")
"""The moments ``hold`` can stop at: restoring a checkpoint, tracing the first training step,
waiting for the run's last save to be written."""
_held: set[str] = set()


def hold(moment: str) -> None:
    """A test hook: holds the process at ``moment`` until a signal comes, when
    ``TFDIST_TEST_HOLD`` names it.

    The value is ``[ROLE:INDEX/]MOMENT``, with ``MOMENT`` one of ``HOLD_MOMENTS``. The process
    prints ``tfdist: TFDIST_TEST_HOLD: held at MOMENT (pid N)`` and waits. SIGTERM, SIGUSR1 or
    SIGINT ends the wait: the handler in place answers it, as it would at that moment. A
    moment holds once a process, and on the first run of a cluster only, as ``TFDIST_FAULT``.

    Args:
      moment: where the caller is, one of ``HOLD_MOMENTS``.
    """
    wanted = env.get(env.TFDIST_TEST_HOLD)
    if wanted is None or moment in _held or env.restart():
        return
    target, _, asked = wanted.rpartition("/")
    if asked != moment or (target and target != _task_name()):
        return
    if threading.current_thread() is not threading.main_thread():
        return
    received: list[int] = []
    signals = (*PREEMPTION_SIGNALS, signal.SIGINT)
    previous = {signum: signal.getsignal(signum) for signum in signals}

    def answer(signum, frame):
        received.append(signum)
        for other, handler in previous.items():
            signal.signal(other, handler)
        handler = previous[signum]
        if callable(handler):
            handler(signum, frame)
        elif handler == signal.SIG_DFL:
            os.kill(os.getpid(), signum)

    try:
        for signum in signals:
            signal.signal(signum, answer)
        _held.add(moment)  # held from here: a signal now ends the wait
        sys.stderr.write(f"tfdist: {env.TFDIST_TEST_HOLD}: held at {moment} (pid {os.getpid()})\n")
        sys.stderr.flush()
        while not received:
            time.sleep(0.02)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _task_name() -> str:
    """``ROLE:INDEX`` of this task from its TF_CONFIG; ``local`` without one."""
    task = json.loads(env.get(env.TF_CONFIG) or "{}").get("task") or {}
    return f"{task.get('type')}:{task.get('index')}" if task else "local"
