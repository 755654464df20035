"""The checkpoint layout: how a run's checkpoints are named and described on disk.

This module alone knows the names of the files of a checkpoint directory, the keys of
tfdist's metadata, and the paths of the progress counters inside a checkpoint; the
checkpointer, ``tfdist ckpt`` and the evaluator ask it. A checkpoint directory holds::

    checkpoint                        TensorFlow's state file: names the complete checkpoints,
                                      rewritten (temp file + rename) only after a save is whole
    ckpt-<step>.index                 the bundle index of the checkpoint of global step <step>
    ckpt-<step>.data-00000-of-00001   its tensors
    ckpt-<step>.tfdist.json           tfdist's metadata: the run (RunMetadata) and its progress
    input/<mode>-<W>w-<w>/ckpt-<step>.*  worker <w>'s position in a user's own tf.data pipeline
                                      (its iterator, written before the checkpoint of <step>)

and, transiently or after trouble, ``ckpt-<step>_temp/`` (a save in flight),
``*.tmp-<id>`` (an atomic write in flight) and ``*.replaced-<stamp>`` (a checkpoint moved
aside instead of being overwritten). Inside a checkpoint the root objects are named by
``ROOT`` below; the counters are ``progress/global_step`` and friends.

All I/O goes through ``tfdist.storage``: a directory may be on any TensorFlow filesystem.
Reading a directory needs no TensorFlow when it is local.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import time
from typing import Any, ClassVar, Mapping

from tfdist import storage

STATE_FILE = "checkpoint"
CHECKPOINT_NAME = "ckpt"
METADATA_SUFFIX = ".tfdist.json"
WRITER_FILE = ".tfdist-writer.json"
"""Names the run whose chief writes the directory (``checkpoint.ownership``)."""
FORMAT = 1
"""Version of the metadata format; a reader accepts the keys it knows and ignores the rest."""

# The root objects of tf.train.Checkpoint (the first component of every variable path).
MODEL, OPTIMIZER, PROGRESS, RNG, METRICS = "model", "optimizer", "progress", "rng", "metrics"
REPLICA_STATE, REPLICA_METRICS = "replica_state", "replica_metrics"
CALLBACKS = "callbacks"
RNG_GLOBAL = "rng_global"  # Keras' global seed generator (saved since 2026-11-27; restored when there)
COUNTERS = ("global_step", "epoch", "step_in_epoch")
VALUE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"
SERIALIZED_GRAPH = "_CHECKPOINTABLE_OBJECT_GRAPH"

_STATE_LINE = re.compile(r'^(model_checkpoint_path|all_model_checkpoint_paths):\s*"((?:[^"\\]|\\.)*)"\s*$')
_STEP = re.compile(r"-(\d+)$")
_DATA = re.compile(r"\.data-(\d{5})-of-(\d{5})$")
# ckpt-12.index, ckpt-12.data-00000-of-00001, ckpt-12.tfdist.json, ckpt-12_temp/, each maybe with a
# ``.replaced-<stamp>`` or ``.tmp-<id>`` tail.
_FILE = re.compile(
    r"^(?P<stem>.+?-(?P<step>\d+))(?P<kind>\.index|\.data-\d{5}-of-\d{5}|\.tfdist\.json|_temp)(?P<tail>.*)$"
)
_REPLACED = re.compile(r"\.replaced-(\S+)$")


# --- names ---------------------------------------------------------------------------------
def prefix_for(directory: str, step: int) -> str:
    """The prefix of the checkpoint of global step ``step`` in ``directory`` (``DIR/ckpt-<step>``)."""
    return storage.join(directory, f"{CHECKPOINT_NAME}-{step}")


def step_of(prefix: str) -> int | None:
    """The global step a checkpoint prefix names (``ckpt-12`` -> 12), or None."""
    match = _STEP.search(storage.basename(prefix))
    return int(match.group(1)) if match else None


INPUT_STATE_DIR = "input"
"""The per-worker positions of a user's own tf.data pipeline (``data.user_pipeline``), beside the checkpoints."""


def input_state_dir(directory: str, *, mode: str, workers: int, worker: int) -> str:
    """Where worker ``worker`` of ``workers`` keeps its pipeline's position (``DIR/input/file-2w-1``).

    ``mode`` names how the pipeline is split among workers: a position saved under another
    mode or worker count is another pipeline's."""
    return storage.join(directory, INPUT_STATE_DIR, f"{mode}-{workers}w-{worker}")


def input_state_owner(state_dir: str) -> tuple[str, int, int] | None:
    """``(mode, workers, worker)`` of a position folder (``file-2w-1`` -> ``("file", 2, 1)``), or None."""
    match = re.fullmatch(r"(\w+)-(\d+)w-(\d+)", storage.basename(state_dir))
    return (match.group(1), int(match.group(2)), int(match.group(3))) if match else None


def input_state_prefix(state_dir: str, step: int) -> str:
    """The prefix of the pipeline position saved with the checkpoint of ``step`` (``.../ckpt-<step>``)."""
    return storage.join(state_dir, f"{CHECKPOINT_NAME}-{step}")


def input_state_dirs(directory: str) -> list[str]:
    """Every worker's position folder in ``directory`` (any mode and worker count), sorted."""
    root = storage.join(directory, INPUT_STATE_DIR)
    return [storage.join(root, name) for name in storage.listdir(root)] if storage.isdir(root) else []


def input_state_steps(state_dir: str) -> list[int]:
    """The steps whose position ``state_dir`` holds completely (its index file is written last), sorted."""
    steps = [step_of(strip_file_suffix(p)) for p in storage.glob_names(state_dir, f"{CHECKPOINT_NAME}-*.index")]
    return sorted(s for s in steps if s is not None)


def checkpoint_dir_of(output_dir: str) -> str:
    """Where a run's checkpoints go inside its output directory (``tfdist train --output-dir``)."""
    return storage.join(output_dir, "checkpoints")


def state_path(directory: str) -> str:
    return storage.join(directory, STATE_FILE)


def writer_path(directory: str) -> str:
    return storage.join(directory, WRITER_FILE)


def metadata_path(prefix: str) -> str:
    return prefix + METADATA_SUFFIX


def index_path(prefix: str) -> str:
    return prefix + ".index"


def counter_key(name: str) -> str:
    """The variable path of a progress counter inside a checkpoint, e.g. ``progress/global_step/...``."""
    return f"{PROGRESS}/{name}{VALUE_SUFFIX}"


GLOBAL_STEP_KEY = counter_key("global_step")
# Metadata keys a reader shows in a form of its own (a time, a list of epochs).
SAVED_AT, HISTORY = "saved_at", "history"


def short_key(key: str) -> str:
    """A variable path without its ``/.ATTRIBUTES/VARIABLE_VALUE`` tail."""
    return key[: -len(VALUE_SUFFIX)] if key.endswith(VALUE_SUFFIX) else key


def replaced_name(path: str, stamp: str) -> str:
    """The name a file is moved to when a checkpoint of the same step is saved again."""
    return f"{path}.replaced-{stamp}"


def checkpoint_files(prefix: str) -> list[str]:
    """The index and data files of ``prefix`` that exist, sorted. Only those exact names: a file
    moved aside (``ckpt-9.data-00000-of-00001.replaced-<stamp>``) is not one of them."""
    directory, name = storage.dirname(prefix) or ".", storage.basename(prefix)
    data = [p for p in storage.glob_names(directory, _escape(name) + ".data-*") if _DATA.search(p)]
    return sorted(storage.glob_names(directory, _escape(name) + ".index") + data)


def data_shard_names(prefix: str, num_shards: int | None = None) -> list[str]:
    """The data files a checkpoint should have: ``num_shards`` of them, else as many as the names on disk say."""
    if num_shards is None:
        counts = {int(_DATA.search(f).group(2)) for f in checkpoint_files(prefix) if _DATA.search(f)}
        if not counts:
            return []
        num_shards = max(counts)
    return [f"{prefix}.data-{i:05d}-of-{num_shards:05d}" for i in range(num_shards)]


def is_data_file(path: str) -> bool:
    return _DATA.search(path) is not None


def strip_file_suffix(path: str) -> str:
    """``DIR/ckpt-8.index`` / ``.tfdist.json`` / ``.data-00000-of-00001`` -> ``DIR/ckpt-8``; else unchanged."""
    for suffix in (".index", METADATA_SUFFIX):
        if path.endswith(suffix):
            return path[: -len(suffix)]
    return _DATA.sub("", path)


@dataclasses.dataclass(frozen=True)
class FileName:
    """What a file name in a checkpoint directory says: the checkpoint it belongs to and how."""

    stem: str  # ckpt-12
    kind: str  # "index", "data", "metadata", "temp" (a save in flight), "state-temp"
    replaced: str | None  # the stamp of a checkpoint moved aside, if it was
    in_flight: bool  # a temporary file of a write in flight (or interrupted)


def parse_file_name(name: str) -> FileName | None:
    """Classifies one name of a checkpoint directory; None for a name tfdist does not write."""
    if name.startswith(STATE_FILE + ".tmp"):
        return FileName(stem=name, kind="state-temp", replaced=None, in_flight=True)
    match = _FILE.match(name)
    if match is None:
        return None
    kind = match.group("kind")
    kind = {".index": "index", METADATA_SUFFIX: "metadata", "_temp": "temp"}.get(kind, "data")
    tail = match.group("tail")
    replaced = _REPLACED.search(tail)
    return FileName(
        stem=match.group("stem"), kind=kind, replaced=replaced.group(1) if replaced else None,
        in_flight=kind == "temp" or ".tmp" in tail,
    )


def interrupted_writes(directory: str, *, listed: list[str] = ()) -> list[str]:
    """The temporary files and folders of writes to ``directory`` that are in flight or were
    interrupted: ``ckpt-<step>_temp/`` of a save, ``*.tmp-<id>`` of an atomic write (metadata, the
    state file, the writer record) and ``check_writable``'s probe; and, given the ``listed``
    checkpoints, the files of interrupted deletions: the data shards (as large as a checkpoint)
    and metadata of one older than every listed one, without its index, which the manager's
    retention deletes first. Never a complete checkpoint, an unlisted one, or one moved aside
    (``*.replaced-<stamp>``)."""
    if not storage.isdir(directory):
        return []
    oldest = min((step for step in map(step_of, listed) if step is not None), default=None)
    names = storage.listdir(directory)

    def deletion_left(parsed: FileName) -> bool:
        step = step_of(parsed.stem)
        return (oldest is not None and step is not None and step < oldest and parsed.replaced is None
                and parsed.kind in ("data", "metadata") and f"{parsed.stem}.index" not in names)

    paths = []
    for name in names:
        parsed = parse_file_name(name)
        if (parsed is not None and ((parsed.in_flight and parsed.replaced is None) or deletion_left(parsed))) or \
                name.startswith((storage.WRITE_PROBE_PREFIX, WRITER_FILE + ".tmp")):
            paths.append(storage.join(directory, name))
    return paths


def _escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)


def reader(prefix: str):
    """TensorFlow's reader of the checkpoint ``prefix`` (its tensors, shapes and dtypes).

    ``tf.train.load_checkpoint`` is not used: it first asks whether ``prefix`` is a directory,
    which some filesystems (``ram://``) answer yes for any prefix."""
    import tensorflow as tf

    return tf.compat.v1.train.NewCheckpointReader(prefix)


# --- the state file --------------------------------------------------------------------------
def _read_state(directory: str) -> tuple[str | None, list[str]]:
    """(``model_checkpoint_path``, ``all_model_checkpoint_paths``) of the state file, as paths."""
    try:
        lines = storage.read_text(state_path(directory)).splitlines()
    except (OSError, UnicodeDecodeError):
        lines = []
    latest, paths = None, []
    for line in lines:
        match = _STATE_LINE.match(line.strip())
        if match:
            path = match.group(2).encode().decode("unicode_escape")
            path = path if storage.is_url(path) or path.startswith("/") else storage.join(directory, path)
            if match.group(1) == "model_checkpoint_path":
                latest = path
            else:
                paths.append(path)
    return latest, paths


def checkpoint_paths(directory: str, *, listed_only: bool = False) -> list[str]:
    """The complete checkpoints of ``directory``, oldest first, as its state file names them
    (read as text: listing needs no TensorFlow for a local directory). The last is the one
    ``model_checkpoint_path`` names: a state file edited to name an earlier one of its list
    (a roll-back, see :func:`rolled_back`) lists the checkpoints up to that one.

    Without a state file that names one (deleted, emptied, damaged, written over), the
    checkpoints found beside it (:func:`found_checkpoints`), so that a run never starts over
    on top of its own checkpoints; ``listed_only``: [] then."""
    latest, paths = _read_state(directory)
    if latest in paths:
        paths = paths[:paths.index(latest) + 1]
    listed = paths or ([latest] if latest else [])
    return listed if listed or listed_only else found_checkpoints(directory)


def rolled_back(directory: str) -> list[str]:
    """The checkpoints the state file lists after the one its ``model_checkpoint_path`` names:
    TensorFlow's manager always names the last one there, so a state file that names an earlier
    one was edited to roll the run back to it. [] if it was not."""
    latest, paths = _read_state(directory)
    return paths[paths.index(latest) + 1:] if latest in paths else []


def unlisted_latest(directory: str) -> str | None:
    """The checkpoint the state file's ``model_checkpoint_path`` names when its list does not hold
    it and it is of an earlier step than the list's last: an edit to roll back to a checkpoint
    ``keep_every_hours`` kept (the manager stops listing those). None otherwise."""
    latest, paths = _read_state(directory)
    if latest is None or latest in paths or not paths:
        return None
    step, last = step_of(latest), step_of(paths[-1])
    return latest if step is not None and last is not None and step < last else None


def write_state(directory: str, paths: list[str]) -> None:
    """Writes the state file naming ``paths`` (oldest first, the last the latest) as
    ``tf.train.CheckpointManager`` writes it: names relative to ``directory``, atomically, with
    each checkpoint's save time. The manager keeps track of (and its ``keep`` retention applies
    to) only the checkpoints saved after ``last_preserved_timestamp``: without the times it
    would forget them all at its next save, leaving them unlisted on disk for good."""
    names = [storage.basename(p) for p in paths]
    now = time.time()
    times = []
    for path in paths:
        metadata = read_metadata(path)
        saved = metadata.saved_at if metadata is not None else None
        times.append(min(now, saved if saved is not None else storage.mtime(index_path(path)) or now))
    times = list(itertools.accumulate(times, max))  # in the order of the list, as the manager keeps it
    lines = [f'model_checkpoint_path: "{names[-1]}"', *(f'all_model_checkpoint_paths: "{n}"' for n in names),
             *(f"all_model_checkpoint_timestamps: {t!r}" for t in times),
             f"last_preserved_timestamp: {min(times) - 1.0!r}"]
    storage.write_atomic(state_path(directory), "\n".join(lines) + "\n")


def found_checkpoints(directory: str) -> list[str]:
    """The checkpoints of ``directory`` whose index and tfdist metadata are there (what a save
    writes last), by step, whatever the state file says."""
    steps = []
    for path in storage.glob_names(directory, f"{CHECKPOINT_NAME}-*.index"):
        match = re.fullmatch(rf"{CHECKPOINT_NAME}-(\d+)\.index", storage.basename(path))
        if match and storage.exists(metadata_path(strip_file_suffix(path))):
            steps.append(int(match.group(1)))
    return [prefix_for(directory, step) for step in sorted(steps)]


# --- metadata --------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True)
class RunMetadata:
    """What a run is. The ``MUST_MATCH`` fields decide whether a checkpoint belongs to this run
    (a resume continues only the same run, unless ``allow_changes``); the others are recorded
    for people and tools."""

    global_batch_size: int
    data_fingerprint: str
    model_fingerprint: str
    seed: int
    shuffle: bool = True
    strategy: str | None = None
    num_replicas: int | None = None
    num_workers: int | None = None
    micro_batch_size: int | None = None
    grad_accum_steps: int | None = None
    steps_per_epoch: int | None = None
    epochs: int | None = None
    tfdist_version: str | None = None
    tensorflow_version: str | None = None
    data_order: dict | None = None
    class_weight: dict | None = None
    data_summary: str | None = None
    """For people: what the data was (name, files, examples), quoted when the fingerprints differ."""
    keras: str | None = None
    """``keras`` (Keras 3) or ``tf_keras``: the two save other objects, so no change is allowed."""
    precision: str | None = None
    """The model's dtype policy (``float32``, ``mixed_float16``, ``mixed_bfloat16``): a change is
    a change of the run (unknown for older checkpoints: not compared)."""
    jit_compile: bool | None = None
    """Whether the model asked for XLA; a change is said on resume, not refused."""

    # The TensorFlow version is part of the run: the data order comes from stateless random ops
    # (index_shuffle, philox), whose outputs TensorFlow does not promise to keep across versions.
    MUST_MATCH: ClassVar[tuple[str, ...]] = (
        "global_batch_size", "data_fingerprint", "model_fingerprint", "seed", "shuffle", "data_order",
        "tensorflow_version", "class_weight",
    )

    def keras_difference(self, saved: "Metadata") -> str | None:
        """The Keras that wrote the checkpoint, if not this run's (unknown for older checkpoints: None)."""
        theirs = saved.raw.get("keras")
        if theirs and self.keras and theirs != self.keras:
            return f"keras: checkpoint {theirs!r}, this run {self.keras!r}"
        return None

    def precision_difference(self, saved: "Metadata") -> tuple[str, str] | None:
        """(checkpoint's, this run's) dtype policy if they differ (None if either is unknown)."""
        theirs = saved.raw.get("precision")
        if isinstance(theirs, str) and self.precision and theirs != self.precision:
            return theirs, self.precision
        return None

    def differences(self, saved: "Metadata") -> list[str]:
        """One line per must-match field that differs from the checkpoint's."""
        mine = self.to_json()
        lines = []
        precision = self.precision_difference(saved)
        if precision:
            lines.append(f"precision: checkpoint {precision[0]!r}, this run {precision[1]!r} -- to go on in the "
                         f"checkpoint's, {precision_fix(precision[0])}")
        for key in self.MUST_MATCH:
            if saved.raw.get(key) == mine[key]:
                continue
            theirs, ours = repr(saved.raw.get(key)), repr(mine[key])
            hint = ""
            if key == "data_fingerprint" and saved.raw.get("data_summary") and self.data_summary:
                theirs, ours = f"{theirs} ({saved.raw['data_summary']})", f"{ours} ({self.data_summary})"
                if saved.raw["data_summary"] == self.data_summary:
                    hint = (" -- the same description, other first examples: the data changed, or it comes in "
                            "another order in each process (a tf.data.Dataset's unseeded shuffle(), files listed "
                            "unsorted), which no run can resume exactly: seed the shuffle, or leave it to tfdist")
            if key == "global_batch_size" and isinstance(saved.raw.get(key), int):
                hint = (f" -- to go on with the run's global batch on another number of replicas, pass "
                        f"batch_size={saved.raw[key]} (--batch-size {saved.raw[key]}: the command line's default is "
                        "32 per replica)")
            lines.append(f"{key}: checkpoint {theirs}, this run {ours}{hint}")
        return lines

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def precision_fix(policy: str) -> str:
    """How a run is put in the dtype policy ``policy``, in words for an error's fix."""
    if policy == "float32":
        return "leave mixed_precision out (no --mixed-precision)"
    if policy in ("mixed_float16", "mixed_bfloat16"):
        return f"pass mixed_precision={policy!r} (--mixed-precision {policy})"
    return f"build the model under the {policy!r} dtype policy"


def _typed(value: Any, kind: type | tuple[type, ...]) -> Any:
    return value if isinstance(value, kind) and not (kind is not bool and isinstance(value, bool)) else None


@dataclasses.dataclass(frozen=True)
class Metadata:
    """The content of ``ckpt-<step>.tfdist.json``: the run's fields (``RunMetadata``) and its
    progress at that checkpoint. Accessors return None for a key that is missing or mistyped
    (a damaged or foreign file); ``raw`` is the whole JSON object."""

    raw: Mapping[str, Any]

    @classmethod
    def of(cls, run: RunMetadata, *, global_step: int, epoch: int, step_in_epoch: int, complete: bool,
           history: list[dict], callbacks: Mapping[str, Any] | None = None) -> "Metadata":
        fields = dict(
            run.to_json(), format=FORMAT, global_step=global_step, epoch=epoch, step_in_epoch=step_in_epoch,
            complete=complete, history=history, saved_at=time.time(),
        )
        if callbacks is not None:
            fields[CALLBACKS] = dict(callbacks)
        return cls(fields)

    @property
    def global_step(self) -> int | None:
        return _typed(self.raw.get("global_step"), int)

    @property
    def epoch(self) -> int | None:
        return _typed(self.raw.get("epoch"), int)

    @property
    def step_in_epoch(self) -> int | None:
        return _typed(self.raw.get("step_in_epoch"), int)

    @property
    def complete(self) -> bool | None:
        """Whether the run had finished all its epochs when this checkpoint was saved."""
        return _typed(self.raw.get("complete"), bool)

    @property
    def saved_at(self) -> float | None:
        return _typed(self.raw.get("saved_at"), (int, float))

    @property
    def history(self) -> list[dict]:
        """Every finished epoch's logs, earlier runs included."""
        history = self.raw.get("history")
        return list(history) if isinstance(history, list) else []

    @property
    def callbacks(self) -> dict | None:
        """The state of the run's callbacks at this checkpoint (``training.callback_state``); None if it had none."""
        return _typed(self.raw.get(CALLBACKS), dict)

    @property
    def seed(self) -> int | None:
        return _typed(self.raw.get("seed"), int)

    @property
    def data_order(self) -> dict | None:
        """How the run orders its data (``DataPlan.order_record()``); None for checkpoints of older tfdist."""
        return _typed(self.raw.get("data_order"), dict)

    @property
    def epochs(self) -> int | None:
        """How many epochs the run that saved it was asked for."""
        return _typed(self.raw.get("epochs"), int)

    def run_value(self, field: str) -> Any:
        """The value of a ``RunMetadata`` field as saved (None if absent)."""
        if field not in {f.name for f in dataclasses.fields(RunMetadata)}:
            raise KeyError(f"{field!r} is not a RunMetadata field")
        return self.raw.get(field)

    def run(self) -> RunMetadata:
        """The run this checkpoint belongs to, as a ``RunMetadata`` (e.g. to save more checkpoints of it)."""
        fields = {f.name for f in dataclasses.fields(RunMetadata)}
        return RunMetadata(**{k: v for k, v in self.raw.items() if k in fields})

    def to_json(self) -> dict[str, Any]:
        return dict(self.raw)


def read_metadata(prefix: str) -> Metadata | None:
    """The metadata of the checkpoint ``prefix``; None if the file is missing or not a JSON object."""
    try:
        raw = json.loads(storage.read_text(metadata_path(prefix)))
    except (OSError, ValueError):
        return None
    return Metadata(raw) if isinstance(raw, dict) else None


def write_metadata(prefix: str, metadata: Metadata) -> None:
    storage.write_atomic(metadata_path(prefix), json.dumps(metadata.to_json(), indent=1, sort_keys=True, default=float))


def metadata_files(directory: str) -> list[str]:
    """Every ``ckpt-*.tfdist.json`` of ``directory``."""
    return storage.glob_names(directory, f"{CHECKPOINT_NAME}-*{METADATA_SUFFIX}")


def latest_metadata(directory: str) -> Metadata | None:
    """The metadata of the newest complete checkpoint in ``directory``, if any."""
    paths = checkpoint_paths(directory)
    return read_metadata(paths[-1]) if paths else None
