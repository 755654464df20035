"""``tfdist cluster``: TF_CONFIGs, docker compose, Kubernetes or TFJob files for one cluster description."""

from __future__ import annotations

import argparse
import os
import sys

from tfdist import manifests
from tfdist.cli import _args


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "cluster",
        help="print the TF_CONFIG of every task, or compose / Kubernetes / TFJob files, for one cluster",
        description="Prints, from one description of the cluster, the TF_CONFIG of every task (env, json) "
        "or a deployment that sets them (compose, k8s, tfjob). Every format agrees on the roles, the "
        "order of the tasks and their ports; compose, k8s and tfjob name the hosts after the tasks. "
        "Connects to nothing.",
        epilog="example: tfdist cluster --chief host0:2222 --workers host1:2222,host2:2222 --ps host3:2222 "
        "--format env",
    )
    tasks = parser.add_argument_group("tasks (host:port addresses)")
    tasks.add_argument("--workers", metavar="HOST:PORT,...", help="the workers, comma-separated (required)")
    tasks.add_argument("--chief", metavar="HOST:PORT", help="the chief; required with --ps")
    tasks.add_argument("--ps", metavar="HOST:PORT,...", help="the parameter servers, comma-separated")
    tasks.add_argument("--evaluator", metavar="HOST:PORT", help="a side-car evaluator")
    parser.add_argument(
        "--format", default="env", metavar="{" + ",".join(manifests.FORMATS) + "}",
        help="env: one `export TF_CONFIG=...` line per task; json: role:index -> TF_CONFIG; compose: a docker "
        "compose file; k8s: a headless Service and one Job per task; tfjob: a Kubeflow TFJob (default: env)",
    )
    deploy = parser.add_argument_group("deployment (compose, k8s, tfjob)")
    deploy.add_argument("--image", default=manifests.DEFAULT_IMAGE, help="container image (default: %(default)s)")
    deploy.add_argument(
        "--command", default=manifests.DEFAULT_COMMAND, help="what every task runs (default: %(default)r)"
    )
    deploy.add_argument("--name", default=manifests.DEFAULT_NAME, help="job name (default: %(default)s)")
    deploy.add_argument(
        "--storage-class", metavar="NAME",
        help="StorageClass of the runs claim (k8s, tfjob), one that offers ReadWriteMany (default: the cluster's)",
    )
    deploy.add_argument(
        "--storage-size", default=manifests.DEFAULT_STORAGE_SIZE, metavar="QUANTITY",
        help="size of the runs claim, e.g. 500Gi (default: %(default)s)",
    )
    deploy.add_argument(
        "--gpus", type=_args.nonnegative_int, default=0, metavar="N",
        help="NVIDIA GPUs of each chief, worker and evaluator task (ps: none): the Kubernetes resource nvidia.com/gpu, "
        "or a compose device reservation and docker/Dockerfile built on TensorFlow's -gpu image (default: 0)",
    )
    deploy.add_argument(
        "--namespace", default=manifests.DEFAULT_NAMESPACE, help="Kubernetes namespace (default: %(default)s)"
    )
    deploy.add_argument(
        "--grace", type=_args.positive_int, default=manifests.GRACE_SECONDS, metavar="SECONDS",
        help="seconds a stopped task has between SIGTERM and SIGKILL, in which tfdist saves: at least a "
        "checkpoint's write time, which tfdist plan estimates (default: %(default)s)",
    )
    deploy.add_argument(
        "--restarts", type=_args.nonnegative_int, default=None, metavar="N",
        help=f"restarts of a failed task before the job fails; preemptions count too (default: compose "
        f"{manifests.COMPOSE_RESTARTS}, k8s {manifests.K8S_BACKOFF_LIMIT}, tfjob {manifests.TFJOB_BACKOFF_LIMIT})",
    )
    parser.add_argument(
        "--output", "-o", metavar="FILE", help="write the document to FILE (named in its header) instead of stdout"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tfdist.env import EXIT_USAGE

    description = manifests.JobDescription.from_flags(
        workers=args.workers,
        chief=args.chief,
        ps=args.ps,
        evaluator=args.evaluator,
        image=args.image,
        command=args.command,
        name=args.name,
        namespace=args.namespace,
        gpus=args.gpus,
        storage_class=args.storage_class,
        storage_size=args.storage_size,
        grace_seconds=args.grace,
        restarts=args.restarts,
    )
    if args.output is not None:
        refusal = _output_refusal(args.output, args.format)
        if refusal:
            sys.stderr.write(f"tfdist: error: {refusal}\n")
            return EXIT_USAGE
    text = manifests.render(description, format=args.format, output=args.output)
    ignored = manifests.ignored_flags(description, format=args.format)
    if ignored:
        verb = "changes" if len(ignored) == 1 else "change"
        sys.stderr.write(f"tfdist: warning: {', '.join(ignored)} {verb} nothing in --format {args.format}: the "
                         "document does not use it (docs/multi-host.md says which format uses which flag).\n")
    if args.format == "compose" and not os.path.isfile(manifests.DOCKERFILE):
        sys.stderr.write(
            f"tfdist: warning: no {manifests.DOCKERFILE} in {os.getcwd()}, which the compose file builds from. "
            f"Run tfdist cluster in the repository root (the folder that holds {manifests.DOCKERFILE}).\n"
        )
    if args.output is None:
        sys.stdout.write(text)
        return 0
    try:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        sys.stderr.write(
            f"tfdist: error: cannot write --output; received --output={args.output!r} ({e.strerror}). "
            "Fix: name a file in an existing, writable directory, or leave --output out to print.\n"
        )
        return EXIT_USAGE
    return 0


def _output_refusal(path: str, format: str) -> str | None:
    """Why ``--output`` may not be written, or None: a name that does not fit the format, or an
    existing file ``tfdist cluster`` did not write (a Dockerfile, someone's notes) -- it is never
    replaced."""
    suffixes = manifests.SUFFIXES.get(format)
    if suffixes and not path.lower().endswith(suffixes):
        return (f"--output does not name a {format} file; received --output={path!r} with --format {format}. "
                f"Fix: name a file ending in {' or '.join(suffixes)}.")
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError):
        text = None
    if text is not None and (not text.strip() or manifests.generated(text)):
        return None
    return (f"--output names a file tfdist cluster did not write; received --output={path!r}. Fix: name a new "
            "file, or move that one aside first; tfdist cluster replaces only the files it generated.")
