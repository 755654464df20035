"""tfdist on a real Slurm cluster of one node, through sbatch and srun, as docs/multi-host.md says.

``tests/engines/slurm_cluster.sh`` installs Slurm where it can (root, apt-get) and starts it; the
tests are skipped with its reason where it cannot. The job script is the recipe's: ``srun
--distribution=block`` of the training command, then ``scontrol requeue`` on exit 75 or 76. Its
time limit is moved with ``scontrol update`` to make Slurm's own ``--signal=USR1`` come at the
moment a test needs, the way a real limit comes: during start-up, then in the middle of training.
"""

from __future__ import annotations

import json
import math
import pathlib
import random
import re
import socket
import subprocess
import sys
import textwrap

import pytest

from conftest import assert_bit_identical, base_env, checkpoint_tensors, wait_for

from tfdist import env

ENGINES = pathlib.Path(__file__).resolve().parent
TRAIN = ENGINES / "_train.py"
STEPS = 2 * 40  # epochs x steps_per_epoch of _train.py

# docs/multi-host.md's job script, with a time limit and preemption, on one node.
JOB = textwrap.dedent("""\
    #!/bin/bash
    #SBATCH --job-name={name}
    #SBATCH --nodes=1
    #SBATCH --ntasks-per-node={tasks}
    #SBATCH --time={minutes}
    #SBATCH --requeue
    #SBATCH --signal=USR1@{warn}
    #SBATCH --open-mode=append
    #SBATCH --output={log}

    srun --distribution=block {python} {train} {run_dir}
    rc=$?
    if [ "$rc" -eq 75 ] || [ "$rc" -eq 76 ]; then scontrol requeue "$SLURM_JOB_ID"; fi   # never on 2: bad input
    exit $rc
""")
WARN = 120  # --signal=USR1@120: a limit set to end 60-120 s from now makes Slurm signal at its next check


def _free_port_base(count: int) -> int:
    """The first of ``count`` free ports below the kernel's ephemeral range. srun listens on ports of
    that range, chosen when it starts: a base taken from it could be srun's by the time the tasks
    bind it, and their peers would then send TensorFlow's messages to srun."""
    low = int(pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(1000):
        base = random.randrange(max(1024, low - 12000), low - count)
        if all(_free(base + i) for i in range(count)):
            return base
    raise RuntimeError(f"no {count} consecutive free ports below {low}")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


class Slurm:
    """The cluster: submits the recipe's job and reads what Slurm says of it."""

    def __init__(self, directory: pathlib.Path):
        self.directory = directory
        self.conf = str(directory / "slurm.conf")
        self.jobs: list[str] = []

    def environ(self, **extra: str) -> dict:
        return base_env(SLURM_CONF=self.conf, **extra)

    def run(self, *args: str, timeout: float = 30, **extra: str) -> str:
        done = subprocess.run(args, env=self.environ(**extra), capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, f"{args}: {done.stderr}"
        return done.stdout

    def submit(self, name: str, run_dir: pathlib.Path, *, tasks: int = 2, minutes: int = 10, wait: bool = False,
               timeout: float = 300, **extra: str) -> tuple[str, int]:
        """(job id, sbatch's exit code: the job's with ``wait``)."""
        script = self.directory / f"{name}.sh"
        script.write_text(JOB.format(name=name, tasks=tasks, minutes=minutes, warn=WARN, log=self.log(name),
                                     python=sys.executable, train=TRAIN, run_dir=run_dir))
        extra.setdefault(env.TFDIST_PORT_BASE, str(_free_port_base(tasks)))
        done = subprocess.run(["sbatch", "--parsable", *(["--wait"] if wait else []), str(script)],
                              env=self.environ(**extra), capture_output=True, text=True, timeout=timeout)
        job = done.stdout.strip().split(";")[0]
        self.jobs.append(job)
        return job, done.returncode

    def log(self, name: str) -> pathlib.Path:
        return self.directory / f"{name}.log"

    def job(self, job: str) -> dict[str, str]:
        """``scontrol show job``'s fields (JobState, Restarts, RunTime...)."""
        out = self.run("scontrol", "show", "job", "-o", job)
        return dict(field.split("=", 1) for field in out.split() if "=" in field)

    def wait_state(self, job: str, *states: str, timeout: float) -> dict[str, str]:
        return wait_for(lambda: (lambda info: info if info["JobState"] in states else None)(self.job(job)),
                        timeout=timeout, interval=0.2, what=f"job {job} to be {' or '.join(states)}")

    def limit_from_now(self, job: str) -> None:
        """A time limit that ends 60-120 s from now: Slurm sends --signal=USR1@120 at its next check."""
        h, m, s = (["0"] + self.job(job)["RunTime"].split("-")[-1].split(":"))[-3:]
        elapsed = int(h) * 3600 + int(m) * 60 + int(s)
        self.run("scontrol", "update", f"JobId={job}", f"TimeLimit={math.ceil(elapsed / 60) + 1}")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    directory = tmp_path_factory.mktemp("slurm")
    script = ENGINES / "slurm_cluster.sh"
    done = subprocess.run(["bash", str(script), "start", str(directory)], capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or ["no reason given"])[-1]
        subprocess.run(["bash", str(script), "stop", str(directory)], capture_output=True, timeout=60)
        pytest.skip(f"no local Slurm cluster: {reason}")
    cluster = Slurm(directory)
    yield cluster
    for job in cluster.jobs:
        subprocess.run(["scancel", job], env=cluster.environ(), capture_output=True, timeout=30)
    subprocess.run(["bash", str(script), "stop", str(directory)], capture_output=True, timeout=60)


def _results(text: str) -> list[dict]:
    return [json.loads(line.split("RESULT ", 1)[1]) for line in text.splitlines() if "RESULT " in line]


def _tasks_that_exited_75(log: str) -> int:
    """How many tasks srun says exited with 75 (``task 1: ...``, or ``tasks 0-1: ...`` when they exit together)."""
    ranges = re.findall(r"tasks? (\d+)(?:-(\d+))?: Exited with exit code 75", log)
    return sum(int(last or first) - int(first) + 1 for first, last in ranges)


def _saved_steps(directory: pathlib.Path) -> int | None:
    from tfdist.checkpoint import layout

    metadata = layout.latest_metadata(str(directory))
    return None if metadata is None else metadata.global_step


@pytest.mark.timeout(900)
def test_two_workers_train_and_a_time_limit_signal_in_start_up_and_in_training_resumes_bit_identical(slurm):
    # The recipe's job never interrupted: 2 workers under multi_worker_mirrored.
    reference = slurm.directory / "uninterrupted"
    _, code = slurm.submit("uninterrupted", reference, wait=True)
    log = slurm.log("uninterrupted").read_text()
    assert code == 0, log[-4000:]
    assert sorted((r["rank"], r["strategy"], r["num_workers"], r["global_step"]) for r in _results(log)) == [
        (rank, "multi_worker_mirrored", 2, STEPS) for rank in (0, 1)]
    # 1: a limit of one minute: Slurm signals at its next check (within about 30 s), mostly while the
    # tasks start (import, connect); on a fast machine it may come once training has begun.
    run_dir = slurm.directory / "preempted"
    # Steps of 1.5 s: the training left after the second limit (40 steps or more) outlasts Slurm's
    # signal, which comes at its next check of the limits, up to about a minute later.
    job, _ = slurm.submit("preempted", run_dir, minutes=1, STEP_SECONDS="1.5")
    wait_for(lambda: slurm.job(job)["Restarts"] == "1", timeout=120, what="the first requeue")  # pending for 5 s
    slurm.run("scontrol", "update", f"JobId={job}", "TimeLimit=10")
    first = _saved_steps(run_dir) or 0
    # 2: in the middle of training (10 more steps saved), a limit that ends within two minutes.
    wait_for(lambda: (_saved_steps(run_dir) or 0) >= first + 10, timeout=180, what="the requeued job's checkpoint")
    slurm.limit_from_now(job)
    wait_for(lambda: slurm.job(job)["Restarts"] == "2", timeout=120, what="the second requeue")
    slurm.run("scontrol", "update", f"JobId={job}", "TimeLimit=10")
    info = slurm.wait_state(job, "COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", timeout=300)
    raw = slurm.log("preempted").read_text()
    log = "\n".join(line for line in raw.splitlines() if "RESULT" in line
                    or line.startswith(("srun", "slurmstepd", "tfdist", "WARNING:tfdist")))  # not TensorFlow's
    assert info["JobState"] == "COMPLETED", log
    assert _tasks_that_exited_75(log) == 4, log  # two tasks, twice
    assert "User defined signal" not in log and "exit code 138" not in log
    if first == 0:  # signalled before training began: nothing to save, exit 75 at once
        assert re.search(r"SIGUSR1 received (before training began|while tfdist was not training): exiting with code "
                         "75", log), log
    # The third run starts where the second saved. Its tasks say so; the second run's own line is
    # searched in the whole log, since srun may put another task's output on the same line.
    final = [r for r in _results(raw) if r["global_step"] == STEPS]
    assert sorted(r["rank"] for r in final) == [0, 1] and len({r["start_step"] for r in final}) == 1, final
    saved = final[0]["start_step"]
    assert first + 10 <= saved < STEPS, (first, saved, log)
    assert re.search(rf"preempted by (SIGUSR1|another worker's signal): saved at step {saved}\b", raw), log
    assert_bit_identical(checkpoint_tensors(str(reference)), checkpoint_tensors(str(run_dir)))


@pytest.mark.timeout(600)
def test_scancel_leaves_a_checkpoint_of_the_step_the_tasks_stopped_at(slurm):
    # scancel sends SIGTERM to every task (SIGKILL after KillWait): each saves at the end of its step.
    # srun is cancelled too, so what the tasks print after the signal may never reach the job's log:
    # the line that says the signal arrived is read from the tasks' own log files.
    run_dir = slurm.directory / "cancelled"
    task_log = slurm.directory / "cancelled-task-{rank}.log"
    job, _ = slurm.submit("cancelled", run_dir, STEP_SECONDS="0.3", TASK_LOG=str(task_log))
    before = wait_for(lambda: _saved_steps(run_dir) if (_saved_steps(run_dir) or 0) >= 10 else None, timeout=180,
                      what="the job's first checkpoint")
    slurm.run("scancel", job)
    slurm.wait_state(job, "CANCELLED", timeout=120)
    logs = [pathlib.Path(str(task_log).format(rank=rank)).read_text() for rank in (0, 1)]
    said = sum(text.count("SIGTERM received: saving at the end of the current step, then exiting") for text in logs)
    assert said in (1, 2), (logs, slurm.log("cancelled").read_text()[-4000:])
    saved = _saved_steps(run_dir)
    assert before < saved < before + 10, (before, saved)  # saved on SIGTERM, not by --save-every-steps 10
    for text in logs:  # both tasks saved that step together
        assert re.search(rf"preempted by (SIGTERM|another worker's signal): saved at step {saved};", text), logs


@pytest.mark.timeout(600)
def test_tfdist_slurm_jobs_roles_train_under_parameter_server(slurm):
    run_dir = slurm.directory / "ps"
    job, code = slurm.submit("ps", run_dir, tasks=4, wait=True, **{env.TFDIST_SLURM_JOBS: "chief:1,worker:2,ps:1"})
    log = slurm.log("ps").read_text()
    assert code == 0, log[-4000:]
    # Ranks fill the roles in alphabetical order: rank 0 is the chief, the only task that trains.
    assert [(r["rank"], r["strategy"], r["global_step"]) for r in _results(log)] == [(0, "parameter_server", STEPS)]
