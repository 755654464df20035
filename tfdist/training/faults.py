"""Fault injection: ``TFDIST_FAULT`` makes a task kill itself at a chosen point of training.

It exists to test and drill recovery without racing timers. The value is a comma-separated
list of ``[ROLE:INDEX/]EVENT:STEP`` items:

* ``kill_at_step:N``     SIGKILL right after global step N finished (nothing is saved).
* ``kill_after_save:N``  SIGKILL right after the save at step N was started: with
                         asynchronous saves the background write is still in flight.
* ``term_at_step:N``     SIGTERM to itself after step N: the preemption path.
* ``stop_at_step:N``     SIGSTOP to itself after step N: a frozen task (a paused VM, a pod cut
                         off), which goes on where it stopped when it receives SIGCONT.
* ``int_at_step:N``      SIGINT to itself after step N: Ctrl-C.

A fault fires at the first step end the training loop reports at or after N: step N itself,
except with ``steps_per_execution=k``, where the loop reports every k-th step only (and
``kill_after_save:N`` fires after the first save at or after step N). With a
``ROLE:INDEX/`` prefix only that task fires. A fault fires on the first run of a cluster
(``TFDIST_RESTART`` unset or 0) only, so that a restarted job runs to the end; an ``@R``
suffix (``term_at_step:18@1``) makes it fire on restart R instead, so that one job can meet
several faults in turn.
"""

from __future__ import annotations

import logging
import os
import signal
import sys

from tfdist import env
from tfdist.errors import ClusterConfigError

log = logging.getLogger("tfdist")

EVENTS = {"kill_at_step": signal.SIGKILL, "kill_after_save": signal.SIGKILL, "term_at_step": signal.SIGTERM,
          "stop_at_step": signal.SIGSTOP, "int_at_step": signal.SIGINT}


def parse(raw: str | None, *, task_name: str, restart: int | None = None) -> dict[tuple[str, int], int]:
    """{(event, step): signal} of the faults that apply to ``task_name`` (and, unless ``restart``
    is None, to that run of the cluster: 0 the first)."""
    faults: dict[tuple[str, int], int] = {}
    for item in (raw or "").split(","):
        item = item.strip()
        if not item:
            continue
        target, _, spec = item.rpartition("/")
        event, _, when = spec.partition(":")
        step, _, run = when.partition("@")
        if event not in EVENTS or not step.isdigit() or not (run or "0").isdigit():
            raise ClusterConfigError(
                f"invalid {env.TFDIST_FAULT} item; received {item!r}. "
                f"Fix: write [ROLE:INDEX/]EVENT:STEP[@RESTART] with EVENT one of {', '.join(EVENTS)}."
            )
        if (target and target != task_name) or (restart is not None and int(run or 0) != restart):
            continue
        faults[(event, int(step))] = EVENTS[event]
    return faults


class Faults:
    """The faults of this task; ``fire`` is called by the training loop at each event.
    ``start_step``: where this run starts or resumes; faults of steps up to it belong to the
    part of the run already done, and never fire."""

    def __init__(self, *, task_name: str, start_step: int = 0, environ=None):
        environ = os.environ if environ is None else environ
        faults = parse(env.get(env.TFDIST_FAULT, environ), task_name=task_name, restart=env.restart(environ))
        self._faults = {key: sig for key, sig in faults.items() if key[1] > start_step}

    def fire(self, event: str, step: int) -> None:
        """Fires ``event``'s fault of step ``step``, or of an earlier step that was never
        reported: with ``steps_per_execution=k`` the loop reports only every k-th step."""
        due = [asked for (name, asked) in self._faults if name == event and asked <= step]
        if not due:
            return
        for asked in due:
            del self._faults[(event, asked)]
        sig = EVENTS[event]
        late = f" (asked for step {max(due)}: the first step end reported at or after it)" if max(due) != step else ""
        sys.stderr.write(f"tfdist: {env.TFDIST_FAULT}: {event} at step {step}{late}: sending "
                         f"{signal.Signals(sig).name} to itself\n")
        sys.stderr.flush()
        os.kill(os.getpid(), sig)
