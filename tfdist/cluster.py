"""Cluster detection: one frozen ClusterSpec from TF_CONFIG, Slurm, or the local machine.

Detectors are tried in a fixed order (see ``detect``):

1. ``TF_CONFIG`` -- written by ``tfdist launch``, Kubeflow's TFJob, or the user. It wins
   because it is the one source a user sets on purpose.
2. Slurm -- inside an ``srun`` step with more than one task, from Slurm's variables (see
   ``from_slurm``: TensorFlow's host-list helpers, not its ``SlurmClusterResolver``).
3. The local machine -- a single task; the strategy then depends on its devices.

Nothing here imports TensorFlow except the Slurm detector (for its host-list helpers).
``check_address`` is the one check of a ``host:port`` address (also used by ``tfdist cluster``
and ``tfdist launch``).
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Mapping

from tfdist import _checks, env
from tfdist.errors import ClusterConfigError

CHIEF, WORKER, PS, EVALUATOR = "chief", "worker", "ps", "evaluator"
ROLES = (CHIEF, WORKER, PS, EVALUATOR)
_ALIASES = {"master": CHIEF}  # Kubeflow's TFJob (and TF 1.x Estimator) call the chief "master".
ADDRESS = re.compile(r"^(?P<host>\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.\-]+):(?P<port>\d{1,5})$")

_TF_CONFIG_EXAMPLE = (
    '{"cluster": {"worker": ["host1:2222", "host2:2222"]}, "task": {"type": "worker", "index": 0}}'
)


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    """The cluster this process belongs to, and its own place in it.

    [`detect_cluster`][tfdist.detect_cluster] builds it from ``TF_CONFIG`` or a Slurm step. Pass
    one to ``fit``, ``evaluate``, ``predict`` or ``make_strategy`` to override the detection.
    Invalid values raise ``ClusterConfigError`` naming the field.

    Attributes:
      jobs: Maps a role (``chief``, ``worker``, ``ps``, ``evaluator``) to its task addresses, each
        ``host:port``. ``master`` is read as ``chief``. Defaults to no jobs: a local run.
      task_type: This process's role. Defaults to None: a local run.
      task_index: This process's index within its role. Defaults to None.
      source: Where the cluster came from, for messages: ``"local"``, ``"TF_CONFIG"`` or
        ``"Slurm"``. Defaults to ``"local"``.
      environment: ``TF_CONFIG``'s ``environment``, such as ``"cloud"``. Defaults to None.
      rpc_layer: The protocol between tasks. Defaults to ``"grpc"``.

    Examples:
        ```python
        import tfdist

        cluster = tfdist.ClusterSpec(jobs={"worker": ["host1:2222", "host2:2222"]},
                                     task_type="worker", task_index=0)
        print(cluster.is_chief, cluster.num_workers)   # True 2
        print(cluster.to_tf_config(task_index=1))
        ```
    """

    jobs: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    task_type: str | None = None
    task_index: int | None = None
    source: str = "local"
    environment: str | None = None
    rpc_layer: str = "grpc"

    def __post_init__(self):
        jobs = {role: tuple(addrs) for role, addrs in dict(self.jobs).items()}
        object.__setattr__(self, "jobs", jobs)
        _validate(jobs, self.task_type, self.task_index, where=self.source)

    def __hash__(self) -> int:
        return hash((tuple(sorted(self.jobs.items())), self.task_type, self.task_index, self.source,
                     self.environment, self.rpc_layer))

    # --- counts -------------------------------------------------------------------
    @property
    def num_workers(self) -> int:
        """Training tasks: the chief plus the workers (ps and evaluator excluded)."""
        return len(self.jobs.get(CHIEF, ())) + len(self.jobs.get(WORKER, ()))

    @property
    def num_ps(self) -> int:
        """Parameter-server tasks."""
        return len(self.jobs.get(PS, ()))

    @property
    def is_local(self) -> bool:
        """True outside a cluster: no jobs."""
        return not self.jobs

    @property
    def is_chief(self) -> bool:
        """True on the task that coordinates and keeps checkpoints and logs."""
        if self.is_local:
            return True
        if CHIEF in self.jobs:
            return self.task_type == CHIEF
        return self.task_type == WORKER and self.task_index == 0

    @property
    def task_address(self) -> str | None:
        """This task's ``host:port``, or None outside a cluster."""
        if self.task_type is None or self.task_type not in self.jobs:
            return None
        return self.jobs[self.task_type][self.task_index or 0]

    @property
    def task_name(self) -> str:
        """``role:index``, such as ``worker:1``, or ``local`` outside a cluster."""
        return "local" if self.is_local else f"{self.task_type}:{self.task_index}"

    def training_jobs(self) -> dict[str, list[str]]:
        """The jobs TensorFlow's strategies see: everything but the evaluator."""
        return {role: list(addrs) for role, addrs in self.jobs.items() if role != EVALUATOR}

    def to_tf_config(self, task_type: str | None = None, task_index: int | None = None) -> dict:
        """The TF_CONFIG dictionary of one task.

        Args:
          task_type: The task's role. Defaults to None: this task's.
          task_index: The task's index. Defaults to None: this task's.

        Returns:
          The dictionary to serialize with ``json.dumps`` into that task's ``TF_CONFIG``.
        """
        task_type = self.task_type if task_type is None else task_type
        task_index = self.task_index if task_index is None else task_index
        config: dict[str, Any] = {
            "cluster": {role: list(addrs) for role, addrs in self.jobs.items()},
            "task": {"type": task_type, "index": task_index},
        }
        if self.environment:
            config["environment"] = self.environment
        return config

    def tasks(self) -> list[tuple[str, int, str]]:
        """Every task as (role, index, address), chief first, then workers, ps, evaluator."""
        return [(role, i, addr) for role in ROLES for i, addr in enumerate(self.jobs.get(role, ()))]

    def describe(self) -> str:
        """One line for logs: the jobs, where they came from and this task."""
        if self.is_local:
            return "local machine (no cluster configured)"
        parts = [f"{len(addrs)} {role}" for role, addrs in self.jobs.items() if addrs]
        return f"{', '.join(parts)} from {self.source}; this task is {self.task_name}"


def check_address(address: Any, *, where: str, field: str) -> tuple[str, int]:
    """(host, port) of a ``host:port`` address; raises ClusterConfigError naming ``field`` otherwise."""
    match = ADDRESS.match(address) if isinstance(address, str) else None
    if match is None:
        raise config_error(where, field, address, "write it as host:port, e.g. 'host1:2222'.")
    port = int(match.group("port"))
    if not 0 < port < 65536:
        raise config_error(where, f"port in {field}", address, "use a port between 1 and 65535.")
    return match.group("host").strip("[]"), port


def config_error(where: str, field: str, received: Any, fix: str) -> ClusterConfigError:
    """The one-line error for an invalid cluster field: where, which field, the value, the fix."""
    return ClusterConfigError(f"{where}: invalid {field}; received {received!r}. Fix: {fix}")


def _validate(jobs: dict[str, tuple[str, ...]], task_type, task_index, *, where: str) -> None:
    if not jobs:
        if task_type is not None:
            raise config_error(where, "task", task_type, "a task needs a cluster; give \"cluster\" too.")
        return
    seen: dict[str, str] = {}
    for role, addresses in jobs.items():
        if role not in ROLES:
            raise config_error(
                where, "role in cluster", role, f"use one of {', '.join(ROLES)} (or 'master' for the chief)."
            )
        if not addresses:
            raise config_error(where, f"cluster.{role}", [], f"list at least one address for '{role}' or remove it.")
        for i, address in enumerate(addresses):
            check_address(address, where=where, field=f"address cluster.{role}[{i}]")
            if address in seen:
                raise config_error(
                    where, f"address cluster.{role}[{i}]", address,
                    f"it is already used by {seen[address]}; give every task its own host:port.",
                )
            seen[address] = f"{role}[{i}]"
    for role in (CHIEF, EVALUATOR):
        if len(jobs.get(role, ())) > 1:
            raise config_error(where, f"cluster.{role}", list(jobs[role]), f"a cluster has at most one {role}.")
    if PS in jobs and CHIEF not in jobs:
        raise config_error(
            where, "cluster", sorted(jobs),
            "a 'ps' job needs a 'chief' to coordinate the training; add \"chief\": [\"host:port\"].",
        )
    if PS in jobs and WORKER not in jobs:
        raise config_error(where, "cluster", sorted(jobs), "a 'ps' job needs at least one 'worker' to run the steps.")
    if task_type is None:
        raise config_error(where, "task", None, 'add "task": {"type": "worker", "index": 0} naming this process.')
    if task_type not in ROLES:
        raise config_error(where, "task.type", task_type, f"use one of {', '.join(ROLES)} (or 'master').")
    if task_type not in jobs:
        raise config_error(
            where, "task.type", task_type, f"the cluster has no '{task_type}' job; it has {', '.join(sorted(jobs))}."
        )
    if not _checks.is_int(task_index):
        raise config_error(where, "task.index", task_index, "give the task's index as an integer, e.g. 0.")
    if not 0 <= task_index < len(jobs[task_type]):
        raise config_error(
            where, "task.index", task_index,
            f"the '{task_type}' job has {len(jobs[task_type])} task(s), so use 0..{len(jobs[task_type]) - 1}.",
        )


def parse_tf_config(raw: str | Mapping[str, Any], *, where: str = "TF_CONFIG") -> ClusterSpec:
    """Parses and validates a TF_CONFIG (a JSON string or an already decoded dictionary)."""
    if isinstance(raw, str):
        try:
            config = json.loads(raw)
        except json.JSONDecodeError as e:
            shown = raw if len(raw) <= 60 else raw[:57] + "..."
            raise ClusterConfigError(
                f"{where} is not valid JSON ({e.msg} at column {e.colno}); received {shown!r}. "
                f"Fix: set it to an object such as {_TF_CONFIG_EXAMPLE}"
            ) from None
    else:
        config = raw
    if not isinstance(config, dict):
        raise config_error(where, "value", config, f"set it to a JSON object such as {_TF_CONFIG_EXAMPLE}")
    unknown = set(config) - {"cluster", "task", "environment", "rpc_layer"}
    if unknown:
        raise config_error(where, "key", sorted(unknown)[0], "use only the keys cluster, task, environment and rpc_layer.")
    cluster = config.get("cluster", {})
    if not isinstance(cluster, dict):
        raise config_error(where, "cluster", cluster, 'make "cluster" an object of role -> list of "host:port".')
    jobs: dict[str, tuple[str, ...]] = {}
    for role, addresses in cluster.items():
        canonical = _ALIASES.get(role, role)
        if canonical in jobs:
            raise config_error(where, "cluster", sorted(cluster), "give the chief once, as 'chief' or as 'master'.")
        if isinstance(addresses, str) or not isinstance(addresses, (list, tuple)):
            raise config_error(where, f"cluster.{role}", addresses, f'make it a list, e.g. "{role}": ["host1:2222"].')
        jobs[canonical] = tuple(addresses)
    task = config.get("task")
    if task is None:
        if not jobs:
            return ClusterSpec(source=where)
        raise config_error(where, "task", None, 'add "task": {"type": "worker", "index": 0} naming this process.')
    if not isinstance(task, dict):
        raise config_error(where, "task", task, 'make "task" an object such as {"type": "worker", "index": 0}.')
    if "type" not in task:
        raise config_error(where, "task.type", None, 'add the role of this process, e.g. "type": "worker".')
    task_type = _ALIASES.get(task["type"], task["type"])
    task_index = task.get("index", 0)
    environment = config.get("environment")
    if environment is not None and not isinstance(environment, str):
        raise config_error(where, "environment", environment, 'use a string such as "cloud", or drop the key.')
    return ClusterSpec(
        jobs=jobs,
        task_type=task_type,
        task_index=task_index,
        source=where,
        environment=environment,
        rpc_layer=config.get("rpc_layer") or "grpc",
    )


def _parse_slurm_jobs(raw: str) -> dict[str, int]:
    jobs: dict[str, int] = {}
    for part in raw.split(","):
        role, _, count = part.strip().partition(":")
        role = _ALIASES.get(role, role)
        if role not in ROLES or not count.isdigit() or int(count) < 1:
            raise config_error(
                env.TFDIST_SLURM_JOBS, "role:count", part, "write it as e.g. 'chief:1,worker:2,ps:1'."
            )
        if role in jobs:
            raise config_error(env.TFDIST_SLURM_JOBS, "role", role, f"name each role once; '{role}' appears twice.")
        jobs[role] = int(count)
    return jobs


def slurm_step_tasks(environ: Mapping[str, str] | None = None) -> str | None:
    """The number of tasks of the srun step this process runs in, as Slurm wrote it (unchecked);
    None outside a Slurm job."""
    if env.get(env.SLURM_JOB_ID, environ) is None or env.get(env.SLURM_PROCID, environ) is None:
        return None
    return env.get(env.SLURM_STEP_NUM_TASKS, environ) or env.get(env.SLURM_NTASKS, environ) or "1"


def from_slurm(environ: Mapping[str, str]) -> ClusterSpec | None:
    """The cluster of an ``srun`` step with more than one task, or None outside one.

    Hosts come from TensorFlow's Slurm helpers (``expand_hostlist``,
    ``expand_tasks_per_node``), kept in Slurm's node-list order: rank r runs on the r-th
    task slot of that list (block distribution), at port ``TFDIST_PORT_BASE`` plus its slot
    on the node. TensorFlow's ``SlurmClusterResolver`` itself is not used because it sorts
    host names as strings (node10 before node9), which gives ranks another node's address.
    Ranks fill the roles in alphabetical order (chief, evaluator, ps, worker), as that
    resolver does.
    """
    num_tasks = slurm_step_tasks(environ)
    if num_tasks is None:
        return None
    if not num_tasks.isdigit():
        raise config_error("Slurm", env.SLURM_STEP_NUM_TASKS, num_tasks, "run tfdist inside an srun step.")
    if int(num_tasks) < 2:
        return None
    nodelist = env.get(env.SLURM_STEP_NODELIST, environ) or env.get(env.SLURM_JOB_NODELIST, environ)
    tasks_per_node = env.get(env.SLURM_STEP_TASKS_PER_NODE, environ)
    if nodelist is None or tasks_per_node is None:
        raise config_error(
            "Slurm", "SLURM_STEP_NODELIST/SLURM_STEP_TASKS_PER_NODE", None,
            "start the tasks with srun, which sets both; or set TF_CONFIG instead.",
        )
    from tfdist._compat.tensorflow import slurm_resolver_module
    slurm = slurm_resolver_module()

    jobs_raw = env.get(env.TFDIST_SLURM_JOBS, environ)
    jobs = _parse_slurm_jobs(jobs_raw) if jobs_raw else {WORKER: int(num_tasks)}
    if sum(jobs.values()) != int(num_tasks):
        raise config_error(
            env.TFDIST_SLURM_JOBS, "number of tasks", jobs_raw,
            f"the roles must add up to the {num_tasks} tasks of the srun step.",
        )
    port_text = env.get(env.TFDIST_PORT_BASE, environ) or str(env.DEFAULT_SLURM_PORT_BASE)
    if not port_text.isdigit():
        raise config_error(
            "Slurm", env.TFDIST_PORT_BASE, port_text,
            f"set it to the first port of the tasks on each node, e.g. {env.DEFAULT_SLURM_PORT_BASE}, or unset it.",
        )
    port_base = int(port_text)
    rank_text = env.get(env.SLURM_PROCID, environ)
    if not rank_text.isdigit():
        raise config_error("Slurm", env.SLURM_PROCID, rank_text, "run tfdist inside an srun step, which sets it.")
    rank = int(rank_text)
    if rank >= int(num_tasks):
        raise config_error(
            "Slurm", env.SLURM_PROCID, rank_text,
            f"the step has {num_tasks} task(s), ranks 0 to {int(num_tasks) - 1}: run tfdist under srun, which sets "
            f"{env.SLURM_PROCID} and {env.SLURM_STEP_NUM_TASKS} together.",
        )
    try:
        hosts = slurm.expand_hostlist(nodelist)
    except (ValueError, AssertionError):  # TensorFlow's parser asserts as well as raising
        raise config_error("Slurm", "node list", nodelist, "run tfdist under srun, which sets SLURM_STEP_NODELIST.") from None
    try:
        per_node = slurm.expand_tasks_per_node(tasks_per_node)
    except (ValueError, AssertionError):
        raise config_error(
            "Slurm", env.SLURM_STEP_TASKS_PER_NODE, tasks_per_node,
            "run tfdist under srun, which sets it (e.g. '2(x3),1').",
        ) from None
    addresses = [f"{host}:{port_base + slot}" for host, count in zip(hosts, per_node) for slot in range(count)]
    if len(addresses) != int(num_tasks):
        raise config_error(
            "Slurm", env.SLURM_STEP_TASKS_PER_NODE, tasks_per_node,
            f"it must place the {num_tasks} tasks of the step on {nodelist}; run tfdist under srun.",
        )
    cluster: dict[str, tuple[str, ...]] = {}
    task_type, task_index, first = None, None, 0
    for role in sorted(jobs):
        cluster[role] = tuple(addresses[first : first + jobs[role]])
        if first <= rank < first + jobs[role]:
            task_type, task_index = role, rank - first
        first += jobs[role]
    return ClusterSpec(jobs=cluster, task_type=task_type, task_index=task_index, source="Slurm")


def detect(environ: Mapping[str, str] | None = None) -> ClusterSpec:
    """Detects this process's cluster.

    The cluster comes from ``TF_CONFIG``, else from a Slurm ``srun`` step of several tasks, else
    from the local machine.

    Args:
      environ: The environment variables to read. Defaults to None: ``os.environ``.

    Returns:
      The [`ClusterSpec`][tfdist.ClusterSpec] of this process. Its ``is_chief`` says whether this
        task writes checkpoints, logs and files.

    Raises:
      ClusterConfigError: ``TF_CONFIG`` or the Slurm variables are invalid: bad JSON, a missing
        ``task``, an unknown role, an index out of range, a duplicate address.

    Examples:
        ```python
        import tfdist

        config = '{"cluster": {"worker": ["host1:2222", "host2:2222"]}, "task": {"type": "worker", "index": 1}}'
        cluster = tfdist.detect_cluster({"TF_CONFIG": config})
        print(cluster.task_name, cluster.is_chief)   # worker:1 False
        ```
    """
    import os

    environ = os.environ if environ is None else environ
    # 1. TF_CONFIG: set on purpose by the launcher, Kubeflow or the user.
    raw = env.get(env.TF_CONFIG, environ)
    if raw is not None:
        return parse_tf_config(raw)
    # 2. Slurm: an srun step of several tasks describes the cluster by itself.
    slurm_spec = from_slurm(environ)
    if slurm_spec is not None:
        return slurm_spec
    # 3. The local machine: a single task.
    return ClusterSpec()
