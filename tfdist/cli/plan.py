"""``tfdist plan``: batch sizes, steps, memory, checkpoint cost and time of a run, before it starts.

Without ``--measure`` (and without ``--model``) this command imports neither TensorFlow
nor anything that does; ``--plot`` imports matplotlib only (the ``plot`` extra).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import sys

from tfdist.cli import _quiet
from tfdist.errors import PlanError
from tfdist.models import DEFAULT_KERAS, KERAS_VERSIONS
from tfdist.planning.planner import DEFAULT_MAX_GPUS, Plan, plan
from tfdist.planning.units import format_bytes, format_seconds, parse_bytes, parse_count, parse_duration

_TIME_HINT = (
    "unknown: pass --step-time SECONDS (one replica's train step on one micro batch), "
    "or --measure with --model NAME|PATH"
)
_MODEL_HINT = "unknown: pass --params N or --model NAME|PATH"
_KERAS_NAMES = {"3": "Keras 3", "2": "tf_keras"}


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="plan batch sizes, steps, memory, checkpoint cost and time of a training run",
        description="Works out the global batch, steps, memory per replica, checkpoint size, "
        "required write bandwidth, Young/Daly checkpoint interval and estimated time of a "
        "data-parallel run. Sizes accept 500MB, 1.5GiB, 10GB/s, 100Gbit/s; durations 30s, 5m, "
        "24h, 1h30m; counts 60k, 1.2M, 7B. See docs/plan.md for the formulas.",
    )
    batch = parser.add_argument_group("data and batch")
    batch.add_argument("--samples", metavar="N", help="training examples per epoch (required)")
    batch.add_argument("--epochs", metavar="E", default="1", help="epochs (default 1)")
    batch.add_argument("--micro-batch", metavar="B", help="examples per replica per forward/backward pass")
    batch.add_argument("--nodes", metavar="N", default="1", help="machines (default 1)")
    batch.add_argument("--gpus-per-node", metavar="G", default="1", help="replicas per machine (default 1)")
    batch.add_argument("--grad-accum-steps", metavar="K", help="micro batches per optimizer step (default 1)")
    batch.add_argument("--global-batch", metavar="G", help="target examples per optimizer step")
    batch.add_argument(
        "--max-micro-batch", metavar="M", help="with --global-batch: solve for the fewest accumulation steps"
    )
    model = parser.add_argument_group("model and memory")
    model.add_argument("--params", metavar="P", help="parameter count, e.g. 125M")
    model.add_argument(
        "--trainable-params", metavar="T",
        help="with --params: the trainable ones, which have gradients and optimizer slots (default all)",
    )
    model.add_argument("--model", metavar="NAME|PATH", help="a built-in model name or a saved model (see --keras)")
    model.add_argument(
        "--keras", default=DEFAULT_KERAS, choices=KERAS_VERSIONS,
        help="the Keras that builds, loads and measures --model: 3 (Keras 3, TensorFlow's default Keras, "
        "`import keras`; timed in tfdist's own loop) or 2 (tf_keras; timed with its model.fit); "
        f"the one you train with (default {DEFAULT_KERAS})",
    )
    model.add_argument("--input-shape", metavar="D,D,...", help="input shape of a built-in model, e.g. 28,28,1")
    model.add_argument("--num-classes", metavar="C", help="classes of a built-in model")
    model.add_argument(
        "--optimizer-slots", metavar="S", default="2", help="values kept per parameter (Adam 2, SGD 0; default 2)"
    )
    model.add_argument("--precision", default="float32", help="float32 (default), mixed_float16 or mixed_bfloat16")
    model.add_argument("--activation-bytes", metavar="BYTES", help="activation bytes per sample, e.g. 2MB")
    timing = parser.add_argument_group("time")
    timing.add_argument("--step-time", metavar="S", help="seconds of one replica's train step on one micro batch")
    timing.add_argument("--measure", action="store_true", help="measure the step time with a short run of --model")
    timing.add_argument("--measure-steps", metavar="N", default="20", help="timed steps of --measure, at least (default 20; short steps are timed for at least 1 s)")
    timing.add_argument("--strategy", default="auto", help="strategy of --measure (default auto)")
    timing.add_argument(
        "--link-bandwidth", metavar="B/s", default="10GB/s", help="slowest link of the all-reduce ring (default 10GB/s)"
    )
    ckpt = parser.add_argument_group("checkpoints and failures")
    ckpt.add_argument("--stall-window", metavar="S", default="30s", help="pause allowed per checkpoint (default 30s)")
    ckpt.add_argument("--mtbf", metavar="S", default="24h", help="mean time between job failures (default 24h)")
    ckpt.add_argument("--restart-time", metavar="S", default="5m", help="failure to training again (default 5m)")
    ckpt.add_argument("--write-bandwidth", metavar="B/s", help="storage bandwidth (default: the required one)")
    out = parser.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print one JSON object")
    out.add_argument("--plot", metavar="FILE.png",
                     help="draw time and scaling efficiency against GPUs (needs matplotlib: the plot extra)")
    out.add_argument("--max-gpus", metavar="N", help="largest GPU count of --plot (default max(64, replicas))")
    parser.set_defaults(func=run)


def _option(args: argparse.Namespace, attr: str, parse=parse_count, *, positive: bool = False, **kwargs):
    """The number of option ``--attr`` read by a ``tfdist.planning.units`` parser; None when not given.

    The one place the command reads numbers: refuses, with a one-line PlanError, a value out of
    range for a float (1e400, 1e99999999, 1e308d) and, with ``positive``, a count below 1.
    """
    text = getattr(args, attr)
    if text is None:
        return None
    flag = "--" + attr.replace("_", "-")
    try:
        value = parse(text, name=flag, **kwargs)
    except OverflowError:
        value = math.inf
    if not math.isfinite(value):
        raise PlanError(
            f"Invalid `{flag}`; received {flag}={text!r}, out of range for a 64-bit float. "
            "Fix: use a number of realistic size (between 1e-300 and 1e300)."
        )
    if positive and value < 1:
        raise PlanError(f"Invalid `{flag}`; received {flag}={text!r}. Fix: use a positive integer.")
    return value


def _check_plot(path: str) -> None:
    """Refuses a ``--plot`` that could not be drawn or written as named: a folder, a missing folder,
    not .png, or no matplotlib installed."""
    folder = os.path.dirname(path) or "."
    if os.path.isdir(path):
        reason = "a folder"
    elif os.path.splitext(path)[1].lower() != ".png":
        reason = "not a .png file name"
    elif not os.path.isdir(folder):
        reason = f"its folder {folder!r} does not exist"
    else:
        reason = None
    if reason is not None:
        raise PlanError(
            f"Invalid `--plot`; received --plot={path!r}, {reason}. "
            "Fix: pass a file name ending in .png in an existing folder, e.g. --plot scaling.png."
        )
    if not _matplotlib_installed():
        raise PlanError(
            f"`--plot` needs matplotlib, which is not installed; received --plot={path!r}. "
            "Fix: pip install 'tfdist[plot]', or leave out --plot."
        )


def _matplotlib_installed() -> bool:
    try:
        return importlib.util.find_spec("matplotlib") is not None
    except ValueError:  # sys.modules["matplotlib"] is None: its import is blocked
        return False


_FLAGS = {  # plan()'s arguments whose flag is not their name with dashes
    "micro_batch_size": "--micro-batch", "global_batch_size": "--global-batch",
    "max_micro_batch_size": "--max-micro-batch", "restart_seconds": "--restart-time",
}
_ARGUMENTS = (
    "samples", "epochs", "micro_batch_size", "grad_accum_steps", "global_batch_size", "max_micro_batch_size", "nodes",
    "gpus_per_node", "trainable_params", "params", "measure_steps", "optimizer_slots", "activation_bytes", "step_time",
    "stall_window", "mtbf", "write_bandwidth", "link_bandwidth", "restart_seconds", "model", "measure",
)


def _in_flags(message: str) -> str:
    """A message of ``plan()`` in the command line's words: ``micro_batch_size`` -> ``--micro-batch``."""
    for name in _ARGUMENTS:
        flag = _FLAGS.get(name, "--" + name.replace("_", "-"))
        ends = "[`=,.) ]" if "_" in name else "[`=]| x "  # a plain word (samples, model) only where it is the argument
        message = re.sub(rf"(?<![\w-]){name}(?={ends})", flag, message)
    return message


def _make_plan(args: argparse.Namespace) -> Plan:
    if args.samples is None:
        raise PlanError("Missing `--samples`; received none. Fix: pass --samples N, the training examples per epoch.")
    input_shape = None
    if args.input_shape is not None:
        try:
            input_shape = tuple(int(d) for d in args.input_shape.split(","))
        except ValueError:
            input_shape = ()
        if min(input_shape, default=0) < 1:
            raise PlanError(
                f"Invalid `--input-shape`; received --input-shape={args.input_shape!r}. "
                "Fix: use positive integers and commas, e.g. 28,28,1."
            )
    try:
        return _plan_of(args, input_shape)
    except PlanError as e:
        raise PlanError(_in_flags(str(e))) from None


def _plan_of(args: argparse.Namespace, input_shape) -> Plan:
    return plan(
        samples=_option(args, "samples"),
        epochs=_option(args, "epochs"),
        micro_batch_size=_option(args, "micro_batch"),
        nodes=_option(args, "nodes"),
        gpus_per_node=_option(args, "gpus_per_node"),
        grad_accum_steps=_option(args, "grad_accum_steps"),
        global_batch_size=_option(args, "global_batch"),
        max_micro_batch_size=_option(args, "max_micro_batch"),
        params=_option(args, "params"),
        trainable_params=_option(args, "trainable_params"),
        model=args.model,
        input_shape=input_shape,
        num_classes=_option(args, "num_classes", positive=True),
        step_time=_option(args, "step_time", parse_duration),
        measure=args.measure,
        measure_steps=_option(args, "measure_steps"),
        strategy=args.strategy,
        keras=args.keras,
        optimizer_slots=_option(args, "optimizer_slots"),
        precision=args.precision,
        activation_bytes=_option(args, "activation_bytes", parse_bytes),
        stall_window=_option(args, "stall_window", parse_duration),
        mtbf=_option(args, "mtbf", parse_duration),
        write_bandwidth=_option(args, "write_bandwidth", parse_bytes, per_second=True),
        link_bandwidth=_option(args, "link_bandwidth", parse_bytes, per_second=True),
        restart_seconds=_option(args, "restart_time", parse_duration),
    )


def _rows(p: Plan) -> list[tuple[str, str, str]]:
    """(label, value, note) lines of the table; a label ending in ':' starts a section."""
    fb, fs = format_bytes, format_seconds
    rows = [
        ("Batch:", "", ""),
        ("micro batch (per replica)", f"{p.micro_batch_size}", ""),
        ("accumulation steps", f"{p.grad_accum_steps}", ""),
        ("replicas", f"{p.replicas}", f"{p.nodes} node(s) x {p.gpus_per_node} GPU(s)"),
        ("global batch", f"{p.global_batch_size}", f"{p.grad_accum_steps} x {p.replicas} x {p.micro_batch_size}"),
        ("steps per epoch", f"{p.steps_per_epoch:,}", f"{p.samples:,} // {p.global_batch_size}; "
         f"{p.dropped_samples_per_epoch} sample(s) dropped per epoch"),
        ("total steps", f"{p.total_steps:,}", f"{p.epochs} epoch(s)"),
    ]
    memory = p.memory
    rows.append((f"Memory per replica ({p.precision}):", "", ""))
    if memory is None:
        rows.append(("", _MODEL_HINT, ""))
    else:
        trained = "params" if p.trained_params == p.params else f"{p.trained_params:,} trainable"
        rows += [
            ("weights", fb(memory.weights_bytes), f"{p.params:,} params x 4 B"),
            ("16-bit weight copies", fb(memory.weight_copies_bytes), "params x 2 B (mixed precision only)"),
            ("gradients", fb(memory.gradients_bytes), f"{trained} x 4 B"),
            ("accumulator", fb(memory.accumulator_bytes), f"{trained} x 4 B (when accumulating)"),
            ("optimizer slots", fb(memory.optimizer_bytes), f"{p.optimizer_slots} x {trained} x 4 B"),
            ("activations", fb(memory.activations_bytes),
             "unknown: pass --activation-bytes (per sample)" if memory.activations_bytes is None
             else f"{fb(p.activation_bytes)}/sample x {p.micro_batch_size}"),
            ("total", f">= {fb(memory.static_bytes)}" if memory.total_bytes is None else fb(memory.total_bytes), ""),
        ]
    if p.measured_peak_bytes is not None:
        rows.append(("measured peak", fb(p.measured_peak_bytes), p.measured_peak_source or ""))
    rows.append(("Checkpoint:", "", ""))
    if p.params is None:
        rows.append(("", _MODEL_HINT, ""))
    else:
        write_note = "assumed: the whole stall window" if p.write_bandwidth is None else f"at {fb(p.write_bandwidth)}/s"
        rows += [
            ("size", fb(p.checkpoint_bytes),
             f"params x 4 B x (1 + {p.optimizer_slots} slots) + overhead" if p.trained_params == p.params
             else f"(params + {p.optimizer_slots} slots x trainable) x 4 B + overhead"),
            ("required write bandwidth", f"{fb(p.required_write_bytes_per_sec)}/s",
             f"to write within {fs(p.stall_window)}"),
            ("write time", fs(p.checkpoint_write_seconds), write_note),
            ("Young/Daly interval", fs(p.checkpoint_interval_seconds),
             f"sqrt(2 x write x MTBF {fs(p.mtbf)})"
             + ("" if p.checkpoint_interval_steps is None else f"; every {p.checkpoint_interval_steps:,} steps")),
            ("work lost per failure", fs(p.lost_seconds_per_failure),
             f"{'training' if p.no_save_falls_due else 'interval'} / 2 + restart {fs(p.restart_seconds)}"),
        ]
    rows.append(("Time:", "", ""))
    if p.step_time is None:
        rows.append(("", _TIME_HINT, ""))
    elif p.step_seconds is None:
        rows.append(("", f"step time {fs(p.step_time)}; the all-reduce is {_MODEL_HINT}", ""))
    else:
        rows += [
            ("step time (1 micro batch)", fs(p.step_time),
             f"measured with {_KERAS_NAMES[p.keras]}" if p.step_time_source == "measured" else p.step_time_source or ""),
            ("compute per step", fs(p.compute_seconds_per_step), f"x {p.grad_accum_steps} accumulation"),
            ("all-reduce per step", fs(p.allreduce_seconds),
             "one replica" if p.replicas == 1
             else f"ring: 2(n-1)/n x {fb(p.gradient_bytes)} / {fb(p.link_bandwidth)}/s"),
            ("optimizer step", fs(p.step_seconds), ""),
            ("training", fs(p.train_seconds), f"{p.total_steps:,} steps"),
            ("checkpoint writes", fs(p.checkpoint_overhead_seconds), f"{p.checkpoint_count or 0} checkpoint(s)"),
            ("estimated total", fs(p.estimated_seconds), ""),
            ("expected failures", f"{p.expected_failures:.3g}",
             "" if p.expected_lost_seconds is None else f"losing about {fs(p.expected_lost_seconds)} in all"),
        ]
    return rows


def format_table(p: Plan) -> str:
    """The human-readable report of ``tfdist plan``."""
    header = (
        f"tfdist plan: {p.samples:,} samples x {p.epochs} epoch(s)"
        + (f", model {p.model}" if p.model else "")
        + (f", {p.params:,} params" if p.params is not None else "")
    )
    lines = [header]
    for label, value, note in _rows(p):
        if label.endswith(":"):
            lines += ["", label]
        elif not label:
            lines.append(f"  {value}")
        else:
            lines.append(f"  {label:<27} {value:<12} {note}".rstrip())
    for warning in p.warnings:
        lines.append(f"note: {warning}")
    return "\n".join(lines)


def plot(p: Plan, path: str, *, max_gpus: int | None = None) -> None:
    """Writes a PNG with the estimated training time and the scaling efficiency against GPUs."""
    if p.step_time is None or p.params is None:
        raise PlanError(
            f"Invalid `--plot`; received --plot={path!r} without a "
            f"{'step time' if p.step_time is None else 'parameter count'}. "
            "Fix: add --step-time (or --measure) and --params (or --model)."
        )
    _check_plot(path)
    top = max_gpus or max(DEFAULT_MAX_GPUS, p.replicas)
    gpus = sorted({2**i for i in range(int(math.log2(top)) + 1)} | {top, p.replicas})
    try:
        points = p.scaling([g for g in gpus if g <= top])
        finite = all(math.isfinite(pt.train_seconds) for pt in points)
    except OverflowError:
        finite = False
    if not finite:
        raise PlanError(
            f"Invalid `--plot`; received --plot={path!r} for a plan whose time on fewer GPUs overflows a float "
            f"(step time {p.step_time!r} s, {p.total_steps} steps). Fix: use realistic --step-time, --epochs "
            "and --samples, or leave out --plot."
        )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    longest = max(pt.train_seconds for pt in points)
    units = (("hours", 3600), ("minutes", 60), ("seconds", 1))
    unit, scale = next((u, s) for u, s in units if longest >= 2 * s or s == 1)
    times = [pt.train_seconds / scale for pt in points]
    low, high = math.floor(math.log10(min(times))), math.ceil(math.log10(max(times)))
    yticks = [t for t in (float(f"{m}e{e}") for e in range(low, high + 1) for m in (1, 2, 5))
              if min(times) / 1.5 <= t <= max(times) * 1.5]
    xs = [pt.gpus for pt in points]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5), constrained_layout=True)
    left.plot(xs, times, "o-", color="tab:blue", label="estimated training time")
    left.plot(xs, [points[0].train_seconds / scale / (pt.gpus / points[0].gpus) for pt in points], "--",
              color="gray", label="perfect scaling")
    left.set_yscale("log")
    left.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    if len(yticks) >= 2:  # else matplotlib's own log ticks
        left.yaxis.set_major_locator(FixedLocator(yticks))
        left.yaxis.set_minor_locator(NullLocator())
    left.set_ylabel(f"training time ({unit}, log scale)")
    left.set_title("Estimated training time (checkpoint writes excluded)")
    right.plot(xs, [100 * pt.efficiency for pt in points], "o-", color="tab:green", label="scaling efficiency")
    right.axhline(100, ls="--", color="gray", label="perfect scaling")
    right.set_ylim(0, 105)
    right.set_ylabel("efficiency (% of perfect scaling)")
    right.set_title("Scaling efficiency (ring all-reduce model)")
    planned = next((pt for pt in points if pt.gpus == p.replicas), None)
    for axis in (left, right):
        axis.set_xscale("log", base=2)
        axis.xaxis.set_major_locator(FixedLocator(xs))
        axis.xaxis.set_minor_locator(NullLocator())
        axis.set_xticklabels([str(x) for x in xs])
        axis.set_xlabel("GPUs (replicas)")
        axis.grid(True, which="major", alpha=0.3)
    dropping = [pt for pt in points if pt.dropped_samples_per_epoch > 0.1 * p.samples]
    if dropping:  # their time falls below perfect scaling: fewer samples are trained on
        left.scatter([pt.gpus for pt in dropping], [pt.train_seconds / scale for pt in dropping], s=180,
                     facecolors="none", edgecolors="tab:orange", linewidths=2,
                     label="drops over 10% of the samples per epoch", zorder=3)
    if planned is not None:
        left.plot([planned.gpus], [planned.train_seconds / scale], "*", ms=16, color="tab:red",
                  label=f"this plan: {planned.gpus} GPU(s), {format_seconds(planned.train_seconds)}")
        right.plot([planned.gpus], [100 * planned.efficiency], "*", ms=16, color="tab:red",
                   label=f"this plan: {100 * planned.efficiency:.0f}%")
    left.legend(loc="upper right")
    right.legend(loc="lower left")
    fig.suptitle(
        f"tfdist plan: {p.model + ', ' if p.model else ''}{p.params:,} params, micro batch {p.micro_batch_size} x "
        f"{p.grad_accum_steps} accumulation per GPU, {p.epochs} epoch(s) of {p.samples:,} samples\n"
        f"step time {format_seconds(p.step_time)} per micro batch, "
        f"ring all-reduce over a {format_bytes(p.link_bandwidth)}/s link; "
        "the global batch grows with the GPUs",
        fontsize=11,
    )
    try:
        fig.savefig(path, dpi=110)
    except OSError as e:
        raise PlanError(
            f"Invalid `--plot`; received --plot={path!r}, which cannot be written ({e.strerror or e}). "
            "Fix: pass a .png path in a folder you can write to."
        ) from None
    finally:
        plt.close(fig)


def run(args: argparse.Namespace) -> int:
    max_gpus = _option(args, "max_gpus", positive=True)
    if args.plot is not None:  # before a measurement, not after it
        _check_plot(args.plot)
    if max_gpus is not None and args.plot is None:
        sys.stderr.write("tfdist: warning: --max-gpus changes nothing without --plot (it sets the plot's largest GPU "
                         "count).\n")
    if args.measure or args.model:
        # The checks that need no TensorFlow first: a bad number is refused at once, not after its import.
        _make_plan(argparse.Namespace(**{**vars(args), "model": None, "measure": False}))
        _quiet.import_tensorflow()
    p = _make_plan(args)
    if args.plot:
        plot(p, args.plot, max_gpus=max_gpus)
    if args.json:
        print(json.dumps(p.to_dict(), indent=2))
    else:
        print(format_table(p))
        if args.plot:
            print(f"\nplot written to {args.plot}")
    return 0
