"""Tests of ``tfdist launch``: options, TF_CONFIG of each task, output, restart policy, signals.

Tasks are tiny Python scripts (no TensorFlow). Each records its pid under ``tmp_path``; the
``task_script`` fixture kills any of them still alive after the test.
"""

from __future__ import annotations

import io
import json
import logging
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from conftest import process_state

from tfdist import env
from tfdist.cluster import parse_tf_config
from tfdist.errors import LaunchError
from tfdist.launch import Launcher, LaunchOptions, exit_code_of

REPO = pathlib.Path(__file__).resolve().parents[1]

# Every task script starts with this: who am I, which restart, and a pid record.
_PRELUDE = """\
import json, os, pathlib, signal, subprocess, sys, time
cfg = json.loads(os.environ["TF_CONFIG"])
role, index = cfg["task"]["type"], cfg["task"]["index"]
restart = int(os.environ["TFDIST_RESTART"])
tmp = pathlib.Path(sys.argv[1])

def record(kind, text=""):
    with open(tmp / f"{kind}-{role}-{index}.log", "a") as f:
        f.write(f"{text}\\n")

def lines(kind, task):
    path = tmp / f"{kind}-{task}.log"
    return path.read_text().splitlines() if path.exists() else []

def wait_for(predicate, timeout=20.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False

record("pid", os.getpid())
"""


@pytest.fixture
def task_script(tmp_path):
    """Returns make(body) -> the command running ``_PRELUDE + body``; kills leftovers after the test."""
    scripts = []

    def make(body: str) -> list[str]:
        path = tmp_path / f"task{len(scripts)}.py"
        path.write_text(_PRELUDE + body)
        scripts.append(str(path))
        return [sys.executable, str(path), str(tmp_path)]

    yield make
    for pid in _recorded_pids(tmp_path):
        try:
            cmdline = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if any(script in cmdline for script in scripts):
            os.kill(pid, signal.SIGKILL)


def _recorded_pids(tmp_path: pathlib.Path, pattern: str = "pid-*.log") -> list[int]:
    return [int(line) for path in tmp_path.glob(pattern) for line in path.read_text().split()]


def _alive(pid: int) -> bool:
    state = process_state(pid)
    return state is not None and state != "Z"


def _launch(command, **options):
    options.setdefault("grace", 2.0)
    out, err = io.StringIO(), io.StringIO()
    launcher = Launcher(options=LaunchOptions(command=command, **options), stdout=out, stderr=err)
    result = launcher.run()
    return result, out.getvalue(), err.getvalue()


def _configs(out: str) -> dict[tuple[int, str], dict]:
    """(restart, task name) -> TF_CONFIG, from lines printed as ``CONFIG <restart> <json>``."""
    configs = {}
    for match in re.finditer(r"^\[(\w+:\d+)\] CONFIG (\d+) (\{.*\})$", out, re.M):
        configs[int(match.group(2)), match.group(1)] = json.loads(match.group(3))
    return configs


def _ports(config: dict) -> list[int]:
    return [int(a.rsplit(":", 1)[1]) for addrs in config["cluster"].values() for a in addrs]


_PRINT_CONFIG = 'print("CONFIG", restart, os.environ["TF_CONFIG"])\n'


# --- options -------------------------------------------------------------------------
@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "kwargs, flag",
    [
        ({"workers": 0}, "--workers"),
        ({"workers": "2"}, "--workers"),
        ({"ps": -1}, "--ps"),
        ({"max_restarts": -1}, "--max-restarts"),
        ({"port_base": 0}, "--port-base"),
        ({"port_base": 65535, "workers": 2}, "--port-base"),
        ({"host": "bad host"}, "--host"),
        ({"grace": 0}, "--grace"),
        ({"finish_timeout": -1}, "--finish-timeout"),
        ({"evaluator_timeout": 0}, "--evaluator-timeout"),
        ({"startup_timeout": -5}, "--startup-timeout"),
        ({"command": []}, "COMMAND"),
        ({"command": "python train.py"}, "COMMAND"),
    ],
)
def test_invalid_options_name_the_flag_the_value_and_the_fix(kwargs, flag):
    kwargs = {"command": ["python"], **kwargs}
    with pytest.raises(LaunchError) as info:
        LaunchOptions(**kwargs)
    message = str(info.value)
    assert flag in message and "received" in message and "Fix:" in message
    assert "\n" not in message


@pytest.mark.timeout(10)
def test_ps_implies_a_chief_and_jobs_are_ordered():
    options = LaunchOptions(command=["x"], workers=2, ps=1, evaluator=True)
    assert options.has_chief and options.is_parameter_server
    assert options.job_sizes() == {"chief": 1, "worker": 2, "ps": 1, "evaluator": 1}
    assert options.num_tasks == 5
    assert LaunchOptions(command=["x"], workers=3).job_sizes() == {"worker": 3}
    assert LaunchOptions(command=("x", "y")).command == ("x", "y")


@pytest.mark.timeout(10)
def test_exit_code_of_a_killed_process_is_128_plus_the_signal():
    assert exit_code_of(0) == 0
    assert exit_code_of(75) == 75
    assert exit_code_of(-signal.SIGTERM) == 128 + signal.SIGTERM


# --- one clean run -----------------------------------------------------------------------
@pytest.mark.timeout(30)
def test_every_task_gets_its_own_valid_tf_config_on_free_ports(task_script):
    command = task_script(
        _PRINT_CONFIG
        + """
import socket
host, port = cfg["cluster"][role][index].rsplit(":", 1)
with socket.socket() as s:
    s.bind((host, int(port)))  # the port handed to this task is free
print("env", os.environ["PYTHONUNBUFFERED"], os.environ["TFDIST_STARTUP_TIMEOUT"], file=sys.stderr)
"""
    )
    result, out, err = _launch(command, workers=2, chief=True, evaluator=True, startup_timeout=7)
    assert result.exit_code == 0 and result.restarts == 0, err

    configs = _configs(out)
    names = {"chief:0", "worker:0", "worker:1", "evaluator:0"}
    assert {name for _, name in configs} == names
    clusters = {json.dumps(c["cluster"], sort_keys=True) for c in configs.values()}
    assert len(clusters) == 1, "every task must see the same cluster"
    for (_, name), config in configs.items():
        spec = parse_tf_config(config)
        assert spec.task_name == name
        assert all(a.startswith("127.0.0.1:") for addrs in spec.jobs.values() for a in addrs)
    ports = _ports(next(iter(configs.values())))
    assert len(ports) == len(set(ports)) == 4
    for name in names:
        assert f"[{name}] env 1 7" in err.splitlines()


@pytest.mark.timeout(30)
def test_output_lines_are_prefixed_with_role_and_index(task_script):
    command = task_script('print(f"out {role}"); print("err line", file=sys.stderr); print("no newline", end="")\n')
    result, out, err = _launch(command, workers=2)
    assert result.exit_code == 0
    out_lines, err_lines = out.splitlines(), err.splitlines()
    for index in (0, 1):
        assert f"[worker:{index}] out worker" in out_lines
        assert f"[worker:{index}] no newline" in out_lines
        assert f"[worker:{index}] err line" in err_lines
    assert all(line.startswith("[worker:") for line in out_lines + err_lines)


def test_evaluator_timeout_without_an_evaluator_is_named_in_a_warning(capsys):
    from tfdist.cli import main

    assert main(["launch", "--workers", "1", "--evaluator-timeout", "5", "--", sys.executable, "-c", "pass"]) == 0
    assert "warning: --evaluator-timeout changes nothing without --evaluator" in capsys.readouterr().err


# --- synchronous jobs -----------------------------------------------------------------------
@pytest.mark.timeout(30)
def test_a_task_that_fails_once_restarts_the_whole_cluster_on_fresh_ports(task_script, tmp_path):
    command = task_script(
        _PRINT_CONFIG
        + """
marker = tmp / "failed-once"
if role == "worker" and index == 1 and not marker.exists():
    marker.write_text("x")
    wait_for(lambda: lines("pid", "worker-0"))  # else worker:0 may be stopped before it records its start
    sys.exit(1)
"""
    )
    result, out, err = _launch(command, workers=2)
    assert (result.exit_code, result.restarts) == (0, 1), err
    configs = _configs(out)
    assert {c["task"]["type"] for c in configs.values()} == {"worker"}
    first = set(_ports(configs[0, "worker:1"]))
    second = set(_ports(configs[1, "worker:1"]))
    assert first.isdisjoint(second), "a restart must use fresh ports"
    assert len(_recorded_pids(tmp_path, "pid-worker-0.log")) == 2  # worker 0 restarted too


@pytest.mark.timeout(30)
def test_restarts_with_port_base_use_consecutive_fresh_ports(task_script):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        base = s.getsockname()[1]
    base = min(base, 65000)
    command = task_script(_PRINT_CONFIG + "sys.exit(1 if restart == 0 else 0)\n")
    result, out, _ = _launch(command, workers=2, port_base=base)
    assert (result.exit_code, result.restarts) == (0, 1)
    configs = _configs(out)
    # The first failure stops the other worker, perhaps before it printed: compare one that printed both times.
    name = next(task for attempt, task in configs if attempt == 0)
    first, second = _ports(configs[0, name]), _ports(configs[1, name])
    assert all(port >= base for port in first + second)
    assert set(first).isdisjoint(second)


@pytest.mark.timeout(30)
def test_a_task_that_always_fails_after_training_a_step_gives_up_after_max_restarts(task_script, tmp_path):
    # Only worker:0 fails, after recording its attempt and a trained step (a crash a restart may
    # survive); the others wait to be stopped (a task failing first could otherwise get worker:0
    # stopped before it recorded anything).
    command = task_script('record("attempt", restart)\nif (role, index) == ("worker", 0):\n'
                          '    from tfdist.progress import Progress\n    Progress().trained(10 + restart)\n'
                          '    sys.exit(3)\ntime.sleep(60)\n')
    result, _, _ = _launch(command, workers=2, max_restarts=2)
    assert (result.exit_code, result.restarts) == (3, 2)
    assert (tmp_path / "attempt-worker-0.log").read_text().split() == ["0", "1", "2"]
    assert "exit code 3, 2 cluster restart(s)" in result.summary()


_CRASH_IN_MODEL_CODE = """
record("attempt", restart)
if (role, index) == ("worker", 1):
    wait_for(lambda: lines("pid", "worker-0"))
    print("building the model")
    raise ValueError("Dense expects 3 units, received 4")  # the same traceback at every start
time.sleep(60)
"""


@pytest.mark.timeout(30)
@pytest.mark.parametrize("ps, restarts", [(0, (1, 0)), (1, (0, 1))])  # (cluster, lone): a ps job's worker restarts alone
def test_a_task_that_fails_the_same_way_twice_before_any_step_ends_the_launch_with_its_last_lines(
        task_script, tmp_path, ps, restarts):
    result, _, err = _launch(task_script(_CRASH_IN_MODEL_CODE), workers=2, ps=ps, max_restarts=3)
    assert (result.exit_code, result.restarts, result.worker_restarts) == (env.EXIT_FAILED, *restarts), err
    assert len((tmp_path / "attempt-worker-1.log").read_text().split()) == 2
    assert result.reason == ("worker:1 exited with code 1 twice in a row, before any task trained a step: a restart "
                             "would fail the same way")
    last = err[err.index("tfdist: the last "):]  # printed again after the other tasks' lines
    header, *lines = last.splitlines()
    assert header == "tfdist: the last 6 line(s) of worker:1:" and len(lines) >= 6, last
    # stdout's and stderr's lines, each in its order (two pipes: not in the order they were written)
    assert {"[worker:1] building the model", "[worker:1] ValueError: Dense expects 3 units, received 4",
            "[worker:1] Traceback (most recent call last):"} <= set(lines[:6]), last


@pytest.mark.timeout(30)
@pytest.mark.parametrize("codes, expected", [
    ("[1, 3, 1]", (1, 2)),  # another failure in between: restarted
    ("[75, 75, 75]", (env.EXIT_PREEMPTED, 2)),  # a preemption asks for the restart, whenever it comes
])
def test_only_the_same_failure_twice_before_any_step_ends_the_launch(task_script, codes, expected):
    command = task_script(f"if (role, index) == ('worker', 0):\n    sys.exit({codes}[restart])\ntime.sleep(60)\n")
    result, _, err = _launch(command, workers=2, max_restarts=2)
    assert (result.exit_code, result.restarts) == expected, err
    assert "twice in a row" not in result.reason


@pytest.mark.timeout(30)
def test_a_training_task_still_running_after_the_finish_timeout_that_follows_worker_0s_exit_is_a_failure(
        task_script, tmp_path):
    # worker:0 exits 0 at once (a script that returns early on one rank); worker:1 never finishes.
    command = task_script('record("attempt", restart)\nif index == 0:\n    sys.exit(0)\ntime.sleep(60)\n')
    result, _, _ = _launch(command, workers=2, max_restarts=1, grace=0.5, finish_timeout=1.5)
    assert (result.exit_code, result.restarts) == (env.EXIT_FAILED, 1)
    assert result.reason == ("worker:1 still running 1.5 s after worker:0 exited with code 0, stopped: not every "
                             "training task finished")
    assert (tmp_path / "attempt-worker-1.log").read_text().split() == ["0", "1"]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("max_restarts, expected", [(1, (0, 1)), (0, (env.EXIT_PREEMPTED, 0))])
def test_exit_code_75_counts_as_a_restart(task_script, max_restarts, expected):
    command = task_script("sys.exit(75 if restart == 0 and role == 'worker' and index == 0 else 0)\n")
    result, _, _ = _launch(command, workers=1, chief=True, max_restarts=max_restarts)
    assert (result.exit_code, result.restarts) == expected


@pytest.mark.timeout(30)
def test_a_failure_stops_the_others_and_sigkills_after_the_grace_period(task_script, tmp_path, caplog):
    command = task_script(
        """
if index == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    record("ready")
    time.sleep(60)
else:
    wait_for(lambda: lines("ready", "worker-0"))
    sys.exit(4)
"""
    )
    start = time.monotonic()
    with caplog.at_level(logging.INFO, logger="tfdist.launch"):
        result, _, _ = _launch(command, workers=2, max_restarts=0, grace=0.5)
    assert (result.exit_code, result.restarts) == (4, 0)
    assert time.monotonic() - start < 15
    assert "SIGKILL" in caplog.text and "worker:1 exited with code 4" in caplog.text
    assert not any(_alive(pid) for pid in _recorded_pids(tmp_path))


@pytest.mark.timeout(30)
def test_what_a_task_leaves_behind_is_killed_with_its_process_group(task_script, tmp_path):
    command = task_script(
        """
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
(tmp / "grandchild").write_text(str(child.pid))
"""
    )
    result, _, _ = _launch(command, workers=1)
    assert result.exit_code == 0
    grandchild = int((tmp_path / "grandchild").read_text())
    assert wait_until(lambda: not _alive(grandchild))


@pytest.mark.timeout(30)
def test_an_evaluator_crash_does_not_restart_the_cluster(task_script):
    command = task_script(
        """
if role == "evaluator":
    sys.exit(1)
wait_for(lambda: lines("pid", "evaluator-0"))
time.sleep(0.3)
"""
    )
    result, _, _ = _launch(command, workers=1, evaluator=True)
    assert (result.exit_code, result.restarts) == (0, 0)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("evaluator_timeout, evaluated", [(30.0, True), (1.0, False)])
def test_the_evaluator_has_the_evaluator_timeout_not_the_grace_period_to_evaluate_the_last_checkpoint(
        task_script, tmp_path, caplog, evaluator_timeout, evaluated):
    # The final evaluation (here 3 s) outlasts --grace (1 s): it is kept within --evaluator-timeout.
    command = task_script(
        """
if role == "evaluator":
    wait_for(lambda: lines("done", "worker-0"))
    time.sleep(3)
    record("evaluated")
    sys.exit(0)
record("done")
"""
    )
    result, _, _ = _launch(command, workers=1, evaluator=True, grace=1.0, evaluator_timeout=evaluator_timeout)
    assert (result.exit_code, result.restarts) == (0, 0)
    assert (tmp_path / "evaluated-evaluator-0.log").exists() == evaluated
    assert ("did not finish within 1 s of the end of training" in caplog.text) == (not evaluated), caplog.text


# --- parameter-server jobs --------------------------------------------------------------------
@pytest.mark.timeout(30)
def test_ps_job_ends_when_the_chief_exits_0_and_stops_the_servers(task_script, tmp_path):
    command = task_script(
        _PRINT_CONFIG
        + """
if role == "chief":
    wait_for(lambda: len(list(tmp.glob("pid-*.log"))) == 5)
    sys.exit(0)
time.sleep(60)  # ps, workers and the evaluator serve forever
"""
    )
    start = time.monotonic()
    # An evaluator that never exits by itself is stopped after --evaluator-timeout.
    result, out, _ = _launch(command, workers=2, ps=1, evaluator=True, evaluator_timeout=1.0)
    assert (result.exit_code, result.restarts, result.worker_restarts) == (0, 0, 0)
    assert time.monotonic() - start < 15
    config = _configs(out)[0, "chief:0"]
    assert sorted(config["cluster"]) == ["chief", "evaluator", "ps", "worker"]
    assert parse_tf_config(config).num_ps == 1
    assert not any(_alive(pid) for pid in _recorded_pids(tmp_path))


@pytest.mark.timeout(30)
def test_ps_job_restarts_a_dead_worker_alone_while_the_chief_goes_on(task_script, tmp_path):
    command = task_script(
        """
if role == "worker" and index == 1:
    record("start", os.environ["TF_CONFIG"])
    marker = tmp / "worker-1-died"
    if not marker.exists():
        marker.write_text("x")
        sys.exit(1)
elif role == "chief":
    sys.exit(0 if wait_for(lambda: len(lines("start", "worker-1")) == 2) else 9)
time.sleep(60)
"""
    )
    result, _, _ = _launch(command, workers=2, ps=1)
    assert (result.exit_code, result.restarts, result.worker_restarts) == (0, 0, 1)
    assert len(_recorded_pids(tmp_path, "pid-chief-0.log")) == 1, "the chief must not restart"
    assert len(_recorded_pids(tmp_path, "pid-ps-0.log")) == 1
    assert len(_recorded_pids(tmp_path, "pid-worker-0.log")) == 1
    first, second = (tmp_path / "start-worker-1.log").read_text().splitlines()
    assert first == second, "a lone restart keeps the worker's TF_CONFIG and port"


@pytest.mark.timeout(30)
def test_ps_job_restarts_the_whole_cluster_when_a_ps_dies(task_script):
    command = task_script(
        """
if role == "ps" and restart == 0:
    sys.exit(1)
if role == "chief" and restart == 1:
    sys.exit(0)
time.sleep(60)
"""
    )
    result, _, _ = _launch(command, workers=1, ps=1)
    assert (result.exit_code, result.restarts, result.worker_restarts) == (0, 1, 0)


@pytest.mark.timeout(30)
def test_ps_job_worker_out_of_lone_restarts_restarts_the_cluster_then_gives_up(task_script):
    command = task_script("sys.exit(5 if role == 'worker' else time.sleep(60))\n")
    result, _, _ = _launch(command, workers=1, ps=1, max_restarts=1)
    assert (result.exit_code, result.restarts, result.worker_restarts) == (5, 1, 2)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ps", [0, 1])
def test_a_bad_input_exit_ends_the_launch_at_once_without_restarts(task_script, tmp_path, ps):
    # Exit code 2 is tfdist's bad input: the same command would fail again after a restart.
    command = task_script('record("attempt", restart)\nsys.exit(2 if role == "worker" else time.sleep(60))\n')
    result, _, _ = _launch(command, workers=2, ps=ps, max_restarts=3)
    assert (result.exit_code, result.restarts, result.worker_restarts) == (2, 0, 0)
    # The first worker to exit 2 ends the launch; the other may be stopped before it records.
    attempts = [path.read_text().split() for path in tmp_path.glob("attempt-worker-*.log")]
    assert attempts and all(a == ["0"] for a in attempts), attempts  # every worker started once, none again
    assert "bad input" in result.reason


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ps", [0, 1])
@pytest.mark.parametrize("how", ["sigint", "130"])
def test_a_task_stopped_by_ctrl_c_ends_the_launch_without_restarts(task_script, tmp_path, ps, how, caplog, ctrl_c):
    # Ctrl-C to one task (kill -INT): fit saves the step and re-raises; a script dies of SIGINT,
    # tfdist train exits 130. The user asked the run to stop: no restart, whole or lone.
    die = "os.kill(os.getpid(), signal.SIGINT)" if how == "sigint" else "sys.exit(130)"
    command = task_script('record("attempt", restart)\n'
                          f'if role == "worker" and index == 1:\n    {die}\ntime.sleep(60)\n')
    result, _, _ = _launch(command, workers=2, ps=ps, max_restarts=3)
    assert (result.exit_code, result.restarts, result.worker_restarts) == (130, 0, 0), caplog.text
    assert (tmp_path / "attempt-worker-1.log").read_text().split() == ["0"]  # started once, never again
    assert "worker:1" in result.reason and "interrupted (Ctrl-C)" in result.reason, result.reason
    assert "not restarting" in caplog.text


def test_bad_input_decides_over_the_peer_that_lost_it_when_both_exit_in_one_poll():
    from tfdist.launch import _deciding, _Task

    def task(index, returncode):
        t = _Task(role="worker", index=index, address="127.0.0.1:1", environ={})
        t.returncode = returncode
        return t

    chief, reader = task(0, env.EXIT_PEER_LOST), task(1, env.EXIT_USAGE)  # worker 1 read a damaged file
    assert _deciding([chief, reader], chief) is reader
    assert _deciding([chief, task(1, 1)], chief) is chief  # else the result task's exit
    other = task(1, 1)
    assert _deciding([other], chief) is other
    interrupted = task(1, -signal.SIGINT)  # Ctrl-C to worker 1; the chief lost it
    assert _deciding([chief, interrupted], chief) is interrupted
    assert _deciding([interrupted, reader], chief) is reader  # bad input first


@pytest.mark.timeout(120)
def test_a_launched_script_whose_model_tfdist_refuses_exits_2_and_is_not_restarted(tmp_path, capfd):
    script = tmp_path / "train.py"
    script.write_text("import tfdist\ntfdist.fit('not a model', 'digits')\n")
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("TF_CONFIG", "TFDIST_"))}
    environ["PYTHONPATH"] = str(REPO)
    result = Launcher(options=LaunchOptions(command=[sys.executable, str(script)], workers=2, max_restarts=3),
                      environ=environ).run()
    assert (result.exit_code, result.restarts) == (2, 0)
    err = capfd.readouterr().err
    # The first worker to fail ends the launch; the other may be stopped before it prints.
    assert re.search(r"\[worker:\d\] tfdist: error: .*model", err), err[-3000:]
    assert "restart 1" not in err


# --- the command line -------------------------------------------------------------------------
def _cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tfdist", "launch", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_until(predicate, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.timeout(40)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_launcher_is_forwarded_and_it_exits(task_script, tmp_path, signum):
    command = task_script("time.sleep(60)\n")
    launcher = _cli("--workers", "2", "--grace", "5", "--", *command)
    try:
        assert wait_until(lambda: len(_recorded_pids(tmp_path)) == 2), "the tasks did not start"
        launcher.send_signal(signum)
        _, stderr = launcher.communicate(timeout=20)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate(timeout=5)
    assert launcher.returncode == 128 + signal.SIGTERM, stderr  # worker 0's exit after SIGTERM
    assert f"stopped by {signal.Signals(signum).name}" in stderr
    assert "Traceback" not in stderr
    assert not any(_alive(pid) for pid in _recorded_pids(tmp_path))



@pytest.mark.timeout(60)
def test_a_stopped_parameter_server_job_stops_its_chief_first_so_that_it_saves_with_its_peers_up(task_script, tmp_path,
                                                                                                   caplog):
    # The chief's last save needs the ps tasks (the variables) and the workers (the steps in flight).
    command = task_script(
        "if role == 'chief':\n"
        "    def on_term(signum, frame):\n"
        "        time.sleep(0.5)  # the save at the end of the step\n"
        "        peers = [int(pid) for task in ('worker-0', 'worker-1', 'ps-0') for pid in lines('pid', task)]\n"
        "        up = all(os.path.exists(f'/proc/{p}') and open(f'/proc/{p}/stat').read().split()[2] != 'Z' for p in peers)\n"
        "        record('saved', f'{len(peers)} peers up' if up else 'a peer was stopped')\n"
        "        sys.exit(75)\n"
        "    signal.signal(signal.SIGTERM, on_term)\n"
        "time.sleep(60)\n"
    )
    out, err = io.StringIO(), io.StringIO()
    launcher = Launcher(options=LaunchOptions(command=command, workers=2, ps=1, grace=20, max_restarts=0),
                        stdout=out, stderr=err)
    threading.Thread(target=lambda: wait_until(lambda: len(_recorded_pids(tmp_path)) == 4, 30)
                     and launcher.request_stop(signal.SIGTERM), daemon=True).start()
    with caplog.at_level(logging.INFO, logger="tfdist"):
        result = launcher.run()
    assert result.exit_code == 75, err.getvalue()[-3000:]  # the chief's: preempted, saved
    assert (tmp_path / "saved-chief-0.log").read_text().split("\n")[0] == "3 peers up"
    log = caplog.text
    assert log.index("stopping chief:0") < log.index("stopping worker:0, worker:1, ps:0"), log[-3000:]
    assert not any(_alive(pid) for pid in _recorded_pids(tmp_path))

@pytest.mark.timeout(40)
@pytest.mark.parametrize(
    "args, flag",
    [
        (["--workers", "0", "--", "python"], "--workers"),
        (["--workers", "two", "--", "python"], "--workers"),
        (["--workers", "1", "--max-restarts", "-1", "--", "python"], "--max-restarts"),
        (["--workers", "1", "--port-base", "70000", "--", "python"], "--port-base"),
        (["--workers", "1", "--"], "COMMAND"),
        (["--", "python"], "--workers"),
    ],
)
def test_invalid_flags_give_a_one_line_error_and_exit_code_2(args, flag):
    process = _cli(*args)
    stdout, stderr = process.communicate(timeout=30)
    assert process.returncode == env.EXIT_USAGE
    assert stdout == ""
    assert "Traceback" not in stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert stderr.startswith("tfdist: error: ") and flag in stderr


@pytest.mark.timeout(30)
def test_the_cli_runs_a_job_and_exits_with_its_code(task_script):
    command = task_script("sys.exit(3 if index == 0 else 0)\n")
    process = _cli("--workers", "2", "--max-restarts", "0", "--", *command)
    _, stderr = process.communicate(timeout=25)
    assert process.returncode == 3
    assert "launch finished: exit code 3, 0 cluster restart(s)" in stderr


@pytest.mark.timeout(30)
def test_a_launched_task_whose_peer_never_serves_is_told_to_look_at_that_peer_not_to_use_the_launcher(monkeypatch):
    import socket

    from tfdist.errors import PeerUnavailableError
    from tfdist.startup import wait_for_peers

    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    cluster = parse_tf_config({"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                               "task": {"type": "worker", "index": 0}})
    monkeypatch.setenv(env.TFDIST_RESTART, "0")
    with pytest.raises(PeerUnavailableError, match=r"missing: worker:1 \(127\.0\.0\.1:\d+\)\. Fix: look at the "
                                                   r"missing tasks' lines above: they exited or failed before serving"):
        wait_for_peers(cluster, timeout=0.5)



@pytest.mark.timeout(120)
def test_fit_writes_its_first_trained_step_to_the_progress_file_the_launcher_names(tmp_path, monkeypatch):
    import tfdist
    from tfdist import progress
    from tfdist.models import builder

    def fit(epochs):
        tfdist.fit(builder("linear", input_shape=(8, 8, 1), num_classes=10), "digits", epochs=epochs,
                   steps_per_epoch=3, batch_size=16, seed=1, strategy="one_device",
                   checkpoint_dir=str(tmp_path / "run"), verbose=0)

    path = tmp_path / "worker-0"
    monkeypatch.setenv(env.TFDIST_PROGRESS_FILE, str(path))
    fit(1)
    assert progress.read(str(path)) == 1  # the first step, written once
    path.unlink()
    fit(1)  # complete already: nothing trained, nothing written
    assert progress.read(str(path)) is None
    fit(2)  # resumed at step 3
    assert progress.read(str(path)) == 4
