"""Output whose reader is gone: ``tfdist train ... | tee log`` stopped by Ctrl-C.

A terminal's Ctrl-C goes to the whole pipeline: ``tee`` dies at once, and the next write of
``tfdist train`` (Keras' progress bar, a log line) raises ``BrokenPipeError`` in the middle of a
step, before the step the Ctrl-C asked to save is saved; the run went back to its last save and
exited 1 with a traceback. While :func:`survive_a_closed_output` holds, a write to a standard
stream whose pipe is closed points that stream's file descriptor at ``/dev/null`` (as Python's
documentation advises for SIGPIPE) and goes on as if written, so the step is saved and the
process exits as a Ctrl-C does. Streams without a file descriptor (a notebook's) are left alone.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Iterator

__all__ = ["survive_a_closed_output"]


class _Survivor:
    """``stream``, whose writes to a closed pipe go to /dev/null from then on."""

    def __init__(self, stream: Any):
        self.stream = stream

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            self._to_devnull()
            return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except BrokenPipeError:
            self._to_devnull()

    def _to_devnull(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self.stream.fileno())
        finally:
            os.close(devnull)
        with contextlib.suppress(BrokenPipeError, ValueError):
            self.stream.flush()  # what the stream still buffered goes to /dev/null too

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding...: the stream's own
        return getattr(self.stream, name)


def _has_descriptor(stream: Any) -> bool:
    try:
        stream.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError and a ValueError
        return False
    return True


@contextlib.contextmanager
def survive_a_closed_output() -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` survive the end of their reader while the block runs."""
    wrapped = {name: _Survivor(getattr(sys, name)) for name in ("stdout", "stderr")
               if not isinstance(getattr(sys, name), _Survivor) and _has_descriptor(getattr(sys, name))}
    for name, survivor in wrapped.items():
        setattr(sys, name, survivor)
    try:
        yield
    finally:
        for name, survivor in wrapped.items():
            if getattr(sys, name) is survivor:
                setattr(sys, name, survivor.stream)
