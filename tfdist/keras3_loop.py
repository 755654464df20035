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

import contextlib
import inspect
import logging
from typing import Any, Sequence

from tfdist.errors import DataError, ModelError

log = logging.getLogger("tfdist")

__all__ = [
    "Hooks",
    "building_scope",
    "built_in",
    "rebuild_in_scope",
    "check_model",
    "is_keras3",
    "prepare",
    "random_state",
    "replica_local_variables",
    "run_loop",
]


class Hooks:
    """What the loop tells tfdist's controller; every method is a no-op here.

    Each is called on every process at the same point of the loop. ``on_step_end`` comes at
    the end of each execution (every ``steps_per_execution`` steps, and at an epoch's last
    step); it may save (a collective under multi_worker_mirrored) or raise to stop (the
    exception propagates out of :func:`run_loop`). Under parameter servers it comes when the
    execution has been *scheduled*: join the coordinator before reading or saving state.
    """

    def on_train_begin(self) -> None:
        """Before the first epoch, before the user's callbacks see ``on_train_begin``."""

    def on_epoch_begin(self, epoch: int) -> None:
        """After the model's metrics were reset for ``epoch``: a resumed epoch restores its accumulators here."""

    def on_step_end(self, global_step: int) -> None:
        """After the execution that ends at ``global_step`` (steps since the run began, all epochs)."""

    def on_epoch_end(self, epoch: int, logs: dict) -> None:
        """After validation and the user's ``on_epoch_end``; ``logs`` are Python floats, ``val_`` ones included."""

    def on_train_end(self) -> None:
        """After the user's ``on_train_end``; not called when an exception ends the loop."""


# --- which Keras ---------------------------------------------------------------------------


def _defined_in(obj: Any, package: str) -> bool:
    """True if a class in ``obj``'s MRO comes from ``package`` (a user's subclass lives in
    the user's module, so its own ``__module__`` does not tell)."""
    return any(c.__module__ == package or c.__module__.startswith(package + ".") for c in type(obj).__mro__)


def is_keras3(obj: Any) -> bool:
    """True for an instance of a Keras 3 class or a subclass of one (tf_keras is ``tf_keras.*``)."""
    return _defined_in(obj, "keras")


def check_model(model: Any) -> None:
    """Refuses a Keras 3 model that tfdist cannot train: another backend than TensorFlow,
    tf_keras layers inside it, or no ``compile``."""
    import keras

    backend = keras.backend.backend()
    if backend != "tensorflow":
        raise ModelError(
            f"tfdist trains Keras 3 models on the TensorFlow backend; received KERAS_BACKEND={backend!r}. "
            "Fix: set KERAS_BACKEND=tensorflow before Keras is imported."
        )
    if not isinstance(model, keras.Model):
        raise ModelError(
            f"the model must be a compiled keras.Model; received {type(model).__module__}.{type(model).__name__}. "
            "Fix: pass a function that builds and compiles a Keras 3 model."
        )
    foreign = sorted({f"{name} ({type(value).__name__})" for name, value in _tf_keras_attributes(model)})
    if foreign:
        raise ModelError(
            f"the Keras 3 model {model.name!r} holds tf_keras layers, which Keras 3 neither tracks nor trains; "
            f"received {', '.join(foreign)}. Fix: build every layer with Keras 3 (`import keras`), or the whole "
            "model with tf_keras."
        )
    if not getattr(model, "compiled", False) or model.optimizer is None:
        raise ModelError(
            f"the model {model.name!r} is not compiled; received a model without optimizer. "
            "Fix: call model.compile(optimizer=..., loss=..., metrics=...) in your builder."
        )


def _tf_keras_attributes(model):
    """(attribute, value) of the model and its layers that are tf_keras objects.

    Uses ``Layer._flatten_layers`` (private, in Keras since 2.x and 3.0) to visit the layers."""
    layers = [model, *model._flatten_layers(include_self=False)] if hasattr(model, "_flatten_layers") else [model]
    for layer in layers:
        for name, value in vars(layer).items():
            if name.startswith("_self_"):  # the tracking machinery's own bookkeeping
                continue
            values = value if isinstance(value, (list, tuple)) else list(value.values()) if isinstance(value, dict) else [value]
            for item in values:
                if _defined_in(item, "tf_keras"):
                    yield f"{type(layer).__name__}.{name}", item


# --- strategies ------------------------------------------------------------------------------


def _kind(strategy) -> str:
    import tensorflow as tf

    if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
        return "parameter_server"
    if isinstance(strategy, tf.distribute.experimental.CentralStorageStrategy):
        return "central_storage"
    return "replicated"  # one_device, mirrored, multi_worker_mirrored: one copy of every variable per replica


@contextlib.contextmanager
def building_scope(strategy):
    """The scope to build (or clone) a Keras 3 model and its optimizer in.

    Under central_storage a variable lives once, on the parameter device, and a replica may
    update it only if it has an aggregation; Keras 3 creates BatchNormalization's moving
    statistics and every SeedGenerator's state with none, so their first update fails
    ("You must specify an aggregation method to update a AggregatingVariable in Replica
    Context"). Here such variables get one: MEAN for floats (the replicas' moving statistics
    are averaged), ONLY_FIRST_REPLICA otherwise (every replica advances a seed the same way).
    Other strategies keep Keras' own variables unchanged.
    """
    import tensorflow as tf

    with strategy.scope():
        if _kind(strategy) != "central_storage":
            yield
            return

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
                kwargs["aggregation"] = tf.VariableAggregation.MEAN if floating else tf.VariableAggregation.ONLY_FIRST_REPLICA
            return next_creator(**kwargs)

        with tf.variable_creator_scope(creator):
            yield


def built_in(model, strategy) -> bool:
    """True if ``model`` was created in ``strategy``'s scope (call it outside any scope:
    Keras answers with the current strategy for a model built outside one)."""
    return model.distribute_strategy is strategy


def rebuild_in_scope(model, strategy):
    """A copy of a compiled Keras 3 model made outside ``strategy``'s scope, built in that
    scope with the same weights and compile arguments (public API: ``clone_model``,
    ``get_compile_config``/``compile_from_config``). The optimizer is a new one of the same
    configuration: slots and iteration count are not carried over. A subclassed model
    needs a ``get_config`` that ``from_config`` can rebuild it from."""
    import keras

    check_model(model)
    if int(model.optimizer.iterations.numpy()):
        log.warning("model %s was trained before: its copy in the strategy's scope starts with a new optimizer "
                    "(weights are kept, optimizer slots and iteration count are not)", model.name)
    config = model.get_compile_config()
    try:
        with building_scope(strategy):
            clone = keras.models.clone_model(model)
            clone.set_weights(model.get_weights())
            clone.compile_from_config(config)
    except (TypeError, ValueError, NotImplementedError) as e:
        raise ModelError(
            f"the model {model.name!r} was created outside the strategy's scope and cannot be rebuilt in it "
            f"({type(e).__name__}: {str(e).splitlines()[0][:160]}); received {type(model).__name__}. Fix: pass a "
            "function that builds and compiles the model (tfdist calls it inside the scope), or give the "
            "subclass a get_config()."
        ) from None
    log.info("model %s was created outside the strategy's scope: rebuilt inside it with its weights", model.name)
    return clone


# --- state -----------------------------------------------------------------------------------


def prepare(model, *, strategy, sample: tuple, grad_accum_steps: int = 1) -> None:
    """Creates all of the model's state now, so that a checkpoint can be restored into it
    before the first step: the layers, the compiled loss and metrics, the optimizer's slots.

    ``sample`` is one ``(x, y)`` or ``(x, y, sample_weight)`` micro batch (NumPy or tensors).
    Keras creates metric variables at the first step; created inside a replica's part of a
    ``tf.function`` they fail under mirrored ("You must feed a value for placeholder tensor
    'cond/.../Placeholder'"), so this runs the model's ``test_step`` once, eagerly, in every
    replica, and resets the metrics (a test step changes nothing else). Call it on every
    process, in the order the model was built.
    """
    import tensorflow as tf

    check_model(model)
    kind = _kind(strategy)
    if grad_accum_steps > 1:
        _check_accumulation(model, strategy, grad_accum_steps)
    keras_steps = getattr(model.optimizer, "gradient_accumulation_steps", None)
    if keras_steps and not isinstance(strategy, tf.distribute.OneDeviceStrategy):
        raise ModelError(
            f"the optimizer's own gradient accumulation fails under {type(strategy).__name__} (keras-team/keras#20582); "
            f"received gradient_accumulation_steps={keras_steps}. Fix: drop it from the optimizer and pass "
            "grad_accum_steps to tfdist, which accumulates exactly under every synchronous strategy."
        )
    sample = tf.nest.map_structure(tf.convert_to_tensor, tuple(sample))
    with strategy.scope():
        model(sample[0], training=False)  # builds the layers in cross-replica context
        if kind == "parameter_server":
            model.test_step(sample)
        else:
            values = strategy.experimental_distribute_values_from_function(lambda _: sample)
            strategy.run(model.test_step, args=(values,))
        model.reset_metrics()
        if not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
    if kind in ("central_storage", "parameter_server"):
        # Keras 3's Variable.assign_add is ``assign(self + value)``: under central_storage a
        # replica-context assign of a SUM variable adds every replica's ``self + value``
        # (the count of a Mean grows R times too fast), and on a parameter server two
        # workers' read-add-writes race and lose updates. The tf.Variable's own
        # assign_add is one atomic op, summed once over replicas.
        counters = [v for v in model.metrics_variables] + [model.optimizer.iterations]
        for variable in counters:
            _use_native_increments(variable)


def _use_native_increments(variable) -> None:
    import tensorflow as tf

    def assign_add(value):
        return variable.value.assign_add(tf.cast(value, variable.value.dtype))

    def assign_sub(value):
        return variable.value.assign_sub(tf.cast(value, variable.value.dtype))

    variable.assign_add = assign_add
    variable.assign_sub = assign_sub


def random_state(model) -> dict[str, Any]:
    """The state of every ``keras.random.SeedGenerator`` of the model (Dropout's and other
    random layers'), keyed by position. ``tf.train.Checkpoint(model=model)`` does not save
    them: checkpoint these too, or a resumed run draws other random numbers."""
    weights = {id(w) for w in model.weights}
    return {f"seed{i}": v for i, v in enumerate(v for v in model.variables if id(v) not in weights)}


def replica_local_variables(model) -> list:
    """The variables whose replicas may hold different values, as Keras variables.

    Under mirrored and multi_worker_mirrored: every metric variable (ON_READ, a partial sum
    per replica) and every non-trainable variable a replica updates on its own
    (BatchNormalization's moving statistics are MirroredVariables with aggregation NONE:
    each replica keeps the statistics of its own batches, and a checkpoint stores only the
    first replica's). For a bit-identical resume, save each replica's value of these and put
    each back into its own replica. Empty for strategies with one copy of each variable.
    """
    import tensorflow as tf

    found = []
    for variable in [*model.metrics_variables, *model.non_trainable_variables]:
        value = variable.value
        if isinstance(value, tf.distribute.DistributedValues) and len(value.values) > 1:
            found.append(variable)
    return found


# --- steps -----------------------------------------------------------------------------------


def _check_accumulation(model, strategy, steps: int) -> None:
    import keras

    if _kind(strategy) == "parameter_server":
        raise ModelError(
            f"gradient accumulation is not supported under parameter_server; received grad_accum_steps={steps}. "
            "Fix: use a synchronous strategy, or a larger per-worker batch instead."
        )
    if type(model).train_step is not keras.Model.train_step:
        raise ModelError(
            f"gradient accumulation runs Keras' own train step on each micro batch; received a model whose class "
            f"{type(model).__name__} overrides train_step. Fix: accumulate in your train_step, or use grad_accum_steps=1."
        )
    if getattr(model.optimizer, "gradient_accumulation_steps", None):
        raise ModelError(
            f"the optimizer accumulates gradients itself; received gradient_accumulation_steps="
            f"{model.optimizer.gradient_accumulation_steps} with grad_accum_steps={steps}. Fix: drop the optimizer's "
            "argument (it fails under tf.distribute, keras-team/keras#20582) and keep tfdist's grad_accum_steps."
        )


def accumulating_train_step(model, steps: int, *, unrolled: bool = False):
    """A replica step that splits its batch into ``steps`` micro batches, sums their
    gradients and applies them once: one cross-replica reduction and one optimizer
    iteration per step, the same update as one batch of all the examples.

    It is Keras' ``train_step`` (public API only) with a loop over micro batches; metrics
    and BatchNormalization's statistics are updated once per micro batch. ``unrolled``
    repeats the micro step in the graph instead of a ``tf.while_loop``: needed under
    central_storage, where updating a metric or a moving statistic is a ``merge_call``,
    which TensorFlow refuses inside a loop.
    """
    import keras
    import tensorflow as tf

    optimizer = model.optimizer
    loss_tracker = next((m for m in model.metrics if m.name == "loss" and isinstance(m, keras.metrics.Mean)), None)
    takes_training = "training" in inspect.signature(model.compute_loss).parameters

    def step(data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        split = lambda t: tf.reshape(t, tf.concat([[steps, -1], tf.shape(t)[1:]], 0))  # noqa: E731
        xs, ys = tf.nest.map_structure(split, x), tf.nest.map_structure(split, y)
        ws = None if sample_weight is None else tf.nest.map_structure(split, sample_weight)
        variables = model.trainable_variables
        replicas = tf.distribute.get_strategy().num_replicas_in_sync

        def micro_step(i, total):
            pick = lambda t: tf.gather(t, i)  # noqa: E731
            xi, yi = tf.nest.map_structure(pick, xs), tf.nest.map_structure(pick, ys)
            wi = None if ws is None else tf.nest.map_structure(pick, ws)
            with tf.GradientTape() as tape:
                y_pred = model(xi, training=True)
                kwargs = {"training": True} if takes_training else {}
                loss = model.compute_loss(x=xi, y=yi, y_pred=y_pred, sample_weight=wi, **kwargs)
                if loss_tracker is not None:
                    # Keras scales the loss by 1/replicas for the summed gradients; the
                    # tracker reports the unscaled value (as Keras' train_step does).
                    count = tf.shape(tf.nest.flatten(xi)[0])[0]
                    loss_tracker.update_state(loss * tf.cast(replicas, loss.dtype), sample_weight=count)
                scaled = optimizer.scale_loss(loss)
            grads = tape.gradient(scaled, variables)
            model.compute_metrics(xi, yi, y_pred, sample_weight=wi)
            return i + 1, [t + tf.convert_to_tensor(g) for t, g in zip(total, grads)]

        state = (tf.constant(0), [tf.zeros_like(v) for v in variables])
        if unrolled:
            for _ in range(steps):
                state = micro_step(*state)
            total = state[1]
        else:
            _, total = tf.while_loop(lambda i, _: i < steps, micro_step, state)
        optimizer.apply([t / steps for t in total], variables)
        return model.get_metrics_result()

    return step


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


class _Functions:
    """The tf.functions of one loop: ``train(iterator, n)`` runs n steps (n a Python int, a
    trace per distinct n) and returns logs; ``test(batch)`` runs one test step."""

    def __init__(self, model, strategy, step_fn, metric_names: frozenset, *, parameter_server: bool):
        import tensorflow as tf

        self._model, self._strategy, self._step = model, strategy, step_fn
        self._reduce = _reducer(strategy, metric_names)
        self._ps = parameter_server
        self._train: dict[int, Any] = {}
        self.test = tf.function(self._test_one, reduce_retracing=True, autograph=False)
        self.test_scheduled = tf.function(self._test_next, autograph=False)

    def _logs(self, logs):
        return self._model.get_metrics_result() if logs == {} else logs

    def train(self, n: int):
        import tensorflow as tf

        if n not in self._train:
            strategy, step, reduce = self._strategy, self._step, self._reduce

            def run(iterator):
                logs = reduce(strategy.run(step, args=(next(iterator),)))
                if n > 1:
                    def body(i, logs):
                        return i + 1, reduce(strategy.run(step, args=(next(iterator),)))

                    _, logs = tf.while_loop(lambda i, _: i < n - 1, body, (tf.constant(0), logs))
                return {} if self._ps else self._logs(logs)

            # No autograph, as in Keras' own train function: the user's train_step is traced as written.
            self._train[n] = tf.function(run, autograph=False)
        return self._train[n]

    def _test_one(self, batch):
        return self._logs(self._reduce(self._strategy.run(self._model.test_step, args=(batch,))))

    def _test_next(self, iterator):
        self._strategy.run(self._model.test_step, args=(next(iterator),))


# --- the loop --------------------------------------------------------------------------------


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise DataError(f"Invalid `{name}`; received {name}={value!r}. Fix: use an integer >= {minimum}.")


def _floats(logs) -> dict:
    import numpy as np

    out = {}
    for key, value in (logs or {}).items():
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

    _check_int("steps_per_epoch", steps_per_epoch, 1)
    _check_int("epochs", epochs, 1)
    _check_int("start_step", start_step, 0)
    _check_int("steps_per_execution", steps_per_execution, 1)
    _check_int("grad_accum_steps", grad_accum_steps, 1)
    kind = _kind(strategy)
    parameter_server = kind == "parameter_server"
    if parameter_server != (coordinator is not None):
        raise DataError(
            f"a ClusterCoordinator goes with parameter_server and only with it; received coordinator={coordinator!r} "
            f"under {type(strategy).__name__}. Fix: pass the coordinator that schedules this strategy's steps, or none."
        )
    if parameter_server and validation_data is not None and validation_steps is None:
        raise DataError(
            "validation under parameter_server reads a per-worker dataset that never ends; received validation_steps=None. "
            "Fix: pass validation_steps (batches per validation)."
        )
    check_model(model)
    hooks = hooks if hooks is not None else Hooks()
    total_steps = steps_per_epoch * epochs

    if grad_accum_steps > 1:
        _check_accumulation(model, strategy, grad_accum_steps)
        step_fn = accumulating_train_step(model, grad_accum_steps, unrolled=kind == "central_storage")
    else:
        step_fn = model.train_step
    with strategy.scope():
        metric_names = frozenset(model.get_metrics_result())  # read once, in the same place on every worker
    functions = _Functions(model, strategy, step_fn, metric_names, parameter_server=parameter_server)
    if validation_data is not None and not parameter_server and isinstance(validation_data, tf.data.Dataset):
        validation_data = strategy.experimental_distribute_dataset(validation_data)

    callback_list = keras.callbacks.CallbackList(
        list(callbacks), add_history=True, add_progbar=verbose != 0, model=model,
        verbose=verbose, epochs=epochs, steps=steps_per_epoch,
    )
    model.stop_training = False
    iterator = iter(train_data)
    step = start_step
    epoch_logs: dict = {}
    hooks.on_train_begin()
    callback_list.on_train_begin()
    for epoch in range(start_step // steps_per_epoch, epochs):
        if step >= total_steps:
            break
        model.reset_metrics()
        hooks.on_epoch_begin(epoch)
        callback_list.on_epoch_begin(epoch)
        logs: dict = {}
        epoch_end = (epoch + 1) * steps_per_epoch
        while step < epoch_end:
            begin = step % steps_per_epoch
            n = min(steps_per_execution - begin % steps_per_execution, steps_per_epoch - begin)
            callback_list.on_train_batch_begin(begin)
            if parameter_server:
                coordinator.schedule(functions.train(n), args=(iterator,))
            else:
                logs = functions.train(n)(iterator)
            step += n
            callback_list.on_train_batch_end(begin + n - 1, logs)
            hooks.on_step_end(step)
            if model.stop_training:
                break
        if parameter_server:
            coordinator.join()
            with strategy.scope():
                logs = model.get_metrics_result()
        epoch_logs = _floats(logs)
        if validation_data is not None:
            epoch_logs.update(
                {f"val_{k}": v for k, v in _validate(model, strategy, functions, callback_list, validation_data,
                                                     validation_steps, coordinator).items()}
            )
        callback_list.on_epoch_end(epoch, epoch_logs)
        history = model.history
        if history.epoch and history.epoch[-1] == epoch:  # what History recorded, with keys callbacks added
            epoch_logs = {key: values[-1] for key, values in history.history.items()}
        hooks.on_epoch_end(epoch, dict(epoch_logs))
        if model.stop_training:
            break
    # As fit: an optimizer with use_ema=True writes its averages into the weights (else nothing).
    model.optimizer.finalize_variable_values(model.trainable_weights)
    callback_list.on_train_end(logs=epoch_logs)
    hooks.on_train_end()
    return model.history


def _validate(model, strategy, functions: _Functions, callback_list, data, steps: int | None, coordinator) -> dict:
    """One pass over the validation data with the model's test_step, as ``fit`` runs ``evaluate``."""
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
