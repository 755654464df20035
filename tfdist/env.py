"""The environment contract: every environment variable tfdist reads or writes, in one place.

The launcher writes these variables, the cluster detector reads them; no other module
touches ``os.environ`` for them.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping, MutableMapping

# --- variables read -------------------------------------------------------------------
TF_CONFIG = "TF_CONFIG"
"""JSON cluster description written by the launcher, Kubeflow's TFJob or the user."""

SLURM_JOB_ID = "SLURM_JOB_ID"
SLURM_PROCID = "SLURM_PROCID"
SLURM_STEP_NUM_TASKS = "SLURM_STEP_NUM_TASKS"
SLURM_NTASKS = "SLURM_NTASKS"
SLURM_STEP_NODELIST = "SLURM_STEP_NODELIST"
SLURM_JOB_NODELIST = "SLURM_JOB_NODELIST"
SLURM_STEP_TASKS_PER_NODE = "SLURM_STEP_TASKS_PER_NODE"

TFDIST_SLURM_JOBS = "TFDIST_SLURM_JOBS"
"""Roles of the Slurm tasks, e.g. ``chief:1,worker:2,ps:1``; ranks fill them in alphabetical
order of role (chief, evaluator, ps, worker). Default: every task a worker."""

TFDIST_PORT_BASE = "TFDIST_PORT_BASE"
"""First port of the tasks on a Slurm node (default 8888, as TensorFlow's resolver)."""

TFDIST_STARTUP_TIMEOUT = "TFDIST_STARTUP_TIMEOUT"
"""Seconds to wait for every peer of a multi-worker job to come up (default 60)."""

TFDIST_RESTART = "TFDIST_RESTART"
"""How many times the launcher has restarted this cluster (0 on the first run)."""

TFDIST_PROGRESS_FILE = "TFDIST_PROGRESS_FILE"
"""A file ``tfdist launch`` names for each task; training writes the first step it trained there
(see tfdist.progress). Without a trained step, two equal failures in a row end the launch."""

TFDIST_VERBOSE_WORKERS = "TFDIST_VERBOSE_WORKERS"
"""Set to 1 to let non-chief workers print progress and logs too."""

TF_CPP_MIN_LOG_LEVEL = "TF_CPP_MIN_LOG_LEVEL"
"""TensorFlow's C++ log level. If the user set it, tfdist leaves TensorFlow's logging as asked;
otherwise the CLI sets it to ``QUIET_TF_CPP_MIN_LOG_LEVEL`` and hides the start-up lines
(``tfdist --verbose`` shows everything)."""
QUIET_TF_CPP_MIN_LOG_LEVEL = "2"

TFDIST_FAULT = "TFDIST_FAULT"
"""Fault injection for tests and drills, e.g. ``worker:1/kill_at_step:13`` (see tfdist.training.faults)."""

TFDIST_TEST_HOLD = "TFDIST_TEST_HOLD"
"""A test hook: ``[ROLE:INDEX/]MOMENT`` holds the task at a moment of its life until a signal
comes, e.g. ``worker:1/restore`` (see ``tfdist._signals.hold``)."""

DEFAULT_SLURM_PORT_BASE = 8888
DEFAULT_STARTUP_TIMEOUT = 60.0

# --- exit codes -------------------------------------------------------------------------
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_PREEMPTED = 75
"""A preempted run saved its state and asks to be restarted (EX_TEMPFAIL)."""
EXIT_PEER_LOST = 76
"""A peer of the cluster died or never came up; the whole cluster must restart."""


def get(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """Returns the variable ``name`` or None; empty values count as unset."""
    value = (os.environ if environ is None else environ).get(name)
    return value if value not in (None, "") else None


def get_float(name: str, default: float, environ: Mapping[str, str] | None = None) -> float:
    from tfdist.errors import ClusterConfigError

    raw = get(name, environ)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ClusterConfigError(
            f"{name} must be a number of seconds; received {name}={raw!r}. "
            f"Fix: set it to a positive number such as {default:g}, or unset it."
        ) from None
    if value <= 0:
        raise ClusterConfigError(
            f"{name} must be positive; received {name}={raw!r}. Fix: set it to a positive number."
        )
    return value


def launched(environ: Mapping[str, str] | None = None) -> bool:
    """True in a task started by ``tfdist launch`` (it sets TFDIST_RESTART in every task)."""
    return get(TFDIST_RESTART, environ) is not None


def restart(environ: Mapping[str, str] | None = None) -> int:
    """How many times the launcher has restarted this cluster: 0 on its first run, and outside a launcher."""
    raw = get(TFDIST_RESTART, environ) or "0"
    return int(raw) if raw.isdigit() else 0


def in_cluster(environ: Mapping[str, str] | None = None) -> bool:
    """True in a task of a cluster: started by ``tfdist launch``, given a TF_CONFIG, or in a Slurm job."""
    return launched(environ) or any(get(name, environ) is not None for name in (TF_CONFIG, SLURM_JOB_ID))


def flag(name: str, environ: Mapping[str, str] | None = None) -> bool:
    return (get(name, environ) or "").lower() in ("1", "true", "yes", "on")


def startup_timeout(environ: Mapping[str, str] | None = None) -> float:
    return get_float(TFDIST_STARTUP_TIMEOUT, DEFAULT_STARTUP_TIMEOUT, environ)


def tf_config_value(config: Mapping[str, Any]) -> str:
    """Serializes a TF_CONFIG dictionary the way TensorFlow reads it."""
    return json.dumps(config, separators=(",", ":"), sort_keys=True)


def task_environment(
    config: Mapping[str, Any],
    *,
    restart: int = 0,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of one launched task: ``base`` plus its TF_CONFIG and restart count.

    Slurm variables are removed so that the launched task reads its cluster from TF_CONFIG
    alone (a launcher inside an ``salloc`` would otherwise leave two conflicting sources).
    """
    environ: MutableMapping[str, str] = dict(os.environ if base is None else base)
    for name in list(environ):
        if name.startswith("SLURM_"):
            del environ[name]
    environ[TF_CONFIG] = tf_config_value(config)
    environ[TFDIST_RESTART] = str(restart)
    return dict(environ)
