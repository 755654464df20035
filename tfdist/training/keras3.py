"""The model side of fit for Keras 3 (TensorFlow's default Keras): checks, building in scope, state, accumulation.

tfdist trains Keras 3 models with its own loop (``training.loop``): Keras 3's ``fit`` does not
run under every ``tf.distribute`` strategy. This module prepares the model for it: builds it
in the strategy's scope (``building_scope``), creates its state before the first step so that
a checkpoint restores into it (``prepare``), names the state a checkpoint must add to what
``tf.train.Checkpoint(model=...)`` saves (``random_state``, ``replica_local_variables``), and
accumulates gradients exactly under every synchronous strategy (``accumulating_train_step``).

The Keras internals it needs (compile state, symbolic build, rebound methods) are entries of
``tfdist._compat.keras3``.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

from tfdist._compat import keras3 as keras3_compat
from tfdist._compat import keras_common as keras_compat
from tfdist.errors import ModelError
from tfdist.strategy_kinds import wrap
from tfdist.training.adapter import KerasAdapter
from tfdist.training.keras_common import (carry_weight_decay_exclusions, check_own_train_step, compile_fix, defined_in,
                                          fresh_metrics, held_optimizers, inherited_from, is_default_optimizer,
                                          merged_history, model_fingerprint, no_labels_for_loss, not_a_model,
                                          summed_gradients, warn_low_precision_outputs)

log = logging.getLogger("tfdist")


# --- which Keras ---------------------------------------------------------------------------


def is_keras3(obj: Any) -> bool:
    """True for an instance of a Keras 3 class or a subclass of one (tf_keras is ``tf_keras.*``)."""
    return defined_in(obj, "keras")


def check_model(model: Any, *, use: str = "fit") -> None:
    """Refuses a Keras 3 model that tfdist cannot ``use`` (fit, evaluate, predict): another
    backend than TensorFlow, tf_keras layers inside it, or no ``compile`` (predict needs none)."""
    import keras

    backend = keras.backend.backend()
    if backend != "tensorflow":
        raise ModelError(
            f"tfdist trains Keras 3 models on the TensorFlow backend; received KERAS_BACKEND={backend!r}. "
            "Fix: set KERAS_BACKEND=tensorflow before Keras is imported."
        )
    if not isinstance(model, keras.Model):
        raise not_a_model(model, use=use, kind="keras.Model")
    foreign = sorted({f"{name} ({type(value).__name__})" for name, value in _tf_keras_attributes(model)})
    if foreign:
        raise ModelError(
            f"the Keras 3 model {model.name!r} holds tf_keras layers, which Keras 3 neither tracks nor trains; "
            f"received {', '.join(foreign)}. Fix: build every layer with Keras 3 (`import keras`), or the whole "
            "model with tf_keras."
        )
    if use != "predict" and (not getattr(model, "compiled", False) or model.optimizer is None):
        raise ModelError(
            f"the model {model.name!r} is not compiled; received a model without optimizer. "
            f"Fix: {compile_fix(use)}"
        )


def check_ema_overwrite(optimizer, strategy) -> None:
    """Refuses an optimizer that writes its moving averages into the model every N steps
    (``use_ema=True, ema_overwrite_frequency=N``) under a strategy with several replicas or
    central storage: Keras does it in a ``tf.cond`` that calls ``merge_call``, which fails at the
    first step (in Keras' own ``fit`` too)."""
    strategy = wrap(strategy)
    if not strategy.merge_call_in_step:
        return
    frequency = getattr(optimizer, "ema_overwrite_frequency", None)
    if getattr(optimizer, "use_ema", False) and frequency:
        raise ModelError(
            "Keras 3 cannot write the optimizer's moving averages into the model every few steps under "
            f"{strategy.name} (in its own fit too: merge_call inside a cond); received "
            f"{type(optimizer).__name__}(use_ema=True, ema_overwrite_frequency={frequency}). Fix: pass "
            "ema_overwrite_frequency=None (the averages are then written at the end of training), or train on one "
            "device."
        )


def _tf_keras_attributes(model):
    """(attribute, value) of the model and its layers that are tf_keras objects.

    Visits the layers with ``_compat.keras_common.sublayers``."""
    layers = [model, *keras_compat.sublayers(model)]
    for layer in layers:
        for name, value in vars(layer).items():
            if name.startswith("_self_"):  # the tracking machinery's own bookkeeping
                continue
            values = value if isinstance(value, (list, tuple)) else list(value.values()) if isinstance(value, dict) else [value]
            for item in values:
                if defined_in(item, "tf_keras"):
                    yield f"{type(layer).__name__}.{name}", item


# --- strategies ------------------------------------------------------------------------------


def building_scope(strategy):
    """The scope to build (or clone) a Keras 3 model and its optimizer in: the strategy's
    ``building_scope()``, in which replicas can update every variable Keras 3 makes
    (under central_storage, variables without an aggregation get one)."""
    return wrap(strategy).building_scope()


def built_in(model, strategy) -> bool:
    """True if ``model`` was created in ``strategy``'s scope (call it outside any scope:
    Keras answers with the current strategy for a model built outside one)."""
    return model.distribute_strategy is wrap(strategy).tf


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
    try:
        with building_scope(strategy):
            model.compiled = False  # else clone_model compiles the copy from the config, which needs registered
            try:                    # functions: it is compiled with the arguments themselves below
                clone = keras.models.clone_model(model)
            finally:
                model.compiled = True
            if model.weights:  # none yet: a subclass that model.build(shape) marked built without making them
                if len(clone.weights) != len(model.weights) and model.get_build_config():
                    clone.build_from_config(model.get_build_config())  # a subclass from_config() leaves unbuilt
                clone.set_weights(model.get_weights())
            clone.compile(**_compile_arguments(model))
            carry_weight_decay_exclusions(model.optimizer, clone.optimizer, model.weights, clone.weights)
    except (TypeError, ValueError, NotImplementedError) as e:
        subclass = "" if isinstance(model, keras.Sequential) or keras3_compat.is_functional(model) else (
            ", or give the subclass a get_config()")
        raise ModelError(
            f"the model {model.name!r} was created outside the strategy's scope and cannot be rebuilt in it "
            f"({type(e).__name__}: {' '.join(str(e).split())[:400]}); received {type(model).__name__}. Fix: pass a "
            f"function that builds and compiles the model (tfdist calls it inside the scope){subclass}."
        ) from None
    log.info("model %s was created outside the strategy's scope: rebuilt inside it with its weights", model.name)
    return clone


def _compile_arguments(model) -> dict:
    """What ``model.compile`` was given, for its copy in a strategy's scope: the same losses and
    metric functions (a function of the user's needs no registration, as it would to be
    serialized), a new optimizer of the same configuration and new metric objects (their
    variables belong to the scope they were made in)."""
    import keras

    arguments = keras3_compat.compile_config(model)
    arguments["optimizer"] = keras.optimizers.deserialize(keras.optimizers.serialize(model.optimizer))
    for key in ("metrics", "weighted_metrics"):
        arguments[key] = fresh_metrics(keras, arguments.get(key))
    return arguments


# --- state -----------------------------------------------------------------------------------


def prepare(model, *, strategy, sample: Any, grad_accum_steps: int = 1) -> None:
    """Creates all of the model's state now, so that a checkpoint can be restored into it
    before the first step: the layers, the compiled loss and metrics (:func:`prepare_metrics`),
    the optimizers' slots. ``sample`` is one micro batch as the model's ``train_step`` receives
    it (NumPy or tensors). Nothing runs a step: every random state, counter and metric stays as
    it was. Call it on every process, in the order the model was built.
    """
    import tensorflow as tf

    check_model(model)
    strategy = wrap(strategy)
    check_labels_for_loss(model, sample)
    if grad_accum_steps > 1:
        check_accumulation(model, strategy, grad_accum_steps)
    keras_steps = getattr(model.optimizer, "gradient_accumulation_steps", None)
    if keras_steps and not isinstance(strategy.tf, tf.distribute.OneDeviceStrategy):
        raise ModelError(
            f"the optimizer's own gradient accumulation fails under {type(strategy.tf).__name__} "
            "(keras-team/keras#20582); "
            f"received gradient_accumulation_steps={keras_steps}. Fix: drop it from the optimizer and pass "
            "grad_accum_steps to tfdist, which accumulates exactly under every synchronous strategy."
        )
    prepare_metrics(model, strategy=strategy, sample=sample)
    check_sharded_variables(model, strategy)
    own = own_optimizers(model)
    with strategy.scope():
        if not model.optimizer.built and not (own and _is_default_optimizer(model)):
            model.optimizer.build(model.trainable_variables)
    if any(not optimizer.built for optimizer in own):
        _build_own_optimizers(model, strategy, sample, own)
    for variable in _keras_variables(model):
        keras3_compat.copy_to_cpu_once(variable)
    if not strategy.replica_variables:
        keras3_compat.use_native_increments(model.optimizer.iterations)  # see prepare_metrics
        for optimizer in own:
            if optimizer.built:
                keras3_compat.use_native_increments(optimizer.iterations)
    if strategy.concurrent_updates:
        for layer in keras_compat.sublayers(model):
            keras3_compat.race_free_moving_statistics(layer)


def check_labels_for_loss(model, sample: Any) -> None:
    """Refuses data without labels for a model whose compiled loss needs them under Keras' own
    ``train_step`` (Keras' error comes from deep inside its loss)."""
    import keras

    labelled = isinstance(sample, tuple) and len(sample) >= 2
    if labelled or not uses_keras_step(model, "train_step") or keras3_compat.compiled_loss(model) is None:
        return
    raise no_labels_for_loss(model, f"Keras {keras.__version__}")


def uses_keras_step(model, name: str) -> bool:
    """True if the model's method ``name`` (``train_step``, ``test_step``, ``call``) is Keras' own, not a subclass's."""
    return inherited_from(model, name, "keras")


def own_optimizers(model) -> list:
    """The optimizers a model holds besides ``model.optimizer`` (a GAN's ``d_optimizer`` and
    ``g_optimizer``), found in the model's checkpoint graph, in a fixed order."""
    import keras

    return held_optimizers(model, keras.optimizers.Optimizer)


def _is_default_optimizer(model) -> bool:
    """True if ``model.optimizer`` is the RMSprop ``compile()`` makes when given none
    (``keras_common.is_default_optimizer``)."""
    import keras

    return is_default_optimizer(model.optimizer, keras.optimizers.RMSprop)


def _build_own_optimizers(model, strategy, sample: Any, optimizers: list) -> None:
    """Builds the optimizers a ``train_step`` builds at their first ``apply_gradients`` (a GAN's
    ``d_optimizer`` and ``g_optimizer``) now, in the strategy's scope, over the variables each
    is given: one trace of the step records them, without running it. An optimizer the trace
    does not reach is built at the first step, as in Keras' own ``fit``, and logged."""
    import tensorflow as tf

    unbuilt = [o for o in optimizers if not o.built]
    given: dict[int, list] = {}

    def record(optimizer, apply, grads, trainable_variables=None):
        if optimizer.built:
            return apply(grads, trainable_variables)
        given.setdefault(id(optimizer), list(trainable_variables))
        return None

    specs = tf.nest.map_structure(lambda a: tf.TensorSpec([None, *_shape_of(a)[1:]], tf.as_dtype(a.dtype)), sample)

    def step(batch):  # as a step runs it: in replica context, where mirrored variables can be read
        return strategy.call_as_step(model.train_step, batch)

    try:
        with strategy.scope(), keras3_compat.apply_replaced(unbuilt, record):
            tf.function(step, autograph=False).get_concrete_function(specs)
    except Exception as e:  # noqa: BLE001 -- the trace only looks for the optimizers' variables
        log.debug("tracing %s's train_step to find its optimizers' variables stopped early: %s", model.name, e)
    with strategy.scope():
        for optimizer in unbuilt:
            if id(optimizer) in given:
                optimizer.build(given[id(optimizer)])
    late = [o.name for o in unbuilt if not o.built]
    if late:
        log.warning("the optimizer(s) %s of model %s are built at the first step: a checkpoint restores their "
                    "state only once they are", ", ".join(late), model.name)


def _shape_of(value) -> tuple:
    """The shape of an array or tensor as a tuple."""
    return tuple(getattr(value, "shape", ()))


def _keras_variables(model) -> list:
    """Every Keras variable a checkpoint of the model writes (the model's, its optimizers',
    its metrics'), each once."""
    import keras
    import tensorflow as tf

    found = [*model.variables, *model.optimizer.variables, *model.metrics_variables]
    found += [obj for obj in tf.train.TrackableView(model).descendants() if isinstance(obj, keras.Variable)]
    return list({id(v): v for v in found}.values())


def check_sharded_variables(model, strategy) -> None:
    """Refuses a Keras 3 model whose variables a ``variable_partitioner`` split into shards:
    Keras 3's steps read every variable's handle, which a ShardedVariable does not have."""
    sharded = [v.path for v in model.variables if type(getattr(v, "value", None)).__name__ == "ShardedVariable"]
    if sharded:
        raise ModelError(
            f"Keras 3 models cannot train on variables split by a variable_partitioner; received {len(sharded)} "
            f"sharded variable(s) ({', '.join(sharded[:3])}) under {type(strategy).__name__}. Fix: make the "
            "ParameterServerStrategy without variable_partitioner (or with tfdist's strategy='parameter_server'), "
            "or use a tf_keras model, which trains on sharded variables."
        )


def prepare_metrics(model, *, strategy, sample: Any) -> None:
    """Builds the layers and creates the compiled loss and metric variables now; what evaluating
    a model needs, also one tfdist did not train (loaded from a ``.keras`` file in a scope).

    It builds them as Keras' own ``fit`` does under a strategy, symbolically
    (``Trainer._symbolic_build``): no layer runs on data, so random states, counters and
    metrics stay as they are. Calling it again changes nothing.
    """
    import tensorflow as tf

    strategy = wrap(strategy)
    sample = tf.nest.map_structure(tf.convert_to_tensor, sample)
    # A model with a train_step and no call() (keras.io's GAN and VAE) is never built by Keras:
    # its sub-models are. Keras' own symbolic build would call it, and fail.
    wrapper = not model.built and uses_keras_step(model, "call") and all(
        layer.built for layer in keras_compat.sublayers(model))
    # Keras' symbolic build also builds model.optimizer; prepare() decides that (it may be unused).
    optimizer = model.optimizer if model.optimizer is not None and not model.optimizer.built else None
    with strategy.scope():
        try:
            model.built = model.built or wrapper
            if optimizer is not None:
                optimizer.built = True
            keras3_compat.symbolic_build(model, _with_stand_in_labels(model, sample))
        except RuntimeError as e:  # Keras' "Unable to automatically build the model"
            raise ModelError(
                f"the model {model.name!r} could not be built on a batch of the data ({' '.join(str(e).split())[-300:]}); "
                "received an unbuilt model. Fix: build it in the function that makes it (model.build(input_shape), "
                "or call it once on a batch), or give it keras.Input layers."
            ) from None
        finally:
            if wrapper:
                model.built = False
            if optimizer is not None:
                optimizer.built = False
    if not strategy.replica_variables:
        # Keras 3's Variable.assign_add is ``assign(self + value)``: under central_storage a
        # replica-context assign of a SUM variable adds every replica's ``self + value``
        # (the count of a Mean grows R times too fast), and on a parameter server two
        # workers' read-add-writes race and lose updates. The tf.Variable's own
        # assign_add is one atomic op, summed once over replicas.
        for variable in model.metrics_variables:
            keras3_compat.use_native_increments(variable)
    keras3_compat.output_losses_weighted_by_examples(model)


def _with_stand_in_labels(model, sample: Any) -> Any:
    """``sample``, or ``(x, outputs)`` for data without labels and a model compiled with a loss or
    metrics: its own ``train_step`` makes the targets (an autoencoder's are ``x``), and the
    compiled loss and metrics are built on targets shaped as the outputs."""
    import keras
    import tensorflow as tf

    compiled = keras3_compat.compiled_loss(model) is not None or keras3_compat.compiled_metrics(model) is not None
    if (isinstance(sample, tuple) and len(sample) >= 2) or not compiled or not model.built:
        return sample
    x = sample[0] if isinstance(sample, tuple) else sample
    symbolic = tf.nest.map_structure(lambda t: keras.KerasTensor(t.shape, t.dtype.name), x)
    return x, model.compute_output_spec(symbolic)


def random_state(model) -> dict[str, Any]:
    """The state of every ``keras.random.SeedGenerator`` of the model (Dropout's and other
    random layers'), keyed by position. ``tf.train.Checkpoint(model=model)`` does not save
    them: checkpoint these too, or a resumed run draws other random numbers."""
    weights = {id(w) for w in model.weights}
    return {f"seed{i}": v for i, v in enumerate(v for v in model.variables if id(v) not in weights)}


def global_seed_state(strategy):
    """The state variable of Keras' global seed generator, which ``keras.random`` calls without a
    seed draw from (a user's layer: ``keras.random.normal(shape)``), made now in ``strategy``'s
    scope if no layer made it yet: ``tf.train.Checkpoint(model=model)`` does not save it, so a
    resumed run would draw other numbers. Making it leaves Python's ``random`` as it was (a
    generator without a seed draws its seed from there)."""
    import random

    before = random.getstate()
    try:
        with strategy.scope():
            return keras3_compat.global_seed_generator().state.value
    finally:
        random.setstate(before)


def replica_local_variables(model, strategy) -> list:
    """The variables whose replicas may hold different values, as Keras variables.

    Under mirrored and multi_worker_mirrored: every metric variable (ON_READ, a partial sum
    per replica) and every non-trainable variable a replica updates on its own
    (BatchNormalization's moving statistics are MirroredVariables with aggregation NONE:
    each replica keeps the statistics of its own batches, and a checkpoint stores only the
    first replica's). For a bit-identical resume, save each replica's value of these and put
    each back into its own replica. Empty for strategies with one copy of each variable.
    Under multi_worker_mirrored a worker holds only its own replicas' copies (one each with
    one device per worker): the replica count decides, not the local copies.
    """
    import tensorflow as tf

    strategy = wrap(strategy)
    if strategy.num_replicas_in_sync < 2 or not strategy.replica_variables:
        return []
    return [
        variable for variable in [*model.metrics_variables, *model.non_trainable_variables]
        if isinstance(variable.value, tf.distribute.DistributedValues)
    ]


# --- steps -----------------------------------------------------------------------------------


def check_accumulation(model, strategy, steps: int) -> None:
    import keras

    strategy = wrap(strategy)
    if strategy.coordinated:
        raise ModelError(
            f"gradient accumulation is not supported under {strategy.name}; received grad_accum_steps={steps}. "
            "Fix: use a synchronous strategy, or a larger per-worker batch instead."
        )
    check_own_train_step(model, keras.Model, steps)
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

        total = summed_gradients(micro_step, variables, steps, unrolled=unrolled)
        optimizer.apply([t / steps for t in total], variables)
        return model.get_metrics_result()

    return step


class _ControllerHooks:
    """The loop's hooks, reported to tfdist's controller (``training.controller.Controller``)."""

    def __init__(self, controller, model):
        self._controller, self._model = controller, model
        self._resumed_mid_epoch = controller.start.mid_epoch
        self._first_step = True

    def on_train_begin(self) -> None:
        self._controller.on_train_begin()

    def on_epoch_begin(self, epoch: int) -> None:
        resumed, self._resumed_mid_epoch = self._resumed_mid_epoch, False
        self._controller.on_epoch_begin(epoch, resumed_mid_epoch=resumed)

    def after_epoch_begin(self, epoch: int) -> None:
        self._controller.after_epoch_begin()

    def on_step_end(self, global_step: int) -> None:
        if self._first_step:  # variables a train_step made at its first call join the asynchronous save's copy
            self._first_step = False
            for variable in _keras_variables(self._model):
                keras3_compat.copy_to_cpu_once(variable)
        self._controller.on_step_end(global_step)

    def on_epoch_end(self, epoch: int, logs: dict) -> None:
        self._controller.on_epoch_end(epoch, logs, stopping=bool(self._model.stop_training))

    def on_train_end(self) -> None:
        self._controller.on_train_end(stopped_early=bool(self._model.stop_training))


class Keras3(KerasAdapter):
    """The Keras 3 adapter of one ``fit`` call: tfdist's own loop (``training.loop``) around the
    model's ``train_step``, under parameter servers through a ``ClusterCoordinator``."""

    name = "keras3"

    def __init__(self, strategy):
        self.strategy = wrap(strategy)
        self._grad_accum_steps = 1

    def check(self, model, *, use: str = "fit") -> None:
        check_model(model, use=use)
        if use == "fit":
            check_ema_overwrite(model.optimizer, self.strategy)

    def in_scope(self, model):
        return model if built_in(model, self.strategy) else rebuild_in_scope(model, self.strategy)

    def after_build(self, model) -> None:
        warn_low_precision_outputs(model)

    def prepare(self, model, *, sample, grad_accum_steps: int) -> None:
        self._grad_accum_steps = grad_accum_steps
        self.strategy.coordinator  # noqa: B018 -- made before any step is scheduled
        prepare(model, strategy=self.strategy, sample=sample, grad_accum_steps=grad_accum_steps)

    def state(self, model):
        """What a checkpoint holds of the model besides what ``tf.train.Checkpoint(model=...)``
        saves: the seed generators' state, the metric variables (Keras 3 metric objects are not
        checkpointable), and each replica's own value of what replicas update on their own."""
        from tfdist.checkpoint import TrainingState

        metric_ids = {id(v) for v in model.metrics_variables}
        local = replica_local_variables(model, self.strategy)
        return TrainingState(
            model=model,
            optimizer=model.optimizer,
            random_state={key: v.value for key, v in random_state(model).items()},
            metrics={f"v{i}": v.value for i, v in enumerate(model.metrics_variables)},
            replica_state=[v.value for v in local if id(v) not in metric_ids],
            replica_metrics=[v.value for v in local if id(v) in metric_ids],
            # What replica_state is under any strategy (each replica's non-trainable variables:
            # a checkpoint keeps the first replica's value of a MirroredVariable).
            one_replica_saved=[v.value for v in model.non_trainable_variables if id(v) not in metric_ids],
            global_random_state={"keras": global_seed_state(self.strategy)},
        )

    def fingerprint(self, model) -> str:
        return model_fingerprint(model)

    def for_workers(self, dataset_fn):
        """Training data under parameter servers: a per-worker dataset made by ``dataset_fn``."""
        return self.strategy.coordinator.create_per_worker_dataset(dataset_fn)

    def validation_for_workers(self, dataset_fn):
        return self.strategy.coordinator.create_per_worker_dataset(lambda _=None: dataset_fn())

    def settle(self, model) -> None:
        self.strategy.join()

    def run(self, model, controller, *, train_data, validation_data, validation_steps, validation_freq, plan,
            callbacks, verbose):
        """Runs tfdist's loop from the controller's start; returns the Keras 3 History."""
        from tfdist.training.loop import run_loop

        return run_loop(
            model, strategy=self.strategy, train_data=train_data, steps_per_epoch=plan.steps_per_epoch,
            epochs=plan.epochs, start_step=controller.start.global_step, validation_data=validation_data,
            validation_steps=validation_steps, validation_freq=validation_freq, callbacks=callbacks or (), verbose=verbose,
            steps_per_execution=int(getattr(model, "steps_per_execution", 1) or 1),
            grad_accum_steps=self._grad_accum_steps, hooks=_ControllerHooks(controller, model),
            coordinator=self.strategy.coordinator,
        )

    def prepare_evaluation(self, model, *, sample) -> None:
        prepare_metrics(model, strategy=self.strategy, sample=sample)

    def evaluate(self, model, data, *, steps, callbacks, verbose) -> dict:
        """One pass of the model's test step over a distributed dataset, under a synchronous strategy."""
        from tfdist.training.loop import evaluate_loop

        return evaluate_loop(model, strategy=self.strategy, data=data, steps=steps, callbacks=callbacks, verbose=verbose)

    def history(self, previous: list[dict], keras_history=None):
        """A Keras 3 History holding every epoch of the run, earlier runs included."""
        import keras

        return merged_history(keras.callbacks.History, previous, keras_history)
