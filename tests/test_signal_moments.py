"""A preemption signal or Ctrl-C at the moments of a run between its start-up and its exit:
restoring a checkpoint, tracing the first step, writing the last save.

Each moment is reached by an event, not a sleep: ``TFDIST_TEST_HOLD`` holds ``tfdist train``
there and prints the process's pid (``tfdist._signals.hold``); the test then sends the signal.
A chain of three runs: the first is held at its first trace, its restart at the restore, the
next restart at the final save. The last checkpoint is then compared with an uninterrupted
run's. Start-up (importing TensorFlow) is in tests/test_signals.py.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading

import pytest

from conftest import Processes, assert_bit_identical, base_env, checkpoint_tensors, wait_for

from tfdist import env
from tfdist.checkpoint import layout

TRAIN = ["-m", "tfdist", "train", "--model", "linear", "--epochs", "1", "--steps-per-epoch", "4", "--batch-size", "16",
         "--seed", "1", "--save-every-steps", "2", "--no-save-model"]
STEPS = 4

# The documented exit codes of `tfdist train` (docs/preemption.md). Before training and while it
# runs, SIGTERM and SIGUSR1 exit with 75 and Ctrl-C with 130. After the last step the run is
# complete and saved: `tfdist train` ends as it would have (0), and Ctrl-C still says it stopped it.
PREEMPTED, INTERRUPTED = env.EXIT_PREEMPTED, 130
EXPECTED = {
    "first_trace": {signal.SIGTERM: PREEMPTED, signal.SIGUSR1: PREEMPTED, signal.SIGINT: INTERRUPTED},
    "restore": {signal.SIGTERM: PREEMPTED, signal.SIGUSR1: PREEMPTED, signal.SIGINT: INTERRUPTED},
    "final_save": {signal.SIGTERM: env.EXIT_OK, signal.SIGUSR1: env.EXIT_OK, signal.SIGINT: INTERRUPTED},
}
HELD = re.compile(r"TFDIST_TEST_HOLD: held at (\w+) \(pid (\d+)\)")


def held_pids(proc, moment: str, count: int = 1) -> tuple[list[int], list[str]]:
    """Reads the output of a process (or of a launch) up to ``count`` ``held at MOMENT`` lines:
    (the held pids, the lines read)."""
    seen, pids = [], []
    for line in proc.stdout:
        seen.append(line)
        match = HELD.search(line)
        if match and match.group(1) == moment:
            pids.append(int(match.group(2)))
            if len(pids) == count:
                return pids, seen
    pytest.fail(f"the process ended before {count} task(s) were held at {moment}:\n" + "".join(seen[-40:]))


def signal_at(procs, moment: str, signum: int, out_dir) -> tuple[int, str]:
    """Runs ``tfdist train`` into ``out_dir`` held at ``moment``, sends ``signum`` to the held
    process; returns its exit code and output."""
    proc = procs.start([sys.executable, *TRAIN, "--output-dir", str(out_dir)], env=base_env(TFDIST_TEST_HOLD=moment))
    (pid,), seen = held_pids(proc, moment)
    os.kill(pid, signum)
    out = proc.communicate(timeout=300)[0]
    return proc.returncode, "".join(seen) + out


def latest(out_dir) -> tuple[int, dict]:
    """The step and the tensors of the latest checkpoint of a run's output directory."""
    import tensorflow as tf

    directory = os.path.join(str(out_dir), "checkpoints")
    path = tf.train.latest_checkpoint(directory)
    assert path, f"no checkpoint in {directory}: {os.listdir(directory)}"
    return layout.step_of(path), checkpoint_tensors(directory)


def uninterrupted_run(reference_runs):
    """The output directory of the run of ``TRAIN`` never interrupted, made once for every test
    that uses it (tests/test_checkpoint.py starts another model's run on a copy of it)."""
    def make(directory):
        with Processes() as processes:
            code, out = processes.run([sys.executable, *TRAIN, "--output-dir", str(directory)], timeout=300)
        assert code == 0, out[-3000:]

    return reference_runs(["test_signal_moments", *TRAIN], make)


@pytest.fixture(scope="module")
def uninterrupted(reference_runs):
    """The last checkpoint of the same run, never interrupted."""
    step, tensors = latest(uninterrupted_run(reference_runs))
    assert step == STEPS
    return tensors


# Two chains: the preemption signals (SIGTERM and SIGUSR1 share one handler) and Ctrl-C.
CHAINS = {
    "preemption": {"first_trace": signal.SIGTERM, "restore": signal.SIGUSR1, "final_save": signal.SIGTERM},
    "ctrl_c": {"first_trace": signal.SIGINT, "restore": signal.SIGINT, "final_save": signal.SIGINT},
}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_a_signal_at_the_first_trace_the_restore_and_the_final_save_loses_nothing(procs, tmp_path, chain,
                                                                                 uninterrupted, ctrl_c):
    out_dir = tmp_path / "run"
    signals = CHAINS[chain]

    # 1. Held while the first step is traced: the step finishes and is saved, then the run stops.
    code, out = signal_at(procs, "first_trace", signals["first_trace"], out_dir)
    assert code == EXPECTED["first_trace"][signals["first_trace"]], out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    step, saved = latest(out_dir)
    assert step == 1, out[-3000:]

    # 2. Its restart, held while it restores that checkpoint: it stops at once; the checkpoint is left as it was.
    code, out = signal_at(procs, "restore", signals["restore"], out_dir)
    assert code == EXPECTED["restore"][signals["restore"]], out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    step, tensors = latest(out_dir)
    assert step == 1
    assert_bit_identical(tensors, saved)

    # 3. The next restart resumes at step 1, trains to the end and is held while its last save is written.
    code, out = signal_at(procs, "final_save", signals["final_save"], out_dir)
    assert code == EXPECTED["final_save"][signals["final_save"]], out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert "global step 1 (epoch 0, step 1 of 4)" in out, out[-3000:]
    step, tensors = latest(out_dir)
    assert step == STEPS, out[-3000:]  # the last save was written before the process ended
    assert_bit_identical(tensors, uninterrupted)
    assert layout.read_metadata(layout.prefix_for(os.path.join(str(out_dir), "checkpoints"), STEPS)).complete


def launch(*flags: str, out_dir) -> list[str]:
    return [sys.executable, "-m", "tfdist", "launch", "--workers", "2", *flags, "--", sys.executable, *TRAIN,
            "--output-dir", str(out_dir)]


@pytest.mark.timeout(600)
def test_launched_workers_signalled_at_their_first_trace_and_one_at_its_restore_lose_nothing(procs, tmp_path,
                                                                                            reference_runs):
    from test_signals import launched_job_preempted_while_importing

    out_dir = tmp_path / "run"
    # The same job, its training never interrupted: its first run stopped while a worker imported TensorFlow.
    reference, code, out = launched_job_preempted_while_importing(reference_runs)
    assert code == 0, out[-4000:]
    step, uninterrupted = latest(reference / "run")
    assert step == STEPS and "1 cluster restart(s)" in out

    # SIGUSR1 to both workers while they trace their first step, as Slurm's --signal sends it:
    # they agree, save step 1 and exit 75; with no restart left, so does the launcher.
    proc = procs.start(launch("--max-restarts", "0", out_dir=out_dir), env=base_env(TFDIST_TEST_HOLD="first_trace"))
    pids, seen = held_pids(proc, "first_trace", count=2)
    for pid in pids:
        os.kill(pid, signal.SIGUSR1)
    out = "".join(seen) + proc.communicate(timeout=300)[0]
    assert proc.returncode == PREEMPTED, out[-4000:]
    assert "saved at step 1" in out and "Traceback" not in out, out[-4000:]
    assert latest(out_dir)[0] == 1

    # Started again, worker 1 gets SIGTERM while it restores: it exits 75, the launcher restarts
    # the cluster, which resumes at step 1 and ends bit-identical to the uninterrupted job.
    proc = procs.start(launch("--max-restarts", "1", out_dir=out_dir), env=base_env(TFDIST_TEST_HOLD="worker:1/restore"))
    (pid,), seen = held_pids(proc, "restore")
    os.kill(pid, signal.SIGTERM)
    out = "".join(seen) + proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, out[-4000:]
    assert "[worker:1] tfdist: SIGTERM received before training began: exiting with code 75" in out, out[-4000:]
    assert "1 cluster restart(s)" in out and "global step 1 (epoch 0, step 1 of 4)" in out, out[-4000:]
    step, tensors = latest(out_dir)
    assert step == STEPS
    assert_bit_identical(tensors, uninterrupted)


@pytest.mark.timeout(30)
def test_the_hold_waits_for_a_signal_which_the_handler_in_place_answers(monkeypatch, capsys):
    from tfdist import _signals

    received = []

    def handler(signum, frame):
        received.append(signum)

    def send_when_held():
        wait_for(lambda: "restore" in _signals._held, timeout=20, interval=0.01, what="the hold")
        os.kill(os.getpid(), signal.SIGUSR1)

    monkeypatch.setenv(env.TFDIST_TEST_HOLD, "restore")
    monkeypatch.setattr(_signals, "_held", set())
    previous = signal.signal(signal.SIGUSR1, handler)
    try:
        sender = threading.Thread(target=send_when_held)
        sender.start()
        _signals.hold("restore")  # returns once the signal came
        sender.join()
        assert received == [signal.SIGUSR1]
        assert signal.getsignal(signal.SIGUSR1) is handler  # the handlers in place are put back
        _signals.hold("restore")  # once a process: no second hold
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert f"TFDIST_TEST_HOLD: held at restore (pid {os.getpid()})" in capsys.readouterr().err


@pytest.mark.timeout(30)
def test_the_hold_waits_for_the_named_task_and_moment_only(monkeypatch):
    """Another moment, another task, or a restarted cluster: no hold (the call returns at once)."""
    from tfdist import _signals

    monkeypatch.setattr(_signals, "_held", set())
    monkeypatch.setenv(env.TF_CONFIG, '{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 0}}')
    for wanted, restart in (("restore", "0"), ("worker:1/first_trace", "0"), ("worker:0/first_trace", "1")):
        monkeypatch.setenv(env.TFDIST_TEST_HOLD, wanted)
        monkeypatch.setenv(env.TFDIST_RESTART, restart)
        _signals.hold("first_trace")
    assert "first_trace" not in _signals._held
