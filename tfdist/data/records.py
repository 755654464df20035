"""TFRecord files: record counts and byte offsets (scanned once, cached in a small index), and reading at an offset.

A TFRecord file is a sequence of ``uint64 length | uint32 crc(length) | data | uint32
crc(data)``. ``tf.data`` cannot seek to a record by number, so tfdist scans each file's
framing once -- headers only: large records are skipped with a seek, nothing is parsed --
and keeps the byte offset of a record every ``mark_bytes(size)`` bytes (1/64 of the file,
between 4 KiB and 256 KiB). Reading record ``i`` then opens the file at the nearest mark
before ``i`` and skips the few records between, reading at most that many bytes more than
it uses.

The index is a JSON file, ``.tfdist-index.json`` next to the data, or in a cache
directory (``cache_dir=``) when the data directory is read-only. Entries are keyed by file
name, size and modification time: a file changed since is scanned again. Only ``tf.io.gfile`` touches
files, so any TensorFlow filesystem works (``gs://``, ``hdfs://``, ``ram://``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import struct
import time
import uuid
import zlib
from typing import Iterable, Iterator, Sequence

from tfdist.errors import DataError

log = logging.getLogger("tfdist")

INDEX_NAME = ".tfdist-index.json"
INDEX_FORMAT = 1
MAX_MARK_BYTES = 256 << 10
MIN_MARK_BYTES = 4 << 10
_CHUNK = 8 << 20
_HEADER, _FOOTER = 12, 4
HEADER_BYTES = _HEADER
"""A record's length and its checksum, before its data."""
_READ_BUFFER = 256 << 10


@dataclasses.dataclass(frozen=True)
class FileIndex:
    """Records of one file, and the byte offsets of some of them (``marks[i]`` starts at ``offsets[i]``)."""

    path: str
    size: int
    records: int
    marks: tuple[int, ...] = (0,)
    offsets: tuple[int, ...] = (0,)

    def as_entry(self) -> dict:
        return {"size": self.size, "records": self.records, "marks": list(self.marks), "offsets": list(self.offsets)}


def _basename(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def _dirname(path: str) -> str:
    head, sep, _ = path.rstrip("/").rpartition("/")
    return head if sep else "."


def file_size(path: str) -> int:
    return file_stat(path)[0]


def file_stat(path: str) -> tuple[int, int]:
    """``(size in bytes, modification time in ns)`` of a data file (the time is 0 where the
    filesystem keeps none)."""
    import tensorflow as tf

    try:
        stat = tf.io.gfile.stat(path)
    except tf.errors.OpError as e:
        raise DataError(f"cannot read a data file; received {path!r} ({type(e).__name__}). Fix: check the path and its permissions.") from None
    return int(stat.length), int(stat.mtime_nsec)


def mark_bytes(size: int) -> int:
    """Bytes between two marked offsets of a file of ``size`` bytes."""
    return max(MIN_MARK_BYTES, min(MAX_MARK_BYTES, size // 64))


def _record_starts(f, path: str, start: int, stop: int, size: int) -> Iterator[int]:
    """The byte offset of each record of the open file ``f`` (``size`` bytes), from ``start`` (a
    record's) until ``stop``, and finally the first offset at or past ``stop``; headers only (a
    large record is skipped with a seek). A header cut off or a record overrunning the file is a
    DataError."""
    pos = start
    buf, buf_start = b"", 0
    while pos < stop:
        yield pos
        rel = pos - buf_start
        if rel < 0 or rel + _HEADER > len(buf):
            f.seek(pos)
            buf, buf_start, rel = f.read(_CHUNK), pos, 0
            if len(buf) < _HEADER:
                raise _corrupt(path, pos, size, "a record header is cut off")
        (length,) = struct.unpack_from("<Q", buf, rel)
        end = pos + _HEADER + length + _FOOTER
        if end > size:
            raise _corrupt(path, pos, size, f"the record there claims {length} bytes")
        pos = end
    yield pos


def scan(path: str, size: int | None = None, *, compression: str = "") -> FileIndex:
    """Counts the records of a TFRecord file and marks byte offsets (a pass over its headers)."""
    import tensorflow as tf

    size = file_size(path) if size is None else size
    if compression:
        return FileIndex(path, size, _count_compressed(path, compression))
    marks, offsets = [], []
    records = next_mark = 0
    spacing = mark_bytes(size)
    with tf.io.gfile.GFile(path, "rb") as f:
        for pos in _record_starts(f, path, 0, size, size):
            if pos == size:  # the end of the last record
                break
            if pos >= next_mark:
                marks.append(records)
                offsets.append(pos)
                next_mark = pos + spacing
            records += 1
    if not marks:
        marks, offsets = [0], [0]
    return FileIndex(path, size, records, tuple(marks), tuple(offsets))


class _Inflated:
    """``read(n)`` of the decompressed bytes of a GZIP or ZLIB stream (the framing is inside it)."""

    def __init__(self, raw, compression: str):
        self.raw = raw
        self.inflater = zlib.decompressobj(31 if compression == "GZIP" else 15)  # 31: gzip header, 15: zlib header
        self.buffer = b""

    def read(self, n: int) -> bytes:
        while len(self.buffer) < n:
            chunk = self.raw.read(_CHUNK)
            if not chunk:
                self.buffer += self.inflater.flush()
                break
            self.buffer += self.inflater.decompress(chunk)
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out


def _count_compressed(path: str, compression: str) -> int:
    """Records of a compressed file: its framing is read from the decompressed stream (no offsets: no seeking)."""
    import tensorflow as tf

    count = position = 0
    try:
        with tf.io.gfile.GFile(path, "rb") as raw:
            stream = _Inflated(raw, compression)
            while True:
                header = stream.read(_HEADER)
                if not header:
                    return count
                if len(header) < _HEADER:
                    raise _corrupt(path, position, None, "a record header is cut off (decompressed stream)")
                (length,) = struct.unpack_from("<Q", header)
                body = stream.read(length + _FOOTER)
                if len(body) < length + _FOOTER:
                    raise _corrupt(path, position, None, f"the record there claims {length} bytes (decompressed stream)")
                count += 1
                position += _HEADER + length + _FOOTER
    except zlib.error as e:
        raise DataError(f"{path!r} is not a {compression} file ({e}). Fix: check the compression option "
                        "(None for uncompressed files).") from None


def starts_record(path: str, offset: int, size: int, index: FileIndex | None = None) -> bool:
    """Whether a record of ``path`` (``size`` bytes) starts at byte ``offset``: its framing walked
    from the nearest marked offset before it (the headers in between, at most one mark's spacing)."""
    import tensorflow as tf

    start = max((o for o in (index.offsets if index is not None else ()) if o <= offset), default=0)
    try:
        with tf.io.gfile.GFile(path, "rb") as f:
            *_, reached = _record_starts(f, path, start, offset, size)
    except DataError:  # the framing breaks before the offset: no record starts there
        return False
    return reached == offset and offset + _HEADER <= size


def record_fails(path: str, offset: int) -> bool:
    """Whether reading the record of ``path`` at byte ``offset`` fails TFRecord's checksums."""
    import tensorflow as tf

    record = tf.data.Dataset.from_tensors(0).interleave(lambda _: open_at(path, offset)[0]).take(1)
    try:
        for _ in record:
            pass
    except tf.errors.DataLossError:
        return True
    return False


def _corrupt(path: str, pos: int, size: int | None, what: str) -> DataError:
    return DataError(
        f"{path!r} is not a valid TFRecord file: at byte {pos}{f' of {size}' if size is not None else ''}, {what}. "
        "Fix: pass only uncompressed TFRecord files (or compression='GZIP'/'ZLIB' for compressed ones), "
        "and regenerate a file that was cut short."
    )


class IndexCache:
    """Where the index of each data directory is read from and written to."""

    def __init__(self, cache_dir: str | None = None):
        self.cache_dir = cache_dir

    def locations(self, data_dir: str) -> list[str]:
        """Index files, in order of preference: next to the data (shared by every run), then the cache directory."""
        places = [f"{data_dir.rstrip('/')}/{INDEX_NAME}"]
        if self.cache_dir:
            tag = hashlib.sha256(data_dir.encode()).hexdigest()[:12]
            places.append(f"{self.cache_dir.rstrip('/')}/tfdist-index-{tag}.json")
        return places

    @staticmethod
    def read(path: str) -> dict:
        import tensorflow as tf

        try:
            if not tf.io.gfile.exists(path):
                return {}
            with tf.io.gfile.GFile(path, "r") as f:
                content = json.load(f)
        except (tf.errors.OpError, ValueError, OSError):
            return {}  # an unreadable cache is rebuilt, never fatal
        if not isinstance(content, dict) or content.get("format") != INDEX_FORMAT:
            return {}
        return content.get("files", {}) if isinstance(content.get("files"), dict) else {}

    def write(self, data_dir: str, entries: dict) -> str | None:
        """Merges ``entries`` into the first writable index location; returns it (None if none was)."""
        import tensorflow as tf

        for path in self.locations(data_dir):
            try:
                if self.cache_dir and path.startswith(self.cache_dir.rstrip("/") + "/"):
                    tf.io.gfile.makedirs(self.cache_dir)
                merged = dict(self.read(path))
                merged.update(entries)
                tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
                with tf.io.gfile.GFile(tmp, "w") as f:
                    json.dump({"format": INDEX_FORMAT, "files": merged}, f, separators=(",", ":"))
                tf.io.gfile.rename(tmp, path, overwrite=True)
                return path
            except (tf.errors.OpError, OSError):
                continue
        return None


def index_files(
    paths: Sequence[str], *, cache_dir: str | None = None, compression: str = "", counts: Sequence[int] | None = None,
    stats: Sequence[tuple[int, int]] | None = None,
) -> list[FileIndex]:
    """The index of every file: from the cache when its size and modification time match, else
    scanned (and cached). ``stats``: the files' ``file_stat``, if the caller has them."""
    cache = IndexCache(cache_dir)
    stats = [file_stat(p) for p in paths] if stats is None else list(stats)
    sizes = [size for size, _ in stats]
    by_dir: dict[str, list[int]] = {}
    for i, p in enumerate(paths):
        by_dir.setdefault(_dirname(p), []).append(i)
    result: list[FileIndex | None] = [None] * len(paths)
    for data_dir, members in by_dir.items():
        cached: dict = {}
        for location in reversed(cache.locations(data_dir)):  # the preferred location wins
            cached.update(cache.read(location))
        fresh = {}
        started = time.monotonic()
        for i in members:
            name, entry = _basename(paths[i]), cached.get(_basename(paths[i]))
            if _valid(entry, stats[i], compression):
                result[i] = FileIndex(paths[i], sizes[i], int(entry["records"]), tuple(entry["marks"]), tuple(entry["offsets"]))
            else:
                result[i] = scan(paths[i], sizes[i], compression=compression)
                fresh[name] = dict(result[i].as_entry(), compression=compression, mtime_ns=stats[i][1])
        if fresh:
            where = cache.write(data_dir, fresh)
            log.info("indexed %d TFRecord file(s) in %s (%.1f s)%s", len(fresh), data_dir, time.monotonic() - started,
                     f"; cached in {where}" if where else "")
            if where is None:
                log.warning("could not write the record index in %s (read-only?): it will be rebuilt by every run. "
                            "Fix: pass cache_dir= (e.g. the checkpoint directory)", data_dir)
    if counts is not None:
        for index, expected in zip(result, counts):
            if index.records != expected:
                raise DataError(
                    f"{index.path!r} holds {index.records} records but its metadata says {expected}. "
                    "Fix: regenerate the data set (a file was changed or cut short)."
                )
    return result  # type: ignore[return-value]


def _valid(entry, stat: tuple[int, int], compression: str) -> bool:
    """Whether a cached entry still describes the file: a file rewritten in place, even to the
    same size (other records), has another modification time, and is scanned again."""
    size, mtime_ns = stat
    return (isinstance(entry, dict) and entry.get("size") == size and entry.get("mtime_ns") == mtime_ns
            and entry.get("compression", "") == compression
            and isinstance(entry.get("records"), int) and isinstance(entry.get("marks"), list)
            and isinstance(entry.get("offsets"), list) and len(entry["marks"]) == len(entry["offsets"]) >= 1)


def expand(files: str | Iterable[str]) -> list[str]:
    """A glob, or a list of paths and globs, as a list of files (through ``tf.io.gfile``)."""
    import tensorflow as tf

    patterns = [files] if isinstance(files, str) else list(files)
    if not patterns:
        raise DataError("no data files; received files=[]. Fix: pass a glob such as 'data/train-*.tfrecord' or a list of paths.")
    paths: list[str] = []
    for pattern in patterns:
        if not isinstance(pattern, str):
            raise DataError(f"`files` must hold paths (str); received {pattern!r}. Fix: pass a glob or a list of path strings.")
        if any(c in pattern for c in "*?["):
            try:
                matches = sorted(tf.io.gfile.glob(pattern))
            except tf.errors.OpError as e:
                raise DataError(f"cannot list the files of {pattern!r} ({type(e).__name__}). Fix: check the path.") from None
            matches = [m for m in matches if not _basename(m).startswith((INDEX_NAME, "tfdist-index-"))
                       and not tf.io.gfile.isdir(m)]
            if not matches:
                raise DataError(f"no file matches the data pattern; received files={pattern!r}. Fix: check the directory and the pattern.")
            paths.extend(matches)
        else:
            if tf.io.gfile.isdir(pattern):
                raise DataError(f"a data file is a directory; received {pattern!r}. Fix: pass its files as a glob, e.g. "
                                f"'{pattern.rstrip('/')}/*.tfrecord'.")
            if not tf.io.gfile.exists(pattern):
                raise DataError(f"no such data file; received {pattern!r}. Fix: pass existing TFRecord files or a glob.")
            paths.append(pattern)
    if len(set(paths)) != len(paths):
        dup = next(p for p in paths if paths.count(p) > 1)
        raise DataError(f"a data file is listed twice; received {dup!r} twice. Fix: list every file once.")
    return paths


# --- reading -------------------------------------------------------------------------------------


_READER = None


def open_at(filename, byte_offset, *, compression: str = "") -> tuple:
    """``(dataset, reads_from_offset)``: records of ``filename`` from ``byte_offset`` if the op allows it.

    Without the op (or for compressed files) the dataset starts at the first record, and the
    caller skips from there instead.
    """
    import tensorflow as tf

    global _READER
    if _READER is None:
        from tfdist._compat.tensorflow import tfrecord_offset_reader
        _READER = tfrecord_offset_reader(_READ_BUFFER) or False
    if compression or not _READER:
        return tf.data.TFRecordDataset(filename, compression_type=compression or None, buffer_size=_READ_BUFFER), False
    return _READER(filename, byte_offset), True
