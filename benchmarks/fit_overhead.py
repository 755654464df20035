"""Step-time overhead of ``tfdist.fit`` over plain ``model.fit``, tf_keras and Keras 3 (target: ratio <= 1.02).

For each Keras (``--keras 2``: tf_keras, the Keras 2 API; ``--keras 3``: Keras 3,
``import keras``; ``--keras both``, the default: both), the variants train the same built-in
model (``tfdist.models.builder(name, keras=...)``) on the same digits training split with the
same global batch, number of steps, seed and strategy (``OneDeviceStrategy`` on the CPU):

* plain:  model built and compiled in ``tf.distribute.OneDeviceStrategy("/cpu:0").scope()``,
  data ``Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed).batch(B, drop_remainder=True)``,
  ``model.fit(ds, epochs=E)`` of that Keras;
* tfdist: ``tfdist.fit(builder, source, epochs=E, batch_size=B, strategy="one_device")``
  without a checkpoint directory -- a tf_keras model trains through tf_keras' ``fit`` with
  tfdist's callback, a Keras 3 model through tfdist's own loop (``tfdist.training.loop``);
* plain+prefetch: plain with ``.prefetch(AUTOTUNE)`` added -- a stricter baseline, since
  tfdist's own pipeline prefetches (information; the target is against plain).

Keras 3 specifics, checked in Keras 3.15's sources: (1) no variant XLA-compiles. tfdist's loop,
like plain ``fit``, compiles the model's ``train_step`` with XLA only when ``model.jit_compile``
is True; plain ``fit`` compiles its step with ``jit_compile=model.jit_compile``, and ``compile``'s default ``"auto"`` resolves to False on a CPU-only
machine and for a model built in a strategy's scope -- the benchmark sets
``model.jit_compile = False`` after compiling so that this holds anywhere, and checks it.
(2) ``steps_per_execution`` is 1 in both (``compile``'s default; tfdist's loop reads the
model's), checked too. (3) Both run the same ``keras.callbacks.CallbackList`` (tfdist's
loop makes one as ``fit`` does and calls the same hooks in the same order), and with the
TensorFlow backend (``IS_THREAD_SAFE = False``) it converts each batch's logs to Python
floats at every batch end, whatever the callbacks: every Keras 3 variant waits for each step's
result, so ``--timer batch`` adds no sync there (it does for tf_keras).

Each variant runs in its own fresh Python process (tfdist enables Keras' generator-based
dropout RNG globally, which must not leak into a plain run). The processes of one
repetition -- every variant of every Keras asked for -- run in lockstep: each trains one
epoch while the others wait (between epochs, inside a callback), in a rotating order --
A B C, B C A, ... -- so only one trains at a time and every epoch is measured next to the
others' epochs, which cancels the slow load drifts of a shared machine. All of a process's
work (setup, epochs, the work between epochs, the end of fit) happens in its own turn;
waiting time is left out of every figure. Ratios pair variants of the same Keras.

Steady-state step time: a callback of the model's Keras (``tf_keras.callbacks.Callback`` or
``keras.callbacks.Callback``) records when each epoch begins and ends. The
first epoch (tracing, pipeline warm-up) is excluded. Two figures:

* step time (the target's figure) = median duration of epochs 2..E / steps per epoch: the
  training steps themselves, robust to the load spikes of a shared machine. Keras 3: median
  over epochs 2..E of (end of the last batch - end of the first batch) / (steps - 1). Keras
  3's ``fit`` makes its distributed iterators inside the epoch, where tf_keras' makes one
  between epochs: one after ``on_epoch_begin``, in the first batch (60-220 ms with the
  shuffle buffer's fill, under OneDeviceStrategy on this machine), and one after the last
  batch, before ``on_epoch_end`` (~40 ms; ``EpochIterator`` makes it for the next epoch,
  which makes a new one anyway when ``steps_per_epoch`` is None). An epoch-level timer would
  charge these per-epoch costs to plain Keras 3's steps (2x its step time for the mlp); from
  the first to the last batch end, both Kerases' step times leave them out. The Keras 3 timer
  therefore has a batch hook, which changes nothing there: Keras 3 reads every batch's logs
  anyway (above);
* step time with epoch boundaries = (end of epoch E - start of epoch 2) / steps: adds what
  happens between epochs (and, with Keras 3, in each epoch's first batch and after its last;
  each is shown apart). Plain Keras (either) re-creates its distributed iterator at every
  epoch of a finite dataset (tens to hundreds of ms on this machine); tfdist's dataset spans
  all epochs, so one iterator serves them all.

With tf_keras the epoch-level callback adds no batch hooks, so plain tf_keras keeps its
batch-hook-free path while tfdist's own callback runs at every batch -- its cost is measured.
``--timer batch`` instead takes the median gap between batch ends, which forces a host sync
after every step in every tf_keras variant (Keras 3 variants sync there anyway). The
whole-call wall time (setup included) is reported for information.

    python benchmarks/fit_overhead.py [--keras {2,3,both}] [--quick] [--json PATH] [--markdown PATH]
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
KERAS_LABELS, KERAS_CHOICES = _common.KERAS_LABELS, _common.KERAS_CHOICES


def _timer_class(kind: str, turns, keras: str):
    from tfdist import models

    # For Keras 3, tfdist's loop calls it through keras.callbacks.CallbackList, as fit does.
    class Timer(models.keras_module(keras).callbacks.Callback):
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

        if kind == "batch" or keras == "3":  # Keras 3 waits for every batch's logs anyway (see the docstring)
            def on_train_batch_end(self, batch, logs=None):  # logs arrive as Python floats: the step has finished
                self.batch_ends[-1].append(time.perf_counter())

    return Timer


def _compiled_as_measured(build, keras: str, settings: dict):
    """``build`` with XLA off for a Keras 3 model (see the docstring); records how the model runs."""

    def build_and_compile():
        model = build()
        if keras == "3":
            model.jit_compile = False  # neither plain fit nor tfdist's loop then compiles its step with XLA
        spe = model.steps_per_execution
        settings.update(jit_compile=bool(model.jit_compile),
                        steps_per_execution=int(spe.numpy() if hasattr(spe, "numpy") else spe))
        return model

    build_and_compile.__name__ = build.__name__
    return build_and_compile


def child(spec: dict, conn) -> None:
    """One variant, in its own process; runs only while it holds the turn."""
    _common.quiet_tensorflow()
    import numpy as np
    import tensorflow as tf

    import tfdist
    from tfdist import data as data_mod
    from tfdist import models

    train, _ = data_mod.load_digits()
    x, y = train.x, train.y
    settings: dict = {}
    builder = _compiled_as_measured(
        models.builder(spec["model"], input_shape=x.shape[1:], num_classes=10, keras=spec["keras"]),
        spec["keras"], settings)
    batch, epochs, seed = spec["batch"], spec["epochs"], spec["seed"]
    turns = _common.Turns(conn)
    timer = _timer_class(spec["timer"], turns, spec["keras"])()
    turns.start()  # first turn: setup + first epoch
    start = time.perf_counter()
    if spec["variant"].startswith("plain"):
        models.keras_module(spec["keras"]).utils.set_random_seed(seed)
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
    elif spec["keras"] == "3":
        # First to last batch end: Keras 3's fit makes an iterator in each epoch's first batch
        # and another after its last batch (see the docstring).
        step = float(np.median([(ends[-1] - ends[0]) / (len(ends) - 1) for ends in timer.batch_ends[1:]]))
    else:
        step = float(np.median(durations[1:])) / steps_per_epoch
    timed = list(zip(timer.epoch_begin[1:], timer.batch_ends[1:], timer.epoch_end[1:]))
    first_batches = [ends[0] - b for b, ends, _ in timed if ends]
    epoch_tails = [e - ends[-1] for _, ends, e in timed if ends]
    turns.finish({
        "keras": spec["keras"],
        "variant": spec["variant"],
        **settings,
        "step_seconds": step,
        # Epochs 2..E plus the boundaries between them (waiting for the turn left out).
        "span_step_seconds": (sum(durations[1:]) + sum(timer.boundaries)) / timed_steps,
        "epoch_seconds": durations,
        "boundary_seconds": timer.boundaries,
        # Epochs 2..E (none with tf_keras' epoch timer): on_epoch_begin to the first batch's end,
        # and the last batch's end to on_epoch_end.
        "first_batch_seconds": first_batches,
        "epoch_tail_seconds": epoch_tails,
        "first_epoch_seconds": durations[0],
        "call_seconds": end - start - turns.waited,
        "after_training_seconds": end - timer.epoch_end[-1],
        "setup_seconds": timer.epoch_begin[0] - start,
        "steps_per_epoch": steps_per_epoch,
        "epochs_timed": len(durations) - 1,
    })


def _check_same_settings(config: str, keras: str, runs: dict) -> dict:
    """The XLA and steps_per_execution settings every variant of one Keras ran with; they must agree."""
    seen = {(r["jit_compile"], r["steps_per_execution"]) for variant in VARIANTS for r in runs[variant]}
    if len(seen) != 1:
        raise RuntimeError(f"{config} {KERAS_LABELS[keras]}: the variants ran with different settings "
                           f"(jit_compile, steps_per_execution): {sorted(seen)}")
    jit, spe = seen.pop()
    return {"jit_compile": jit, "steps_per_execution": spe}


def _summarize(config: str, keras: str, runs: dict, *, model: str, batch: int, epochs: int, timer: str):
    """(results, rows) of one Keras in one configuration."""
    label = KERAS_LABELS[keras]
    settings = _check_same_settings(config, keras, runs)
    keys = ("step_seconds", "span_step_seconds", "call_seconds", "setup_seconds", "first_epoch_seconds")
    s = {variant: {key: _common.summary_of(runs[variant], key) for key in keys} for variant in runs}
    ratio = {key: _common.paired(runs["plain"], runs["tfdist"], key)
             for key in ("step_seconds", "span_step_seconds", "call_seconds")}
    ratio_prefetch = {key: _common.paired(runs["plain+prefetch"], runs["tfdist"], key)
                      for key in ("step_seconds", "span_step_seconds")}
    boundary = {v: _common.summary([b for r in runs[v] for b in r["boundary_seconds"]]) for v in runs}
    first_batch = {v: _common.summary([b for r in runs[v] for b in r["first_batch_seconds"]]) for v in runs}
    epoch_tail = {v: _common.summary([b for r in runs[v] for b in r["epoch_tail_seconds"]]) for v in runs}
    spe = runs["plain"][0]["steps_per_epoch"]
    results = {"runs": runs, "summary": s, "ratio": ratio, "ratio_vs_prefetch": ratio_prefetch,
               "boundary_seconds": boundary, "first_batch_seconds": first_batch,
               "epoch_tail_seconds": epoch_tail, "settings": settings,
               "steps_per_epoch": spe, "epochs": epochs, "timed_steps": spe * (epochs - 1)}
    print(f"{config} {label}: step time plain {_common.fmt(s['plain']['step_seconds'], 1e3, ' ms')}, "
          f"tfdist {_common.fmt(s['tfdist']['step_seconds'], 1e3, ' ms')}; "
          f"ratio {_common.fmt_ratio(ratio['step_seconds'])}", flush=True)
    what = f"{model}, batch {batch} ({spe} steps/epoch, epochs 2–{epochs} timed)"
    steps_timed = " (first to last batch end of each epoch)" if keras == "3" and timer == "epoch" else ""
    rows = [
        (label, f"{what}: step time{steps_timed} tfdist / plain",
         f"**{_common.fmt_ratio(ratio['step_seconds'])}**; plain {_common.fmt(s['plain']['step_seconds'], 1e3, ' ms')}, "
         f"tfdist {_common.fmt(s['tfdist']['step_seconds'], 1e3, ' ms')}",
         f"≤ {TARGET}", _common.verdict(ratio["step_seconds"]["median"], TARGET)),
        (label, f"{what}: step time with epoch boundaries tfdist / plain",
         f"{_common.fmt_ratio(ratio['span_step_seconds'])}; between epochs: plain "
         f"{_common.fmt(boundary['plain'], 1e3, ' ms')}, tfdist {_common.fmt(boundary['tfdist'], 1e3, ' ms')}"
         + (f"; an epoch's first batch (plain fit makes its iterator there): plain "
            f"{_common.fmt(first_batch['plain'], 1e3, ' ms')}, tfdist {_common.fmt(first_batch['tfdist'], 1e3, ' ms')}"
            f"; last batch to epoch end (plain fit makes the next iterator there): plain "
            f"{_common.fmt(epoch_tail['plain'], 1e3, ' ms')}, tfdist {_common.fmt(epoch_tail['tfdist'], 1e3, ' ms')}"
            if keras == "3" else ""),
         f"(≤ {TARGET})", _common.verdict(ratio["span_step_seconds"]["median"], TARGET)),
        (label, f"{what}: step time tfdist / plain with `.prefetch(AUTOTUNE)` (stricter baseline)",
         f"{_common.fmt_ratio(ratio_prefetch['step_seconds'])}; plain+prefetch "
         f"{_common.fmt(s['plain+prefetch']['step_seconds'], 1e3, ' ms')}; with epoch boundaries "
         f"{_common.fmt_ratio(ratio_prefetch['span_step_seconds'])}",
         f"(≤ {TARGET})", _common.verdict(ratio_prefetch["step_seconds"]["median"], TARGET)),
        (label, f"{model}, batch {batch}: whole call (setup + {epochs} epochs) tfdist / plain (information)",
         f"{_common.fmt_ratio(ratio['call_seconds'])}; before epoch 1: plain "
         f"{_common.fmt(s['plain']['setup_seconds'], 1, ' s')}, tfdist {_common.fmt(s['tfdist']['setup_seconds'], 1, ' s')}",
         "–", "–"),
    ]
    return results, rows


def main() -> None:
    p = _common.parser(__doc__.splitlines()[0])
    p.add_argument("--configs", nargs="+", default=None,
                   help=f"MODEL:BATCH:EPOCHS triples (default {' '.join(DEFAULT_CONFIGS)}; --quick cnn:32:3)")
    _common.add_reps_option(p, default=4)
    p.add_argument("--timer", choices=("epoch", "batch"), default="epoch")
    _common.add_keras_option(p)
    args = p.parse_args()
    _common.quiet_tensorflow()
    reps = args.reps or (1 if args.quick else 4)
    configs = args.configs or (("cnn:32:3",) if args.quick else DEFAULT_CONFIGS)
    kerases = KERAS_CHOICES[args.keras]
    info = _common.machine()
    print("machine:", _common.describe_machine(info), flush=True)
    results: dict = {}
    rows: dict[str, list] = {keras: [] for keras in kerases}
    for config in configs:
        model, batch, epochs = config.split(":")
        batch, epochs = int(batch), int(epochs)
        runs = {keras: {v: [] for v in VARIANTS} for keras in kerases}
        for rep in range(reps):
            specs = {_common.keras_variant(keras, v): dict(keras=keras, variant=v, model=model, batch=batch, epochs=epochs, seed=rep,
                                           timer=args.timer)
                     for keras in kerases for v in VARIANTS}
            for name, r in _common.lockstep(child, specs, rotation=rep).items():
                runs[r["keras"]][r["variant"]].append(r)
                print(f"  {config} rep {rep} {name:23s}: step {r['step_seconds'] * 1e3:.3f} ms, with boundaries "
                      f"{r['span_step_seconds'] * 1e3:.3f} ms, first epoch {r['first_epoch_seconds']:.2f} s, "
                      f"call {r['call_seconds']:.2f} s (after training {r['after_training_seconds']:.2f} s)", flush=True)
        results[config] = {}
        for keras in kerases:
            results[config][KERAS_LABELS[keras]], config_rows = _summarize(
                config, keras, runs[keras], model=model, batch=batch, epochs=epochs, timer=args.timer)
            rows[keras] += config_rows
        if len(kerases) == 2:
            # Both Kerases' processes ran in the same lockstep rounds: their step times compare too.
            cross = {v: _common.paired(runs["2"][v], runs["3"][v], "step_seconds") for v in ("plain", "tfdist")}
            results[config]["keras3_over_tf_keras"] = cross
            rows["3"].append((
                "Keras 3 / tf_keras", f"{model}, batch {batch}: step time of a Keras 3 model / the tf_keras model "
                "(information)", f"plain fit {_common.fmt_ratio(cross['plain'])}; tfdist.fit "
                f"{_common.fmt_ratio(cross['tfdist'])}", "–", "–"))
    flags = ["--quick"] if args.quick else []
    if args.keras != "both":
        flags.append(f"--keras {args.keras}")
    if args.timer != "epoch":
        flags.append(f"--timer {args.timer}")
    if args.configs:
        flags.append("--configs " + " ".join(args.configs))
    if args.reps:
        flags.append(f"--reps {args.reps}")
    settings = "; ".join(
        f"{KERAS_LABELS[k]}: " + ", ".join(sorted({
            f"jit_compile={s['jit_compile']}, steps_per_execution={s['steps_per_execution']}"
            for s in (results[c][KERAS_LABELS[k]]["settings"] for c in configs)}))
        for k in kerases)
    _common.finish(
        title="fit overhead: tfdist.fit vs plain model.fit, "
              f"{' and '.join(KERAS_LABELS[k] for k in kerases)} (one_device, CPU, digits)",
        info=info,
        command=" ".join(["python benchmarks/fit_overhead.py", *flags]),
        results=results,
        rows=[row for keras in kerases for row in rows[keras]],
        header=("Keras", "Figure", "Measured: median (min–max, n)", "Target", "Met?"),
        notes=[f"{reps} repetitions; in each, the {len(VARIANTS) * len(kerases)} variants ({', '.join(VARIANTS)} for "
               f"{' and '.join(KERAS_LABELS[k] for k in kerases)}) run in fresh processes in lockstep, one epoch each "
               "in turn (rotating order), so only one trains at a time; ratios are paired (same Keras, repetition "
               f"and seed); {args.timer}-level timer; first epoch excluded.",
               f"Every variant of one Keras ran with the same settings ({settings}), so no variant "
               "XLA-compiles.",
               "Plain tf_keras re-creates the iterator of its finite dataset between epochs; plain Keras 3 makes one "
               "in each epoch's first batch and one after its last batch, so its step time runs from the first to "
               "the last batch end of each epoch; tfdist's dataset spans all epochs (one iterator, created before "
               "epoch 1)."],
        args=args,
    )


if __name__ == "__main__":
    main()
