"""Cluster detection: TF_CONFIG parsing and validation, Kubeflow's form, detector order."""

import json

import pytest

from tfdist import cluster
from tfdist.errors import ClusterConfigError

W2 = {"cluster": {"worker": ["h1:2222", "h2:2222"]}, "task": {"type": "worker", "index": 1}}


def test_parses_a_two_worker_config():
    spec = cluster.parse_tf_config(json.dumps(W2))
    assert spec.num_workers == 2 and spec.num_ps == 0
    assert spec.task_type == "worker" and spec.task_index == 1 and not spec.is_chief
    assert spec.task_address == "h2:2222"
    assert spec.to_tf_config() == W2


def test_kubeflow_tfjob_form_master_and_environment_cloud():
    raw = {
        "cluster": {"master": ["job-master-0.ns.svc:2222"], "worker": ["job-worker-0.ns.svc:2222"],
                    "ps": ["job-ps-0.ns.svc:2222"], "evaluator": ["job-evaluator-0.ns.svc:2222"]},
        "task": {"type": "master", "index": 0},
        "environment": "cloud",
    }
    spec = cluster.parse_tf_config(json.dumps(raw))
    assert spec.task_type == "chief" and spec.is_chief and spec.environment == "cloud"
    assert spec.num_workers == 2 and spec.num_ps == 1
    assert "evaluator" not in spec.training_jobs()


def test_worker_zero_is_the_chief_without_a_chief_job():
    spec = cluster.parse_tf_config({**W2, "task": {"type": "worker", "index": 0}})
    assert spec.is_chief


@pytest.mark.parametrize(
    "raw, field",
    [
        ("{not json", "not valid JSON"),
        ('["worker"]', "invalid value"),
        (json.dumps({"cluster": {"worker": ["h:1"]}}), "invalid task"),
        (json.dumps({**W2, "task": {"index": 0}}), "task.type"),
        (json.dumps({**W2, "task": {"type": "boss", "index": 0}}), "task.type; received 'boss'"),
        (json.dumps({"cluster": {"boss": ["h:1"]}, "task": {"type": "boss", "index": 0}}), "role in cluster"),
        (json.dumps({**W2, "task": {"type": "worker", "index": 2}}), "task.index; received 2"),
        (json.dumps({**W2, "task": {"type": "worker", "index": "0"}}), "task.index"),
        (json.dumps({**W2, "task": {"type": "ps", "index": 0}}), "has no 'ps' job"),
        (json.dumps({"cluster": {"worker": ["h:1", "h:1"]}, "task": {"type": "worker", "index": 0}}), "already used"),
        (json.dumps({"cluster": {"worker": ["h1"]}, "task": {"type": "worker", "index": 0}}), "host:port"),
        (json.dumps({"cluster": {"worker": ["h1:99999"]}, "task": {"type": "worker", "index": 0}}), "port"),
        (json.dumps({"cluster": {"worker": ["h:1"], "ps": ["h:2"]}, "task": {"type": "worker", "index": 0}}), "needs a 'chief'"),
        (json.dumps({"cluster": {"chief": ["h:1", "h:2"]}, "task": {"type": "chief", "index": 0}}), "at most one chief"),
        (json.dumps({"cluster": {"chief": ["h:1"], "master": ["h:2"]}, "task": {"type": "chief", "index": 0}}), "once"),
        (json.dumps({"cluster": {"worker": "h:1"}, "task": {"type": "worker", "index": 0}}), "make it a list"),
        (json.dumps({"cluster": {"worker": []}, "task": {"type": "worker", "index": 0}}), "at least one address"),
        (json.dumps({**W2, "tasks": {}}), "invalid key"),
    ],
)
def test_invalid_configs_give_one_line_errors_naming_field_value_and_fix(raw, field):
    with pytest.raises(ClusterConfigError) as info:
        cluster.parse_tf_config(raw)
    message = str(info.value)
    assert field in message
    assert "Fix:" in message and "\n" not in message
    assert isinstance(info.value, ValueError)


def test_detect_prefers_tf_config_then_slurm_then_local(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    for name in ("SLURM_JOB_ID", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    assert cluster.detect().is_local
    monkeypatch.setenv("TF_CONFIG", json.dumps(W2))
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_PROCID", "0")
    assert cluster.detect().source == "TF_CONFIG"


def test_empty_tf_config_means_local(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", "")
    assert cluster.detect().is_local


def test_cluster_spec_is_hashable_and_frozen():
    spec = cluster.parse_tf_config(W2)
    assert hash(spec) == hash(cluster.parse_tf_config(W2))
    with pytest.raises(Exception):
        spec.task_index = 0
