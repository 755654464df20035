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
"""

from __future__ import annotations

import os
import signal
import sys
import threading

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

