"""The trained model as one Keras file (``.keras``: architecture, weights, compile configuration),
written atomically on any TensorFlow filesystem -- what ``tfdist train`` leaves for serving or
further use, next to the checkpoints that only tfdist reads back."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile

from tfdist import storage
from tfdist.errors import ModelError

log = logging.getLogger("tfdist")

SUFFIX = ".keras"


def check_name(path: str, *, what: str = "--save-model") -> None:
    """Refuses a file name Keras cannot write a model to (no TensorFlow is imported)."""
    if not path.endswith(SUFFIX) or storage.basename(path) == SUFFIX:
        raise ModelError(f"the trained model is written as a Keras file, whose name ends in {SUFFIX}; received "
                         f"{what}={path!r}. Fix: name a file such as model{SUFFIX}.")


def save_model(model, path: str, *, is_chief: bool) -> None:
    """Writes ``model`` to ``path``. Every task that trained calls it: under multi_worker_mirrored
    reading a variable may be a collective that all workers join (TensorFlow's rule for saving
    there); the chief's file goes to ``path``, the others' to a temporary file, removed."""
    scratch = tempfile.mkdtemp(prefix="tfdist-model-")
    try:
        local = os.path.join(scratch, "model" + SUFFIX)
        model.save(local)
        if is_chief:
            storage.makedirs(storage.dirname(storage.absolute(path)))
            storage.copy_atomic(local, path)
            log.info("trained model written to %s (%.1f MB; load it with %s.models.load_model)", path,
                     os.path.getsize(local) / 1e6, "tf_keras" if type(model).__module__.startswith("tf_keras") else "keras")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
