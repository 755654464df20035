"""A launched task's progress: the first step it trained, written to the file ``tfdist launch`` names.

``tfdist launch`` restarts a failed cluster, except when a task fails the same way twice in a
row before any task trained a step: a restart cannot fix that (see ``tfdist.launch``). It gives
each task a file in ``TFDIST_PROGRESS_FILE``; the training controller tells its ``Progress``
every step it finished, and the first one is written there. Outside a launch nothing is written.
"""

from __future__ import annotations

import os
from typing import Mapping

from tfdist import env


class Progress:
    """Writes the first trained step to ``TFDIST_PROGRESS_FILE``, once per process.

    Args:
      environ: the environment to read the file's name from (default ``os.environ``).
    """

    def __init__(self, environ: Mapping[str, str] | None = None):
        self._path = env.get(env.TFDIST_PROGRESS_FILE, os.environ if environ is None else environ)

    def trained(self, step: int) -> None:
        """Records that global step ``step`` finished (only the first call writes)."""
        if self._path is None:
            return
        path, self._path = self._path, None
        try:
            with open(path, "w") as f:
                f.write(f"{step}\n")
        except OSError:  # the launcher's folder is gone: it has ended, and nothing reads it
            pass


def read(path: str) -> int | None:
    """The step a task wrote to ``path``; None when it trained none (or wrote nothing readable)."""
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None
