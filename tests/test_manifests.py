"""tfdist cluster: every format's TF_CONFIGs agree, validate, and the committed compose files never drift."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest
import yaml

from tfdist import manifests
from tfdist.cli import main
from tfdist.cluster import parse_tf_config
from tfdist.errors import ClusterConfigError
from tfdist.manifests import FORMATS, JobDescription

REPO = pathlib.Path(__file__).resolve().parents[1]

# The committed compose files: (file, flags that describe the job). The header of each
# file holds the exact command that regenerates it.
COMPOSE_FILES = {
    "docker/compose-mwms.yaml": dict(workers="worker-0:2222,worker-1:2222", name="tfdist-mwms"),
    "docker/compose-ps.yaml": dict(
        chief="chief:2222", workers="worker-0:2222,worker-1:2222", ps="ps-0:2222", name="tfdist-ps"
    ),
}

IMAGE = "registry.example.com/ml/tfdist:1"  # k8s and tfjob pull from a registry: the default is refused there
DESCRIPTIONS = {
    "mwms": dict(workers="host1:2222,host2:2222", image=IMAGE),
    "ps": dict(chief="host0:2222", workers="host1:2222,host2:2222", ps="host3:2222", image=IMAGE),
    "full": dict(
        chief="host0:2222", workers="host1:2222,host2:2222,host3:2222", ps="host4:2222,host5:2222",
        evaluator="host6:2222", name="mnist", namespace="team-a", image=IMAGE,
    ),
    "one-host": dict(workers="localhost:12345,localhost:12346", chief="localhost:12344", image=IMAGE),
}


def _describe(name: str) -> JobDescription:
    return JobDescription.from_flags(**DESCRIPTIONS[name])


def _shape(configs: dict[str, dict]) -> list[tuple[str, dict[str, list[str]]]]:
    """The tasks in order with each role's ports: what every format must agree on."""
    shape = []
    for key, config in configs.items():
        spec = parse_tf_config(json.dumps(config))  # every TF_CONFIG must validate
        assert spec.task_name == key
        ports = {role: [a.rpartition(":")[2] for a in addrs] for role, addrs in sorted(spec.jobs.items())}
        shape.append((key, ports))
    return shape


# --- every format agrees -----------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(DESCRIPTIONS))
def test_every_format_writes_the_same_tasks_roles_and_ports(name):
    description = _describe(name)
    shapes = {}
    for format in FORMATS:
        if format == "tfjob" and name == "one-host":  # Kubeflow gives all workers one port
            with pytest.raises(ClusterConfigError, match="same port"):
                manifests.render(description, format=format)
            continue
        text = manifests.render(description, format=format)
        read = manifests.read_tf_configs(text, format=format)
        assert read == manifests.tf_configs(description, format=format), format
        assert list(read) == list(manifests.tf_configs(description, format=format)), f"{format}: task order"
        shapes[format] = _shape(read)
    assert [key for key, _ in shapes["env"]] == [f"{role}:{i}" for role, i, _ in description.tasks()]
    for format, shape in shapes.items():
        assert shape == shapes["env"], f"{format} disagrees with env"


@pytest.mark.parametrize("name", sorted(DESCRIPTIONS))
def test_env_and_json_use_the_given_addresses(name):
    description = _describe(name)
    for format in ("env", "json"):
        for role, index, address in description.tasks():
            config = manifests.read_tf_configs(manifests.render(description, format=format), format=format)
            assert config[f"{role}:{index}"]["cluster"][role][index] == address


def test_env_lines_are_shell_quoted_and_name_their_task():
    description = _describe("ps")
    lines = [line for line in manifests.render(description, format="env").splitlines() if not line.startswith("#")]
    assert len(lines) == 4
    for line, (role, index, address) in zip(lines, description.tasks()):
        words = shlex.split(line, comments=True)
        assert words[0] == "export" and words[1].startswith("TF_CONFIG={")
        assert line.endswith(f"# {role}:{index} at {address}")
        assert parse_tf_config(words[1].partition("=")[2]).task_name == f"{role}:{index}"


def test_json_maps_role_index_to_tf_config():
    configs = json.loads(manifests.render(_describe("ps"), format="json"))
    assert list(configs) == ["chief:0", "worker:0", "worker:1", "ps:0"]
    assert configs["ps:0"] == {
        "cluster": {"chief": ["host0:2222"], "ps": ["host3:2222"], "worker": ["host1:2222", "host2:2222"]},
        "task": {"index": 0, "type": "ps"},
    }


# --- compose -----------------------------------------------------------------------------
def test_compose_has_one_service_per_task_sharing_the_runs_volume():
    description = _describe("full")
    text = manifests.render(description, format="compose")
    assert "&id" not in text and "*id" not in text  # no YAML anchors
    document = yaml.safe_load(text)
    assert document["name"] == "mnist"
    assert list(document["services"]) == [
        "chief", "worker-0", "worker-1", "worker-2", "ps-0", "ps-1", "evaluator"
    ]
    assert document["volumes"] == {"runs": {}}
    for name, service in document["services"].items():
        assert service["hostname"] == name
        assert service["image"] == IMAGE
        assert service["build"] == {"context": ".", "dockerfile": "docker/Dockerfile"}  # printed: saved in the root
        assert service["command"] == shlex.split(manifests.DEFAULT_COMMAND)
        assert service["volumes"] == ["runs:/runs"]
        assert service["stop_grace_period"] == f"{manifests.GRACE_SECONDS}s"  # compose's 10 s would cut a save
        assert service["restart"] == "on-failure:3"  # 75 and 76 come back; bad input's 2 stops after 3
        spec = parse_tf_config(service["environment"]["TF_CONFIG"])
        assert spec.task_address == f"{name}:2222"  # the address of a task is its service name


def test_compose_command_and_image_come_from_the_flags():
    description = JobDescription.from_flags(
        workers="a:2222,b:2222", image="registry.example/tfdist:1.0", command="tfdist train --epochs 3 --note 'a b'"
    )
    document = yaml.safe_load(manifests.render(description, format="compose"))
    for service in document["services"].values():
        assert service["image"] == "registry.example/tfdist:1.0"
        assert service["command"] == ["tfdist", "train", "--epochs", "3", "--note", "a b"]


@pytest.mark.parametrize("image", ["tfdist", "tfdist:2.21.0-rc1", "gcr.io/my-project/team/tfdist:1.0",
                                   "localhost:5000/tfdist", "registry:5000/a__b/c--d.e@sha256:" + "a" * 64,
                                   "[::1]:5000/tfdist:x"])
def test_image_references_docker_accepts_are_accepted(image):
    description = JobDescription.from_flags(workers="a:2222", image=image)
    for service in yaml.safe_load(manifests.render(description, format="compose"))["services"].values():
        assert service["image"] == image


@pytest.mark.parametrize("output, context", [(None, "."), ("compose.yaml", "."), ("docker/compose.yaml", ".."),
                                             ("deploy/jobs/c.yaml", "../..")])
def test_the_compose_build_context_is_the_folder_the_command_ran_in_seen_from_the_file(output, context):
    description = JobDescription.from_flags(workers="a:2222")
    document = yaml.safe_load(manifests.render(description, format="compose", output=output))
    for service in document["services"].values():
        assert service["build"] == {"context": context, "dockerfile": "docker/Dockerfile"}


def test_a_compose_file_written_elsewhere_builds_from_the_folder_the_command_ran_in(tmp_path, monkeypatch, capsys):
    root, elsewhere = tmp_path / "repo", tmp_path / "out"
    (root / "docker").mkdir(parents=True)
    (root / "docker" / "Dockerfile").write_text("FROM scratch\n")
    elsewhere.mkdir()
    monkeypatch.chdir(root)
    output = elsewhere / "c.yaml"
    assert main(["cluster", "--workers", "a:2222", "--format", "compose", "--output", str(output)]) == 0
    assert capsys.readouterr().err == ""
    for service in yaml.safe_load(output.read_text())["services"].values():
        context = os.path.normpath(os.path.join(elsewhere, service["build"]["context"]))
        assert os.path.isfile(os.path.join(context, service["build"]["dockerfile"]))
    monkeypatch.chdir(elsewhere)  # no docker/Dockerfile here: said, not refused
    assert main(["cluster", "--workers", "a:2222", "--format", "compose"]) == 0
    err = capsys.readouterr().err
    assert "warning" in err and "docker/Dockerfile" in err and str(elsewhere) in err


@pytest.mark.parametrize("path", sorted(COMPOSE_FILES))
def test_committed_compose_files_are_exactly_the_generator_output(path):
    description = JobDescription.from_flags(**COMPOSE_FILES[path])
    expected = manifests.render(description, format="compose", output=path)
    committed = (REPO / path).read_text()
    assert committed == expected, (
        f"{path} drifted from the generator; regenerate it from the repository root with:\n"
        f"  {manifests.command_line(description, format='compose', output=path)}"
    )


@pytest.mark.parametrize("path", sorted(COMPOSE_FILES))
def test_committed_compose_header_command_regenerates_the_file(path, tmp_path, monkeypatch):
    committed = (REPO / path).read_text()
    command = committed.splitlines()[1].lstrip("#").strip()
    argv = shlex.split(command)
    assert argv[:2] == ["tfdist", "cluster"] and argv[-2:] == ["--output", path]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "docker").mkdir()
    assert main(argv[1:]) == 0
    assert (tmp_path / path).read_text() == committed


def test_committed_compose_files_describe_the_documented_jobs():
    mwms = yaml.safe_load((REPO / "docker/compose-mwms.yaml").read_text())
    assert list(mwms["services"]) == ["worker-0", "worker-1"]
    ps = yaml.safe_load((REPO / "docker/compose-ps.yaml").read_text())
    assert list(ps["services"]) == ["chief", "worker-0", "worker-1", "ps-0"]
    assert mwms["name"] != ps["name"]  # separate projects, so separate `runs` volumes


# --- Kubernetes --------------------------------------------------------------------------
def test_k8s_pods_resolve_through_the_headless_service_and_each_task_is_a_job():
    description = _describe("full")
    docs = list(yaml.safe_load_all(manifests.render(description, format="k8s")))
    (service,) = [d for d in docs if d["kind"] == "Service"]
    (claim,) = [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    jobs = [d for d in docs if d["kind"] == "Job"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["metadata"]["namespace"] == "team-a"
    assert [j["metadata"]["name"] for j in jobs] == [
        f"mnist-{role}-{i}" for role, i, _ in description.tasks()
    ]
    for job in jobs:
        assert job["apiVersion"] == "batch/v1" and job["spec"]["backoffLimit"] == manifests.K8S_BACKOFF_LIMIT
        # Bad input fails the Job at once; an eviction gets a new pod without counting; 75 and 76 retry.
        rules = job["spec"]["podFailurePolicy"]["rules"]
        assert rules[0] == {"action": "FailJob",
                            "onExitCodes": {"containerName": "tensorflow", "operator": "In", "values": [2]}}
        assert rules[1] == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}
        template = job["spec"]["template"]
        labels = template["metadata"]["labels"]
        assert all(labels[k] == v for k, v in service["spec"]["selector"].items())
        spec = template["spec"]
        assert spec["restartPolicy"] == "Never" and spec["terminationGracePeriodSeconds"] == manifests.GRACE_SECONDS
        assert spec["subdomain"] == service["metadata"]["name"] and spec["hostname"] == job["metadata"]["name"]
        (container,) = spec["containers"]
        (variable,) = container["env"]
        cluster = parse_tf_config(variable["value"])
        host, _, port = cluster.task_address.rpartition(":")
        assert host == f"{spec['hostname']}.{spec['subdomain']}.{job['metadata']['namespace']}.svc"
        assert container["ports"][0]["containerPort"] == int(port)
        assert {"name": "runs", "mountPath": "/runs"} in container["volumeMounts"]
        assert spec["volumes"][0]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]


def test_gpus_are_asked_for_by_every_task_that_computes_and_by_no_ps():
    description = JobDescription.from_flags(**DESCRIPTIONS["full"], gpus=2)
    docs = list(yaml.safe_load_all(manifests.render(description, format="k8s")))
    for job in (d for d in docs if d["kind"] == "Job"):
        (container,) = job["spec"]["template"]["spec"]["containers"]
        role = job["metadata"]["labels"]["tfdist/role"]
        assert container.get("resources") == (None if role == "ps" else {"limits": {"nvidia.com/gpu": 2}})
    (job,) = [d for d in yaml.safe_load_all(manifests.render(description, format="tfjob")) if d["kind"] == "TFJob"]
    for replica_type, replica in job["spec"]["tfReplicaSpecs"].items():
        (container,) = replica["template"]["spec"]["containers"]
        assert ("resources" in container) == (replica_type != "PS")
    compose = yaml.safe_load(manifests.render(description, format="compose"))["services"]
    assert compose["worker-0"]["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "count": 2, "capabilities": ["gpu"]}]
    assert "deploy" not in compose["ps-0"]
    assert all(s["build"]["args"] == {"BASE": manifests.GPU_BASE_IMAGE} for s in compose.values())
    assert "--gpus 2" in manifests.command_line(description, format="compose")
    assert "resources" not in str(yaml.safe_load_all(manifests.render(_describe("full"), format="k8s")))
    with pytest.raises(ClusterConfigError, match=r"invalid --gpus; received -1\. Fix: give the GPUs of each task"):
        JobDescription.from_flags(workers="h:1", gpus=-1)
    dockerfile = (REPO / manifests.DOCKERFILE).read_text()
    assert "ARG BASE=" in dockerfile and "FROM ${BASE}" in dockerfile


def test_the_claim_takes_the_storage_class_and_size_given():
    description = JobDescription.from_flags(**DESCRIPTIONS["mwms"], storage_class="nfs-client", storage_size="500Gi")
    for format in ("k8s", "tfjob"):
        text = manifests.render(description, format=format)
        (claim,) = [d for d in yaml.safe_load_all(text) if d["kind"] == "PersistentVolumeClaim"]
        assert claim["spec"]["storageClassName"] == "nfs-client"
        assert claim["spec"]["resources"]["requests"]["storage"] == "500Gi"
        assert "--storage-class nfs-client --storage-size 500Gi" in text.splitlines()[1]
    (claim,) = [d for d in yaml.safe_load_all(manifests.render(_describe("mwms"), format="k8s"))
                if d["kind"] == "PersistentVolumeClaim"]
    assert "storageClassName" not in claim["spec"] and claim["spec"]["resources"]["requests"]["storage"] == "10Gi"
    for flags, message in ((dict(storage_class="NFS_Client"), "invalid --storage-class; received 'NFS_Client'"),
                           (dict(storage_size="10 GB"), "invalid --storage-size; received '10 GB'. Fix: give a")):
        with pytest.raises(ClusterConfigError, match=re.escape(message)):
            JobDescription.from_flags(workers="h:1", **flags)



def test_grace_and_restarts_reach_every_deployment_and_its_notes():
    # A checkpoint that takes longer to write than the fixed 120 s would be cut by SIGKILL.
    description = JobDescription.from_flags(**DESCRIPTIONS["mwms"], grace_seconds=900, restarts=2)
    compose = yaml.safe_load(manifests.render(description, format="compose"))
    assert {s["stop_grace_period"] for s in compose["services"].values()} == {"900s"}
    assert {s["restart"] for s in compose["services"].values()} == {"on-failure:2"}
    k8s_text = manifests.render(description, format="k8s")
    jobs = [d for d in yaml.safe_load_all(k8s_text) if d["kind"] == "Job"]
    assert jobs and all(j["spec"]["backoffLimit"] == 2 for j in jobs)
    assert all(j["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 900 for j in jobs)
    assert "up to 2\n" in k8s_text and "--grace 900 --restarts 2" in k8s_text.splitlines()[1]
    tfjob_text = manifests.render(description, format="tfjob")
    (job,) = [d for d in yaml.safe_load_all(tfjob_text) if d["kind"] == "TFJob"]
    assert job["spec"]["runPolicy"] == {"backoffLimit": 2} and "It fails after 2 restarts" in tfjob_text
    assert all(r["template"]["spec"]["terminationGracePeriodSeconds"] == 900 for r in job["spec"]["tfReplicaSpecs"].values())
    # Docker reads on-failure:0 as no limit: no restarts is "no".
    never = JobDescription.from_flags(workers="h:1", restarts=0)
    assert yaml.safe_load(manifests.render(never, format="compose"))["services"]["worker-0"]["restart"] == "no"
    for flags, message in ((dict(grace_seconds=0), "invalid --grace; received 0. Fix: give the seconds"),
                           (dict(grace_seconds=99999999999), "invalid --grace; received 99999999999. Fix: give the "
                                                             "seconds a stopped task has to save before it is killed, "
                                                             "from 1 to 86400"),
                           (dict(restarts=-1), "invalid --restarts; received -1. Fix: give how many"),
                           (dict(grace_seconds=True), "invalid --grace; received True")):
        with pytest.raises(ClusterConfigError, match=re.escape(message)):
            JobDescription.from_flags(workers="h:1", **flags)

def test_k8s_service_lists_every_distinct_port():
    description = _describe("one-host")
    docs = list(yaml.safe_load_all(manifests.render(description, format="k8s")))
    ports = [p["port"] for p in docs[0]["spec"]["ports"]]
    assert ports == [12344, 12345, 12346]


# --- Kubeflow TFJob ----------------------------------------------------------------------
def _kubeflow_cluster(job: dict) -> dict[str, list[str]]:
    """What Kubeflow's operator derives from a TFJob: lowercase roles, <job>-<role>-<i>.<ns>.svc:<port>."""
    name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
    cluster = {}
    for replica_type, replica in job["spec"]["tfReplicaSpecs"].items():
        (container,) = [c for c in replica["template"]["spec"]["containers"] if c["name"] == "tensorflow"]
        (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == "tfjob-port"]
        role = replica_type.lower()
        cluster[role] = [f"{name}-{role}-{i}.{namespace}.svc:{port}" for i in range(replica["replicas"])]
    return cluster


@pytest.mark.parametrize("name", ["mwms", "ps", "full"])
def test_tfjob_annotation_is_what_kubeflow_writes(name):
    description = _describe(name)
    docs = list(yaml.safe_load_all(manifests.render(description, format="tfjob")))
    (job,) = [d for d in docs if d["kind"] == "TFJob"]
    assert job["apiVersion"] == "kubeflow.org/v1"
    replicas = job["spec"]["tfReplicaSpecs"]
    assert set(replicas) <= {"Chief", "Worker", "PS", "Evaluator"}
    assert all(r["restartPolicy"] == "OnFailure" for r in replicas.values())
    # Bounded: a bad input's exit 2 would otherwise restart for ever (Kubeflow's ExitCode policy fails on 75 and 76).
    assert job["spec"]["runPolicy"] == {"backoffLimit": manifests.TFJOB_BACKOFF_LIMIT}
    assert all(r["template"]["spec"]["terminationGracePeriodSeconds"] == manifests.GRACE_SECONDS
               for r in replicas.values())
    cluster = _kubeflow_cluster(job)
    configs = manifests.tfjob_tf_configs(description)
    assert configs == json.loads(job["metadata"]["annotations"]["tfdist/tf-configs"])
    for key, config in configs.items():
        assert config["cluster"] == cluster
        assert config["environment"] == "cloud"
        assert parse_tf_config(config).task_name == key


def test_tfjob_of_one_task_gets_no_tf_config():
    description = JobDescription.from_flags(workers="host1:2222", image=IMAGE)
    assert manifests.tfjob_tf_configs(description) == {}
    assert manifests.read_tf_configs(manifests.render(description, format="tfjob"), format="tfjob") == {}


# --- the command line --------------------------------------------------------------------
@pytest.mark.parametrize("format", FORMATS)
def test_cli_prints_the_rendered_document(format, capsys):
    flags = DESCRIPTIONS["ps"]
    argv = [f"--{k}={v}" for k, v in flags.items()]
    assert main(["cluster", *argv, "--format", format]) == 0
    out = capsys.readouterr().out
    assert out == manifests.render(JobDescription.from_flags(**flags), format=format)


@pytest.mark.parametrize(
    "argv, fragments",
    [
        (["--workers", ""], ["--workers", "''", "Fix:"]),
        ([], ["--workers", "Fix:"]),
        (["--workers", "host1,host2:2222"], ["--workers", "'host1'", "host:port"]),
        (["--workers", "host1:2222,host1:2222"], ["--workers", "'host1:2222'", "already used"]),
        (["--workers", "h:1", "--chief", "h:1"], ["--workers", "'h:1'", "already used by chief:0"]),
        (["--workers", "h:1", "--format", "xml"], ["--format", "'xml'", "env, json, compose, k8s, tfjob"]),
        (["--workers", "h:1", "--ps", "h:2"], ["--ps", "--chief", "'h:2'", "add --chief"]),
        (["--workers", "h:1", "--chief", "a:1,b:2"], ["--chief", "'a:1,b:2'", "one host:port"]),
        (["--workers", "h:70000"], ["--workers", "'h:70000'", "between 1 and 65535"]),
        (["--workers", "h:1", "--name", "My_Job"], ["--name", "'My_Job'", "lowercase"]),
        (["--workers", "h:1,h:2", "--format", "tfjob", "--image", IMAGE], ["--workers", "'h:1,h:2'", "same port"]),
        (["--workers", "h:1", "--format", "k8s"], ["--image for --format k8s", "'tfdist:latest'", "push it"]),
        (["--workers", "2", "--format", "k8s"], ["--workers", "'2'", "not a count: e.g. --workers w0:2222,w1:2222"]),
        *((["--workers", "h:1", f"--image={image}"], ["--image", repr(image), "[registry/]repository[:tag]"])
          for image in ("UPPER/img:1", "Tfdist:latest", "img:", "img::1", "img:tag:tag", "img:tag!", "img:$(rm)",
                        "img@sha256:xyz", "-img", "img/", "a b", "")),
    ],
)
def test_bad_input_is_one_line_naming_the_flag_the_value_and_the_fix(argv, fragments, capsys):
    assert main(["cluster", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err
    assert captured.err.startswith("tfdist: error: ") and "Fix:" in captured.err
    for fragment in fragments:
        assert fragment in captured.err


@pytest.mark.parametrize("argv, message", [
    (["--grace", "0"], "argument --grace: expected a positive integer, received '0'"),
    (["--restarts", "-1"], "argument --restarts: expected a whole number, 0 or more; received '-1'"),
])
def test_bad_grace_or_restarts_is_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["cluster", "--workers", "h:1", *argv])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err

def test_ps_without_chief_is_refused_like_tf_config_refuses_it():
    with pytest.raises(ClusterConfigError, match="--chief"):
        JobDescription(workers=("h:1",), ps=("h:2",))
    with pytest.raises(ClusterConfigError, match="chief"):
        parse_tf_config({"cluster": {"worker": ["h:1"], "ps": ["h:2"]}, "task": {"type": "worker", "index": 0}})


def test_description_is_frozen_keyword_only_and_rejects_a_bare_string():
    description = _describe("mwms")
    with pytest.raises(AttributeError):
        description.workers = ()
    with pytest.raises(TypeError):
        JobDescription(("h:1",))  # keyword-only
    with pytest.raises(ClusterConfigError, match="from_flags"):
        JobDescription(workers="h:1,h:2")


def test_output_flag_writes_the_file_it_names(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["cluster", "--workers", "a:2222", "--format", "k8s", "--image", IMAGE, "--output", "job.yaml"]) == 0
    assert capsys.readouterr().out == ""
    expected = manifests.render(JobDescription.from_flags(workers="a:2222", image=IMAGE), format="k8s", output="job.yaml")
    assert (tmp_path / "job.yaml").read_text() == expected
    assert "--output job.yaml" in expected.splitlines()[1]
    assert main(["cluster", "--workers", "a:2222", "--output", str(tmp_path / "missing" / "x")]) == 2
    assert "--output" in capsys.readouterr().err


def test_output_replaces_only_a_file_tfdist_cluster_wrote(tmp_path, monkeypatch, capsys):
    # It silently replaced any file, docker/Dockerfile included, with the document.
    monkeypatch.chdir(tmp_path)
    notes = tmp_path / "notes.yaml"
    notes.write_text("my notes\n")
    (tmp_path / "run.env").write_text("export A=1\n")
    for argv in (["--format", "compose", "--output", "notes.yaml"], ["--output", "run.env"]):
        assert main(["cluster", "--workers", "a:2222", *argv]) == 2
        err = capsys.readouterr().err
        assert "--output names a file tfdist cluster did not write" in err and err.count("\n") == 1
    assert notes.read_text() == "my notes\n" and (tmp_path / "run.env").read_text() == "export A=1\n"
    for fmt, name in (("compose", "Dockerfile"), ("compose", "c.json"), ("json", "c.yaml")):
        assert main(["cluster", "--workers", "a:2222", "--format", fmt, "--output", name]) == 2
        assert f"--output does not name a {fmt} file; received --output='{name}'" in capsys.readouterr().err
    # What it wrote itself, it regenerates, JSON (no header) included.
    for fmt, name in (("compose", "c.yaml"), ("json", "c.json"), ("env", "run2.env")):
        for workers in ("a:2222", "a:2222,b:2222"):
            assert main(["cluster", "--workers", workers, "--format", fmt, "--output", name]) == 0
        assert "b:2222" in (tmp_path / name).read_text()


def test_a_deployment_flag_the_format_does_not_use_is_named_in_a_warning(capsys):
    # --gpus with --format env was accepted in silence: a user may think GPUs were asked for.
    assert main(["cluster", "--workers", "a:2222", "--gpus", "1", "--image", "r/x:1"]) == 0
    assert "warning: --image, --gpus change nothing in --format env" in capsys.readouterr().err
    assert main(["cluster", "--workers", "a:2222", "--namespace", "ns", "--format", "compose"]) == 0
    assert "warning: --namespace changes nothing in --format compose" in capsys.readouterr().err
    assert main(["cluster", "--workers", "a:2222", "--gpus", "1", "--format", "compose"]) == 0
    assert "warning" not in capsys.readouterr().err
    assert main(["cluster", "--workers", "a:2222", "--grace", "600", "--restarts", "1"]) == 0
    assert "warning: --grace, --restarts change nothing in --format env" in capsys.readouterr().err


def test_cluster_command_does_not_import_tensorflow():
    code = (
        "import sys; from tfdist.cli import cluster; from tfdist import manifests; "
        "manifests.render(manifests.JobDescription.from_flags(workers='a:1,b:1', image='r.io/t:1'), format='k8s'); "
        "sys.exit('tensorflow' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
