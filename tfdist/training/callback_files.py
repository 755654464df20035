"""The files of the user's callbacks, written by the chief alone.

Under multi_worker_mirrored every worker runs ``fit`` and its callbacks. Keras 3's
``ModelCheckpoint``, ``TensorBoard`` and ``CSVLogger`` know nothing of workers: every worker
writes the same files at the same moment (an HDF5 file lock that fails the job, a ``.keras``
file two writers corrupted, every TensorBoard point twice, every CSV row twice). tf_keras'
``ModelCheckpoint`` and ``TensorBoard`` send a non-chief worker's files to a temporary place;
its ``CSVLogger`` does not.

On a worker that is not the chief, the paths of these callbacks point into a scratch
directory of the task instead. The callbacks still run (a save may read variables that every
worker must read in step), and the scratch directory goes when ``fit`` ends.
"""

from __future__ import annotations

import logging
import shutil
from typing import Any, Sequence

from tfdist import storage
from tfdist.training.callback_state import keras_class

log = logging.getLogger("tfdist")

PATH_ATTRIBUTES = {"ModelCheckpoint": "filepath", "TensorBoard": "log_dir", "CSVLogger": "filename"}
"""The Keras callbacks that write files, and the attribute that names where."""


class ChiefOnlyFiles:
    """Sends the files of ``callbacks`` to a scratch directory of the task ``task_name`` if it is
    not the chief (``is_chief``); ``close`` removes that directory and puts the paths back."""

    def __init__(self, callbacks: Sequence[Any] | None, *, is_chief: bool, task_name: str):
        self.scratch: str | None = None
        self._changed: list[tuple[Any, str, Any]] = []
        writers = [(cb, PATH_ATTRIBUTES[name]) for cb in callbacks or ()
                   if (name := keras_class(cb, tuple(PATH_ATTRIBUTES)))]
        if is_chief or not writers:
            return
        paths = [str(getattr(cb, attribute)) for cb, attribute in writers]
        self.scratch = storage.task_scratch_dir(purpose="callbacks", task_name=task_name,
                                                key="\n".join(storage.absolute(p) for p in paths))
        for i, ((cb, attribute), path) in enumerate(zip(writers, paths)):
            self._changed.append((cb, attribute, getattr(cb, attribute)))
            # The file name stays (a ModelCheckpoint's {epoch:02d} fields are in it): only the folder changes,
            # made here (a CSVLogger opens its file without making its folder).
            folder = storage.join(self.scratch, str(i))
            storage.makedirs(folder)
            setattr(cb, attribute, storage.join(folder, storage.basename(path.rstrip("/")) or "files"))
        log.info("%s is not the chief: the files of its %s go to %s, removed at the end (the chief writes the "
                 "callbacks' files)", task_name, ", ".join(type(cb).__name__ for cb, _ in writers), self.scratch)

    def close(self) -> None:
        for cb, attribute, value in self._changed:
            setattr(cb, attribute, value)
        self._changed = []
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None
