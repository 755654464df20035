"""The tfdist strategy object: a TensorFlow strategy, with what its kind means for training.

``make_strategy`` returns one; ``wrap`` gives one for a ``tf.distribute.Strategy`` a user made.
Each kind of strategy is a subclass of :class:`Strategy`. It answers what callers would
otherwise decide from the strategy's name: how input is distributed, how steps are scheduled,
how variables are held and made race-free, and how workers sum a value. So no caller compares
names. The TensorFlow strategy itself is ``.tf``.

The object keeps TensorFlow's public surface that users and tfdist call (``scope()``,
``run``, ``num_replicas_in_sync``...), each method handing over to ``.tf``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterator

from tfdist.cluster import WORKER, ClusterSpec
from tfdist.errors import StrategyError

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

ONE_DEVICE = "one_device"
MIRRORED = "mirrored"
MULTI_WORKER_MIRRORED = "multi_worker_mirrored"
CENTRAL_STORAGE = "central_storage"
PARAMETER_SERVER = "parameter_server"
NAMES = (ONE_DEVICE, MIRRORED, MULTI_WORKER_MIRRORED, CENTRAL_STORAGE, PARAMETER_SERVER)


@dataclasses.dataclass(frozen=True)
class Traits:
    """What a strategy means for the training loop.

    Attributes:
      name: the registry name.
      coordinated: the chief schedules steps on worker tasks through a ClusterCoordinator
        (parameter_server); it coordinates and saves, the workers compute.
      step_tasks: processes that run training steps (the worker tasks under parameter_server).
      multi_process: several processes run each step together, so decisions that can differ
        between them (a signal, a clock) must be agreed before acting.
    """

    name: str
    coordinated: bool
    step_tasks: int
    multi_process: bool

    @property
    def synchronous(self) -> bool:
        """Every step is one step of all replicas together (all but parameter_server)."""
        return not self.coordinated


class Strategy:
    """A ``tf.distribute.Strategy`` with the behaviour of its kind; one subclass per kind.

    Use it where TensorFlow's strategy is used: ``with strategy.scope(): ...``,
    ``strategy.num_replicas_in_sync``, ``strategy.run(fn, args=...)``. Pass ``strategy.tf``
    to an API that needs TensorFlow's own object.

    Args:
      tf_strategy: The TensorFlow strategy of this kind.
      cluster: This task's cluster. Defaults to None: detected when ``traits`` first needs it.
      all_reduce: The all-reduce tfdist chose. Defaults to None: TensorFlow chose, or none applies.

    Attributes:
      name: the registry name of the kind, such as ``"mirrored"``.
      coordinated: a ClusterCoordinator schedules the steps on worker tasks (``coordinator``);
        False: every replica runs every step together.
      per_worker_input: each worker task reads whole steps of its own (a per-worker dataset);
        False: the replicas of one step share its global batch.
      replica_variables: every replica holds its own copy of each variable, so each replica's
        value of an on-read variable is saved and restored on its own.
      aggregating_variables: the replicas share one copy of each variable, and a replica's update
        is a ``merge_call``. Such an update needs an aggregation, and cannot run inside a loop.
      concurrent_updates: worker tasks update the shared variables at the same time, so a
        read-add-write loses updates unless it is one atomic operation.
      merge_call_in_step: a ``merge_call`` inside a step waits for every replica (it fails inside
        a ``tf.cond``).
    """

    name: ClassVar[str] = ""
    coordinated: ClassVar[bool] = False
    per_worker_input: ClassVar[bool] = False
    replica_variables: ClassVar[bool] = True
    aggregating_variables: ClassVar[bool] = False
    concurrent_updates: ClassVar[bool] = False
    merge_call_in_step: ClassVar[bool] = True

    def __init__(self, tf_strategy: "tf.distribute.Strategy", *, cluster: ClusterSpec | None = None,
                 all_reduce: str | None = None):
        """Wraps ``tf_strategy``; ``make_strategy`` and ``wrap`` call it."""
        self._tf = tf_strategy
        self._cluster = cluster
        self._all_reduce = all_reduce
        self._summed: Callable | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({type(self._tf).__name__}, {self.num_replicas_in_sync} replica(s))"

    # --- what it is ----------------------------------------------------------------------------

    @property
    def tf(self) -> "tf.distribute.Strategy":
        """The TensorFlow strategy."""
        return self._tf

    @property
    def all_reduce(self) -> str | None:
        """The all-reduce tfdist chose (``nccl``, ``ring``, ``hierarchical_copy``, ``reduce_to_one``);
        None for kinds without one, and for a TensorFlow strategy a user made (TensorFlow chose)."""
        return self._all_reduce

    @property
    def cluster(self) -> ClusterSpec:
        """This task's cluster: the one the strategy was made for, else the detected one."""
        if self._cluster is None:
            from tfdist.cluster import detect

            self._cluster = detect()
        return self._cluster

    @property
    def traits(self) -> Traits:
        """What the strategy means for the training loop in its cluster."""
        return self.traits_in(self.cluster)

    def traits_in(self, cluster: ClusterSpec) -> Traits:
        """What the strategy means for the training loop in ``cluster``.

        Args:
          cluster: The cluster the strategy trains in.

        Returns:
          The strategy's ``Traits`` there.
        """
        return Traits(name=self.name, coordinated=self.coordinated, step_tasks=self._step_tasks(cluster),
                      multi_process=self._multi_process(cluster))

    @classmethod
    def trains_on(cls, cluster: ClusterSpec) -> bool:
        """Whether a task of ``cluster`` trains under this kind.

        Args:
          cluster: This task's cluster.

        Returns:
          True where the task trains; False where it serves the chief.
        """
        return True

    def _step_tasks(self, cluster: ClusterSpec) -> int:
        return max(cluster.num_workers, 1)

    def _multi_process(self, cluster: ClusterSpec) -> bool:
        return False

    # --- TensorFlow's strategy API, handed over to .tf ------------------------------------------

    def scope(self):
        """TensorFlow's ``strategy.scope()``: variables made inside it are distributed."""
        return self._tf.scope()

    @property
    def num_replicas_in_sync(self) -> int:
        """The replicas that run each step together, over every worker."""
        return self._tf.num_replicas_in_sync

    @property
    def extended(self) -> Any:
        """TensorFlow's ``strategy.extended`` (its devices, among other things)."""
        return self._tf.extended

    @property
    def cluster_resolver(self) -> Any:
        """TensorFlow's ``strategy.cluster_resolver``; None for one-machine strategies."""
        return getattr(self._tf, "cluster_resolver", None)

    def run(self, fn: Callable, args: tuple = (), kwargs: dict | None = None, options: Any = None) -> Any:
        """TensorFlow's ``strategy.run``: ``fn`` on every replica.

        Args:
          fn: The function each replica runs.
          args: Its positional arguments. Defaults to none.
          kwargs: Its keyword arguments. Defaults to None: none.
          options: TensorFlow's ``tf.distribute.RunOptions``. Defaults to None.

        Returns:
          The per-replica results.
        """
        return self._tf.run(fn, args=args, kwargs=kwargs, options=options)

    def reduce(self, reduce_op: Any, value: Any, axis: int | None) -> Any:
        """TensorFlow's ``strategy.reduce``: per-replica values to one.

        Args:
          reduce_op: ``tf.distribute.ReduceOp.SUM`` or ``MEAN``.
          value: The per-replica values.
          axis: The axis reduced within each replica's value, or None.

        Returns:
          The reduced value.
        """
        return self._tf.reduce(reduce_op, value, axis=axis)

    def gather(self, value: Any, axis: int) -> Any:
        """TensorFlow's ``strategy.gather``: per-replica values joined along ``axis``.

        Args:
          value: The per-replica values.
          axis: The axis they are joined along.

        Returns:
          The joined value.
        """
        return self._tf.gather(value, axis=axis)

    def experimental_distribute_dataset(self, dataset: Any, options: Any = None) -> Any:
        """TensorFlow's ``strategy.experimental_distribute_dataset``: global batches split among replicas.

        Args:
          dataset: A ``tf.data.Dataset`` of global batches.
          options: TensorFlow's ``tf.distribute.InputOptions``. Defaults to None.

        Returns:
          TensorFlow's distributed dataset.
        """
        return self._tf.experimental_distribute_dataset(dataset, options=options)

    def distribute_datasets_from_function(self, dataset_fn: Callable, options: Any = None) -> Any:
        """TensorFlow's ``strategy.distribute_datasets_from_function``: one pipeline per input worker.

        Args:
          dataset_fn: A function of a ``tf.distribute.InputContext`` returning a dataset of
            per-replica batches.
          options: TensorFlow's ``tf.distribute.InputOptions``. Defaults to None.

        Returns:
          TensorFlow's distributed dataset.
        """
        return self._tf.distribute_datasets_from_function(dataset_fn, options=options)

    def experimental_distribute_values_from_function(self, value_fn: Callable) -> Any:
        """TensorFlow's ``strategy.experimental_distribute_values_from_function``: a value per replica.

        Args:
          value_fn: A function of a ``tf.distribute.ValueContext`` returning one replica's value.

        Returns:
          The per-replica values.
        """
        return self._tf.experimental_distribute_values_from_function(value_fn)

    # --- behaviour -----------------------------------------------------------------------------

    @property
    def coordinator(self) -> Any:
        """The ClusterCoordinator that schedules the steps (made once); None where every replica runs them."""
        return None

    def join(self) -> None:
        """Waits for every scheduled step to finish; nothing to wait for where steps are not scheduled."""

    @contextlib.contextmanager
    def building_scope(self) -> Iterator[None]:
        """The scope to create a model's variables in: ``scope()``, plus what this kind needs so
        that replicas can update every variable."""
        with self._tf.scope():
            yield

    def call_as_step(self, fn: Callable, *args: Any) -> Any:
        """``fn(*args)`` as a step runs it: in every replica (``run``), or, where steps are scheduled
        on workers, as the scheduled function calls it.

        Args:
          fn: The step's function.
          *args: Its arguments.

        Returns:
          What ``fn`` returns.
        """
        return self.run(fn, args=args)

    def xla_unavailable(self, *, one_copy_compiles: bool = False) -> str | None:
        """Why XLA cannot compile the replicas' step, as the end of "jit_compile=True is not
        applied ..."; None where it can.

        Several replicas on CPU devices of one process: XLA places the step on one CPU device,
        from which the other replicas' variables cannot be reached.

        Args:
          one_copy_compiles: The step is tf_keras' own, which compiles where the replicas share
            one copy of the variables.
        """
        try:
            local = list(self.extended.worker_devices)
        except (AttributeError, RuntimeError):  # the default strategy (no scope) has none
            local = []
        if len(local) > 1 and any("CPU" in d.upper() for d in local):
            return f"to replicas on {len(local)} CPU devices"
        return None

    def sum_over_workers(self, values: list[int]) -> list[int]:
        """Each value summed over the workers (one small all-reduce; each worker counted once,
        whatever its number of local replicas). Every worker must call it at the same step.

        The all-reduce runs in a ``tf.function`` made once per strategy: run eagerly it costs
        about twice as much (4 against 2 ms between two local CPU workers).

        Args:
          values: This worker's integers.

        Returns:
          Each integer summed over the workers.
        """
        import tensorflow as tf

        if self._summed is None:
            strategy = self._tf
            per_worker = max(1, len(strategy.extended.worker_devices))

            @tf.function(autograph=False)
            def summed(local):
                none = tf.zeros_like(local)
                distributed = strategy.experimental_distribute_values_from_function(
                    lambda ctx: local if ctx.replica_id_in_sync_group % per_worker == 0 else none
                )
                return strategy.reduce(tf.distribute.ReduceOp.SUM, distributed, axis=None)

            self._summed = summed
        return [int(v) for v in self._summed(tf.constant(values, tf.int64)).numpy()]


class OneDevice(Strategy):
    """``tf.distribute.OneDeviceStrategy``: one replica on one device."""

    name = ONE_DEVICE
    merge_call_in_step = False


class Mirrored(Strategy):
    """``tf.distribute.MirroredStrategy``: a replica per device of one machine, each with its own copy
    of every variable, gradients all-reduced."""

    name = MIRRORED


class MultiWorkerMirrored(Strategy):
    """``tf.distribute.MultiWorkerMirroredStrategy``: mirrored over the devices of several worker
    processes, which run every step together."""

    name = MULTI_WORKER_MIRRORED

    def _multi_process(self, cluster: ClusterSpec) -> bool:
        return cluster.num_workers > 1

    def xla_unavailable(self, *, one_copy_compiles: bool = False) -> str | None:
        """Also: XLA compiles NCCL's collectives only, not the ring all-reduce tfdist takes for CPU workers."""
        on_cpus = super().xla_unavailable(one_copy_compiles=one_copy_compiles)
        if on_cpus is None and self.all_reduce == "ring":
            return "under multi_worker_mirrored with the ring all-reduce (XLA compiles NCCL's only)"
        return on_cpus


class CentralStorage(Strategy):
    """``tf.distribute.experimental.CentralStorageStrategy``: replicas on one machine's devices,
    one copy of each variable on the parameter device."""

    name = CENTRAL_STORAGE
    replica_variables = False
    aggregating_variables = True

    @contextlib.contextmanager
    def building_scope(self) -> Iterator[None]:
        """``scope()``, in which a variable made without an aggregation gets one.

        A replica may update a central variable only if it has an aggregation. Keras 3 makes
        BatchNormalization's moving statistics and every SeedGenerator's state with none, so
        their first update would fail. Here a non-trainable variable without one gets MEAN if it
        is a float (the replicas' statistics are averaged), else ONLY_FIRST_REPLICA (every
        replica advances a seed the same way).
        """
        import tensorflow as tf

        def creator(next_creator, **kwargs):
            aggregation = kwargs.get("aggregation")
            synchronization = kwargs.get("synchronization")
            if (
                kwargs.get("trainable") is False
                and aggregation in (None, tf.VariableAggregation.NONE)
                and synchronization in (None, tf.VariableSynchronization.AUTO, tf.VariableSynchronization.ON_WRITE)
            ):
                dtype = kwargs.get("dtype")
                floating = dtype is not None and tf.as_dtype(dtype).is_floating
                kwargs["aggregation"] = (tf.VariableAggregation.MEAN if floating
                                         else tf.VariableAggregation.ONLY_FIRST_REPLICA)
            return next_creator(**kwargs)

        with self._tf.scope(), tf.variable_creator_scope(creator):
            yield

    def xla_unavailable(self, *, one_copy_compiles: bool = False) -> str | None:
        """As for every kind, except that a step over the one copy of the variables compiles."""
        return None if one_copy_compiles else super().xla_unavailable()


class ParameterServer(Strategy):
    """``tf.distribute.experimental.ParameterServerStrategy``: the chief schedules steps on worker
    tasks through a ClusterCoordinator; the variables live on the ps tasks."""

    name = PARAMETER_SERVER
    coordinated = True
    per_worker_input = True
    replica_variables = False
    concurrent_updates = True
    merge_call_in_step = False

    def __init__(self, tf_strategy: "tf.distribute.Strategy", **kwargs: Any):
        super().__init__(tf_strategy, **kwargs)
        self._coordinator = None

    @classmethod
    def trains_on(cls, cluster: ClusterSpec) -> bool:
        """Only the chief trains; the ps and worker tasks serve it."""
        return cluster.is_chief

    def _step_tasks(self, cluster: ClusterSpec) -> int:
        return len(cluster.jobs.get(WORKER, ()))

    @property
    def coordinator(self) -> Any:
        """The ClusterCoordinator of this strategy, made at the first use."""
        import tensorflow as tf

        if self._coordinator is None:
            self._coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(self._tf)
        return self._coordinator

    def join(self) -> None:
        """Waits for the steps scheduled so far, if any were."""
        if self._coordinator is not None:
            self._coordinator.join()

    def call_as_step(self, fn: Callable, *args: Any) -> Any:
        """``fn(*args)`` as it is: a scheduled function runs on a worker, which holds no replicas."""
        return fn(*args)


KINDS: dict[str, type[Strategy]] = {kind.name: kind for kind in
                                    (OneDevice, Mirrored, MultiWorkerMirrored, CentralStorage, ParameterServer)}
"""Each kind's class, by registry name."""


def _tf_classes() -> list[tuple[type, type[Strategy]]]:
    """TensorFlow's strategy classes and the kind of each, subclasses before the classes they extend."""
    import tensorflow as tf

    return [
        (tf.distribute.experimental.ParameterServerStrategy, ParameterServer),
        (tf.distribute.MultiWorkerMirroredStrategy, MultiWorkerMirrored),
        (tf.distribute.experimental.CentralStorageStrategy, CentralStorage),
        (tf.distribute.MirroredStrategy, Mirrored),
        (tf.distribute.OneDeviceStrategy, OneDevice),
    ]


def kind_of(tf_strategy: "tf.distribute.Strategy") -> type[Strategy]:
    """The kind of a TensorFlow strategy, from its class; the only place that decides it.

    TensorFlow's default strategy (outside every scope) is one replica on the current device: ``OneDevice``.

    Raises:
      StrategyError: a strategy of a class tfdist does not run under (a TPUStrategy).
    """
    import tensorflow as tf

    for tf_class, kind in _tf_classes():
        if isinstance(tf_strategy, tf_class):
            return kind
    if not tf.distribute.has_strategy() and tf_strategy is tf.distribute.get_strategy():
        return OneDevice
    raise StrategyError(
        "tfdist runs under tf.distribute's OneDeviceStrategy, MirroredStrategy, MultiWorkerMirroredStrategy, "
        "experimental.CentralStorageStrategy and experimental.ParameterServerStrategy; received a "
        f"{type(tf_strategy).__name__}. "
        "Fix: pass a strategy name such as 'auto', or one of those TensorFlow strategies."
    )


_MADE: dict[int, Strategy] = {}
"""The strategies ``make_strategy`` made, by the id of their TensorFlow strategy (both live as long as the process)."""


def keep(strategy: Strategy) -> None:
    """Makes ``wrap(strategy.tf)`` return ``strategy``, with its all-reduce and cluster, from now on."""
    _MADE[id(strategy.tf)] = strategy


def wrap(strategy: "Strategy | tf.distribute.Strategy", *, cluster: ClusterSpec | None = None) -> Strategy:
    """The tfdist strategy of ``strategy``: itself, or a TensorFlow strategy wrapped by its kind.

    Args:
      strategy: A tfdist ``Strategy`` or a ``tf.distribute.Strategy`` (a user's own
        ``tf.distribute.MirroredStrategy()``, say).
      cluster: This task's cluster, for a TensorFlow strategy. Defaults to None: detected when needed.

    Returns:
      The ``Strategy``: the one ``make_strategy`` made for a TensorFlow strategy, else a new one
      whose ``all_reduce`` is None (TensorFlow chose).

    Raises:
      StrategyError: ``strategy`` is neither, or of a class tfdist does not run under.
    """
    if isinstance(strategy, Strategy):
        return strategy
    made = _MADE.get(id(strategy))
    if made is not None and made.tf is strategy:
        return made
    import tensorflow as tf

    if not isinstance(strategy, tf.distribute.Strategy):
        raise StrategyError(
            f"Invalid `strategy`; received {type(strategy).__name__}. Fix: pass a name such as 'auto', the "
            "strategy tfdist.make_strategy returned, or a tf.distribute.Strategy."
        )
    return kind_of(strategy)(strategy, cluster=cluster)
