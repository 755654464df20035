"""How long each of a run's first asynchronous saves blocks with the state in GPU memory, and where
the time of a later one goes (cProfile): the "wide" model + Adam (~594 MB), tfdist's Checkpointer.

    python benchmarks/device/save_profile.py [--saves 4] [--device /gpu:0]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import checkpoint  # noqa: E402  (benchmarks/checkpoint.py: the same model and Checkpointer as its part a)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--saves", type=int, default=4, help="saves timed; the last one is profiled")
    p.add_argument("--device", default="/gpu:0")
    args = p.parse_args()
    directory = tempfile.mkdtemp(prefix="tfdist-save-profile-")
    model, checkpointers = checkpoint.model_checkpointers({"async": directory}, "wide", args.device)
    checkpointer = checkpointers["async"]
    print(f"state on {model.weights[0].device}: {len(model.weights)} model + "
          f"{len(model.optimizer.variables())} optimizer variables")
    profile = cProfile.Profile()
    for step in range(1, args.saves + 1):
        last = step == args.saves
        if last:
            profile.enable()
        start = time.perf_counter()
        checkpointer.save(global_step=step, epoch=0, step_in_epoch=step, history=[])
        blocked = time.perf_counter() - start
        if last:
            profile.disable()
        checkpointer.sync()
        print(f"save {step}: blocked {blocked * 1e3:.0f} ms, complete {time.perf_counter() - start:.3f} s", flush=True)
    checkpointer.close()
    pstats.Stats(profile).sort_stats("cumulative").print_stats(20)


if __name__ == "__main__":
    main()
