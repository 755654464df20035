"""Preemption signals outside ``fit``: from ``import tfdist`` on, SIGTERM and SIGUSR1 exit with 75.

The moment is chosen by an event, not a sleep: a ``sitecustomize`` module on the task's path
holds ``import tensorflow`` (or another module) until the test has signalled the process.
"""

from __future__ import annotations

import os
import signal
import sys
import textwrap

import pytest

from conftest import base_env, wait_for

from tfdist import env

# Holds the import of HOLD_MODULE (on the first run of a cluster only, and in HOLD_TASK only when
# set): prints "HELD <pid> <module>" and sleeps, until a signal ends the process.
_SITECUSTOMIZE = textwrap.dedent("""
    import json, os, sys, time

    class _Hold:
        def find_spec(self, name, path=None, target=None):
            if name != os.environ["HOLD_MODULE"] or os.environ.get("TFDIST_RESTART", "0") != "0":
                return None
            task = json.loads(os.environ.get("TF_CONFIG") or "{}").get("task", {})
            if os.environ.get("HOLD_TASK") not in (None, f"{task.get('type')}:{task.get('index')}"):
                return None
            print(f"HELD {os.getpid()} {name}", flush=True)
            while True:
                time.sleep(0.05)

    sys.meta_path.insert(0, _Hold())
""")

PREEMPTION = [signal.SIGTERM, signal.SIGUSR1]


def _holding_env(tmp_path, module: str, **extra: str) -> dict:
    hook = tmp_path / "hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    environ = base_env(HOLD_MODULE=module, **extra)
    environ["PYTHONPATH"] = str(hook) + os.pathsep + environ["PYTHONPATH"]
    return environ


def _held_pid(proc) -> int:
    """Reads the process's output up to the HELD line; returns the held process's pid."""
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "HELD " in line:
            return int(line.split("HELD ", 1)[1].split()[0])
    pytest.fail("the process ended before the import it was to be held in:\n" + "".join(seen[-30:]))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("signum", PREEMPTION, ids=lambda s: signal.Signals(s).name)
def test_a_script_that_imported_tfdist_exits_75_on_a_preemption_signal(procs, tmp_path, signum):
    proc = procs.start([sys.executable, "-c", "import tfdist, tfdist_test_held"],
                       env=_holding_env(tmp_path, "tfdist_test_held"))
    os.kill(_held_pid(proc), signum)
    out = proc.communicate(timeout=30)[0]
    assert proc.returncode == env.EXIT_PREEMPTED, out
    assert (f"tfdist: {signal.Signals(signum).name} received while tfdist was not training: exiting with code 75 "
            "(no step in progress to save; a restart resumes from the last checkpoint)") in out


@pytest.mark.timeout(60)
def test_a_handler_the_program_set_before_importing_tfdist_stays(procs, tmp_path):
    script = textwrap.dedent("""
        import os, signal
        signal.signal(signal.SIGTERM, lambda *_: os._exit(9))
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        import tfdist
        assert signal.getsignal(signal.SIGUSR1) is signal.SIG_IGN
        import tfdist_test_held
    """)
    proc = procs.start([sys.executable, "-c", script], env=_holding_env(tmp_path, "tfdist_test_held"))
    pid = _held_pid(proc)
    os.kill(pid, signal.SIGUSR1)  # ignored, as the program asked
    os.kill(pid, signal.SIGTERM)
    out = proc.communicate(timeout=30)[0]
    assert proc.returncode == 9, out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, env.EXIT_PREEMPTED), (signal.SIGUSR1, env.EXIT_PREEMPTED),
                                          (signal.SIGINT, 130)], ids=["SIGTERM", "SIGUSR1", "SIGINT"])
def test_tfdist_train_signalled_while_it_imports_tensorflow_exits_with_the_documented_code(procs, tmp_path, signum,
                                                                                            code, ctrl_c):
    proc = procs.start([sys.executable, "-m", "tfdist", "train", "--output-dir", str(tmp_path / "run")],
                       env=_holding_env(tmp_path, "tensorflow"))
    os.kill(_held_pid(proc), signum)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == code, out
    assert "Traceback" not in out, out
    assert not (tmp_path / "run" / "checkpoints").exists()


def launched_job_preempted_while_importing(reference_runs):
    """A ``tfdist launch`` job of 2 workers whose worker 1 gets SIGUSR1 while its first run imports
    TensorFlow, as Slurm's ``--signal=USR1`` reaches a task still starting; made once for every
    test that uses it. Returns (its directory, the launch's exit code, its output). Its training
    is never interrupted: tests/test_signal_moments.py compares its launched drill with its end."""
    from conftest import Processes
    from test_signal_moments import TRAIN

    def make(directory):
        out_dir = directory / "run"
        with Processes() as procs:
            proc = procs.start([sys.executable, "-m", "tfdist", "launch", "--workers", "2", "--max-restarts", "1", "--",
                                sys.executable, *TRAIN, "--output-dir", str(out_dir),
                                "--summary-json", str(out_dir / "summary.json")],
                               env=_holding_env(directory, "tensorflow", HOLD_TASK="worker:1"))
            os.kill(_held_pid(proc), signal.SIGUSR1)
            out = proc.communicate(timeout=360)[0]
        (directory / "launch.out").write_text(out)
        (directory / "launch.code").write_text(str(proc.returncode))

    directory = reference_runs(["test_signals", "preempted while importing", *TRAIN], make)
    return directory, int((directory / "launch.code").read_text()), (directory / "launch.out").read_text()


@pytest.mark.timeout(400)
def test_a_launched_task_preempted_while_it_imports_tensorflow_is_restarted_and_the_run_completes(reference_runs):
    directory, code, out = launched_job_preempted_while_importing(reference_runs)
    out_dir = directory / "run"
    assert code == 0, out[-4000:]
    assert "[worker:1] tfdist: SIGUSR1 received while tfdist was not training: exiting with code 75" in out
    assert "worker:1 exited with code 75 (preempted)" in out and "1 cluster restart(s)" in out
    wait_for(lambda: (out_dir / "summary.json").exists(), timeout=5, what="the summary of the restarted run")
