"""Several hosts on one machine: tasks in network namespaces joined by a bridge, and real network faults.

Each task runs in its own namespace with its own address (10.231.0.2, .3, ...), as on its own host.
A cut link (``ip link set DEV down``) drops packets without a reset, as a lost node or a partition
does; a ``tbf`` queue makes a link slow. Traffic goes only to these addresses. Skipped, with the
reason, where network namespaces cannot be made (not root, no ``ip``, a container without the
capability).
"""

from __future__ import annotations

import itertools
import json
import os
import pathlib
import signal
import shutil
import subprocess
import sys
import time

import pytest

from conftest import assert_bit_identical, base_env, checkpoint_tensors, wait_for

from tfdist import env

TRAIN = pathlib.Path(__file__).resolve().parent / "_train.py"
STEPS = 2 * 40  # epochs x steps_per_epoch of _train.py
SUBNET = "10.231.0"
PORT = 2222
DETECTION_BOUND = 60.0
"""Seconds from a cut link (or a frozen peer) to the exit of every task. TensorFlow's coordination
service marks a task unhealthy after 10 s without a heartbeat, and the collective in flight is then
aborted on every task, the cut one included: about 10 s measured (8 s for SIGSTOP). 60 s leaves room
for a loaded 2-core machine."""


class Namespaces:
    """``count`` network namespaces on one bridge; ``command(i, ...)`` runs a command in the i-th."""

    made = itertools.count()
    """Numbers each set of one process: the kernel frees a deleted namespace's links some time later."""

    def __init__(self, count: int):
        tag = f"tfd{os.getpid() % 100000}{next(self.made) % 10}"
        self.bridge = f"{tag}br"
        self.names = [f"{tag}n{i}" for i in range(count)]
        self.links = [f"{tag}v{i}" for i in range(count)]  # the host's end of each namespace's cable
        self.addresses = [f"{SUBNET}.{i + 2}" for i in range(count)]

    def create(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("link", "set", self.bridge, "up")
        for name, link, address in zip(self.names, self.links, self.addresses):
            _ip("netns", "add", name)
            _ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", name)
            _ip("link", "set", link, "master", self.bridge)
            _ip("link", "set", link, "up")
            for args in (["addr", "add", f"{address}/24", "dev", "eth0"], ["link", "set", "eth0", "up"],
                         ["link", "set", "lo", "up"]):
                _ip("-n", name, *args)

    def delete(self) -> None:
        for link in self.links:  # both ends of the cable at once, not when the namespace is freed
            subprocess.run(["ip", "link", "del", link], capture_output=True, timeout=30)
        for name in self.names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, timeout=30)

    def command(self, i: int, *args: str) -> list[str]:
        return ["ip", "netns", "exec", self.names[i], *args]

    def cut(self, i: int) -> None:
        """Unplugs namespace i: its packets are dropped, nobody is told (no reset)."""
        _ip("link", "set", self.links[i], "down")

    def plug(self, i: int) -> None:
        _ip("link", "set", self.links[i], "up")

    def slow(self, i: int, rate: str = "2mbit") -> None:
        """Limits namespace i's link to ``rate`` both ways (tbf; this kernel has no netem)."""
        tbf = ["root", "tbf", "rate", rate, "burst", "32kbit", "latency", "400ms"]
        for prefix, device in (([], self.links[i]), (["-n", self.names[i]], "eth0")):
            subprocess.run(["tc", *prefix, "qdisc", "add", "dev", device, *tbf], check=True, capture_output=True,
                           timeout=30)

    def tf_config(self, i: int) -> str:
        return json.dumps({"cluster": {"worker": [f"{a}:{PORT}" for a in self.addresses]},
                           "task": {"type": "worker", "index": i}})


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


@pytest.fixture
def hosts():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("no network namespaces: they need root and iproute2's `ip`")
    namespaces = Namespaces(2)
    try:
        namespaces.create()
    except RuntimeError as e:
        namespaces.delete()
        pytest.skip(f"no network namespaces on this machine: {e}")
    yield namespaces
    namespaces.delete()


def _start(procs, hosts: Namespaces, run_dir, **extra: str) -> list[subprocess.Popen]:
    return [procs.start(hosts.command(i, sys.executable, str(TRAIN), str(run_dir)),
                        env=base_env(TF_CONFIG=hosts.tf_config(i), **extra)) for i in range(2)]


def _finish(procs_list: list[subprocess.Popen], timeout: float) -> list[tuple[int, str]]:
    return [(p.wait(timeout=timeout), p.stdout.read()) for p in procs_list]


def _results(out: str) -> list[dict]:
    return [json.loads(line.split("RESULT ", 1)[1]) for line in out.splitlines() if "RESULT " in line]


def _saved_step(directory) -> int:
    from tfdist.checkpoint import layout

    metadata = layout.latest_metadata(str(directory))
    return 0 if metadata is None else metadata.global_step


@pytest.mark.timeout(600)
def test_a_cut_link_ends_every_task_with_76_and_a_restart_resumes_bit_identical(procs, hosts, tmp_path):
    # The same job on 127.0.0.1 (tfdist launch), at the same time: the result a cut run must match.
    reference = procs.start([sys.executable, "-m", "tfdist", "launch", "--workers", "2", "--max-restarts", "0", "--",
                             sys.executable, str(TRAIN), str(tmp_path / "loopback")])
    run_dir = tmp_path / "hosts"
    tasks = _start(procs, hosts, run_dir, STEP_SECONDS="0.3")
    wait_for(lambda: _saved_step(run_dir) >= 10, timeout=240, interval=0.2, what="the first checkpoint")
    hosts.cut(1)
    cut_at = time.monotonic()
    ended = _finish(tasks, timeout=DETECTION_BOUND + 60)
    took = time.monotonic() - cut_at
    for code, out in ended:
        assert code == env.EXIT_PEER_LOST, out[-3000:]
        errors = [line for line in out.splitlines() if line.startswith("tfdist: error: ")]
        assert len(errors) == 1 and "was lost" in errors[0], out[-3000:]
    assert took < DETECTION_BOUND, f"the tasks ended {took:.0f} s after the cut"
    saved = _saved_step(run_dir)
    hosts.plug(1)
    resumed = _finish(_start(procs, hosts, run_dir), timeout=300)
    assert all(code == 0 for code, _ in resumed), resumed[0][1][-3000:]
    assert {(r["start_step"], r["global_step"]) for _, out in resumed for r in _results(out)} == {(saved, STEPS)}
    out = reference.communicate(timeout=300)[0]
    assert reference.returncode == 0, out[-3000:]
    assert_bit_identical(checkpoint_tensors(str(tmp_path / "loopback")), checkpoint_tensors(str(run_dir)))
    print(f"cut link: every task ended {took:.1f} s after the cut")


@pytest.mark.timeout(600)
def test_a_slow_link_trains_to_the_same_result_and_a_frozen_worker_is_detected(procs, hosts, tmp_path):
    hosts.slow(1)
    run_dir = tmp_path / "slow"
    slow = _finish(_start(procs, hosts, run_dir), timeout=400)
    for code, out in slow:
        assert code == 0 and "was lost" not in out, out[-3000:]
    assert {(r["num_workers"], r["global_step"]) for _, out in slow for r in _results(out)} == {(2, STEPS)}
    # The same job again, frozen (SIGSTOP: alive, silent) in the middle of training.
    frozen_dir = tmp_path / "frozen"
    tasks = _start(procs, hosts, frozen_dir, STEP_SECONDS="0.3")
    wait_for(lambda: _saved_step(frozen_dir) >= 10, timeout=240, interval=0.2, what="the first checkpoint")
    tasks[1].send_signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    code = tasks[0].wait(timeout=DETECTION_BOUND + 60)
    took = time.monotonic() - stopped_at
    tasks[1].send_signal(signal.SIGKILL)
    out = tasks[0].stdout.read()
    assert code == env.EXIT_PEER_LOST and "was lost" in out, out[-3000:]
    assert took < DETECTION_BOUND, f"worker:0 ended {took:.0f} s after worker:1 froze"
    slow_final = checkpoint_tensors(str(run_dir))
    resumed = _finish(_start(procs, hosts, frozen_dir), timeout=300)
    assert all(c == 0 for c, _ in resumed), resumed[0][1][-3000:]
    assert_bit_identical(slow_final, checkpoint_tensors(str(frozen_dir)))
    print(f"frozen worker: worker:0 ended {took:.1f} s after SIGSTOP")
