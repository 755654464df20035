"""Built-in models, by name: what `tfdist train --model` and `tfdist plan --model` refer to.

Each is built with Keras 3 (``import keras``, TensorFlow's default Keras; ``keras="3"``) or
with tf_keras (the Keras 2 API; ``keras="2"``): the same layers either way.
"""

from __future__ import annotations

from typing import Callable, Sequence

from tfdist.errors import ModelError


def _cnn(input_shape: Sequence[int], num_classes: int, keras):
    """A small CNN with dropout (the default; ~0.98 validation accuracy on digits)."""
    layers = keras.layers
    inputs = keras.Input(shape=tuple(input_shape))
    x = inputs if len(input_shape) == 3 else layers.Reshape(tuple(input_shape) + (1,))(inputs)
    x = layers.Conv2D(32, 3, padding="same", activation="relu")(x)
    x = layers.Conv2D(32, 3, padding="same", activation="relu")(x)
    x = layers.MaxPooling2D(2)(x)
    x = layers.Conv2D(64, 3, padding="same", activation="relu")(x)
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.Dropout(0.25)(x)
    x = layers.Dense(64, activation="relu")(x)
    outputs = layers.Dense(num_classes, dtype="float32")(x)  # logits stay float32 under mixed precision
    return keras.Model(inputs, outputs, name="cnn")


def _resnet(input_shape: Sequence[int], num_classes: int, keras):
    """A small residual CNN with what real CNNs have: input noise, batch normalization, dropout
    (trained with a decaying learning rate)."""
    layers = keras.layers
    inputs = keras.Input(shape=tuple(input_shape))
    x = inputs if len(input_shape) == 3 else layers.Reshape(tuple(input_shape) + (1,))(inputs)
    x = layers.GaussianNoise(0.05)(x)
    x = layers.Conv2D(16, 3, padding="same", use_bias=False)(x)
    x = layers.Activation("relu")(layers.BatchNormalization()(x))
    for filters, stride in ((16, 1), (32, 2)):
        shortcut = x if stride == 1 else layers.Conv2D(filters, 1, strides=stride, use_bias=False)(x)
        y = layers.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False)(x)
        y = layers.Activation("relu")(layers.BatchNormalization()(y))
        y = layers.Conv2D(filters, 3, padding="same", use_bias=False)(y)
        y = layers.BatchNormalization()(y)
        x = layers.Activation("relu")(layers.Add()([shortcut, y]))
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.Dropout(0.2)(x)
    outputs = layers.Dense(num_classes, dtype="float32")(x)
    return keras.Model(inputs, outputs, name="resnet")


def _mlp(input_shape: Sequence[int], num_classes: int, keras):
    """A two-layer perceptron with dropout."""
    layers = keras.layers
    inputs = keras.Input(shape=tuple(input_shape))
    x = layers.Flatten()(inputs)
    x = layers.Dense(128, activation="relu")(x)
    x = layers.Dropout(0.2)(x)
    outputs = layers.Dense(num_classes, dtype="float32")(x)
    return keras.Model(inputs, outputs, name="mlp")


def _linear(input_shape: Sequence[int], num_classes: int, keras):
    """Softmax regression: one dense layer (exact arithmetic checks, e.g. accumulation)."""
    inputs = keras.Input(shape=tuple(input_shape))
    outputs = keras.layers.Dense(num_classes, dtype="float32")(keras.layers.Flatten()(inputs))
    return keras.Model(inputs, outputs, name="linear")


def _wide(input_shape: Sequence[int], num_classes: int, keras):
    """A wide perceptron of ~50M parameters: a checkpoint of ~600 MB with Adam (benchmarks)."""
    layers = keras.layers
    inputs = keras.Input(shape=tuple(input_shape))
    x = layers.Flatten()(inputs)
    x = layers.Dense(7000, activation="relu")(x)
    x = layers.Dense(7000, activation="relu")(x)
    outputs = layers.Dense(num_classes, dtype="float32")(x)
    return keras.Model(inputs, outputs, name="wide")


MODELS: dict[str, Callable] = {"cnn": _cnn, "resnet": _resnet, "mlp": _mlp, "linear": _linear, "wide": _wide}
DECAYING = {"resnet"}
"""Built-in models trained with an exponentially decaying learning rate (x0.9 every 50 steps)."""
CONVOLUTIONAL = {"cnn", "resnet"}
"""Built-in models that take images: height x width, or height x width x channels."""
DEFAULT_MODEL = "cnn"
# What a built-in model is built for when nothing else is said (tfdist plan): the data set
# tfdist train uses by default, 8x8 digits in 10 classes.
DEFAULT_INPUT_SHAPE = (8, 8, 1)
DEFAULT_NUM_CLASSES = 10


KERAS_VERSIONS = ("3", "2")
DEFAULT_KERAS = "3"


def keras_module(version: str = DEFAULT_KERAS):
    """``keras`` (Keras 3) for ``"3"``, ``tf_keras`` for ``"2"``."""
    if version not in KERAS_VERSIONS:
        raise ModelError(f"unknown Keras version; received keras={version!r}. Fix: use 3 (Keras 3) or 2 (tf_keras).")
    if version == "2":
        import tf_keras

        return tf_keras
    import keras

    return keras


def build(name: str, *, input_shape: Sequence[int], num_classes: int, keras: str = DEFAULT_KERAS):
    """Builds the uncompiled built-in model ``name`` (call it inside a strategy's scope)."""
    if name not in MODELS:
        raise ModelError(f"unknown built-in model; received model={name!r}. Fix: use one of {', '.join(MODELS)}.")
    return MODELS[name](input_shape, num_classes, keras_module(keras))


def compile_default(model, *, learning_rate: float = 1e-3, decay: bool = False, keras: str = DEFAULT_KERAS):
    """Adam (with ``decay``: on an exponentially decaying learning rate), sparse categorical
    cross-entropy on logits, accuracy."""
    k = keras_module(keras)
    if decay:
        learning_rate = k.optimizers.schedules.ExponentialDecay(learning_rate, decay_steps=50, decay_rate=0.9)
    model.compile(
        optimizer=k.optimizers.Adam(learning_rate),
        loss=k.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def builder(name: str, *, input_shape: Sequence[int], num_classes: int, learning_rate: float = 1e-3,
            keras: str = DEFAULT_KERAS, rescale: float | None = None) -> Callable:
    """A function that builds and compiles the built-in model, for `tfdist.fit(model=...)`;
    ``rescale``: its inputs are multiplied by this first (e.g. ``1 / 255`` for 0-255 pixels)."""
    if name not in MODELS:
        raise ModelError(f"unknown built-in model; received model={name!r}. Fix: use one of {', '.join(MODELS)}.")
    keras_module(keras)  # refuses an unknown version now
    if name in CONVOLUTIONAL and len(input_shape) not in (2, 3):
        raise ModelError(f"the {name} model takes images (height x width, or height x width x channels); received "
                         f"examples of shape {tuple(input_shape)}. Fix: for vectors of features use model "
                         f"{' or '.join(sorted(set(MODELS) - CONVOLUTIONAL))} (--model); or pass images.")

    def build_and_compile():
        model = build(name, input_shape=input_shape, num_classes=num_classes, keras=keras)
        if rescale is not None:
            k = keras_module(keras)
            model = k.Sequential([k.Input(tuple(input_shape)), k.layers.Rescaling(rescale), model], name=model.name)
        return compile_default(model, learning_rate=learning_rate, decay=name in DECAYING, keras=keras)

    build_and_compile.__name__ = f"build_{name}"
    return build_and_compile


USER_MODEL_ARGUMENTS = ("input_shape", "num_classes")
"""What ``tfdist train`` passes to a user's model function that names them as parameters."""


def keras_of_function(function: Callable) -> str | None:
    """``"2"`` if ``function`` uses tf_keras and not Keras 3, ``"3"`` for the reverse, None when
    it cannot tell. The names its code reads are looked up first, then its module's globals."""
    import inspect

    namespace = getattr(function, "__globals__", {})

    def names(code) -> set[str]:
        found = set(code.co_names)
        for const in code.co_consts:
            if inspect.iscode(const):
                found |= names(const)
        return found

    def kerases(values) -> set[str]:
        roots = {(v.__name__ if inspect.ismodule(v) else str(getattr(v, "__module__", ""))).split(".")[0]
                 for v in values}
        return roots & {"keras", "tf_keras"}

    code = getattr(function, "__code__", None)
    for found in (kerases(namespace[n] for n in names(code) if n in namespace) if code is not None else set(),
                  kerases(namespace.values())):
        if len(found) == 1:
            return "2" if found == {"tf_keras"} else "3"
    return None


def user_builder(function: Callable, *, name: str, input_shape: Sequence[int], num_classes: int,
                 keras: str) -> Callable:
    """A function for ``tfdist.fit(model=...)`` that calls the user's ``function`` (named ``name``,
    ``MODULE:FUNCTION``), passing it ``input_shape`` and ``num_classes`` if it has such parameters,
    and checks that it returns a compiled model of the Keras ``keras`` ("3" or "2")."""
    import inspect

    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        parameters = {}
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    given = {"input_shape": tuple(input_shape), "num_classes": num_classes}
    arguments = {key: value for key, value in given.items() if takes_any or key in parameters}

    def build_and_check():
        from tfdist.training.keras_common import defined_in  # a subclass's Keras is that of a base class

        model = function(**arguments)
        expected = keras_module(keras).__name__
        package = next((p for p in ("keras", "tf_keras") if defined_in(model, p)), None)
        if not hasattr(model, "compile") or package is None:
            raise ModelError(f"--model {name} must return a compiled Keras model; received {type(model).__name__}. "
                             "Fix: build the model, compile it and return it.")
        if package != expected:
            raise ModelError(f"--model {name} returned a {package} model, and --keras {keras} means {expected}. Fix: "
                             f"pass --keras {'2' if package == 'tf_keras' else '3'}.")
        if getattr(model, "optimizer", None) is None:
            raise ModelError(f"--model {name} returned a model that is not compiled. Fix: call model.compile("
                             "optimizer, loss, metrics) before returning it.")
        return model

    build_and_check.__name__ = name.partition(":")[2] or "build"
    return build_and_check
