"""Every keras.io model pattern under every synchronous strategy: SIGKILLed once, started again, bit-identical?

The test suite runs a representative part of this matrix (tests/test_keras_patterns.py). This
script runs all of it: each pattern of tests/keras_patterns.py (a GAN with two optimizers and
no call(), a VAE with its own loss trackers, an autoencoder on images without labels, a model
counting examples in a variable, a string column from a pandas-like object array) under
``one_device``, ``mirrored`` and ``central_storage`` (two logical CPUs) and two
``multi_worker_mirrored`` workers under ``tfdist launch``. For each, a run never interrupted,
then a run SIGKILLed after a random global step (after the first save, before the end; under
the launcher one worker is killed and the launcher restarts the cluster), started again. The
default asynchronous save is on.

Reported per cell: the step of the kill, the step the restart resumed from, and whether the
final checkpoint's tensors are bit-identical to the uninterrupted run's.

    python benchmarks/keras_patterns.py            # the whole matrix (~15 min on 2 cores)
    python benchmarks/keras_patterns.py --quick    # one cell: checks the script runs
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(REPO, "tests")
DRIVER = os.path.join(TESTS, "keras_patterns.py")
PATTERNS = ("gan", "vae", "autoencoder", "counter", "strings")
STRATEGIES = ("one_device", "mirrored", "central_storage", "multi_worker_mirrored")
STEPS = 12


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_CONFIG", "SLURM_", "TFDIST_"))}
    env.update(PYTHONPATH=os.pathsep.join([REPO, TESTS]), TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", **extra)
    return env


def _run(strategy: str, root: str, pattern: str, kill_at: int, *, fault: str | None = None) -> tuple[int, str]:
    driver = [sys.executable, DRIVER, strategy, root, pattern, str(kill_at)]
    if strategy == "multi_worker_mirrored":
        command = [sys.executable, "-m", "tfdist", "launch", "--workers", "2", "--", *driver]
    else:
        command = driver
    done = subprocess.run(command, env=_env(**({"TFDIST_FAULT": fault} if fault else {})), capture_output=True,
                          text=True, timeout=600)
    return done.returncode, done.stdout + done.stderr


def _resumed_from(out: str, pattern: str) -> int | None:
    for line in out.splitlines():
        if "RESULT " in line:
            return json.loads(line.split("RESULT ", 1)[1])[pattern]["from"]
    return None


def _tensors(directory: str) -> dict:
    import tensorflow as tf

    reader = tf.compat.v1.train.NewCheckpointReader(tf.train.latest_checkpoint(directory))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if not name.startswith(("save_counter", "_CHECKPOINTABLE_OBJECT_GRAPH"))}


def cell(strategy: str, pattern: str, rng: random.Random) -> dict:
    kill_at = rng.randint(3, STEPS - 1)
    with tempfile.TemporaryDirectory() as root:
        reference, killed = os.path.join(root, "reference"), os.path.join(root, "killed")
        code, out = _run(strategy, reference, pattern, 0)
        if code != 0:
            return {"error": f"reference run exited {code}: {out[-500:]}"}
        if strategy == "multi_worker_mirrored":  # the launcher restarts the cluster after worker 1's kill
            code, out = _run(strategy, killed, pattern, 0, fault=f"worker:1/kill_at_step:{kill_at}")
        else:
            code, out = _run(strategy, killed, pattern, kill_at)
            if code != -9:
                return {"error": f"the killed run exited {code}, not by SIGKILL: {out[-500:]}"}
            code, out = _run(strategy, killed, pattern, kill_at)
        if code != 0:
            return {"error": f"the restart exited {code}: {out[-500:]}"}
        a, b = _tensors(os.path.join(reference, pattern)), _tensors(os.path.join(killed, pattern))
        same = sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)
        return {"kill_at": kill_at, "resumed_from": _resumed_from(out, pattern), "tensors": len(a),
                "bit_identical": same}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one cell (gan under one_device)")
    parser.add_argument("--seed", type=int, default=0, help="the seed of the kill steps (default 0)")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    cells = [("one_device", "gan")] if args.quick else [(s, p) for s in STRATEGIES for p in PATTERNS]
    failures = 0
    print(f"{'strategy':<24}{'pattern':<13}{'killed at':>10}{'resumed from':>14}  bit-identical")
    for strategy, pattern in cells:
        result = cell(strategy, pattern, rng)
        if "error" in result:
            failures += 1
            print(f"{strategy:<24}{pattern:<13}  ERROR {result['error']}", flush=True)
            continue
        failures += not result["bit_identical"]
        resumed = "?" if result["resumed_from"] is None else result["resumed_from"]
        print(f"{strategy:<24}{pattern:<13}{result['kill_at']:>10}{resumed!s:>14}  "
              f"{'yes' if result['bit_identical'] else 'NO'} ({result['tensors']} tensors)", flush=True)
    print(f"{len(cells) - failures} of {len(cells)} cells bit-identical after a SIGKILL and a restart")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
