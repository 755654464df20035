"""Each replica's own value of its replica-local variables, kept in a checkpoint and put back per replica.

Under mirrored and multi_worker_mirrored an on-read-synchronized variable has one value per
replica: BatchNormalization's moving statistics (``MEAN`` aggregation), every metric's
accumulators (``SUM``), anything a layer or optimizer creates that way. A plain checkpoint
keeps only the aggregate -- the mean, the sum -- and restores it into every replica (a sum
divided by the replicas), so a resumed run continues from values no replica had: its
statistics and metrics then differ from an uninterrupted run's in their last bits.

Keras 3 keeps BatchNormalization's statistics in mirrored variables that each replica updates
on its own (aggregation NONE): a checkpoint stores the first replica's. The Keras adapters say
which variables may differ (``on_read_variables`` for tf_keras).

``ReplicaValues`` keeps every replica's value instead: one ``[replicas, ...]`` variable per
on-read variable, filled by gathering each replica's value (from every worker: a collective,
so every worker captures at the same step), and scattered back row by row after a restore.
Its variables are named after the replica count and restored on their own, after the rest of
the state: a checkpoint of another replica count (or of one replica) simply does not hold
them, and the aggregates are restored instead, which is all a different topology can use (see
docs/resume.md, "On another number of replicas"). Where a checkpoint holds one replica's value rather than the
aggregate (Keras 3's), ``aggregate_saved`` computes the aggregate from the saved per-replica values.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable, Sequence

from tfdist._logs import without_retracing_warning
from tfdist.checkpoint import layout

log = logging.getLogger("tfdist")


def _is_on_read(variable: Any) -> bool:
    import tensorflow as tf

    return (
        isinstance(variable, tf.distribute.DistributedValues)
        and getattr(variable, "synchronization", None) == tf.VariableSynchronization.ON_READ
    )


def on_read_variables(*roots: Any) -> list[Any]:
    """Every on-read distributed variable reachable from ``roots`` (a model, an optimizer, metrics),
    once each, in a deterministic order (the checkpoint's own traversal)."""
    import tensorflow as tf

    found, seen = [], set()
    root = tf.train.Checkpoint(**{f"r{i}": r for i, r in enumerate(roots)})  # the view holds it weakly
    for obj in tf.train.TrackableView(root).descendants():
        if _is_on_read(obj) and id(obj) not in seen:
            seen.add(id(obj))
            found.append(obj)
    return found


class ReplicaValues:
    """Every replica's value of ``variables``, as checkpointable ``[replicas, ...]`` variables.

    Create it with ``ReplicaValues.of``, which gives None when there is nothing per replica
    (one device, parameter servers, central storage, no on-read variable)."""

    def __init__(self, strategy, variables: Sequence[Any], *, name: str):
        import tensorflow as tf

        self.name = name
        self.strategy = strategy
        self.replicas = strategy.num_replicas_in_sync
        self.variables = list(variables)
        self.module = tf.Module(name=name)
        self.shadows = []
        with tf.init_scope():
            for j, variable in enumerate(self.variables):
                shadow = tf.Variable(tf.zeros([self.replicas, *variable.shape], variable.dtype), trainable=False,
                                     name=f"replica_value_{j}")
                setattr(self.module, self.key(j), shadow)
                self.shadows.append(shadow)
        variables, shadows = self.variables, self.shadows

        @tf.function
        def gather():
            # In replica context an on-read variable reads as this replica's own value.
            local = strategy.run(lambda: [tf.expand_dims(tf.identity(v), 0) for v in variables])
            return [strategy.gather(value, axis=0) for value in local]

        @tf.function
        def scatter():
            def assign():
                replica = tf.distribute.get_replica_context().replica_id_in_sync_group
                for variable, shadow in zip(variables, shadows):
                    variable.assign(tf.gather(shadow, replica))

            strategy.run(assign)

        self._gather, self._scatter = without_retracing_warning(gather), without_retracing_warning(scatter)

    @classmethod
    def of(cls, strategy, variables: Iterable[Any], *, name: str) -> "ReplicaValues | None":
        """A ReplicaValues for the distributed ones of ``variables`` under ``strategy`` (the
        Keras adapter chooses which may differ between replicas), or None if there are none or
        only one replica."""
        import tensorflow as tf

        if strategy.num_replicas_in_sync < 2 or isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
            return None  # one replica, or asynchronous: no per-replica promise to keep
        distributed = [v for v in variables if isinstance(v, tf.distribute.DistributedValues)]
        return cls(strategy, distributed, name=name) if distributed else None

    def key(self, j: int) -> str:
        return _key(self.replicas, j)

    def capture(self) -> None:
        """Copies every replica's values into the checkpointed variables (a collective under
        multi_worker_mirrored: every worker calls it at the same step)."""
        for shadow, value in zip(self.shadows, self._gather()):
            shadow.assign(value)

    def saved_in(self, path: str) -> bool:
        """Whether the checkpoint ``path`` holds these values for this replica count."""
        wanted = f"{self.name}/{self.key(0)}/"
        return any(wanted in name for name in layout.reader(path).get_variable_to_shape_map())

    def restore(self, path: str) -> bool:
        """Reads the per-replica values from ``path`` and puts each replica's back, if ``path``
        holds them for this replica count; False otherwise (the aggregates stay)."""
        import tensorflow as tf

        if not self.saved_in(path):
            return False
        status = tf.train.Checkpoint(**{self.name: self.module}).restore(path)
        status.expect_partial()
        try:
            status.assert_existing_objects_matched()  # every one of them, or none is put back
        except AssertionError:
            log.warning("%s holds other per-replica values than this run's; every replica starts from their aggregate",
                        path)
            return False
        self._scatter()
        return True


def _key(replicas: int, j: int) -> str:
    return f"r{replicas}_v{j}"  # a checkpoint of another replica count does not match


def aggregate_saved(variables: Sequence[Any], path: str, *, name: str, saved_replicas: int) -> bool:
    """Sets each of ``variables`` to the aggregate of the per-replica values ``path`` holds for
    them (saved by a ``ReplicaValues`` called ``name`` of ``saved_replicas`` replicas, in the same
    order): their mean for floating-point variables, else the first replica's, as the checkpoint
    already has it. For variables a checkpoint saves as one replica's value (Keras 3's
    BatchNormalization statistics), when this run cannot put each replica's own back. False,
    changing nothing, if ``path`` holds no such values or values of other shapes."""
    import numpy as np

    reader = layout.reader(path)
    shapes = reader.get_variable_to_shape_map()
    names = [f"{name}/{_key(saved_replicas, j)}/.ATTRIBUTES/VARIABLE_VALUE" for j in range(len(variables))]
    expected = [[saved_replicas, *variable.shape] for variable in variables]
    extra = f"{name}/{_key(saved_replicas, len(variables))}/.ATTRIBUTES/VARIABLE_VALUE"
    if not variables or extra in shapes or [shapes.get(n) for n in names] != expected:
        return False
    for variable, tensor in zip(variables, names):
        if variable.dtype.is_floating:
            values = reader.get_tensor(tensor)
            variable.assign(np.mean(values, axis=0, dtype=np.float64).astype(values.dtype))
    return True
