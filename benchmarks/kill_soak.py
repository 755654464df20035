"""Killed from outside at moments no one chose: does `tfdist train`, SIGKILLed again and again
and started again each time, end bit-identical to a run never interrupted?

The tests place their kills (``TFDIST_FAULT`` kills a run at an exact step, or right after an
asynchronous save starts). This script does what a preemptible machine does instead: it starts
the same `tfdist train` command as a user would, SIGKILLs its process group after a random delay
(anywhere from start-up, through restoring a checkpoint, to training and saving), starts the
command again, and so on, until a start runs to the end (a round); fresh rounds follow until the
scenario's SIGKILLs are spent. The delays are drawn from a seeded generator, uniformly between
5 % and 85 % of the length of a run never interrupted, so kills land in start-up, in the
restore, between steps, in the middle of writing a checkpoint and after the last step alike (a
restarted run has less left to do, so a late kill can find it finishing).

Each scenario is a real user set-up: the built-in ``resnet`` (input noise, BatchNormalization,
Dropout, a decaying learning rate), op determinism, a checkpoint at every step or two (so most
kills land while a save is in flight), Keras 3 and tf_keras, in-memory arrays and TFRecord files,
one device, ``mirrored`` on two logical CPUs, and two ``multi_worker_mirrored`` workers under
``tfdist launch``: there one task of the cluster, chosen at random, is SIGKILLed after each
start, and the launcher restarts the whole cluster, as it does in production.

Reported per scenario: the kills (and how many landed after the model was built), the steps
each start resumed from (they must never go back: a kill must not cost a saved step), whether
``tfdist ckpt verify`` passes on what the kills left, which temporary files of killed writes are
still there at the end (the last start removes what the kills left), and whether the final
checkpoint's tensors, the final loss and the run's history equal those of the run never
interrupted.

    python benchmarks/kill_soak.py            # ~7 min: 4 scenarios x 10 kills
    python benchmarks/kill_soak.py --quick    # 1 scenario, 2 kills: checks the script runs
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

import _common

TRAIN = ["--model", "resnet", "--steps-per-epoch", "20", "--seed", "4", "--deterministic", "--verbose", "0"]
SCENARIOS = {
    # name: (extra `tfdist train` arguments, data: "digits" arrays or "files", workers: None for one
    # process, N for `tfdist launch --workers N`, where one worker at a time is SIGKILLed)
    "one_device, Keras 3, arrays, save every step": (
        ["--keras", "3", "--epochs", "6", "--batch-size", "32", "--save-every-steps", "1"], "digits", None),
    "mirrored on 2 logical CPUs, tf_keras, TFRecord files, save every 2 steps": (
        ["--keras", "2", "--epochs", "5", "--strategy", "mirrored", "--cpu-devices", "2",
         "--per-replica-batch-size", "16", "--save-every-steps", "2"], "files", None),
    "one_device, Keras 3, TFRecord files, save every 0.5 s and keep 2": (
        ["--keras", "3", "--epochs", "6", "--batch-size", "32", "--save-every-seconds", "0.5", "--keep", "2"],
        "files", None),
    "multi_worker_mirrored, 2 workers under `tfdist launch`, Keras 3, TFRecord files, save every 2 steps": (
        ["--keras", "3", "--epochs", "4", "--per-replica-batch-size", "16", "--save-every-steps", "2"], "files", 2),
}


def write_files(directory: str) -> list[str]:
    """The bundled digits as 6 TFRecord files of float pixels, a validation file and a feature spec."""
    import numpy as np
    import tensorflow as tf

    from tfdist import data

    train, val = data.load_digits()
    os.makedirs(directory, exist_ok=True)

    def write(path, source, indices):
        with tf.io.TFRecordWriter(path) as w:
            for i in indices:
                feature = {"pixels": tf.train.Feature(float_list=tf.train.FloatList(value=source.x[i].ravel())),
                           "digit": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(source.y[i])]))}
                w.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())

    for f, indices in enumerate(np.array_split(np.arange(train.num_examples), 6)):
        write(os.path.join(directory, f"train-{f:05d}.tfrecord"), train, indices)
    write(os.path.join(directory, "val-00000.tfrecord"), val, range(val.num_examples))
    spec = {"x": {"key": "pixels", "dtype": "float32", "shape": [8, 8, 1]},
            "y": {"key": "digit", "dtype": "int64"}, "num_classes": 10}
    with open(os.path.join(directory, "spec.json"), "w") as f:
        json.dump(spec, f)
    return ["--data", os.path.join(directory, "train-*.tfrecord"), "--features", os.path.join(directory, "spec.json"),
            "--validation-data", os.path.join(directory, "val-*.tfrecord")]


def _command(args: list[str], out: str, *, workers: int | None = None, restarts: int = 0) -> list[str]:
    train = ["-m", "tfdist", "train", *TRAIN, *args, "--output-dir", out,
             "--summary-json", os.path.join(out, "summary.json")]
    if workers is None:
        return [sys.executable, *train]
    return [sys.executable, "-m", "tfdist", "launch", "--workers", str(workers), "--max-restarts", str(restarts),
            "--grace", "5", "--", sys.executable, *train]


def _resumed_at(output: str) -> int | None:
    """The global step a run resumed from (0: it started fresh; None: killed before it said)."""
    if "resuming from" in output:
        return int(output.split("resuming from")[1].split("global step ")[1].split(" ")[0].rstrip(".,;"))
    if "model " in output and "built in the scope" in output:
        return 0
    return None


def run_once(command: list[str], *, kill_after: float | None, log: str) -> dict:
    """Runs ``command``; SIGKILLs its process group after ``kill_after`` seconds unless it ended first."""
    start = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=_common.child_env(),
                                cwd=_common.REPO, start_new_session=True)
        try:
            proc.wait(timeout=kill_after if kill_after is not None else 900)
            killed = False
        except subprocess.TimeoutExpired:
            if kill_after is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise RuntimeError(f"`{' '.join(command)}` did not finish within 900 s")
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            killed = True
    with open(log) as f:
        output = f.read()
    return {"killed": killed, "code": proc.returncode, "seconds": time.monotonic() - start,
            "resumed_at": _resumed_at(output), "training": "built in the scope" in output, "output": output}


def _latest_tensors(directory: str) -> dict:
    """Every tensor of the newest complete checkpoint in ``directory`` (the save counter left out)."""
    from tfdist.checkpoint import layout

    reader = layout.reader(layout.checkpoint_paths(directory)[-1])
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if not name.startswith(("save_counter", layout.SERIALIZED_GRAPH))}


def _history(directory: str) -> dict:
    from tfdist.checkpoint import layout

    return layout.latest_metadata(directory).history


def _compare(reference: str, interrupted: str) -> dict:
    """The interrupted run's final state against the run never interrupted, and what is left in its directory."""
    import numpy as np

    from tfdist.checkpoint import layout

    checkpoints = os.path.join(interrupted, "checkpoints")
    verify = subprocess.run([sys.executable, "-m", "tfdist", "ckpt", "verify", checkpoints], capture_output=True,
                            text=True, env=_common.child_env(), cwd=_common.REPO, timeout=300)
    a = _latest_tensors(os.path.join(reference, "checkpoints"))
    b = _latest_tensors(checkpoints)
    same_names = sorted(a) == sorted(b)
    differing = [k for k in a if k in b and not np.array_equal(a[k], b[k])] if same_names else sorted(set(a) ^ set(b))
    summaries = []
    for directory in (reference, interrupted):
        with open(os.path.join(directory, "summary.json")) as f:
            summaries.append(json.load(f))
    identical = (not differing and summaries[0]["final_loss"] == summaries[1]["final_loss"]
                 and _history(os.path.join(reference, "checkpoints")) == _history(checkpoints))
    return {
        "verify_code": verify.returncode,
        "verify_tail": verify.stdout.strip().splitlines()[-1:],
        "leftovers": [os.path.basename(p) for p in layout.interrupted_writes(checkpoints)],
        "tensors": len(a),
        "differing_tensors": differing,
        "identical": identical,
        "final_loss": (summaries[0]["final_loss"], summaries[1]["final_loss"]),
    }


def _round(name: str, args: list[str], root: str, reference: str, *, length: float, kills: int,
           rng: random.Random) -> dict:
    """One interrupted run: restarted after each SIGKILL (at most ``kills``) until it ends by
    itself; then compared with the run never interrupted."""
    interrupted = os.path.join(root, "interrupted")
    runs = []
    while True:
        delay = rng.uniform(0.05 * length, 0.85 * length) if len(runs) < kills else None
        run = run_once(_command(args, interrupted), kill_after=delay, log=os.path.join(root, f"run-{len(runs)}.log"))
        run["kill_after"] = delay
        if not run["killed"] and run["code"] != 0:
            sys.stderr.write(run["output"][-4000:])
            raise RuntimeError(f"{name}: restart {len(runs)} failed with exit code {run['code']}")
        runs.append(run)
        print(f"  {name}: {os.path.basename(root)}, run {len(runs)}: "
              + (f"SIGKILL after {delay:.2f} s" if run["killed"] else "ended by itself")
              + f", resumed from step {run['resumed_at']}", flush=True)
        if not run["killed"]:
            break
    resumed = [r["resumed_at"] for r in runs if r["resumed_at"] is not None]
    return {
        "kills": sum(r["killed"] for r in runs),
        "kills_after_model_built": sum(r["killed"] and r["training"] for r in runs),
        "kill_delays": [round(r["kill_after"], 2) for r in runs if r["killed"]],
        "resumed_from": resumed,
        "never_went_back": all(x <= y for x, y in zip(resumed, resumed[1:])),
        **_compare(reference, interrupted),
    }


def _tasks(launcher: int) -> dict[int, str]:
    """The live task processes of the launcher ``launcher``: {pid: task name from its TF_CONFIG}."""
    tasks = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
            if int(ppid) != launcher or state == "Z":
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except (OSError, ValueError):
            continue
        config = next((e[len(b"TF_CONFIG="):] for e in environ if e.startswith(b"TF_CONFIG=")), None)
        if config:
            task = json.loads(config)["task"]
            tasks[int(entry)] = f"{task['type']}:{task['index']}"
    return tasks


def _cluster_round(name: str, args: list[str], root: str, reference: str, *, workers: int, length: float,
                   kills: int, rng: random.Random) -> dict:
    """One `tfdist launch` job: after each start of the cluster, one of its tasks (chosen at random)
    is SIGKILLed after a random delay, and the launcher restarts the cluster, until ``kills`` kills
    or the job ends; then the job runs to its end and is compared with the run never interrupted."""
    interrupted = os.path.join(root, "interrupted")
    log = os.path.join(root, "launch.log")
    killed, seen = [], set()
    with open(log, "w") as out:
        proc = subprocess.Popen(_command(args, interrupted, workers=workers, restarts=kills + 5), stdout=out,
                                stderr=subprocess.STDOUT, env=_common.child_env(), cwd=_common.REPO,
                                start_new_session=True)
        try:
            while len(killed) < kills and proc.poll() is None:
                tasks = {}
                while proc.poll() is None:  # a new start of the cluster: none of its tasks seen before
                    tasks = _tasks(proc.pid)
                    if len(tasks) == workers and not set(tasks) & seen:
                        break
                    time.sleep(0.05)
                offset = os.path.getsize(log)
                delay = rng.uniform(0.05 * length, 0.85 * length)
                try:
                    proc.wait(timeout=delay)
                    break
                except subprocess.TimeoutExpired:
                    pass
                tasks = _tasks(proc.pid)
                if not tasks:
                    continue
                victim = rng.choice(sorted(tasks))
                os.killpg(victim, signal.SIGKILL)  # the task's own process group
                seen |= set(tasks)
                with open(log) as f:
                    f.seek(offset)
                    since = f.read()
                built = any(line.startswith(f"[{tasks[victim]}]") and "built in the scope" in line
                            for line in since.splitlines())
                killed.append({"task": tasks[victim], "kill_after": round(delay, 2), "model_built": built})
                print(f"  {name}: {os.path.basename(root)}, SIGKILL of {tasks[victim]} after {delay:.2f} s", flush=True)
            proc.wait(timeout=1800)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    with open(log) as f:
        output = f.read()
    if proc.returncode != 0:
        sys.stderr.write(output[-4000:])
        raise RuntimeError(f"{name}: the launched job ended with exit code {proc.returncode}")
    chief = [line for line in output.splitlines() if line.startswith("[worker:0]")]
    resumed = [0] + [int(line.split("global step ")[1].split(" ")[0]) for line in chief if "resuming from" in line]
    print(f"  {name}: {os.path.basename(root)}: the job ended by itself; starts resumed from {resumed}", flush=True)
    return {
        "kills": len(killed),
        "kills_after_model_built": sum(k["model_built"] for k in killed),
        "kill_delays": [k["kill_after"] for k in killed],
        "killed_tasks": [k["task"] for k in killed],
        "resumed_from": resumed,
        "never_went_back": all(x <= y for x, y in zip(resumed, resumed[1:])),
        **_compare(reference, interrupted),
    }


def soak(name: str, args: list[str], root: str, *, workers: int | None, kills: int, rng: random.Random) -> dict:
    """A run never interrupted, then interrupted rounds until ``kills`` SIGKILLs have landed
    (a round whose restart ends by itself before that is followed by a fresh one)."""
    reference = os.path.join(root, "reference")
    first = run_once(_command(args, reference, workers=workers), kill_after=None,
                     log=os.path.join(root, "reference.log"))
    if first["code"] != 0:
        sys.stderr.write(first["output"][-4000:])
        raise RuntimeError(f"{name}: the run never interrupted failed with exit code {first['code']}")
    rounds = []
    while not rounds or sum(r["kills"] for r in rounds) < kills:
        directory = os.path.join(root, f"round-{len(rounds)}")
        os.makedirs(directory)
        left = kills - sum(r["kills"] for r in rounds)
        if workers is None:
            rounds.append(_round(name, args, directory, reference, length=first["seconds"], kills=left, rng=rng))
        else:
            rounds.append(_cluster_round(name, args, directory, reference, workers=workers, length=first["seconds"],
                                         kills=left, rng=rng))
        if len(rounds) >= max(kills, 1):  # every round ended by itself at once: the delays are too long
            break
    return {"scenario": name, "never_interrupted_seconds": first["seconds"], "rounds": rounds}


def main() -> None:
    p = _common.parser(__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=None, help="SIGKILLs per scenario (default 10; --quick 2)")
    p.add_argument("--seed", type=int, default=0, help="seed of the kill delays (default 0)")
    p.add_argument("--scenarios", default=None, metavar="N,N",
                   help=f"which scenarios, numbered 1-{len(SCENARIOS)} in the order of SCENARIOS (default all; --quick 1)")
    p.add_argument("--dir", default=None, help="keep the runs and their logs here (default: a temporary directory)")
    args = p.parse_args()
    kills = args.kills if args.kills is not None else (2 if args.quick else 10)
    if kills < 0:
        p.error(f"--kills must be 0 or more; received {kills}")
    info = _common.machine()
    rng = random.Random(args.seed)
    try:
        chosen = [int(n) for n in args.scenarios.split(",")] if args.scenarios else ([1] if args.quick else None)
        names = [list(SCENARIOS)[n - 1] for n in chosen] if chosen else list(SCENARIOS)
        if chosen and min(chosen) < 1:
            raise IndexError
    except (ValueError, IndexError):
        p.error(f"--scenarios takes numbers from 1 to {len(SCENARIOS)} separated by commas; received {args.scenarios!r}")
    results = []
    with tempfile.TemporaryDirectory(prefix="tfdist-soak-") as tmp:
        root = args.dir or tmp
        files = None
        for i, name in enumerate(names):
            extra, data, workers = SCENARIOS[name]
            if data == "files" and files is None:
                files = write_files(os.path.join(root, "files"))
            directory = os.path.join(root, f"scenario-{i}")
            os.makedirs(directory, exist_ok=True)
            result = soak(name, [*extra, *(files if data == "files" else [])], directory, workers=workers,
                          kills=kills, rng=rng)
            print(json.dumps({k: v for k, v in result.items()}, default=str), flush=True)
            results.append(result)

    def cell(result, key, text):
        return " / ".join(text(r[key]) for r in result["rounds"])

    rows = []
    for r in results:
        rounds = r["rounds"]
        rows.append((
            r["scenario"],
            f"{sum(x['kills'] for x in rounds)} in {len(rounds)} round(s) "
            f"({sum(x['kills_after_model_built'] for x in rounds)} after the model was built)",
            cell(r, "resumed_from", lambda steps: " → ".join(str(s) for s in steps)),
            "yes" if all(x["never_went_back"] for x in rounds) else "**NO**",
            "passes" if all(x["verify_code"] == 0 for x in rounds) else "**fails**",
            ", ".join(name for x in rounds for name in x["leftovers"]) or "none",
            (f"**yes**, {len(rounds)} of {len(rounds)}" if all(x["identical"] for x in rounds)
             else f"**NO**, {sum(x['identical'] for x in rounds)} of {len(rounds)}")
            + f" ({rounds[0]['tensors']} tensors, history, final loss)",
        ))
    _common.finish(
        title="Killed at random moments from outside, started again each time, against a run never interrupted",
        info=info, command=" ".join(["python", "benchmarks/kill_soak.py", *sys.argv[1:]]), results={"runs": results},
        rows=rows, args=args,
        header=("Scenario", "SIGKILLs", "Steps each start resumed from (rounds split by /)", "Never went back",
                "`tfdist ckpt verify` after", "Killed writes' files left at the end", "Final state bit-identical"),
        notes=[f"Kill delays drawn uniformly between 5 % and 85 % of the length of the run never interrupted "
               f"(seed {args.seed}); the process group is SIGKILLed. A round ends when a start runs to the end; "
               "rounds follow, each in a fresh directory, until the scenario's SIGKILLs are spent.",
               "Every scenario: `tfdist train " + " ".join(TRAIN) + "` plus its own arguments (see SCENARIOS).",
               "Under `tfdist launch`, each start of the cluster has one of its tasks (chosen at random) SIGKILLed, "
               "and the launcher restarts the whole cluster; the steps are those the chief (worker:0) resumed from."],
    )


if __name__ == "__main__":
    main()
