"""The trained model as one Keras file (``.keras``: architecture, weights, compile configuration),
written atomically on any TensorFlow filesystem -- what ``tfdist train`` leaves for serving or
further use, next to the checkpoints that only tfdist reads back -- and read back with the Keras
that wrote it (``tfdist evaluate``)."""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile

from tfdist import storage
from tfdist.errors import ModelError
from tfdist.training.keras_common import keras_of

log = logging.getLogger("tfdist")

SUFFIX = ".keras"


def check_name(path: str, *, what: str = "--save-model", reading: bool = False) -> None:
    """Refuses a file name Keras cannot write a model to, or (``reading``) that is no Keras model
    file (no TensorFlow is imported)."""
    if not path.endswith(SUFFIX) or storage.basename(path) == SUFFIX:
        if reading:
            checkpoints = ("" if not _is_checkpoint(path) else
                           " A checkpoint holds no model architecture: while a run trains, an evaluator task scores "
                           "each of its checkpoints (tfdist launch --evaluator), and the run writes OUTPUT_DIR/model"
                           f"{SUFFIX} when it ends.")
            raise ModelError(f"tfdist reads Keras model files, whose name ends in {SUFFIX}; received {what}={path!r}. "
                             f"Fix: pass the {SUFFIX} file that tfdist train or tfdist.save_model wrote (a model in "
                             f"another format: load it with Keras and save it as {SUFFIX}).{checkpoints}")
        raise ModelError(f"the trained model is written as a Keras file, whose name ends in {SUFFIX}; received "
                         f"{what}={path!r}. Fix: name a file such as model{SUFFIX}.")


def _is_checkpoint(path: str) -> bool:
    """Whether ``path`` names a checkpoint, a checkpoint directory or a run's output directory."""
    from tfdist.checkpoint import layout

    path = path.rstrip("/")
    try:
        return storage.exists(layout.index_path(path)) or any(
            storage.exists(layout.state_path(d)) for d in (path, layout.checkpoint_dir_of(path)))
    except OSError:
        return False


def save_model(model, path: str, *, cluster=None) -> None:
    """Writes a trained Keras 3 or tf_keras model to one ``.keras`` file, atomically.

    Call it on every task that trained, as ``fit`` is. Under multi_worker_mirrored, reading the
    model's variables may be a collective that every worker joins. The chief writes the file. The
    other tasks write a temporary file and remove it.

    Args:
      model: The trained model, such as ``history.model``.
      path: The ``.keras`` file, on any TensorFlow filesystem, such as ``gs://bucket/model.keras``.
      cluster: This task's [`ClusterSpec`][tfdist.ClusterSpec]. Defaults to None: detected, as
        ``fit`` does.

    Raises:
      ModelError: The path does not end in ``.keras``.
      StorageError: The path's filesystem is not one TensorFlow can open.

    Examples:
        ```python
        import keras
        import tfdist

        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        tfdist.save_model(model, "models/model.keras")
        print(keras.models.load_model("models/model.keras").output_shape)   # (None, 2)
        ```
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
                     os.path.getsize(local) / 1e6, keras_of(model).__name__)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def keras_of_file(local: str) -> str:
    """``keras`` or ``tf_keras``: the Keras that wrote a local ``.keras`` file (its metadata says
    which version); a file that is not one is a ModelError."""
    import json
    import zipfile

    try:
        with zipfile.ZipFile(local) as archive:
            version = str(json.loads(archive.read("metadata.json")).get("keras_version", ""))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as e:
        raise ModelError(f"not a Keras model file: it holds no Keras metadata ({type(e).__name__}). Fix: pass the "
                         f"{SUFFIX} file that tfdist train (OUTPUT_DIR/model{SUFFIX}), tfdist.save_model or "
                         "model.save wrote.") from None
    return "keras" if version.split(".")[0] not in ("", "2") else "tf_keras"


def load_model(path: str, *, strategy=None, what: str = "path"):
    """The model of a ``.keras`` file on any TensorFlow filesystem, loaded with the Keras that wrote
    it (Keras 3 or tf_keras), its variables created in ``strategy``'s scope (default: none)."""
    check_name(path, what=what, reading=True)
    storage.check_supported(path, what=what)
    if not storage.isfile(path):
        raise ModelError(f"no such model file; received {what}={path!r}. Fix: pass the {SUFFIX} file that tfdist "
                         f"train (OUTPUT_DIR/model{SUFFIX}) or tfdist.save_model wrote.")
    if not storage.is_url(path):
        return _load_local(path, path, strategy)
    scratch = tempfile.mkdtemp(prefix="tfdist-model-")
    try:  # Keras reads local files
        local = os.path.join(scratch, "model" + SUFFIX)
        with open(local, "wb") as f:
            f.write(storage.read_bytes(path))
        return _load_local(local, path, strategy)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _load_local(local: str, path: str, strategy):
    """The model of the local file ``local`` (a copy of ``path``, named in errors and the log)."""
    import contextlib
    import importlib

    try:
        keras = importlib.import_module(keras_of_file(local))
    except ModelError as e:
        raise ModelError(f"{path!r} is {e}") from None
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        try:
            model = keras.models.load_model(local)
        except (TypeError, ValueError) as e:
            missing = re.search(r"(?:Could not locate|Unknown) (?:class|function|layer|loss|metric)[^']*'([^']+)'",
                                str(e))
            if missing is None:
                raise
            raise ModelError(
                f"{path!r} uses {missing.group(1)!r}, a class or function that is not loaded. Fix: import the module "
                "that defines "
                "and registers it (@keras.saving.register_keras_serializable) first: --import MODULE on the command "
                "line (a module on PYTHONPATH or in the current directory), or import it before tfdist.load_model."
            ) from None
    log.info("model %s loaded from %s (%s)", model.name, path, keras.__name__)
    return model
