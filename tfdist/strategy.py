"""Strategy factory: a registry of builders and the one ordered ``auto`` rule.

The ``auto`` rule (``choose``) decides from the detected cluster, in this order:

1. a ``ps`` job in the cluster         -> ``parameter_server``
2. more than one training task         -> ``multi_worker_mirrored``
3. several devices given (``devices=``, ``--cpu-devices N``) -> ``mirrored`` over them
4. one machine with several GPUs       -> ``mirrored``
5. otherwise                           -> ``one_device`` (the GPU if there is one, else the CPU)

``central_storage`` is only chosen by name. Every choice is logged once with its reason.

``make_strategy`` returns a tfdist ``Strategy`` (``strategy_kinds``): one class per kind, which
answers what the kind means for training (its ``traits``, its input, its steps, its variables).
``trains_here`` says whether this task trains or serves. So callers never branch on strategy names.

The all-reduce of ``mirrored`` and ``multi_worker_mirrored`` is tfdist's own decision too
(``choose_all_reduce``): ``auto`` picks NCCL for several GPUs, a reduction to one device
or TensorFlow's ring otherwise; see that function for the order.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import threading
from typing import TYPE_CHECKING, Callable, Sequence

from tfdist import env
from tfdist._compat import tensorflow as tf_compat
from tfdist.cluster import CHIEF, PS, ClusterSpec, detect
from tfdist.errors import StrategyError
from tfdist.startup import startup_watchdog, wait_for_peers
from tfdist.strategy_kinds import (CENTRAL_STORAGE, KINDS, MIRRORED, MULTI_WORKER_MIRRORED, NAMES, ONE_DEVICE,
                                   PARAMETER_SERVER, CentralStorage, Mirrored, MultiWorkerMirrored, OneDevice,
                                   ParameterServer, Strategy, Traits, keep, wrap)

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

log = logging.getLogger("tfdist")

__all__ = ["CENTRAL_STORAGE", "MIRRORED", "MIRRORED_ALL_REDUCE", "MULTI_WORKER_ALL_REDUCE", "MULTI_WORKER_MIRRORED",
           "MAX_CPU_DEVICES", "NAMES", "NO_ALL_REDUCE", "ONE_DEVICE", "PARAMETER_SERVER", "Choice", "Strategy",
           "StrategyOptions", "Traits", "all_reduce_for", "choose", "choose_all_reduce", "cross_device_ops",
           "local_gpus", "make_strategy", "nccl_unavailable_reason", "resolve_name", "split_cpu", "traits",
           "trains_here", "wrap"]

MULTI_WORKER_ALL_REDUCE = ("auto", "ring", "nccl")
MIRRORED_ALL_REDUCE = ("auto", "nccl", "hierarchical_copy", "reduce_to_one")


@dataclasses.dataclass(frozen=True)
class StrategyOptions:
    """How the strategy places replicas and communicates: settings a strategy uses where they apply.

    Pass it as ``fit(..., strategy_options=tfdist.StrategyOptions(...))``. ``fit``'s own
    ``devices`` fills ``devices`` when it is left unset here. The options check their values when
    they are made.

    Attributes:
      devices: Devices of one machine's replicas, such as ``("/cpu:0", "/cpu:1")``. Defaults to
        None: ``fit``'s ``devices``, else every GPU, else the CPU.
      all_reduce: The all-reduce algorithm. [`make_strategy`][tfdist.make_strategy] lists the
        names each strategy takes. Defaults to ``"auto"``: tfdist picks one and logs it.
      bytes_per_pack: Gradient bytes per all-reduce pack. Defaults to 0: TensorFlow decides.
      collective_timeout: Seconds until a collective that has not finished fails, such as one
        waiting on a stuck peer. Defaults to None: no limit.
      startup_timeout: Seconds to wait for the cluster's peers before an error names the ones
        missing. Defaults to None: ``TFDIST_STARTUP_TIMEOUT``, else 60.

    Raises:
      StrategyError: A value is of the wrong type or out of range.

    Examples:
        ```python
        import tfdist

        options = tfdist.StrategyOptions(all_reduce="ring", collective_timeout=300)
        print(options.all_reduce, options.bytes_per_pack)   # ring 0
        ```
    """

    devices: tuple[str, ...] | None = None
    all_reduce: str = "auto"
    bytes_per_pack: int = 0
    collective_timeout: float | None = None
    startup_timeout: float | None = None

    def __post_init__(self):
        if self.devices is not None:
            if isinstance(self.devices, str) or not all(isinstance(d, str) for d in self.devices):
                raise StrategyError(
                    f"Invalid `devices`; received devices={self.devices!r}. "
                    "Fix: pass a list of device names such as ['/gpu:0', '/gpu:1']."
                )
            object.__setattr__(self, "devices", tuple(self.devices))
            if not self.devices:
                raise StrategyError("Invalid `devices`; received devices=(). Fix: name at least one device or pass None.")
        allowed = sorted(set(MULTI_WORKER_ALL_REDUCE) | set(MIRRORED_ALL_REDUCE))
        if self.all_reduce not in allowed:
            raise StrategyError(
                f"Invalid `all_reduce`; received all_reduce={self.all_reduce!r}. Fix: use one of {', '.join(allowed)}."
            )
        if not isinstance(self.bytes_per_pack, int) or self.bytes_per_pack < 0:
            raise StrategyError(
                f"Invalid `bytes_per_pack`; received bytes_per_pack={self.bytes_per_pack!r}. "
                "Fix: use 0 (TensorFlow decides) or a positive number of bytes."
            )
        for field in ("collective_timeout", "startup_timeout"):
            value = getattr(self, field)
            if value is not None and (not isinstance(value, (int, float)) or value <= 0):
                raise StrategyError(
                    f"Invalid `{field}`; received {field}={value!r}. Fix: use a positive number of seconds."
                )


@dataclasses.dataclass(frozen=True)
class Choice:
    """A strategy name and why it was chosen."""

    name: str
    reason: str


def choose(cluster: ClusterSpec, *, num_gpus: int, devices: Sequence[str] | None = None) -> Choice:
    """The ``auto`` rule. Pure: needs only the cluster, the number of local GPUs and the devices given."""
    # 1. A ps job can only be driven by ParameterServerStrategy.
    if cluster.num_ps:
        return Choice(
            PARAMETER_SERVER,
            f"{cluster.source} lists {cluster.num_ps} ps and {cluster.num_workers - 1 if CHIEF in cluster.jobs else cluster.num_workers} worker task(s)",
        )
    # 2. Several training tasks must synchronize across machines.
    if cluster.num_workers > 1:
        return Choice(MULTI_WORKER_MIRRORED, f"{cluster.source} lists {cluster.num_workers} workers")
    # 3. Several devices given: replicas on them (e.g. a CPU split to try mirrored without GPUs).
    if devices is not None and len(devices) > 1:
        return Choice(MIRRORED, f"{len(devices)} devices given ({', '.join(devices)})")
    # 4. One machine, several GPUs.
    if num_gpus > 1:
        return Choice(MIRRORED, f"{num_gpus} GPUs on this machine")
    # 5. One device.
    if num_gpus == 1:
        return Choice(ONE_DEVICE, "1 GPU on this machine")
    return Choice(ONE_DEVICE, "no GPU on this machine; using the CPU")


NO_ALL_REDUCE = "none"


def nccl_unavailable_reason(*, physical_gpus: int, logical_gpus: int, nccl_kernels: bool) -> str | None:
    """Why NCCL cannot run on this machine's GPUs, or None if it can. Pure."""
    if not nccl_kernels:
        return "this TensorFlow build has no NCCL kernels"
    if logical_gpus > physical_gpus:
        # NCCL refuses two ranks on one device; TensorFlow's own default falls back the same way.
        return (f"the {logical_gpus} GPUs are logical devices carved from {physical_gpus} physical GPU(s), "
                "and NCCL needs one replica per physical GPU")
    return None


def choose_all_reduce(
    strategy_name: str,
    *,
    requested: str = "auto",
    num_gpus: int,
    num_devices: int | None = None,
    nccl_unavailable: str | None = None,
) -> Choice:
    """The all-reduce rule. Pure: needs only the strategy, the request and the local replicas' devices.

    ``num_gpus`` counts the GPUs among this machine's replica devices and ``num_devices``
    all of them (default: ``num_gpus``, or 1 -- the CPU -- without GPUs);
    ``nccl_unavailable`` says why NCCL cannot run on these GPUs (``nccl_unavailable_reason``).

    ``mirrored`` with ``auto``, in this order:
      1. one replica                    -> reduce_to_one (nothing to exchange)
      2. a replica on a CPU             -> reduce_to_one (NCCL needs GPUs)
      3. NCCL unavailable here          -> reduce_to_one (TensorFlow's own fallback)
      4. several GPUs                   -> nccl
    ``hierarchical_copy`` is only chosen by name (it is built for DGX-1's topology).
    ``multi_worker_mirrored`` with ``auto``: ``nccl`` when the replicas are GPUs and NCCL can
    run (TensorFlow's AUTO would use its ring there too), else ``ring``. The other strategies
    do not all-reduce gradients: ``none``. A name asked for is checked, not changed.
    """
    num_devices = num_devices if num_devices is not None else max(num_gpus, 1)
    all_gpus = 0 < num_devices <= num_gpus
    if strategy_name == MIRRORED:
        allowed, cpu_fix = MIRRORED_ALL_REDUCE, "use all_reduce='auto' or 'reduce_to_one' on CPUs"
    elif strategy_name == MULTI_WORKER_MIRRORED:
        allowed, cpu_fix = MULTI_WORKER_ALL_REDUCE, "use all_reduce='ring' or 'auto'"
    else:
        why = {
            ONE_DEVICE: "one_device has one replica: nothing to all-reduce",
            CENTRAL_STORAGE: "central_storage sums the gradients on its parameter device",
            PARAMETER_SERVER: "parameter_server workers send their updates to the ps tasks",
        }.get(strategy_name, f"{strategy_name} is not a mirrored strategy")
        ignored = "" if requested == "auto" else f"; all_reduce={requested!r} does not apply"
        return Choice(NO_ALL_REDUCE, why + ignored)
    if requested not in allowed:
        raise StrategyError(
            f"{strategy_name} does not support all_reduce={requested!r}. Fix: use one of {', '.join(allowed)}."
        )
    if requested == "nccl":
        if not all_gpus:
            raise StrategyError(
                f"all_reduce='nccl' needs GPUs; received it with {num_gpus} GPU(s) among {num_devices} replica "
                f"device(s). Fix: {cpu_fix}."
            )
        if nccl_unavailable:
            raise StrategyError(
                f"all_reduce='nccl' cannot run here: {nccl_unavailable}. Fix: use all_reduce='auto' "
                f"(it picks {'reduce_to_one' if strategy_name == MIRRORED else 'ring'})."
            )
    if requested == "hierarchical_copy" and num_devices > 1 and num_devices % 2:
        # TensorFlow's HierarchicalCopyAllReduce splits the devices into two groups of
        # num_devices // 2: with an odd count one replica's gradients are silently left out.
        raise StrategyError(
            f"all_reduce='hierarchical_copy' needs an even number of replicas; received {num_devices} devices, "
            "of which TensorFlow would leave one out of the sum. Fix: use 'auto', 'nccl' or 'reduce_to_one'."
        )
    if requested != "auto":
        return Choice(requested, "chosen by name")
    if strategy_name == MULTI_WORKER_MIRRORED:
        if not all_gpus:
            return Choice("ring", "no GPU replicas: TensorFlow's ring all-reduce between the workers")
        if nccl_unavailable:
            return Choice("ring", f"NCCL cannot run: {nccl_unavailable}")
        return Choice("nccl", f"{num_gpus} GPU replica(s) on this worker: NCCL")
    if num_devices == 1:
        return Choice("reduce_to_one", "one replica: nothing to all-reduce")
    if not all_gpus:
        return Choice("reduce_to_one",
                      f"{num_devices - num_gpus} of {num_devices} replicas on CPU devices: NCCL needs GPUs")
    if nccl_unavailable:
        return Choice("reduce_to_one", f"NCCL cannot run: {nccl_unavailable}")
    return Choice("nccl", f"{num_gpus} GPUs on one machine: NCCL")


def local_gpus() -> list[str]:
    import tensorflow as tf

    return [d.name for d in tf.config.list_physical_devices("GPU")]


def _gpu_facts() -> tuple[int, int, bool]:
    """(visible physical GPUs, logical GPUs made of them, NCCL kernels present); starts no runtime."""
    import tensorflow as tf

    visible = tf.config.get_visible_devices("GPU")
    logical = sum(len(tf.config.get_logical_device_configuration(gpu) or [None]) for gpu in visible)
    nccl = tf_compat.nccl_kernels_registered()
    return len(visible), logical, nccl


def all_reduce_for(strategy_name: str, *, requested: str = "auto", devices: Sequence[str] | None = None) -> Choice:
    """``choose_all_reduce`` with this machine's facts: its GPUs and the replicas' devices."""
    if strategy_name not in (MIRRORED, MULTI_WORKER_MIRRORED):
        return choose_all_reduce(strategy_name, requested=requested, num_gpus=0)
    physical, logical, nccl_kernels = _gpu_facts() if local_gpus() else (0, 0, True)
    if strategy_name == MIRRORED and devices:
        num_gpus, num_devices = sum("gpu" in d.lower() for d in devices), len(devices)
    else:  # TensorFlow's default: every logical GPU, else the CPU
        num_gpus, num_devices = logical, max(logical, 1)
    reason = nccl_unavailable_reason(physical_gpus=physical, logical_gpus=logical, nccl_kernels=nccl_kernels)
    return choose_all_reduce(strategy_name, requested=requested, num_gpus=num_gpus, num_devices=num_devices,
                             nccl_unavailable=reason if num_gpus else None)


def cross_device_ops(name: str) -> "tf.distribute.CrossDeviceOps":
    """The MirroredStrategy ``cross_device_ops`` of an all-reduce name."""
    import tensorflow as tf

    return {
        "nccl": tf.distribute.NcclAllReduce,
        "hierarchical_copy": tf.distribute.HierarchicalCopyAllReduce,
        "reduce_to_one": tf.distribute.ReductionToOneDevice,
    }[name]()


MAX_CPU_DEVICES = 64
"""The most logical CPU devices ``split_cpu`` makes: more stand-in GPUs than any machine has."""


def split_cpu(count: int) -> list[str]:
    """Splits the CPU into ``count`` logical devices, stand-ins for GPUs on a CPU machine.

    Call it before TensorFlow's runtime starts: first thing in the program, or in a notebook's
    first cell.

    Args:
      count: The number of logical devices, from 1 to 64.

    Returns:
      The device names, such as ``["/cpu:0", "/cpu:1"]``.

    Raises:
      StrategyError: ``count`` is out of range, or TensorFlow's runtime already started.

    Examples:
        ```python
        import tfdist

        devices = tfdist.split_cpu(2)
        strategy = tfdist.make_strategy("mirrored", devices=devices)
        print(strategy.num_replicas_in_sync)   # 2
        ```
    """
    import tensorflow as tf

    if not 1 <= count <= MAX_CPU_DEVICES:
        raise StrategyError(f"Invalid `cpu_devices`; received {count}. Fix: use 1 to {MAX_CPU_DEVICES} (each logical "
                            "device stands in for one GPU).")
    cpu = tf.config.list_physical_devices("CPU")[0]
    current = tf.config.get_logical_device_configuration(cpu)
    if current is None or len(current) != count:
        try:
            tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * count)
        except RuntimeError:
            raise StrategyError(
                f"Cannot split the CPU into {count} devices: TensorFlow's runtime already started. "
                "Fix: split it first thing in the program, before any TensorFlow op runs (in a notebook: restart "
                "the kernel, then run it first)."
            ) from None
    return [f"/cpu:{i}" for i in range(count)]


def _resolver(cluster: ClusterSpec):
    import tensorflow as tf

    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster.training_jobs()),
        task_type=cluster.task_type,
        task_id=cluster.task_index,
        rpc_layer=cluster.rpc_layer,
    )


def _check_devices_exist(devices: Sequence[str] | None) -> None:
    """Raises StrategyError for a device of ``devices`` this machine does not have: TensorFlow
    would place replicas on a missing CPU device silently, and fail on a missing GPU mid-step."""
    import tensorflow as tf

    if not devices:
        return
    present = {(d.device_type, int(d.name.rsplit(":", 1)[1])) for d in tf.config.list_logical_devices()}
    for device in devices:
        try:
            spec = tf.DeviceSpec.from_string(device)
        except ValueError:
            spec = None
        if spec is not None and spec.job is not None:  # another task's device: not this machine's to check
            continue
        if spec is None or spec.device_type is None or (spec.device_type.upper(), spec.device_index or 0) not in present:
            names = ", ".join(sorted(f"/{kind.lower()}:{index}" for kind, index in present))
            raise StrategyError(
                f"device {device!r} does not exist on this machine; received devices={list(devices)!r}, and the "
                f"devices here are {names}. Fix: name devices this machine has; for two CPU devices standing in for "
                "GPUs, call tfdist.split_cpu(2) before any TensorFlow op runs (in a notebook: restart the kernel and "
                "run it first; tfdist train: --cpu-devices 2)."
            )


def _one_device(cluster: ClusterSpec, options: StrategyOptions):
    import tensorflow as tf

    if options.devices and len(options.devices) > 1:
        raise StrategyError(
            f"one_device takes one device; received devices={list(options.devices)!r}. "
            "Fix: pass one device, or use strategy='mirrored'."
        )
    _check_devices_exist(options.devices)
    device = options.devices[0] if options.devices else ("/gpu:0" if local_gpus() else "/cpu:0")
    return OneDevice(tf.distribute.OneDeviceStrategy(device), cluster=cluster)


def _mirrored(cluster: ClusterSpec, options: StrategyOptions):
    import tensorflow as tf

    _check_devices_exist(options.devices)
    devices = list(options.devices) if options.devices else None
    choice = all_reduce_for(MIRRORED, requested=options.all_reduce, devices=devices or _local_devices())
    log.info("all-reduce %s: %s", choice.name, choice.reason)
    strategy = tf.distribute.MirroredStrategy(devices, cross_device_ops=cross_device_ops(choice.name))
    return Mirrored(strategy, cluster=cluster, all_reduce=choice.name)


def _central_storage(cluster: ClusterSpec, options: StrategyOptions):
    import tensorflow as tf

    # By default the local GPUs, else every logical CPU (split_cpu), as MirroredStrategy picks
    # them; TensorFlow's own default for this strategy is the GPUs, else /cpu:0 alone.
    _check_devices_exist(options.devices)
    devices = list(options.devices) if options.devices else _local_devices()
    strategy = tf.distribute.experimental.CentralStorageStrategy(compute_devices=devices, parameter_device="/cpu:0")
    return CentralStorage(strategy, cluster=cluster)


def _local_devices() -> list[str]:
    """The devices MirroredStrategy replicates over by default: the logical GPUs, else every logical CPU."""
    import tensorflow as tf

    return [d.name for d in tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("CPU")]


def _communication_options(options: StrategyOptions):
    """(the collectives' options, the all-reduce chosen) of multi_worker_mirrored."""
    import tensorflow as tf

    choice = all_reduce_for(MULTI_WORKER_MIRRORED, requested=options.all_reduce)
    log.info("all-reduce %s: %s", choice.name, choice.reason)
    implementation = {
        "ring": tf.distribute.experimental.CommunicationImplementation.RING,
        "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
    }[choice.name]
    communication = tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=options.bytes_per_pack,
        timeout_seconds=options.collective_timeout,
        implementation=implementation,
    )
    return communication, choice.name


def _require_cluster(cluster: ClusterSpec, name: str, roles: Sequence[str]) -> None:
    if cluster.is_local or not any(role in cluster.jobs for role in roles):
        raise StrategyError(
            f"{name} needs a cluster with {' or '.join(roles)} tasks; received {cluster.describe()}. "
            "Fix: set TF_CONFIG (or start the job with `tfdist launch`), or choose another strategy."
        )


def _multi_worker_mirrored(cluster: ClusterSpec, options: StrategyOptions):
    import tensorflow as tf

    communication, all_reduce = _communication_options(options)
    if cluster.is_local:  # one process on its own, e.g. a unit test: a one-worker cluster.
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=communication)
    else:
        if cluster.num_ps:
            raise StrategyError(
                f"multi_worker_mirrored cannot use a cluster with a ps job; received {cluster.describe()}. "
                "Fix: use strategy='parameter_server' or remove the ps job."
            )
        wait_for_peers(cluster, options.startup_timeout)
        with startup_watchdog(cluster, options.startup_timeout):
            try:
                strategy = tf.distribute.MultiWorkerMirroredStrategy(
                    cluster_resolver=_resolver(cluster), communication_options=communication
                )
            except RuntimeError as e:  # "Collective ops must be configured at program startup"
                raise StrategyError(
                    f"multi_worker_mirrored must start before TensorFlow runs any op; received a process that ran one "
                    f"first ({e}), e.g. by building a tf.data.Dataset. Fix: call strategy = tfdist.make_strategy() "
                    "first thing, then build the dataset and pass strategy=strategy to fit; or pass a "
                    "dataset_fn(input_context), which fit calls after it."
                ) from None
    return MultiWorkerMirrored(strategy, cluster=cluster, all_reduce=all_reduce)


def _parameter_server(cluster: ClusterSpec, options: StrategyOptions):
    import tensorflow as tf

    _require_cluster(cluster, PARAMETER_SERVER, (PS,))
    if not cluster.is_chief:
        raise StrategyError(
            f"parameter_server strategy is created on the chief only; this task is {cluster.task_name}. "
            "Fix: run the same tfdist.fit call (or `tfdist train`) on every task: on ps and worker tasks it serves."
        )
    wait_for_peers(cluster, options.startup_timeout)
    with startup_watchdog(cluster, options.startup_timeout):
        return ParameterServer(tf.distribute.experimental.ParameterServerStrategy(_resolver(cluster)), cluster=cluster)


_REGISTRY: dict[str, Callable[[ClusterSpec, StrategyOptions], Strategy]] = {
    ONE_DEVICE: _one_device,
    MIRRORED: _mirrored,
    MULTI_WORKER_MIRRORED: _multi_worker_mirrored,
    CENTRAL_STORAGE: _central_storage,
    PARAMETER_SERVER: _parameter_server,
}


# Strategies already made in this process, by (name, cluster, options). TensorFlow's
# collectives are process-global: a second MirroredStrategy over the same devices reuses
# the first one's collective keys and fails with shape mismatches, and a multi-worker
# strategy can be created only once per process. So calling fit again reuses the strategy.
_CREATED: dict[tuple, Strategy] = {}


def resolve_name(name: str, cluster: ClusterSpec, *, devices: Sequence[str] | None = None) -> Choice:
    """The strategy name and its reason, for a name or ``auto`` (creates nothing)."""
    if name == "auto":
        return choose(cluster, num_gpus=len(local_gpus()), devices=devices)
    if name not in _REGISTRY:
        raise StrategyError(
            f"Unknown strategy; received strategy={name!r}. Fix: use 'auto' or one of {', '.join(NAMES)}."
        )
    return Choice(name, "chosen by name")


def _reclaim_signals() -> None:
    """Puts Python's SIGTERM and SIGUSR1 handlers back in force. A multi-worker strategy installs
    TensorFlow's C-level SIGTERM handler (its preemption notifier), which swallows the signal
    while Python still reports its own handler: a task told to stop would train on."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGUSR1", None)):
        handler = signal.getsignal(sig) if sig is not None else None
        if handler is not None:  # None: a handler Python did not install
            signal.signal(sig, handler)


def make_strategy(
    name: "str | Strategy | tf.distribute.Strategy" = "auto",
    *,
    cluster: ClusterSpec | None = None,
    devices: Sequence[str] | None = None,
    all_reduce: str = "auto",
    bytes_per_pack: int = 0,
    collective_timeout: float | None = None,
    startup_timeout: float | None = None,
) -> Strategy:
    """Creates the strategy ``name``, or the one ``"auto"`` picks, for this process's cluster.

    Every process of a cluster must call it with the same arguments. The choice is logged once
    with its reason. Calling it again with the same arguments returns the same strategy.

    Args:
      name: ``"auto"``, ``"one_device"``, ``"mirrored"``, ``"multi_worker_mirrored"``,
        ``"parameter_server"`` or ``"central_storage"``. A tfdist ``Strategy`` is returned
        unchanged, and a ready ``tf.distribute.Strategy`` is wrapped. Defaults to ``"auto"``.
      cluster: This task's [`ClusterSpec`][tfdist.ClusterSpec]. Defaults to None: detected.
      devices: The devices of one machine's replicas, such as ``["/cpu:0", "/cpu:1"]``. Defaults
        to None: every GPU, else the CPU.
      all_reduce: ``"auto"``, ``"ring"`` or ``"nccl"`` for multi_worker_mirrored; ``"auto"``,
        ``"nccl"``, ``"hierarchical_copy"`` or ``"reduce_to_one"`` for mirrored.
        Defaults to ``"auto"``.
      bytes_per_pack: The gradient bytes per all-reduce pack. Defaults to 0: TensorFlow decides.
      collective_timeout: The seconds after which a collective that does not finish fails. It
        guards against a peer that is alive but stuck. Defaults to None: no limit.
      startup_timeout: The seconds to wait for every peer to come up before an error names the
        missing tasks. Defaults to None: ``TFDIST_STARTUP_TIMEOUT``, else 60.

    Returns:
      The tfdist ``Strategy``: ``scope()``, ``num_replicas_in_sync`` and ``run`` as TensorFlow's,
      which is ``.tf``.

    Raises:
      StrategyError: The name is unknown, an option does not fit the strategy, or a one-machine
        strategy is asked for in a cluster of several tasks.
      PeerUnavailableError: A peer did not come up within ``startup_timeout``.

    Examples:
        ```python
        import tfdist

        strategy = tfdist.make_strategy("auto")
        print(strategy.num_replicas_in_sync)   # 1 on a machine without GPUs
        ```
    """
    if not isinstance(name, str):
        return wrap(name, cluster=cluster)
    cluster = detect() if cluster is None else cluster
    options = StrategyOptions(
        devices=tuple(devices) if devices is not None else None,
        all_reduce=all_reduce,
        bytes_per_pack=bytes_per_pack,
        collective_timeout=collective_timeout,
        startup_timeout=startup_timeout if startup_timeout is not None else env.startup_timeout(),
    )
    choice = resolve_name(name, cluster, devices=options.devices)
    key = (choice.name, cluster, options)
    if key in _CREATED:
        return _CREATED[key]
    if choice.name in (ONE_DEVICE, MIRRORED, CENTRAL_STORAGE) and cluster.num_workers > 1:
        raise StrategyError(
            f"{choice.name} runs on one machine but the cluster has several tasks; received {cluster.describe()}. "
            "Fix: use 'multi_worker_mirrored' (or 'auto'), or unset TF_CONFIG."
        )
    strategy = _REGISTRY[choice.name](cluster, options)
    _reclaim_signals()
    log.info("strategy %s: %s (%d replica(s))", choice.name, choice.reason, strategy.num_replicas_in_sync)
    _CREATED[key] = strategy
    keep(strategy)
    return strategy


def traits(strategy: "Strategy | tf.distribute.Strategy", cluster: ClusterSpec) -> Traits:
    """The ``Traits`` of ``strategy`` (a tfdist or a TensorFlow strategy) in ``cluster``."""
    return wrap(strategy, cluster=cluster).traits_in(cluster)


def trains_here(strategy: "str | Strategy | tf.distribute.Strategy", cluster: ClusterSpec) -> bool:
    """False on the ps and worker tasks of a parameter-server cluster: they serve (``serve``)
    while the chief trains. True everywhere else."""
    kind = KINDS[resolve_name(strategy, cluster).name] if isinstance(strategy, str) else type(wrap(strategy))
    return kind.trains_on(cluster)
