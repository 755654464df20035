"""How long a training loop waits for tfdist's input pipeline, step by step: a TFRecord file source
against in-memory arrays, behind a consumer that takes a GPU step's time.

RESULTS.md (§GPU, run of 2026-11-26) found tfdist's TFRecord source stalling a 12.4 ms
mixed_bfloat16 step on an H100 by 10.5 %, the in-memory arrays by 0.7 %. This takes the GPU
out: it builds the pipeline ``tfdist.fit`` builds for each source (``data.make_plan`` and
``data.dataset_fn``, one replica, batch 256, the workload of ``benchmarks/gpu.py``: 32x32x3
images stored as uint8 bytes in TFRecords and parsed with ``tf.io.parse_example`` + ``decode_raw``,
or float32 arrays), and reads it behind a consumer that busy-waits ``--consume`` ms per step
(what the training step would take), timing each ``next()``. A source that keeps up waits
~0 ms; one that cannot shows where (epoch starts, window boundaries, steady state). It also
prints each pipeline's element spec: the batch dimension a training step is traced for. The
sources alternate, ``--repeats`` times. No GPU needed.

    python benchmarks/device/input_wait.py [--consume 12] [--steps 50] [--epochs 6] [--files 1] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import _common  # noqa: E402  (benchmarks/_common.py: statistics, the machine)
from gpu import _tfrecord_source  # noqa: E402  (benchmarks/gpu.py: the records and parse function of part d)

BATCH, SHAPE = 256, (32, 32, 3)


def _waits(source, *, epochs: int, consume: float) -> tuple[list[float], int, str]:
    """Each step's wait in ``next()`` (seconds), the steps per epoch, the element spec."""
    from tfdist import data
    from tfdist.data.loading import as_source

    source = as_source(source)
    sizes = data.BatchSizes.resolve(num_replicas=1, batch_size=BATCH)
    plan = data.make_plan(source, sizes, steps_per_epoch=None, epochs=epochs, seed=0)
    ds = data.dataset_fn(source, plan, start_step=0, stop_step=plan.total_steps)(None)
    iterator, waits = iter(ds), []
    for _ in range(plan.total_steps):
        t = time.perf_counter()
        next(iterator)
        waits.append(time.perf_counter() - t)
        end = time.perf_counter() + consume
        while time.perf_counter() < end:  # the step: the training thread is busy
            pass
    spec = ", ".join(str(tuple(s.shape.as_list())) for s in ds.element_spec)
    return waits, plan.steps_per_epoch, spec


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--consume", type=float, default=12.0, help="ms a step takes (default 12: bfloat16 on the H100)")
    p.add_argument("--steps", type=int, default=50, help="steps per epoch (default 50, as gpu.py)")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--files", type=int, default=1, help="TFRecord files (default 1, as gpu.py)")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    _common.quiet_tensorflow()
    info = _common.machine()
    print(f"machine: {_common.describe_machine(info)}", flush=True)
    rng = np.random.default_rng(0)
    x = rng.random((BATCH * args.steps, *SHAPE), dtype=np.float32)
    y = rng.integers(0, 10, len(x)).astype(np.int32)
    directory = tempfile.mkdtemp(prefix="tfdist-input-wait-")
    sources = {"tfrecord": _tfrecord_source(x, y, directory, files=args.files), "arrays": (x, y)}
    results: dict[str, list[dict]] = {name: [] for name in sources}
    for rep in range(args.repeats):
        for name in (list(sources) if rep % 2 == 0 else list(sources)[::-1]):
            waits, spe, spec = _waits(sources[name], epochs=args.epochs, consume=args.consume / 1e3)
            timed = np.array(waits[spe:]) * 1e3  # epochs 2..: the first builds the pipeline
            starts = [waits[e * spe] * 1e3 for e in range(1, args.epochs)]
            r = dict(mean=float(timed.mean()), p95=float(np.percentile(timed, 95)), max=float(timed.max()),
                     epoch_start=float(np.mean(starts)), spec=spec)
            results[name].append(r)
            print(f"  rep {rep} {name:8s}: wait per step mean {r['mean']:.2f} ms, p95 {r['p95']:.2f}, max {r['max']:.1f}; "
                  f"first step of an epoch {r['epoch_start']:.2f} ms; element spec {spec}", flush=True)
    print(f"\n| source ({args.files} file(s) for TFRecord; consumer {args.consume:g} ms a step, {args.steps} steps an epoch, "
          f"epochs 2-{args.epochs}) | wait per step, mean | p95 | first step of an epoch | batch shapes |")
    print("|---|---|---|---|---|")
    for name, runs in results.items():
        print(f"| {name} | {_common.fmt(_common.summary_of(runs, 'mean'), 1, ' ms')} | "
              f"{_common.fmt(_common.summary_of(runs, 'p95'), 1, ' ms')} | "
              f"{_common.fmt(_common.summary_of(runs, 'epoch_start'), 1, ' ms')} | {runs[0]['spec']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
