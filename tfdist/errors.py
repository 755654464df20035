"""Exceptions raised by tfdist; each message names the input, the value received and the fix.

Each class carries the exit code the command line (and a task launched by ``tfdist launch``)
ends with: ``EXIT_USAGE`` (2) for bad input -- running the same command again fails the
same way, so the launcher does not restart it -- unless the class says otherwise.
"""

from __future__ import annotations

import os
import re
import sys

from tfdist.env import EXIT_FAILED, EXIT_PEER_LOST, EXIT_USAGE


class TfdistError(Exception):
    """Base class of every error tfdist raises on purpose."""

    exit_code = EXIT_USAGE


class ClusterConfigError(TfdistError, ValueError):
    """The cluster description (TF_CONFIG, Slurm variables, flags) is invalid."""


class StrategyError(TfdistError, ValueError):
    """A strategy name or its options are invalid, or do not fit the cluster."""


class BatchSizeError(TfdistError, ValueError):
    """Batch sizes, replicas and accumulation steps do not divide."""


class DataError(TfdistError, ValueError):
    """The training data cannot be read or does not have the expected form."""


class ModelError(TfdistError, TypeError):
    """The model cannot be used: a Keras 3 model, an uncompiled model, a subclassed model..."""


class CheckpointError(TfdistError, RuntimeError):
    """A checkpoint could not be written, read or verified."""


class CheckpointIOError(CheckpointError):
    """Writing or reading checkpoints failed (a full disk, a storage outage, corrupt files);
    a failed save leaves the earlier checkpoints as they were. A restart may succeed."""

    exit_code = EXIT_FAILED


class CheckpointTakenOverError(CheckpointError):
    """Another run started writing the same checkpoint directory; this one stops before its
    next save (``checkpoint.ownership``). Not restarted: a restart would take it back."""


class StorageError(CheckpointError):
    """A checkpoint or output location cannot be used: no TensorFlow filesystem for its
    scheme, not writable, not reachable."""


class CompatibilityError(TfdistError, RuntimeError):
    """A private part of TensorFlow or Keras that tfdist relies on is missing in the installed
    version (``tfdist._compat``); the message names the versions and the tested ones."""


class CheckpointMismatchError(TfdistError, ValueError):
    """The checkpoint in the directory was written by a different run."""


class PeerUnavailableError(TfdistError, RuntimeError):
    """Another task of the cluster died or never came up."""

    exit_code = EXIT_PEER_LOST


class PlanError(TfdistError, ValueError):
    """The inputs of a training plan are invalid."""


class LaunchError(TfdistError, RuntimeError):
    """A local cluster could not be launched."""


_TENSORFLOW_NOISE = re.compile(r"\{\{[^}]*\}\}\s*|\s*\[Op:[^\]]*\]")
"""What TensorFlow puts before and after what names the problem: ``{{function_node ...}}``, ``[Op:...]``."""


_FRAMES_FIRST = ("in user code:", "Graph execution error:")
"""The first lines of TensorFlow's messages that list frames before the error: a traced function's, a graph's."""


def describe(error: BaseException, limit: int = 200) -> str:
    """``Type: reason`` of an exception, for a one-line error (never empty).

    The reason is the message's first line, or the line after the frames where TensorFlow lists
    them first. TensorFlow's function-node prefix and op suffix are left out: they would take the
    room of the reason.
    """
    lines = [line for line in _TENSORFLOW_NOISE.sub("", str(error)).strip().splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    line = lines[0]
    if line.strip() in _FRAMES_FIRST:  # the frames, then the error itself, then the node that raised it
        said = [text for text in lines if text.strip().strip("[]")]
        line = said[-1].strip().removeprefix(f"{type(error).__name__}: ")
    if len(line) > limit and not isinstance(error, TfdistError):  # tfdist's own keep their fix
        line = line[:limit].rsplit(" ", 1)[0] + " ..."
    return f"{type(error).__name__}: {line}"


def install_task_hook() -> None:
    """In a task of a cluster: a tfdist error that ends the program ends it with the error's exit
    code instead of Python's 1, after the usual traceback and one line that names it. Bad input
    (e.g. a refused model in the user's script) exits ``EXIT_USAGE``, so that ``tfdist launch``
    stops instead of restarting in vain; a lost peer ``EXIT_PEER_LOST``, which the launcher and
    the Slurm recipe restart."""
    previous = sys.excepthook

    def hook(kind, value, traceback):
        previous(kind, value, traceback)
        if isinstance(value, TfdistError) and value.exit_code in (EXIT_USAGE, EXIT_PEER_LOST):
            sys.stderr.write(f"tfdist: error: {value}\n")
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(value.exit_code)  # at once: TensorFlow's shutdown can block on a lost peer

    sys.excepthook = hook
