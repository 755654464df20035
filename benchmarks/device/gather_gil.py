"""What running Python in the input pipeline costs: tfdist's in-memory gather beside a busy Python thread.

A suspect for mixed_bfloat16's 1.048 in RESULTS.md (§GPU, part a): in-memory arrays are read
through ``tf.numpy_function``, which runs Python, and so takes the GIL, in a tf.data thread.
This reads the batches of a CIFAR-sized array (256 images a step) three ways, interleaved: the
real ``ArraySource.gather_fn`` as tfdist's pipeline calls it (``steps_per_read`` steps a call),
and ``tf.gather`` from a copy of the array in a CPU ``tf.Variable`` or in a captured tensor (no
Python; but a second copy of the data in memory, and a captured tensor is serialized into the
dataset's graph when tf.data optimizes it). For each: the images/s read while the main thread
sleeps, the images/s read while it counts in a pure-Python loop (a training loop's thread at
its busiest), and that loop's speed relative to its speed with no pipeline running. A reader
that runs Python waits for the GIL while the loop holds it; one that holds the GIL slows the
loop. ``--read-mib`` changes tfdist's read budget (``pipeline.READ_BYTES``) for the run. No GPU
needed.

    python benchmarks/device/gather_gil.py [--repeats 5] [--seconds 3] [--read-mib 4]
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import _common  # noqa: E402  (benchmarks/_common.py: statistics, the alternating order, the machine)

BATCH, EXAMPLES, SHAPE = 256, 20_000, (32, 32, 3)
KINDS = {
    "tfdist": "tf.numpy_function on the NumPy array (tfdist's gather_fn)",
    "variable": "tf.gather from a copy of the array in a CPU tf.Variable: no Python",
    "constant": "tf.gather from a copy of the array in a captured tensor: no Python",
}


def _pipeline(kind: str, x: np.ndarray, y: np.ndarray):
    import tensorflow as tf

    from tfdist.data.arrays import ArraySource
    from tfdist.data.pipeline import steps_per_read

    source = ArraySource(x, y)
    steps = steps_per_read(source.example_bytes * BATCH)
    if kind == "tfdist":
        gather = source.gather_fn()
    elif kind == "variable":
        with tf.init_scope(), tf.device("/cpu:0"):
            copies = (tf.Variable(x, trainable=False), tf.Variable(y, trainable=False))
        gather = lambda idx: tuple(tf.gather(c, idx) for c in copies)  # noqa: E731
    else:
        copies = (tf.constant(x), tf.constant(y))
        gather = lambda idx: tuple(tf.gather(c, idx) for c in copies)  # noqa: E731
    indices = tf.data.Dataset.range(2**62).map(
        lambda s: tf.random.stateless_uniform([steps * BATCH], [7, s], 0, EXAMPLES, tf.int64))
    return indices.map(gather, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).prefetch(2), steps


def _read(ds, steps: int, stop: threading.Event, marks: list) -> None:
    """Reads ``ds`` until ``stop``, appending (time, images read so far) after every 8 reads."""
    import tensorflow as tf

    it = iter(ds)

    @tf.function
    def take(n):
        acc = tf.constant(0.0)
        for _ in tf.range(n):
            x, _ = next(it)
            acc += tf.reshape(x, [-1])[0]
        return acc

    take(tf.constant(1))
    done = 0
    while not stop.is_set():
        take(tf.constant(8))
        done += 8 * steps * BATCH
        marks.append((time.perf_counter(), done))


def _rate(marks: list, begin: float, end: float) -> float:
    inside = [(t, n) for t, n in list(marks) if begin <= t <= end]
    (t0, n0), (t1, n1) = inside[0], inside[-1]
    return (n1 - n0) / (t1 - t0)


def _count(seconds: float) -> float:
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        n += 1
    return n / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--read-mib", type=float, default=None,
                        help="tfdist's read budget (pipeline.READ_BYTES) for this run, in MiB; default: tfdist's")
    args = parser.parse_args()
    if args.read_mib is not None:
        from tfdist.data import pipeline

        pipeline.READ_BYTES = int(args.read_mib * 2**20)
    info = _common.machine()
    rng = np.random.default_rng(0)
    x = rng.random((EXAMPLES, *SHAPE), dtype=np.float32)
    y = rng.integers(0, 10, EXAMPLES)
    loop, idle, busy = ({kind: [] for kind in KINDS} for _ in range(3))
    for _, kind in _common.alternate(list(KINDS), args.repeats):
        alone = _count(args.seconds)
        ds, steps = _pipeline(kind, x, y)
        stop, marks = threading.Event(), []
        reader = threading.Thread(target=_read, args=(ds, steps, stop, marks))
        reader.start()
        while not marks and reader.is_alive():  # a captured tensor is serialized first: seconds
            time.sleep(0.05)
        time.sleep(1.0)  # the pipeline's buffers filled
        begin = time.perf_counter()
        time.sleep(args.seconds)  # the main thread idle
        middle = time.perf_counter()
        beside = _count(args.seconds)  # the main thread busy in Python
        end = time.perf_counter()
        stop.set()
        reader.join()
        loop[kind].append(beside / alone)
        idle[kind].append(_rate(marks, begin, middle))
        busy[kind].append(_rate(marks, middle, end))
    info["load_average_at_end"] = [round(v, 2) for v in os.getloadavg()]

    print(f"\nMachine: {_common.describe_machine(info)}")
    print(f"{BATCH} images of {SHAPE} a step, {steps} step(s) a read, {args.repeats} repetitions of "
          f"{args.seconds:g} s, the readers alternated\n")
    print("| reader | images/s, main thread idle | images/s beside a busy Python loop | that loop's speed / alone |")
    print("|---|---|---|---|")
    stats = {kind: [_common.summary(v[kind]) for v in (idle, busy, loop)] for kind in KINDS}
    for kind, what in KINDS.items():
        rate_idle, rate_busy, speed = stats[kind]
        print(f"| {what} | {_common.fmt(rate_idle, 1e-3, 'k')} | {_common.fmt(rate_busy, 1e-3, 'k')} | "
              f"{_common.fmt_ratio(speed)} |")
    for kind in ("variable", "constant"):
        idle_ratio, busy_ratio, speed_ratio = (a["median"] / b["median"] for a, b in zip(stats["tfdist"], stats[kind]))
        print(f"\ntfdist / {kind}: images/s idle {idle_ratio:.2f}, beside the loop {busy_ratio:.2f}; "
              f"the loop's speed {speed_ratio:.2f}")

if __name__ == "__main__":
    main()
