"""Shared fixtures: environment-leak guard, subprocess helpers, checkpoint and weight comparison,
a callback that crashes a run."""

from __future__ import annotations

import fcntl
import gc
import hashlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

_CONTRACT_PREFIXES = ("TF_CONFIG", "SLURM_", "TFDIST_")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The suite starts about 300 Python processes that import the same modules of the repository: they
# cache the compiled bytecode (__pycache__, which git ignores) even where PYTHONDONTWRITEBYTECODE is set.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


# matplotlib is the plot extra, not a dependency: the README's command runs without it, and
# .ci/run installs it for a pass of the tests marked ``plot`` (tests/README.md).
_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def pytest_runtest_setup(item):
    if not _MATPLOTLIB and item.get_closest_marker("plot"):
        pytest.skip("needs matplotlib, which is not installed: pip install '.[plot]', then pytest -m plot")


def _contract_env() -> dict:
    return {k: v for k, v in os.environ.items() if k.startswith(_CONTRACT_PREFIXES)}


@pytest.fixture(autouse=True)
def _no_environment_leaks():
    """Fails a test that leaves TF_CONFIG, SLURM_* or TFDIST_* changed (use monkeypatch)."""
    before = _contract_env()
    yield
    after = _contract_env()
    assert after == before, f"test leaked environment variables: {sorted(set(after.items()) ^ set(before.items()))}"


@pytest.fixture(scope="session", autouse=True)
def _no_automatic_garbage_collection():
    """Turns Python's automatic garbage collection off in the test processes; the fixture below
    collects between tests instead."""
    gc.disable()
    yield
    gc.enable()


_collector: threading.Thread | None = None
_tests_since_full_collection = 0
_FULL_COLLECTION_EVERY = 50  # tests; the young generations are collected after each


@pytest.fixture(autouse=True)
def _garbage_collected_between_tests():
    """Collects each test's garbage after it, on a thread of its own.

    Freeing a ``tf.data`` iterator waits for its autotuning thread, and on a busy machine that
    thread can sleep for up to a minute before it sees the cancellation. The wait releases the
    GIL, so on its own thread it holds up nothing else. The next test starts when the collection
    is done, or after 5 s while it waits; while a collection still waits, the tests after it
    start at once and the next collection starts after it. A full collection walks every object
    the process holds, so it runs every 50 tests; the others collect the young generations.
    """
    yield
    global _collector, _tests_since_full_collection
    _tests_since_full_collection += 1
    if _collector is not None and _collector.is_alive():
        return
    generation = 1
    if _tests_since_full_collection >= _FULL_COLLECTION_EVERY:
        generation, _tests_since_full_collection = 2, 0
    _collector = threading.Thread(target=gc.collect, args=(generation,), name="collect-garbage", daemon=True)
    _collector.start()
    _collector.join(timeout=5)


def collect_garbage() -> None:
    """``gc.collect()`` once the collection of earlier tests' garbage has finished."""
    if _collector is not None:
        _collector.join()
    gc.collect()


def base_env(**extra: str) -> dict:
    """A subprocess environment without any cluster configuration, plus ``extra``."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(_CONTRACT_PREFIXES)}
    environ.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", PYTHONPATH=REPO + os.pathsep + environ.get("PYTHONPATH", ""))
    environ.update(extra)
    return environ


def _importing_the_tests() -> dict:
    """``base_env()`` for a script that imports the test modules."""
    return base_env(PYTHONPATH=os.path.dirname(os.path.abspath(__file__)) + os.pathsep + base_env()["PYTHONPATH"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Processes:
    """Starts subprocesses in their own process groups and kills what is left in teardown."""

    def __init__(self):
        self._procs: list[subprocess.Popen] = []

    def __enter__(self) -> "Processes":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self, args, *, env=None, cwd=None) -> subprocess.Popen:
        proc = subprocess.Popen(
            args, env=env or base_env(), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, start_new_session=True,
        )
        self._procs.append(proc)
        return proc

    def run(self, args, *, timeout: float, env=None, cwd=None) -> tuple[int, str]:
        proc = self.start(args, env=env, cwd=cwd)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._kill(proc)
            out, _ = proc.communicate()
            pytest.fail(f"{args[:6]} did not finish within {timeout} s; output:\n{out[-4000:]}")
        return proc.returncode, out

    def tfdist(self, *args, timeout: float = 240, env=None, cwd=None) -> tuple[int, str]:
        return self.run([sys.executable, "-m", "tfdist", *args], timeout=timeout, env=env, cwd=cwd)

    def launch_script(self, path, source: str, *script_args, cluster, timeout: float = 240, env=None) -> str:
        """Writes ``source`` to ``path`` and runs it on every task of a ``tfdist launch`` cluster
        (``cluster``: launch's flags); fails the test unless the launch exits 0; returns its output."""
        path.write_text(source)
        code, out = self.tfdist("launch", *cluster, "--", sys.executable, str(path), *map(str, script_args),
                                timeout=timeout, env=env)
        assert code == 0, out[-4000:]
        return out

    @staticmethod
    def _kill(proc):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def close(self):
        for proc in self._procs:
            if proc.poll() is None:
                self._kill(proc)
                proc.wait(timeout=30)
            if proc.stdout:
                proc.stdout.close()


@pytest.fixture
def ctrl_c():
    """SIGINT answered as at a terminal, in this process and the processes it starts, whatever
    this one inherited (a job started in the background, e.g. with nohup, ignores SIGINT)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.fixture
def procs():
    processes = Processes()
    yield processes
    processes.close()


@pytest.fixture(scope="session")
def reference_runs(tmp_path_factory):
    """``get(args, make)``: the directory of an uninterrupted run several tests compare against,
    made once per suite run by ``make(directory)``, shared by the xdist workers (a file lock).
    Tests read it and never write into it; a test that trains on from it copies it first."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the workers' temporary directories share this parent
    root = root / "reference-runs"
    root.mkdir(exist_ok=True)

    def get(args, make):
        key = hashlib.sha1(json.dumps([str(a) for a in args]).encode()).hexdigest()[:16]
        directory = root / key
        with open(root / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another worker making it: wait for it
            if not (directory / ".complete").exists():
                shutil.rmtree(directory, ignore_errors=True)
                directory.mkdir()
                make(directory)
                (directory / ".complete").write_text(" ".join(str(a) for a in args))
        return directory

    return get


# A SIGKILL drill of a synchronous cluster launches with this --grace. The survivor of a SIGKILLed
# peer waits in its all-reduce until TensorFlow's coordination service declares the peer lost (about
# 10 s), and it cannot save meanwhile: a longer grace only delays the cluster's restart.
SIGKILL_DRILL_GRACE = ("--grace", "3")


def launched_job(reference_runs, source: str, *, cluster, args=lambda job: ()) -> tuple:
    """(directory, output) of one ``tfdist launch`` of the script ``source`` on ``cluster`` (launch's
    flags), made once per suite through ``reference_runs``; several tests assert on its parts. The
    script's arguments: the job's directory, then ``args(directory)``; it can import the tests."""

    def make(job):
        environ = _importing_the_tests()
        with Processes() as procs:
            out = procs.launch_script(job / "job.py", source, job, *args(job), cluster=cluster, env=environ,
                                      timeout=540)
        (job / "out.txt").write_text(out)

    job = reference_runs(["launched job", source, *cluster], make)
    return job, (job / "out.txt").read_text()


def script_result(procs, script: str, *args: str, timeout: float = 280):
    """Runs Python source ``script`` with ``args`` in a fresh process that can import the tests
    (e.g. to configure logical devices before TensorFlow starts); returns the JSON it printed
    on a line starting with ``RESULT ``."""
    environ = _importing_the_tests()
    code, out = procs.run([sys.executable, "-c", script, *args], timeout=timeout, env=environ)
    assert code == 0, out[-3000:]
    return json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])


def checkpoint_tensors(directory: str, *, prefix: str | None = None) -> dict:
    """Every tensor of the latest checkpoint in ``directory`` (save counters left out)."""
    import tensorflow as tf

    path = prefix or tf.train.latest_checkpoint(directory)
    assert path, f"no checkpoint in {directory}"
    reader = tf.compat.v1.train.NewCheckpointReader(path)  # load_checkpoint fails on ram:// prefixes
    return {
        name: reader.get_tensor(name)
        for name in reader.get_variable_to_shape_map()
        if not name.startswith(("save_counter", "_CHECKPOINTABLE_OBJECT_GRAPH"))
    }


def assert_bit_identical(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b), set(a) ^ set(b)
    different = [name for name in a if not np.array_equal(a[name], b[name])]
    assert not different, f"{len(different)} of {len(a)} tensors differ, e.g. {different[:5]}"


def read_json(path) -> dict:
    with open(path) as f:
        return json.load(f)


def process_state(pid: int) -> str | None:
    """The state letter of process ``pid`` in /proc (R, S, T stopped, Z zombie...); None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def wait_for(predicate, *, timeout: float, interval: float = 0.1, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout} s waiting for {what}")


def same_weights(a, b) -> bool:
    """Whether two Keras models hold the same weights, bit for bit."""
    wa, wb = a.get_weights(), b.get_weights()
    return len(wa) == len(wb) > 0 and all(np.array_equal(p, q) for p, q in zip(wa, wb))


class Crash(Exception):
    """What ``crash_after``'s callback raises: a failure in the middle of a run."""


def crash_after(step: int, keras_name: str = "keras"):
    """A callback of ``keras_name`` that raises ``Crash`` at the end of this run's ``step``-th
    train batch, counted across epochs (before tfdist saves that step: its callback runs after
    the user's)."""
    keras = __import__(keras_name)

    class CrashAfter(keras.callbacks.Callback):
        seen = 0

        def on_train_batch_end(self, batch, logs=None):
            self.seen += 1
            if self.seen == step:
                raise Crash(f"crashed after step {step} of this run")

    return CrashAfter()


def crash_and_resume(fit, data, *, crash_at: int, save_every: int, **options) -> dict:
    """``fit(data(), **options)`` never interrupted; then crashed after step ``crash_at`` with saves
    every ``save_every`` steps, and run again. Returns what the tests compare: the resumed run's
    replicas and first step, whether its weights are the uninterrupted run's, both last val_losses."""
    import tempfile

    directory = tempfile.mkdtemp()
    reference = fit(data(), **options)
    try:
        fit(data(), checkpoint_dir=directory, save_every_steps=save_every, callbacks=[crash_after(crash_at)], **options)
    except Crash:
        pass
    resumed = fit(data(), checkpoint_dir=directory, save_every_steps=save_every, **options)
    return {"replicas": resumed.tfdist.num_replicas, "from": resumed.tfdist.start_step,
            "same": same_weights(resumed.model, reference.model),
            "val_loss": [resumed.history["val_loss"][-1], reference.history["val_loss"][-1]]}


# The scripts other modules run on two logical CPUs: one fresh process runs them all, one after
# another, so that TensorFlow starts once. Each test reads its own script's output.
_SCRIPTS = {"evaluation": ("test_evaluation", "_REPLICAS"), "images": ("test_data_images", "_MIRRORED"),
            "pydataset": ("test_data_pydataset", "_MIRRORED"), "structured": ("test_data_structured", "_MIRRORED"),
            "class_weights": ("test_data_class_weights", "_MIRRORED"), "keras3": ("test_fit_keras3", "_TWO_CPUS")}

_RUN_SCRIPTS = textwrap.dedent(
    """
    import contextlib, importlib, io, json, sys, traceback
    import tfdist
    tfdist.split_cpu(2)
    import keras, tf_keras
    from test_data_images import write_images
    write_images(sys.argv[2])
    for name, module, attribute, args, path in json.loads(sys.argv[1]):
        keras.backend.clear_session()
        tf_keras.backend.clear_session()
        sys.argv = ["-c", *args]
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed):
                exec(compile(getattr(importlib.import_module(module), attribute), name, "exec"), {"__name__": "__main__"})
        except BaseException:
            printed.write(traceback.format_exc())
        with open(path, "w") as f:
            f.write(printed.getvalue())
    """
)


def _two_cpu_directory(reference_runs, procs: Processes, environ: dict):
    """The directory of the outputs of every script of ``_SCRIPTS``, run once per suite by ``procs``
    in one process with two logical CPUs and the environment ``environ``. That process also writes
    the images the ``images`` script reads: nothing here imports TensorFlow or starts its runtime,
    so this can run on a thread beside the tests."""

    def make(directory):
        images = str(directory / "images")
        args = {"images": [images], "structured": [str(directory / "structured")]}
        plan = [[name, module, attribute, args.get(name, []), str(directory / f"{name}.out")]
                for name, (module, attribute) in _SCRIPTS.items()]
        code, out = procs.run([sys.executable, "-c", _RUN_SCRIPTS, json.dumps(plan), images], timeout=600,
                              env=environ)
        assert code == 0, out[-4000:]

    return reference_runs(["two logical CPUs", sorted(_SCRIPTS.items())], make)


@pytest.fixture(scope="session", autouse=True)
def _two_cpu_scripts_started_early(request, reference_runs):
    """Starts the process of ``two_cpu_scripts`` on a thread when the session begins, if a collected
    test needs it: the worker runs other tests meanwhile instead of waiting for it later. A failure
    here is left to ``two_cpu_scripts``, which runs the scripts again and fails its test."""
    if not any("two_cpu_scripts" in item.fixturenames for item in request.session.items):
        yield
        return
    procs, environ = Processes(), _importing_the_tests()  # read now: a test may patch the environment later

    def start():
        try:
            _two_cpu_directory(reference_runs, procs, environ)
        except BaseException:  # noqa: BLE001 -- reported by the test that needs it
            pass

    thread = threading.Thread(target=start, name="two-cpu-scripts", daemon=True)
    thread.start()
    yield
    procs.close()
    thread.join(timeout=60)


@pytest.fixture(scope="session")
def two_cpu_scripts(reference_runs):
    """``result(name)``: the JSON that the script ``name`` of ``_SCRIPTS`` printed on its
    ``RESULT`` line, all of them run once per suite in one process with two logical CPUs."""
    with Processes() as procs:
        directory = _two_cpu_directory(reference_runs, procs, _importing_the_tests())

    def result(name):
        printed = (directory / f"{name}.out").read_text()
        lines = [line for line in printed.splitlines() if line.startswith("RESULT ")]
        assert lines, printed[-4000:]
        return json.loads(lines[0][7:])

    return result
