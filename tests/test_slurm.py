"""Slurm detection: a faked srun step through the environment, read by tfdist.cluster.detect()."""

from __future__ import annotations

import json

import pytest

from tfdist import cluster, env
from tfdist.errors import ClusterConfigError

_SLURM_VARIABLES = (
    env.SLURM_JOB_ID, env.SLURM_PROCID, env.SLURM_STEP_NUM_TASKS, env.SLURM_NTASKS,
    env.SLURM_STEP_NODELIST, env.SLURM_JOB_NODELIST, env.SLURM_STEP_TASKS_PER_NODE,
    env.TFDIST_SLURM_JOBS, env.TFDIST_PORT_BASE, env.TF_CONFIG, "SLURMD_NODENAME",
)


@pytest.fixture
def srun(monkeypatch):
    """Fakes one task of an srun step: ``srun(rank, tasks=..., nodes=..., per_node=..., **extra)``."""
    for name in _SLURM_VARIABLES:
        monkeypatch.delenv(name, raising=False)

    def step(rank: int, *, tasks: int = 4, nodes: str = "node[1-2]", per_node: str = "2(x2)", **extra: str):
        monkeypatch.setenv(env.SLURM_JOB_ID, "4242")
        monkeypatch.setenv(env.SLURM_PROCID, str(rank))
        monkeypatch.setenv(env.SLURM_STEP_NUM_TASKS, str(tasks))
        monkeypatch.setenv(env.SLURM_STEP_NODELIST, nodes)
        monkeypatch.setenv(env.SLURM_STEP_TASKS_PER_NODE, per_node)
        for name, value in extra.items():
            monkeypatch.setenv(name, value)
        return cluster.detect()

    return step


PS_JOB = {env.TFDIST_SLURM_JOBS: "chief:1,worker:2,ps:1", env.TFDIST_PORT_BASE: "9000"}


def test_roles_fill_the_ranks_in_alphabetical_order(srun):
    expected_jobs = {
        "chief": ("node1:9000",),
        "ps": ("node1:9001",),
        "worker": ("node2:9000", "node2:9001"),
    }
    # ranks fill chief, then ps, then worker (TensorFlow's resolver sorts the roles)
    expected_tasks = [("chief", 0), ("ps", 0), ("worker", 0), ("worker", 1)]
    for rank, (task_type, task_index) in enumerate(expected_tasks):
        spec = srun(rank, **PS_JOB)
        assert spec.source == "Slurm"
        assert dict(spec.jobs) == expected_jobs
        assert (spec.task_type, spec.task_index) == (task_type, task_index)
        assert spec.is_chief == (rank == 0)
        assert spec.num_workers == 3 and spec.num_ps == 1


def test_without_tfdist_slurm_jobs_every_task_is_a_worker_on_the_default_ports(srun):
    for rank in range(4):
        spec = srun(rank)
        assert dict(spec.jobs) == {"worker": ("node1:8888", "node1:8889", "node2:8888", "node2:8889")}
        assert (spec.task_type, spec.task_index) == ("worker", rank)
        assert spec.is_chief == (rank == 0)


def test_an_evaluator_sorts_between_chief_and_ps(srun):
    spec = srun(1, tasks=5, per_node="3,2", **{env.TFDIST_SLURM_JOBS: "chief:1,worker:2,ps:1,evaluator:1"})
    assert dict(spec.jobs) == {
        "chief": ("node1:8888",),
        "evaluator": ("node1:8889",),
        "ps": ("node1:8890",),
        "worker": ("node2:8888", "node2:8889"),
    }
    assert (spec.task_type, spec.task_index) == ("evaluator", 0)


def test_master_is_read_as_chief(srun):
    spec = srun(0, tasks=2, per_node="1(x2)", **{env.TFDIST_SLURM_JOBS: "master:1,worker:1"})
    assert dict(spec.jobs) == {"chief": ("node1:8888",), "worker": ("node2:8888",)}
    assert spec.task_type == "chief"


@pytest.mark.parametrize("tasks_variable", [env.SLURM_STEP_NUM_TASKS, env.SLURM_NTASKS])
def test_one_task_is_a_local_run(srun, monkeypatch, tasks_variable):
    srun(0, tasks=1, nodes="node1", per_node="1")
    if tasks_variable == env.SLURM_NTASKS:  # an sbatch script outside srun: only SLURM_NTASKS
        monkeypatch.delenv(env.SLURM_STEP_NUM_TASKS)
        monkeypatch.setenv(env.SLURM_NTASKS, "1")
    spec = cluster.detect()
    assert spec.is_local and spec.source == "local" and spec.is_chief


def test_outside_slurm_the_run_is_local(srun, monkeypatch):
    srun(0)
    monkeypatch.delenv(env.SLURM_JOB_ID)
    assert cluster.detect().is_local


@pytest.mark.parametrize(
    "jobs, fragment",
    [
        ("chief:1,worker:1", "add up to the 4 tasks"),  # 2 roles for 4 tasks
        ("chief:1,worker:2,ps:2", "add up to the 4 tasks"),  # 5 roles for 4 tasks
        ("boss:1,worker:3", "'boss:1'"),  # unknown role
        ("worker:x", "'worker:x'"),
        ("worker:0,chief:4", "'worker:0'"),
        ("worker", "'worker'"),
    ],
)
def test_bad_tfdist_slurm_jobs_is_refused(srun, jobs, fragment):
    with pytest.raises(ClusterConfigError, match="TFDIST_SLURM_JOBS") as raised:
        srun(0, **{env.TFDIST_SLURM_JOBS: jobs})
    assert fragment in str(raised.value) and "Fix:" in str(raised.value)


@pytest.mark.parametrize(
    "rank, extra, fragment",
    [
        (0, {env.TFDIST_PORT_BASE: "abc"}, "invalid TFDIST_PORT_BASE; received 'abc'"),
        (0, {env.SLURM_STEP_NODELIST: "node[1-"}, "invalid node list; received 'node[1-'"),
        (0, {env.SLURM_STEP_TASKS_PER_NODE: "x"}, "invalid SLURM_STEP_TASKS_PER_NODE; received 'x'"),
        ("abc", {}, "invalid SLURM_PROCID; received 'abc'"),
        (5, {}, "invalid SLURM_PROCID; received '5'. Fix: the step has 4 task(s), ranks 0 to 3"),
    ],
)
def test_a_malformed_slurm_environment_is_one_line_naming_the_variable(srun, rank, extra, fragment):
    # These were tracebacks (int() of the text, TensorFlow's node-list parser), or, for a rank
    # outside the step, an error about TF_CONFIG's "task" key.
    with pytest.raises(ClusterConfigError) as raised:
        srun(rank, **extra)
    message = str(raised.value)
    assert message.startswith("Slurm: ") and fragment in message and "Fix:" in message and "\n" not in message


def test_a_ps_job_without_chief_is_refused_like_a_tf_config(srun):
    with pytest.raises(ClusterConfigError, match="chief"):
        srun(0, **{env.TFDIST_SLURM_JOBS: "worker:3,ps:1"})


def test_a_step_without_node_list_is_refused():
    with pytest.raises(ClusterConfigError, match="SLURM_STEP_NODELIST"):
        cluster.from_slurm({env.SLURM_JOB_ID: "1", env.SLURM_PROCID: "0", env.SLURM_STEP_NUM_TASKS: "2"})


def test_tf_config_takes_precedence_over_slurm(srun, monkeypatch):
    srun(3, **PS_JOB)
    config = {"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}}
    monkeypatch.setenv(env.TF_CONFIG, json.dumps(config))
    spec = cluster.detect()
    assert spec.source == "TF_CONFIG"
    assert dict(spec.jobs) == {"worker": ("a:1", "b:1")}
    assert (spec.task_type, spec.task_index) == ("worker", 1)


def test_an_explicit_environment_mapping_is_read_instead_of_os_environ(srun, monkeypatch):
    srun(0)  # os.environ says rank 0 of 4 ...
    spec = cluster.detect({
        env.SLURM_JOB_ID: "1", env.SLURM_PROCID: "1", env.SLURM_STEP_NUM_TASKS: "2",
        env.SLURM_STEP_NODELIST: "gpu[07-08]", env.SLURM_STEP_TASKS_PER_NODE: "1(x2)",
    })  # ... but the mapping given is what counts
    assert dict(spec.jobs) == {"worker": ("gpu07:8888", "gpu08:8888")}
    assert (spec.task_type, spec.task_index) == ("worker", 1)


def test_each_rank_gets_the_address_of_the_node_it_runs_on(srun):
    # Block distribution: rank 0 on node9, rank 1 on node10.
    for rank, node in enumerate(["node9", "node10"]):
        spec = srun(rank, tasks=2, nodes="node[9-10]", per_node="1(x2)", SLURMD_NODENAME=node)
        assert spec.task_address == f"{node}:8888"
