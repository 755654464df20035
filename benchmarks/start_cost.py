"""The CPU a process spends importing tfdist and Keras, with and without matplotlib importable.

Keras imports ``matplotlib.pyplot`` whenever matplotlib is installed. Every task of a launch pays
that import on every start, so tfdist keeps matplotlib out of its dependencies (the ``plot``
extra). Each repetition starts two fresh processes that run ``import tfdist, keras``, alternated
(A B, B A, ...): (A) as installed, (B) with ``sys.modules["matplotlib"] = None``, which is what an
install without the extra sees. The figure is each process's user + system CPU, from the kernel's
accounting of the waited child; the ratio is paired by repetition (B over A).

    python benchmarks/start_cost.py [--quick] [--reps 12]

It needs matplotlib installed (``pip install ".[plot]"``), since (A) must import it.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

VARIANTS = {
    "A": "import tfdist, keras",
    "B": "import sys; sys.modules['matplotlib'] = None; import tfdist, keras",
}


def measure(code: str) -> dict[str, float]:
    """CPU and wall seconds of one fresh ``python -c code``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env=_common.child_env(), capture_output=True, timeout=300)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"cpu": cpu, "wall": wall}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=12, help="repetitions of each variant (default 12)")
    parser.add_argument("--quick", action="store_true", help="2 repetitions: only checks that the script runs")
    args = parser.parse_args(argv)
    if importlib.util.find_spec("matplotlib") is None:
        sys.stderr.write("start_cost.py: matplotlib is not installed, so variant A cannot import it. "
                         "Fix: pip install '.[plot]'.\n")
        return 2
    reps = 2 if args.quick else args.reps
    info = _common.machine()
    runs = {name: [] for name in VARIANTS}
    measure(VARIANTS["A"])  # the page cache holds the libraries for both variants from here on
    for rep in range(reps):
        for name in (("A", "B") if rep % 2 == 0 else ("B", "A")):
            runs[name].append(measure(VARIANTS[name]))
            print(f"rep {rep + 1}/{reps} {name}: {runs[name][-1]['cpu']:.2f} s CPU", flush=True)
    info["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    import matplotlib

    cpu_a, cpu_b = _common.summary_of(runs["A"], "cpu"), _common.summary_of(runs["B"], "cpu")
    saved = _common.summary([a["cpu"] - b["cpu"] for a, b in zip(runs["A"], runs["B"])])
    lines = [
        f"Machine: {_common.describe_machine(info)}; matplotlib {matplotlib.__version__}.",
        "",
        "| variant | CPU per process, s | wall per process, s |",
        "|---|---|---|",
        f"| (A) `import tfdist, keras`, matplotlib installed | {_common.fmt(cpu_a)} | "
        f"{_common.fmt(_common.summary_of(runs['A'], 'wall'))} |",
        f"| (B) the same, matplotlib not importable | {_common.fmt(cpu_b)} | "
        f"{_common.fmt(_common.summary_of(runs['B'], 'wall'))} |",
        "",
        f"CPU saved per process (A − B, paired): {_common.fmt(saved, unit=' s')}.",
        f"Ratio B / A (paired): {_common.fmt_ratio(_common.paired(runs['A'], runs['B'], 'cpu'))}.",
    ]
    print("----- Markdown -----")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
