"""Starting a cluster without hanging: ps and worker servers, waiting for peers, a startup watchdog.

A multi-worker or parameter-server strategy blocks (holding the GIL) until every peer has
joined; these helpers make a missing or stuck peer an error that names it instead.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time

from tfdist import env
from tfdist.cluster import PS, WORKER, ClusterSpec, check_address
from tfdist.errors import ClusterConfigError

log = logging.getLogger("tfdist")

CHECK_SECONDS = 5.0
"""How often a serving task looks for the end of the run (``serve(checkpoint_dir=...)``)."""


class _RunEnd:
    """Whether the parameter-server run a task serves is over: the newest checkpoint is complete,
    and either it was not the newest one when the task started (a finished run started again for
    more epochs is not over) or a chief that started since has ended (its writer record says so:
    a finished run started again, which trains nothing); and the chief is no longer listening at
    two looks in a row (it exports the model from the ps tasks after its last save). A serving
    task cannot tell a chief that finished from one being restarted otherwise; where nothing
    stops it (compose, Kubernetes Jobs, Slurm), it would serve until killed, holding its machine.
    Create it before the server starts: a chief can only claim the directory after that."""

    def __init__(self, cluster: ClusterSpec, directory: str):
        from tfdist.cluster import CHIEF

        self._directory, self._chief = directory, cluster.jobs[CHIEF][0]
        self._at_start = self._newest()
        self._writer_at_start = self._writer()
        self._gone = 0

    def _writer(self):
        from tfdist.checkpoint import ownership

        try:
            return ownership.current(self._directory)
        except Exception:  # noqa: BLE001 -- storage unreachable for a moment: not the end of the run
            return None

    def _chief_came_and_ended(self) -> bool:
        writer = self._writer()
        return (writer is not None and writer.ended_at is not None
                and (self._writer_at_start is None or writer.token != self._writer_at_start.token))

    def _newest(self):
        from tfdist.checkpoint import layout

        try:
            metadata = layout.latest_metadata(self._directory)
        except Exception:  # noqa: BLE001 -- storage unreachable for a moment: not the end of the run
            return None
        return None if metadata is None else (metadata.global_step, metadata.saved_at, metadata.complete)

    def over(self) -> bool:
        newest = self._newest()
        if newest is None or not newest[2] or (newest == self._at_start and not self._chief_came_and_ended()):
            self._gone = 0
            return False
        self._gone = 0 if _listening(self._chief) else self._gone + 1
        return self._gone >= 2


def serve(cluster: ClusterSpec, *, checkpoint_dir: str | None = None) -> None:
    """Runs this task's TensorFlow server until the process is stopped (ps and PS workers), by
    SIGTERM, or by Ctrl-C, which raises ``KeyboardInterrupt`` (``tfdist train``: exit 130).

    With the run's ``checkpoint_dir`` it also returns when the run is over: its chief saved a
    complete checkpoint and stopped (``_RunEnd``)."""
    import tensorflow as tf

    if cluster.task_type not in (PS, WORKER):
        raise ClusterConfigError(
            f"Only ps and worker tasks serve; received task {cluster.task_name}. Fix: run training on the chief."
        )
    end = _RunEnd(cluster, checkpoint_dir) if checkpoint_dir is not None else None
    server = tf.distribute.Server(
        tf.train.ClusterSpec(cluster.training_jobs()),
        job_name=cluster.task_type,
        task_index=cluster.task_index,
        protocol=cluster.rpc_layer,
        start=True,
    )
    from tfdist.training import faults

    try:  # from here on a Ctrl-C says the task stopped serving, also while these lines are written
        log.info("parameter_server: serving as %s at %s until stopped", cluster.task_name, cluster.task_address)
        if faults.parse(env.get(env.TFDIST_FAULT), task_name=cluster.task_name):  # a drill that would test nothing
            log.warning("%s names %s, which serves the parameter servers' chief and runs no training loop: its "
                        "faults never fire; name chief:0 (the training loop) instead", env.TFDIST_FAULT,
                        cluster.task_name)
        # Not server.join(): it waits in C++, where a Ctrl-C never reaches Python's handler. Short
        # sleeps: the OS may deliver the signal to one of TensorFlow's threads, which does not wake
        # this one; Python runs the handler when this thread next wakes.
        next_check = time.monotonic() + CHECK_SECONDS
        while True:
            time.sleep(0.5)
            if end is not None and time.monotonic() >= next_check:
                next_check = time.monotonic() + CHECK_SECONDS
                if end.over():
                    log.info("the run in %s is complete and its chief stopped: %s stops serving", checkpoint_dir,
                             cluster.task_name)
                    return
    except KeyboardInterrupt:
        raise KeyboardInterrupt(f"interrupted by Ctrl-C: {cluster.task_name} stopped serving") from None
    finally:
        del server  # referenced until here: a Server that is garbage-collected stops serving


def _split(address: str) -> tuple[str, int]:
    return check_address(address, where="cluster", field="address")


def _listening(address: str, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection(_split(address), timeout=timeout):
            return True
    except OSError:
        return False


def _peers(cluster: ClusterSpec) -> list[tuple[str, str]]:
    """(name, address) of the tasks this one must reach before its strategy can start."""
    return [
        (f"{role}:{index}", address)
        for role, index, address in cluster.tasks()
        if role != "evaluator" and address != cluster.task_address
    ]


def wait_for_peers(cluster: ClusterSpec, timeout: float) -> None:
    """Waits until every peer's port accepts connections; raises PeerUnavailableError naming
    the tasks that did not come up within ``timeout`` seconds.

    TensorFlow blocks (holding the GIL) inside strategy creation until every peer joined,
    so the wait happens here first, in Python. While waiting, this task listens on its own
    port so that its peers see it too; the listener closes before TensorFlow's server binds.
    """
    from tfdist.errors import PeerUnavailableError

    listener = None
    if cluster.task_address is not None:
        try:
            listener = socket.create_server(_split(cluster.task_address), reuse_port=False)
        except OSError:
            listener = None  # the port is taken (e.g. by this task's server already): just probe
    try:
        deadline = time.monotonic() + timeout
        missing = _peers(cluster)
        while missing:
            missing = [(name, address) for name, address in missing if not _listening(address, timeout=0.5)]
            if not missing:
                break
            if time.monotonic() > deadline:
                names = ", ".join(f"{name} ({address})" for name, address in missing)
                start = ("look at the missing tasks' lines above: they exited or failed before serving"
                         if env.launched() else "start every task listed in TF_CONFIG (or use `tfdist launch`)")
                raise PeerUnavailableError(
                    f"the cluster did not come up within {timeout:g} s; missing: {names}. "
                    f"Fix: {start}; raise {env.TFDIST_STARTUP_TIMEOUT} if they start slowly."
                )
            time.sleep(0.2)
    finally:
        if listener is not None:
            listener.close()


_WATCHDOG = r"""
import os, select, signal, sys
parent, timeout, message = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
ready, _, _ = select.select([sys.stdin], [], [], timeout)
if not ready:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
    os.kill(parent, signal.SIGKILL)
"""


class startup_watchdog:
    """Kills this process if the block inside does not finish within ``timeout`` seconds.

    A backstop for a peer that answered ``wait_for_peers`` but never joined: TensorFlow
    then blocks holding the GIL, so no Python thread could act; a tiny watchdog process
    prints the one-line error and sends SIGKILL instead.
    """

    def __init__(self, cluster: ClusterSpec, timeout: float):
        self._cluster, self._timeout = cluster, timeout
        self._proc: subprocess.Popen | None = None

    def __enter__(self):
        names = ", ".join(name for name, _ in _peers(self._cluster)) or "none"
        message = (
            f"tfdist: error: the cluster did not form within {self._timeout:g} s: a peer ({names}) answered but "
            f"never joined. Fix: restart every task (tfdist launch does it); raise {env.TFDIST_STARTUP_TIMEOUT} "
            "if they start slowly."
        )
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(self._timeout), message],
            stdin=subprocess.PIPE, start_new_session=True,
        )
        return self

    def __exit__(self, *exc):
        if self._proc is not None:
            self._proc.stdin.close()  # end of input: the watchdog exits
            self._proc.wait(timeout=10)
        return False
