"""``tfdist env``: versions, devices, the detected cluster and the strategy and all-reduce ``auto`` would pick."""

from __future__ import annotations

import argparse
import json

from tfdist.cli import _quiet


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "env",
        help="show versions, devices, the cluster and the strategy auto would choose",
        description="Shows versions, devices, the detected cluster, this task's role, and the strategy "
        "and all-reduce `auto` would choose with their reasons. Creates no strategy and connects to nothing.",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run)


def collect() -> dict:
    """Everything ``tfdist env`` reports, as a dictionary."""
    from tfdist import cluster as cluster_mod
    from tfdist import strategy as strategy_mod
    from tfdist._version import __version__

    spec = cluster_mod.detect()  # validate before importing TensorFlow
    tf = _quiet.import_tensorflow()
    import tf_keras

    gpus = strategy_mod.local_gpus()
    choice = strategy_mod.choose(spec, num_gpus=len(gpus))
    all_reduce = strategy_mod.all_reduce_for(choice.name)
    return {
        "tfdist": __version__,
        "tensorflow": tf.__version__,
        "tf_keras": tf_keras.__version__,
        "devices": [d.name for d in tf.config.list_physical_devices()],
        "gpus": len(gpus),
        "cluster_source": spec.source,
        "cluster": {role: list(addrs) for role, addrs in spec.jobs.items()},
        "task_type": spec.task_type,
        "task_index": spec.task_index,
        "is_chief": spec.is_chief,
        "num_workers": spec.num_workers if not spec.is_local else 1,
        "num_ps": spec.num_ps,
        "environment": spec.environment,
        "strategy": choice.name,
        "reason": choice.reason,
        "all_reduce": all_reduce.name,
        "all_reduce_reason": all_reduce.reason,
    }


def run(args: argparse.Namespace) -> int:
    info = collect()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"tfdist {info['tfdist']}  tensorflow {info['tensorflow']}  tf_keras {info['tf_keras']}")
    print(f"devices:  {', '.join(info['devices'])}")
    if info["cluster"]:
        jobs = ", ".join(f"{role}={','.join(addrs)}" for role, addrs in info["cluster"].items())
        print(f"cluster:  {jobs}  (from {info['cluster_source']})")
        print(f"task:     {info['task_type']}:{info['task_index']}{' (chief)' if info['is_chief'] else ''}")
    else:
        print("cluster:  none (local machine)")
    print(f"strategy: {info['strategy']}  ({info['reason']})")
    print(f"all-reduce: {info['all_reduce']}  ({info['all_reduce_reason']})")
    return 0
