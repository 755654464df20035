"""tfdist's own training loop for Keras 3 models (tfdist/training/keras3.py and loop.py) under every strategy.

Each scenario runs in fresh processes (logical CPU devices must be split before TensorFlow
starts; multi-worker clusters are real local processes): this file is also the program they
run (``python tests/test_keras3.py SCENARIO ...``), which prints one JSON line of results
that the test asserts on. The multi-worker and parameter-server programs run as the last
parts of the jobs of tests/multiprocess/test_multi_worker.py and test_parameter_server.py,
which start each cluster once for both files.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile

import numpy as np
import pytest

from tfdist._compat import keras3 as keras3_compat
from tfdist.training import keras3 as keras3_loop
from tfdist.training import loop as loop_mod

GLOBAL_BATCH, STEPS_PER_EPOCH, FEATURES, CLASSES = 16, 3, 6, 3
# Replicas compute in another order than one device (per-replica sums, then an all-reduce):
# float32 results agree to a few ulps of the values (measured: 1.8e-7 on weights, 6e-8 on logs).
TOLERANCE = 1e-6


# --- the programs the tests start ----------------------------------------------------------


def _data(n=GLOBAL_BATCH * STEPS_PER_EPOCH):
    rs = np.random.RandomState(0)
    x = rs.normal(size=(n, FEATURES)).astype("float32")
    y = (x @ rs.normal(size=(FEATURES, CLASSES))).argmax(1).astype("int32")
    return x, y


def _model(*, dropout=0.3, sync_bn=False, batch_norm=True):
    import keras

    keras.utils.set_random_seed(7)
    layers = [keras.Input((FEATURES,)), keras.layers.Dense(16, activation="relu")]
    if batch_norm:
        layers.append(keras.layers.BatchNormalization(synchronized=sync_bn))
    if dropout:
        layers.append(keras.layers.Dropout(dropout, seed=3))
    model = keras.Sequential([*layers, keras.layers.Dense(CLASSES)])
    schedule = keras.optimizers.schedules.ExponentialDecay(0.05, decay_steps=2, decay_rate=0.7)
    model.compile(optimizer=keras.optimizers.Adam(schedule),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def _dataset_fn(start_step, stop_step, replicas):
    """Global step s reads examples [s % SPE * GB, +GB) in order; each input pipeline its replicas' slices."""
    import tensorflow as tf

    x, y = _data()
    per_replica = GLOBAL_BATCH // replicas

    def make(context=None):
        pipelines = context.num_input_pipelines if context else 1
        local = replicas // pipelines
        offset = (context.input_pipeline_id if context else 0) * local * per_replica

        def step(s):
            rows = tf.range(s % STEPS_PER_EPOCH * GLOBAL_BATCH + offset, s % STEPS_PER_EPOCH * GLOBAL_BATCH + offset + local * per_replica)
            return tf.data.Dataset.from_tensor_slices((tf.reshape(tf.gather(x, rows), [local, per_replica, FEATURES]),
                                                       tf.reshape(tf.gather(y, rows), [local, per_replica])))

        return tf.data.Dataset.range(start_step, stop_step).flat_map(step)

    return make


def _train(strategy, model, *, epochs=2, start_step=0, validation=None, **kwargs):
    import tensorflow as tf


    x, y = _data()
    keras3_loop.prepare(model, strategy=strategy, sample=(x[:8], y[:8]), grad_accum_steps=kwargs.get("grad_accum_steps", 1))
    data = strategy.distribute_datasets_from_function(
        _dataset_fn(start_step, STEPS_PER_EPOCH * epochs, strategy.num_replicas_in_sync))
    val = None
    if validation is not None:
        val = tf.data.Dataset.from_tensor_slices((x[:validation], y[:validation])).batch(GLOBAL_BATCH)
    return loop_mod.run_loop(model, strategy=strategy, train_data=data, steps_per_epoch=STEPS_PER_EPOCH, epochs=epochs,
                                start_step=start_step, validation_data=val, verbose=0, **kwargs)


def _weights(model):
    return [np.asarray(w) for w in model.get_weights()]


def _max_diff(a, b):
    return max(float(np.max(np.abs(np.asarray(u) - np.asarray(v)))) for u, v in zip(a, b))


def _two_cpus():
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)


class _Recorder:
    """A Keras callback that records every call it receives (name, batch or epoch, log keys)."""

    @staticmethod
    def make():
        import keras

        class Recorder(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.calls = []

            def _record(self, name, index=None, logs=None):
                self.calls.append([name, index, sorted(logs) if logs else None])

        for name in ("train_begin", "train_end", "test_begin", "test_end"):
            setattr(Recorder, f"on_{name}", lambda self, logs=None, _n=name: self._record(_n, None, logs))
        for name in ("epoch_begin", "epoch_end", "train_batch_begin", "train_batch_end", "test_batch_begin", "test_batch_end"):
            setattr(Recorder, f"on_{name}", lambda self, i, logs=None, _n=name: self._record(_n, i, logs))
        return Recorder()


def _summary_tags(path):
    import tensorflow as tf

    tags = set()
    for record in tf.data.TFRecordDataset(path):
        tags.update(value.tag for value in tf.compat.v1.Event.FromString(record.numpy()).summary.value)
    return sorted(tags)


def program_one_device():
    """(a) loop vs model.fit, (e) callbacks, (f) a custom train_step, hooks at execution ends."""
    import keras
    import tensorflow as tf


    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    x, y = _data()
    out = {}

    def callbacks():
        return [_Recorder.make(), keras.callbacks.EarlyStopping(monitor="val_loss", patience=0, min_delta=10.0)]

    with strategy.scope():
        reference = _model()
    fit_callbacks = callbacks()
    fit = reference.fit(x, y, batch_size=GLOBAL_BATCH, epochs=4, shuffle=False, verbose=0,
                        validation_data=(x[:20], y[:20]), callbacks=fit_callbacks)
    with keras3_loop.building_scope(strategy):
        model = _model()
    loop_callbacks = callbacks()
    with tempfile.TemporaryDirectory() as logdir:
        board = keras.callbacks.TensorBoard(logdir, update_freq=1)
        loop = _train(strategy, model, epochs=4, validation=20, callbacks=[*loop_callbacks, board])
        out["tensorboard"] = {os.path.basename(d): sorted(_summary_tags(os.path.join(d, f)) for f in files)
                              for d, _, files in os.walk(logdir) if files}
    out["fit"] = {"history": fit.history, "calls": fit_callbacks[0].calls, "stopped": fit_callbacks[1].stopped_epoch}
    out["loop"] = {"history": loop.history, "calls": loop_callbacks[0].calls, "stopped": loop_callbacks[1].stopped_epoch,
                   "history_is_keras3": type(loop).__module__.startswith("keras.")}
    out["weights_equal"] = all(np.array_equal(a, b) for a, b in zip(_weights(reference), _weights(model)))

    # Hooks and batch indices with steps_per_execution=2, resumed at global step 4 (epoch 1, step 1).
    class Hooks(loop_mod.Hooks):
        def __init__(self):
            self.calls = []

        def on_train_begin(self):
            self.calls.append(["train_begin"])

        def on_epoch_begin(self, epoch):
            self.calls.append(["epoch_begin", epoch, float(model.metrics_variables[1].numpy())])  # loss count: reset

        def on_step_end(self, step):
            self.calls.append(["step_end", step])

        def on_epoch_end(self, epoch, logs):
            self.calls.append(["epoch_end", epoch, sorted(logs)])

        def on_train_end(self):
            self.calls.append(["train_end"])

    hooks, recorder = Hooks(), _Recorder.make()
    with keras3_loop.building_scope(strategy):
        model = _model()
    _train(strategy, model, epochs=3, start_step=4, steps_per_execution=2, hooks=hooks, callbacks=[recorder])
    out["hooks"] = hooks.calls
    out["resumed_batches"] = [c for c in recorder.calls if c[0].startswith("train_batch")]

    # A subclassed model with its own train_step (and logs that are not its metrics).
    class Custom(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(CLASSES)
            self.steps = keras.metrics.Sum(name="steps")

        def call(self, inputs):
            return self.dense(inputs)

        def train_step(self, data):
            inputs, labels = data
            with tf.GradientTape() as tape:
                loss = self.compute_loss(x=inputs, y=labels, y_pred=self(inputs, training=True))
            grads = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply(grads, self.trainable_variables)
            self.steps.update_state(1.0)
            return {"custom_loss": loss, "steps": self.steps.result()}

    with keras3_loop.building_scope(strategy):
        custom = Custom()
        custom.compile(optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = _train(strategy, custom, epochs=3)
    out["custom"] = history.history
    return out


def program_replicas():
    """(b) mirrored and central_storage match one_device for the same global batch."""
    _two_cpus()
    import tensorflow as tf


    strategies = {
        "one_device": tf.distribute.OneDeviceStrategy("/cpu:0"),
        "mirrored": tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]),
        "central_storage": tf.distribute.experimental.CentralStorageStrategy(["/cpu:0", "/cpu:1"], parameter_device="/cpu:0"),
    }
    out = {}
    for name, strategy in strategies.items():
        # Synchronized BatchNormalization: the statistics of the global batch, as on one device.
        # (Per-replica statistics and Dropout masks cannot equal one device's.)
        for spx in (1,) if name == "one_device" else (1, 2):
            with keras3_loop.building_scope(strategy):
                model = _model(dropout=0, sync_bn=True)
            history = _train(strategy, model, validation=17, steps_per_execution=spx)  # last val batch: 1 example
            out[f"{name}/spx{spx}"] = {"history": history.history, "weights": [w.tolist() for w in _weights(model)],
                                       "iterations": int(model.optimizer.iterations.numpy())}
        # tfdist's gradient accumulation: 2 micro batches per replica, the update of the whole batch.
        with keras3_loop.building_scope(strategy):
            model = _model(dropout=0, batch_norm=False)
        history = _train(strategy, model, grad_accum_steps=1 if name == "one_device" else 2)
        out[f"{name}/accum"] = {"history": history.history, "weights": [w.tolist() for w in _weights(model)],
                                "iterations": int(model.optimizer.iterations.numpy())}
    # Under central_storage, Dropout and unsynchronized BatchNormalization train too (they fail
    # without building_scope's aggregations).
    with keras3_loop.building_scope(strategies["central_storage"]):
        model = _model(dropout=0.3)
    out["central_storage/dropout"] = _train(strategies["central_storage"], model).history
    return out


def _replica_state(strategy, variables):
    """Each replica's own value of ``variables``, kept in checkpointable [replicas, ...] variables."""
    import tensorflow as tf

    module = tf.Module()
    with tf.init_scope():
        module.values = [tf.Variable(tf.zeros([strategy.num_replicas_in_sync, *v.shape], v.dtype), trainable=False)
                         for v in variables]

    @tf.function
    def capture():
        # In a replica, a variable reads as that replica's own copy.
        local = strategy.run(lambda: [tf.identity(v.value) for v in variables])
        for shadow, value in zip(module.values, local):
            shadow.assign(tf.stack(strategy.experimental_local_results(value)))

    @tf.function
    def restore():
        def assign():
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            for variable, shadow in zip(variables, module.values):
                variable.value.assign(tf.gather(shadow, replica))

        strategy.run(assign)

    return module, capture, restore


class _Stop(Exception):
    pass


def _checkpointed(strategy, model):
    """A checkpoint of everything a bit-identical resume needs, with its capture and restore
    functions (after ``prepare``: the metric variables exist from then on)."""
    import tensorflow as tf


    x, y = _data()
    keras3_loop.prepare(model, strategy=strategy, sample=(x[:8], y[:8]))
    rng, metrics = tf.Module(), tf.Module()
    rng.states = list(keras3_loop.random_state(model).values())  # not saved by Checkpoint(model=...)
    metrics.accumulators = list(model.metrics_variables)  # not saved by Checkpoint(model=...) either
    replicas, capture, scatter = _replica_state(strategy, keras3_loop.replica_local_variables(model, strategy))
    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer, rng=rng, metrics=metrics, replicas=replicas)

    def restore_accumulators(path):
        """The epoch's metric accumulators (Keras resets them when the epoch begins): the
        checkpoint's values, then each replica's own where there are several."""
        tf.train.Checkpoint(metrics=metrics).read(path).expect_partial()
        scatter()

    return checkpoint, capture, restore_accumulators


def _state(strategy, model):
    """Every variable of the model, optimizer and metrics, every replica's copy (by position: layer names
    differ between models of one process)."""
    return {f"{i}:{re.sub(r'_[0-9]+', '', v.path)}": np.stack([np.asarray(t) for t in strategy.experimental_local_results(v.value)])
            for i, v in enumerate([*model.variables, *model.optimizer.variables, *model.metrics_variables])}


def program_resume(phase, directory):
    """(g) 2 epochs straight vs stopped at global step 4 (mid-epoch) + a fresh process resuming there."""
    _two_cpus()
    import tensorflow as tf


    stop = 4
    strategies = {"one_device": tf.distribute.OneDeviceStrategy("/cpu:0"),
                  "mirrored": tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])}
    out = {}
    for name, strategy in strategies.items():
        prefix = os.path.join(directory, name, "ckpt")
        if phase == "first":
            with keras3_loop.building_scope(strategy):
                model = _model()
            history = _train(strategy, model)
            np.savez(os.path.join(directory, f"{name}-straight.npz"), **_state(strategy, model))
            out[name] = history.history

            with keras3_loop.building_scope(strategy):
                model = _model()
            checkpoint, capture, _ = _checkpointed(strategy, model)

            class SaveAndStop(loop_mod.Hooks):
                def on_step_end(self, step):
                    if step == stop:
                        capture()
                        checkpoint.write(prefix)
                        raise _Stop

            try:
                _train(strategy, model, hooks=SaveAndStop())
                raise AssertionError(f"training did not stop at step {stop}")
            except _Stop:
                pass
        else:
            with keras3_loop.building_scope(strategy):
                model = _model()
            checkpoint, _, restore = _checkpointed(strategy, model)
            checkpoint.read(prefix).assert_existing_objects_matched().assert_consumed()

            class RestoreEpoch(loop_mod.Hooks):
                def on_epoch_begin(self, epoch):
                    restore(prefix)  # after Keras reset the metrics: the resumed epoch's accumulators

            history = _train(strategy, model, start_step=stop, hooks=RestoreEpoch())
            straight = np.load(os.path.join(directory, f"{name}-straight.npz"))
            state = _state(strategy, model)
            out[name] = {"history": history.history, "differ": [k for k in straight if not np.array_equal(straight[k], state[k])],
                         "compared": len(straight)}
    return out


def program_multi_worker():
    """(c) multi_worker_mirrored, 2 processes of one replica each, vs one_device in the same process."""
    import tensorflow as tf

    import tfdist

    strategy = tfdist.make_strategy("multi_worker_mirrored")
    with keras3_loop.building_scope(strategy):
        model = _model(dropout=0, sync_bn=True)
    history = _train(strategy, model, validation=17, steps_per_execution=2)
    one = tf.distribute.OneDeviceStrategy("/cpu:0")
    with keras3_loop.building_scope(one):
        reference = _model(dropout=0, sync_bn=True)
    expected = _train(one, reference, validation=17)
    return {"history": history.history, "expected": expected.history, "replicas": strategy.num_replicas_in_sync,
            "weights_diff": _max_diff(_weights(model), _weights(reference))}


def program_parameter_server():
    """(d) parameter_server on the chief of a chief + 2 workers + 1 ps cluster."""
    import tensorflow as tf

    import tfdist
    from tfdist import startup
    from tfdist.cluster import detect

    cluster = detect()
    if cluster.task_type != "chief":
        startup.serve(cluster)
        return None
    import keras

    strategy = tfdist.make_strategy("parameter_server")
    coordinator = strategy.coordinator  # the ClusterCoordinator of the strategy, made once
    with keras3_loop.building_scope(strategy):
        model = _model(dropout=0.2)
    x, y = _data()
    keras3_loop.prepare(model, strategy=strategy, sample=(x[:8], y[:8]))
    train = coordinator.create_per_worker_dataset(
        lambda _=None: tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(GLOBAL_BATCH))
    val = coordinator.create_per_worker_dataset(
        lambda _=None: tf.data.Dataset.from_tensor_slices((x[:32], y[:32])).repeat().batch(GLOBAL_BATCH))
    recorder = _Recorder.make()
    history = loop_mod.run_loop(model, strategy=strategy, train_data=train, steps_per_epoch=8, epochs=4,
                                   validation_data=val, validation_steps=2, callbacks=[recorder], verbose=0,
                                   steps_per_execution=2, coordinator=coordinator)
    counts = {}
    for name, *_ in recorder.calls:
        counts[name] = counts.get(name, 0) + 1
    norms = [layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)]

    class Lag(loop_mod.Hooks):  # executions scheduled but not run when the controller sees a step end
        most = 0

        def on_step_end(self, global_step):
            Lag.most = max(Lag.most, global_step - int(model.optimizer.iterations.numpy()))

    done = int(model.optimizer.iterations.numpy())
    val_count = float(model.metrics_variables[1].numpy())
    loop_mod.run_loop(model, strategy=strategy, train_data=train, steps_per_epoch=done + 60, epochs=1, verbose=0,
                      start_step=done, hooks=Lag(), coordinator=coordinator)
    return {"history": history.history, "iterations": done, "calls": counts, "val_count": val_count,
            "race_free_norms": [getattr(layer, "_tfdist_race_free", False) for layer in norms], "lag": Lag.most}


# --- the tests -----------------------------------------------------------------------------


@pytest.mark.parametrize("race_free", [False, True])
def test_batch_normalization_keeps_a_concurrent_update_of_its_moving_statistics(race_free):
    # On parameter servers another worker updates the moving mean between this worker's read
    # and its write. Keras' own assign(moving * m + batch * (1 - m)) writes over that update;
    # tfdist's atomic increment of (1 - m) (batch - moving) keeps it.
    import keras

    layer = keras.layers.BatchNormalization(momentum=0.9)
    x = np.arange(12, dtype="float32").reshape(4, 3)
    layer.build(x.shape)
    moments = layer._moments

    def moments_while_another_worker_updates(inputs, mask):
        layer.moving_mean.value.assign_add(np.full(3, 100.0, "float32"))  # after the layer read it
        return moments(inputs, mask)

    layer._moments = moments_while_another_worker_updates
    if race_free:
        keras3_compat.race_free_moving_statistics(layer)
    layer(x, training=True)
    batch = x.mean(axis=0)
    own = 0.1 * batch  # 0.9 x 0 + 0.1 x batch
    expected = 100.0 + own if race_free else own
    np.testing.assert_allclose(layer.moving_mean.numpy(), expected, rtol=1e-6)
    if race_free:  # the variance too; and other assigns (set_weights, restores) assign as before
        np.testing.assert_allclose(layer.moving_variance.numpy(), 0.9 + 0.1 * x.var(axis=0), rtol=1e-6)
        layer.set_weights([np.full(3, 2.0, "float32")] * 4)
        assert np.array_equal(layer.moving_mean.numpy(), np.full(3, 2.0, "float32"))


def _run(procs, *args, timeout=240, env=None):
    from conftest import base_env

    code, out = procs.run([sys.executable, os.path.abspath(__file__), *args], timeout=timeout, env=env or base_env())
    assert code == 0, out[-4000:]
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert lines, out[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.timeout(300)
def test_one_device_loop_equals_model_fit_and_calls_callbacks_like_fit(procs):
    out = _run(procs, "one_device")
    fit, loop = out["fit"], out["loop"]
    # (a) same data, seed and steps: bit-identical weights and logs (BatchNormalization, Dropout, a schedule).
    assert out["weights_equal"]
    assert loop["history"] == fit["history"] and loop["history_is_keras3"]
    # (e) every callback call of model.fit, in order; EarlyStopping stops at the same epoch.
    assert loop["calls"] == fit["calls"]
    assert loop["stopped"] == fit["stopped"] == 1 and len(loop["history"]["loss"]) == 2
    assert ["test_batch_end", 1, ["accuracy", "loss"]] in loop["calls"]
    # The TensorBoard callback wrote epoch and batch scalars, and the validation run.
    assert {"epoch_loss", "epoch_accuracy", "batch_loss"} <= set(out["tensorboard"]["train"][0])
    assert {"epoch_loss", "evaluation_loss_vs_iterations"} <= set(out["tensorboard"]["validation"][0])
    # Hooks at execution ends (steps_per_execution=2 within epochs of 3 steps), resumed at step 4.
    assert out["hooks"] == [
        ["train_begin"],
        ["epoch_begin", 1, 0.0], ["step_end", 5], ["step_end", 6], ["epoch_end", 1, ["accuracy", "loss"]],
        ["epoch_begin", 2, 0.0], ["step_end", 8], ["step_end", 9], ["epoch_end", 2, ["accuracy", "loss"]],
        ["train_end"],
    ]
    # The resumed epoch's batch indices are the real steps within it (1, then 2).
    assert out["resumed_batches"][:4] == [["train_batch_begin", 1, None], ["train_batch_end", 1, ["accuracy", "loss"]],
                                          ["train_batch_begin", 2, None], ["train_batch_end", 2, ["accuracy", "loss"]]]
    # (f) a custom train_step runs, and its own logs come back.
    assert out["custom"]["steps"] == [3.0, 3.0, 3.0] and out["custom"]["custom_loss"][-1] < out["custom"]["custom_loss"][0]


@pytest.mark.timeout(300)
def test_mirrored_and_central_storage_match_one_device_for_the_same_global_batch(procs):
    out = _run(procs, "replicas")
    for config in ("spx1", "spx2", "accum"):
        reference = out[f"one_device/{'spx1' if config == 'spx2' else config}"]
        for name in ("mirrored", "central_storage"):
            got = out[f"{name}/{config}"]
            assert got["history"].keys() == reference["history"].keys()
            for key, values in reference["history"].items():
                np.testing.assert_allclose(got["history"][key], values, atol=TOLERANCE, err_msg=f"{name}/{config} {key}")
            assert _max_diff(got["weights"], reference["weights"]) < TOLERANCE, f"{name}/{config}"
            assert got["iterations"] == 6  # optimizer steps, micro batches not counted
    assert "val_loss" in out["mirrored/spx1"]["history"]
    dropout = out["central_storage/dropout"]
    assert np.all(np.isfinite(dropout["loss"])) and dropout["loss"][-1] < dropout["loss"][0]


@pytest.mark.timeout(300)
def test_resume_mid_epoch_in_a_fresh_process_is_bit_identical(procs, tmp_path):
    first = _run(procs, "resume", "first", str(tmp_path))
    second = _run(procs, "resume", "second", str(tmp_path))
    for name in ("one_device", "mirrored"):
        # Every variable of every replica: weights, BatchNormalization statistics, Dropout's seed
        # state, optimizer slots and iterations, metric accumulators.
        assert second[name]["differ"] == [] and second[name]["compared"] >= 20, name
        assert second[name]["history"] == {k: v[1:] for k, v in first[name].items()}, name


@pytest.mark.timeout(600)
def test_multi_worker_mirrored_two_processes_match_one_device(reference_runs):
    # Each worker runs the program in the last part of the two-worker job of
    # tests/multiprocess/test_multi_worker.py, after that job's fits.
    from conftest import read_json
    from multiprocess.test_multi_worker import after_fit_run

    job, _ = after_fit_run(reference_runs)
    results = [read_json(job / "keras3_loop-keras" / f"worker{index}.json") for index in range(2)]
    assert results[0]["history"] == results[1]["history"]  # every worker sees the same logs
    for result in results:
        assert result["replicas"] == 2 and result["weights_diff"] < TOLERANCE
        for key, values in result["expected"].items():
            np.testing.assert_allclose(result["history"][key], values, atol=TOLERANCE, err_msg=key)


@pytest.mark.timeout(600)
def test_parameter_server_chief_two_workers_one_ps_trains(reference_runs):
    # The chief runs the program in the last part of the parameter-server job of
    # tests/multiprocess/test_parameter_server.py, after that job's fits.
    from conftest import read_json
    from multiprocess.test_parameter_server import ps_job_run

    job, _ = ps_job_run(reference_runs)
    out = read_json(job / "keras3-loop.json")
    loss = out["history"]["loss"]
    assert loss[-1] < loss[0] and len(out["history"]["val_loss"]) == 4
    # Atomic increments: no update of the iteration count or the metric counts is lost to a race.
    assert out["iterations"] == 32 and out["val_count"] == 2 * GLOBAL_BATCH
    assert out["race_free_norms"] == [True]  # and BatchNormalization's moving statistics' updates
    # Scheduling waits once 4 executions per worker are queued, so that a preemption is acted on
    # within a few steps, not after the rest of the epoch (all of it was queued at once).
    assert 0 < out["lag"] <= 2 * 4 + 1
    assert out["calls"]["train_batch_end"] == 16 and out["calls"]["test_batch_end"] == 8 and out["calls"]["epoch_end"] == 4



def test_refusals_name_the_input_and_the_fix():
    import keras
    import tensorflow as tf
    import tf_keras

    from tfdist import ModelError
    from tfdist.errors import DataError

    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")

    class Mixed(keras.Model):  # Keras 3 does not track a tf_keras layer: it would never train
        def __init__(self):
            super().__init__()
            self.dense = tf_keras.layers.Dense(2)

        def call(self, inputs):
            return self.dense(inputs)

    mixed = Mixed()
    mixed.compile(optimizer="sgd", loss="mse")
    assert keras3_loop.is_keras3(mixed) and not keras3_loop.is_keras3(tf_keras.Sequential())
    with pytest.raises(ModelError, match=r"holds tf_keras layers.*Mixed\.dense \(Dense\).*Fix:"):
        keras3_loop.check_model(mixed)
    with pytest.raises(ModelError, match="not compiled"):
        keras3_loop.check_model(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]))

    class Custom(keras.Sequential):
        def train_step(self, data):
            return super().train_step(data)

    custom = Custom([keras.Input((2,)), keras.layers.Dense(1)])
    custom.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ModelError, match="overrides train_step"):
        keras3_loop.prepare(custom, strategy=strategy, sample=(np.zeros((4, 2)), np.zeros((4, 1))), grad_accum_steps=2)
    with pytest.raises(DataError, match="coordinator"):
        loop_mod.run_loop(custom, strategy=strategy, train_data=None, steps_per_epoch=1, epochs=1,
                             coordinator=object())
    with pytest.raises(DataError, match="steps_per_execution=0"):
        loop_mod.run_loop(custom, strategy=strategy, train_data=None, steps_per_epoch=1, epochs=1, steps_per_execution=0)

    class NoConfig(keras.Model):  # cannot be rebuilt in a scope without get_config
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(1)

        def call(self, inputs):
            return self.dense(inputs)

    outside = NoConfig()
    outside.compile(optimizer="sgd", loss="mse")
    outside(np.zeros((1, 2)))
    assert not keras3_loop.built_in(outside, strategy)
    with pytest.raises(ModelError, match="pass a function that builds and compiles"):
        keras3_loop.rebuild_in_scope(outside, strategy)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    scenario, args = sys.argv[1], sys.argv[2:]
    programs = {"one_device": program_one_device, "replicas": program_replicas, "resume": program_resume}
    result = programs[scenario](*args)
    if result is not None:
        print("RESULT " + json.dumps(result), flush=True)
