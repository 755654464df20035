"""Step-time overhead of ``tfdist.fit`` over plain tf_keras ``model.fit`` (target: ratio <= 1.02).

Both variants train the same built-in model on the same digits training split with the
same global batch, number of steps, seed and strategy (``OneDeviceStrategy`` on the CPU):

* plain:  model built and compiled in ``tf.distribute.OneDeviceStrategy("/cpu:0").scope()``,
  data ``Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed).batch(B, drop_remainder=True)``,
  ``model.fit(ds, epochs=E)``;
* tfdist: ``tfdist.fit(builder, source, epochs=E, batch_size=B, strategy="one_device")``
  without a checkpoint directory;
* plain+prefetch: plain with ``.prefetch(AUTOTUNE)`` added -- a stricter baseline, since
  tfdist's own pipeline prefetches (information; the target is against plain).

Each variant runs in its own fresh Python process (tfdist enables Keras' generator-based
dropout RNG globally, which must not leak into a plain run). The processes of one
repetition run in lockstep: each trains one epoch while the others wait (between epochs,
inside a callback), in a rotating order -- A B C, B C A, ... -- so only one trains at a time
and every epoch is measured next to the others' epochs, which cancels the slow load drifts
of a shared machine. All of a process's work (setup, epochs, the work between epochs, the
end of fit) happens in its own turn; waiting time is left out of every figure.

Steady-state step time: a callback (epoch hooks only) records when each epoch begins and
ends. The first epoch (tracing, pipeline warm-up) is excluded. Two figures:

* step time (the target's figure) = median duration of epochs 2..E / steps per epoch: the
  training steps themselves, robust to the load spikes of a shared machine;
* step time with epoch boundaries = (end of epoch E - start of epoch 2) / steps: adds what
  happens between epochs. Plain Keras re-creates its distributed iterator at every epoch
  of a finite dataset (tens to hundreds of ms on this machine); tfdist's dataset spans all
  epochs, so Keras keeps one iterator.

The epoch-level callback adds no batch hooks, so plain Keras keeps its batch-hook-free path
while tfdist's own callback runs at every batch -- its cost is measured. ``--timer batch``
instead takes the median gap between batch ends, which forces a host sync after every step
in both variants. The whole-call wall time (setup included) is reported for information.

    python benchmarks/fit_overhead.py [--quick] [--json PATH] [--markdown PATH]
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

TARGET = 1.02
DEFAULT_CONFIGS = ("cnn:32:20", "mlp:64:40")
VARIANTS = ("plain", "tfdist", "plain+prefetch")


def _timer_class(kind: str, turns):
    import tf_keras

    class Timer(tf_keras.callbacks.Callback):
        """Epoch-level (default) or batch-level timestamps; hands the turn back between epochs."""

        def __init__(self):
            super().__init__()
            self.epoch_begin: list[float] = []
            self.epoch_end: list[float] = []
            self.boundaries: list[float] = []
            self.batch_ends: list[list[float]] = []

        def on_epoch_begin(self, epoch, logs=None):
            now = time.perf_counter()
            if self.epoch_end:  # end of this process's turn: wait until the others ran an epoch
                self.boundaries.append(now - self.epoch_end[-1])
                now = turns.pass_turn()
            self.epoch_begin.append(now)
            self.batch_ends.append([])

        def on_epoch_end(self, epoch, logs=None):
            self.epoch_end.append(time.perf_counter())

        if kind == "batch":
            def on_train_batch_end(self, batch, logs=None):  # logs arrive as NumPy: the step has finished
                self.batch_ends[-1].append(time.perf_counter())

    return Timer


def child(spec: dict, conn) -> None:
    """One variant, in its own process; runs only while it holds the turn."""
    _common.quiet_tensorflow()
    import numpy as np
    import tensorflow as tf
    import tf_keras

    import tfdist
    from tfdist import data as data_mod
    from tfdist import models

    train, _ = data_mod.load_digits()
    x, y = train.x, train.y
    builder = models.builder(spec["model"], input_shape=x.shape[1:], num_classes=10, keras=spec.get("keras", "2"))
    batch, epochs, seed = spec["batch"], spec["epochs"], spec["seed"]
    turns = _common.Turns(conn)
    timer = _timer_class(spec["timer"], turns)()
    turns.start()  # first turn: setup + first epoch
    start = time.perf_counter()
    if spec["variant"].startswith("plain"):
        tf_keras.utils.set_random_seed(seed)
        strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
        with strategy.scope():
            model = builder()
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=seed).batch(batch, drop_remainder=True)
        if spec["variant"] == "plain+prefetch":
            ds = ds.prefetch(tf.data.AUTOTUNE)
        model.fit(ds, epochs=epochs, verbose=0, callbacks=[timer])
    else:
        history = tfdist.fit(builder, train, epochs=epochs, batch_size=batch, strategy="one_device", seed=seed,
                             verbose=0, callbacks=[timer])
        assert history.tfdist.strategy == "one_device", history.tfdist
    end = time.perf_counter()
    steps_per_epoch = len(x) // batch
    timed_steps = steps_per_epoch * (epochs - 1)
    durations = [e - b for b, e in zip(timer.epoch_begin, timer.epoch_end)]
    if spec["timer"] == "batch":
        # Median gap between consecutive batch ends inside an epoch (epoch boundaries left out).
        step = float(np.median(np.concatenate([np.diff(ends) for ends in timer.batch_ends[1:]])))
    else:
        step = float(np.median(durations[1:])) / steps_per_epoch
    turns.finish({
        "variant": spec["variant"],
        "step_seconds": step,
        # Epochs 2..E plus the boundaries between them (waiting for the turn left out).
        "span_step_seconds": (sum(durations[1:]) + sum(timer.boundaries)) / timed_steps,
        "epoch_seconds": durations,
        "boundary_seconds": timer.boundaries,
        "first_epoch_seconds": durations[0],
        "call_seconds": end - start - turns.waited,
        "after_training_seconds": end - timer.epoch_end[-1],
        "setup_seconds": timer.epoch_begin[0] - start,
        "steps_per_epoch": steps_per_epoch,
        "epochs_timed": len(durations) - 1,
    })


def main() -> None:
    p = _common.parser(__doc__.splitlines()[0])
    p.add_argument("--configs", nargs="+", default=None,
                   help=f"MODEL:BATCH:EPOCHS triples (default {' '.join(DEFAULT_CONFIGS)}; --quick cnn:32:3)")
    p.add_argument("--reps", type=int, default=None, help="repetitions per variant (default 4; --quick 1)")
    p.add_argument("--timer", choices=("epoch", "batch"), default="epoch")
    args = p.parse_args()
    _common.quiet_tensorflow()
    reps = args.reps or (1 if args.quick else 4)
    configs = args.configs or (("cnn:32:3",) if args.quick else DEFAULT_CONFIGS)
    info = _common.machine()
    print("machine:", _common.describe_machine(info), flush=True)
    results, rows = {}, []
    for config in configs:
        model, batch, epochs = config.split(":")
        batch, epochs = int(batch), int(epochs)
        runs = {v: [] for v in VARIANTS}
        for rep in range(reps):
            specs = {v: dict(variant=v, model=model, batch=batch, epochs=epochs, seed=rep, timer=args.timer)
                     for v in VARIANTS}
            for variant, r in _common.lockstep(child, specs, rotation=rep).items():
                runs[variant].append(r)
                print(f"  {config} rep {rep} {variant:14s}: step {r['step_seconds'] * 1e3:.3f} ms, with boundaries "
                      f"{r['span_step_seconds'] * 1e3:.3f} ms, first epoch {r['first_epoch_seconds']:.2f} s, "
                      f"call {r['call_seconds']:.2f} s (after training {r['after_training_seconds']:.2f} s)", flush=True)
        keys = ("step_seconds", "span_step_seconds", "call_seconds", "setup_seconds", "first_epoch_seconds")
        s = {variant: {key: _common.summary([r[key] for r in runs[variant]]) for key in keys} for variant in runs}
        ratio = {key: _common.summary([t[key] / pl[key] for pl, t in zip(runs["plain"], runs["tfdist"])])
                 for key in ("step_seconds", "span_step_seconds", "call_seconds")}
        ratio_prefetch = {key: _common.summary([t[key] / pl[key] for pl, t in zip(runs["plain+prefetch"], runs["tfdist"])])
                          for key in ("step_seconds", "span_step_seconds")}
        boundary = {v: _common.summary([b for r in runs[v] for b in r["boundary_seconds"]]) for v in runs}
        spe = runs["plain"][0]["steps_per_epoch"]
        results[config] = {"runs": runs, "summary": s, "ratio": ratio, "ratio_vs_prefetch": ratio_prefetch,
                           "boundary_seconds": boundary,
                           "steps_per_epoch": spe, "epochs": epochs, "timed_steps": spe * (epochs - 1)}
        print(f"{config}: step time plain {_common.fmt(s['plain']['step_seconds'], 1e3, ' ms')}, "
              f"tfdist {_common.fmt(s['tfdist']['step_seconds'], 1e3, ' ms')}; "
              f"ratio {_common.fmt_ratio(ratio['step_seconds'])}", flush=True)
        what = f"{model}, batch {batch} ({spe} steps/epoch, epochs 2–{epochs} timed)"
        rows.append((
            f"{what}: step time tfdist / plain",
            f"**{_common.fmt_ratio(ratio['step_seconds'])}**; plain {_common.fmt(s['plain']['step_seconds'], 1e3, ' ms')}, "
            f"tfdist {_common.fmt(s['tfdist']['step_seconds'], 1e3, ' ms')}",
            f"≤ {TARGET}", _common.verdict(ratio["step_seconds"]["median"], TARGET),
        ))
        rows.append((
            f"{what}: step time with epoch boundaries tfdist / plain",
            f"{_common.fmt_ratio(ratio['span_step_seconds'])}; between epochs: plain "
            f"{_common.fmt(boundary['plain'], 1e3, ' ms')}, tfdist {_common.fmt(boundary['tfdist'], 1e3, ' ms')}",
            f"(≤ {TARGET})", _common.verdict(ratio["span_step_seconds"]["median"], TARGET),
        ))
        rows.append((
            f"{what}: step time tfdist / plain with `.prefetch(AUTOTUNE)` (stricter baseline)",
            f"{_common.fmt_ratio(ratio_prefetch['step_seconds'])}; plain+prefetch "
            f"{_common.fmt(s['plain+prefetch']['step_seconds'], 1e3, ' ms')}; with epoch boundaries "
            f"{_common.fmt_ratio(ratio_prefetch['span_step_seconds'])}",
            f"(≤ {TARGET})", _common.verdict(ratio_prefetch["step_seconds"]["median"], TARGET),
        ))
        rows.append((
            f"{model}, batch {batch}: whole call (setup + {epochs} epochs) tfdist / plain (information)",
            f"{_common.fmt_ratio(ratio['call_seconds'])}; before epoch 1: plain "
            f"{_common.fmt(s['plain']['setup_seconds'], 1, ' s')}, tfdist {_common.fmt(s['tfdist']['setup_seconds'], 1, ' s')}",
            "–", "–",
        ))
    flags = ["--quick"] if args.quick else []
    if args.timer != "epoch":
        flags.append(f"--timer {args.timer}")
    if args.configs:
        flags.append("--configs " + " ".join(args.configs))
    if args.reps:
        flags.append(f"--reps {args.reps}")
    _common.finish(
        title="fit overhead: tfdist.fit vs plain tf_keras model.fit (one_device, CPU, digits)",
        info=info,
        command=" ".join(["python benchmarks/fit_overhead.py", *flags]),
        results=results,
        rows=rows,
        notes=[f"{reps} repetitions; in each, the {len(VARIANTS)} variants run in fresh processes in lockstep, one "
               "epoch each in turn (rotating order), so only one trains at a time; ratios are paired (same "
               f"repetition and seed); {args.timer}-level timer; first epoch excluded.",
               "Between epochs, plain Keras re-creates the iterator of its finite dataset; tfdist's dataset spans "
               "all epochs (one iterator, created before epoch 1)."],
        args=args,
    )


if __name__ == "__main__":
    main()
