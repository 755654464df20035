"""The model side of fit, for either Keras: which Keras a model is, building it in the strategy's scope.

``fit`` takes a Keras 3 model (TensorFlow's default Keras, ``import keras``) or a tf_keras one
(the Keras 2 API), built by a function tfdist calls in the strategy's scope or ready-made.
``resolve`` builds or adopts it and returns it with its adapter: ``keras3.Keras3`` (tfdist's own
loop) or ``keras2.TfKeras`` (tf_keras' ``fit``). Everything after that asks the adapter.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Sequence

from tfdist import _checks
from tfdist import strategy as strategy_mod
from tfdist._compat import keras_common as keras_compat
from tfdist._compat import tf_keras as tf_keras_compat
from tfdist._imports import when_imported
from tfdist.errors import ModelError
from tfdist.training import keras2, keras3, keras_common

log = logging.getLogger("tfdist")

PRECISIONS = _checks.PRECISIONS


def is_model(obj: Any) -> bool:
    """True for a Keras 3 or tf_keras model (a subclass of either included)."""
    return (keras3.is_keras3(obj) or keras2.is_tf_keras(obj)) and hasattr(obj, "compile")


def check_argument(model: Any) -> None:
    """Refuses at once what can never work: neither a model nor a function that builds one."""
    if is_model(model) or (callable(model) and not isinstance(model, type)):
        return
    raise ModelError(
        f"the model must be a compiled Keras model (Keras 3 `import keras`, or tf_keras) or a function that builds "
        f"and compiles one; received {type(model).__module__}.{type(model).__name__}. Fix: pass a compiled model, "
        "or `lambda: build_and_compile()` (tfdist calls it inside the strategy's scope)."
    )


def check_callbacks(callbacks: Sequence[Any] | None) -> None:
    """Refuses callbacks that conflict with tfdist's own work (either Keras' BackupAndRestore)."""
    for cb in callbacks or ():
        if type(cb).__name__ == "BackupAndRestore" and (keras3.is_keras3(cb) or keras2.is_tf_keras(cb)):
            raise ModelError(
                "BackupAndRestore conflicts with tfdist's own checkpoints; received it in callbacks. "
                "Fix: remove it and pass checkpoint_dir= (tfdist resumes at the exact batch)."
            )


def set_seed(seed: int) -> None:
    """Seeds Python, NumPy and TensorFlow, and both Kerases' own generators (call it before building:
    a Keras 3 layer without a seed takes its initial one from Python's generator). tf_keras' own
    generator is seeded now if tf_keras is imported, else when something imports it."""
    import keras

    when_imported("tf_keras", lambda tf_keras: tf_keras_compat.seed_layer_seeds(tf_keras, seed))
    keras.utils.set_random_seed(seed)


def check_precision(precision: str | None, *, strategy: str) -> None:
    """Refuses ``mixed_float16`` under central_storage before anything is built: its loss scaling
    needs one copy of each variable per replica. tf_keras refuses it in ``compile``, and Keras
    3's loss-scale optimizer fails in its first step (an aggregating variable's update)."""
    kind = strategy_mod.KINDS.get(strategy)
    if precision == "mixed_float16" and kind is not None and kind.aggregating_variables:
        raise ModelError(
            f"mixed_float16 needs loss scaling, which does not run where the replicas share one copy of the "
            f"variables; received strategy={strategy!r}. Fix: use mixed_precision='mixed_bfloat16' (no loss "
            "scaling), or strategy='mirrored'."
        )


def _loss_scaling_refused(error: ValueError, precision: str) -> ModelError | None:
    """tf_keras' refusal of loss scaling under a strategy (parameter_server), raised by the
    builder's ``compile``, as one line with the fix; None for any other error."""
    message = str(error)
    if precision != "mixed_float16" or "Mixed precision is not supported with the tf.distribute.Strategy" not in message:
        return None
    strategy = message.split("Strategy: ", 1)[-1].split(".", 1)[0]
    return ModelError(
        f"tf_keras runs mixed_float16's loss scaling only under one_device, mirrored and multi_worker_mirrored; "
        f"received {strategy}. Fix: use mixed_precision='mixed_bfloat16' (no loss scaling), or build the model "
        "with Keras 3 (import keras; tfdist train --keras 3), whose loss scaling tfdist runs there."
    )


@contextlib.contextmanager
def precision_policy(precision: str):
    """Both Kerases' dtype policies set to ``precision`` while a model is built, then restored."""
    import keras

    with keras2.precision_policy(precision):
        previous = keras.mixed_precision.dtype_policy()
        if precision != "float32":
            keras.mixed_precision.set_dtype_policy(precision)
        try:
            yield
        finally:
            keras.mixed_precision.set_dtype_policy(previous)


def precision_of(model: Any) -> str | None:
    """The dtype policy ``model`` was built under (``float32``, ``mixed_float16``...), either Keras."""
    name = getattr(getattr(model, "dtype_policy", None), "name", None)
    return name if isinstance(name, str) else None


def adapter_for(model: Any, strategy, *, what: str = "model", use: str = "fit"):
    """The adapter of ``model``: ``keras3.Keras3`` or ``keras2.TfKeras``. ``what``: how to name
    the model (``model returned by the builder function``); ``use``: fit, evaluate or predict."""
    if keras3.is_keras3(model):
        return keras3.Keras3(strategy)
    if keras2.is_tf_keras(model):
        return keras2.TfKeras(strategy)
    raise keras_common.not_a_model(model, use=use, kind="Keras model (Keras 3 or tf_keras)", what=what)


def resolve(model: Any, strategy, *, precision: str = "float32"):
    """(adapter, model): the compiled model with its variables in ``strategy``, and its adapter.

    ``model`` is a function that builds and compiles a model (called inside the scope, under
    the ``precision`` policy), or a compiled model (rebuilt inside the scope if it was created
    outside it).
    """
    _checks.check_choice("mixed_precision", precision, PRECISIONS, error=ModelError)
    # tf_keras' dropout and augmentation layers then keep their random state in
    # tf.random.Generator variables, which tfdist checkpoints.
    when_imported("tf_keras", lambda tf_keras: tf_keras.backend.experimental.enable_tf_random_generator())
    if callable(model) and not is_model(model):
        with precision_policy(precision), keras3.building_scope(strategy):
            try:
                built = model()
            except ValueError as e:
                refused = _loss_scaling_refused(e, precision)
                if refused is None:
                    raise
                raise refused from None
        adapter = adapter_for(built, strategy, what="model returned by the builder function")
        adapter.check(built)
    else:
        adapter = adapter_for(model, strategy)
        adapter.check(model)
        if precision != "float32":
            ready = precision_of(model)
            raise ModelError(
                f"mixed_precision={precision!r} sets the policy the model is built under; received a ready model "
                f"(built under {ready!r}). Fix: pass a function that builds and compiles the model"
                + (", or leave mixed_precision out: the model already has that policy." if ready == precision else ".")
            )
        built = adapter.in_scope(model)
    adapter.after_build(built)
    return adapter, built


def copy_back(trained: Any, original: Any) -> None:
    """Gives the model the user passed, which fit copied into the strategy's scope to train, the
    trained weights, and its optimizer the trained state (where its variables match), as
    ``model.fit`` would have left them."""
    import numpy as np

    if len(original.weights) != len(trained.weights):
        _make_weights(original)
    original.set_weights(trained.get_weights())
    optimizer = original.optimizer
    theirs = _optimizer_variables(optimizer)
    ours = _optimizer_variables(trained.optimizer)
    unbuilt = not keras_compat.optimizer_built(optimizer)
    if len(theirs) != len(ours) and unbuilt:  # an optimizer that never stepped makes its variables now
        keras_common.build_optimizer(optimizer, original.trainable_variables)
        theirs = _optimizer_variables(optimizer)
    if [tuple(v.shape) for v in theirs] != [tuple(v.shape) for v in ours]:
        log.info("the optimizer of the model passed to fit has other variables than the one trained; it keeps its own "
                 "state (the model has the trained weights)")
        return
    for target, source in zip(theirs, ours):
        target.assign(np.asarray(source.numpy() if hasattr(source, "numpy") else source))


def _make_weights(model: Any) -> None:
    """Calls once, on zeros of its input shape, a model that ``model.build(shape)`` marked built
    without making its weights (a Keras 3 subclass): that makes them."""
    import numpy as np

    shape = (model.get_build_config() or {}).get("input_shape") if hasattr(model, "get_build_config") else None
    if isinstance(shape, (tuple, list)) and all(d is None or isinstance(d, int) for d in shape):
        model(np.zeros([1 if d is None else d for d in shape], np.float32))


def _optimizer_variables(optimizer: Any) -> list:
    variables = getattr(optimizer, "variables", [])
    return list(variables() if callable(variables) else variables)
