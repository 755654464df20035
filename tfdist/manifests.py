"""Deployment files from one job description: TF_CONFIG lines, JSON, docker compose, Kubernetes, TFJob.

Every format takes its TF_CONFIGs from one validated ``ClusterSpec``, so the roles, the
task order and the ports agree across formats; only the host names follow each format's
naming scheme:

- ``env``, ``json``: the hosts as given on the command line;
- ``compose``: the service names (``chief``, ``worker-0``, ``ps-0``, ``evaluator``), which
  compose's network resolves;
- ``k8s``: ``<name>-<role>-<i>.<name>.<namespace>.svc``, resolved through the headless Service;
- ``tfjob``: ``<name>-<role>-<i>.<namespace>.svc``, what Kubeflow's operator writes itself.

Pure Python and PyYAML; nothing here imports TensorFlow.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
from typing import Any, Iterator

import yaml

from tfdist import env
from tfdist.cluster import ADDRESS, CHIEF, EVALUATOR, PS, ROLES, WORKER, ClusterSpec, check_address, config_error

FORMATS = ("env", "json", "compose", "k8s", "tfjob")
DEFAULT_IMAGE = "tfdist:latest"
DOCKERFILE = "docker/Dockerfile"  # relative to the repository root
DEFAULT_COMMAND = "tfdist train --output-dir /runs --summary-json /runs/summary.json"
DEFAULT_NAME = "tfdist"
DEFAULT_NAMESPACE = "default"
RUNS_VOLUME, RUNS_MOUNT = "runs", "/runs"
"""Every task mounts one shared volume here: workers restore from the chief's checkpoints."""
DEFAULT_STORAGE_SIZE = "10Gi"
GPU_BASE_IMAGE = "tensorflow/tensorflow:2.21.0-gpu"
"""docker/Dockerfile's ``BASE`` for compose files with ``--gpus``."""
GRACE_SECONDS = 120
"""How long a stopped task has between SIGTERM and SIGKILL (Kubernetes' default is 30 s, compose's
10 s): tfdist saves at the end of the current step on SIGTERM, which must fit in it."""
COMPOSE_RESTARTS = 3
"""Restarts of a compose service after a failed exit (a preemption's 75, a lost peer's 76, a
crash); bounded, so that bad input's exit 2 stops. Docker does not restart a container that
`docker compose stop` stopped, nor one that exited 0."""
K8S_BACKOFF_LIMIT = 10
"""Failed pods a task's Job replaces before it fails (``--format k8s``)."""
TFJOB_BACKOFF_LIMIT = 10
"""Restarts a TFJob allows before it fails: every restart counts (a preemption's exit 75, a lost
peer's 76), and without a limit a bad input's exit 2 would restart for ever. Kubeflow's
``ExitCode`` policy cannot tell them apart: it takes 75 and 76 for permanent failures."""

TF_CONFIGS_ANNOTATION = "tfdist/tf-configs"
"""TFJob annotation listing the TF_CONFIG Kubeflow writes into each task."""

_WHERE = "tfdist cluster"
_FLAGS = {CHIEF: "--chief", WORKER: "--workers", PS: "--ps", EVALUATOR: "--evaluator"}
_SCHEMES = {"env": "given", "json": "given", "compose": "compose", "k8s": "k8s", "tfjob": "tfjob"}
_TFJOB_REPLICAS = {CHIEF: "Chief", WORKER: "Worker", PS: "PS", EVALUATOR: "Evaluator"}
# Kubeflow reads a task's port from the container named "tensorflow", port named "tfjob-port".
_TFJOB_CONTAINER, _TFJOB_PORT = "tensorflow", "tfjob-port"
_RFC1035_LABEL = r"[a-z]([-a-z0-9]*[a-z0-9])?"  # job names: Kubeflow and pod hostnames need it
_RFC1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"  # namespaces
_MAX_LABEL = 63
# An image reference as Docker and Kubernetes parse it (github.com/distribution/reference):
# [registry/]path[:tag][@digest]. The registry is named only when the first part looks like a
# host (a '.', a port, or localhost); the path is lowercase.
_IMAGE_HOST_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_IMAGE_REGISTRY = (rf"(?:{_IMAGE_HOST_PART}(?:\.{_IMAGE_HOST_PART})+(?::[0-9]+)?|{_IMAGE_HOST_PART}:[0-9]+"
                   rf"|localhost|\[[0-9a-fA-F:]+\](?::[0-9]+)?)")
_IMAGE_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_REFERENCE = (rf"(?:{_IMAGE_REGISTRY}/)?{_IMAGE_PATH_PART}(?:/{_IMAGE_PATH_PART})*"
                    r"(?::[\w][\w.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?")
_MAX_IMAGE_NAME = 255
_QUANTITY = r"[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?"  # a storage request: no sign, no exponent


def split_addresses(raw: str | None, *, flag: str) -> tuple[str, ...]:
    """Splits a comma-separated flag value (``host1:2222,host2:2222``); None gives ()."""
    if raw is None or not raw.strip():
        return ()
    addresses = tuple(part.strip() for part in raw.split(","))
    if "" in addresses:
        raise config_error(_WHERE, flag, raw, "separate the host:port addresses by single commas, with none empty.")
    if len(addresses) == 1 and addresses[0].isdigit():  # tfdist launch --workers 2 takes a count
        count = int(addresses[0])
        example = ",".join(f"w{i}:2222" for i in range(min(count, 3))) + (",..." if count > 3 else "")
        raise config_error(
            _WHERE, flag, raw, f"give one host:port per task, not a count: e.g. {flag} {example or 'w0:2222'} "
            "(compose, k8s and tfjob name the tasks themselves and keep only the port).",
        )
    return addresses


@dataclasses.dataclass(frozen=True, kw_only=True)
class JobDescription:
    """One distributed job: the address of every task, and what every task runs.

    The fields mirror the flags of ``tfdist cluster``. Validation reuses ClusterSpec's
    rules, so a description this class accepts is a TF_CONFIG that ``detect`` accepts.
    """

    workers: tuple[str, ...]
    chief: str | None = None
    ps: tuple[str, ...] = ()
    evaluator: str | None = None
    image: str = DEFAULT_IMAGE
    command: str = DEFAULT_COMMAND
    name: str = DEFAULT_NAME
    namespace: str = DEFAULT_NAMESPACE
    gpus: int = 0
    storage_class: str | None = None
    storage_size: str = DEFAULT_STORAGE_SIZE

    def __post_init__(self):
        for field, flag in (("workers", "--workers"), ("ps", "--ps")):
            value = getattr(self, field)
            if isinstance(value, str):
                raise config_error(_WHERE, flag, value, "give a list of host:port; split a comma-separated flag "
                            "with JobDescription.from_flags.")
            object.__setattr__(self, field, tuple(value))
        if not self.workers:
            raise config_error(_WHERE, "--workers", "", "list at least one worker, e.g. --workers host1:2222,host2:2222.")
        self._check_addresses()
        if self.ps and self.chief is None:
            raise config_error(
                _WHERE, "--ps without --chief", ",".join(self.ps),
                "a parameter-server job needs a chief to coordinate it; add --chief HOST:PORT.",
            )
        self._check_deployment()
        self.cluster_spec()  # the TF_CONFIG rules themselves, exactly as `detect` applies them

    @classmethod
    def from_flags(
        cls,
        *,
        workers: str | None,
        chief: str | None = None,
        ps: str | None = None,
        evaluator: str | None = None,
        image: str = DEFAULT_IMAGE,
        command: str = DEFAULT_COMMAND,
        name: str = DEFAULT_NAME,
        namespace: str = DEFAULT_NAMESPACE,
        gpus: int = 0,
        storage_class: str | None = None,
        storage_size: str = DEFAULT_STORAGE_SIZE,
    ) -> JobDescription:
        """A description from the flag values of ``tfdist cluster`` (comma-separated lists)."""
        return cls(
            workers=split_addresses(workers, flag="--workers"),
            chief=chief,
            ps=split_addresses(ps, flag="--ps"),
            evaluator=evaluator,
            image=image,
            command=command,
            name=name,
            namespace=namespace,
            gpus=gpus,
            storage_class=storage_class,
            storage_size=storage_size,
        )

    # --- validation -------------------------------------------------------------------
    def _check_addresses(self) -> None:
        seen: dict[str, str] = {}
        for role, index, address in self.tasks():
            flag = _FLAGS[role]
            if role in (CHIEF, EVALUATOR) and isinstance(address, str) and "," in address:
                raise config_error(_WHERE, flag, address, f"give one host:port; a job has a single {role}.")
            check_address(address, where=_WHERE, field=f"address in {flag}")
            if address in seen:
                raise config_error(
                    _WHERE, f"address in {flag}", address,
                    f"it is already used by {seen[address]}; give every task its own host:port.",
                )
            seen[address] = f"{role}:{index}"

    def _check_deployment(self) -> None:
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or self.gpus < 0:
            raise config_error(_WHERE, "--gpus", self.gpus, "give the GPUs of each task as a whole number, 0 or more.")
        if not _is_image(self.image):
            raise config_error(
                _WHERE, "--image", self.image,
                "name an image as [registry/]repository[:tag][@sha256:digest], the repository in "
                "lowercase letters, digits and . _ -, e.g. tfdist:latest or gcr.io/my-project/tfdist:1.0.",
            )
        try:
            argv = shlex.split(self.command)
        except ValueError as e:
            raise config_error(_WHERE, "--command", self.command, f"close the quotes ({e}).") from None
        if not argv:
            raise config_error(_WHERE, "--command", self.command, f"give what every task runs, e.g. {DEFAULT_COMMAND!r}.")
        longest = max(len(_pod_name(self.name, role, index)) for role, index, _ in self.tasks())
        if not _is_label(self.name, _RFC1035_LABEL) or longest > _MAX_LABEL:
            raise config_error(
                _WHERE, "--name", self.name,
                "use lowercase letters, digits and '-', starting with a letter, short enough that "
                f"'<name>-<role>-<index>' fits in {_MAX_LABEL} characters, e.g. mnist-1.",
            )
        if not _is_label(self.namespace, _RFC1123_LABEL) or len(self.namespace) > _MAX_LABEL:
            raise config_error(_WHERE, "--namespace", self.namespace, "use a Kubernetes namespace name, e.g. default.")
        if self.storage_class is not None and not (
                re.fullmatch(rf"{_RFC1123_LABEL}(\.{_RFC1123_LABEL})*", self.storage_class)
                and len(self.storage_class) <= 253):
            raise config_error(_WHERE, "--storage-class", self.storage_class,
                               "name a StorageClass of the cluster (kubectl get storageclass), e.g. nfs-client.")
        if not isinstance(self.storage_size, str) or not re.fullmatch(_QUANTITY, self.storage_size):
            raise config_error(_WHERE, "--storage-size", self.storage_size,
                               "give a Kubernetes quantity such as 10Gi, 500Gi or 2Ti.")

    # --- the cluster ------------------------------------------------------------------
    def tasks(self) -> list[tuple[str, int, str]]:
        """Every task as (role, index, address as given): chief, workers, ps, evaluator."""
        given = {CHIEF: (self.chief,) if self.chief is not None else (), WORKER: self.workers,
                 PS: self.ps, EVALUATOR: (self.evaluator,) if self.evaluator is not None else ()}
        return [(role, i, address) for role in ROLES for i, address in enumerate(given[role])]

    def cluster_spec(self, *, scheme: str = "given") -> ClusterSpec:
        """The validated cluster with the host names of ``scheme`` (given, compose, k8s, tfjob)."""
        jobs: dict[str, list[str]] = {}
        for role, index, address in self.tasks():
            port = ADDRESS.match(address).group("port")
            jobs.setdefault(role, []).append(f"{self._host(scheme, role, index, address)}:{port}")
        first = CHIEF if CHIEF in jobs else WORKER
        return ClusterSpec(jobs=jobs, task_type=first, task_index=0, source=_WHERE)

    def _host(self, scheme: str, role: str, index: int, address: str) -> str:
        if scheme == "given":
            return ADDRESS.match(address).group("host")
        if scheme == "compose":
            return service_name(role, index)
        if scheme == "k8s":
            return f"{_pod_name(self.name, role, index)}.{self.name}.{self.namespace}.svc"
        if scheme == "tfjob":
            return f"{_pod_name(self.name, role, index)}.{self.namespace}.svc"
        raise ValueError(f"unknown host scheme {scheme!r}")


def service_name(role: str, index: int) -> str:
    """The compose service (and host name) of a task: ``chief``, ``worker-0``, ``ps-1``..."""
    return role if role in (CHIEF, EVALUATOR) else f"{role}-{index}"


def _pod_name(name: str, role: str, index: int) -> str:
    return f"{name}-{role}-{index}"  # Kubeflow's naming, used for the k8s Jobs too


def _is_image(value: Any) -> bool:
    if not _is_label(value, _IMAGE_REFERENCE):
        return False
    name = value.split("@", 1)[0]
    tag = re.search(r":[^/]*$", name)  # after the last '/': a registry's port comes before it
    return len(name[: tag.start()] if tag else name) <= _MAX_IMAGE_NAME


def _is_label(value: Any, pattern: str) -> bool:
    return isinstance(value, str) and re.fullmatch(pattern, value) is not None


def _check_format(format: str) -> None:
    if format not in FORMATS:
        raise config_error(_WHERE, "--format", format, f"use one of {', '.join(FORMATS)}.")


def _key(config: dict) -> str:
    return f"{config['task']['type']}:{config['task']['index']}"


# --- TF_CONFIGs -------------------------------------------------------------------------
def tf_configs(description: JobDescription, *, format: str) -> dict[str, dict]:
    """The TF_CONFIG every task gets in ``format``, keyed "role:index", in task order."""
    _check_format(format)
    if format == "tfjob":
        return tfjob_tf_configs(description)
    spec = description.cluster_spec(scheme=_SCHEMES[format])
    return {f"{role}:{i}": spec.to_tf_config(role, i) for role, i, _ in spec.tasks()}


def tfjob_tf_configs(description: JobDescription) -> dict[str, dict]:
    """The TF_CONFIG Kubeflow's training operator writes into each task of the TFJob.

    Roles are lowercased replica types, addresses ``<job>-<role>-<i>.<namespace>.svc:<port>``,
    ``environment`` is ``"cloud"``, and the evaluator is listed in the cluster (the
    training-operator does; the former tf-operator left it out). A job of a single task
    gets no TF_CONFIG at all: the result is empty, and tfdist runs the task as a local job.
    """
    _check_tfjob_ports(description)
    spec = description.cluster_spec(scheme="tfjob")
    tasks = spec.tasks()
    if len(tasks) == 1:
        return {}
    return {f"{role}:{i}": {**spec.to_tf_config(role, i), "environment": "cloud"} for role, i, _ in tasks}


def _check_tfjob_ports(description: JobDescription) -> None:
    ports: dict[str, set[str]] = {}
    for role, _, address in description.tasks():
        ports.setdefault(role, set()).add(ADDRESS.match(address).group("port"))
    for role, found in ports.items():
        if len(found) > 1:
            given = description.workers if role == WORKER else description.ps
            raise config_error(
                _WHERE, f"{_FLAGS[role]} for --format tfjob", ",".join(given),
                f"Kubeflow gives every task of a role one port; use the same port in all of {_FLAGS[role]}.",
            )


# --- rendering --------------------------------------------------------------------------
def command_line(description: JobDescription, *, format: str, output: str | None = None) -> str:
    """The ``tfdist cluster`` command that prints (or, with ``output``, writes) this document."""
    argv = ["tfdist", "cluster"]
    if description.chief is not None:
        argv += ["--chief", description.chief]
    argv += ["--workers", ",".join(description.workers)]
    if description.ps:
        argv += ["--ps", ",".join(description.ps)]
    if description.evaluator is not None:
        argv += ["--evaluator", description.evaluator]
    argv += ["--format", format]
    for flag, value, default in (
        ("--image", description.image, DEFAULT_IMAGE),
        ("--command", description.command, DEFAULT_COMMAND),
        ("--name", description.name, DEFAULT_NAME),
        ("--namespace", description.namespace, DEFAULT_NAMESPACE),
        ("--gpus", str(description.gpus), "0"),
        ("--storage-class", description.storage_class, None),
        ("--storage-size", description.storage_size, DEFAULT_STORAGE_SIZE),
    ):
        if value != default:
            argv += [flag, value]
    if output is not None:
        argv += ["--output", output]
    return shlex.join(argv)


def render(description: JobDescription, *, format: str, output: str | None = None) -> str:
    """The document of ``format`` for ``description``; ``output`` only names the file in its header."""
    _check_format(format)
    if format in ("k8s", "tfjob") and description.image == DEFAULT_IMAGE:
        raise config_error(
            _WHERE, f"--image for --format {format}", description.image,
            "a cluster pulls its image from a registry, where there is no tfdist:latest: build "
            f"{DOCKERFILE}, push it, and pass its name, e.g. --image registry.example.com/ml/tfdist:1.",
        )
    if format == "json":  # JSON has no comments, hence no header
        return _json_lines(tf_configs(description, format="json"))
    header = (
        "# Generated by `tfdist cluster`: change the flags and regenerate rather than editing this file.\n"
        f"#   {command_line(description, format=format, output=output)}\n"
    )
    if format == "env":
        return header + _env(description)
    body = {"compose": _compose, "k8s": _k8s, "tfjob": _tfjob}[format](description, output=output)
    return header + body


def _json_lines(configs: dict[str, dict]) -> str:
    """A JSON object of TF_CONFIGs, one task a line, each TF_CONFIG as TensorFlow reads it."""
    lines = [f"  {json.dumps(key)}: {env.tf_config_value(config)}" for key, config in configs.items()]
    return "{\n" + ",\n".join(lines) + ("\n" if lines else "") + "}\n"


def _env(description: JobDescription) -> str:
    given = {(role, i): address for role, i, address in description.tasks()}
    lines = ["# Run the line of each task in its shell on its host, then the training command there."]
    for key, config in tf_configs(description, format="env").items():
        role, index = config["task"]["type"], config["task"]["index"]
        value = shlex.quote(env.tf_config_value(config))
        lines.append(f"export {env.TF_CONFIG}={value}  # {key} at {given[role, index]}")
    return "\n".join(lines) + "\n"


def _argv(description: JobDescription) -> list[str]:
    return shlex.split(description.command)


def _compose(description: JobDescription, *, output: str | None) -> str:
    services = {}
    for config in tf_configs(description, format="compose").values():
        role = config["task"]["type"]
        name = service_name(role, config["task"]["index"])
        build: dict[str, Any] = {"context": _build_context(output), "dockerfile": DOCKERFILE}
        if description.gpus:  # docker/Dockerfile's BASE: TensorFlow's image with CUDA
            build["args"] = {"BASE": GPU_BASE_IMAGE}
        services[name] = {
            "build": build,
            "image": description.image,
            "hostname": name,
            "command": _argv(description),
            "environment": {env.TF_CONFIG: env.tf_config_value(config)},
            "volumes": [f"{RUNS_VOLUME}:{RUNS_MOUNT}"],
            "stop_grace_period": f"{GRACE_SECONDS}s",
            "restart": f"on-failure:{COMPOSE_RESTARTS}",
        }
        gpus = _gpus(description, role)
        if gpus:
            services[name]["deploy"] = {"resources": {"reservations": {"devices": [
                {"driver": "nvidia", "count": gpus, "capabilities": ["gpu"]}]}}}
    document = {"name": description.name, "services": services, "volumes": {RUNS_VOLUME: {}}}
    if output is None:
        note = (f"# Save this file in the repository root (the folder holding {DOCKERFILE}), its build context,\n"
                "# and start it there: docker compose -f <this file> up --build\n")
    else:
        note = (f"# Builds {DOCKERFILE} with the folder `tfdist cluster` ran in (the repository root) as context.\n"
                f"# Start from there: docker compose -f {output} up --build\n")
    return note + _yaml(document)


def _build_context(output: str | None) -> str:
    """The folder ``tfdist cluster`` runs in (the repository root), relative to the folder of
    the compose file ``output`` (stdout: the file is to be saved there), as compose reads it."""
    if output is None:
        return "."
    return os.path.relpath(".", os.path.dirname(output) or ".").replace(os.sep, "/")


def _labels(description: JobDescription, role: str | None = None, index: int | None = None) -> dict:
    labels = {"app.kubernetes.io/name": "tfdist", "tfdist/job": description.name}
    if role is not None:
        labels.update({"tfdist/role": role, "tfdist/index": str(index)})
    return labels


def _claim(description: JobDescription) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": f"{description.name}-{RUNS_VOLUME}", "namespace": description.namespace,
                     "labels": _labels(description)},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": description.storage_size}},
                 **({"storageClassName": description.storage_class} if description.storage_class else {})},
    }


def _gpus(description: JobDescription, role: str) -> int:
    """The GPUs a task of ``role`` asks for: a ps keeps variables, it computes nothing."""
    return 0 if role == PS else description.gpus


def _container(description: JobDescription, port: str, *, role: str, port_name: str, tf_config: dict | None) -> dict:
    container: dict[str, Any] = {
        "name": _TFJOB_CONTAINER,
        "image": description.image,
        "command": _argv(description),
    }
    if tf_config is not None:
        container["env"] = [{"name": env.TF_CONFIG, "value": env.tf_config_value(tf_config)}]
    container["ports"] = [{"name": port_name, "containerPort": int(port)}]
    container["volumeMounts"] = [{"name": RUNS_VOLUME, "mountPath": RUNS_MOUNT}]
    gpus = _gpus(description, role)
    if gpus:  # the NVIDIA device plugin's resource; without it a pod sees no GPU
        container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    return container


def _volumes(description: JobDescription) -> list[dict]:
    return [{"name": RUNS_VOLUME, "persistentVolumeClaim": {"claimName": f"{description.name}-{RUNS_VOLUME}"}}]


def _apply_note(description: JobDescription, output: str | None, *, stop: str) -> str:
    return (f"# Apply: kubectl apply -f {output or '<this file>'}\n"
            f"# Stop:  kubectl -n {description.namespace} delete {stop}\n"
            f"# Not `kubectl delete -f`: it deletes the claim too and, under the usual reclaim policy\n"
            f"# (Delete), the volume with every checkpoint, which a restarted job resumes from.\n")


_STORAGE_NOTE = (
    "# The claim needs a ReadWriteMany storage class (NFS, Filestore, EFS...; --storage-class): every task\n"
    "# reads the chief's checkpoints when it resumes. tf.distribute's gRPC is unauthenticated: trusted network only.\n"
)


def _k8s(description: JobDescription, *, output: str | None) -> str:
    ports = sorted({ADDRESS.match(address).group("port") for _, _, address in description.tasks()}, key=int)
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": description.name, "namespace": description.namespace, "labels": _labels(description)},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,  # peers must resolve while they start or restart
            "selector": {"tfdist/job": description.name},
            "ports": [{"name": f"grpc-{port}", "port": int(port)} for port in ports],
        },
    }
    jobs = []
    for config in tf_configs(description, format="k8s").values():
        role, index = config["task"]["type"], config["task"]["index"]
        pod = _pod_name(description.name, role, index)
        port = config["cluster"][role][index].rpartition(":")[2]
        labels = _labels(description, role, index)
        jobs.append({
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": pod, "namespace": description.namespace, "labels": labels},
            "spec": {
                "backoffLimit": K8S_BACKOFF_LIMIT,
                "podFailurePolicy": {"rules": [
                    # Bad input: no new pod can fix it.
                    {"action": "FailJob", "onExitCodes": {"containerName": _TFJOB_CONTAINER, "operator": "In",
                                                          "values": [env.EXIT_USAGE]}},
                    # An eviction or a drained node: a new pod, not counted against the limit.
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
                ]},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "hostname": pod,  # every pod of the Job keeps the task's DNS name
                        "subdomain": description.name,
                        "restartPolicy": "Never",  # what podFailurePolicy needs: each retry is a new pod
                        "terminationGracePeriodSeconds": GRACE_SECONDS,
                        "containers": [_container(description, port, role=role, port_name="grpc", tf_config=config)],
                        "volumes": _volumes(description),
                    },
                },
            },
        })
    note = (f"# One Job per task: a failed pod is replaced (a preemption's 75, a lost peer's 76: up to {K8S_BACKOFF_LIMIT}\n"
            "# times; an eviction does not count), bad input's exit 2 fails the Job at once. Needs Kubernetes\n"
            "# 1.26+ (podFailurePolicy). A ps or worker of a parameter-server job exits 0 when the run is over.\n")
    return (_apply_note(description, output, stop=f"job,service -l tfdist/job={description.name}") + note + _STORAGE_NOTE
            + _yaml(service, _claim(description), *jobs))


def _tfjob(description: JobDescription, *, output: str | None) -> str:
    configs = tfjob_tf_configs(description)
    replicas = {}
    for role in ROLES:
        addresses = [address for r, _, address in description.tasks() if r == role]
        if not addresses:
            continue
        port = ADDRESS.match(addresses[0]).group("port")
        replicas[_TFJOB_REPLICAS[role]] = {
            "replicas": len(addresses),
            "restartPolicy": "OnFailure",
            "template": {"spec": {
                "terminationGracePeriodSeconds": GRACE_SECONDS,
                "containers": [_container(description, port, role=role, port_name=_TFJOB_PORT, tf_config=None)],
                "volumes": _volumes(description),
            }},
        }
    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {
            "name": description.name,
            "namespace": description.namespace,
            "labels": _labels(description),
            "annotations": {TF_CONFIGS_ANNOTATION: _json_lines(configs)},
        },
        "spec": {"runPolicy": {"backoffLimit": TFJOB_BACKOFF_LIMIT}, "tfReplicaSpecs": replicas},
    }
    note = (
        "# Kubeflow's training operator writes TF_CONFIG into every pod itself; the annotation\n"
        f"# {TF_CONFIGS_ANNOTATION} shows what each task will receive (nothing in a job of one task).\n"
    )
    note += (f"# It fails after {TFJOB_BACKOFF_LIMIT} restarts (runPolicy.backoffLimit; preemptions count too): a bad\n"
             "# input's exit 2 does not restart for ever. Not restartPolicy ExitCode: it fails on 75 and 76.\n")
    return (_apply_note(description, output, stop=f"tfjob {description.name}") + note + _STORAGE_NOTE
            + _yaml(_claim(description), job))


class _Dumper(yaml.SafeDumper):
    """Block style for multi-line strings, and no anchors for repeated objects."""

    def ignore_aliases(self, data) -> bool:
        return True


_Dumper.add_representer(
    str,
    lambda dumper, value: dumper.represent_scalar(
        "tag:yaml.org,2002:str", value, style="|" if "\n" in value else None
    ),
)
_Dumper.add_representer(  # a command or a list of names on one line: [tfdist, train, ...]
    list,
    lambda dumper, value: dumper.represent_sequence(
        "tag:yaml.org,2002:seq", value, flow_style=all(isinstance(item, str) for item in value)
    ),
)


def _yaml(*documents: dict) -> str:
    return yaml.dump_all(
        documents, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=1 << 16, explicit_start=True
    )


# --- reading generated documents back ---------------------------------------------------
def read_tf_configs(text: str, *, format: str) -> dict[str, dict]:
    """The TF_CONFIG of every task found in a document ``render`` wrote, keyed "role:index".

    For ``tfjob`` these are the configurations listed in its annotation, i.e. what Kubeflow
    will write. The values are decoded dictionaries; check them with ``parse_tf_config``.
    """
    _check_format(format)
    if format == "json":
        return json.loads(text)
    if format == "tfjob":
        (job,) = [doc for doc in yaml.safe_load_all(text) if doc and doc.get("kind") == "TFJob"]
        return json.loads(job["metadata"]["annotations"][TF_CONFIGS_ANNOTATION])
    reader = {"env": _env_values, "compose": _compose_values, "k8s": _k8s_values}[format]
    configs = [json.loads(value) for value in reader(text)]
    return {_key(config): config for config in configs}


def _env_values(text: str) -> Iterator[str]:
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["export"]:
            words = words[1:]
        for word in words:
            name, _, value = word.partition("=")
            if name == env.TF_CONFIG:
                yield value


def _compose_values(text: str) -> Iterator[str]:
    for service in yaml.safe_load(text)["services"].values():
        yield service["environment"][env.TF_CONFIG]


def _k8s_values(text: str) -> Iterator[str]:
    for doc in yaml.safe_load_all(text):
        if doc and doc.get("kind") == "Job":
            for variable in doc["spec"]["template"]["spec"]["containers"][0].get("env", ()):
                if variable["name"] == env.TF_CONFIG:
                    yield variable["value"]
