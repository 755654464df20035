"""Looking into a checkpoint directory: list its checkpoints, inspect one, verify their bytes.

These functions only read. ``list_checkpoints`` needs nothing but the file system and the
``checkpoint`` state file; ``inspect_checkpoint`` and ``verify_checkpoint`` open the
checkpoint with TensorFlow, which checks every tensor's CRC32C as it reads it. The bundle
index is also parsed here (a LevelDB table of ``BundleEntryProto``) so that a problem names
the data shard it is in: a truncated shard, a missing shard, the shard of an unreadable tensor.
"""

from __future__ import annotations

import dataclasses
import os
import struct
from typing import Any

from tfdist import storage
from tfdist.checkpoint import layout
from tfdist.errors import CheckpointError, describe


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    """One checkpoint of a directory, or a group of checkpoint-like files the state file does not name.

    Attributes:
      path: the checkpoint prefix (``DIR/ckpt-8``), or the leftover file or folder.
      global_step, epoch, step_in_epoch: from the metadata (the step also from the name).
      saved_at: seconds since the epoch, from the metadata's ``saved_at``, else the newest file's mtime.
      size_bytes: the index and data files together (for leftovers: all their files).
      complete: the metadata's ``complete`` flag (the run had finished); None without metadata.
      listed: whether the ``checkpoint`` state file names it, i.e. whether its save finished.
      problem: why it is not a usable checkpoint, or what is missing; None when nothing is seen wrong.
      files: the files that belong to it.
      kept: a complete checkpoint older than every listed one, with its metadata: one that
        ``keep_every_hours`` keeps (TensorFlow's manager stops listing those).
    """

    path: str
    global_step: int | None
    epoch: int | None
    step_in_epoch: int | None
    saved_at: float | None
    size_bytes: int
    complete: bool | None
    listed: bool
    problem: str | None
    files: tuple[str, ...]
    kept: bool = False

    def to_json(self) -> dict[str, Any]:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return dict(fields, files=list(self.files))


@dataclasses.dataclass(frozen=True)
class Verification:
    """The result of reading one checkpoint back: ``ok``, or the ``problem`` in one line."""

    path: str
    ok: bool
    problem: str | None
    tensors: int = 0
    bytes_read: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "ok": self.ok, "problem": self.problem, "verified": True}


# --- finding checkpoints -------------------------------------------------------------------
def checkpoint_dir(path: str) -> str:
    """The checkpoint directory ``path`` names: itself, or the ``checkpoints`` folder inside a
    run's output directory (``tfdist train --output-dir``) when it has no state file of its own."""
    path = storage.absolute(path)
    inner = layout.checkpoint_dir_of(path)
    if storage.isdir(inner) and not storage.exists(layout.state_path(path)) and not _leftovers_exist(path):
        return inner
    return path


def _leftovers_exist(directory: str) -> bool:
    return storage.isdir(directory) and any(layout.parse_file_name(n) for n in storage.listdir(directory))


def _check_directory(directory: str, *, prefixes: bool = True) -> None:
    """``prefixes``: whether the command also takes a checkpoint prefix (inspect, verify; not list)."""
    if not prefixes:
        prefix = layout.strip_file_suffix(directory)
        if storage.exists(layout.index_path(prefix)) or (prefix != directory and storage.isfile(directory)):
            parent = storage.dirname(prefix) or "."
            raise CheckpointError(
                f"`list` takes a checkpoint directory; received the checkpoint {directory!r}. "
                f"Fix: list its directory (tfdist ckpt list {parent}), or look into it (tfdist ckpt inspect {prefix})."
            )
    if not storage.exists(directory):
        if storage.scheme(directory) == storage.PROCESS_MEMORY:
            raise CheckpointError(
                f"the checkpoint directory does not exist in this process's memory (ram://), which is its own: a "
                f"run's ram:// checkpoints are in the memory of the process that ran it; received {directory!r}. Fix: "
                "look into them from that process (tfdist.checkpoint.inspect, or tfdist.cli.main(['ckpt', ...])), or "
                "save to a local path or storage such as gs://."
            )
        raise CheckpointError(
            f"the checkpoint directory does not exist; received {directory!r}. "
            "Fix: pass the checkpoint_dir of a run (the folder holding the `checkpoint` state file) or its output directory."
        )
    if not storage.isdir(directory):
        also = ", or a checkpoint prefix such as DIR/ckpt-8" if prefixes else ""
        raise CheckpointError(
            f"the checkpoint directory is not a directory; received {directory!r}. "
            f"Fix: pass the folder holding the `checkpoint` state file{also}."
        )


def _listed_paths(directory: str) -> list[str]:
    """The checkpoints the state file names, oldest first; [] without a state file that names one
    (deleted, emptied, damaged, written over: `list` shows the checkpoints found beside it)."""
    return [_normalized(p) for p in layout.checkpoint_paths(directory, listed_only=True)]


def _readable_paths(directory: str) -> list[str]:
    """The checkpoints to inspect or verify: those the state file names, else the complete ones
    found beside it (index and metadata), which a run started there would resume from."""
    return [_normalized(p) for p in layout.checkpoint_paths(directory)]


def _normalized(path: str) -> str:
    return path if storage.is_url(path) else os.path.normpath(path)


def _no_checkpoint_error(directory: str, leftovers: list[CheckpointInfo]) -> CheckpointError:
    found = f"; only incomplete files: {', '.join(storage.basename(c.path) for c in leftovers)}" if leftovers else ""
    return CheckpointError(
        f"no complete checkpoint in {directory!r} (no `checkpoint` state file naming one{found}). "
        "Fix: pass the checkpoint_dir a run saved to (tfdist train --checkpoint-dir), or wait for its first save."
    )


def _mtime(paths) -> float | None:
    times = [t for t in (storage.mtime(p) for p in paths) if t is not None]
    return max(times) if times else None


def _missing_files(prefix: str) -> str | None:
    """A one-line description of the files a checkpoint lacks (judged by the file names only)."""
    name = storage.basename(prefix)
    if not storage.exists(layout.index_path(prefix)):
        return f"missing index file {name}.index"
    shards = layout.data_shard_names(prefix)
    if not shards:
        return f"missing data files ({name}.data-*)"
    missing = [s for s in shards if not storage.exists(s)]
    if missing:
        return "missing data shard " + ", ".join(storage.basename(s) for s in missing)
    if not storage.exists(layout.metadata_path(prefix)) and _written_by_tfdist(prefix):
        return f"missing metadata file {storage.basename(layout.metadata_path(prefix))}"
    return None


def _written_by_tfdist(prefix: str) -> bool:
    """Whether the checkpoint's directory holds tfdist metadata (a tf.train.CheckpointManager's own
    checkpoints have none, and lack nothing without it)."""
    return bool(storage.glob_names(storage.dirname(prefix), f"*{layout.METADATA_SUFFIX}"))


def _info(prefix: str, *, listed: bool, problem: str | None = None, files=None) -> CheckpointInfo:
    metadata = layout.read_metadata(prefix) or layout.Metadata({})
    files = tuple(files if files is not None else layout.checkpoint_files(prefix))
    step = metadata.global_step if metadata.global_step is not None else layout.step_of(prefix)
    return CheckpointInfo(
        path=prefix,
        global_step=step,
        epoch=metadata.epoch,
        step_in_epoch=metadata.step_in_epoch,
        saved_at=metadata.saved_at if metadata.saved_at is not None else _mtime(files),
        size_bytes=sum(storage.size(f) for f in files),
        complete=metadata.complete,
        listed=listed,
        problem=problem if problem is not None or not listed else _missing_files(prefix),
        files=files,
    )


def _leftovers(directory: str, listed: list[str]) -> list[CheckpointInfo]:
    """Checkpoint-like files in ``directory`` that no listed checkpoint owns, grouped by checkpoint."""
    listed_names = {storage.basename(p) for p in listed}
    groups: dict[tuple[str, str], list[str]] = {}
    for name in storage.listdir(directory):
        parsed = layout.parse_file_name(name)
        if parsed is None:
            continue
        path = storage.join(directory, name)
        if parsed.kind == "state-temp":
            groups.setdefault((name, "state"), []).append(path)
        elif parsed.replaced:
            groups.setdefault((parsed.stem, "replaced-" + parsed.replaced), []).append(path)
        elif parsed.stem not in listed_names:
            groups.setdefault((parsed.stem, "unlisted"), []).append(path)
        elif parsed.in_flight:  # a listed checkpoint's leftover temporary files
            groups.setdefault((parsed.stem, "temp"), []).append(path)
    leftovers = []
    rolled_back = set(layout.rolled_back(directory))
    for (stem, kind), files in groups.items():
        prefix = storage.join(directory, stem)
        if kind == "state":
            leftovers.append(CheckpointInfo(
                path=prefix, global_step=None, epoch=None, step_in_epoch=None, saved_at=_mtime(files),
                size_bytes=sum(storage.size(f) for f in files), complete=None, listed=False,
                problem=f"temporary state file of an interrupted update of `{layout.STATE_FILE}`", files=tuple(files),
            ))
            continue
        if kind == "temp":
            path = files[0] if len(files) == 1 else prefix
            problem = "temporary files of a save that is still in flight or was interrupted"
        elif kind.startswith("replaced-"):
            path = f"{prefix}.*.{kind}"  # its files: ckpt-N.index.replaced-<stamp>, ...
            problem = f"an earlier {stem} moved aside (.{kind}) before the same step was saved again"
        else:
            path = prefix
            if any(layout.parse_file_name(storage.basename(f)).in_flight for f in files):
                problem = "temporary files of a save that is still in flight or was interrupted"
            elif not storage.exists(layout.index_path(prefix)) or not any(layout.is_data_file(f) for f in files):
                problem = "not named in the state file, and " + (_missing_files(prefix) or "incomplete")
            elif not listed and storage.exists(layout.metadata_path(prefix)):
                problem = (f"no readable state file `{layout.STATE_FILE}` names it: a run started here resumes from "
                           "the newest of these")
            elif prefix in rolled_back or (rolled_back and _older_than(listed[-1], prefix)):
                problem = (f"after {storage.basename(listed[-1])}, which the state file names as its latest: a roll-back; "
                           "the next run moves it aside when it saves this step again")
            elif listed and _older_than(prefix, listed[0]) and storage.exists(layout.metadata_path(prefix)):
                info = _info(prefix, listed=False, files=files)  # keep_every_hours: kept, no longer listed
                leftovers.append(dataclasses.replace(info, kept=True, problem=None))
                continue
            else:
                problem = "not named in the state file (a save being committed, or one the manager stopped tracking)"
        info = _info(prefix, listed=False, problem=problem, files=files)
        leftovers.append(dataclasses.replace(info, path=path, saved_at=info.saved_at or _mtime(files)))
    return sorted(leftovers, key=lambda c: (c.global_step is None, c.global_step or 0, c.path))


def _older_than(prefix: str, other: str) -> bool:
    """Whether checkpoint ``prefix`` is of an earlier step than checkpoint ``other``."""
    step, others = layout.step_of(prefix), layout.step_of(other)
    return step is not None and others is not None and step < others


def list_checkpoints(directory: str) -> list[CheckpointInfo]:
    """The checkpoints the state file names (oldest first), then the incomplete leftovers.

    ``directory`` is a checkpoint directory or a run's output directory. Raises
    CheckpointError when it is missing, is not a directory, or holds nothing that looks
    like a checkpoint."""
    directory = checkpoint_dir(directory)
    _check_directory(directory, prefixes=False)
    listed = _listed_paths(directory)
    leftovers = _leftovers(directory, listed)
    if not listed and not leftovers:
        raise _no_checkpoint_error(directory, [])
    return [_info(p, listed=True) for p in listed] + leftovers


def resolve(path: str, *, every: bool = False) -> list[str]:
    """The checkpoint prefixes ``path`` names: a prefix (``DIR/ckpt-8``, also ``.index``), or a
    directory's latest listed checkpoint (all of them with ``every``)."""
    path = storage.absolute(path)
    stripped = layout.strip_file_suffix(path)
    if stripped != path and storage.isfile(path):
        path = stripped
    if not storage.isdir(path) and (storage.exists(layout.index_path(path)) or layout.checkpoint_files(path)):
        return [path]
    parent = storage.dirname(path) or "."
    if not storage.exists(path) and storage.isdir(parent):
        raise CheckpointError(
            f"no checkpoint or directory at {path!r} (neither {storage.basename(path)}.index nor a folder exists). "
            "Fix: pass a checkpoint directory or a prefix such as DIR/ckpt-8; `tfdist ckpt list DIR` shows them."
        )
    path = checkpoint_dir(path)
    _check_directory(path)
    readable = _readable_paths(path)
    if not readable:
        raise _no_checkpoint_error(path, _leftovers(path, []))
    return readable if every else readable[-1:]


# --- reading the bundle index ------------------------------------------------------------

def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _block_entries(data: bytes, offset: int, size: int):
    """The (key, value) pairs of one uncompressed table block."""
    if data[offset + size] != 0:  # the trailer's compression type: TensorFlow writes bundles uncompressed
        raise ValueError("compressed index block")
    block = data[offset: offset + size]
    (num_restarts,) = struct.unpack_from("<I", block, len(block) - 4)
    end, pos, key = len(block) - 4 - 4 * num_restarts, 0, b""
    while pos < end:
        shared, pos = _varint(block, pos)
        unshared, pos = _varint(block, pos)
        value_len, pos = _varint(block, pos)
        key = key[:shared] + block[pos: pos + unshared]
        pos += unshared
        yield key, block[pos: pos + value_len]
        pos += value_len


def read_index(prefix: str) -> tuple[Any, dict[bytes, Any]]:
    """The bundle header and the entry (shard, offset, size, crc) of every key of ``prefix.index``.

    Raises ValueError (or a struct/index error) when the index is not a readable table."""
    from tensorflow.core.protobuf import tensor_bundle_pb2

    data = storage.read_bytes(layout.index_path(prefix))
    if len(data) < 48 or data[-8:] != struct.pack("<Q", 0xDB4775248B80FB57):
        raise ValueError("not an sstable (bad magic number)")
    pos = len(data) - 48
    _, pos = _varint(data, pos)  # meta-index block handle: unused
    _, pos = _varint(data, pos)
    index_offset, pos = _varint(data, pos)
    index_size, pos = _varint(data, pos)
    header, entries = None, {}
    for _, handle in _block_entries(data, index_offset, index_size):
        block_offset, p = _varint(handle, 0)
        block_size, _ = _varint(handle, p)
        for key, value in _block_entries(data, block_offset, block_size):
            if key == b"":
                header = tensor_bundle_pb2.BundleHeaderProto.FromString(value)
            else:
                entries[key] = tensor_bundle_pb2.BundleEntryProto.FromString(value)
    if header is None:
        raise ValueError("the index has no header entry")
    return header, entries


# --- inspecting ----------------------------------------------------------------------------
def inspect_checkpoint(path: str) -> dict[str, Any]:
    """The metadata and the saved variables of the checkpoint ``path`` names (a directory: its latest).

    Returns a dictionary with ``path``, ``metadata`` (None without a metadata file),
    ``files`` (name and size), ``variables`` (name, shape, dtype, parameters, bytes) and
    ``summary`` (count, parameters and bytes in all and per top-level object)."""
    (prefix,) = resolve(path)
    import tensorflow as tf

    try:
        checkpoint = layout.reader(prefix)
        shapes = checkpoint.get_variable_to_shape_map()
        dtypes = checkpoint.get_variable_to_dtype_map()
    except Exception as e:  # the index is unreadable: TensorFlow raises several kinds
        raise CheckpointError(
            f"cannot read the index of {prefix!r} ({describe(e)}); received a corrupt or "
            f"incomplete checkpoint. Fix: run `tfdist ckpt verify {storage.dirname(prefix) or '.'} --all`."
        ) from None
    owners = _owners(checkpoint)
    variables, groups = [], {}
    for name in sorted(shapes):
        shape, dtype = list(shapes[name]), dtypes.get(name)
        numeric = name != layout.SERIALIZED_GRAPH and dtype is not None and dtype != tf.string
        count = 1
        for dim in shape:
            count *= dim
        params = count if numeric else 0
        size = params * dtype.size if numeric else 0
        owner = owners.get(name, name.split("/", 1)[0])
        variables.append({
            "name": name, "shape": shape, "dtype": dtype.name if dtype is not None else None,
            "parameters": params, "bytes": size, "group": owner,
        })
        if name != layout.SERIALIZED_GRAPH:
            group = groups.setdefault(owner, {"count": 0, "parameters": 0, "bytes": 0})
            group["count"] += 1
            group["parameters"] += params
            group["bytes"] += size
    saved = [v for v in variables if v["name"] != layout.SERIALIZED_GRAPH]
    files = layout.checkpoint_files(prefix)
    metadata = layout.read_metadata(prefix)
    return {
        "path": prefix,
        "metadata_path": layout.metadata_path(prefix),
        "metadata": metadata.to_json() if metadata is not None else None,
        "files": [{"name": storage.basename(f), "size_bytes": storage.size(f)} for f in files],
        "size_bytes": sum(storage.size(f) for f in files),
        "variables": variables,
        "summary": {
            "count": len(saved),
            "parameters": sum(v["parameters"] for v in saved),
            "bytes": sum(v["bytes"] for v in saved),
            "groups": groups,
        },
    }


def _owners(checkpoint) -> dict[str, str]:
    """Each saved tensor's top-level object (``model`` first, then the others in saved order).

    A tensor is saved once, under the first path the object graph reaches it by, which need
    not be its owner's: Keras 3's optimizer tracks the model's weights, and saves them as
    ``optimizer/_trainable_variables/N``. The graph says who else reaches them. A walk from one
    top-level object stops at the others (a Keras model tracks its optimizer), and an
    optimizer's slots are its own. {} when the graph is unreadable."""
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    try:
        graph = trackable_object_graph_pb2.TrackableObjectGraph.FromString(
            checkpoint.get_tensor(layout.SERIALIZED_GRAPH))
    except Exception:  # no graph (a TF1 checkpoint) or a damaged one: group by name
        return {}
    owners: dict[str, str] = {}
    tops = sorted(graph.nodes[0].children, key=lambda child: child.local_name != layout.MODEL) if graph.nodes else []
    for top in tops:
        stack, seen = [top.node_id], {other.node_id for other in tops if other is not top}
        while stack:
            node_id = stack.pop()
            if node_id in seen or node_id >= len(graph.nodes):
                continue
            seen.add(node_id)
            node = graph.nodes[node_id]
            for attribute in node.attributes:
                owners.setdefault(attribute.checkpoint_key, top.local_name)
            stack.extend(child.node_id for child in node.children)
            stack.extend(slot.slot_variable_node_id for slot in node.slot_variables)
    return owners


# --- verifying -----------------------------------------------------------------------------
def _structure_problems(prefix: str) -> tuple[list[str], dict[str, str]]:
    """Problems visible without reading tensors, and each tensor's data file (when the index parses)."""
    name = storage.basename(prefix)
    if not storage.exists(layout.index_path(prefix)):
        return [f"missing index file {name}.index"], {}
    try:
        header, entries = read_index(prefix)
    except Exception:  # TensorFlow reads the index next and says what is wrong with it
        header, entries = None, {}
    shards = layout.data_shard_names(prefix, header.num_shards if header is not None else None)
    if not shards:
        return [f"missing data files ({name}.data-*)"], {}
    missing = [storage.basename(s) for s in shards if not storage.exists(s)]
    if missing:
        return [f"missing data shard {', '.join(missing)}"], {}
    problems, needed = [], {}
    for entry in entries.values():
        if entry.size and entry.shard_id < len(shards):
            needed[entry.shard_id] = max(needed.get(entry.shard_id, 0), entry.offset + entry.size)
    for shard_id, end in sorted(needed.items()):
        size = storage.size(shards[shard_id])
        if size < end:
            problems.append(
                f"{storage.basename(shards[shard_id])} is truncated: {size} bytes, "
                f"the index places data up to byte {end}"
            )
    shard_of = {
        key.decode("utf-8", "replace"): storage.basename(shards[e.shard_id])
        for key, e in entries.items() if e.shard_id < len(shards)
    }
    return problems, shard_of


def _metadata_problems(prefix: str, tensor_step: int | None) -> list[str]:
    name = storage.basename(layout.metadata_path(prefix))
    if not storage.exists(layout.metadata_path(prefix)):  # a problem where tfdist wrote the others
        return [f"missing metadata file {name}"] if _written_by_tfdist(prefix) else []
    metadata = layout.read_metadata(prefix)
    if metadata is None:
        return [f"metadata file {name} is not a JSON object"]
    problems, step = [], metadata.global_step
    name_step = layout.step_of(prefix)
    if name_step is not None and step != name_step:
        problems.append(f"metadata file {name} says global_step={step!r}, the checkpoint's name says {name_step}")
    if tensor_step is not None and step != tensor_step and tensor_step != name_step:
        problems.append(f"metadata file {name} says global_step={step!r}, the checkpoint holds {tensor_step}")
    return problems


def verify_checkpoint(prefix: str) -> Verification:
    """Reads every tensor of ``prefix`` (TensorFlow checks each one's CRC32C) and checks its files.

    Never raises for a bad checkpoint: the result says what is wrong, in one line."""
    problems, shard_of = _structure_problems(prefix)
    if problems:  # reading would only fail again, less clearly
        return Verification(path=prefix, ok=False, problem="; ".join(problems))
    tensors = bytes_read = 0
    tensor_step = None
    try:
        reader = layout.reader(prefix)
        names = sorted(reader.get_variable_to_shape_map())
    except Exception as e:  # a corrupt index: TensorFlow raises OpError, ValueError, ...
        return Verification(path=prefix, ok=False, problem=(
            f"the index {storage.basename(prefix)}.index cannot be read ({describe(e)})"))
    for name in names:
        try:
            value = reader.get_tensor(name)
        except Exception as e:  # a CRC mismatch is an OpError; a short file an IndexError
            where = shard_of.get(name) or ", ".join(sorted({storage.basename(s) for s in layout.data_shard_names(prefix)}))
            where = f" in {where}" if where else ""
            return Verification(path=prefix, ok=False, problem=(
                f"tensor {name!r}{where} cannot be read ({describe(e)})"), tensors=tensors)
        tensors += 1
        bytes_read += getattr(value, "nbytes", 0)
        if name == layout.GLOBAL_STEP_KEY:
            tensor_step = int(value)
    problems = _metadata_problems(prefix, tensor_step)
    return Verification(path=prefix, ok=not problems, problem="; ".join(problems) or None,
                        tensors=tensors, bytes_read=bytes_read)


def verify(path: str, *, every: bool = False) -> tuple[list[Verification], list[CheckpointInfo]]:
    """Verifies the latest checkpoint ``path`` names (with ``every``, every listed one and those
    ``keep_every_hours`` kept).

    Returns the results and the directory's incomplete leftovers (reported, not verified).
    A directory without a listed checkpoint but with leftovers gives one failed result per leftover."""
    path = storage.absolute(path)
    if storage.isdir(path):
        path = checkpoint_dir(path)
        _check_directory(path)
        readable = _readable_paths(path)
        leftovers = _leftovers(path, readable)
        if not readable:
            if not leftovers:
                raise _no_checkpoint_error(path, [])
            return [Verification(path=c.path, ok=False, problem=c.problem) for c in leftovers], []
        kept = [c.path for c in leftovers if c.kept]
        leftovers = [c for c in leftovers if not c.kept]
        prefixes = kept + readable if every else readable[-1:]
    else:
        prefixes, leftovers = resolve(path), []
    return [verify_checkpoint(p) for p in prefixes], leftovers
