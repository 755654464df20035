"""The trained model as a file others read: a Keras file to train on, a SavedModel to serve.

``save_model`` writes one ``.keras`` file (architecture, weights, compile configuration), read back
with the Keras that wrote it (``load_model``, ``tfdist evaluate``). ``export`` writes a SavedModel
directory with a serving signature, what TensorFlow Serving, Vertex AI and TFLite take. Both are
written by the chief alone, atomically, on any TensorFlow filesystem, every worker taking part.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import uuid
from typing import Any, Callable

from tfdist import storage
from tfdist.errors import ModelError, StorageError
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

    def write(scratch: str) -> str:
        local = os.path.join(scratch, "model" + SUFFIX)
        model.save(local)
        return local

    def publish(local: str) -> None:
        storage.makedirs(storage.dirname(storage.absolute(path)))
        storage.copy_atomic(local, path)
        log.info("trained model written to %s (%.1f MB; load it with %s.models.load_model)", path,
                 os.path.getsize(local) / 1e6, keras_of(model).__name__)

    _written_by_the_chief(write, publish, cluster=cluster)


def export(model, path: str, *, cluster=None) -> str:
    """Writes a trained Keras model (Keras 3 or tf_keras) as a SavedModel for serving.

    The directory ``path`` (on any TensorFlow filesystem) gets the model's forward pass as the
    ``serving_default`` signature, with every layer inside the model (preprocessing included).
    ``tf.saved_model.load(path).signatures["serving_default"]`` calls it; TensorFlow Serving,
    Vertex AI and the TFLite converter read it. It holds no optimizer: train on with a ``.keras``
    file (``save_model``).

    Call it on every task that trained, as ``fit`` was: reading the variables may be a collective.
    The chief writes the directory; the other workers write a temporary one and remove it. The
    directory appears whole: it is written beside ``path`` and renamed. Where a rename does not
    move a directory (``gs://``, ``s3://``), ``saved_model.pb`` is written last, and a loader finds
    none before the rest is there. An earlier SavedModel at ``path`` is replaced.

    Args:
      model: the trained model (``history.model`` after ``fit``).
      path: the SavedModel directory, e.g. ``gs://bucket/serving/1`` (TensorFlow Serving reads
        numbered versions in a folder).
      cluster: this task's ``ClusterSpec`` (default: detected, as ``fit`` does).

    Returns:
      ``path``.

    Raises:
      ModelError: ``path`` names a ``.keras`` file.
      StorageError: ``path`` is on a filesystem TensorFlow cannot write, or is a file or a
        directory that holds something other than a SavedModel.
    """
    check_export_path(path, what="path")
    keras = keras_of(model)

    def write(scratch: str) -> str:
        local = os.path.join(scratch, "savedmodel")
        if keras.__name__ == "tf_keras":
            model.export(local)
        else:
            model.export(local, format="tf_saved_model", verbose=False)
        return local

    def publish(local: str) -> None:
        _publish_directory(local, path)
        log.info("SavedModel written to %s (signature serving_default; load it with tf.saved_model.load)", path)

    _written_by_the_chief(write, publish, cluster=cluster)
    return path


SAVED_MODEL_FILE = "saved_model.pb"
"""The file that makes a directory a SavedModel; loaders look for it."""


def check_export_path(path: str, *, what: str = "--export-savedmodel") -> None:
    """Refuses, before any work, a SavedModel directory that cannot be written: a ``.keras`` name,
    an unsupported filesystem, a file, or a directory holding something else (it would be lost)."""
    if path.rstrip("/").endswith(SUFFIX):
        raise ModelError(f"a SavedModel is a directory, not a {SUFFIX} file; received {what}={path!r}. Fix: name a "
                         f"directory such as serving/1, or write a {SUFFIX} file with tfdist.save_model "
                         "(--save-model).")
    storage.check_supported(path, what=what)
    if storage.isfile(path) or (storage.isdir(path) and storage.listdir(path)
                                and not storage.exists(storage.join(path, SAVED_MODEL_FILE))):
        raise StorageError(f"{what} would replace a file or a directory that is not a SavedModel; received "
                           f"{what}={path!r}. Fix: name a new directory, or an earlier SavedModel to replace.")


def _written_by_the_chief(write: Callable[[str], str], publish: Callable[[str], Any], *, cluster) -> None:
    """``write(scratch)`` on every task (reading variables may be a collective), into a local
    scratch directory; the chief then ``publish``es what it returned. The scratch goes at the end."""
    if cluster is None:
        from tfdist.cluster import detect

        cluster = detect()
    scratch = tempfile.mkdtemp(prefix="tfdist-model-")
    try:
        local = write(scratch)
        if cluster.is_chief:
            publish(local)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


_DIRECTORY_RENAMES = (None, "hdfs")
"""The filesystems (None: local) whose rename moves a directory whole; on the others (``gs://``,
``s3://``, ``ram://``) a directory is copied object by object, or not at all."""


def _publish_directory(local: str, path: str) -> None:
    """Copies the local directory ``local`` to ``path`` (any filesystem), whole: into a
    temporary directory beside it, then renamed (an earlier one at ``path`` goes). Where a
    rename does not move a directory, the files go to ``path`` itself, ``saved_model.pb`` last."""
    path = path.rstrip("/")
    storage.makedirs(storage.dirname(storage.absolute(path)))
    if storage.scheme(path) not in _DIRECTORY_RENAMES:
        storage.remove(storage.join(path, SAVED_MODEL_FILE))  # no longer a SavedModel, then emptied
        storage.rmtree(path)
        _copy_tree(local, path)
        return
    token = uuid.uuid4().hex[:8]
    tmp, old = f"{path}.tmp-{token}", f"{path}.old-{token}"
    try:
        _copy_tree(local, tmp)
        replacing = storage.exists(path)
        if replacing:
            storage.rename(path, old)
        storage.rename(tmp, path)
        if replacing:
            storage.rmtree(old)
    except BaseException:
        storage.rmtree(tmp)
        raise


def _copy_tree(local: str, target: str) -> None:
    """Copies every file under the local directory ``local`` to ``target``, ``saved_model.pb`` last."""
    files = []
    for root, _, names in os.walk(local):
        relative = os.path.relpath(root, local)
        folder = target if relative == "." else storage.join(target, *relative.split(os.sep))
        storage.makedirs(folder)
        files += [(os.path.join(root, name), storage.join(folder, name)) for name in names]
    files.sort(key=lambda pair: pair[1] == storage.join(target, SAVED_MODEL_FILE))
    for source, destination in files:
        storage.copy_atomic(source, destination)


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
    """Loads the model of a ``.keras`` file with the Keras that wrote it, Keras 3 or tf_keras.

    The file may be on any TensorFlow filesystem. Import the modules that register your custom
    layers, losses or metrics first.

    Args:
      path: The ``.keras`` file, such as one [`save_model`][tfdist.save_model] wrote: a local path
        or a URL such as ``gs://bucket/run/model.keras``.
      strategy: A ``tf.distribute.Strategy`` whose scope holds the model's variables, so that
        [`evaluate`][tfdist.evaluate] and [`predict`][tfdist.predict] run under it. Defaults to
        None: no strategy.
      what: The name of ``path`` in error messages, such as a command-line flag. Defaults to
        ``"path"``.

    Returns:
      The model, compiled as it was saved.

    Raises:
      ModelError: The file is not a Keras model file, does not exist, or uses a class that is not
        registered.
      StorageError: No TensorFlow filesystem serves the path's scheme.

    Examples:
        ```python
        import keras
        import tfdist

        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        model.compile("adam", "mse")
        tfdist.save_model(model, "model.keras")
        print(tfdist.load_model("model.keras").output_shape)   # (None, 2)
        ```
    """
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
