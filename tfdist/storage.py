"""Files and directories on any TensorFlow filesystem: local paths, ``gs://``, ``hdfs://``, ``ram://``...

Every read, write, listing and removal tfdist does in a checkpoint or output directory goes
through this module. A path with a scheme (``gs://bucket/run``) goes through
``tf.io.gfile``, TensorFlow's one API for all of its filesystems; ``os`` and ``open`` on such
a path would silently act on a local folder named ``gs:``. A local path goes through ``os``,
which behaves the same and lets commands such as ``tfdist ckpt list`` answer without
importing TensorFlow.

Writes are atomic where the filesystem allows: a temporary file renamed over the target on
local disks and HDFS; a single object write on object stores (``gs://``, ``s3://``), where a
rename is a copy and an object appears whole or not at all.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import posixpath
import re
import shutil
import tempfile
import uuid

from tfdist.errors import StorageError, describe

WRITE_PROBE_PREFIX = ".tfdist-write-test-"
"""The name of the small file ``check_writable`` writes and removes at once."""
_SCHEME = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*)://")
OBJECT_STORES = ("gs", "s3")
"""Schemes whose single object writes are atomic and whose renames are copies."""


def scheme(path: str) -> str | None:
    """The URL scheme of ``path`` (``gs`` for ``gs://b/x``), or None for a local path."""
    match = _SCHEME.match(os.fspath(path))
    return match.group("scheme").lower() if match else None


def is_url(path: str) -> bool:
    return scheme(path) is not None


def _gfile():
    import tensorflow as tf

    return tf.io.gfile


def join(path: str, *parts: str) -> str:
    """``os.path.join`` for local paths, ``/``-joined for URLs."""
    path = os.fspath(path)
    return posixpath.join(path, *parts) if is_url(path) else os.path.join(path, *parts)


def basename(path: str) -> str:
    path = os.fspath(path)
    return posixpath.basename(path.rstrip("/")) if is_url(path) else os.path.basename(path)


def dirname(path: str) -> str:
    path = os.fspath(path)
    return posixpath.dirname(path.rstrip("/")) if is_url(path) else os.path.dirname(path)


def absolute(path: str) -> str:
    """An absolute, normalized local path; a URL unchanged (``os.path.abspath`` would make
    ``ram://x`` into ``<cwd>/ram:/x``)."""
    path = os.fspath(path)
    return path.rstrip("/") if is_url(path) else os.path.abspath(path)


def check_supported(path: str, *, what: str = "checkpoint_dir") -> None:
    """Raises StorageError if TensorFlow has no filesystem for the scheme of ``path``."""
    name = scheme(path)
    if name is None:
        return
    import tensorflow as tf

    try:
        tf.io.gfile.exists(path)
    except tf.errors.UnimplementedError:
        fix = (
            "install tensorflow-io (`pip install tensorflow-io`), which adds s3:// and more, then import it"
            if name in ("s3", "hdfs", "az", "http", "https")
            else "use a local path or a scheme TensorFlow supports (gs://, hdfs://, ram:// for tests)"
        )
        raise StorageError(
            f"TensorFlow has no filesystem for the scheme {name}://; received {what}={path!r}. Fix: {fix}."
        ) from None
    except tf.errors.OpError as e:  # reachable scheme, other trouble (credentials, ...): name it
        raise StorageError(
            f"cannot reach {path!r} ({describe(e)}); received {what}={path!r}. "
            "Fix: check the path and your credentials for that storage."
        ) from None


def exists(path: str) -> bool:
    return _gfile().exists(path) if is_url(path) else os.path.exists(path)


def isdir(path: str) -> bool:
    return _gfile().isdir(path) if is_url(path) else os.path.isdir(path)


def isfile(path: str) -> bool:
    return exists(path) and not isdir(path)


def makedirs(path: str) -> None:
    if is_url(path):
        _gfile().makedirs(path)
    else:
        os.makedirs(path, exist_ok=True)


def listdir(path: str) -> list[str]:
    """The names (not paths) in directory ``path``, sorted; a sub-directory's name has no trailing ``/``."""
    if is_url(path):
        return sorted(name.rstrip("/") for name in _gfile().listdir(path))
    return sorted(os.listdir(path))


def glob_names(directory: str, pattern: str) -> list[str]:
    """The paths in ``directory`` whose names match the shell ``pattern`` (no recursion), sorted."""
    if not isdir(directory):
        return []
    return [join(directory, name) for name in listdir(directory) if fnmatch.fnmatchcase(name, pattern)]


def size(path: str) -> int:
    """Bytes of a file, or of every file below a directory; 0 if it vanished."""
    try:
        if isdir(path):
            return sum(size(join(path, name)) for name in listdir(path))
        return _gfile().stat(path).length if is_url(path) else os.path.getsize(path)
    except (OSError, _not_found()):
        return 0


def mtime(path: str) -> float | None:
    """Seconds since the epoch of the last change of ``path``; None if unknown (``ram://``, and a
    directory on an object store, report 0)."""
    try:
        seconds = _gfile().stat(path).mtime_nsec / 1e9 if is_url(path) else os.path.getmtime(path)
    except (OSError, _not_found()):
        return None
    return seconds if seconds > 0 else None


def read_bytes(path: str) -> bytes:
    """The content of ``path``; raises OSError (FileNotFoundError if it is missing)."""
    if not is_url(path):
        with open(path, "rb") as f:
            return f.read()
    import tensorflow as tf

    try:
        with tf.io.gfile.GFile(path, "rb") as f:
            return f.read()
    except tf.errors.NotFoundError as e:
        raise FileNotFoundError(2, "No such file", path) from e
    except tf.errors.OpError as e:
        raise OSError(f"{type(e).__name__}: {e}") from e


def read_text(path: str) -> str:
    return read_bytes(path).decode("utf-8")


def write_atomic(path: str, data: str | bytes) -> None:
    """Writes ``data`` to ``path`` so that readers see the old content or the new, never a part."""
    payload = data.encode("utf-8") if isinstance(data, str) else data

    def write(target: str) -> None:
        with (_gfile().GFile(target, "wb") if is_url(target) else open(target, "wb")) as f:
            f.write(payload)

    _replace_atomically(path, write)


def copy_atomic(local: str, path: str) -> None:
    """Copies the local file ``local`` to ``path`` (any filesystem), atomically as ``write_atomic``."""

    def copy(target: str) -> None:
        if is_url(target):
            _gfile().copy(local, target, overwrite=True)
        else:
            shutil.copyfile(local, target)

    _replace_atomically(path, copy)


def _replace_atomically(path: str, write) -> None:
    """``write(target)`` into a temporary file renamed over ``path``; on an object store, into ``path`` itself."""
    if not is_url(path):
        tmp = f"{path}.tmp-{os.getpid()}"
        try:
            write(tmp)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise
        return
    if scheme(path) in OBJECT_STORES:
        write(path)  # one object write: atomic on an object store
        return
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    write(tmp)
    _gfile().rename(tmp, path, overwrite=True)


def rename(source: str, target: str) -> None:
    """Moves ``source`` to ``target`` (replacing it)."""
    if is_url(source):
        _gfile().rename(source, target, overwrite=True)
    else:
        os.replace(source, target)


def remove(path: str) -> None:
    """Removes a file; a file that is already gone is not an error."""
    try:
        if is_url(path):
            _gfile().remove(path)
        else:
            os.remove(path)
    except (FileNotFoundError, _not_found()):
        pass


def rmtree(path: str) -> None:
    """Removes a directory and everything below it; a missing one is not an error."""
    if is_url(path):
        try:
            _gfile().rmtree(path)
        except _not_found():
            pass
    else:
        shutil.rmtree(path, ignore_errors=True)


def check_writable(directory: str, *, what: str = "checkpoint_dir") -> None:
    """Creates ``directory`` and writes and removes a small file there; raises StorageError if
    that fails, naming the directory and the reason."""
    check_supported(directory, what=what)
    reason = _write_probe(directory)
    if reason:
        raise StorageError(
            f"the {what} is not writable; received {what}={directory!r} ({reason}). "
            "Fix: choose a directory you can write to, or fix its permissions."
        )


def check_output_file(path: str, *, what: str) -> None:
    """Refuses, before any work, a file that cannot be written: a name that is a directory, or
    whose folder cannot be made or written to (a file in the way, no permission). Makes the folder."""
    check_supported(path, what=what)
    if isdir(path):
        raise StorageError(f"{what} names a directory, not a file; received {what}={path!r}. Fix: name a file "
                           "in it, or elsewhere.")
    folder = dirname(absolute(path))
    reason = _write_probe(folder)
    if reason:
        raise StorageError(f"{what} cannot be written: its folder {folder!r} is not writable ({reason}); received "
                           f"{what}={path!r}. Fix: name a file in a folder you can write to.")


PROCESS_MEMORY = "ram"
"""The scheme of TensorFlow's in-memory filesystem: each process has its own, gone at its exit."""


def check_shared(path: str, *, what: str, tasks: int) -> None:
    """Refuses a path in one process's memory (``ram://``) for a job of several tasks: each task
    holds its own, so the others never see the chief's checkpoints, and they are gone at its exit."""
    if tasks > 1 and scheme(path) == PROCESS_MEMORY:
        raise StorageError(
            f"{what} is in one process's memory (ram://), which each of the job's {tasks} tasks holds apart and loses "
            f"at its exit; received {what}={path!r}. Fix: use storage every task reaches (gs://..., a shared disk)."
        )


def check_kept(path: str, *, what: str) -> None:
    """Refuses, for a command, a path in its own memory (``ram://``), which is gone when it exits."""
    if scheme(path) == PROCESS_MEMORY:
        raise StorageError(
            f"{what} is in this process's memory (ram://), which is gone when the command exits; received "
            f"{what}={path!r}. Fix: use a local path or storage such as gs://."
        )


def check_output_files(outputs: dict[str, str | None], *, writer: bool) -> None:
    """A command's output files (``{flag: path}``), before any work: kept past the command's
    exit (``check_kept``), and writable (``check_output_file``) on the task that writes them
    (``writer``); the others check only that the storage is supported."""
    for flag, path in outputs.items():
        if not path:
            continue
        check_kept(path, what=flag)
        if writer:
            check_output_file(path, what=flag)
        else:
            check_supported(path, what=flag)


def _write_probe(directory: str) -> str | None:
    """Why ``directory`` cannot be made or written to (after trying), or None."""
    probe = join(directory, f"{WRITE_PROBE_PREFIX}{uuid.uuid4().hex[:8]}")
    try:
        in_the_way = _file_in_the_way(directory)
        if in_the_way is not None:
            return "it is a file" if in_the_way == directory else f"{in_the_way!r} is a file"
        makedirs(directory)
        write_atomic(probe, b"")
        remove(probe)
    except Exception as e:  # noqa: BLE001 -- OSError locally, tf.errors.OpError elsewhere
        return getattr(e, "strerror", None) or describe(e)
    return None


def _file_in_the_way(directory: str) -> str | None:
    """``directory`` or the nearest of its parents that exists, if that is a file (not a folder)."""
    path = directory.rstrip("/") or "/"
    while not exists(path):
        parent = dirname(path)
        if not parent or parent == path:
            return None
        path = parent
    return None if isdir(path) else path


def task_scratch_dir(*, purpose: str, task_name: str, key: str) -> str:
    """An empty local directory for one task's throw-away files (a non-chief worker's checkpoints
    or TensorBoard logs), which the task removes when it ends.

    A task that is killed cannot remove it. Its name is therefore the same for the same user,
    task and run (``key``: what names the run, e.g. its checkpoint directory): the task, started
    again on this machine, empties its predecessor's directory and reuses it, instead of adding
    a copy of the checkpoint to the temporary folder at every kill. Where that name cannot be
    had (another user's file holds it), a fresh temporary directory is used."""
    path = task_scratch_path(purpose=purpose, task_name=task_name, key=key)
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    try:
        os.mkdir(path, 0o700)
    except OSError:
        return tempfile.mkdtemp(prefix=os.path.basename(path) + "-")
    return path


def task_scratch_path(*, purpose: str, task_name: str, key: str) -> str:
    """The path ``task_scratch_dir`` uses for these arguments (nothing is created)."""
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:12]
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return os.path.join(tempfile.gettempdir(), f"tfdist-{purpose}-{uid}-{task_name.replace(':', '-')}-{digest}")


def _not_found() -> type[Exception]:
    """TensorFlow's NotFoundError when TensorFlow is loaded, else an exception never raised."""
    import sys

    tf = sys.modules.get("tensorflow")
    return tf.errors.NotFoundError if tf is not None and hasattr(tf, "errors") else _Never


class _Never(Exception):
    pass
