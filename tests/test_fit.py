"""tfdist.fit under one_device in process, and mirrored / central_storage on two logical CPUs."""

import json
import os
import re
import sys
import textwrap

import numpy as np
import pytest

import tfdist
from tfdist import models
from tfdist.data import load_digits
from tfdist.errors import BatchSizeError, DataError, ModelError

from conftest import base_env

CNN = models.builder("cnn", input_shape=(8, 8, 1), num_classes=10, keras="2")  # tf_keras; Keras 3: test_fit_keras3.py


def _linear_sgd():
    import tf_keras

    model = tf_keras.Sequential([tf_keras.Input((8, 8, 1)), tf_keras.layers.Flatten(), tf_keras.layers.Dense(10)])
    model.compile(tf_keras.optimizers.SGD(0.1), tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def test_fit_trains_under_one_device_and_reports_the_run():
    history = tfdist.fit(CNN, "digits", epochs=3, batch_size=64, strategy="one_device", seed=0, verbose=0)
    summary = history.tfdist
    assert summary.strategy == "one_device" and summary.num_replicas == 1 and summary.all_reduce is None
    assert summary.steps_per_epoch == 1437 // 64 and summary.global_step == 3 * summary.steps_per_epoch
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert set(history.history) >= {"loss", "accuracy", "val_loss", "val_accuracy"}
    assert len(history.epoch) == 3


def test_tfdist_fit_stays_the_function_whatever_is_imported(procs):
    # A module named like the function would replace it once imported (``from tfdist.fit import ...``).
    code, out = procs.run([sys.executable, "-c", "import tfdist.training, tfdist.cli.train, tfdist; "
                           "from tfdist.training import FitSummary; print(callable(tfdist.fit), tfdist.fit.__module__)"],
                          timeout=120, env=base_env())
    assert code == 0 and out.split()[-2:] == ["True", "tfdist.training.run"], out[-2000:]


def test_same_seed_with_determinism_gives_identical_weights():
    runs = [tfdist.fit(CNN, "digits", epochs=1, batch_size=128, strategy="one_device", seed=5, deterministic=True,
                       verbose=0).model.get_weights() for _ in range(2)]
    assert all(np.array_equal(a, b) for a, b in zip(*runs))


def test_x_and_y_passed_as_to_keras_fit_train_as_the_pair():
    x, y = load_digits()[0].sample(320)
    options = dict(epochs=1, batch_size=64, strategy="one_device", seed=5, deterministic=True, verbose=0)
    separate = tfdist.fit(_linear_sgd, x, y, **options)
    paired = tfdist.fit(_linear_sgd, (x, y), **options)
    assert separate.tfdist.global_step == 5
    assert all(np.array_equal(a, b) for a, b in zip(separate.model.get_weights(), paired.model.get_weights()))
    with pytest.raises(DataError, match=r"`y` is given with data that holds its own labels; received data of type "
                                        r"str\. Fix: leave y out"):
        tfdist.fit(_linear_sgd, "digits", y, **options)


def test_a_label_the_model_has_no_class_for_is_bad_data_named_with_the_fix():
    x, y = load_digits()[0].sample(64)
    y = y.copy()
    y[40] = 10  # classes 1 to 10 for a model of 10 outputs
    with pytest.raises(DataError, match=r"a label is not one of the model's classes 0 to 9; received label 10 in "
                                        r"'arrays'\. Fix: number the classes from 0"):
        tfdist.fit(_linear_sgd, x, y, epochs=1, batch_size=32, strategy="one_device", seed=0, verbose=0)
    # TensorFlow reports it in one of two ways (the loss's own check, or the gather inside it); another gather is not it.
    import tensorflow as tf

    from tfdist.data.pipeline import _label_out_of_range

    gather = "node sparse_categorical_crossentropy/SparseSoftmaxCrossEntropyWithLogits/GatherV2: indices[28] = 10 is not in [0, 10)"
    assert "received label 10 in the data" in str(_label_out_of_range(tf.errors.InvalidArgumentError(None, None, gather), []))
    embedding = "node embedding/GatherV2: indices[3] = 99 is not in [0, 10)"
    assert _label_out_of_range(tf.errors.InvalidArgumentError(None, None, embedding), []) is None


def test_a_compiled_model_created_outside_the_scope_is_rebuilt_with_its_weights(caplog):
    model = _linear_sgd()
    before = [w.copy() for w in model.get_weights()]
    with caplog.at_level("INFO", logger="tfdist"):
        history = tfdist.fit(model, "digits", epochs=1, batch_size=64, strategy="one_device", seed=0, verbose=0,
                             steps_per_epoch=1)
    assert "rebuilt inside it with its weights" in caplog.text
    assert history.model is not model
    # As after model.fit, the model passed holds the trained weights and optimizer state.
    assert all(np.array_equal(a, b) for a, b in zip(history.model.get_weights(), model.get_weights()))
    assert not all(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))
    assert int(model.optimizer.iterations.numpy()) == history.tfdist.global_step == 1
    assert type(history.model.optimizer).__name__ == "SGD"


@pytest.mark.parametrize("keras_name", ["keras", "tf_keras"])
def test_a_model_instance_trains_as_its_builder_with_weight_decay_exclusions_and_a_users_loss_function(keras_name):
    """What compile's config leaves out (AdamW.exclude_from_weight_decay) or cannot serialize
    unregistered (a plain loss function) is carried into the copy made in the scope."""
    keras = __import__(keras_name)

    def loss(y_true, y_pred):
        return keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)

    def build():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(16),
                                  keras.layers.Dense(10)])
        optimizer = keras.optimizers.AdamW(0.01, weight_decay=0.5)
        optimizer.exclude_from_weight_decay(var_list=[model.layers[-1].kernel], var_names=["bias"])
        model.compile(optimizer, loss, metrics=[keras.metrics.SparseCategoricalAccuracy(name="acc")])
        return model

    options = dict(epochs=1, batch_size=64, strategy="one_device", seed=0, deterministic=True, verbose=0,
                   steps_per_epoch=4)
    built = tfdist.fit(build, "digits", **options)
    copied = tfdist.fit(build(), "digits", **options)
    assert copied.history == built.history and "acc" in copied.history
    assert all(np.array_equal(a, b) for a, b in zip(built.model.get_weights(), copied.model.get_weights()))


def test_refusals_name_the_problem_and_the_fix():
    import tf_keras

    class Sub(tf_keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = tf_keras.layers.Dense(10)

        def call(self, x):
            return self.dense(tf_keras.layers.Flatten()(x))

    sub = Sub()
    sub.compile("sgd", "sparse_categorical_crossentropy")
    with pytest.raises(ModelError, match="subclassed model .* Fix: pass a function"):
        tfdist.fit(sub, "digits", strategy="one_device", verbose=0)
    with pytest.raises(ModelError, match="not compiled"):
        tfdist.fit(lambda: tf_keras.Sequential([tf_keras.Input((8, 8, 1)), tf_keras.layers.Flatten(),
                                                tf_keras.layers.Dense(10)]), "digits", strategy="one_device", verbose=0)
    with pytest.raises(ModelError, match="BackupAndRestore"):
        tfdist.fit(CNN, "digits", strategy="one_device", verbose=0,
                   callbacks=[tf_keras.callbacks.BackupAndRestore("/tmp/unused-backup")])
    with pytest.raises(BatchSizeError, match="batch_size=64 is not divisible"):
        tfdist.fit(CNN, "digits", strategy="one_device", verbose=0, batch_size=64, grad_accum_steps=3)
    with pytest.raises(ModelError, match="must be a compiled Keras model .* received builtins.str. Fix:"):
        tfdist.fit("not a model", "digits", strategy="one_device", verbose=0)

    class OwnStep(tf_keras.Sequential):  # accumulation would run Keras' step instead of this one
        def train_step(self, data):
            return super().train_step(data)

    def own_step():
        model = OwnStep([tf_keras.Input((8, 8, 1)), tf_keras.layers.Flatten(), tf_keras.layers.Dense(10)])
        model.compile("sgd", tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    with pytest.raises(ModelError, match="grad_accum_steps=2 with a model whose class OwnStep overrides train_step. Fix:"):
        tfdist.fit(own_step, "digits", strategy="one_device", verbose=0, batch_size=64, grad_accum_steps=2)
    # A ready model and mixed_precision: the fix says whether leaving it out would do.
    ready = tf_keras.Sequential([tf_keras.Input((8, 8, 1)), tf_keras.layers.Flatten(), tf_keras.layers.Dense(10)])
    ready.compile("sgd", tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(ModelError, match=re.escape("received a ready model (built under 'float32'). Fix: pass a "
                                                   "function that builds and compiles the model.")):
        tfdist.fit(ready, "digits", strategy="one_device", verbose=0, mixed_precision="mixed_bfloat16")
    tf_keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        ready = tf_keras.Sequential([tf_keras.Input((8, 8, 1)), tf_keras.layers.Flatten(), tf_keras.layers.Dense(10)])
        ready.compile("sgd", tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    finally:
        tf_keras.mixed_precision.set_global_policy("float32")
    with pytest.raises(ModelError, match="or leave mixed_precision out: the model already has that policy"):
        tfdist.fit(ready, "digits", strategy="one_device", verbose=0, mixed_precision="mixed_bfloat16")


def test_gradient_accumulation_equals_the_large_batch_under_one_device():
    big = tfdist.fit(_linear_sgd, "digits", epochs=2, batch_size=64, seed=1, deterministic=True,
                     strategy="one_device", verbose=0)
    acc = tfdist.fit(_linear_sgd, "digits", epochs=2, batch_size=64, grad_accum_steps=4, seed=1, deterministic=True,
                     strategy="one_device", verbose=0)
    assert acc.tfdist.micro_batch_size == 16 and acc.tfdist.grad_accum_steps == 4
    assert int(acc.model.optimizer.iterations.numpy()) == int(big.model.optimizer.iterations.numpy()) == 2 * 22
    for a, b in zip(big.model.get_weights(), acc.model.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5)
    np.testing.assert_allclose(big.history["loss"], acc.history["loss"], rtol=1e-5)


def test_mixed_precision_under_one_device():
    # Two steps: a CPU has no fast path for 16-bit math, and the checks need a step, not an epoch.
    history = tfdist.fit(CNN, "digits", epochs=1, batch_size=64, steps_per_epoch=2, mixed_precision="mixed_float16",
                         strategy="one_device", seed=0, verbose=0)
    model = history.model
    assert type(model.optimizer).__name__.startswith("LossScaleOptimizer")
    assert model.layers[1].compute_dtype == "float16" and model.outputs[0].dtype.name == "float32"
    assert np.isfinite(history.history["loss"][0])
    with pytest.raises(ModelError, match="mixed_precision"):
        tfdist.fit(CNN, "digits", mixed_precision="float8", strategy="one_device", verbose=0)
    # tf_keras refuses loss scaling under central_storage deep in its first step; tfdist before building anything.
    with pytest.raises(ModelError, match="mixed_float16 needs loss scaling.*received strategy='central_storage'. "
                                         "Fix: use mixed_precision='mixed_bfloat16'"):
        tfdist.fit(CNN, "digits", mixed_precision="mixed_float16", strategy="central_storage", verbose=0)
    # Under parameter_server tf_keras' compile refuses it (Keras 3 trains); its ValueError, one line with the fix.
    # (It raises the same under central_storage, which reaches it here: fit refuses that first.)
    import tensorflow as tf

    from tfdist.training import model as model_mod

    central = tf.distribute.experimental.CentralStorageStrategy(["/cpu:0"])
    with pytest.raises(ModelError, match="tf_keras runs mixed_float16's loss scaling only under one_device, mirrored "
                                         "and multi_worker_mirrored; received CentralStorageStrategy. Fix: "):
        model_mod.resolve(CNN, central, precision="mixed_float16")


def test_a_tf_data_stream_of_unknown_length_trains():
    import tensorflow as tf

    from tfdist.data import load_digits

    train, _ = load_digits()
    stream = tf.data.Dataset.from_tensor_slices((train.x, train.y)).filter(lambda x, y: y >= 0)
    history = tfdist.fit(CNN, stream, epochs=1, batch_size=100, strategy="one_device", seed=0, verbose=0)
    assert history.tfdist.steps_per_epoch == 14 and history.tfdist.global_step == 14


_TWO_CPUS = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import tfdist
    devices = tfdist.split_cpu(2)
    import tf_keras
    from tfdist import models
    cnn = models.builder("cnn", input_shape=(8, 8, 1), num_classes=10, keras="2")
    def linear():
        m = tf_keras.Sequential([tf_keras.Input((8, 8, 1)), tf_keras.layers.Flatten(), tf_keras.layers.Dense(10)])
        m.compile(tf_keras.optimizers.SGD(0.1), tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return m
    out = {}
    for name in ("mirrored", "central_storage"):
        h = tfdist.fit(cnn, "digits", epochs=2, batch_size=64, strategy=name, devices=devices, seed=0, verbose=0)
        out[name] = {"replicas": h.tfdist.num_replicas, "strategy": h.tfdist.strategy, "loss": h.history["loss"],
                     "per_replica": h.tfdist.per_replica_batch_size, "all_reduce": h.tfdist.all_reduce,
                     "global_step": h.tfdist.global_step, "steps_per_epoch": h.tfdist.steps_per_epoch}
    big = tfdist.fit(linear, "digits", epochs=1, batch_size=64, strategy="mirrored", devices=devices, seed=1, deterministic=True, verbose=0)
    acc = tfdist.fit(linear, "digits", epochs=1, batch_size=64, grad_accum_steps=2, strategy="mirrored", devices=devices, seed=1, deterministic=True, verbose=0)
    out["accum_maxdiff"] = max(float(np.max(np.abs(a - b))) for a, b in zip(big.model.get_weights(), acc.model.get_weights()))
    out["accum_micro"] = acc.tfdist.micro_batch_size
    # central_storage: each micro step updates metrics and BatchNormalization through merge_call,
    # which TensorFlow refuses inside a tf.while_loop; the micro steps are unrolled there.
    big = tfdist.fit(linear, "digits", epochs=1, batch_size=64, strategy="central_storage", devices=devices, seed=1, deterministic=True, verbose=0)
    acc = tfdist.fit(linear, "digits", epochs=1, batch_size=64, grad_accum_steps=2, strategy="central_storage", devices=devices, seed=1, deterministic=True, verbose=0)
    out["cs_accum_maxdiff"] = max(float(np.max(np.abs(a - b))) for a, b in zip(big.model.get_weights(), acc.model.get_weights()))
    out["cs_accum_cnn_loss"] = tfdist.fit(cnn, "digits", epochs=1, batch_size=64, grad_accum_steps=2, strategy="central_storage", devices=devices, seed=0, verbose=0).history["loss"]
    # Two steps: a CPU has no fast path for 16-bit math.
    mp = tfdist.fit(cnn, "digits", epochs=1, batch_size=64, steps_per_epoch=2, strategy="mirrored", devices=devices, mixed_precision="mixed_float16", seed=0, verbose=0)
    out["mp"] = {"optimizer": type(mp.model.optimizer).__name__, "loss": mp.history["loss"][0], "replicas": mp.tfdist.num_replicas}
    cnn3 = models.builder("cnn", input_shape=(8, 8, 1), num_classes=10, keras="3")
    h = tfdist.fit(cnn3, "digits", epochs=2, batch_size=128, strategy="one_device", devices=devices[:1], seed=0, verbose=0)
    out["steps"] = {"one_device": [h.tfdist.global_step, h.tfdist.steps_per_epoch],
                    "mirrored": [out["mirrored"]["global_step"], out["mirrored"]["steps_per_epoch"]]}
    print("RESULT " + json.dumps(out), flush=True)
    """
)


@pytest.fixture(scope="module")
def two_cpus(reference_runs):
    """The output of ``_TWO_CPUS`` run once per suite with TensorFlow's default logging
    (TF_CPP_MIN_LOG_LEVEL unset): its exit code, then what it printed."""
    from conftest import Processes

    def make(directory):
        environ = base_env(TF_CPP_MIN_LOG_LEVEL="0", PYTHONPATH=os.path.dirname(__file__) + os.pathsep + base_env()["PYTHONPATH"])
        with Processes() as procs:
            code, out = procs.run([sys.executable, "-c", _TWO_CPUS], timeout=280, env=environ)
        (directory / "out").write_text(f"{code}\n{out}")

    code, out = (reference_runs(["test_fit", "two logical cpus"], make) / "out").read_text().split("\n", 1)
    return int(code), out


def _result(out: str) -> dict:
    return json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])


@pytest.mark.timeout(300)
def test_mirrored_and_central_storage_on_two_logical_cpus(two_cpus):
    code, out = two_cpus
    assert code == 0, out[-3000:]
    result = _result(out)
    for name in ("mirrored", "central_storage"):
        run = result[name]
        assert run["strategy"] == name and run["replicas"] == 2 and run["per_replica"] == 32
        assert run["loss"][1] < run["loss"][0]
    assert result["mirrored"]["all_reduce"] == "reduce_to_one"  # auto on logical CPUs
    assert result["central_storage"]["all_reduce"] is None
    assert result["accum_micro"] == 16 and result["accum_maxdiff"] < 1e-5
    assert result["cs_accum_maxdiff"] < 1e-5 and np.isfinite(result["cs_accum_cnn_loss"][0])
    assert result["mp"]["optimizer"].startswith("LossScaleOptimizer") and result["mp"]["replicas"] == 2
    assert np.isfinite(result["mp"]["loss"])


def test_the_training_dataset_is_endless_to_tensorflow_with_zeros_past_the_runs_batches():
    # A finite dataset makes multi_worker_mirrored add an all-reduce to every next() (partial-batch handling).
    import tensorflow as tf

    from tfdist.training.run import _endless

    seen = []
    make = _endless(lambda input_context=None: seen.append(input_context) or tf.data.Dataset.range(1, 4).map(
        lambda i: {"x": tf.fill([2, 3], tf.cast(i, tf.float32)), "n": tf.fill([2, i], i)}))
    dataset = make("context")
    assert seen == ["context"]
    assert int(dataset.cardinality()) == int(tf.data.INFINITE_CARDINALITY)
    assert dataset.element_spec["x"].shape.as_list() == [2, 3]  # the step keeps its static batch shape
    iterator = iter(dataset)
    assert [float(next(iterator)["x"][0, 0]) for _ in range(3)] == [1.0, 2.0, 3.0]
    for _ in range(20):  # the read-ahead past the end
        past = next(iterator)
        assert past["x"].shape == (2, 3) and not np.any(past["x"]) and past["n"].shape == (2, 0)


def test_a_training_dataset_with_a_ragged_component_is_asserted_endless_and_fails_past_its_end():
    import tensorflow as tf

    from tfdist.training.run import _endless

    ragged = tf.data.Dataset.from_tensor_slices(tf.ragged.constant([[1], [2, 3]])).batch(2)
    dataset = _endless(lambda input_context=None: ragged)()
    assert int(dataset.cardinality()) == int(tf.data.INFINITE_CARDINALITY)
    iterator = iter(dataset)
    next(iterator)
    with pytest.raises(tf.errors.FailedPreconditionError, match="infinite"):
        next(iterator)


@pytest.mark.timeout(300)
def test_the_end_of_training_logs_no_tensorflow_error_with_its_logging_on(two_cpus):
    # TensorFlow's default logging (TF_CPP_MIN_LOG_LEVEL unset) printed "Local rendezvous is aborting with
    # status: FAILED_PRECONDITION: Input dataset was expected to contain an infinite number of elements"
    # at the end of every run: the input's read-ahead met the end of the run's batches.
    # _TWO_CPUS ends runs under one_device (Keras 3), mirrored and central_storage (tf_keras).
    code, out = two_cpus
    assert code == 0, out[-3000:]
    # 1437 digits for training: 64 a step under mirrored, 128 under one_device
    assert _result(out)["steps"] == {"one_device": [22, 11], "mirrored": [44, 22]}
    # A multi-device iterator deleted at the end of a fit while a read-ahead is in flight may log "Local
    # rendezvous is aborting with status: CANCELLED" (TensorFlow's teardown, seen once under load): not an error.
    aborted = [line for line in out.splitlines() if "rendezvous is aborting" in line and "CANCELLED" not in line]
    assert not aborted and "FAILED_PRECONDITION" not in out, out[-3000:]


@pytest.mark.parametrize("error, expected", [
    (KeyboardInterrupt(), "when Ctrl-C stopped training was not completed and is not used; the next run resumes "
                          "from the last complete one"),
    (RuntimeError("bad batch"), "when training failed was not completed: CheckpointIOError: disk full"),
])
def test_a_save_cut_short_by_the_error_that_ended_training_is_reported_for_what_it_is(caplog, error, expected):
    import logging

    from tfdist.errors import CheckpointIOError
    from tfdist.training import run

    class Cut:
        def close(self):
            raise CheckpointIOError("disk full")

    with caplog.at_level(logging.WARNING, logger="tfdist"):
        run._finish_saves(Cut(), error)
    assert [r.getMessage() for r in caplog.records] == [f"the checkpoint being written {expected}"]


def test_a_save_that_fails_because_a_parameter_server_is_gone_names_the_task_not_the_storage():
    import types

    import tensorflow as tf

    from tfdist.cluster import parse_tf_config
    from tfdist.errors import CheckpointIOError, PeerUnavailableError
    from tfdist.training.run import _peer_lost_in_save

    cluster = parse_tf_config({"cluster": {"chief": ["127.0.0.1:35001"], "worker": ["127.0.0.1:35002"],
                                           "ps": ["127.0.0.1:35645"]}, "task": {"type": "chief", "index": 0}})
    coordinated = types.SimpleNamespace(coordinated=True)

    def failed_save(cause):
        try:
            raise CheckpointIOError("writing a checkpoint failed") from cause
        except CheckpointIOError as e:
            return e

    by_address = failed_save(tf.errors.UnavailableError(
        None, None, "failed to connect to all addresses; ipv4:127.0.0.1:35645: Connection refused"))
    lost = _peer_lost_in_save(by_address, cluster, coordinated)
    assert isinstance(lost, PeerUnavailableError)
    assert str(lost).startswith("ps:0 could not be reached while chief:0 saved a checkpoint (UnavailableError: ")
    assert "the storage is not at fault. Fix: restart every task" in str(lost)
    by_device = failed_save(tf.errors.UnavailableError(None, None, "/job:ps/replica:0/task:0 is unreachable"))
    assert str(_peer_lost_in_save(by_device, cluster, coordinated)).startswith("ps:0 could not be reached")
    # Storage's own failures (gs:// answers 503 as Unavailable too) stay storage failures.
    storage = failed_save(tf.errors.UnavailableError(None, None, "storage.googleapis.com: 503 Service Unavailable"))
    assert _peer_lost_in_save(storage, cluster, coordinated) is None
    assert _peer_lost_in_save(failed_save(OSError("No space left on device")), cluster, coordinated) is None


def test_fit_on_the_evaluator_task_without_checkpoints_is_refused_naming_the_task(monkeypatch):
    import json

    from tfdist.errors import ModelError

    cluster = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "evaluator": ["127.0.0.1:3"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "evaluator", "index": 0}}))
    with pytest.raises(ModelError, match=r"does not train on the evaluator task: it scores the run's checkpoints; "
                                         r"received task evaluator:0 and no checkpoint_dir\. Fix: pass checkpoint_dir="):
        tfdist.fit(lambda: None, "digits", epochs=1)
