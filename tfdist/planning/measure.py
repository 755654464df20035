"""Measured inputs of a plan: a model's parameter count and its step time on this machine.

TensorFlow is imported inside the functions only.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Sequence

from tfdist import _checks, models
from tfdist.errors import PlanError

if TYPE_CHECKING:  # pragma: no cover
    import tf_keras


MIN_TIMED_SECONDS = 1.0
"""``measure_step_time`` times at least this long (more steps than asked for when they are short)."""
MAX_TIMED_STEPS = 5000
TIMED_BLOCKS = 5


def _load_model(model: str, *, input_shape: Sequence[int] | None = None, num_classes: int | None = None):
    """A tf_keras model from a saved-model path or a built-in model name."""
    if os.path.exists(model):
        import tf_keras

        try:
            return tf_keras.models.load_model(model, compile=False)
        except Exception as e:  # noqa: BLE001 -- any load failure is the user's file
            raise PlanError(
                f"Invalid `model`; received model={model!r}, which tf_keras cannot load ({type(e).__name__}: {e}). "
                "Fix: pass a .keras/.h5/SavedModel path saved with tf_keras, or --params."
            ) from e
    if model not in models.MODELS:
        raise PlanError(
            f"Invalid `model`; received model={model!r}, neither a file nor a built-in model. "
            f"Fix: use a path or one of {', '.join(sorted(models.MODELS))}."
        )
    shape = tuple(input_shape) if input_shape is not None else models.DEFAULT_INPUT_SHAPE
    # The step measured is tf_keras' (its fit runs the model); the built-in layers are the same in Keras 3.
    return models.build(model, input_shape=shape, num_classes=num_classes or models.DEFAULT_NUM_CLASSES, keras="2")


def builtin_params(name: str, *, input_shape: Sequence[int] | None = None, num_classes: int | None = None) -> int:
    """Parameter count of a built-in model, built (not trained) through ``tfdist.models``."""
    return int(_load_model(name, input_shape=input_shape, num_classes=num_classes).count_params())


@dataclasses.dataclass(frozen=True)
class Measurement:
    """Result of ``measure_step_time``.

    ``step_seconds`` is the median time of one optimizer step: with ``grad_accum_steps`` > 1,
    one accumulated step over that many micro batches. ``peak_bytes`` is the GPU allocator's peak (``tf.config.experimental.get_memory_info``)
    on GPU; on CPU the increase of the process's maximum resident set (``ru_maxrss``)
    over the run, which includes TensorFlow's own allocations; None if neither is known.
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


def measure_step_time(
    *,
    model: "str | tf_keras.Model",
    micro_batch_size: int,
    strategy: str = "auto",
    steps: int = 20,
    warmup: int = 3,
    grad_accum_steps: int = 1,
    precision: str = "float32",
    optimizer_slots: int = 2,
    input_shape: Sequence[int] | None = None,
    num_classes: int | None = None,
) -> Measurement:
    """Times at least ``steps`` train steps of ``model`` after ``warmup`` steps (at least two),
    on random data.

    Short steps are timed for at least ``MIN_TIMED_SECONDS`` (more steps than asked for), in
    ``TIMED_BLOCKS`` blocks that run asynchronously, as training does, with the device waited
    for only at the end of each block; ``step_seconds`` is the median block's time per step.

    With ``grad_accum_steps`` > 1 the steps are tfdist's accumulated steps (one while loop
    over the micro batches, one optimizer update), so their fixed cost -- dispatch,
    optimizer update, metrics -- is measured once per optimizer step, as it is paid.

    ``model`` is a built-in name or a saved-model path, built under ``strategy``, or a
    tf_keras model object, trained as is without a strategy, with plain tf_keras
    ``model.fit``. Each replica gets ``micro_batch_size`` examples of random data;
    a built-in model is trained with its own loss and metric (cross-entropy, accuracy) on
    random labels, any other with a mean squared error against random targets. Every
    process of a cluster must call this.
    """
    for name, value in (("micro_batch_size", micro_batch_size), ("steps", steps), ("grad_accum_steps", grad_accum_steps)):
        _checks.check_int(name, value, error=PlanError)
    _checks.check_int("warmup", warmup, error=PlanError, minimum=0)
    import resource
    import time

    import numpy as np
    import tensorflow as tf
    import tf_keras

    from tfdist.training.keras2 import install_grad_accumulation
    from tfdist.strategy import make_strategy, name_of

    gpus = tf.config.list_physical_devices("GPU")
    builtin = isinstance(model, str) and not os.path.exists(model)  # a built-in classifier of tfdist.models
    # A model object was built outside any strategy scope, so it trains without one.
    dist = make_strategy(strategy) if isinstance(model, str) else tf.distribute.get_strategy()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if gpus:
        tf.config.experimental.reset_memory_stats("GPU:0")
    previous_policy = tf_keras.mixed_precision.global_policy()
    tf_keras.mixed_precision.set_global_policy(precision)
    try:
        with dist.scope():
            net = model
            if isinstance(model, str):
                net = _load_model(model, input_shape=input_shape, num_classes=num_classes)
            optimizer = {0: tf_keras.optimizers.SGD(), 1: tf_keras.optimizers.SGD(momentum=0.9)}.get(
                optimizer_slots, tf_keras.optimizers.Adam()
            )
            if builtin:  # the loss and metric of the real run: their cost is part of a step
                net.compile(optimizer=optimizer, loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                            metrics=["accuracy"])
            else:
                net.compile(optimizer=optimizer, loss="mse")
            install_grad_accumulation(net, grad_accum_steps)
    finally:
        tf_keras.mixed_precision.set_global_policy(previous_policy)
    batch = micro_batch_size * dist.num_replicas_in_sync * grad_accum_steps
    rng = np.random.default_rng(0)

    def random_like(tensor):  # one batch shaped like a model input or output (unknown sizes -> 1)
        shape = (batch, *[d or 1 for d in tensor.shape[1:]])
        if tensor.dtype.is_integer:
            return rng.integers(0, 2, size=shape).astype(tensor.dtype.as_numpy_dtype)
        return rng.standard_normal(shape).astype("float32")

    xs = [random_like(t) for t in net.inputs]
    if builtin:
        ys = [rng.integers(0, net.outputs[0].shape[-1], size=(batch,)).astype("int32")]
    else:
        ys = [random_like(t) if not t.dtype.is_integer else random_like(t).astype("float32") for t in net.outputs]
    one = lambda arrays: tuple(arrays) if len(arrays) > 1 else arrays[0]  # noqa: E731
    data = tf.data.Dataset.from_tensor_slices((one(xs), one(ys)))
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    data = data.batch(batch, drop_remainder=True).cache().repeat().with_options(options)

    marks: list[float] = []
    sync_at: set[int] = set()

    class _Timer(tf_keras.callbacks.Callback):
        """Records when chosen steps have finished; between them the steps run asynchronously,
        as they do in training (reading the loss waits for the device)."""

        def __init__(self):
            super().__init__()
            self._supports_tf_logs = True

        def on_train_batch_end(self, batch_index, logs=None):
            if batch_index + 1 in sync_at:
                float((logs or {}).get("loss", 0.0))
                marks.append(time.perf_counter())

    # Warm-up (tracing; at least two steps), each step waited for: a first estimate of the step.
    probe = max(2, warmup)
    sync_at.update(range(1, probe + 1))
    net.fit(data, epochs=1, steps_per_epoch=probe, verbose=0, callbacks=[_Timer()])
    estimate = float(np.median(np.diff(marks)))
    # Timed: at least `steps` steps and MIN_TIMED_SECONDS of them, in TIMED_BLOCKS blocks; the
    # median block (one slowed down by another process on the machine does not count).
    timed = int(min(MAX_TIMED_STEPS, max(steps, np.ceil(MIN_TIMED_SECONDS / max(estimate, 1e-6)))))
    blocks = min(TIMED_BLOCKS, timed)
    bounds = [round(timed * (i + 1) / blocks) for i in range(blocks)]
    marks.clear()
    sync_at.clear()
    sync_at.update(bounds)
    start = time.perf_counter()
    net.fit(data, epochs=1, steps_per_epoch=timed, verbose=0, callbacks=[_Timer()])
    step_seconds = float(np.median([(end - begin) / (b - a) for begin, end, a, b in
                                    zip([start, *marks[:-1]], marks, [0, *bounds[:-1]], bounds)]))
    if gpus:
        peak, source = int(tf.config.experimental.get_memory_info("GPU:0")["peak"]), "GPU:0 allocator peak"
    else:
        rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        peak, source = max(0, rss_after - rss_before), "process max RSS increase (CPU, includes TensorFlow)"
    return Measurement(
        step_seconds=step_seconds,
        params=int(net.count_params()),
        steps=timed,
        grad_accum_steps=grad_accum_steps,
        warmup=probe,  # the warm-up steps that ran (at least two)
        micro_batch_size=micro_batch_size,
        replicas=dist.num_replicas_in_sync,
        strategy=name_of(dist) if isinstance(model, str) else "none",
        device="GPU:0" if gpus else "CPU",
        peak_bytes=peak,
        peak_source=source,
    )


# --- the entry point --------------------------------------------------------------------------
