"""What the two Keras adapters (``keras3``, ``keras2``) share: which package a model comes from,
its structural fingerprint, the History of a whole run, the low-precision output warning, a
cache of the last model's functions, what an optimizer's copy needs besides its config, the fix
for a model tfdist cannot use, the refusal to accumulate over a model's own train_step, the
sum of the micro steps' gradients, and the optimizers a model holds besides its default one."""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from tfdist._compat import keras_common as keras_compat
from tfdist.errors import ModelError

log = logging.getLogger("tfdist")


def defined_in(obj: Any, package: str) -> bool:
    """True if a class in ``obj``'s MRO comes from ``package`` (a user's subclass lives in
    the user's module, so its own ``__module__`` does not tell)."""
    return any(c.__module__ == package or c.__module__.startswith(package + ".") for c in type(obj).__mro__)


def inherited_from(model: Any, name: str, package: str) -> bool:
    """True if the model's method ``name`` (``train_step``, ``test_step``, ``call``) is the one
    ``package`` (``keras``, ``tf_keras``) defines, not a subclass's own."""
    return getattr(type(model), name).__module__.split(".")[0] == package


def not_a_model(obj: Any, *, use: str, kind: str = "Keras model", what: str = "model") -> ModelError:
    """The error for ``obj``, given to ``use`` (fit, evaluate, predict) where a ``kind`` of model
    belongs; ``what`` names it (``model returned by the builder function``: returning one fixes it)."""
    compiled = "a" if use == "predict" else "a compiled"
    if what != "model":
        fix = "return the compiled model from the function."
    elif use == "fit":
        fix = "pass a function that builds and compiles a model, or a compiled model."
    else:
        fix = f"pass a Keras model: the one fit returned (history.model), or one loaded with load_model, to {use}."
    return ModelError(f"the {what} must be {compiled} {kind}; received {type(obj).__module__}.{type(obj).__name__}. "
                      f"Fix: {fix}")


def check_own_train_step(model, base_class, steps: int) -> None:
    """Refuses gradient accumulation for a model whose class overrides ``train_step``: tfdist's
    accumulation runs Keras' own step on each micro batch, and would replace the model's."""
    if type(model).train_step is not base_class.train_step:
        raise ModelError(
            f"gradient accumulation runs Keras' own train step on each micro batch; received grad_accum_steps={steps} "
            f"with a model whose class {type(model).__name__} overrides train_step. Fix: accumulate in your "
            "train_step, or use grad_accum_steps=1."
        )


def summed_gradients(micro_step, variables, steps: int, *, unrolled: bool) -> list:
    """The gradients of ``variables`` summed over ``steps`` micro steps; ``micro_step(i, total)``
    returns ``(i + 1, total + its gradients)``. ``unrolled`` repeats it in the graph instead of a
    ``tf.while_loop``: under central_storage a metric's or a moving statistic's update is a
    ``merge_call``, which TensorFlow refuses inside a loop."""
    import tensorflow as tf

    state = (tf.constant(0), [tf.zeros_like(v) for v in variables])
    if unrolled:
        for _ in range(steps):
            state = micro_step(*state)
        return state[1]
    return tf.while_loop(lambda i, _: i < steps, micro_step, state)[1]


def compile_fix(use: str) -> str:
    """The fix for a model without ``compile`` given to ``use`` (fit, evaluate)."""
    if use == "fit":
        return "call model.compile(optimizer=..., loss=..., metrics=...) in your builder."
    return ("call model.compile(loss=..., metrics=...) before evaluate; for `tfdist evaluate FILE`, save the model "
            "compiled (tfdist train and fit's model are), or load, compile and evaluate it in Python.")


def keras_of(model: Any):
    """The Keras package of ``model``: ``tf_keras`` or ``keras`` (Keras 3)."""
    import importlib

    return importlib.import_module("tf_keras" if defined_in(model, "tf_keras") else "keras")


class LastModelCache:
    """What was made for the model used last (its traced functions): using that model again (in
    a loop, after each fit) does not make them, and trace them, again. One entry, so that it keeps
    at most one model alive."""

    def __init__(self):
        self._model, self._value = None, None

    def get(self, model: Any, make) -> Any:
        if self._model is not model:
            self._model, self._value = model, make()
        return self._value


def _dtype_name(dtype) -> str:
    """``float32`` for a tf.DType (tf_keras) or a dtype string (Keras 3)."""
    return str(getattr(dtype, "name", dtype))


def model_fingerprint(model) -> str:
    """A hash of the model's structure: layer classes and weight shapes and dtypes, in order.

    Names are left out: Keras numbers them per process (dense, dense_1, ...)."""
    digest = hashlib.sha256()
    for layer in keras_compat.sublayers(model):
        shapes = ",".join(f"{tuple(w.shape)}:{_dtype_name(w.dtype)}" for w in layer.weights)
        digest.update(f"{type(layer).__name__}[{shapes}];".encode())
    return digest.hexdigest()[:16]


def merged_history(history_class, previous: list[dict], history=None):
    """A ``history_class`` (either Keras' History) holding every epoch of the run, earlier runs included."""
    merged = history_class()
    merged.epoch = list(range(len(previous)))
    for logs in previous:
        for key, value in logs.items():
            merged.history.setdefault(key, []).append(value)
    if history is not None:
        merged.set_model(history.model)
        merged.set_params(history.params)
    return merged


def warn_low_precision_outputs(model) -> None:
    """A float16/bfloat16 output makes the loss inaccurate: say so once, after the model is built."""
    for output in getattr(model, "outputs", None) or []:
        dtype = _dtype_name(getattr(output, "dtype", ""))
        if dtype in ("float16", "bfloat16"):
            log.warning("model output %s is %s: compute the last layer in float32 (dtype='float32') so the loss "
                        "stays accurate", getattr(output, "name", "?"), dtype)


def carry_weight_decay_exclusions(source, target, source_weights, target_weights) -> None:
    """Gives ``target``, an optimizer made from ``source``'s config for a copy of its model, what
    ``source.exclude_from_weight_decay(var_list, var_names)`` was told: the config leaves it out,
    and the copy would decay what the user excluded. ``*_weights``: the two models' weights, in
    the same order (a variable of the source maps to the copy's at its position)."""
    source = getattr(source, "inner_optimizer", source)  # a loss-scale wrapper: the optimizer it wraps
    target = getattr(target, "inner_optimizer", target)
    keys, names = keras_compat.weight_decay_exclusions(source)
    if not keys and not names:
        return
    variables = [new for old, new in zip(source_weights, target_weights) if keras_compat.variable_key(source, old) in keys]
    target.exclude_from_weight_decay(var_list=variables or None, var_names=names or None)


def fresh_metrics(keras, metrics: Any) -> Any:
    """``metrics`` as ``compile`` was given them (names, functions, metric objects, in lists or
    dicts), with a new object of each metric object's config: its variables belong to the scope
    it was made in, and a model copied into a strategy's scope needs its own there."""
    import tensorflow as tf

    def fresh(metric):
        return type(metric).from_config(metric.get_config()) if isinstance(metric, keras.metrics.Metric) else metric

    return tf.nest.map_structure(fresh, metrics)


def build_optimizer(optimizer: Any, variables: list) -> None:
    """Creates an optimizer's variables now (Keras makes them at its first step): ``build``, or
    ``_create_all_weights`` for a tf_keras legacy optimizer (iterations, hyper-parameters, slots)."""
    build = keras_compat.optimizer_builder(optimizer)
    if build is not None:
        build(variables)


def held_optimizers(model, optimizer_class) -> list:
    """The optimizers a model holds besides ``model.optimizer`` (a GAN's ``d_optimizer`` and
    ``g_optimizer``), found in the model's checkpoint graph, each once, in a fixed order.

    Args:
      model: A Keras 3 or tf_keras model.
      optimizer_class: The optimizer class (or tuple of classes) of the model's Keras.

    Returns:
      The optimizers, in the order of the checkpoint graph.
    """
    import tensorflow as tf

    found = [obj for obj in tf.train.TrackableView(model).descendants()
             if isinstance(obj, optimizer_class) and obj is not model.optimizer]
    return list({id(o): o for o in found}.values())


# Options that say nothing of how an optimizer trains: its name, whether Keras may compile its
# update (tf_keras turns it off where it cannot), and tf_keras' flag for its legacy classes.
_NOT_HYPERPARAMETERS = ("name", "jit_compile", "is_legacy_optimizer")


def is_default_optimizer(optimizer, rmsprop_class) -> bool:
    """True if ``optimizer`` is the one ``compile()`` makes when given none: RMSprop with Keras'
    defaults. A model with its own optimizers never uses it (keras.io's GAN calls
    ``super().compile()``), so it is left unbuilt, its slots out of every checkpoint.

    Args:
      optimizer: The model's ``optimizer``.
      rmsprop_class: ``keras.optimizers.RMSprop`` or ``tf_keras.optimizers.RMSprop``.

    Returns:
      Whether its class is ``rmsprop_class`` and every option has its default value.
    """
    import inspect

    import numpy as np

    if type(optimizer) is not rmsprop_class:
        return False
    defaults = inspect.signature(rmsprop_class.__init__).parameters  # no optimizer made to compare
    config = {k: v for k, v in optimizer.get_config().items() if k not in _NOT_HYPERPARAMETERS}

    def is_default(key, value):  # a float option comes back through a float32 variable
        default = defaults[key].default if key in defaults else inspect.Parameter.empty
        return value == default or (isinstance(value, float) and isinstance(default, float)
                                    and np.float32(value) == np.float32(default))

    return all(is_default(key, value) for key, value in config.items())


def no_labels_for_loss(model, keras_name: str) -> ModelError:
    """The refusal of data without labels for a model whose compiled loss needs them under its
    Keras' own ``train_step``.

    Args:
      model: The model.
      keras_name: Its Keras and version, as the message names it (``Keras 3.15.1``).

    Returns:
      The ModelError to raise.
    """
    return ModelError(
        f"the model {model.name!r} is compiled with a loss, which compares its outputs to labels; received data "
        "without labels (x alone). Fix: pass (x, y) (for an autoencoder, (x, x)), or compute the loss in the "
        f"model's own train_step (see keras.io's VAE and GAN examples); {keras_name} fails the same way."
    )


def nothing_to_validate(model, cause: str) -> ModelError:
    """The refusal of validation data for a model whose Keras' own ``test_step`` cannot evaluate it.

    Args:
      model: The model.
      cause: What it lacks, ending in a word that leads to "Keras' own test_step needs":
        ``"no call() method, which"`` or ``"no compiled loss, and"``.

    Returns:
      The ModelError to raise.
    """
    return ModelError(
        f"the model {model.name!r} has {cause} Keras' own test_step needs to evaluate the validation data; "
        "received validation data for it. Fix: leave validation_data (and validation_split) out, or give the "
        "model a test_step of its own (as its train_step)."
    )
