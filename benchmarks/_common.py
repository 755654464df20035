"""Shared helpers of the benchmark scripts: machine description, statistics, child runs, output.

Every benchmark compares variants measured side by side in one run: the variants are
alternated (A B A B ...), each repetition usually in a fresh Python process so that no
variant inherits another's global TensorFlow state, and the script reports the median
and the spread (min-max) of each figure and of the ratio of paired repetitions.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Sequence

RESULT_PREFIX = "BENCH-RESULT "
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:  # measure this checkout's tfdist, in this process as in the children
    sys.path.insert(0, REPO)


# --- the machine -------------------------------------------------------------------------------
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _filesystem(path: str) -> str:
    """``device type`` of the mount holding ``path`` (from /proc/mounts; best effort)."""
    path = os.path.realpath(path)
    best = ("", "?", "?")
    try:
        with open("/proc/mounts") as f:
            for line in f:
                device, mount, fstype = line.split()[:3]
                if (path == mount or path.startswith(mount.rstrip("/") + "/")) and len(mount) > len(best[0]):
                    best = (mount, device, fstype)
    except OSError:
        pass
    return f"{best[1]} ({best[2]}, mounted on {best[0] or '?'})"


def machine(*, tensorflow: bool = True, paths: Sequence[str] = ()) -> dict[str, Any]:
    """Cores, CPU, memory, load, Python/TensorFlow/tf_keras/Keras 3 versions (TensorFlow imported if asked)."""
    info: dict[str, Any] = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpu": _cpu_model(),
        "cores_online": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    try:
        with open("/proc/meminfo") as f:
            info["memory_gb"] = round(int(f.readline().split()[1]) / 1e6, 1)
    except OSError:
        pass
    if tensorflow:
        import keras
        import tensorflow as tf
        import tf_keras

        info["tensorflow"] = tf.__version__
        info["tf_keras"] = tf_keras.__version__
        info["keras"] = keras.__version__
        info["gpus"] = len(tf.config.list_physical_devices("GPU"))
    for path in paths:
        info.setdefault("filesystems", {})[path] = _filesystem(path)
    return info


def describe_machine(info: dict[str, Any]) -> str:
    parts = [
        f"{info['cores_usable']} usable cores ({info['cpu']})",
        f"{info.get('memory_gb', '?')} GB RAM",
        f"TensorFlow {info.get('tensorflow', '?')}, tf_keras {info.get('tf_keras', '?')}, Keras {info.get('keras', '?')}",
        f"Python {info['python']}",
        f"load average at start {info['load_average_at_start']}",
    ]
    if "load_average_at_end" in info:
        parts.append(f"at end {info['load_average_at_end']}")
    return "; ".join(parts)


# --- statistics --------------------------------------------------------------------------------
def summary(values: Sequence[float]) -> dict[str, float]:
    """Median, min, max and count of ``values`` (empty -> NaNs)."""
    values = [float(v) for v in values]
    if not values:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan"), "n": 0}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def summary_of(runs: Sequence[dict[str, Any]], key: str) -> dict[str, float]:
    """``summary`` of ``run[key]`` over ``runs``."""
    return summary([run[key] for run in runs])


def paired(baseline: Sequence[dict[str, Any]], other: Sequence[dict[str, Any]], key: str) -> dict[str, float]:
    """``summary`` of ``other[i][key] / baseline[i][key]``: ratios paired by repetition."""
    return summary([o[key] / b[key] for b, o in zip(baseline, other)])


def fmt(stats: dict[str, float], scale: float = 1.0, unit: str = "", digits: int = 3) -> str:
    """``median (min-max)`` text of a summary, values multiplied by ``scale``."""
    m, lo, hi = (stats[k] * scale for k in ("median", "min", "max"))
    return f"{m:.{digits}g}{unit} ({lo:.{digits}g}–{hi:.{digits}g}{unit}, n={stats['n']})"


def fmt_ratio(stats: dict[str, float]) -> str:
    return f"{stats['median']:.3f} (min–max {stats['min']:.3f}–{stats['max']:.3f}, n={stats['n']})"


# --- child processes ---------------------------------------------------------------------------
def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_child(script: str, spec: dict[str, Any], *, timeout: float = 600) -> dict[str, Any]:
    """Runs ``python script --child JSON`` in a fresh process; returns the dict it printed.

    The child prints one line ``BENCH-RESULT {json}`` (see ``emit``); anything else it
    prints is shown only if it fails.
    """
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, script, "--child", json.dumps(spec)],
        capture_output=True, text=True, timeout=timeout, env=child_env(), cwd=REPO,
    )
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            result = json.loads(line[len(RESULT_PREFIX):])
            result["process_seconds"] = time.perf_counter() - start
            return result
    sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
    raise RuntimeError(f"child {spec} failed with exit code {proc.returncode}")


def lockstep(
    target: Callable, specs: dict[str, dict], *, rotation: int = 0, turn_timeout: float = 600, linger: float = 60
) -> dict[str, dict]:
    """Runs ``target(spec, conn)`` for each variant in its own fresh (spawned) process, in turns.

    Only one process works at a time: each runs until it passes the turn (``Turns.pass_turn``)
    or finishes, then the next one runs; the order rotates every round (A B C, B C A, ...).
    Every stretch of one variant is thus measured next to a stretch of the others, so the
    slow load drifts of a shared machine hit all variants alike. Importing TensorFlow
    happens in parallel before the first turn and is not timed. Returns each variant's result;
    a process still running ``linger`` seconds after the last result is killed.
    """
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    procs = {}
    for name, spec in specs.items():
        parent, child_end = ctx.Pipe()
        proc = ctx.Process(target=target, args=(spec, child_end), daemon=True)
        proc.start()
        procs[name] = (proc, parent)

    def receive(name):
        proc, conn = procs[name]
        deadline = time.monotonic() + turn_timeout
        while not conn.poll(1.0):
            if not proc.is_alive():
                raise RuntimeError(f"the {name} process died with exit code {proc.exitcode}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the {name} process did not pass its turn within {turn_timeout:g} s")
        return conn.recv()

    try:
        for name in procs:
            message = receive(name)
            assert message[0] == "loaded", message
        names, results, turn = list(procs), {}, 0
        while len(results) < len(names):
            k = (turn + rotation) % len(names)
            for name in names[k:] + names[:k]:
                if name in results:
                    continue
                procs[name][1].send(("go",))
                message = receive(name)
                if message[0] == "result":
                    results[name] = message[1]
            turn += 1
    finally:
        for proc, conn in procs.values():
            proc.join(timeout=linger)
            if proc.is_alive():  # SIGKILL: tfdist.fit turns SIGTERM into "save at the next step"
                proc.kill()
                proc.join(timeout=10)
            conn.close()
    return results


class Turns:
    """The child's side of ``lockstep``."""

    def __init__(self, conn):
        self.conn = conn
        self.waited = 0.0

    def start(self) -> None:
        """Says the process is ready, and waits for its first turn."""
        self.conn.send(("loaded",))
        self.conn.recv()

    def pass_turn(self) -> float:
        """Lets the other variants run; returns the time of the handover (when the turn came back)."""
        start = time.perf_counter()
        self.conn.send(("turn",))
        self.conn.recv()
        now = time.perf_counter()
        self.waited += now - start
        return now

    def finish(self, result: dict[str, Any]) -> None:
        self.conn.send(("result", result))


def time_batches(dataset: Any, *, warmup: int, batches: int) -> float:
    """Seconds to take ``batches`` elements of ``dataset``, after ``warmup`` elements not timed."""
    it = iter(dataset)
    for _ in range(warmup):
        next(it)
    start = time.perf_counter()
    for _ in range(batches):
        next(it)
    return time.perf_counter() - start


def emit(result: dict[str, Any]) -> None:
    """What a child prints for ``run_child``."""
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def quiet_tensorflow() -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import logging

    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    logging.getLogger("tfdist").setLevel(logging.WARNING)


# --- command line and output -------------------------------------------------------------------
def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="a short run (< 60 s) that only checks the script works")
    p.add_argument("--json", metavar="PATH", help="write every measurement and the summary to PATH as JSON")
    p.add_argument("--markdown", metavar="PATH", help="also write the Markdown rows to PATH")
    p.add_argument("--child", metavar="JSON", help=argparse.SUPPRESS)
    return p


KERAS_LABELS = {"2": "tf_keras", "3": "Keras 3"}
KERAS_CHOICES = {"2": ("2",), "3": ("3",), "both": ("2", "3")}


def add_keras_option(p: argparse.ArgumentParser) -> None:
    """``--keras {2,3,both}`` (default both): the Kerases whose models a benchmark measures."""
    p.add_argument("--keras", choices=tuple(KERAS_CHOICES), default="both",
                   help="which Keras the models are built with: 2 (tf_keras), 3 (Keras 3) or both (default)")


def _count(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1; received {text!r}. "
                                         "Fix: pass a positive count, e.g. 8")
    return value


def add_reps_option(p: argparse.ArgumentParser, *, default: int, flag: str = "--reps",
                    what: str = "repetitions per variant", small: str = "--quick") -> None:
    """``--reps N`` (or ``flag``): how many repetitions a benchmark runs; None when not given
    (the script's ``default``, or 1 under ``small``)."""
    p.add_argument(flag, type=_count, default=None, help=f"{what} (default {default}; {small} 1)")


def keras_variant(keras: str, variant: str) -> str:
    """A variant's name with its Keras, e.g. ``Keras 3 tfdist``."""
    return f"{KERAS_LABELS[keras]} {variant}"


def alternate(variants: Sequence[str], reps: int) -> list[tuple[int, str]]:
    """(repetition, variant) in the order A B A B ... (B A B A on odd repetitions, to cancel drift)."""
    order = []
    for rep in range(reps):
        names = list(variants) if rep % 2 == 0 else list(reversed(variants))
        order.extend((rep, name) for name in names)
    return order


def finish(
    *,
    title: str,
    info: dict[str, Any],
    command: str,
    results: dict[str, Any],
    rows: Sequence[Sequence[str]],
    header: Sequence[str] = ("Figure", "Measured: median (min–max, n)", "Target", "Met?"),
    notes: Sequence[str] = (),
    args: argparse.Namespace,
) -> None:
    """Prints the Markdown snippet (machine + table) and writes the JSON / Markdown files asked for."""
    info["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    lines = [
        f"### {title}",
        "",
        f"Run {info['date']}{' (QUICK mode: not a result)' if args.quick else ''}: `{command}`  ",
        f"Machine: {describe_machine(info)}.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
    ]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    if notes:
        lines.append("")
        lines += [f"- {note}" for note in notes]
    markdown = "\n".join(lines) + "\n"
    print("\n----- Markdown -----\n" + markdown + "--------------------")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"title": title, "machine": info, "command": command, "quick": args.quick,
                       "results": results, "markdown": markdown}, f, indent=1, default=float)
        print(f"wrote {args.json}")


def verdict(value: float, target: float, *, below: bool = True) -> str:
    """``yes``/``NO`` for a value against a target (``below``: value <= target is met)."""
    if value != value:  # NaN
        return "?"
    met = value <= target if below else value >= target
    return "yes" if met else "**NO**"
