"""TFRecordSource: data in files larger than memory, each replica reading its own stream, exact resume in O(1).

The layout (``Layout``):

* The files, in the order given (a glob's matches sorted), form one sequence of ``N``
  records, cut into **blocks** of ``R`` records (about ``block_bytes``, 2 MiB by default;
  only the last block may be shorter; a block may span two files).
* Every epoch orders the full blocks with a seeded permutation of ``(seed, epoch)``
  (``index_shuffle``, never built), the short block last, and deals them round-robin to
  ``S`` **streams**: stream ``s`` gets the blocks at positions ``s, s + S, ...``.
* A stream reads its blocks ``K`` at a time (a **window**; the last window of a stream
  takes the remaining ``K`` to ``2K - 1`` blocks) and shuffles the records of a window with a
  permutation keyed by ``(seed, epoch, stream, window)``.
* Global step ``i`` of an epoch takes records ``[i * g, (i + 1) * g)`` of every stream,
  ``g = G / S`` (``G`` the global batch), concatenated stream after stream; replica ``r`` of
  ``M`` gets positions ``[r * G / M, (r + 1) * G / M)`` of that. When ``M`` divides ``S``,
  replica ``r`` reads streams ``[r * S / M, (r + 1) * S / M)`` and nothing else; a worker
  reads only its replicas' streams: 1/W of the bytes.
* ``S`` is a property of the run: the replica count of its first run (under parameter
  servers, the worker count), recorded in the checkpoint and passed back on resume. The
  examples of every global step are then the same for any replica count ``M`` that
  divides ``G`` (the global batch is fixed by the checkpoint): when ``M`` divides ``S``
  each replica reads whole streams; otherwise replicas that share a stream each read it
  (and parse only their part) -- same data, more bytes read.
* Steps per epoch = ``min_s len(stream s) // g``: equal on every worker; the records past
  it are left out of that epoch (a different set each epoch).
* Resuming at step ``i`` opens, in every stream, the window holding position ``i * g``:
  one window of reading, whatever the step.

Under parameter servers each worker runs whole steps: step ``i`` is ``G`` records of
stream ``i % S`` (``S`` = the workers of the first run), so worker ``w`` reads stream ``w``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

import numpy as np

from tfdist import _checks
from tfdist.data import order as order_mod
from tfdist.data import records as records_mod
from tfdist.data.arrays import inputs_of
from tfdist.errors import BatchSizeError, DataError, describe

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

log = logging.getLogger("tfdist")

LAYOUT_VERSION = "tfrecord-blocks-1"
DEFAULT_BLOCK_BYTES = 2 << 20
DEFAULT_WINDOW_BLOCKS = 8
MIN_BLOCKS_PER_STREAM = 8  # small data sets get smaller blocks, so that every stream has several
_CYCLE = 4  # blocks of a window read in parallel


@dataclasses.dataclass(frozen=True)
class Layout:
    """How a file source's records are cut and dealt: a property of the run, recorded in its checkpoints."""

    streams: int
    block_records: int
    window_blocks: int
    num_records: int

    def __post_init__(self):
        for name in ("streams", "block_records", "window_blocks", "num_records"):
            _checks.check_int(name, getattr(self, name), error=DataError)

    @property
    def num_blocks(self) -> int:
        return -(-self.num_records // self.block_records)

    @property
    def full_blocks(self) -> int:
        return self.num_records // self.block_records

    @property
    def window_records(self) -> int:
        return self.window_blocks * self.block_records

    def stream_blocks(self, stream: int) -> int:
        return len(range(stream, self.num_blocks, self.streams))

    def stream_windows(self, stream: int) -> int:
        """Windows of ``stream``: ``K`` blocks each, the last one taking what is left (up to ``2K - 1``)."""
        return max(1, self.stream_blocks(stream) // self.window_blocks)

    def stream_records(self, stream: int) -> int:
        """Records of ``stream`` in every epoch (the short block is always the epoch's last)."""
        n = self.stream_blocks(stream) * self.block_records
        if self.num_blocks != self.full_blocks and (self.num_blocks - 1) % self.streams == stream:
            n -= self.num_blocks * self.block_records - self.num_records
        return n

    def min_stream_records(self) -> int:
        return min(self.stream_records(s) for s in range(self.streams))

    def as_dict(self) -> dict:
        return {"layout": LAYOUT_VERSION, "streams": self.streams, "block_records": self.block_records,
                "window_blocks": self.window_blocks}


def _positive_or_none(name: str, value) -> None:
    if value is not None:
        _checks.check_int(name, value, error=DataError, fix="use a positive integer (or leave it out).")


class TFRecordSource:
    """Examples in TFRecord files, read in blocks by one stream per replica.

    Use it when the data does not fit in memory, or when several workers train: each worker then
    reads only its share of the files. Each epoch's order is a pure function of the seed, the epoch
    and the step, so a resume reads exactly the batches the uninterrupted run would have read.

    Args:
      files: A glob such as ``"gs://bucket/train-*.tfrecord"``, or a list of paths and globs, on
        any TensorFlow filesystem. The files are read in sorted order.
      parse_fn: ``parse_fn(serialized) -> (x, y)`` or ``(x, y, sample_weight)``. ``serialized`` is
        a 1-D string tensor holding one per-replica batch of records. Return batched tensors, for
        example from ``tf.io.parse_example``. Each of ``x`` and ``y`` is a tensor or a dict of them.
        It runs as a graph, as a function given to ``Dataset.map`` runs: AutoGraph converts its
        Python control flow on tensors.
      streams: The number of streams the blocks are dealt to. It must divide the global batch.
        Defaults to None: the replica count of the run's first start, recorded in the checkpoint.
      block_bytes: The size of a block, in bytes. Defaults to 2 MiB.
      block_records: The size of a block, in records. It wins over ``block_bytes``.
        Defaults to None.
      window_blocks: How many blocks each stream shuffles together. Memory is this many blocks per
        stream. Defaults to None: 8.
      cache_dir: Where to keep the record index when the data directory is read-only, such as
        the checkpoint directory. Defaults to None: ``.tfdist-index.json`` beside the files.
      compression: ``"GZIP"`` or ``"ZLIB"`` for compressed files. A block is then reached by
        reading its file from the start. Defaults to None: uncompressed.
      num_classes: The number of classes, for tools that build a model, such as ``tfdist train``.
        Defaults to None.
      name: The data's name in logs and in the checkpoint's data fingerprint. Defaults to None:
        the glob, or the number of files.
      record_counts: The number of records of each file, when known, such as from a TFDS data
        set's metadata. The byte index then waits until the files are read. Defaults to None:
        counted when the files are indexed.

    Raises:
      DataError: ``parse_fn`` is not callable, an option is invalid, no file matches, or a file is
        cut short.

    Examples:
        ```python
        import keras
        import numpy as np
        import tensorflow as tf
        import tfdist

        with tf.io.TFRecordWriter("train.tfrecord") as writer:   # 256 records of 4 floats and a label
            for i in range(256):
                features = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=np.full(4, i % 2, "float32"))),
                            "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 2]))}
                writer.write(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())

        def parse(serialized):
            f = tf.io.parse_example(serialized, {"x": tf.io.FixedLenFeature([4], tf.float32),
                                                 "y": tf.io.FixedLenFeature([], tf.int64)})
            return f["x"], f["y"]

        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        tfdist.fit(model, tfdist.TFRecordSource("*.tfrecord", parse), epochs=2, batch_size=32, seed=0)
        ```
    """

    index_addressable = False

    def __init__(
        self,
        files: str | Iterable[str],
        parse_fn: Callable,
        *,
        streams: int | None = None,
        block_bytes: int = DEFAULT_BLOCK_BYTES,
        block_records: int | None = None,
        window_blocks: int | None = None,
        cache_dir: str | None = None,
        compression: str | None = None,
        num_classes: int | None = None,
        name: str | None = None,
        record_counts: Sequence[int] | None = None,
    ):
        if not callable(parse_fn):
            raise DataError(f"`parse_fn` must be callable; received {parse_fn!r}. Fix: pass a function serialized -> (x, y).")
        for label, value in (("streams", streams), ("block_records", block_records), ("window_blocks", window_blocks),
                             ("block_bytes", block_bytes), ("num_classes", num_classes)):
            _positive_or_none(label, value)
        if compression not in (None, "", "GZIP", "ZLIB"):
            raise DataError(f"Invalid `compression`; received compression={compression!r}. Fix: use None, 'GZIP' or 'ZLIB'.")
        self.paths = records_mod.expand(files)
        self.parse_fn = parse_fn
        self.streams = streams
        self.block_bytes = block_bytes
        self.block_records = block_records
        self.window_blocks = window_blocks
        self.cache_dir = cache_dir
        self.compression = compression or ""
        self.num_classes = num_classes
        self.name = name or (files if isinstance(files, str) else f"{len(self.paths)} TFRecord file(s)")
        self._stats = [records_mod.file_stat(p) for p in self.paths]  # one look at each file (on gs://, a request)
        self.sizes = [size for size, _ in self._stats]
        self._index: list[records_mod.FileIndex] | None = None
        if record_counts is not None:  # known from metadata (TFDS): the byte index can wait until reading
            if len(record_counts) != len(self.paths):
                raise DataError(f"{len(record_counts)} record counts for {len(self.paths)} files. Fix: give one count per file.")
            self.counts = [int(c) for c in record_counts]
        else:
            self._index = records_mod.index_files(self.paths, cache_dir=cache_dir, compression=self.compression,
                                                  stats=self._stats)
            self.counts = [ix.records for ix in self._index]
        self.num_records = int(sum(self.counts))
        if self.num_records == 0:
            raise DataError(f"the data files hold no records; received {self.name!r}. Fix: check the files.")
        # Nothing here may start TensorFlow's runtime (tf.io.gfile does not): multi-worker
        # strategies must be created first, and fit creates them after the source exists.
        # parse_fn is therefore checked on first use (fit's sample, or a dataset).
        self._sample: tuple | None = None
        self._parse_graph: Callable | None = None

    # --- what fit asks of every source ---------------------------------------------------------------

    @property
    def num_examples(self) -> int:
        return self.num_records

    @property
    def example_shape(self) -> Any:
        import tensorflow as tf

        return tf.nest.map_structure(lambda a: tuple(np.shape(a)[1:]), inputs_of(self.sample(1)))

    def failure_of(self, error: BaseException) -> DataError | None:
        """TensorFlow's ``corrupted record at N`` (a record failing its checksum, e.g. a file damaged
        in a copy), as a DataError naming the file: the one with a record at byte ``N`` that fails
        when read again; or its ``NotFoundError`` for one of the files (deleted while training).
        ``None``: not about this source's files."""
        import re

        text = str(error)
        if "No such file" in text or type(error).__name__ == "NotFoundError":
            gone = next((path for path in self.paths if path in text), None)
            if gone is not None:
                return DataError(f"a data file went away during training; received {gone!r}, one of {self.name}. "
                                 "Fix: put it back, then run again (training resumes from its last checkpoint).")
        found = re.search(r"corrupted record at (\d+)", text)
        if found is None or self.compression:  # compressed: the position is in the inflated stream
            return None
        reported = int(found.group(1))  # a record's start (its length failed) or its data's (12 bytes on)
        indexes = self._index or [None] * len(self.paths)
        for path, size, index in zip(self.paths, self.sizes, indexes):
            for offset in (reported, reported - records_mod.HEADER_BYTES):
                if 0 <= offset < size and records_mod.starts_record(path, offset, size, index) and \
                        records_mod.record_fails(path, offset):
                    return DataError(f"a record fails its checksum (TensorFlow: corrupted record at {reported}); "
                                     f"received {path!r}, its record at byte {offset}, in {self.name}. Fix: copy or "
                                     "write the file again, then run again (training resumes from its last checkpoint).")
        return None

    def fingerprint(self) -> str:
        """File names (not directories: the data may move), sizes and record counts."""
        described = [[p.rstrip("/").rsplit("/", 1)[-1], s, c] for p, s, c in zip(self.paths, self.sizes, self.counts)]
        text = json.dumps({"tfrecord": described, "compression": self.compression}, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def sample(self, count: int) -> tuple:
        """The first ``count`` examples, parsed (NumPy)."""
        import tensorflow as tf

        with tf.init_scope():  # eager, also where a dataset is made in a traced function (parameter-server workers)
            if self._sample is None:
                self._check_parse_fn()
            if self._sample[0] < count:
                self._sample = (count, self._read_first(count))
        return tf.nest.map_structure(lambda a: a[:count], self._sample[1])

    def _read_first(self, count: int) -> tuple:
        import tensorflow as tf

        serialized = next(iter(
            tf.data.TFRecordDataset(self.paths, compression_type=self.compression or None).take(count).batch(count)
        ))
        return tf.nest.map_structure(lambda t: np.asarray(t), self._parse(serialized))

    def _parse(self, serialized):
        out = self._parse_as_graph()(serialized)
        if isinstance(out, (tuple, list)) and len(out) in (2, 3):
            return tuple(out)
        if not isinstance(out, (tuple, list)) or len(out) == 1:  # x alone (a tensor, a dict), as Keras' fit takes it
            return tuple(out) if isinstance(out, (tuple, list)) else out
        raise DataError(
            f"`parse_fn` must return x, (x, y) or (x, y, sample_weight); received {type(out).__name__} of length "
            f"{len(out)}. Fix: return a pair of batched tensors, e.g. (parsed['image'], parsed['label']), or the "
            "inputs alone for a model that needs no labels."
        )

    def _parse_as_graph(self) -> Callable:
        """``parse_fn`` as a ``tf.function``, made once.

        AutoGraph converts its Python control flow on tensors, as ``tf.data.Dataset.map`` does for
        a function it is given. The first-records check runs the same graph as training does.
        """
        if self._parse_graph is None:
            import tensorflow as tf

            self._parse_graph = tf.function(self.parse_fn, reduce_retracing=True)
        return self._parse_graph

    def _check_parse_fn(self) -> None:
        import tensorflow as tf

        batch = min(2, self.num_records)
        try:
            element = self._read_first(batch)
        except DataError:
            raise
        except (tf.errors.OpError, ValueError, TypeError, KeyError, AttributeError) as e:
            reason = describe(e, limit=300)
            spec_file = getattr(self.parse_fn, "spec_file", None)
            if spec_file:  # tfdist train --features: the user wrote a spec, not a parse_fn
                raise DataError(
                    f"the records of {self.name!r} do not fit the feature spec ({reason}); received --features "
                    f"{spec_file!r}. Fix: give each feature's key, dtype and shape as the records hold them."
                ) from None
            raise DataError(
                f"`parse_fn` failed on the first records of {self.name!r} ({reason}). "
                "Fix: parse_fn receives a 1-D string tensor of serialized records and runs as a graph, as in "
                "Dataset.map; parse it with tf.io.parse_example and TensorFlow ops (no .numpy())."
            ) from None
        for label, value in zip(("x", "y", "sample_weight"), element if isinstance(element, tuple) else (element,)):
            for leaf in tf.nest.flatten(value):
                if np.ndim(leaf) < 1 or np.shape(leaf)[0] != batch:
                    spec_file = getattr(self.parse_fn, "spec_file", None)
                    if spec_file:  # e.g. a decoded image's shape that does not hold its values
                        raise DataError(
                            f"the records of {self.name!r} do not fit the feature spec ({label} comes out of shape "
                            f"{np.shape(leaf)} for {batch} records); received --features {spec_file!r}. Fix: give "
                            "each feature's shape as one record holds it (a decoded image's shape holds its values)."
                        )
                    raise DataError(
                        f"`parse_fn` must return batched tensors (first dimension = number of records); received {label} of "
                        f"shape {np.shape(leaf)} for {batch} records. Fix: use tf.io.parse_example (not parse_single_example)."
                    )
        self._sample = (batch, element)

    # --- layout --------------------------------------------------------------------------------------

    def layout(self, *, num_replicas: int, num_workers: int = 1, parameter_server: bool = False,
               recorded: dict | None = None) -> Layout:
        """The run's layout: the options given, else the recorded ones (resume), else the defaults."""
        recorded = recorded if isinstance(recorded, dict) and recorded.get("layout") == LAYOUT_VERSION else {}
        defaults = {"streams": num_workers if parameter_server else num_replicas}
        chosen = {}
        for name in ("streams", "block_records", "window_blocks"):
            explicit = getattr(self, name)
            if explicit is not None and recorded.get(name) not in (None, explicit):
                log.warning("%s=%d differs from the run's recorded %s=%d: the data order changes from here",
                            name, explicit, name, recorded[name])
            chosen[name] = explicit if explicit is not None else recorded.get(name)
        streams = chosen["streams"] or defaults["streams"]
        block = chosen["block_records"]
        if block is None:
            average = max(1.0, sum(self.sizes) / self.num_records)
            block = int(round(self.block_bytes / average))
            block = max(1, min(block, self.num_records // (streams * MIN_BLOCKS_PER_STREAM)))
        window = chosen["window_blocks"] or DEFAULT_WINDOW_BLOCKS
        return Layout(streams=int(streams), block_records=int(block), window_blocks=int(window),
                      num_records=self.num_records)

    def steps_per_epoch(self, layout: Layout, global_batch: int, *, parameter_server: bool = False) -> int:
        """Whole steps every stream can feed in one epoch (0 when the data is too small)."""
        if parameter_server:
            return layout.streams * (layout.min_stream_records() // global_batch)
        if global_batch % layout.streams:
            raise BatchSizeError(
                f"the global batch {global_batch} is not divisible by the data's {layout.streams} streams (the replica "
                f"count of the run's first run). Fix: use a global batch that is a multiple of {layout.streams}, "
                "or pass TFRecordSource(streams=...) that divides it (the data order then differs from the recorded run)."
            )
        return layout.min_stream_records() // (global_batch // layout.streams)

    # --- reading -------------------------------------------------------------------------------------

    def _tables(self):
        """Constants of the reading graph: file names, record starts, byte marks."""
        import tensorflow as tf

        if self._index is None:
            self._index = records_mod.index_files(self.paths, cache_dir=self.cache_dir, compression=self.compression,
                                                  counts=self.counts, stats=self._stats)
        starts = np.concatenate([[0], np.cumsum([ix.records for ix in self._index])]).astype(np.int64)
        mark_starts = np.concatenate([[0], np.cumsum([len(ix.marks) for ix in self._index])]).astype(np.int64)
        marks = np.concatenate([np.asarray(ix.marks, np.int64) for ix in self._index])
        offsets = np.concatenate([np.asarray(ix.offsets, np.int64) for ix in self._index])
        return _Tables(
            names=tf.constant(self.paths), starts=tf.constant(starts), mark_starts=tf.constant(mark_starts),
            marks=tf.constant(marks), offsets=tf.constant(offsets), compression=self.compression,
        )

    def reader(self, plan) -> "_Reader":
        return _Reader(self._tables(), plan.layout, seed=plan.seed, shuffle=plan.shuffle)

    def dataset_fn(self, plan, *, start_step: int, stop_step: int | None, parameter_server: bool) -> Callable:
        """See ``pipeline.dataset_fn``: the same contract, for files."""
        import tensorflow as tf

        sizes, spe = plan.sizes, plan.steps_per_epoch
        self.sample(1)  # checks parse_fn here, eagerly: under parameter servers `make` is traced
        parse = self._parse
        last_epoch = (stop_step - 1) // spe if stop_step is not None and not parameter_server else None

        @tf.autograph.experimental.do_not_convert  # graph building only: no tensor-dependent Python control flow
        def make(input_context=None):
            reader = self.reader(plan)
            if parameter_server:
                pipelines = input_context.num_input_pipelines if input_context else 1
                pipeline_id = input_context.input_pipeline_id if input_context else 0
                first_step = start_step + pipeline_id
                epoch_dataset = reader.parameter_server_epoch(spe, sizes.global_batch_size, first_step, pipelines)
                shape = [sizes.global_batch_size]
            else:
                part = order_mod.pipeline_slice(sizes, input_context)
                first_step = start_step
                epoch_dataset = reader.synchronous_epoch(spe, sizes, part, first_step, stop_step)
                shape = [sizes.per_replica_batch_size]
            first_epoch = first_step // spe
            epochs = tf.data.Dataset.range(first_epoch, last_epoch + 1 if last_epoch is not None else 2**62)
            ds = epochs.flat_map(epoch_dataset)
            ds = ds.map(lambda s: tf.ensure_shape(s, shape)).map(
                lambda s: _with_batch_size(parse(s), shape[0]), num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=True)
            return ds

        return make

    def records_dataset(self, begin: int, end: int) -> "tf.data.Dataset":
        """Records ``[begin, end)`` of the files, in order (validation)."""
        self.sample(1)  # checks parse_fn
        tables = self._tables()
        return _read_range(tables, begin, end)


def _with_batch_size(element, size: int):
    """``element``'s dense tensors with their first dimension known to be ``size``.

    A parse function's ``reshape(-1, ...)`` or ``decode_raw`` leaves the batch dimension unknown,
    and the training step would be traced for any batch size, where an in-memory source's
    batches have it; every training batch of a file source is full (parse_fn's first dimension
    is the number of records: ``_check_parse_fn``), so the step gets the same static shapes."""
    import tensorflow as tf

    def pin(t):
        if not isinstance(t, tf.Tensor) or t.shape.rank in (None, 0):
            return t
        return tf.ensure_shape(t, [size, *t.shape.as_list()[1:]])

    return tf.nest.map_structure(pin, element)


@dataclasses.dataclass(frozen=True)
class _Tables:
    names: Any
    starts: Any
    mark_starts: Any
    marks: Any
    offsets: Any
    compression: str


def _read_segment(tables: _Tables, f, lo, hi) -> "tf.data.Dataset":
    """Records ``[lo, hi)`` of file ``f``: opened at the nearest byte mark, then a short header-only skip."""
    import tensorflow as tf

    f, lo, hi = (tf.cast(v, tf.int64) for v in (f, lo, hi))
    m0, m1 = tables.mark_starts[f], tables.mark_starts[f + 1]
    marks = tables.marks[m0:m1]
    c = tf.searchsorted(marks, tf.reshape(lo, [1]), side="right", out_type=tf.int64)[0] - 1
    ds, at_offset = records_mod.open_at(tables.names[f], tables.offsets[m0 + c], compression=tables.compression)
    skip = lo - marks[c] if at_offset else lo
    return ds.skip(skip).take(hi - lo)


def _segments(tables: _Tables, begin, end) -> "tf.data.Dataset":
    """``(file, lo, hi)`` pieces of the global record range ``[begin, end)``."""
    import tensorflow as tf

    starts = tables.starts
    begin, end = tf.cast(begin, tf.int64), tf.cast(end, tf.int64)
    f0 = tf.searchsorted(starts, tf.reshape(begin, [1]), side="right")[0] - 1
    f1 = tf.searchsorted(starts, tf.reshape(tf.maximum(end - 1, begin), [1]), side="right")[0] - 1
    f0, f1 = tf.cast(f0, tf.int64), tf.cast(f1, tf.int64)

    def piece(f):
        return f, tf.maximum(begin, starts[f]) - starts[f], tf.minimum(end, starts[f + 1]) - starts[f]

    return tf.data.Dataset.range(f0, tf.where(end > begin, f1 + 1, f0)).map(piece)


def _read_range(tables: _Tables, begin, end) -> "tf.data.Dataset":
    return _segments(tables, begin, end).interleave(
        lambda f, lo, hi: _read_segment(tables, f, lo, hi), cycle_length=_CYCLE, block_length=2**31 - 1,
        num_parallel_calls=_CYCLE, deterministic=True,
    )


class _Reader:
    """The graph pieces that produce streams, windows and steps (one per pipeline)."""

    def __init__(self, tables: _Tables, layout: Layout, *, seed: int, shuffle: bool):
        self.tables, self.layout, self.seed, self.shuffle = tables, layout, seed, shuffle

    def _blocks(self, stream: int, epoch, window):
        """Block ids of ``window`` of ``stream`` in ``epoch``."""
        import tensorflow as tf

        lay = self.layout
        n = lay.stream_blocks(stream)
        window = tf.cast(window, tf.int64)
        q0 = window * lay.window_blocks
        n = tf.constant(n, tf.int64)
        q1 = tf.where(window == lay.stream_windows(stream) - 1, n, tf.minimum(q0 + lay.window_blocks, n))
        positions = stream + lay.streams * tf.range(q0, q1, dtype=tf.int64)
        if not self.shuffle or lay.full_blocks == 0:
            return positions
        shuffled = order_mod.permuted(tf.minimum(positions, lay.full_blocks - 1), lay.full_blocks,
                                      order_mod.key(self.seed, epoch, order_mod.BLOCKS))
        return tf.where(positions < lay.full_blocks, shuffled, positions)  # the short block stays last

    def _window(self, stream: int, epoch, window) -> "tf.data.Dataset":
        """One element: the records of ``window`` of ``stream``, shuffled (a 1-D string tensor)."""
        import tensorflow as tf

        lay, tables = self.layout, self.tables
        R = lay.block_records
        blocks = tf.data.Dataset.from_tensor_slices(self._blocks(stream, epoch, window))
        segments = blocks.flat_map(lambda b: _segments(tables, b * R, tf.minimum((b + 1) * R, lay.num_records)))
        records = segments.interleave(
            lambda f, lo, hi: _read_segment(tables, f, lo, hi), cycle_length=_CYCLE, block_length=R,
            num_parallel_calls=_CYCLE, deterministic=True,
        )
        ds = records.batch(2 * lay.window_records)  # the whole window: the last one may hold up to 2K - 1 blocks
        if self.shuffle:
            k = order_mod.key(self.seed, epoch, order_mod.WINDOWS, stream, window)
            ds = ds.map(lambda w: tf.gather(w, tf.random.experimental.stateless_shuffle(
                tf.range(tf.shape(w, out_type=tf.int64)[0]), seed=k, alg="philox")))
        return ds

    def stream(self, stream: int, epoch, begin, end) -> "tf.data.Dataset":
        """Records ``[begin, end)`` of ``stream``'s sequence in ``epoch``: only the windows that hold them are read."""
        import tensorflow as tf

        W = self.layout.window_records
        last = self.layout.stream_windows(stream) - 1
        begin, end = tf.cast(begin, tf.int64), tf.cast(end, tf.int64)
        end = tf.maximum(end, begin)

        def window_slice(j):
            lo = tf.maximum(begin - j * W, 0)
            hi = tf.where(j == last, end - j * W, tf.minimum(end - j * W, W))
            return self._window(stream, epoch, j).map(lambda w: w[lo:hi]).unbatch()

        first = tf.minimum(begin // W, last)
        stop = tf.where(end > begin, tf.minimum((end + W - 1) // W, last + 1), first)
        return tf.data.Dataset.range(first, stop).flat_map(window_slice)

    def synchronous_epoch(self, spe: int, sizes, part, first_step: int, stop_step: int | None):
        """``epoch -> dataset`` of this pipeline's per-replica batches of serialized records."""
        import tensorflow as tf

        S = self.layout.streams
        g = sizes.global_batch_size // S
        first_stream, last_stream = part.offset // g, (part.offset + part.length - 1) // g
        lo = part.offset - first_stream * g
        log.info("input pipeline %d of %d reads stream(s) %s of %d", part.pipeline_id, part.pipelines,
                 f"{first_stream}-{last_stream}" if last_stream > first_stream else first_stream, S)
        per_replica = sizes.per_replica_batch_size

        def epoch_dataset(epoch):
            begin, end = order_mod.steps_of_epoch(epoch, steps_per_epoch=spe, first_step=first_step, stop_step=stop_step)
            slabs = tuple(self.stream(s, epoch, begin * g, end * g).batch(g, drop_remainder=True)
                          for s in range(first_stream, last_stream + 1))

            def assemble(*parts):
                joined = tf.concat(parts, 0)[lo:lo + part.length]
                return tf.reshape(joined, [part.local_replicas, per_replica])

            return tf.data.Dataset.zip(slabs).map(assemble).unbatch()

        return epoch_dataset

    def parameter_server_epoch(self, spe: int, global_batch: int, first_step: int, stride: int):
        """``epoch -> dataset`` of whole global batches for the steps ``first_step + k * stride``."""
        import tensorflow as tf

        S = self.layout.streams
        G = global_batch

        def epoch_dataset(epoch):
            begin, end = order_mod.steps_of_epoch(epoch, steps_per_epoch=spe, first_step=first_step, stop_step=None,
                                                  stride=stride)
            steps = tf.data.Dataset.range(begin, end, stride)
            streams = []
            for s in range(S):
                # Slabs of stream s this pipeline runs: steps i = slab * S + s with i = begin (mod stride).
                first_slab = tf.maximum((begin - s + S - 1) // S, 0)
                slabs = self.stream(s, epoch, first_slab * G, (spe // S) * G).batch(G, drop_remainder=True)
                mine = slabs.enumerate(first_slab).filter(
                    lambda k, _, s=s: tf.math.floormod(k * S + s - begin, stride) == 0)
                streams.append(mine.map(lambda _, batch: batch))
            return tf.data.Dataset.choose_from_datasets(streams, steps.map(lambda i: i % S))

        return epoch_dataset
