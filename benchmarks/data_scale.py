"""The file source at scale: throughput, bytes read per worker, resume latency, time to the first step.

A TFRecord data set of ``--gb`` GB (32x32x3 uint8 images stored as raw bytes, and a label;
~3.1 KB a record, files of ~64 MB) is generated once under ``--data-dir`` and reused. Every
measurement runs in a fresh process; variants alternate (A B, B A, ...):

* (a) input examples/s of ``TFRecordSource`` (tfdist's pipeline for one replica, batched
  ``parse_example``) vs a hand-written ``TFRecordDataset(num_parallel_reads=4) -> shuffle(10k)
  -> map(parse one example) -> batch -> prefetch``; the same decoding, no training. Target
  >= 0.9x. Also against the hand-written pipeline that parses whole batches (``shuffle ->
  batch -> map(parse_example)``): the cost of tfdist's blocks, windows and streams alone.
* (b) bytes read by one worker's input pipeline (``rchar`` of /proc/self/io) for the same
  global steps, with 2 workers vs 1 (2 replicas, 2 streams). Target <= 0.55x.
* (c) resume latency: from ``dataset_fn(start_step=S)`` to its first batch, at the last step
  of an epoch vs at step 10. Target <= 1.5x.
* (d) time before the first batch, from nothing (record index scanned) and with the index
  cached: constructing the source, planning, first batch.
* (e) training: ``tfdist.fit`` on the files, one_device vs 2-worker multi_worker_mirrored
  (``tfdist launch``), same global batch and steps: bytes each worker read (target <= 0.55x);
  and mirrored on 2 logical CPUs (one process reads for both replicas: ~1x).

Peak RSS of every process is reported against the data size.

    python benchmarks/data_scale.py [--quick] [--gb 4] [--data-dir /tmp/tfdist-data-scale] [--json PATH]
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

SHAPE = (32, 32, 3)
FILE_BYTES = 64 << 20
BATCH = 256
TARGETS = {"a": 0.9, "b": 0.55, "c": 1.5, "e": 0.55}


# --- the data ------------------------------------------------------------------------------------
def _record_size() -> int:
    import tensorflow as tf

    return len(_example(tf, b"\0" * (SHAPE[0] * SHAPE[1] * SHAPE[2]), 7))


def _example(tf, image: bytes, label: int) -> bytes:
    feature = {"image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image])),
               "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))}
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def generate(directory: str, gb: float) -> dict:
    """Writes (once) ``gb`` GB of records; returns the manifest (files, records, bytes)."""
    import numpy as np
    import tensorflow as tf

    manifest_path = os.path.join(directory, "manifest.json")
    if os.path.exists(manifest_path):
        with open(manifest_path) as f:
            manifest = json.load(f)
        if manifest.get("gb") == gb and all(os.path.exists(p) for p in manifest["files"]):
            return manifest
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    per_record = _record_size() + 16
    per_file = FILE_BYTES // per_record
    total = int(gb * 1e9) // per_record
    rng = np.random.default_rng(0)
    pixels = SHAPE[0] * SHAPE[1] * SHAPE[2]
    files, written, start = [], 0, time.perf_counter()
    while written < total:
        path = os.path.join(directory, f"train-{len(files):05d}.tfrecord")
        n = min(per_file, total - written)
        images = rng.integers(0, 256, (n, pixels), dtype=np.uint8)
        labels = rng.integers(0, 10, n)
        with tf.io.TFRecordWriter(path) as w:
            for i in range(n):
                w.write(_example(tf, images[i].tobytes(), int(labels[i])))
        files.append(path)
        written += n
        print(f"  wrote {path} ({written:,}/{total:,} records, {time.perf_counter() - start:.0f} s)", flush=True)
    manifest = {"gb": gb, "files": files, "records": written, "bytes": sum(os.path.getsize(p) for p in files)}
    with open(manifest_path, "w") as f:
        json.dump(manifest, f)
    return manifest


def parse_batch(serialized):
    """tfdist's parse_fn: a batch of records at once."""
    import tensorflow as tf

    parsed = tf.io.parse_example(serialized, {"image": tf.io.FixedLenFeature([], tf.string),
                                              "label": tf.io.FixedLenFeature([], tf.int64)})
    image = tf.reshape(tf.io.decode_raw(parsed["image"], tf.uint8), [-1, *SHAPE])
    return tf.cast(image, tf.float32) / 255.0, parsed["label"]


def parse_one(serialized):
    """The hand-written pipeline's map function: one record."""
    import tensorflow as tf

    parsed = tf.io.parse_single_example(serialized, {"image": tf.io.FixedLenFeature([], tf.string),
                                                     "label": tf.io.FixedLenFeature([], tf.int64)})
    image = tf.reshape(tf.io.decode_raw(parsed["image"], tf.uint8), SHAPE)
    return tf.cast(image, tf.float32) / 255.0, parsed["label"]


# --- children --------------------------------------------------------------------------------------
def _rchar() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    return 0


def _peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


class _Context:
    def __init__(self, pipelines: int, pipeline_id: int):
        self.num_input_pipelines, self.input_pipeline_id = pipelines, pipeline_id
        self.num_replicas_in_sync = 2


def _source_and_plan(files, *, replicas: int, streams: int | None = None):
    from tfdist import data

    source = data.TFRecordSource(files, parse_batch, streams=streams)
    sizes = data.BatchSizes.resolve(num_replicas=replicas, batch_size=BATCH)
    plan = data.make_plan(source, sizes, steps_per_epoch=None, epochs=1, seed=0)
    return source, plan


def child(spec: dict) -> None:
    _common.quiet_tensorflow()
    import tensorflow as tf

    from tfdist import data

    files, part = spec["files"], spec["part"]
    if part == "a":
        if spec["variant"] == "tfdist":
            source, plan = _source_and_plan(files, replicas=1)
            ds = data.dataset_fn(source, plan, start_step=0, stop_step=plan.total_steps)(None)
        elif spec["variant"] == "plain":
            ds = (tf.data.TFRecordDataset(files, num_parallel_reads=4).shuffle(10_000, seed=0)
                  .map(parse_one, num_parallel_calls=tf.data.AUTOTUNE).batch(BATCH, drop_remainder=True)
                  .prefetch(tf.data.AUTOTUNE))
        else:  # plain, parsing whole batches like tfdist
            ds = (tf.data.TFRecordDataset(files, num_parallel_reads=4).shuffle(10_000, seed=0)
                  .batch(BATCH, drop_remainder=True).map(parse_batch, num_parallel_calls=tf.data.AUTOTUNE)
                  .prefetch(tf.data.AUTOTUNE))
        seconds = _common.time_batches(ds, warmup=spec["warmup"], batches=spec["batches"])
        _common.emit({"examples_per_sec": spec["batches"] * BATCH / seconds, "seconds": seconds,
                      "peak_rss_gb": _peak_rss_gb()})
    elif part == "b":
        source, plan = _source_and_plan(files, replicas=2)
        context = _Context(spec["pipelines"], 0)
        ds = data.dataset_fn(source, plan, start_step=0, stop_step=spec["steps"])(context)
        before = _rchar()
        elements = sum(1 for _ in ds)
        _common.emit({"bytes": _rchar() - before, "elements": elements, "peak_rss_gb": _peak_rss_gb()})
    elif part == "c":
        source, plan = _source_and_plan(files, replicas=1)
        start_step = plan.steps_per_epoch - 1 if spec["where"] == "last" else 10
        t0 = time.perf_counter()
        ds = data.dataset_fn(source, plan, start_step=start_step, stop_step=plan.total_steps)(None)
        x, _y = next(iter(ds))
        _common.emit({"seconds": time.perf_counter() - t0, "start_step": start_step,
                      "steps_per_epoch": plan.steps_per_epoch, "peak_rss_gb": _peak_rss_gb()})
    elif part == "d":
        t0 = time.perf_counter()
        source, plan = _source_and_plan(files, replicas=1)
        ds = data.dataset_fn(source, plan, start_step=0, stop_step=plan.total_steps)(None)
        x, _y = next(iter(ds))
        _common.emit({"seconds": time.perf_counter() - t0, "peak_rss_gb": _peak_rss_gb()})
    elif part == "e":
        if spec["strategy"] == "mirrored":
            from tfdist.strategy import split_cpu

            split_cpu(2)
        import tf_keras

        import tfdist

        source = tfdist.TFRecordSource(files, parse_batch)

        def build():
            model = tf_keras.Sequential([tf_keras.layers.Flatten(input_shape=SHAPE), tf_keras.layers.Dense(10)])
            model.compile(optimizer="sgd", loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            return model

        before, t0 = _rchar(), time.perf_counter()
        history = tfdist.fit(build, source, epochs=1, steps_per_epoch=spec["steps"], batch_size=BATCH,
                             strategy=spec["strategy"], seed=0, verbose=0)
        _common.emit({"bytes": _rchar() - before, "seconds": time.perf_counter() - t0,
                      "replicas": history.tfdist.num_replicas, "workers": history.tfdist.num_workers,
                      "peak_rss_gb": _peak_rss_gb()})


def _launch_two_workers(spec: dict, timeout: float) -> list[dict]:
    """Runs part (e) as a 2-worker multi_worker_mirrored cluster through ``tfdist launch``."""
    script = os.path.abspath(__file__)
    proc = subprocess.run(
        [sys.executable, "-m", "tfdist", "launch", "--workers", "2", "--max-restarts", "0", "--",
         sys.executable, script, "--child", json.dumps(spec)],
        capture_output=True, text=True, timeout=timeout, env=_common.child_env(), cwd=_common.REPO,
    )
    results = []
    for line in proc.stdout.splitlines() + proc.stderr.splitlines():
        _, _, rest = line.partition("] ")
        if rest.startswith(_common.RESULT_PREFIX):
            results.append(json.loads(rest[len(_common.RESULT_PREFIX):]))
    if proc.returncode != 0 or len(results) != 2:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise RuntimeError(f"the 2-worker cluster failed (exit code {proc.returncode})")
    return results


# --- the run ---------------------------------------------------------------------------------------
def main() -> None:
    p = _common.parser(__doc__.splitlines()[0])
    p.add_argument("--gb", type=float, default=None, help="size of the generated data set (default 4; quick 0.1)")
    p.add_argument("--data-dir", default="/tmp/tfdist-data-scale", help="where the data is generated once and reused")
    _common.add_reps_option(p, default=3)
    p.add_argument("--parts", default="abcde", help="which parts to run (default abcde)")
    args = p.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    quick = args.quick
    gb = args.gb if args.gb is not None else (0.1 if quick else 4.0)
    reps = args.reps or (1 if quick else 3)
    directory = args.data_dir + ("-quick" if quick and args.gb is None else "")
    info = _common.machine(paths=[directory])
    print("generating / reusing the data set ...", flush=True)
    manifest = generate(directory, gb)
    files = manifest["files"]
    data_gb = manifest["bytes"] / 1e9
    print(f"data: {len(files)} files, {manifest['records']:,} records, {data_gb:.2f} GB", flush=True)
    script = os.path.abspath(__file__)
    results: dict = {"manifest": {k: v for k, v in manifest.items() if k != "files"}, "data_gb": data_gb}
    rows, notes, peaks = [], [], []

    def run(spec, timeout=1200):
        r = _common.run_child(script, dict(spec, files=files), timeout=timeout)
        peaks.append(r.get("peak_rss_gb", 0.0))
        return r

    # Make sure the record index exists before the timed parts (d measures both cases itself).
    run({"part": "d"})

    if "a" in args.parts:
        batches, warmup = (40, 10) if quick else (400, 40)
        runs = {"tfdist": [], "plain": [], "plain-batched": []}
        for rep, variant in _common.alternate(tuple(runs), reps):
            r = run({"part": "a", "variant": variant, "batches": batches, "warmup": warmup})
            runs[variant].append(r["examples_per_sec"])
            print(f"  (a) rep {rep} {variant}: {r['examples_per_sec']:,.0f} examples/s", flush=True)
        results["a"] = {"runs": runs}
        for baseline, label, target in (("plain", "map(parse one example) -> batch", f">= {TARGETS['a']}"),
                                        ("plain-batched", "batch -> map(parse_example)", "(>= 0.9)")):
            ratios = [a / b for a, b in zip(runs["tfdist"], runs[baseline])]
            results["a"][f"ratios_{baseline}"] = ratios
            stats = _common.summary(ratios)
            rows.append((f"(a) input examples/s, TFRecordSource / hand-written `shuffle -> {label}` (one worker)",
                         f"{_common.fmt_ratio(stats)}; {_common.fmt(_common.summary(runs['tfdist']), digits=4)} vs "
                         f"{_common.fmt(_common.summary(runs[baseline]), digits=4)} examples/s",
                         target, _common.verdict(stats["median"], TARGETS["a"], below=False)))

    if "b" in args.parts:
        steps = 20 if quick else 200
        runs = {1: [], 2: []}
        for rep, pipelines in _common.alternate((1, 2), reps):
            r = run({"part": "b", "pipelines": pipelines, "steps": steps})
            runs[pipelines].append(r["bytes"])
            print(f"  (b) rep {rep} {pipelines} worker(s): worker 0 read {r['bytes'] / 1e6:,.1f} MB", flush=True)
        ratios = [b / a for a, b in zip(runs[1], runs[2])]
        results["b"] = {"runs": runs, "ratios": ratios, "steps": steps}
        stats = _common.summary(ratios)
        rows.append((f"(b) bytes read by a worker's pipeline, 2 workers / 1 worker ({steps} steps of {BATCH})",
                     f"{_common.fmt_ratio(stats)}; {_common.fmt(_common.summary(runs[2]), 1e-6, ' MB')} vs "
                     f"{_common.fmt(_common.summary(runs[1]), 1e-6, ' MB')}",
                     f"<= {TARGETS['b']}", _common.verdict(stats["median"], TARGETS["b"])))

    if "c" in args.parts:
        runs = {"10": [], "last": []}
        for rep, where in _common.alternate(("10", "last"), reps + (0 if quick else 2)):
            r = run({"part": "c", "where": where})
            runs[where].append(r["seconds"])
            results.setdefault("c_steps", {})[where] = r["start_step"]
            print(f"  (c) rep {rep} start at step {r['start_step']:,}: first batch after {r['seconds']:.3f} s", flush=True)
        ratios = [b / a for a, b in zip(runs["10"], runs["last"])]
        results["c"] = {"runs": runs, "ratios": ratios}
        stats = _common.summary(ratios)
        last = results["c_steps"]["last"]
        rows.append((f"(c) resume latency, step {last:,} (last of the epoch) / step 10",
                     f"{_common.fmt_ratio(stats)}; {_common.fmt(_common.summary(runs['last']), unit=' s')} vs "
                     f"{_common.fmt(_common.summary(runs['10']), unit=' s')}",
                     f"<= {TARGETS['c']}", _common.verdict(stats["median"], TARGETS["c"])))

    if "d" in args.parts:
        runs = {"scanned": [], "cached": []}
        index = os.path.join(directory, ".tfdist-index.json")
        for rep, variant in _common.alternate(("scanned", "cached"), reps):
            if variant == "scanned" and os.path.exists(index):
                os.remove(index)
            r = run({"part": "d"})
            runs[variant].append(r["seconds"])
            print(f"  (d) rep {rep} index {variant}: first batch after {r['seconds']:.2f} s", flush=True)
        results["d"] = {"runs": runs}
        rows.append(("(d) time to the first batch (source, plan, first batch): index scanned / cached",
                     f"{_common.fmt(_common.summary(runs['scanned']), unit=' s')} / "
                     f"{_common.fmt(_common.summary(runs['cached']), unit=' s')}", "–", "–"))

    if "e" in args.parts:
        steps = 20 if quick else 400
        runs = {"one_device": [], "two_workers": [], "mirrored": []}
        seconds = {name: [] for name in runs}
        for rep, variant in _common.alternate(tuple(runs), reps):
            spec = {"part": "e", "steps": steps, "files": files}
            if variant != "two_workers":
                r = run(dict(spec, strategy=variant))
                runs[variant].append(r["bytes"])
                seconds[variant].append(r["seconds"])
            else:
                both = _launch_two_workers(dict(spec, strategy="multi_worker_mirrored"), timeout=1200)
                peaks.extend(r.get("peak_rss_gb", 0.0) for r in both)
                assert all(r["workers"] == 2 for r in both), both
                runs[variant].append(max(r["bytes"] for r in both))
                seconds[variant].append(max(r["seconds"] for r in both))
            print(f"  (e) rep {rep} {variant}: a worker read {runs[variant][-1] / 1e6:,.1f} MB "
                  f"in {seconds[variant][-1]:.1f} s", flush=True)
        ratios = [b / a for a, b in zip(runs["one_device"], runs["two_workers"])]
        results["e"] = {"runs": runs, "seconds": seconds, "ratios": ratios, "steps": steps}
        stats = _common.summary(ratios)
        rows.append((f"(e) tfdist.fit on the files, {steps} steps of {BATCH}: bytes read per worker, "
                     "2-worker multi_worker_mirrored / one_device",
                     f"{_common.fmt_ratio(stats)}; {_common.fmt(_common.summary(runs['two_workers']), 1e-6, ' MB')} vs "
                     f"{_common.fmt(_common.summary(runs['one_device']), 1e-6, ' MB')}",
                     f"<= {TARGETS['e']}", _common.verdict(stats["median"], TARGETS["e"])))
        mirrored = _common.summary([b / a for a, b in zip(runs["one_device"], runs["mirrored"])])
        rows.append(("(e) the same, mirrored (2 logical CPUs, one process) / one_device",
                     f"{_common.fmt_ratio(mirrored)}; {_common.fmt(_common.summary(runs['mirrored']), 1e-6, ' MB')}; "
                     f"training time {_common.fmt(_common.summary(seconds['mirrored']), unit=' s')} vs "
                     f"{_common.fmt(_common.summary(seconds['one_device']), unit=' s')} (one_device), "
                     f"{_common.fmt(_common.summary(seconds['two_workers']), unit=' s')} (2 workers)", "(~1)", "–"))

    results["peak_rss_gb"] = max(peaks) if peaks else None
    notes.append(f"Data: {len(files)} TFRecord files, {manifest['records']:,} records of {SHAPE} uint8 images "
                 f"(raw bytes) + label, {data_gb:.2f} GB; peak RSS of any process {max(peaks):.2f} GB "
                 f"({max(peaks) / data_gb:.2f}x the data).")
    notes.append("bytes = rchar of /proc/self/io over the reading (reads from the page cache count).")
    _common.finish(title="The file source at scale (`benchmarks/data_scale.py`)", info=info,
                   command="python benchmarks/data_scale.py" + (" --quick" if quick else ""), results=results,
                   rows=rows, notes=notes, args=args)


if __name__ == "__main__":
    main()
