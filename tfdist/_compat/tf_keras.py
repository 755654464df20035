"""Private parts of tf_keras (the Keras 2 API) that tfdist reaches: compile state, fit's counters, random layers.

tfdist trains tf_keras models with their own ``fit`` and hooks in where tf_keras' own
``BackupAndRestore`` does. Checked on tf_keras 2.17.0 and 2.21.0. tf_keras is imported inside
the functions.
"""

from __future__ import annotations

from typing import Any

from tfdist._compat import missing, private, require


def compile_arguments(model: Any) -> dict:
    """What ``model.compile`` was given: ``loss``, ``metrics``, ``loss_weights``, ``weighted_metrics``,
    plus ``steps_per_execution`` and ``jit_compile`` as the model holds them.

    Reaches ``Model._get_compile_args(user_metrics=True)``, ``_steps_per_execution`` and
    ``_jit_compile``. tf_keras' public ``get_compile_config`` serializes the objects instead.
    """
    entry = "tf_keras.compile_arguments"
    args = dict(private(model, "_get_compile_args", entry)(user_metrics=True))
    steps = private(model, "_steps_per_execution", entry)
    args["steps_per_execution"] = int(steps.numpy()) if steps is not None else 1
    args["jit_compile"] = private(model, "_jit_compile", entry)
    return args


def is_graph_network(model: Any) -> bool:
    """Whether ``model`` is a functional model (``Model(inputs, outputs)``), which tf_keras can clone.

    Reaches ``Model._is_graph_network``; tf_keras exports no name for its ``Functional`` class.
    """
    return bool(private(model, "_is_graph_network", "tf_keras.is_graph_network"))


def cluster_coordinator(model: Any) -> Any:
    """The ``ClusterCoordinator`` that ``fit`` made for ``model`` under parameter servers, or None.

    Reaches ``Model._cluster_coordinator``. tfdist waits on it (``join``) before a save; ``fit``
    keeps it to itself.
    """
    return private(model, "_cluster_coordinator", "tf_keras.cluster_coordinator")


def seed_layer_seeds(tf_keras: Any, seed: int) -> None:
    """Seeds the generator tf_keras draws its layers' missing seeds from, as
    ``tf_keras.utils.set_random_seed(seed)`` does, without reseeding Python, NumPy and TensorFlow.

    Reaches ``_SEED_GENERATOR`` (a thread-local) in ``tf_keras.src.backend``. tfdist seeds it when
    tf_keras is imported after ``fit`` seeded everything else; the public function would reseed
    the generators that have drawn since.
    """
    import random

    try:
        from tf_keras.src import backend
    except ImportError:
        raise missing("tf_keras.seed_layer_seeds", "tf_keras.src.backend") from None
    private(backend, "_SEED_GENERATOR", "tf_keras.seed_layer_seeds").generator = random.Random(seed)


def random_generator(layer: Any) -> tuple[Any, bool]:
    """(the layer's ``tf.random.Generator`` or None, whether it draws from TensorFlow's global state).

    Reaches ``Layer._random_generator`` (present on random layers only, such as Dropout) and its
    ``_generator`` and ``_rng_type``. Its state is what a checkpoint must hold for a resumed run
    to draw the same numbers; tf_keras does not track it.
    """
    entry = "tf_keras.random_generator"
    rng = getattr(layer, "_random_generator", None)  # absent: the layer draws no random numbers
    if rng is None:
        return None, False
    generator = private(rng, "_generator", entry)
    if generator is not None:
        return generator, False
    return None, private(rng, "_rng_type", entry) == "legacy_stateful"


def schedule_rate_variable(optimizer: Any) -> Any:
    """The variable where a tf_keras optimizer keeps the rate of its learning-rate schedule, or None.

    Reaches ``Optimizer._current_learning_rate``, which exists only with a schedule.
    """
    return getattr(optimizer, "_current_learning_rate", None)


def set_schedule_rate_variable(optimizer: Any, variable: Any) -> None:
    """Replaces the variable of :func:`schedule_rate_variable` (same checkpoint name expected).

    Writes ``Optimizer._current_learning_rate``: no public API recreates it.
    """
    require(optimizer, "_current_learning_rate", "tf_keras.set_schedule_rate_variable")
    optimizer._current_learning_rate = variable


def start_state(model: Any) -> Any:
    """What ``fit`` asks for the (epoch, step) to start at: None, or an object with
    ``maybe_load_initial_counters_from_ckpt``.

    Reaches ``Model._training_state``, which tf_keras' own ``BackupAndRestore`` sets; no public
    API tells ``fit`` to start mid-epoch.
    """
    return private(model, "_training_state", "tf_keras.start_state")


def set_start_state(model: Any, state: Any) -> None:
    """Sets what :func:`start_state` reads; None lets ``fit`` start where it would."""
    require(model, "_training_state", "tf_keras.set_start_state")
    model._training_state = state


def train_counter(model: Any) -> Any:
    """The variable ``fit`` counts its steps in (TensorBoard's batch summaries use it), or None
    before the model was compiled.

    Reaches ``Model._train_counter``; tfdist sets it to the resumed step.
    """
    return private(model, "_train_counter", "tf_keras.train_counter")


def callback_takes_tensor_logs(callback: Any) -> bool:
    """Whether a tf_keras callback accepts batch logs as tensors (``_supports_tf_logs``)."""
    return bool(getattr(callback, "_supports_tf_logs", False))  # other objects than tf_keras callbacks: False


def take_tensor_logs(callback: Any, takes: bool = True) -> None:
    """Tells tf_keras that ``callback`` accepts batch logs as tensors (``takes``), so they stay unresolved.

    Writes ``Callback._supports_tf_logs``, set by ``Callback.__init__``. Unresolved logs are what
    let batch hooks run under ParameterServerStrategy; no public API says it.
    """
    require(callback, "_supports_tf_logs", "tf_keras.take_tensor_logs")
    callback._supports_tf_logs = bool(takes)


def logs_as_python(logs: Any) -> Any:
    """``logs`` with tensors turned into NumPy values and Python numbers, waiting for remote values.

    Reaches ``tf_keras.src.utils.tf_utils.sync_to_numpy_or_python_type``, the conversion tf_keras'
    own callbacks use; it is not exported.
    """
    try:
        from tf_keras.src.utils import tf_utils
    except ImportError:
        raise missing("tf_keras.logs_as_python", "tf_keras.src.utils.tf_utils") from None
    return tf_utils.sync_to_numpy_or_python_type(logs)


def init_callback_attributes(callback: Any) -> None:
    """Gives ``callback`` the private attributes ``tf_keras.callbacks.Callback.__init__`` sets
    (``_supports_tf_logs``, ``_chief_worker_only``), for a class that inherits both Keras' callbacks
    but runs only Keras 3's ``__init__``.

    Copies them from a new tf_keras ``Callback``, so a renamed attribute comes along. tf_keras'
    callback list reads them from every callback it is given.
    """
    import tf_keras

    for name, value in vars(tf_keras.callbacks.Callback()).items():
        if name.startswith("_"):
            setattr(callback, name, value)
