"""The training loop tfdist owns for Keras 3 models: its own train and test functions around the model's steps.

Keras 3's ``fit`` does not run under every ``tf.distribute`` strategy (MultiWorkerMirrored:
tensorflow/tensorflow#72388; ParameterServer: keras-team/keras#18624; CentralStorage counts
metrics wrongly; Mirrored with ``steps_per_execution > 1``: keras-team/keras#19246). This
loop runs the model's own ``train_step``/``test_step`` (a user's override included) inside
``strategy.run`` in a ``tf.function`` tfdist owns, under parameter servers through
``coordinator.schedule``, and reads the logs from the model's metrics in cross-replica
context, so that they are the metrics of the whole global batch on every strategy.

Every process of a synchronous cluster calls :func:`run_loop` with the same arguments: the
functions it runs contain collectives, and the hooks are called at the same steps everywhere.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

from tfdist import _checks, _signals
from tfdist._logs import without_retracing_warning
from tfdist.errors import DataError
from tfdist.strategy_kinds import wrap
from tfdist.training.keras3 import check_accumulation, accumulating_train_step, check_model, uses_keras_step
from tfdist.training.keras_common import LastModelCache, nothing_to_validate

log = logging.getLogger("tfdist")

__all__ = ["Hooks", "evaluate_loop", "run_loop"]


class Hooks:
    """What the loop tells tfdist's controller; every method is a no-op here.

    Each is called on every process at the same point of the loop. ``on_step_end`` comes at
    the end of each execution (every ``steps_per_execution`` steps, and at an epoch's last
    step); it may save (a collective under multi_worker_mirrored) or raise to stop (the
    exception propagates out of :func:`run_loop`). Under parameter servers it comes when the
    execution has been *scheduled*: join the coordinator before reading or saving state.
    """

    def on_train_begin(self) -> None:
        """Before the first epoch, after the user's callbacks saw ``on_train_begin``: their
        saved state is put back here."""

    def on_epoch_begin(self, epoch: int) -> None:
        """After the model's metrics were reset for ``epoch``, before the user's ``on_epoch_begin``:
        a resumed epoch restores its accumulators here."""

    def after_epoch_begin(self, epoch: int) -> None:
        """After the user's ``on_epoch_begin``."""

    def on_step_end(self, global_step: int) -> None:
        """After the execution that ends at ``global_step`` (steps since the run began, all
        epochs) and the user's ``on_train_batch_end``."""

    def on_epoch_end(self, epoch: int, logs: dict) -> None:
        """After validation and the user's ``on_epoch_end``; ``logs`` are Python floats, ``val_`` ones included."""

    def on_train_end(self) -> None:
        """After the user's ``on_train_end``; not called when an exception ends the loop."""


def _reducer(strategy, metric_names: frozenset):
    """Maps a step's per-replica outputs to logs: {} when they are the model's metric results
    (read afterwards in cross-replica context), else each output's mean over replicas (as
    Keras' ``reduce_per_replica(..., "auto")``), decided when the function is traced."""
    import tensorflow as tf

    def reduce(outputs):
        if isinstance(outputs, dict) and frozenset(outputs) == metric_names:
            return {}

        def mean(value):
            if isinstance(value, tf.distribute.DistributedValues):
                return strategy.reduce(tf.distribute.ReduceOp.MEAN, value, axis=None)
            return value

        return tf.nest.map_structure(mean, outputs)

    return reduce


def _skipping_empty_batches(model, strategy):
    """The model's ``test_step``; Keras' own copes with a replica's empty batch (fewer examples
    than replicas). Keras 3's loss of a batch whose static shape is ``(0,)`` is left unreduced,
    and its mean in the loss tracker is 0/0, NaN, which makes the whole evaluation's loss NaN.
    Under mirrored and multi_worker_mirrored, where each replica's metrics are its own, a
    replica skips an empty batch. Under central storage a metric update is a cross-replica
    call, which a condition cannot hold: there the batch's size is made unknown to the trace
    (the first trace has the first batch's shapes), so the loss of no examples is Keras'
    ``divide_no_nan``'s 0, weighted by 0. A user's own ``test_step`` runs as written."""
    import tensorflow as tf

    test_step = model.test_step
    if not uses_keras_step(model, "test_step"):
        return test_step
    if not strategy.replica_variables:
        return lambda data: test_step(tf.nest.map_structure(_any_batch_size, data))

    def step(data):
        examples = tf.shape(tf.nest.flatten(data)[0])[0]
        return tf.cond(examples > 0, lambda: test_step(data), model.get_metrics_result)

    return step


def _any_batch_size(value):
    """``value`` with its first dimension unknown to the trace (a dense tensor of rank >= 1), else as it is."""
    import tensorflow as tf

    if not isinstance(value, tf.Tensor) or value.shape.rank in (None, 0) or value.shape[0] is None:
        return value
    return tf.compat.v1.placeholder_with_default(value, [None, *value.shape[1:]])


class _Functions:
    """The tf.functions of one loop: ``train(iterator, n)`` runs n steps (n a Python int, a
    trace per distinct n) and returns logs; ``test(batch)`` runs one test step."""

    def __init__(self, model, strategy, step_fn, metric_names: frozenset):
        import tensorflow as tf

        test_step = _skipping_empty_batches(model, strategy)
        # As Keras' fit does: a model compiled with jit_compile=True gets its replica steps compiled
        # by XLA inside strategy.run ("auto" has already resolved to False on CPUs and in a scope).
        wanted = getattr(model, "jit_compile", False) is True
        unavailable = f"under {strategy.name}" if strategy.coordinated else strategy.xla_unavailable()
        if wanted and not unavailable:
            step_fn = tf.function(step_fn, jit_compile=True, reduce_retracing=True)
            test_step = tf.function(test_step, jit_compile=True, reduce_retracing=True)
            log.info("the model's train and test steps are compiled with XLA (jit_compile=True)")
        elif wanted:
            log.warning("jit_compile=True is not applied %s; the steps run without XLA", unavailable)
        self._model, self._strategy, self._step, self._test_step = model, strategy, step_fn, test_step
        self._reduce = _reducer(strategy, metric_names)
        self._scheduled = strategy.coordinated
        self._train: dict[int, Any] = {}
        self.test = tf.function(self._test_one, reduce_retracing=True, autograph=False)
        self.test_scheduled = tf.function(self._test_next, autograph=False)
        for function in (self.test, self.test_scheduled):  # made once per loop (per fit)
            without_retracing_warning(function)

    def _logs(self, logs):
        return self._model.get_metrics_result() if logs == {} else logs

    def train(self, n: int):
        import tensorflow as tf

        if n not in self._train:
            strategy, step, reduce = self._strategy, self._step, self._reduce

            def run(iterator):
                _signals.hold("first_trace")  # a test hook (TFDIST_TEST_HOLD); runs while the function is traced
                logs = reduce(strategy.run(step, args=(next(iterator),)))
                if n > 1:
                    def body(i, logs):
                        return i + 1, reduce(strategy.run(step, args=(next(iterator),)))

                    _, logs = tf.while_loop(lambda i, _: i < n - 1, body, (tf.constant(0), logs))
                return {} if self._scheduled else self._logs(logs)

            # No autograph, as in Keras' own train function: the user's train_step is traced as written.
            self._train[n] = without_retracing_warning(tf.function(run, autograph=False))
        return self._train[n]

    def _test_one(self, batch):
        return self._logs(self._reduce(self._strategy.run(self._test_step, args=(batch,))))

    def _test_next(self, iterator):
        self._strategy.run(self._test_step, args=(next(iterator),))


# --- the loop --------------------------------------------------------------------------------


class _ScheduledSteps:
    """Bounds the executions scheduled ahead on parameter servers. ``ClusterCoordinator.schedule``
    does not block, so the whole epoch was queued at once: a preemption (SIGTERM) or a due save
    seen at the next step end then waited for the rest of the epoch and its validation (minutes,
    past a pod's grace period). Here the loop waits for the oldest execution once ``PER_WORKER``
    per worker are queued: enough to keep every worker busy. (tf_keras' own fit, which tfdist
    runs for tf_keras models, was seen acting within a few dozen steps already.)"""

    PER_WORKER = 4

    def __init__(self, strategy, coordinator):
        import collections

        resolver = getattr(strategy, "cluster_resolver", None)
        try:
            workers = resolver.cluster_spec().num_tasks("worker")
        except (AttributeError, ValueError):
            workers = 1
        self.limit = self.PER_WORKER * max(1, workers)
        self._queue = collections.deque()
        self._coordinator = coordinator

    def add(self, remote_value) -> None:
        import tensorflow as tf

        self._queue.append(remote_value)
        while len(self._queue) > self.limit:
            try:
                self._queue.popleft().fetch()  # waits for that execution (its outputs are empty)
            except tf.errors.CancelledError:  # another execution failed: join raises its error
                self._coordinator.join()
                raise


def _floats(logs) -> dict:
    """Logs as Keras' ``fit`` gives them to callbacks and History: scalars as floats, and a dict
    inside them flattened into them (a ``train_step`` returning ``{m.name: m.result() for m in
    self.metrics}``, as Keras' guide writes it, holds ``compile_metrics``' dict of results)."""
    import numpy as np

    out = {}
    for key, value in (logs or {}).items():
        if isinstance(value, dict):
            out.update(_floats(value))
            continue
        array = np.asarray(value)
        out[key] = float(array) if array.ndim == 0 else array
    return out


def run_loop(
    model,
    *,
    strategy,
    train_data,
    steps_per_epoch: int,
    epochs: int,
    start_step: int = 0,
    validation_data=None,
    validation_steps: int | None = None,
    validation_freq: int = 1,
    callbacks: Sequence[Any] = (),
    verbose: int = 1,
    steps_per_execution: int = 1,
    grad_accum_steps: int = 1,
    hooks: Hooks | None = None,
    coordinator=None,
):
    """Trains ``model`` from global step ``start_step`` to ``steps_per_epoch * epochs``;
    returns the ``keras.callbacks.History`` of the epochs it ran.

    Every process of a synchronous cluster must call it with the same arguments.

    Args:
      model: a compiled Keras 3 model built in ``strategy``'s scope (see :func:`building_scope`),
        its state created by :func:`prepare` (and possibly restored from a checkpoint since).
      train_data: synchronous strategies: a distributed dataset
        (``strategy.distribute_datasets_from_function``) whose elements are the batches of
        the global steps ``start_step, start_step + 1, ...``, at least as many as are run.
        Parameter servers: a per-worker dataset (``coordinator.create_per_worker_dataset``)
        that never ends; each element is the batch of one step on that worker.
      steps_per_epoch, epochs: the run's length; the loop starts in epoch
        ``start_step // steps_per_epoch`` at step ``start_step % steps_per_epoch`` of it.
      validation_data: after each epoch. Synchronous strategies: a batched ``tf.data.Dataset``
        or a distributed dataset, read to its end (or ``validation_steps`` batches).
        Parameter servers: a per-worker dataset that never ends; ``validation_steps`` is then required.
      validation_freq: validate after every ``validation_freq``-th epoch (epochs counted from 1), as Keras.
      callbacks: Keras 3 callbacks; they receive the calls ``model.fit`` makes, with the
        batch index within the epoch (a resumed epoch starts at its real step). A progress
        bar is added unless ``verbose == 0``.
      steps_per_execution: steps run in one ``tf.function`` call. Executions end at multiples
        of it within the epoch and at the epoch's end; batch callbacks and ``hooks.on_step_end``
        are called once per execution.
      grad_accum_steps: split every replica's batch into this many micro batches and apply
        their summed gradient once (needs Keras' own ``train_step``; see :func:`accumulating_train_step`).
      hooks: tfdist's controller (see :class:`Hooks`).
      coordinator: the ``ClusterCoordinator`` under parameter servers, else None.
    """
    import keras
    import tensorflow as tf

    _checks.check_int("steps_per_epoch", steps_per_epoch, error=DataError, minimum=1)
    _checks.check_int("epochs", epochs, error=DataError, minimum=1)
    _checks.check_int("start_step", start_step, error=DataError, minimum=0)
    _checks.check_int("steps_per_execution", steps_per_execution, error=DataError, minimum=1)
    _checks.check_int("grad_accum_steps", grad_accum_steps, error=DataError, minimum=1)
    _checks.check_int("validation_freq", validation_freq, error=DataError, minimum=1)
    strategy = wrap(strategy)
    scheduled = strategy.coordinated
    if scheduled != (coordinator is not None):
        raise DataError(
            f"a ClusterCoordinator goes with parameter_server and only with it; received coordinator={coordinator!r} "
            f"under {type(strategy.tf).__name__}. Fix: pass the coordinator that schedules this strategy's steps, "
            "or none."
        )
    if scheduled and validation_data is not None and validation_steps is None:
        raise DataError(
            "validation under parameter_server reads a per-worker dataset that never ends; received validation_steps=None. "
            "Fix: pass validation_steps (batches per validation)."
        )
    check_model(model)
    hooks = hooks if hooks is not None else Hooks()
    total_steps = steps_per_epoch * epochs

    if grad_accum_steps > 1:
        check_accumulation(model, strategy, grad_accum_steps)
        step_fn = accumulating_train_step(model, grad_accum_steps, unrolled=strategy.aggregating_variables)
    else:
        step_fn = model.train_step
    with strategy.scope():
        metric_names = frozenset(model.get_metrics_result())  # read once, in the same place on every worker
    functions = _Functions(model, strategy, step_fn, metric_names)
    if validation_data is not None and not scheduled and isinstance(validation_data, tf.data.Dataset):
        validation_data = strategy.experimental_distribute_dataset(validation_data)

    callback_list = keras.callbacks.CallbackList(
        list(callbacks), add_history=True, add_progbar=verbose != 0, model=model,
        verbose=verbose, epochs=epochs, steps=steps_per_epoch,
    )
    history = next(c for c in callback_list.callbacks if isinstance(c, keras.callbacks.History))
    model.stop_training = False
    iterator = iter(train_data)
    in_flight = _ScheduledSteps(strategy, coordinator) if scheduled else None
    step = start_step
    epoch_logs: dict = {}
    callback_list.on_train_begin()
    hooks.on_train_begin()
    for epoch in range(start_step // steps_per_epoch, epochs):
        if step >= total_steps:
            break
        model.reset_metrics()
        hooks.on_epoch_begin(epoch)
        callback_list.on_epoch_begin(epoch)
        hooks.after_epoch_begin(epoch)
        logs: dict = {}
        epoch_end = (epoch + 1) * steps_per_epoch
        while step < epoch_end:
            begin = step % steps_per_epoch
            n = min(steps_per_execution - begin % steps_per_execution, steps_per_epoch - begin)
            callback_list.on_train_batch_begin(begin)
            if scheduled:
                in_flight.add(coordinator.schedule(functions.train(n), args=(iterator,)))
            else:
                logs = functions.train(n)(iterator)
            step += n
            callback_list.on_train_batch_end(begin + n - 1, logs)
            hooks.on_step_end(step)
            if model.stop_training:
                break
        if scheduled:
            coordinator.join()
            with strategy.scope():
                logs = model.get_metrics_result()
        epoch_logs = _floats(logs)
        if validation_data is not None and (epoch + 1) % validation_freq == 0:
            epoch_logs.update(
                {f"val_{k}": v for k, v in _validate(model, strategy, functions, callback_list, validation_data,
                                                     validation_steps, coordinator).items()}
            )
        recorded = {key: len(values) for key, values in history.history.items()}
        callback_list.on_epoch_end(epoch, epoch_logs)
        if history.epoch and history.epoch[-1] == epoch:  # what History recorded, with keys callbacks added
            # Only this epoch's keys: an epoch without validation (validation_freq) has no val_ ones.
            epoch_logs = {key: values[-1] for key, values in history.history.items()
                          if len(values) > recorded.get(key, 0)}
        hooks.on_epoch_end(epoch, dict(epoch_logs))
        if model.stop_training:
            break
    # As fit: an optimizer with use_ema=True writes its averages into the weights (else nothing).
    model.optimizer.finalize_variable_values(model.trainable_weights)
    callback_list.on_train_end(logs=epoch_logs)
    hooks.on_train_end()
    return model.history


_EVALUATED = LastModelCache()  # the test function of the model evaluated last


def evaluate_loop(model, *, strategy, data, steps: int | None = None, callbacks: Sequence[Any] = (),
                  verbose: int = 1) -> dict:
    """Keras' ``evaluate`` under any synchronous ``strategy``: one pass over ``data`` (a
    distributed dataset; at most ``steps`` batches) with the model's ``test_step`` in every
    replica; returns the logs, the metrics of every example read.

    Every process of a synchronous cluster must call it with the same arguments."""
    import keras

    check_model(model)
    strategy = wrap(strategy)

    def make():
        with strategy.scope():
            metric_names = frozenset(model.get_metrics_result())
        return _Functions(model, strategy, model.train_step, metric_names)

    functions = _EVALUATED.get(model, make)
    callback_list = keras.callbacks.CallbackList(list(callbacks), add_progbar=verbose != 0, model=model,
                                                 verbose=verbose, epochs=1, steps=steps)
    return _validate(model, strategy, functions, callback_list, data, steps, None)


def _validate(model, strategy, functions: _Functions, callback_list, data, steps: int | None, coordinator) -> dict:
    """One pass over the validation data with the model's test_step, as ``fit`` runs ``evaluate``;
    a model with nothing to compute there is refused in one line."""
    try:
        return _validate_pass(model, strategy, functions, callback_list, data, steps, coordinator)
    except (ValueError, NotImplementedError) as e:
        no_call = isinstance(e, NotImplementedError) and "call()" in str(e)
        if not no_call and "No loss to compute" not in str(e):
            raise
        raise nothing_to_validate(model, "no call() method, which" if no_call else "no compiled loss, and") from None


def _validate_pass(model, strategy, functions: _Functions, callback_list, data, steps: int | None, coordinator) -> dict:
    model.reset_metrics()
    model.stop_evaluating = False
    callback_list.on_test_begin()
    logs: dict = {}
    if coordinator is not None:
        iterator = iter(data)
        for i in range(steps):
            callback_list.on_test_batch_begin(i)
            coordinator.schedule(functions.test_scheduled, args=(iterator,))
            callback_list.on_test_batch_end(i, {})
        coordinator.join()
        with strategy.scope():
            logs = model.get_metrics_result()
    else:
        for i, batch in enumerate(data):
            if steps is not None and i >= steps:
                break
            callback_list.on_test_batch_begin(i)
            logs = functions.test(batch)
            callback_list.on_test_batch_end(i, logs)
            if model.stop_evaluating:
                break
    logs = _floats(logs)
    callback_list.on_test_end(logs)
    return logs
