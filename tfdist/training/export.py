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


def save_model(model, path: str, *, cluster=None) -> None:
    """Writes a trained Keras model (Keras 3 or tf_keras) to ``path``, a ``.keras`` file on any
    TensorFlow filesystem (``gs://bucket/model.keras``), atomically.

    Call it on every task that trained, as ``fit`` was: under multi_worker_mirrored, reading the
    model's variables may be a collective that all workers join (tf_keras' ``model.save`` on the
    chief alone fails once the other workers have gone on). The chief's file goes to ``path``;
    the other workers write a temporary file and remove it. ``cluster``: this task's
    ``ClusterSpec`` (default: detected, as ``fit`` does).
    """
    check_name(path, what="path")
    storage.check_supported(path, what="path")
    if cluster is None:
        from tfdist.cluster import detect

        cluster = detect()
    scratch = tempfile.mkdtemp(prefix="tfdist-model-")
    try:
        local = os.path.join(scratch, "model" + SUFFIX)
        model.save(local)
        if cluster.is_chief:
            storage.makedirs(storage.dirname(storage.absolute(path)))
            storage.copy_atomic(local, path)
            log.info("trained model written to %s (%.1f MB; load it with %s.models.load_model)", path,
                     os.path.getsize(local) / 1e6, "tf_keras" if type(model).__module__.startswith("tf_keras") else "keras")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
