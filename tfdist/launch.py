"""Local clusters: every task of a cluster as a process on this machine, with a restart policy.

``Launcher`` starts one process per task (chief, workers, ps, evaluator), each with its own
``TF_CONFIG`` on free ports, prefixes every output line with the task's name, forwards
SIGINT, SIGTERM and SIGUSR1 (as SIGTERM), and applies the failure policy:

* synchronous jobs (no ps): any training task that fails stops the cluster, and the WHOLE
  cluster restarts on fresh ports, at most ``max_restarts`` times;
* parameter-server jobs: the chief's exit ends the job; a dead worker restarts ALONE (same
  ``TF_CONFIG``, same port) at most ``max_restarts`` times; a dead ps or chief restarts the
  whole cluster;
* the evaluator is a sidecar: stopped when training ends, never a reason to restart.

Exit code ``EXIT_PREEMPTED`` (75) is a failure like any other: it restarts the cluster and
counts towards ``max_restarts``. Exit code ``EXIT_USAGE`` (2: bad input, e.g. a refused model
or an invalid option) ends the launch at once with that code: the same command would fail
the same way after a restart. A task that dies of SIGINT (Ctrl-C to it alone: ``fit`` saves the
step, tells the other workers and re-raises the ``KeyboardInterrupt``) ends the launch too, with
code 130: the user asked the run to stop.

A failure that repeats before any step is trained ends the launch after one restart: the same
task with the same exit code (other than 75) twice in a row, while no task of either attempt
trained a step (``tfdist.progress``). A crash in the model's code would repeat at every restart.
That task's last lines are printed again, then the reason. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO, Callable, Mapping, Sequence

from tfdist import _checks, env, progress
from tfdist.cluster import CHIEF, EVALUATOR, PS, WORKER, ClusterSpec
from tfdist.errors import ClusterConfigError, LaunchError
from tfdist.ports import DEFAULT_HOST, MAX_PORT, free_ports

log = logging.getLogger("tfdist.launch")

DEFAULT_MAX_RESTARTS = 3
DEFAULT_GRACE = 30.0
DEFAULT_FINISH_TIMEOUT = 60.0
DEFAULT_EVALUATOR_TIMEOUT = 600.0

_PYTHONUNBUFFERED = "PYTHONUNBUFFERED"
_HOST = re.compile(r"^[A-Za-z0-9_.\-]+$")  # a host name or IPv4 address, as cluster.py accepts
_POLL_S = 0.05
_KILL_WAIT_S = 5.0  # how long a SIGKILLed process may take to be reaped
_READER_JOIN_S = 2.0  # how long to wait for the last output lines of an exited task
LAST_LINES = 20
"""How many of its last output lines a task that ends the launch has printed again."""


def _fix_int(flag: str, value, *, minimum: int, fix: str) -> None:
    if not _checks.is_int(value) or value < minimum:
        raise LaunchError(f"{flag} must be an integer >= {minimum}; received {flag} {value!r}. Fix: {fix}")


def _fix_seconds(flag: str, value, *, fix: str) -> None:
    if not _checks.is_number(value) or not value > 0:
        raise LaunchError(f"{flag} must be a positive number of seconds; received {flag} {value!r}. Fix: {fix}")


@dataclasses.dataclass(frozen=True)
class LaunchOptions:
    """What to launch and how to treat failures; validated on construction.

    Attributes:
      command: the program and its arguments, run once per task.
      workers: worker tasks (at least 1).
      ps: parameter-server tasks; more than 0 makes a parameter-server job, which implies a chief.
      chief: add a chief task (always there when ``ps > 0``).
      evaluator: add an evaluator sidecar task.
      max_restarts: whole-cluster restarts allowed; in a ps job also lone restarts per worker.
      port_base: first port to try (consecutive free ports from there); None: any free port.
      host: the address every task binds and is reached at.
      startup_timeout: seconds each task waits for its peers (sets TFDIST_STARTUP_TIMEOUT);
        None keeps the inherited value or the default.
      grace: seconds between SIGTERM and SIGKILL when tasks are stopped.
      finish_timeout: seconds the other training tasks have to exit after the one whose exit
        decides the job (the chief, else worker 0) exited 0; one still running then is stopped,
        and that is a failure. Longer than ``grace``: a busy machine takes a while to tear
        TensorFlow down, and a needless restart of a finished run only reports it complete.
      evaluator_timeout: seconds the evaluator has, once training has finished, to evaluate the
        run's last checkpoint and exit by itself; then it is stopped (and that final
        evaluation is lost). An evaluation of a large validation set takes minutes.
    """

    command: Sequence[str]
    workers: int = 1
    ps: int = 0
    chief: bool = False
    evaluator: bool = False
    max_restarts: int = DEFAULT_MAX_RESTARTS
    port_base: int | None = None
    host: str = DEFAULT_HOST
    startup_timeout: float | None = None
    grace: float = DEFAULT_GRACE
    finish_timeout: float = DEFAULT_FINISH_TIMEOUT
    evaluator_timeout: float = DEFAULT_EVALUATOR_TIMEOUT

    def __post_init__(self):
        command = self.command
        if isinstance(command, str) or not isinstance(command, (list, tuple)):
            raise LaunchError(
                f"COMMAND must be a list of arguments; received {command!r}. "
                f"Fix: put the command after `--`, e.g. `tfdist launch --workers 2 -- python train.py`."
            )
        command = tuple(command)
        if not command or not all(isinstance(a, str) for a in command) or command[0] == "":
            raise LaunchError(
                f"COMMAND is missing; received {list(command)!r}. "
                f"Fix: put the command after `--`, e.g. `tfdist launch --workers 2 -- python train.py`."
            )
        object.__setattr__(self, "command", command)
        _fix_int("--workers", self.workers, minimum=1, fix="pass --workers 1 or more.")
        _fix_int("--ps", self.ps, minimum=0, fix="pass --ps 0 (no parameter servers) or more.")
        _fix_int(
            "--max-restarts", self.max_restarts, minimum=0,
            fix="pass --max-restarts 0 to never restart, or a positive count.",
        )
        if self.port_base is not None:
            _fix_int("--port-base", self.port_base, minimum=1, fix="pass a port between 1024 and 65535.")
            last = self.port_base + self.num_tasks - 1
            if last > MAX_PORT:
                raise LaunchError(
                    f"--port-base is out of range: {self.num_tasks} tasks need ports {self.port_base}..{last}; "
                    f"received --port-base {self.port_base}. Fix: pass a port base of at most "
                    f"{MAX_PORT - self.num_tasks + 1}, or leave it out to use any free ports."
                )
        if not isinstance(self.host, str) or not _HOST.match(self.host):
            raise LaunchError(
                f"--host must be a host name or IPv4 address; received --host {self.host!r}. "
                f"Fix: pass --host {DEFAULT_HOST} (the default) or an address of this machine."
            )
        if self.startup_timeout is not None:
            _fix_seconds("--startup-timeout", self.startup_timeout, fix="pass e.g. --startup-timeout 60.")
        _fix_seconds("--grace", self.grace, fix=f"pass e.g. --grace {DEFAULT_GRACE:g}.")
        _fix_seconds("--finish-timeout", self.finish_timeout,
                     fix=f"pass e.g. --finish-timeout {DEFAULT_FINISH_TIMEOUT:g}.")
        _fix_seconds("--evaluator-timeout", self.evaluator_timeout,
                     fix=f"pass e.g. --evaluator-timeout {DEFAULT_EVALUATOR_TIMEOUT:g}.")

    @property
    def has_chief(self) -> bool:
        """A ps job needs a chief to coordinate it, so ``ps > 0`` implies one."""
        return self.chief or self.ps > 0

    @property
    def is_parameter_server(self) -> bool:
        return self.ps > 0

    @property
    def num_tasks(self) -> int:
        return int(self.has_chief) + self.workers + self.ps + int(self.evaluator)

    def job_sizes(self) -> dict[str, int]:
        """Tasks per role, in the order they are started: chief, worker, ps, evaluator."""
        sizes = {CHIEF: int(self.has_chief), WORKER: self.workers, PS: self.ps, EVALUATOR: int(self.evaluator)}
        return {role: n for role, n in sizes.items() if n}


@dataclasses.dataclass(frozen=True)
class LaunchResult:
    """How a launch ended.

    Attributes:
      exit_code: the job's exit code (0: every training task succeeded).
      restarts: whole-cluster restarts used.
      worker_restarts: lone worker restarts used (parameter-server jobs only).
      wall_time: seconds from the first start to the end.
      reason: why the launch ended, in words.
    """

    exit_code: int
    restarts: int
    worker_restarts: int
    wall_time: float
    reason: str

    def summary(self) -> str:
        lone = f", {self.worker_restarts} lone worker restart(s)" if self.worker_restarts else ""
        return (
            f"launch finished: exit code {self.exit_code}, {self.restarts} cluster restart(s){lone}, "
            f"wall time {self.wall_time:.1f} s ({self.reason})"
        )


def exit_code_of(returncode: int) -> int:
    """A process's return code as a shell reports it: killed by signal N -> 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def _describe_exit(returncode: int) -> str:
    if returncode < 0:
        return f"was killed by {_signal_name(-returncode)}"
    note = " (preempted)" if returncode == env.EXIT_PREEMPTED else ""
    note = " (peer lost)" if returncode == env.EXIT_PEER_LOST else note
    return f"exited with code {returncode}{note}"


class _Task:
    """One process of the cluster and its reader threads."""

    def __init__(self, *, role: str, index: int, address: str, environ: dict[str, str]):
        self.role = role
        self.index = index
        self.address = address
        self.environ = environ
        self.process: subprocess.Popen | None = None
        self.readers: list[threading.Thread] = []
        self.returncode: int | None = None
        self.lone_restarts = 0
        self.lone_failure: int | None = None  # the return code of its last failure before any step, in a ps job
        self.last_lines: collections.deque[str] = collections.deque(maxlen=LAST_LINES)

    @property
    def progress_file(self) -> str:
        return self.environ[env.TFDIST_PROGRESS_FILE]

    @property
    def name(self) -> str:
        return f"{self.role}:{self.index}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.returncode is None


@dataclasses.dataclass(frozen=True)
class _Outcome:
    kind: str  # "success", "failure", "bad-input", "interrupted" or "repeated" (not worth a restart), or "stopped"
    exit_code: int
    reason: str
    task: _Task | None = dataclasses.field(default=None, compare=False)  # the failed task whose exit decided


def _failure(task: _Task, note: str = "") -> _Outcome:
    """The outcome of ``task``'s failed exit: bad input or a Ctrl-C ends the launch, anything else may restart."""
    if task.returncode == env.EXIT_USAGE:
        return _Outcome("bad-input", env.EXIT_USAGE,
                        f"{task.name} {_describe_exit(task.returncode)}: bad input, which a restart cannot fix", task)
    if _interrupted(task):  # fit saved the step it came in
        return _Outcome("interrupted", exit_code_of(task.returncode),
                        f"{task.name} {_describe_exit(task.returncode)}: interrupted (Ctrl-C), which stops the run",
                        task)
    return _Outcome("failure", exit_code_of(task.returncode) or env.EXIT_FAILED,
                    f"{task.name} {_describe_exit(task.returncode)}{note}", task)


def _signature(outcome: _Outcome, *, progressed: bool) -> tuple[str, int] | None:
    """The failure as (task, return code) when it may repeat at every restart: no task trained a step
    in this attempt, and it is not a preemption (which asks for the restart). The same two attempts
    in a row end the launch."""
    task = outcome.task
    if outcome.kind != "failure" or task is None or progressed or task.returncode == env.EXIT_PREEMPTED:
        return None
    return task.name, task.returncode


def _interrupted(task: _Task) -> bool:
    """Stopped by Ctrl-C: killed by SIGINT (a script's uncaught KeyboardInterrupt), or exit code
    130 (``tfdist train``, which reports where it stopped)."""
    return task.returncode in (-signal.SIGINT, 128 + signal.SIGINT)


def _deciding(failures: list[_Task], result_task: _Task) -> _Task:
    """Of the tasks that failed in one poll, the one whose exit decides: bad input first (a restart
    cannot fix it, whatever the peers that lost it exited with), then a Ctrl-C, then the result
    task, then the first."""
    final = [t for t in failures if t.returncode == env.EXIT_USAGE] or [t for t in failures if _interrupted(t)]
    return final[0] if final else result_task if result_task in failures else failures[0]


class Launcher:
    """Runs a cluster of local processes under the failure policy of ``LaunchOptions``.

    ``run`` blocks until the job ends and returns a ``LaunchResult``; every process it
    started is dead when it returns or raises. Call it from the main thread to have
    SIGINT, SIGTERM and SIGUSR1 forwarded to the tasks; from another thread, use ``request_stop``.
    """

    def __init__(
        self,
        *,
        options: LaunchOptions,
        environ: Mapping[str, str] | None = None,
        stdout: IO[str] | None = None,
        stderr: IO[str] | None = None,
    ):
        if not isinstance(options, LaunchOptions):
            raise LaunchError(
                f"`options` must be a LaunchOptions; received {type(options).__name__}. "
                f"Fix: pass options=LaunchOptions(command=[...], workers=N)."
            )
        self.options = options
        self._environ = dict(os.environ if environ is None else environ)
        self._stdout = stdout
        self._stderr = stderr
        self._write_lock = threading.Lock()
        self._tasks: list[_Task] = []
        self._signals: list[int] = []
        self._used_ports: set[int] = set()
        self._restarts = 0
        self._worker_restarts = 0
        self._progress_dir: str | None = None

    # --- public -----------------------------------------------------------------------
    def request_stop(self, signum: int = signal.SIGTERM) -> None:
        """Stops every task as if the launcher had received ``signum``; a second call kills at once."""
        self._signals.append(int(signum))

    def run(self) -> LaunchResult:
        """Launches the cluster and supervises it until the job ends."""
        start = time.monotonic()
        previous = self._install_signal_handlers()
        atexit.register(self._kill_all)
        self._progress_dir = tempfile.mkdtemp(prefix="tfdist-launch-")
        try:
            if self.options.ps and not self.options.chief:
                log.info("--ps %d implies a chief: adding chief:0 to coordinate the training", self.options.ps)
            outcome = self._run()
        finally:
            self._kill_all()
            atexit.unregister(self._kill_all)
            self._restore_signal_handlers(previous)
            shutil.rmtree(self._progress_dir, ignore_errors=True)
        result = LaunchResult(
            exit_code=outcome.exit_code,
            restarts=self._restarts,
            worker_restarts=self._worker_restarts,
            wall_time=time.monotonic() - start,
            reason=outcome.reason,
        )
        log.info("%s", result.summary())
        return result

    # --- the policy ---------------------------------------------------------------------
    def _run(self) -> _Outcome:
        signature = None  # the last attempt's failure, when it came before any step was trained
        while True:
            if self._signals:
                return self._stopped_outcome()
            self._tasks = self._start_cluster(restart=self._restarts)
            try:
                if self.options.is_parameter_server:
                    outcome = self._supervise_parameter_server()
                else:
                    outcome = self._supervise_synchronous()
                if outcome.kind == "success":
                    self._let_the_evaluator_finish()
            finally:
                self._stop(self._tasks)
            if outcome.kind == "stopped":
                return self._stopped_outcome()
            if outcome.kind == "success":
                return outcome
            if outcome.kind in ("bad-input", "interrupted"):
                log.error("%s; not restarting", outcome.reason)
                return outcome
            if outcome.kind == "repeated":  # a parameter-server worker's, said already
                return outcome
            previous, signature = signature, _signature(outcome, progressed=self._progressed())
            if signature is not None and signature == previous:
                return self._repeated_outcome(outcome)
            if self._restarts >= self.options.max_restarts:
                log.error(
                    "%s; no restart left (--max-restarts %d), giving up",
                    outcome.reason, self.options.max_restarts,
                )
                return outcome
            self._restarts += 1
            log.warning(
                "%s; restarting the whole cluster on fresh ports (restart %d of %d)",
                outcome.reason, self._restarts, self.options.max_restarts,
            )

    def _progressed(self) -> bool:
        """Whether any task of this attempt trained a step (tfdist.progress)."""
        return any(progress.read(task.progress_file) is not None for task in self._tasks)

    def _repeated_outcome(self, outcome: _Outcome) -> _Outcome:
        """Ends the launch on a failure that came twice, the same, before any step: its task's last lines, one reason."""
        task = outcome.task
        reason = (f"{task.name} {_describe_exit(task.returncode)} twice in a row, before any task trained a step: a "
                  "restart would fail the same way")
        with self._write_lock:
            out = self._err()
            out.write(f"tfdist: the last {len(task.last_lines)} line(s) of {task.name}:\n")
            out.writelines(f"[{task.name}] {line}\n" for line in task.last_lines)
            out.flush()
        log.error("%s; not restarting. Fix: correct what its last lines above say, then launch again", reason)
        return _Outcome("repeated", outcome.exit_code, reason, task)

    def _result_task(self) -> _Task:
        """The task whose exit code is the job's: the chief, or worker 0 without a chief."""
        return self._tasks[0]  # chief first, then worker 0 (see LaunchOptions.job_sizes)

    def _stopped_outcome(self) -> _Outcome:
        signum = self._signals[0]
        name = _signal_name(signum)
        code = self._tasks[0].returncode if self._tasks else None
        if code is not None and code != 0:
            return _Outcome("stopped", exit_code_of(code), f"stopped by {name}")
        return _Outcome("stopped", 128 + signum, f"stopped by {name}")

    def _supervise_synchronous(self) -> _Outcome:
        """Every training task must exit 0; the first failure ends this attempt."""
        training = [t for t in self._tasks if t.role in (CHIEF, WORKER)]
        result_task = self._result_task()
        finish_deadline: float | None = None
        while True:
            if self._signals:
                return _Outcome("stopped", 0, "stopped by signal")
            failures = []
            for task in self._poll():
                if task.role == EVALUATOR:
                    self._evaluator_exited(task)
                elif task.returncode != 0:
                    failures.append(task)
            if failures:
                return _failure(_deciding(failures, result_task))
            if all(t.returncode == 0 for t in training):
                return _Outcome("success", env.EXIT_OK, "every training task exited with code 0")
            if result_task.returncode == 0:
                if finish_deadline is None:
                    finish_deadline = time.monotonic() + self.options.finish_timeout
                elif time.monotonic() > finish_deadline:  # a task that did not finish did not succeed
                    late = ", ".join(t.name for t in training if t.running)
                    return _Outcome("failure", env.EXIT_FAILED,
                                    f"{late} still running {self.options.finish_timeout:g} s after {result_task.name} "
                                    "exited with code 0, stopped: not every training task finished")
            time.sleep(_POLL_S)

    def _supervise_parameter_server(self) -> _Outcome:
        """The chief's exit ends the job; workers restart alone, a dead ps restarts everything."""
        max_restarts = self.options.max_restarts
        while True:
            if self._signals:
                return _Outcome("stopped", 0, "stopped by signal")
            exited = self._poll()  # chief first
            for task in exited:
                if task.role == CHIEF:
                    if task.returncode == 0:
                        return _Outcome("success", env.EXIT_OK, "chief:0 exited with code 0")
                    return _failure(task)
            for task in exited:
                if task.role == PS:
                    return _failure(task, " (a ps must serve until the chief ends)")
                if task.role == EVALUATOR:
                    self._evaluator_exited(task)
                elif task.role == WORKER:
                    if task.returncode == env.EXIT_USAGE or _interrupted(task) or task.lone_restarts >= max_restarts:
                        return _failure(task, f" and used its {max_restarts} lone restart(s)")
                    failure = _signature(_failure(task), progressed=self._progressed())
                    if failure is not None and failure[1] == task.lone_failure:
                        return self._repeated_outcome(_failure(task))
                    task.lone_failure = None if failure is None else failure[1]
                    task.lone_restarts += 1
                    self._worker_restarts += 1
                    log.warning(
                        "%s %s; restarting it alone on %s (lone restart %d of %d) while the chief goes on",
                        task.name, _describe_exit(task.returncode), task.address, task.lone_restarts, max_restarts,
                    )
                    self._spawn(task)
            time.sleep(_POLL_S)

    def _let_the_evaluator_finish(self) -> None:
        """After training, the evaluator gets ``evaluator_timeout`` seconds to evaluate the last
        checkpoint (it exits by itself once it has evaluated the run's complete one)."""
        evaluators = [t for t in self._tasks if t.role == EVALUATOR and t.running]
        timeout = self.options.evaluator_timeout
        if evaluators:
            log.info("training finished; waiting up to %g s (--evaluator-timeout) for %s to evaluate the last "
                     "checkpoint", timeout, ", ".join(t.name for t in evaluators))
        deadline = time.monotonic() + timeout
        while evaluators and time.monotonic() < deadline and not self._signals:
            for task in self._poll():
                if task.role == EVALUATOR:
                    self._evaluator_exited(task)
            evaluators = [t for t in evaluators if t.running]
            time.sleep(_POLL_S)
        if evaluators and not self._signals:
            log.warning("%s did not finish within %g s of the end of training; stopping it: the last checkpoint may "
                        "not be evaluated. Fix: pass a longer --evaluator-timeout",
                        ", ".join(t.name for t in evaluators), timeout)

    def _evaluator_exited(self, task: _Task) -> None:
        if task.returncode == 0:
            log.info("%s %s", task.name, _describe_exit(task.returncode))
        else:
            log.warning(
                "%s %s; the evaluator is a sidecar: training goes on and it is not restarted",
                task.name, _describe_exit(task.returncode),
            )

    # --- processes ----------------------------------------------------------------------
    def _start_cluster(self, *, restart: int) -> list[_Task]:
        sizes = self.options.job_sizes()
        ports = self._allocate_ports(sum(sizes.values()))
        host = self.options.host
        jobs: dict[str, tuple[str, ...]] = {}
        for role, count in sizes.items():
            jobs[role] = tuple(f"{host}:{ports.pop(0)}" for _ in range(count))
        base = dict(self._environ)
        base[_PYTHONUNBUFFERED] = "1"
        if self.options.startup_timeout is not None:
            base[env.TFDIST_STARTUP_TIMEOUT] = f"{self.options.startup_timeout:g}"
        tasks = []
        for role, addresses in jobs.items():
            for index, address in enumerate(addresses):
                try:
                    spec = ClusterSpec(jobs=jobs, task_type=role, task_index=index, source="tfdist launch")
                except ClusterConfigError as e:
                    raise LaunchError(f"the launched cluster would be invalid: {e}") from None
                environ = env.task_environment(spec.to_tf_config(), restart=restart, base=base)
                environ[env.TFDIST_PROGRESS_FILE] = os.path.join(self._progress_dir, f"{role}-{index}")
                tasks.append(_Task(role=role, index=index, address=address, environ=environ))
        described = "; ".join(f"{role}={','.join(addrs)}" for role, addrs in jobs.items())
        log.info("starting %d task(s) (restart %d): %s", len(tasks), restart, described)
        self._tasks = tasks  # so that _kill_all sees them even if a spawn below fails
        for task in tasks:
            self._spawn(task)
        return tasks

    def _spawn(self, task: _Task) -> None:
        try:
            os.remove(task.progress_file)  # a lone restart's progress is its own
        except OSError:
            pass
        try:
            task.process = subprocess.Popen(
                list(self.options.command),
                env=task.environ,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # its own process group: one killpg stops it and its children
            )
        except OSError as e:
            raise LaunchError(
                f"COMMAND could not be started: {e.strerror}; received {self.options.command[0]!r}. "
                f"Fix: give a program on PATH or its full path, e.g. `-- {sys.executable} train.py`."
            ) from None
        task.returncode = None
        task.last_lines.clear()
        prefix = f"[{task.name}] "
        task.readers = [
            threading.Thread(
                target=self._pump, args=(task.process.stdout, prefix, self._out, task.last_lines), daemon=True,
                name=f"tfdist-launch-{task.name}-stdout",
            ),
            threading.Thread(
                target=self._pump, args=(task.process.stderr, prefix, self._err, task.last_lines), daemon=True,
                name=f"tfdist-launch-{task.name}-stderr",
            ),
        ]
        for reader in task.readers:
            reader.start()

    def _poll(self) -> list[_Task]:
        """The tasks that exited since the last poll, chief first; their groups are cleaned up."""
        exited = []
        for task in self._tasks:
            if task.running and task.process.poll() is not None:
                task.returncode = task.process.returncode
                _kill_group(task.process, signal.SIGKILL)  # whatever the task left behind
                self._join_readers(task)
                if task.role != EVALUATOR:  # _evaluator_exited reports it
                    log.info("%s %s", task.name, _describe_exit(task.returncode))
                exited.append(task)
        return exited

    def _stop(self, tasks: list[_Task]) -> None:
        """SIGTERM to every running task's group, SIGKILL after the grace period. Under parameter
        servers the chief first, and the others once it has exited: its last save reads the
        variables from the ps tasks and waits for the steps the workers run."""
        live = [t for t in tasks if t.running]
        first = [t for t in live if t.role == CHIEF] if self.options.is_parameter_server else []
        signals_before = len(self._signals)
        for phase in (first, [t for t in live if t not in first]):
            self._stop_now(phase, signals_before=signals_before)

    def _stop_now(self, live: list[_Task], *, signals_before: int) -> None:
        if not live:
            return
        log.info("stopping %s", ", ".join(t.name for t in live))
        for task in live:
            _kill_group(task.process, signal.SIGTERM)
        deadline = time.monotonic() + self.options.grace
        why = f"did not stop within {self.options.grace:g} s of SIGTERM"
        while any(t.process.poll() is None for t in live):
            if len(self._signals) > max(1, signals_before):
                why = "is still running at the second signal"  # a second Ctrl-C kills at once
                break
            if time.monotonic() > deadline:
                break
            time.sleep(_POLL_S)
        for task in live:
            if task.process.poll() is None:
                log.warning("%s %s; sending SIGKILL", task.name, why)
            _kill_group(task.process, signal.SIGKILL)
        for task in live:
            try:
                task.process.wait(timeout=_KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                log.error("%s (pid %d) survived SIGKILL for %.0f s", task.name, task.process.pid, _KILL_WAIT_S)
                continue
            task.returncode = task.process.returncode
            self._join_readers(task)

    def _kill_all(self) -> None:
        """Last resort on every exit path: SIGKILL to every task still running."""
        for task in self._tasks:
            if task.process is not None and task.process.poll() is None:
                _kill_group(task.process, signal.SIGKILL)
                try:
                    task.process.wait(timeout=_KILL_WAIT_S)
                except subprocess.TimeoutExpired:
                    pass
            if task.process is not None and task.returncode is None:
                task.returncode = task.process.returncode

    # --- output -------------------------------------------------------------------------
    def _out(self) -> IO[str]:
        return self._stdout or sys.stdout

    def _err(self) -> IO[str]:
        return self._stderr or sys.stderr

    def _pump(self, pipe: IO[bytes], prefix: str, stream: Callable[[], IO[str]], last: collections.deque) -> None:
        try:
            for raw in iter(pipe.readline, b""):
                line = raw.decode("utf-8", errors="replace").rstrip("\n")
                with self._write_lock:
                    last.append(line)
                    out = stream()
                    out.write(f"{prefix}{line}\n")
                    out.flush()
        except (OSError, ValueError):  # the pipe or the stream was closed under us
            pass
        finally:
            try:
                pipe.close()
            except OSError:
                pass

    @staticmethod
    def _join_readers(task: _Task) -> None:
        deadline = time.monotonic() + _READER_JOIN_S
        for reader in task.readers:
            reader.join(timeout=max(0.0, deadline - time.monotonic()))

    # --- signals and ports ----------------------------------------------------------------
    def _install_signal_handlers(self) -> dict[int, object]:
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous = {}
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):  # SIGUSR1: Slurm's warning of a time limit
            previous[signum] = signal.signal(signum, self._on_signal)
        return previous

    @staticmethod
    def _restore_signal_handlers(previous: dict[int, object]) -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    def _on_signal(self, signum, frame) -> None:  # runs in the main thread; only records it
        self._signals.append(signum)

    def _allocate_ports(self, count: int) -> list[int]:
        """``count`` distinct free ports never used by an earlier attempt of this launch."""
        ports = free_ports(count, host=self.options.host, port_base=self.options.port_base, avoid=self._used_ports)
        self._used_ports.update(ports)
        return ports


def _kill_group(process: subprocess.Popen, signum: int) -> None:
    """Sends ``signum`` to the task's process group (its pgid is its pid: start_new_session)."""
    try:
        os.killpg(process.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def launch(options: LaunchOptions) -> LaunchResult:
    """Runs ``options.command`` as every task of a local cluster; see ``Launcher``."""
    return Launcher(options=options).run()
