"""The model side of fit for tf_keras (the Keras 2 API): checks, building in scope, accumulation,
mixed precision, RNG state, and ``TfKeras``, the adapter ``fit`` uses (tf_keras' own ``fit`` loop
with tfdist's callback)."""

from __future__ import annotations

import contextlib
import logging
import sys
import types
from typing import Any, Sequence

from tfdist import _checks
from tfdist._compat import keras_common as keras_compat
from tfdist._compat import tf_keras as tf_keras_compat
from tfdist._imports import when_imported
from tfdist.errors import ModelError
from tfdist.strategy_kinds import wrap
from tfdist.training.adapter import KerasAdapter
from tfdist.training.keras_common import (build_optimizer, carry_weight_decay_exclusions, check_own_train_step,
                                          compile_fix, defined_in, fresh_metrics, held_optimizers,
                                          inherited_from, is_default_optimizer, merged_history, model_fingerprint, no_labels_for_loss,
                                          not_a_model, nothing_to_validate, summed_gradients,
                                          warn_low_precision_outputs)

log = logging.getLogger("tfdist")

PRECISIONS = _checks.PRECISIONS


def is_tf_keras(obj: Any) -> bool:
    """True for an instance of a tf_keras class or a subclass of one."""
    return defined_in(obj, "tf_keras")


def check(model: Any, *, use: str = "fit") -> None:
    """Refuses a tf_keras model tfdist cannot ``use`` (fit, evaluate, predict): not a model, or
    not compiled (predict needs no compile)."""
    import tf_keras

    if not isinstance(model, tf_keras.Model):
        raise not_a_model(model, use=use)
    if use != "predict" and (model.optimizer is None or not getattr(model, "compiled_loss", None)):
        raise ModelError(
            f"the model {model.name!r} is not compiled; received a model without optimizer or loss. "
            f"Fix: {compile_fix(use)}"
        )


def precision_warning(precision: str, *, gpu_capabilities: Sequence[tuple[int, int]]) -> str | None:
    """The warning a mixed-precision policy deserves on GPUs of these compute capabilities
    (none: no GPU), or None. Pure."""
    if precision == "float32":
        return None
    if not gpu_capabilities:
        return (f"{precision} on a machine with no GPU: the CPU has no fast path for 16-bit math, so steps may be "
                "slower; it still saves activation memory")
    lowest = min(tuple(c) for c in gpu_capabilities)
    shown = ".".join(str(v) for v in lowest)
    if precision == "mixed_float16" and lowest < (7, 0):
        return f"mixed_float16 on a GPU of compute capability {shown}: no Tensor Cores (7.0+), little speed-up"
    if precision == "mixed_bfloat16" and lowest < (8, 0):
        advice = "; mixed_float16 is fast on this GPU" if lowest >= (7, 0) else ""
        return (f"mixed_bfloat16 on a GPU of compute capability {shown}: bfloat16 math is fast from 8.0 (Ampere) "
                f"on, so steps may be slower than in float32{advice}")
    return None


def _gpu_capabilities() -> list[tuple[int, int]]:
    import tensorflow as tf

    details = (tf.config.experimental.get_device_details(gpu) for gpu in tf.config.list_physical_devices("GPU"))
    return [tuple(d.get("compute_capability") or (0, 0)) for d in details]


@contextlib.contextmanager
def precision_policy(precision: str):
    """Sets tf_keras' dtype policy while the model is built, then restores the previous one.
    tf_keras, if not imported yet, gets the policy when the build imports it."""
    _checks.check_choice("mixed_precision", precision, PRECISIONS, error=ModelError)
    if precision != "float32":
        warning = precision_warning(precision, gpu_capabilities=_gpu_capabilities())
        if warning:
            log.warning("%s", warning)
    building, previous = [True], []

    def set_policy(tf_keras) -> None:
        if building:
            previous.append(tf_keras.mixed_precision.global_policy())
            tf_keras.mixed_precision.set_global_policy(precision)

    when_imported("tf_keras", set_policy)
    try:
        yield
    finally:
        building.clear()
        if previous:
            sys.modules["tf_keras"].mixed_precision.set_global_policy(previous[0])


def settle(model) -> None:
    """Waits until every step scheduled so far has run (parameter servers: before a save)."""
    coordinator = tf_keras_compat.cluster_coordinator(model)
    if coordinator is not None:
        coordinator.join()


def _rebuild(model, strategy):
    """Rebuilds a Sequential or functional model inside the strategy's scope."""
    import tf_keras

    if not (isinstance(model, tf_keras.Sequential) or tf_keras_compat.is_graph_network(model)):
        raise ModelError(
            f"a subclassed model created outside the strategy's scope cannot be rebuilt in it; received "
            f"{type(model).__name__}. Fix: pass a function that builds and compiles the model, e.g. "
            "tfdist.fit(lambda: make_model(), data); tfdist calls it inside the scope."
        )
    args = tf_keras_compat.compile_arguments(model)
    with strategy.scope():
        rebuilt = tf_keras.models.clone_model(model)
        rebuilt.set_weights(model.get_weights())
        optimizer = tf_keras.optimizers.deserialize(tf_keras.optimizers.serialize(model.optimizer))
        carry_weight_decay_exclusions(model.optimizer, optimizer, model.weights, rebuilt.weights)
        rebuilt.compile(
            optimizer=optimizer,
            loss=args["loss"],
            metrics=fresh_metrics(tf_keras, args["metrics"]),
            loss_weights=args["loss_weights"],
            weighted_metrics=fresh_metrics(tf_keras, args["weighted_metrics"]),
            steps_per_execution=args["steps_per_execution"],
            jit_compile=args["jit_compile"],
        )
    log.info("model %s was created outside the strategy's scope: rebuilt inside it with its weights", model.name)
    return rebuilt


def in_scope(model, strategy):
    """``model`` with its variables in ``strategy``: itself, or a copy rebuilt in the scope."""
    if keras_compat.owning_strategy(model) is not wrap(strategy).tf:
        return _rebuild(model, strategy)
    return model


def random_generators(model) -> dict[str, Any]:
    """The tf.random.Generator of every random layer, keyed by layer path (checkpointed state)."""
    generators = {}
    legacy = []
    for index, layer in enumerate(keras_compat.sublayers(model)):
        generator, global_state = tf_keras_compat.random_generator(layer)
        if generator is not None:
            generators[f"layer{index}"] = generator  # by position: names differ per process
        elif global_state:
            legacy.append(layer.name)
    if legacy:
        log.warning(
            "layers %s draw random numbers from TensorFlow's global state, which no checkpoint holds: a resumed "
            "run will not be bit-identical. Fix: pass a builder function so tfdist builds the model.", legacy,
        )
    return generators


def build_state(model, sample: tuple) -> None:
    """Creates the optimizer slots and the compiled loss and metric objects now (Keras creates
    them at the first step), so that a checkpoint restores into them before training starts.
    ``sample``: one batch as the model's ``train_step`` receives it: ``(x, y)``, ``(x, y, sample_weight)``
    or ``x`` alone, each part a nest of arrays.

    The model is traced on the sample's shapes, not run: its layers are built, and no random
    generator, counter or metric moves (as before tf_keras' own first step). A model compiled
    with ``run_eagerly=True`` is called on the sample instead."""
    import tensorflow as tf

    labelled = isinstance(sample, tuple) and len(sample) >= 2
    x = tf.nest.map_structure(tf.constant, sample[0] if isinstance(sample, tuple) else sample)
    with model.distribute_strategy.scope():
        if _callable(model):  # a model with a train_step and no call() (the GAN form): tf_keras' fit never calls it
            if model.run_eagerly:  # its call() may need eager tensors, as its steps get
                y_pred = model(x, training=False)
            else:
                specs = tf.nest.map_structure(lambda t: tf.TensorSpec([None, *t.shape[1:]], t.dtype), x)
                trace = tf.function(lambda inputs: model(inputs, training=False))
                y_pred = trace.get_concrete_function(specs).structured_outputs
            model.compiled_loss.build(y_pred)
            if labelled:
                model.compiled_metrics.build(y_pred, tf.nest.map_structure(tf.constant, sample[1]))
        optimizer = getattr(model.optimizer, "inner_optimizer", model.optimizer)
        if not _unused_default_optimizer(model):
            build_optimizer(optimizer, model.trainable_variables)
        _aggregate_schedule_variable(optimizer, model.distribute_strategy)


def _unused_default_optimizer(model) -> bool:
    """True for the RMSprop ``super().compile()`` leaves on a model with optimizers of its own
    (keras.io's GAN): it stays unbuilt and out of checkpoints. If a ``train_step`` uses it after
    all, its first step builds it, and a checkpoint restores into it then, as into the model's
    own optimizers."""
    import tf_keras

    classes = (tf_keras.optimizers.Optimizer, tf_keras.optimizers.legacy.Optimizer)
    return bool(held_optimizers(model, classes)) and is_default_optimizer(model.optimizer,
                                                                          tf_keras.optimizers.RMSprop)


def _callable(model) -> bool:
    """False for a model with no ``call()`` of its own (a functional model has tf_keras')."""
    import tf_keras

    return type(model).call is not tf_keras.Model.call or tf_keras_compat.is_graph_network(model)


def _uses_tf_keras_step(model, name: str) -> bool:
    """True if the model's method ``name`` (``train_step``, ``test_step``) is tf_keras' own, not a subclass's."""
    return inherited_from(model, name, "tf_keras")


def check_labels_for_loss(model, sample: Any) -> None:
    """Refuses data without labels for a model whose compiled loss needs them under tf_keras' own
    ``train_step`` (tf_keras' error is a traceback from inside its step)."""
    import tf_keras

    labelled = isinstance(sample, tuple) and len(sample) >= 2
    if labelled or not _uses_tf_keras_step(model, "train_step") or not model.loss:
        return
    raise no_labels_for_loss(model, f"tf_keras {tf_keras.__version__}")


def _aggregate_schedule_variable(optimizer, strategy) -> None:
    """Works around a tf_keras bug under CentralStorageStrategy (tf_keras 2.16-2.21).

    With a learning-rate schedule, tf_keras keeps the current rate in a variable
    (``_current_learning_rate``) created without an aggregation and assigned in replica
    context at every step; a central-storage (aggregating) variable refuses that, so plain
    ``model.fit`` fails at its first step ("You must specify an aggregation method"). Every
    replica computes the same rate, so the variable is recreated, with its value and under the
    same checkpoint name, with ``ONLY_FIRST_REPLICA`` aggregation."""
    import tensorflow as tf

    current = tf_keras_compat.schedule_rate_variable(optimizer)
    if not wrap(strategy).aggregating_variables or current is None:
        return
    if current.aggregation != tf.VariableAggregation.NONE:
        return
    with strategy.scope():
        tf_keras_compat.set_schedule_rate_variable(optimizer, tf.Variable(
            current.read_value(), name="current_learning_rate", dtype=current.dtype, trainable=False,
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
        ))


def race_free_moving_statistics(model) -> None:
    """Makes the model's BatchNormalization layers lose no update of their moving statistics
    on parameter servers. tf_keras' fused layers (after a convolution) assign the new moving
    average, a read-compute-write that races between workers: with 2 workers about 1 update
    in 4 was lost, and the statistics lagged behind the weights. The non-fused update is an
    atomic ``assign_sub`` of ``(moving - batch) (1 - momentum)``, the same statistics."""
    import tf_keras

    norms = [layer for layer in keras_compat.sublayers(model)
             if isinstance(layer, tf_keras.layers.BatchNormalization) and layer.fused]
    for layer in norms:
        layer.fused = False
    if norms:
        log.info("parameter servers: %d BatchNormalization layer(s) update their moving statistics without fusing "
                 "(tf_keras' fused update loses updates when workers race)", len(norms))


def install_grad_accumulation(model, steps: int, *, unrolled: bool = False) -> None:
    """Makes each train step split its batch into ``steps`` micro batches and apply their mean
    gradient once: one cross-replica reduction and one optimizer iteration per step.

    ``unrolled`` repeats the micro step in the graph instead of a ``tf.while_loop``: needed
    under central_storage, where updating a metric or a moving statistic is a ``merge_call``,
    which TensorFlow refuses inside a loop (as ``keras3.accumulating_train_step``)."""
    import tensorflow as tf
    import tf_keras

    if steps == 1:
        return
    check_own_train_step(model, tf_keras.Model, steps)
    optimizer = model.optimizer
    scaled = isinstance(optimizer, tf_keras.mixed_precision.LossScaleOptimizer)

    def train_step(self, data):
        x, y, sample_weight = tf_keras.utils.unpack_x_y_sample_weight(data)
        split = lambda t: tf.reshape(t, tf.concat([[steps, -1], tf.shape(t)[1:]], 0))  # noqa: E731
        xs, ys = tf.nest.map_structure(split, x), tf.nest.map_structure(split, y)
        ws = None if sample_weight is None else tf.nest.map_structure(split, sample_weight)
        variables = self.trainable_variables

        def micro_step(i, total):
            pick = lambda t: tf.gather(t, i)  # noqa: E731
            xi, yi = tf.nest.map_structure(pick, xs), tf.nest.map_structure(pick, ys)
            wi = None if ws is None else tf.nest.map_structure(pick, ws)
            with tf.GradientTape() as tape:
                y_pred = self(xi, training=True)
                loss = self.compute_loss(xi, yi, y_pred, wi)
                if scaled:
                    loss = optimizer.get_scaled_loss(loss)
            grads = tape.gradient(loss, variables)
            if scaled:
                grads = optimizer.get_unscaled_gradients(grads)
            self.compiled_metrics.update_state(yi, y_pred, wi)  # results are read once, after the loop
            return i + 1, [t + tf.convert_to_tensor(g) for t, g in zip(total, grads)]

        total = summed_gradients(micro_step, variables, steps, unrolled=unrolled)
        optimizer.apply_gradients(zip([t / steps for t in total], variables))
        return self.get_metrics_result()

    model.train_step = types.MethodType(train_step, model)
    model.train_function = None  # retrace with the new step
    log.info("gradient accumulation: %d micro batches per optimizer step", steps)


class TfKeras(KerasAdapter):
    """The tf_keras adapter of one ``fit`` call: tf_keras' own ``model.fit`` loop, with
    ``callback.TrainingCallback`` reporting every step and epoch to tfdist's controller."""

    name = "tf_keras"

    def __init__(self, strategy):
        self.strategy = wrap(strategy)

    def check(self, model, *, use: str = "fit") -> None:
        check(model, use=use)

    def in_scope(self, model):
        return in_scope(model, self.strategy)

    def after_build(self, model) -> None:
        warn_low_precision_outputs(model)

    def prepare(self, model, *, sample, grad_accum_steps: int) -> None:
        """Installs accumulation and creates every variable now (a checkpoint restores into them)."""
        check_labels_for_loss(model, sample)
        install_grad_accumulation(model, grad_accum_steps, unrolled=self.strategy.aggregating_variables)
        build_state(model, sample)
        if self.strategy.concurrent_updates:
            race_free_moving_statistics(model)
        unavailable = self.strategy.xla_unavailable(one_copy_compiles=True)
        if getattr(model, "jit_compile", False) is True and unavailable:
            model.jit_compile = False
            log.warning("jit_compile=True is not applied %s; the steps run without XLA", unavailable)

    def state(self, model):
        """What a checkpoint holds of the model: tf_keras metric objects are checkpointable, and
        every on-read variable (BatchNormalization's statistics, metric accumulators) has a value
        per replica."""
        from tfdist.checkpoint import TrainingState
        from tfdist.checkpoint.replicas import on_read_variables

        metric_variables = [v for metric in model.metrics for v in metric.variables]
        metric_ids = {id(v) for v in metric_variables}
        return TrainingState(
            model=model,
            optimizer=model.optimizer,
            random_state=random_generators(model),
            metrics={f"m{i}_{metric.name}": metric for i, metric in enumerate(model.metrics)},
            replica_state=[v for v in on_read_variables(model, model.optimizer) if id(v) not in metric_ids],
            replica_metrics=metric_variables,
        )

    def fingerprint(self, model) -> str:
        return model_fingerprint(model)

    def for_workers(self, dataset_fn):
        """Training data under parameter servers: a dataset function every worker runs."""
        import tf_keras

        return tf_keras.utils.experimental.DatasetCreator(dataset_fn)

    def validation_for_workers(self, dataset_fn):
        return dataset_fn()  # tf_keras hands the dataset to the workers itself

    def settle(self, model) -> None:
        settle(model)

    def run(self, model, controller, *, train_data, validation_data, validation_steps, validation_freq, plan,
            callbacks, verbose):
        """Runs tf_keras' fit from the controller's start; returns its History."""
        from tfdist.training.callback import EpochBeginCallback, TrainingCallback

        if validation_data is not None and _uses_tf_keras_step(model, "test_step") and not _callable(model):
            raise nothing_to_validate(model, "no call() method, which")

        return model.fit(
            train_data,
            epochs=plan.epochs,
            initial_epoch=controller.start.epoch,
            steps_per_epoch=plan.steps_per_epoch,
            validation_data=validation_data,
            validation_steps=validation_steps,
            validation_freq=validation_freq,
            callbacks=[EpochBeginCallback(controller), *(callbacks or []), TrainingCallback(controller)],
            verbose=verbose,
        )

    def prepare_evaluation(self, model, *, sample) -> None:
        """Nothing: tf_keras creates a loaded model's metrics in its own evaluate, under every strategy."""

    def evaluate(self, model, data, *, steps, callbacks, verbose) -> dict:
        """tf_keras' own evaluate over a distributed dataset, under a synchronous strategy."""
        return model.evaluate(data, steps=steps, callbacks=callbacks, verbose=verbose, return_dict=True)

    def history(self, previous: list[dict], keras_history=None):
        """A tf_keras History holding every epoch of the run, earlier runs included."""
        import tf_keras

        return merged_history(tf_keras.callbacks.History, previous, keras_history)
