"""Private parts of Keras 3 that tfdist reaches: compile state, symbolic build, seeds, and rebound methods.

tfdist trains Keras 3 models in its own loop; the rebinding entries make Keras' own methods
exact under every strategy (see each). Checked on Keras 3.5.0 and 3.15.1.
Keras and TensorFlow are imported inside the functions.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Callable, Iterator

from tfdist._compat import missing, private, require


def compile_config(model: Any) -> dict:
    """What ``model.compile`` was given, as a new dict: the same loss and metric objects and functions.

    Reaches ``Trainer._compile_config.config``. The public ``get_compile_config()`` serializes
    them, which needs every function of the user's to be registered.
    """
    return dict(private(private(model, "_compile_config", "keras3.compile_config"), "config", "keras3.compile_config"))


def compiled_loss(model: Any) -> Any:
    """``model``'s ``CompileLoss``, or None when it was compiled without a loss (or not compiled).

    Reaches ``Trainer._compile_loss``, which Keras sets to None before ``compile``. The public
    ``model.loss`` is what ``compile`` was given, not the object that tracks per-output losses.
    """
    return private(model, "_compile_loss", "keras3.compiled_loss")


def compiled_metrics(model: Any) -> Any:
    """``model``'s ``CompileMetrics``, or None when it was compiled without metrics (or not compiled).

    Reaches ``Trainer._compile_metrics``, which Keras sets to None before ``compile``.
    """
    return private(model, "_compile_metrics", "keras3.compiled_metrics")


def symbolic_build(model: Any, data_batch: Any) -> None:
    """Builds ``model``'s layers, compiled loss and metrics (and optimizer) on ``data_batch``'s specs.

    Reaches ``Trainer._symbolic_build``, what Keras' own ``fit`` runs under a strategy. No layer
    runs on data: random states, counters and metrics stay as they are. No public API builds
    the compiled loss and metrics without running a step.
    """
    private(model, "_symbolic_build", "keras3.symbolic_build")(data_batch=data_batch)


def is_functional(model: Any) -> bool:
    """Whether ``model`` is a functional model (``keras.Model(inputs, outputs)``), which Keras can clone.

    Reaches ``keras.src.models.functional.Functional``; Keras exports no name for the class.
    """
    try:
        from keras.src.models.functional import Functional
    except ImportError:
        raise missing("keras3.is_functional", "keras.src.models.functional.Functional") from None
    return isinstance(model, Functional)


def global_seed_generator() -> Any:
    """Keras' global ``SeedGenerator``, made now if nothing drew from it yet.

    Reaches ``keras.src.random.seed_generator.global_seed_generator``: ``keras.random`` calls
    without a seed draw from it, and Keras exports no way to reach its state.
    """
    try:
        from keras.src.random.seed_generator import global_seed_generator as generator
    except ImportError:
        raise missing("keras3.global_seed_generator", "keras.src.random.seed_generator.global_seed_generator") from None
    return generator()


@contextlib.contextmanager
def apply_replaced(optimizers: list, call: Callable) -> Iterator[None]:
    """While active, each optimizer's ``apply(grads, variables)`` calls
    ``call(optimizer, its_own_apply, grads, variables)``; afterwards ``apply`` is the class's again.

    Rebinds ``apply`` on these instances, past ``Optimizer.__setattr__``'s tracking. tfdist
    traces a ``train_step`` with it to learn which variables each optimizer is given.
    """
    for optimizer in optimizers:
        object.__setattr__(optimizer, "apply", functools.partial(call, optimizer, optimizer.apply))
    try:
        yield
    finally:
        for optimizer in optimizers:
            if "apply" in vars(optimizer):
                del optimizer.apply  # back to the class's own


def output_losses_weighted_by_examples(model) -> None:
    """Weighs each output's loss tracker (``a_loss``, ``b_loss`` of a model with several outputs)
    by the examples of its batch, as Keras 3 weighs the ``loss`` tracker.

    Keras 3's ``CompileLoss.call`` passes the tracker the batch's *static* size, which a traced
    step does not know for a partial batch (its dataset's batch dimension is ``None``): the
    tracker then counts the batch as one example, and the per-output losses no longer add up to
    ``loss`` with the loss weights. While the compiled loss runs, its trackers are given the batch's size from ``tf.shape``; per thread,
    since mirrored traces its replicas in threads of their own. It stays on the model; calling
    this again changes nothing.

    Rebinds ``CompileLoss.call`` and each tracker's ``update_state`` on these instances."""
    import tensorflow as tf

    compile_loss = compiled_loss(model)
    trackers = list(getattr(compile_loss, "metrics", None) or ())
    if not trackers or "call" in vars(compile_loss):
        return
    call, examples = compile_loss.call, threading.local()
    for tracker in trackers:
        def update_state(values, sample_weight=None, update=tracker.update_state):
            size = getattr(examples, "size", None)
            return update(values, sample_weight=sample_weight if size is None else size)

        object.__setattr__(tracker, "update_state", update_state)  # past Metric.__setattr__'s tracking

    def weighted_call(y_true, y_pred, sample_weight=None):
        outer = getattr(examples, "size", None)
        examples.size = tf.shape(tf.nest.flatten(y_pred)[0])[0]
        try:
            return call(y_true, y_pred, sample_weight)
        finally:
            examples.size = outer

    compile_loss.call = weighted_call


def copy_to_cpu_once(variable) -> None:
    """Lets TensorFlow's asynchronous checkpoints save Keras 3 variables.

    An async save first copies every variable to host memory, in a ``tf.function`` that must
    create its copies only once; Keras 3.15's ``KerasVariable._copy_trackable_to_cpu`` creates
    a new ``tf.Variable`` on every call, so the first async save fails ("tf.function only
    supports singleton tf.Variables created on the first call"). Here a Keras variable's copy
    is its TensorFlow variable's copy, which TensorFlow makes once and then assigns.

    Rebinds ``_copy_trackable_to_cpu`` on this Keras variable; the TensorFlow one keeps its own."""
    value = getattr(variable, "value", None)
    if value is None:
        return
    require(value, "_copy_trackable_to_cpu", "keras3.copy_to_cpu_once")

    def copy_to_cpu(object_map):
        value._copy_trackable_to_cpu(object_map)
        object_map[variable] = object_map[value]

    variable._copy_trackable_to_cpu = copy_to_cpu


def use_native_increments(variable) -> None:
    """Makes ``variable``'s ``assign_add``/``assign_sub`` its TensorFlow variable's own: one atomic op.

    Keras 3's are ``assign(self + value)``: under central_storage a replica-context assign of a
    SUM variable adds every replica's ``self + value``; on a parameter server two workers'
    read-add-writes race and lose updates. Rebinds both methods on this instance."""
    import tensorflow as tf

    def assign_add(value):
        return variable.value.assign_add(tf.cast(value, variable.value.dtype))

    def assign_sub(value):
        return variable.value.assign_sub(tf.cast(value, variable.value.dtype))

    variable.assign_add = assign_add
    variable.assign_sub = assign_sub


def race_free_moving_statistics(layer) -> None:
    """Makes a BatchNormalization layer's moving statistics lose no update on parameter servers.

    Keras 3 updates them as ``moving.assign(moving * m + batch * (1 - m))``: on a parameter
    server, two workers' read-compute-writes race, and the later write undoes the earlier
    (with 2 workers, about 1 update in 4 was lost, and the statistics lagged behind the
    weights). Here the same update is one atomic ``assign_add`` of ``(1 - m) (batch - moving)``,
    which is ``(1 - m) / m (batch - new)`` for the ``new`` value the layer assigns; the batch
    statistics come from its ``_moments``. Other assigns (``set_weights``, a restore) are left as
    they were. Renormalization and a momentum of 0 keep Keras' own update.

    Rebinds ``BatchNormalization._moments`` and the moving statistics' ``assign`` on these
    instances, and marks the layer with ``_tfdist_race_free``."""
    import keras

    if (not isinstance(layer, keras.layers.BatchNormalization) or layer.renorm or not layer.momentum
            or getattr(layer, "_tfdist_race_free", False)):
        return
    moments, pending = private(layer, "_moments", "keras3.race_free_moving_statistics"), {}

    def batch_moments(inputs, mask):
        pending["mean"], pending["variance"] = moments(inputs, mask)
        return pending["mean"], pending["variance"]

    def increment(variable, key):
        assign = variable.assign

        def assign_moving_average(value):
            batch = pending.pop(key, None)
            if batch is None:  # not the layer's own update
                return assign(value)
            momentum = layer.momentum
            delta = (1.0 - momentum) / momentum * (batch - value)
            return variable.value.assign_add(keras.ops.cast(delta, variable.value.dtype))

        return assign_moving_average

    layer._moments = batch_moments
    layer.moving_mean.assign = increment(layer.moving_mean, "mean")
    layer.moving_variance.assign = increment(layer.moving_variance, "variance")
    layer._tfdist_race_free = True
