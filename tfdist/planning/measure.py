"""Measured inputs of a plan: a model's parameter count and its step time on this machine.

TensorFlow is imported inside the functions only.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import TYPE_CHECKING, Any, Sequence

from tfdist import _checks, models
from tfdist.errors import PlanError, describe

if TYPE_CHECKING:  # pragma: no cover
    import keras
    import tf_keras


MIN_TIMED_SECONDS = 1.0
"""``measure_step_time`` times at least this long (more steps than asked for when they are short)."""
MAX_TIMED_STEPS = 5000
TIMED_BLOCKS = 5


def check_keras(keras: str) -> None:
    """Refuses a Keras version other than ``"3"`` or ``"2"`` with a one-line PlanError."""
    if keras not in models.KERAS_VERSIONS:
        raise PlanError(
            f"Invalid `keras`; received keras={keras!r}. "
            'Fix: use "3" (Keras 3, TensorFlow\'s default Keras, `import keras`) or "2" (tf_keras), as a string.'
        )


def _load_model(model: str, *, keras: str, input_shape: Sequence[int] | None = None, num_classes: int | None = None):
    """A model of Keras ``keras`` ("3" or "2") from a saved-model path or a built-in model name."""
    if os.path.exists(model):
        module = models.keras_module(keras)
        try:
            return module.models.load_model(model, compile=False)
        except Exception as e:  # noqa: BLE001 -- any load failure is the user's file
            if keras == "3":
                fix = ("pass a .keras/.h5 file saved with Keras 3, or keras=\"2\" (--keras 2) for a model saved "
                       "with tf_keras (SavedModel directories included), or params (--params).")
            else:
                fix = ("pass a .keras/.h5/SavedModel path saved with tf_keras, or keras=\"3\" (--keras 3) for a model "
                       "saved with Keras 3, or params (--params).")
            what = "Keras 3" if keras == "3" else "tf_keras"
            raise PlanError(
                f"Invalid `model`; received model={model!r}, which {what} cannot load ({describe(e)}). Fix: {fix}"
            ) from e
    if model not in models.MODELS:
        raise PlanError(
            f"Invalid `model`; received model={model!r}, neither a file nor a built-in model. "
            f"Fix: use a path or one of {', '.join(sorted(models.MODELS))}."
        )
    shape = tuple(input_shape) if input_shape is not None else models.DEFAULT_INPUT_SHAPE
    return models.build(model, input_shape=shape, num_classes=num_classes or models.DEFAULT_NUM_CLASSES, keras=keras)


def builtin_params(
    name: str, *, input_shape: Sequence[int] | None = None, num_classes: int | None = None, keras: str = "3"
) -> tuple[int, int]:
    """Parameter counts, all and trainable, of a built-in model or a saved model, built or loaded
    (not trained) with Keras ``keras`` ("3" or "2"; the built-in models have the same parameters
    in either)."""
    check_keras(keras)
    return param_counts(_load_model(name, keras=keras, input_shape=input_shape, num_classes=num_classes))


def param_counts(model) -> tuple[int, int]:
    """A built model's parameters, all of them and its trainable ones (which get gradients and
    optimizer slots)."""
    trainable = sum(math.prod(int(d) for d in v.shape) for v in model.trainable_weights)
    return int(model.count_params()), int(trainable)


def keras_of(model) -> str:
    """``"3"`` for a Keras 3 model object, ``"2"`` for a tf_keras one; a PlanError otherwise."""
    from tfdist.training import keras2, keras3

    if keras3.is_keras3(model):
        return "3"
    if keras2.is_tf_keras(model):
        return "2"
    raise PlanError(
        f"Invalid `model`; received a {type(model).__module__}.{type(model).__name__}. "
        "Fix: pass a Keras 3 or tf_keras model, a built-in model name or a saved-model path."
    )


@dataclasses.dataclass(frozen=True)
class Measurement:
    """Result of ``measure_step_time``.

    ``step_seconds`` is the median time of one optimizer step: with ``grad_accum_steps`` > 1,
    one accumulated step over that many micro batches. ``keras`` is the Keras that ran it
    (``"3"`` or ``"2"``). ``peak_bytes`` is the GPU allocator's peak (``tf.config.experimental.get_memory_info``)
    on GPU; on CPU the increase of the process's maximum resident set (``ru_maxrss``)
    over the run, which includes TensorFlow's own allocations; None if neither is known.
    ``params`` counts all the model's parameters, ``trainable_params`` its trainable ones.
    """

    step_seconds: float
    params: int
    steps: int
    grad_accum_steps: int
    warmup: int
    micro_batch_size: int
    replicas: int
    strategy: str
    device: str
    peak_bytes: int | None
    peak_source: str | None
    keras: str = "3"
    trainable_params: int | None = None


class _Clock:
    """Which steps a measurement waits for, and when they finished.

    The first ``warmup`` steps (tracing; at least two) are each waited for: a first estimate of
    a step. Then at least ``steps`` steps and ``MIN_TIMED_SECONDS`` of them run in
    ``TIMED_BLOCKS`` blocks; only each block's last step is waited for, so that the steps run
    asynchronously between them, as in training. Steps are counted from 1.
    """

    def __init__(self, *, warmup: int, steps: int):
        self.warmup, self._steps = warmup, steps
        self.timed = 0
        self._marks: list[float] = []
        self._bounds: list[int] = []  # step counts that end the timed blocks

    def waits_for(self, step: int) -> bool:
        return step <= self.warmup or step in self._bounds

    def mark(self, step: int) -> bool:
        """Records that ``step`` (one ``waits_for`` chose) has finished; True after the last one."""
        import numpy as np

        self._marks.append(time.perf_counter())
        if step == self.warmup:
            estimate = float(np.median(np.diff(self._marks)))
            self.timed = int(min(MAX_TIMED_STEPS, max(self._steps, np.ceil(MIN_TIMED_SECONDS / max(estimate, 1e-6)))))
            blocks = min(TIMED_BLOCKS, self.timed)
            self._bounds = [self.warmup + round(self.timed * (i + 1) / blocks) for i in range(blocks)]
        return bool(self._bounds) and step == self._bounds[-1]

    def step_seconds(self) -> float:
        """Seconds per step of the median block (one slowed down by another process does not count)."""
        import numpy as np

        ends = self._marks[self.warmup - 1:]  # the last warm-up step starts the first block
        counts = [self.warmup, *self._bounds]
        return float(np.median([(ends[i + 1] - ends[i]) / (counts[i + 1] - counts[i]) for i in range(len(self._bounds))]))


def measure_step_time(
    *,
    model: "str | keras.Model | tf_keras.Model",
    micro_batch_size: int,
    keras: str = "3",
    strategy: Any = "auto",
    steps: int = 20,
    warmup: int = 3,
    grad_accum_steps: int = 1,
    precision: str = "float32",
    optimizer_slots: int = 2,
    input_shape: Sequence[int] | None = None,
    num_classes: int | None = None,
) -> Measurement:
    """Times at least ``steps`` train steps of ``model`` after ``warmup`` steps (at least two),
    on random data, with the Keras the model will train with.

    Short steps are timed for at least ``MIN_TIMED_SECONDS`` (more steps than asked for), in
    ``TIMED_BLOCKS`` blocks that run asynchronously, as training does, with the device waited
    for only at the end of each block; ``step_seconds`` is the median block's time per step.

    ``model`` is a built-in name or a saved-model path, built or loaded with ``keras``
    (``"3"``: Keras 3, ``import keras``, the default; ``"2"``: tf_keras) under ``strategy`` (a
    name, the strategy ``make_strategy`` returned, or a ``tf.distribute.Strategy``); or a model
    object, trained as is without a strategy, whose own Keras is measured
    (``keras`` is then ignored). A Keras 3 model runs tfdist's own training loop
    (``training.loop.run_loop``, what ``tfdist.fit`` trains Keras 3 models with); a tf_keras
    model runs plain tf_keras ``model.fit``.

    With ``grad_accum_steps`` > 1 the steps are tfdist's accumulated steps (one while loop
    over the micro batches, one optimizer update), so their fixed cost -- dispatch,
    optimizer update, metrics -- is measured once per optimizer step, as it is paid.

    Each replica gets ``micro_batch_size`` examples of random data per micro batch; a
    built-in model is trained with its own loss and metric (cross-entropy, accuracy) on
    random labels, any other with a mean squared error against random targets. Every
    process of a cluster must call this.
    """
    for name, value in (("micro_batch_size", micro_batch_size), ("steps", steps), ("grad_accum_steps", grad_accum_steps)):
        _checks.check_int(name, value, error=PlanError)
    _checks.check_int("warmup", warmup, error=PlanError, minimum=0)
    _checks.check_int("optimizer_slots", optimizer_slots, error=PlanError, minimum=0)
    _checks.check_choice("precision", precision, _checks.PRECISIONS, error=PlanError)
    check_keras(keras)
    import resource

    import numpy as np
    import tensorflow as tf

    from tfdist.strategy import make_strategy, wrap

    if not isinstance(model, str):
        keras = keras_of(model)  # the model's own Keras, whatever was asked for
    gpus = tf.config.list_physical_devices("GPU")
    builtin = isinstance(model, str) and not os.path.exists(model)  # a built-in classifier of tfdist.models
    # A model object was built outside any strategy scope, so it trains without one.
    dist = make_strategy(strategy) if isinstance(model, str) else wrap(tf.distribute.get_strategy())
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if gpus:
        tf.config.experimental.reset_memory_stats("GPU:0")
    net = _compiled(model, keras=keras, strategy=dist, builtin=builtin, precision=precision,
                    optimizer_slots=optimizer_slots, input_shape=input_shape, num_classes=num_classes)
    batch = micro_batch_size * dist.num_replicas_in_sync * grad_accum_steps
    rng = np.random.default_rng(0)

    def random_like(tensor):  # one batch shaped like a model input or output (unknown sizes -> 1)
        shape = (batch, *[d or 1 for d in tensor.shape[1:]])
        if tf.as_dtype(tensor.dtype).is_integer:
            return rng.integers(0, 2, size=shape).astype(tf.as_dtype(tensor.dtype).as_numpy_dtype)
        return rng.standard_normal(shape).astype("float32")

    xs = [random_like(t) for t in net.inputs]
    if builtin:
        ys = [rng.integers(0, net.outputs[0].shape[-1], size=(batch,)).astype("int32")]
    else:
        ys = [random_like(t).astype("float32") for t in net.outputs]
    one = lambda arrays: tuple(arrays) if len(arrays) > 1 else arrays[0]  # noqa: E731
    data = tf.data.Dataset.from_tensor_slices((one(xs), one(ys)))
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    data = data.batch(batch, drop_remainder=True).cache().repeat().with_options(options)

    clock = _Clock(warmup=max(2, warmup), steps=steps)
    # One run, stopped after the clock's last block: the warm-up's trace serves the timed steps.
    longest = clock.warmup + MAX_TIMED_STEPS
    if keras == "3":
        _run_keras3(net, dist, data, clock, steps=longest, grad_accum_steps=grad_accum_steps,
                    sample=(one([x[:micro_batch_size] for x in xs]), one([y[:micro_batch_size] for y in ys])))
    else:
        _run_tf_keras(net, data, clock, steps=longest, grad_accum_steps=grad_accum_steps)
    step_seconds = clock.step_seconds()
    if gpus:
        peak, source = int(tf.config.experimental.get_memory_info("GPU:0")["peak"]), "GPU:0 allocator peak"
    else:
        rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        peak, source = max(0, rss_after - rss_before), "process max RSS increase (CPU, includes TensorFlow)"
    params, trainable = param_counts(net)
    return Measurement(
        step_seconds=step_seconds,
        params=params,
        trainable_params=trainable,
        steps=clock.timed,
        grad_accum_steps=grad_accum_steps,
        warmup=clock.warmup,  # the warm-up steps that ran (at least two)
        micro_batch_size=micro_batch_size,
        replicas=dist.num_replicas_in_sync,
        strategy=dist.name if isinstance(model, str) else "none",
        device="GPU:0" if gpus else "CPU",
        peak_bytes=peak,
        peak_source=source,
        keras=keras,
    )


def _compiled(model, *, keras: str, strategy, builtin: bool, precision: str, optimizer_slots: int,
              input_shape, num_classes):
    """The model to time, compiled with an optimizer of ``optimizer_slots`` slots; a name or
    path is built or loaded in ``strategy``'s scope under the ``precision`` policy (the policy
    of Keras ``keras``, restored afterwards)."""
    from tfdist.training import keras3

    k = models.keras_module(keras)
    previous_policy = k.mixed_precision.global_policy()
    k.mixed_precision.set_global_policy(precision)
    try:
        # Keras 3 variables need aggregations under central_storage: tfdist's building scope gives them.
        scope = keras3.building_scope(strategy) if keras == "3" else strategy.scope()
        with scope:
            net = model
            if isinstance(model, str):
                net = _load_model(model, keras=keras, input_shape=input_shape, num_classes=num_classes)
            # Only the one used: a Keras 3 optimizer makes variables when it is created.
            if optimizer_slots == 0:
                optimizer = k.optimizers.SGD()
            elif optimizer_slots == 1:
                optimizer = k.optimizers.SGD(momentum=0.9)
            else:
                optimizer = k.optimizers.Adam()
            if builtin:  # the loss and metric of the real run: their cost is part of a step
                net.compile(optimizer=optimizer, loss=k.losses.SparseCategoricalCrossentropy(from_logits=True),
                            metrics=["accuracy"])
            else:
                net.compile(optimizer=optimizer, loss="mse")
    finally:
        k.mixed_precision.set_global_policy(previous_policy)
    return net


def _run_keras3(net, strategy, data, clock: _Clock, *, steps: int, grad_accum_steps: int, sample) -> None:
    """Runs tfdist's Keras 3 loop -- the step ``tfdist.fit`` runs, accumulation included -- until
    ``clock`` has its last block, waiting for the steps it chooses."""
    from tfdist.training import keras3
    from tfdist.training.loop import Hooks, run_loop

    keras3.prepare(net, strategy=strategy, sample=sample, grad_accum_steps=grad_accum_steps)
    # Reading a weight the step updates waits for the step (on a GPU too: the copy to the host
    # follows the update on the device's stream).
    last = (net.trainable_variables or [net.optimizer.iterations])[-1]

    class _Timer(Hooks):
        def on_step_end(self, global_step: int) -> None:
            if clock.waits_for(global_step):
                last.numpy()
                if clock.mark(global_step):
                    net.stop_training = True

    run_loop(net, strategy=strategy, train_data=strategy.experimental_distribute_dataset(data),
             steps_per_epoch=steps, epochs=1, verbose=0, grad_accum_steps=grad_accum_steps, hooks=_Timer())


def _run_tf_keras(net, data, clock: _Clock, *, steps: int, grad_accum_steps: int) -> None:
    """Runs plain tf_keras ``fit`` (with tfdist's accumulated step) until ``clock`` has its last
    block, waiting for the steps it chooses."""
    import tf_keras

    from tfdist._compat import tf_keras as tf_keras_compat
    from tfdist.training.keras2 import install_grad_accumulation

    install_grad_accumulation(net, grad_accum_steps)

    class _Timer(tf_keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            tf_keras_compat.take_tensor_logs(self)  # logs stay tensors: only the steps the clock chose are waited for

        def on_train_batch_end(self, batch_index, logs=None):
            if clock.waits_for(batch_index + 1):
                float((logs or {}).get("loss", 0.0))  # reading the loss waits for the step
                if clock.mark(batch_index + 1):
                    self.model.stop_training = True

    net.fit(data, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[_Timer()])
