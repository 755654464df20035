"""tfdist.fit with Keras 3 models (TensorFlow's default Keras): callbacks, custom steps, precision,
accumulation, refusals, and metrics equal to one device under mirrored and central_storage.

Exact resume with Keras 3 is tested where tf_keras' is: tests/test_checkpoint.py and
tests/multiprocess/ (the built-in models are Keras 3 by default)."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

import tfdist
from tfdist.errors import ModelError

from conftest import Crash, crash_after, same_weights, script_result

_RNG = np.random.RandomState(3)
X = _RNG.rand(256, 6).astype(np.float32)
Y = (X.sum(1) * 1.7).astype(np.int64) % 3


def _model(*, dropout=True, synchronized=False, schedule=True):
    import keras

    lr = keras.optimizers.schedules.ExponentialDecay(0.01, 20, 0.9) if schedule else 0.01
    # No bias before BatchNormalization (it cancels out; Adam would turn its float noise into steps).
    layers = [keras.Input((6,)), keras.layers.Dense(16, use_bias=False), keras.layers.BatchNormalization(synchronized=synchronized),
              keras.layers.Activation("relu")]
    if dropout:
        layers.append(keras.layers.Dropout(0.2))
    model = keras.Sequential([*layers, keras.layers.Dense(3)])
    model.compile(keras.optimizers.Adam(lr), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def _fit(**kwargs):
    options = dict(epochs=2, batch_size=32, strategy="one_device", seed=1, deterministic=True, verbose=0)
    options.update(kwargs)
    model = options.pop("model", _model)
    return tfdist.fit(model, options.pop("data", (X, Y)), **options)


def test_a_layer_drawing_keras_random_numbers_without_a_seed_resumes_bit_identical():
    # keras.random.normal(shape) without a seed draws from Keras' global seed generator, which
    # tf.train.Checkpoint(model=...) does not save: a resumed run would draw other numbers.
    import keras

    class Noise(keras.layers.Layer):
        def call(self, x, training=False):
            return x + keras.random.normal(keras.ops.shape(x), stddev=0.1) if training else x

    def noisy():
        model = keras.Sequential([keras.Input((6,)), Noise(), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(3)])
        model.compile(keras.optimizers.SGD(0.05), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    import tempfile

    reference = _fit(model=noisy)
    directory = tempfile.mkdtemp()
    with pytest.raises(Crash):
        _fit(model=noisy, checkpoint_dir=directory, save_every_steps=4, callbacks=[crash_after(11)])
    resumed = _fit(model=noisy, checkpoint_dir=directory, save_every_steps=4)
    assert resumed.tfdist.start_step == 8 and same_weights(resumed.model, reference.model)


def test_a_compiled_subclassed_model_built_with_build_shape_is_trained_and_given_the_weights():
    # model.build(shape) marks a Keras 3 subclass built without making its layers' weights.
    import keras

    class Net(keras.Model):
        def __init__(self, units=3, **kwargs):
            super().__init__(**kwargs)
            self.units = units
            self.hidden, self.out = keras.layers.Dense(8, activation="relu"), keras.layers.Dense(units)

        def call(self, x):
            return self.out(self.hidden(x))

        def get_config(self):
            return {**super().get_config(), "units": self.units}

    model = Net()
    model.build((None, 6))
    model.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = _fit(model=model, epochs=1)
    assert history.tfdist.global_step == 8 and len(model.weights) == 4
    assert np.isfinite(history.history["loss"][0])
    np.testing.assert_array_equal(model.predict(X[:4], verbose=0), history.model.predict(X[:4], verbose=0))


def test_a_keras_3_model_trains_and_the_users_callbacks_see_what_model_fit_gives_them(tmp_path):
    import keras

    class Counter(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.calls = {}

        def _count(self, name):
            self.calls[name] = self.calls.get(name, 0) + 1

        def on_train_begin(self, logs=None):
            self._count("train_begin")

        def on_epoch_begin(self, epoch, logs=None):
            self._count("epoch_begin")

        def on_train_batch_end(self, batch, logs=None):
            self._count("batch_end")
            assert set(logs) >= {"loss", "accuracy"}

        def on_test_begin(self, logs=None):
            self._count("test_begin")

        def on_epoch_end(self, epoch, logs=None):
            self._count("epoch_end")
            assert set(logs) >= {"loss", "accuracy", "val_loss", "val_accuracy"}

        def on_train_end(self, logs=None):
            self._count("train_end")

    counter = Counter()
    history = _fit(epochs=3, validation_data=(X[:64], Y[:64]), callbacks=[counter, keras.callbacks.TensorBoard(str(tmp_path))])
    assert isinstance(history, keras.callbacks.History) and history.tfdist.global_step == 3 * 8
    assert history.history["loss"][-1] < history.history["loss"][0] and len(history.epoch) == 3
    assert counter.calls == {"train_begin": 1, "epoch_begin": 3, "batch_end": 24, "test_begin": 3, "epoch_end": 3,
                             "train_end": 1}
    assert list(tmp_path.glob("train/events.out.tfevents.*")) and list(tmp_path.glob("validation/events.out.tfevents.*"))


def test_early_stopping_stops_the_run_and_a_second_call_reports_it_complete(tmp_path):
    import keras

    stop = keras.callbacks.EarlyStopping(monitor="loss", patience=0, min_delta=10.0)  # stops after epoch 2
    history = _fit(epochs=5, callbacks=[stop], checkpoint_dir=str(tmp_path))
    assert len(history.epoch) == 2 and history.tfdist.global_step == 16
    again = _fit(epochs=5, checkpoint_dir=str(tmp_path))
    assert again.tfdist.start_step == 16 and again.tfdist.completed and len(again.epoch) == 2


def test_a_subclassed_model_with_its_own_train_step_runs_that_step():
    import keras

    class Custom(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(3)
            self.steps = keras.Variable(0, dtype="int64", trainable=False)

        def call(self, x):
            return self.dense(x)

        def train_step(self, data):
            self.steps.assign_add(1)
            return super().train_step(data)

    def build():
        model = Custom()
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    history = _fit(model=build, epochs=1)
    assert int(history.model.steps.numpy()) == 8


def test_the_keras_guide_train_step_returning_every_metric_result_logs_them_flat_as_fit_does():
    """Keras' guide writes ``return {m.name: m.result() for m in self.metrics}``: with compiled
    metrics one of them is ``compile_metrics``, whose result is a dict; fit flattens it."""
    import keras
    import tensorflow as tf

    class Guide(keras.Model):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(y=y, y_pred=y_pred)
            self.optimizer.apply(tape.gradient(loss, self.trainable_variables), self.trainable_variables)
            for metric in self.metrics:
                metric.update_state(loss) if metric.name == "loss" else metric.update_state(y, y_pred)
            return {m.name: m.result() for m in self.metrics}

    def build():
        inputs = keras.Input((6,))
        model = Guide(inputs, keras.layers.Dense(3)(inputs))
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
        return model

    history = _fit(model=build, epochs=2)
    assert sorted(history.history) == ["accuracy", "loss"]
    assert all(isinstance(v, float) and np.isfinite(v) for values in history.history.values() for v in values)
    assert 0.0 <= history.history["accuracy"][1] <= 1.0 and history.history["loss"][1] < history.history["loss"][0]


def test_a_model_built_in_the_users_own_strategy_scope_trains_under_that_strategy_or_is_refused_with_the_fix():
    import tensorflow as tf

    from tfdist.errors import ModelError

    mine = tf.distribute.OneDeviceStrategy("/cpu:0")
    with mine.scope():
        model = _model(dropout=False)
    history = _fit(model=model, epochs=1)  # strategy="one_device": that strategy's own name
    assert history.model.distribute_strategy is mine and history.tfdist.strategy == "one_device"
    assert _fit(model=model, epochs=1, strategy="auto").model.distribute_strategy is mine
    with pytest.raises(ModelError, match=r"built in the scope of a OneDeviceStrategy \(one_device\).*received "
                                         r"strategy='central_storage'\. Fix: pass that strategy object"):
        _fit(model=model, epochs=1, strategy="central_storage")


def test_mixed_precision_builds_the_model_under_the_policy():
    history = _fit(model=lambda: _model(dropout=False), mixed_precision="mixed_float16", epochs=1)
    model = history.model
    assert type(model.optimizer).__name__ == "LossScaleOptimizer"
    assert model.layers[0].compute_dtype == "float16" and np.isfinite(history.history["loss"][0])
    # Keras 3's loss-scale optimizer fails in its first step under central_storage; refused first.
    with pytest.raises(ModelError, match="mixed_float16 needs loss scaling.*received strategy='central_storage'"):
        _fit(model=lambda: _model(dropout=False), mixed_precision="mixed_float16", strategy="central_storage")
    bfloat16 = _fit(model=lambda: _model(dropout=False), mixed_precision="mixed_bfloat16", strategy="central_storage",
                    epochs=1)
    assert np.isfinite(bfloat16.history["loss"][0]) and bfloat16.tfdist.strategy == "central_storage"


def test_gradient_accumulation_equals_the_large_batch():
    import keras

    def dense():  # no BatchNormalization: its statistics would differ on micro batches
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)])
        model.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    big = _fit(model=dense, epochs=2)
    acc = _fit(model=dense, epochs=2, grad_accum_steps=4)
    assert acc.tfdist.micro_batch_size == 8 and int(acc.model.optimizer.iterations.numpy()) == 16
    for a, b in zip(big.model.get_weights(), acc.model.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5)
    np.testing.assert_allclose(big.history["loss"], acc.history["loss"], rtol=1e-5)


def test_refusals_name_the_problem_and_the_fix(monkeypatch):
    import keras
    import tf_keras

    with pytest.raises(ModelError, match="BackupAndRestore"):
        _fit(callbacks=[keras.callbacks.BackupAndRestore("/tmp/unused-backup")])

    class Mixed(keras.Model):
        def __init__(self):
            super().__init__()
            self.inner = tf_keras.layers.Dense(3)  # a tf_keras layer inside a Keras 3 model never trains

        def call(self, x):
            return self.inner(x)

    def build_mixed():
        model = Mixed()
        model.compile("sgd", "mse")
        return model

    with pytest.raises(ModelError, match="holds tf_keras layers.*Fix: build every layer with Keras 3"):
        _fit(model=build_mixed, epochs=1)

    def ema_written_every(n):
        model = _model(dropout=False)
        model.compile(keras.optimizers.Adam(0.01, use_ema=True, ema_overwrite_frequency=n),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    with pytest.raises(ModelError, match=r"under mirrored .*received Adam\(use_ema=True, ema_overwrite_frequency=2\)\. "
                                         r"Fix: pass ema_overwrite_frequency=None"):
        _fit(model=lambda: ema_written_every(2), strategy="mirrored", epochs=1)
    assert _fit(model=lambda: ema_written_every(2), epochs=1).tfdist.global_step == 8  # one device: Keras can
    monkeypatch.setattr(keras.backend, "backend", lambda: "jax")
    with pytest.raises(ModelError, match="KERAS_BACKEND='jax'.*Fix: set KERAS_BACKEND=tensorflow"):
        _fit(epochs=1)


_TWO_CPUS = textwrap.dedent(
    """
    import json
    import numpy as np
    import tfdist
    devices = tfdist.split_cpu(2)
    from test_fit_keras3 import X, Y, _model

    out = {}
    for name in ("one_device", "mirrored", "central_storage"):
        # Synchronized BatchNormalization and no dropout: replicas then compute what one device does.
        history = tfdist.fit(lambda: _model(dropout=False, synchronized=True), (X, Y), epochs=2, batch_size=32,
                             strategy=name, devices=None if name == "one_device" else devices, seed=1,
                             deterministic=True, verbose=0, validation_data=(X[:64], Y[:64]))
        out[name] = {"history": history.history, "replicas": history.tfdist.num_replicas,
                     "weights": [w.tolist() for w in history.model.get_weights()]}
    print("RESULT " + json.dumps(out))
    """
)


# In a fresh process (2 logical CPUs): Keras turns jit_compile off under op determinism, which deterministic=True
# fits switch on process-wide (TensorFlow has no public way back).
_XLA = textwrap.dedent(
    """
    import json, logging, sys
    import tfdist
    devices = tfdist.split_cpu(2)
    from test_fit_keras3 import X, Y, _model

    records = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logging.getLogger("tfdist").addHandler(handler)
    logging.getLogger("tfdist").setLevel(logging.INFO)

    def build(jit_compile):
        def make():
            model = _model(dropout=False, schedule=False, synchronized=True)
            model.compile(model.optimizer, model.loss, metrics=["accuracy"], jit_compile=jit_compile)
            return model
        return make

    out = {}
    for name in ("one_device", "mirrored"):
        for jit in (False, True):
            del records[:]
            history = tfdist.fit(build(jit), (X, Y), epochs=1, batch_size=32, strategy=name, seed=1, verbose=0,
                                 devices=None if name == "one_device" else devices, validation_data=(X[:64], Y[:64]))
            out[f"{name} {jit}"] = {"history": history.history, "jit_compile": history.model.jit_compile,
                                    "xla_logged": any("compiled with XLA" in m for m in records),
                                    "not_applied": any("not applied to replicas on 2 CPU" in m for m in records)}
    print("RESULT " + json.dumps(out))
    """
)


@pytest.mark.timeout(300)
def test_jit_compile_true_compiles_the_steps_with_xla_as_model_fit_does(procs):
    result = script_result(procs, _XLA)
    # XLA on one device; 2 replicas on logical CPU devices cannot run XLA (it places the function on
    # one CPU): tfdist says so and trains without it.
    for name, applied in (("one_device", True), ("mirrored", False)):
        plain, xla = result[f"{name} False"], result[f"{name} True"]
        assert (plain["jit_compile"], plain["xla_logged"], plain["not_applied"]) == (False, False, False), name
        assert (xla["jit_compile"], xla["xla_logged"], xla["not_applied"]) == (True, applied, not applied), name
        for key in ("loss", "val_loss"):  # the same training, up to XLA's float reordering
            np.testing.assert_allclose(xla["history"][key], plain["history"][key], rtol=1e-4, err_msg=f"{name} {key}")


def test_mirrored_and_central_storage_give_one_devices_metrics_and_weights(two_cpu_scripts):
    result = two_cpu_scripts("keras3")  # _TWO_CPUS
    one = result["one_device"]
    for name in ("mirrored", "central_storage"):
        run = result[name]
        assert run["replicas"] == 2
        for key, values in one["history"].items():  # same global batch: same metrics (float tolerance)
            # An accuracy can flip on one example whose logits tie within float error (1 of 64).
            atol = 1.5 / 64 if "accuracy" in key else 1e-6
            np.testing.assert_allclose(run["history"][key], values, rtol=1e-5, atol=atol, err_msg=f"{name} {key}")
        for a, b in zip(run["weights"], one["weights"]):
            np.testing.assert_allclose(a, b, atol=1e-5, err_msg=name)


def test_fits_in_one_process_do_not_warn_of_retracing_tfdists_own_loop_functions(monkeypatch):
    # Each fit makes its own train and test functions; TensorFlow counts traces by the code, so
    # a notebook's third or fourth fit warned of a retracing loop naming _Functions._test_one.
    from tensorflow.python.eager.polymorphic_function import polymorphic_function

    traces = []
    detector = polymorphic_function._frequent_tracing_detector_manager
    monkeypatch.setattr(type(detector), "called_with_tracing",
                        lambda self, key, function, omit: traces.append((getattr(function, "__name__", ""), omit)))
    x = np.random.default_rng(0).random((64, 6)).astype("float32")
    y = (x.sum(axis=1) > 3).astype("int32")
    for _ in range(2):
        tfdist.fit(lambda: _model(dropout=False, schedule=False), (x, y), validation_data=(x[:16], y[:16]),
                   epochs=1, batch_size=16, strategy="one_device", verbose=0)
    ours = [omit for name, omit in traces if name in ("run", "_test_one")]
    assert len(ours) >= 4 and all(ours)
