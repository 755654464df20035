"""Which run writes a checkpoint directory: the one that started last.

Two runs writing one directory at the same time save the same steps over each other, and the
retention policy of each deletes the other's checkpoints. It happens by mistake: the same
command started in a second terminal, a Kubernetes pod replaced while its predecessor still
runs, a Slurm job requeued while the first copy lingers.

The chief of every run that starts records itself in ``DIR/.tfdist-writer.json`` (``claim``):
a random token, its host, its pid and its start time. Before each save it checks that the
record still names it (``check``). A run that finds another run's record stops with
``CheckpointTakenOverError`` before it writes anything, and the newer run goes on. A run
that ends (finished, preempted, failed) marks its record as ended (``release``); the record
stays, so that a frozen run that wakes up after its replacement finished still finds that
another run has written the directory since.

Nothing waits and nothing expires: the record a killed run left never holds up its restart,
on the same host or another. The newer run only says that the previous one did not end
cleanly (killed, or still running, in which case it stops at its next save).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import time
import uuid

from tfdist import storage
from tfdist.checkpoint import layout
from tfdist.errors import CheckpointIOError, CheckpointTakenOverError, describe

log = logging.getLogger("tfdist")


@dataclasses.dataclass(frozen=True)
class Writer:
    """One run's record as the writer of a checkpoint directory.

    Attributes:
      token: random, unique to the run (two processes with the same pid on different hosts differ).
      host: the chief's host name.
      pid: the chief's process id.
      started_at: seconds since the epoch at which the run claimed the directory.
      ended_at: when the run ended (finished, preempted or failed); None while it runs, or if it was killed.
    """

    token: str
    host: str
    pid: int
    started_at: float
    ended_at: float | None = None

    @classmethod
    def this_process(cls) -> "Writer":
        return cls(token=uuid.uuid4().hex, host=socket.gethostname(), pid=os.getpid(), started_at=time.time())

    def describe(self) -> str:
        text = f"pid {self.pid} on {self.host}, started {_clock(self.started_at)}"
        return text + (f", ended {_clock(self.ended_at)}" if self.ended_at is not None else "")

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Writer | None":
        """The record in ``text``; None if it is not one (an unknown or damaged file is no claim)."""
        try:
            data = json.loads(text)
            ended = data.get("ended_at")
            return cls(token=str(data["token"]), host=str(data["host"]), pid=int(data["pid"]),
                       started_at=float(data["started_at"]), ended_at=float(ended) if ended is not None else None)
        except (ValueError, TypeError, KeyError):
            return None


def current(directory: str) -> Writer | None:
    """The run recorded as the writer of ``directory``; None if none is. Raises CheckpointIOError
    if the record cannot be read (a storage outage is not taken for a missing record)."""
    path = layout.writer_path(directory)
    try:
        return Writer.from_json(storage.read_text(path))
    except FileNotFoundError:
        return None
    except OSError as e:
        raise CheckpointIOError(
            f"reading the record of the run that writes {directory!r} failed: {describe(e)}. "
            "Fix: check that the storage is reachable, then restart; the checkpoints were left as they are."
        ) from e


def _record(directory: str, writer: Writer) -> None:
    try:
        storage.write_atomic(layout.writer_path(directory), writer.to_json())
    except Exception as e:  # noqa: BLE001 -- OSError locally, tf.errors.OpError elsewhere
        raise CheckpointIOError(
            f"writing the record of the run that writes {directory!r} failed: {describe(e)}. "
            "Fix: check free space, permissions and that the storage is reachable, then restart; "
            "the checkpoints were left as they are."
        ) from e


def claim(directory: str) -> Writer:
    """Records this process as the writer of ``directory`` and returns its record. A record left
    by another run means that run did not end cleanly; it is logged, then replaced."""
    previous = current(directory)
    writer = Writer.this_process()
    _record(directory, writer)
    if previous is not None and previous.ended_at is None:
        log.info("the run that wrote %s before (%s) did not end cleanly: it was killed, or it is still running and "
                 "stops before its next save; this run writes there now", directory, previous.describe())
    return writer


def check(directory: str, writer: Writer, *, step: int) -> None:
    """Raises CheckpointTakenOverError if another run has claimed ``directory`` since ``writer``
    did (about to save ``step``). A record that vanished is written again."""
    holder = current(directory)
    if holder is None:
        _record(directory, writer)
        return
    if holder.token != writer.token:
        raise CheckpointTakenOverError(
            f"another run started writing the checkpoint directory {directory!r} ({holder.describe()}); this run "
            f"({writer.describe()}) stops without saving step {step}, so that the two do not overwrite or delete "
            "each other's checkpoints. Fix: run one training per checkpoint directory; to run this one as well, "
            "give it its own --output-dir (checkpoint_dir)."
        )


def release(directory: str, writer: Writer) -> None:
    """Marks the record as ended if it still names ``writer`` (a newer run's record is left alone)."""
    try:
        holder = current(directory)
        if holder is not None and holder.token == writer.token:
            _record(directory, dataclasses.replace(writer, ended_at=time.time()))
    except CheckpointIOError as e:  # never raised over the run's own outcome
        log.warning("the record of this run as the writer of %s was not marked as ended (%s); the next run there "
                    "will say that this one did not end cleanly", directory, describe(e))


def _clock(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


__all__ = ["Writer", "current", "claim", "check", "release"]
