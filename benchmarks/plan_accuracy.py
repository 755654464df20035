"""Accuracy of ``tfdist plan --measure``: predicted vs measured epoch time (target: within +-15%).

For each configuration (built-in model, micro batch, gradient accumulation steps) on the
digits training split (1,438 examples), alternated, each in a fresh process, both with the
Keras ``--keras`` names (3: Keras 3, the default, trained by tfdist's own loop; 2: tf_keras,
trained by its ``model.fit``):

* plan: ``python -m tfdist plan --model M --keras V --samples 1438 --micro-batch B
  --grad-accum-steps K --epochs E --measure --strategy one_device --json`` (the CLI as a user
  runs it); predicted epoch time = ``train_seconds / epochs`` = steps per epoch x (measured
  step time x K);
* fit: ``tfdist.fit(models.builder(M, keras=V), digits, epochs=E, batch_size=B x K,
  grad_accum_steps=K, strategy="one_device")``; a callback times each epoch. Measured
  steady-state epoch time = median of epochs 2..E (the first epoch, which traces the step, is
  reported apart).

Ratio = predicted / measured steady-state epoch time, paired by repetition. With K > 1 a
diagnostic plan of the same global batch as one micro batch (K = 1) is run alongside. The
planner measures the real accumulated step (K micro batches in one loop, one optimizer
update) and divides it by K; before it did so, it priced an accumulated step as K x a micro
step, counting a step's fixed cost (dispatch, optimizer update, metrics) K times. Memory: the
plan's static estimate (weights + gradients + Adam slots [+ accumulator]), the plan's
measured peak and the fit's increase of the process's maximum resident set -- on the CPU
both measured figures include TensorFlow's own allocations, so they bound rather than
check the estimate.

    python benchmarks/plan_accuracy.py [--keras {3,2}] [--quick] [--json PATH] [--markdown PATH]
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

TARGET = 0.15
SAMPLES = 1438  # len(tfdist.data.load_digits()[0]); checked in the fit child
# model:micro_batch:grad_accum_steps:epochs
DEFAULT_CONFIGS = ("cnn:32:1:6", "cnn:64:1:6", "mlp:128:1:20", "cnn:32:2:6", "cnn:16:4:6")


def timed_fit(builder, data, spec: dict) -> dict:
    """``tfdist.fit`` of ``builder`` on ``data`` as ``spec`` says (keras, micro, accum, epochs,
    seed), on one device; each epoch's time, the step time inside an epoch and the RSS increase."""
    import numpy as np

    import tfdist
    from tfdist import models

    begins, ends, batch_ends = [], [], []

    class Timer(models.keras_module(spec["keras"]).callbacks.Callback):
        # tf_keras: logs stay tensors (tfdist's own callback already has batch hooks: this adds no
        # sync). Keras 3 with the TensorFlow backend converts every step's logs to floats in the
        # loop's thread whatever the callbacks (backend.IS_THREAD_SAFE is False): no sync added either.

        def __init__(self):
            super().__init__()
            self._supports_tf_logs = True

        def on_epoch_begin(self, epoch, logs=None):
            begins.append(time.perf_counter())
            batch_ends.append([])

        def on_train_batch_end(self, batch, logs=None):
            batch_ends[-1].append(time.perf_counter())

        def on_epoch_end(self, epoch, logs=None):
            ends.append(time.perf_counter())

    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = time.perf_counter()
    history = tfdist.fit(builder, data, epochs=spec["epochs"], batch_size=spec["micro"] * spec["accum"],
                         grad_accum_steps=spec["accum"], strategy="one_device", seed=spec["seed"], verbose=0,
                         callbacks=[Timer()])
    call = time.perf_counter() - start
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    durations = [e - b for b, e in zip(begins, ends)]
    # Diagnostic: the step time inside an epoch (batch 2 to the last) and what an epoch costs beyond its steps.
    inner = [(t[-1] - t[0]) / (len(t) - 1) for t in batch_ends[1:] if len(t) > 1]
    step = float(np.median(inner)) if inner else float("nan")
    return {
        "in_epoch_step_seconds": step,
        "epoch_fixed_seconds": float(np.median(durations[1:])) - step * history.tfdist.steps_per_epoch,
        "epoch_seconds": float(np.median(durations[1:])),
        "first_epoch_seconds": durations[0],
        "all_epochs": durations,
        "call_seconds": call,
        "steps_per_epoch": history.tfdist.steps_per_epoch,
        "rss_increase_bytes": rss_after - rss_before,
    }


def fit_child(spec: dict) -> None:
    """The fit variant: the built-in model on the digits training split."""
    _common.quiet_tensorflow()
    from tfdist import data as data_mod
    from tfdist import models

    train, _ = data_mod.load_digits()
    assert train.num_examples == SAMPLES, train.num_examples
    builder = models.builder(spec["model"], input_shape=train.example_shape, num_classes=10, keras=spec["keras"])
    _common.emit(timed_fit(builder, train, spec))


def run_plan(spec: dict, *, samples: int = SAMPLES, extra: tuple[str, ...] = ()) -> dict:
    """``tfdist plan --measure --json`` of ``spec`` as a user runs it; ``extra``: more flags."""
    cmd = [sys.executable, "-m", "tfdist", "plan", "--model", spec["model"], "--keras", spec["keras"],
           "--samples", str(samples),
           "--micro-batch", str(spec["micro"]), "--grad-accum-steps", str(spec["accum"]),
           "--epochs", str(spec["epochs"]), "--measure", "--strategy", "one_device", "--json", *extra]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_common.child_env(), cwd=_common.REPO, timeout=600)
    if proc.returncode:
        sys.stderr.write(proc.stderr[-4000:])
        raise RuntimeError(f"{' '.join(cmd)} failed with exit code {proc.returncode}")
    plan = json.loads(proc.stdout)
    return {
        "epoch_seconds": plan["train_seconds"] / plan["epochs"],
        "step_time": plan["step_time"],
        "steps_per_epoch": plan["steps_per_epoch"],
        "static_bytes": plan["memory"]["static_bytes"],
        "measured_peak_bytes": plan["measured_peak_bytes"],
        "measured_peak_source": plan["measured_peak_source"],
        "params": plan["params"],
        "process_seconds": time.perf_counter() - start,
        "command": " ".join(["tfdist", *cmd[3:]]),
    }


def main() -> None:
    p = _common.parser(__doc__.splitlines()[0])
    p.add_argument("--configs", nargs="+", default=None,
                   help=f"MODEL:MICRO_BATCH:ACCUM:EPOCHS (default {' '.join(DEFAULT_CONFIGS)})")
    _common.add_reps_option(p, default=3)
    p.add_argument("--keras", choices=("3", "2"), default="3",
                   help="the Keras that plans and trains: 3 (Keras 3, tfdist's own loop; default) or 2 (tf_keras)")
    args = p.parse_args()
    if args.child:
        fit_child(json.loads(args.child))
        return
    reps = args.reps or (1 if args.quick else 3)
    configs = args.configs or (("cnn:32:1:3",) if args.quick else DEFAULT_CONFIGS)
    info = _common.machine()
    print("machine:", _common.describe_machine(info), flush=True)
    script = os.path.abspath(__file__)
    results, rows = {}, []
    for config in configs:
        model, micro, accum, epochs = config.split(":")
        spec = dict(model=model, micro=int(micro), accum=int(accum), epochs=int(epochs), keras=args.keras)
        # With accumulation, also plan the same global batch as ONE micro batch (K = 1): the
        # diagnostic that tells whether a step's cost scales with K or with the examples.
        variants = ("plan", "fit", "plan K=1") if spec["accum"] > 1 else ("plan", "fit")
        one_batch = dict(spec, micro=spec["micro"] * spec["accum"], accum=1)
        runs = {v: [] for v in variants}
        for rep, variant in _common.alternate(variants, reps):
            if variant == "fit":
                r = _common.run_child(script, dict(spec, seed=rep))
            else:
                r = run_plan(spec if variant == "plan" else one_batch)
            runs[variant].append(r)
            extra = f" (first {r['first_epoch_seconds']:.2f} s)" if variant == "fit" else f" (step {r['step_time'] * 1e3:.2f} ms)"
            print(f"  {config} rep {rep} {variant:8s}: epoch {r['epoch_seconds']:.3f} s{extra}, "
                  f"process {r['process_seconds']:.1f} s", flush=True)
        assert runs["plan"][0]["steps_per_epoch"] == runs["fit"][0]["steps_per_epoch"], runs
        ratio = _common.paired(runs["fit"], runs["plan"], "epoch_seconds")
        first = _common.summary([pl["epoch_seconds"] / f["first_epoch_seconds"] for pl, f in zip(runs["plan"], runs["fit"])])
        predicted = _common.summary_of(runs["plan"], "epoch_seconds")
        measured = _common.summary_of(runs["fit"], "epoch_seconds")
        first_epoch = _common.summary_of(runs["fit"], "first_epoch_seconds")
        rss = _common.summary_of(runs["fit"], "rss_increase_bytes")
        fit_step = _common.summary_of(runs["fit"], "in_epoch_step_seconds")
        plan_step = _common.summary([r["step_time"] * spec["accum"] for r in runs["plan"]])
        fixed = _common.summary_of(runs["fit"], "epoch_fixed_seconds")
        peak = _common.summary([r["measured_peak_bytes"] or 0 for r in runs["plan"]])
        static = runs["plan"][0]["static_bytes"]
        results[config] = {"spec": spec, "runs": runs, "ratio": ratio, "ratio_first_epoch": first,
                           "predicted": predicted, "measured": measured, "plan_step": plan_step,
                           "fit_in_epoch_step": fit_step, "fit_epoch_fixed": fixed}
        spe = runs["fit"][0]["steps_per_epoch"]
        err = ratio["median"] - 1
        what = f"{model}, micro batch {micro}" + (f" x {accum} accumulation steps" if int(accum) > 1 else "")
        rows.append((
            f"{what} ({spe} steps/epoch)",
            f"{_common.fmt(predicted, 1e3, ' ms')}",
            f"{_common.fmt(measured, 1e3, ' ms')}",
            f"**{_common.fmt_ratio(ratio)}** ({err:+.0%})",
            f"plan {plan_step['median'] * 1e3:.2f} ms; fit in-epoch {fit_step['median'] * 1e3:.2f} ms, "
            f"+{fixed['median'] * 1e3:.1f} ms/epoch beyond the steps",
            f"{_common.fmt(first_epoch, 1, ' s')} (pred./first {first['median']:.2f})",
            f"static {static / 1e6:.2f} MB; plan peak {peak['median'] / 1e6:.0f} MB; fit RSS +{rss['median'] / 1e6:.0f} MB",
            _common.verdict(abs(err), TARGET),
        ))
        if "plan K=1" in runs:
            diag = _common.paired(runs["fit"], runs["plan K=1"], "epoch_seconds")
            diag_pred = _common.summary_of(runs["plan K=1"], "epoch_seconds")
            results[config]["ratio_plan_one_batch"] = diag
            rows.append((
                f"↳ diagnostic: plan of the same global batch {spec['micro'] * spec['accum']} as one micro batch (K = 1)",
                f"{_common.fmt(diag_pred, 1e3, ' ms')}", "(same fit)", f"{_common.fmt_ratio(diag)} ({diag['median'] - 1:+.0%})",
                f"plan {_common.summary_of(runs['plan K=1'], 'step_time')['median'] * 1e3:.2f} ms", "–", "–",
                "(diagnostic)",
            ))
        print(f"{config}: predicted {_common.fmt(predicted, 1e3, ' ms')}, measured {_common.fmt(measured, 1e3, ' ms')}, "
              f"ratio {_common.fmt_ratio(ratio)}", flush=True)
    flags = [f"--keras {args.keras}"] + (["--quick"] if args.quick else [])
    if args.configs:
        flags.append("--configs " + " ".join(args.configs))
    if args.reps:
        flags.append(f"--reps {args.reps}")
    _common.finish(
        title="plan accuracy: `tfdist plan --measure` predicted vs measured epoch time "
              f"({'Keras 3' if args.keras == '3' else 'tf_keras'}, one_device, CPU, digits)",
        info=info,
        command=" ".join(["python benchmarks/plan_accuracy.py", *flags]),
        results=results,
        rows=rows,
        header=("Configuration", "Predicted epoch", "Measured epoch (2..E)", "Predicted / measured",
                "Step time (medians)", "First epoch (tracing)", "Memory", "Within ±15%?"),
        notes=[f"{reps} repetitions per variant, alternated, each in a fresh process; plan command e.g. "
               f"`{runs['plan'][0]['command']}`.",
               "Step time: the plan's measured step (x K) vs the fit's step inside an epoch (batch 2 to the "
               "last); what an epoch costs beyond its steps (epoch-end callbacks, metric reset, first batch) is "
               "not in the plan's formula.",
               "Memory on the CPU: the plan's peak and the fit's RSS increase include TensorFlow's runtime "
               "allocations; only the static estimate is the plan's own arithmetic."],
        args=args,
    )


if __name__ == "__main__":
    main()
