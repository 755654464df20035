"""tfdist.evaluate and tfdist.predict: a trained model's metrics, or its outputs in order, on any data
fit takes, every example once, under the strategy the model was built in (multi_worker_mirrored and
parameter_server: tests/multiprocess)."""

import textwrap

import numpy as np
import pytest

import tfdist
from tfdist import BatchSizeError, DataError, ModelError
from tfdist.data import load_digits



def _builder(keras_name: str):
    """BatchNormalization and Dropout: evaluation must use the moving statistics and no dropout."""
    def build():
        keras = __import__(keras_name)
        layers = keras.layers
        model = keras.Sequential([keras.Input((8, 8, 1)), layers.Flatten(), layers.Dense(32), layers.BatchNormalization(),
                                  layers.Activation("relu"), layers.Dropout(0.3), layers.Dense(10)])
        model.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
        return model

    return build



def _two_outputs(keras_name: str):
    """A regression output ``a`` and a classifier ``b``, their losses weighted 1 and 0.5."""
    keras = __import__(keras_name)
    inputs = keras.Input((8, 8, 1))
    hidden = keras.layers.Dense(16, activation="relu")(keras.layers.Flatten()(inputs))
    model = keras.Model(inputs, {"a": keras.layers.Dense(1, name="a")(hidden), "b": keras.layers.Dense(10, name="b")(hidden)})
    model.compile(keras.optimizers.SGD(0.01), loss={"a": "mse", "b": keras.losses.SparseCategoricalCrossentropy(from_logits=True)},
                  loss_weights={"a": 1.0, "b": 0.5})
    return model


def _whole_set_output_losses(model, x, y) -> dict:
    """Each output's loss over all of ``x`` at once, computed from the predictions."""
    outputs = tfdist.predict(model, x, verbose=0)
    a = float(np.mean((outputs["a"][:, 0] - y.astype(np.float32)) ** 2))
    logits = outputs["b"].astype(np.float64)
    log_softmax = logits - logits.max(axis=1, keepdims=True)
    log_softmax -= np.log(np.exp(log_softmax).sum(axis=1, keepdims=True))
    return {"a_loss": a, "b_loss": float(-np.mean(log_softmax[np.arange(len(y)), y]))}

@pytest.fixture(scope="module", params=["keras", "tf_keras"])
def trained(request):
    train, val = load_digits()
    history = tfdist.fit(_builder(request.param), (train.x, train.y), validation_data=(val.x, val.y), epochs=2,
                         batch_size=64, strategy="one_device", seed=0, verbose=0)
    return request.param, history, val


def test_the_metrics_are_the_last_validations_and_keras_own_evaluate(trained):
    keras_name, history, val = trained
    last = {key: history.history[f"val_{key}"][-1] for key in ("loss", "accuracy")}
    assert tfdist.evaluate(history.model, val.x, val.y, batch_size=64, verbose=0) == last
    assert tfdist.evaluate(history.model, "digits", batch_size=64, verbose=0) == last  # a name: its held-out split
    keras_own = history.model.evaluate(val.x, val.y, batch_size=64, verbose=0, return_dict=True)
    assert keras_own == pytest.approx(last, rel=1e-6)


def test_every_example_counts_once_whatever_the_batch(trained):
    keras_name, history, val = trained
    x, y = val.x[:101], val.y[:101]  # 101 = 12 batches of 8 and one of 5
    result = tfdist.evaluate(history.model, (x, y), batch_size=8, verbose=0)
    predicted = np.argmax(history.model.predict(x, verbose=0), axis=-1)
    assert result["accuracy"] == pytest.approx(np.mean(predicted == y), abs=1e-7)
    one_batch = history.model.evaluate(x, y, batch_size=101, verbose=0, return_dict=True)
    assert result["loss"] == pytest.approx(one_batch["loss"], rel=1e-6)
    # A sample weight weighs each example, as in Keras (the loss is the weighted sum over all 101 examples).
    weights = (np.arange(101) < 50).astype(np.float32)
    weighted = tfdist.evaluate(history.model, (x, y, weights), batch_size=8, verbose=0)
    first_half = tfdist.evaluate(history.model, (x[:50], y[:50]), verbose=0)["loss"]
    assert weighted["loss"] == pytest.approx(first_half * 50 / 101, rel=1e-6)
    keras_own = history.model.evaluate(x, y, sample_weight=weights, batch_size=101, verbose=0, return_dict=True)
    assert weighted["loss"] == pytest.approx(keras_own["loss"], rel=1e-6)



@pytest.mark.parametrize("keras_name", ["keras", "tf_keras"])
def test_each_outputs_loss_is_over_every_example_whatever_the_batch(keras_name):
    # Keras 3 weighed each output's loss tracker by the batch's static size, unknown for a partial
    # batch, which then counted as one example: a_loss and b_loss no longer added up to loss.
    _, val = load_digits()
    x, y = val.x[:101], val.y[:101]  # 12 batches of 8 and one of 5
    with tfdist.make_strategy("one_device").scope():
        model = _two_outputs(keras_name)
    result = tfdist.evaluate(model, (x, {"a": y.astype(np.float32), "b": y}), batch_size=8, verbose=0)
    expected = _whole_set_output_losses(model, x, y)
    for key, value in expected.items():
        assert result[key] == pytest.approx(value, rel=1e-5), key
    assert result["loss"] == pytest.approx(result["a_loss"] + 0.5 * result["b_loss"], rel=1e-5)

def test_predict_returns_every_output_in_order(trained):
    keras_name, history, val = trained
    x = val.x[:101]  # 12 batches of 8 and one of 5
    outputs = tfdist.predict(history.model, x, batch_size=8, verbose=0)
    assert isinstance(outputs, np.ndarray) and outputs.shape == (101, 10)
    np.testing.assert_allclose(outputs, history.model.predict(x, verbose=0), atol=1e-5)
    # A source with labels (any form evaluate takes): the labels are not used.
    from tfdist.data import ArraySource

    labelled = ArraySource(x, val.y[:101])
    np.testing.assert_array_equal(tfdist.predict(history.model, labelled, batch_size=8, verbose=0), outputs)


def test_predict_takes_several_inputs_as_keras_does():
    import keras

    a, b = keras.Input((3,), name="a"), keras.Input((2,), name="b")
    model = keras.Model([a, b], keras.layers.Dense(4)(keras.layers.Concatenate()([a, b])))
    model.compile("sgd", "mse")
    rng = np.random.default_rng(0)
    xa, xb = rng.normal(size=(10, 3)).astype("float32"), rng.normal(size=(10, 2)).astype("float32")
    expected = model.predict([xa, xb], verbose=0)
    for inputs in ([xa, xb], (xa, xb), {"a": xa, "b": xb}):
        np.testing.assert_allclose(tfdist.predict(model, inputs, batch_size=4, verbose=0), expected, atol=1e-6)


def test_callbacks_get_keras_test_calls(trained):
    keras_name, history, val = trained
    keras = __import__(keras_name)
    calls = []

    class Record(keras.callbacks.Callback):
        def on_test_begin(self, logs=None):
            calls.append("begin")

        def on_test_batch_end(self, batch, logs=None):
            calls.append(batch)

        def on_test_end(self, logs=None):
            calls.append(("end", sorted(logs)))

    tfdist.evaluate(history.model, val.x[:40], val.y[:40], batch_size=16, callbacks=[Record()], verbose=0)
    assert calls == ["begin", 0, 1, 2, ("end", ["accuracy", "loss"])]


def test_images_in_folders_evaluate_as_fit_validated_them(tmp_path):
    from test_data_images import _fit, write_images

    images = write_images(str(tmp_path / "images"))
    source = tfdist.ImageFolderSource(images, image_size=(16, 16))
    history = _fit(source, validation_data=source, epochs=2)
    result = tfdist.evaluate(history.model, source, batch_size=8, verbose=0)
    assert result == {key: history.history[f"val_{key}"][-1] for key in ("loss", "accuracy")}
    # Predicting needs no labels: a folder's name reads every image under it (labels=None), at the model's size.
    outputs = tfdist.predict(history.model, images, batch_size=8, verbose=0)
    unlabelled = tfdist.ImageFolderSource(images, labels=None, image_size=(16, 16))
    np.testing.assert_allclose(outputs, history.model.predict(unlabelled.sample(36), verbose=0), atol=1e-5)
    with pytest.raises(DataError, match="evaluate needs labelled examples; received 'images in"):
        tfdist.evaluate(history.model, unlabelled, batch_size=8, verbose=0)


def test_tfrecord_files_evaluate_and_predict_as_fit_validated_them(tmp_path):
    from test_data_files import write_digits
    from tfdist import data

    digits = write_digits(tmp_path / "digits", files=2)
    train, validation = data.load(digits["train"], features=digits["features"], validation=digits["validation"])
    history = tfdist.fit(_builder("keras"), train, validation_data=validation, epochs=1, batch_size=64,
                         strategy="one_device", seed=0, verbose=0)
    last = {key: history.history[f"val_{key}"][-1] for key in ("loss", "accuracy")}
    assert tfdist.evaluate(history.model, validation, batch_size=64, verbose=0) == last
    outputs = tfdist.predict(history.model, validation, batch_size=64, verbose=0)
    labels = load_digits()[1].y
    assert outputs.shape == (digits["num_validation"], 10)
    assert np.mean(np.argmax(outputs, axis=-1) == labels) == pytest.approx(last["accuracy"], abs=1e-7)


def test_defects_are_named_with_the_fix(trained):
    import keras

    keras_name, history, val = trained
    with pytest.raises(DataError, match="holds its own labels"):
        tfdist.evaluate(history.model, "digits", val.y)
    with pytest.raises(BatchSizeError, match="batch_size=0"):
        tfdist.evaluate(history.model, val.x, val.y, batch_size=0)
    with pytest.raises(ModelError, match="must be a compiled Keras model"):
        tfdist.evaluate(object(), val.x, val.y)
    bare = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(10)])
    with pytest.raises(ModelError, match="not compiled") as info:
        tfdist.evaluate(bare, val.x, val.y)
    assert "before evaluate" in str(info.value) and "builder" not in str(info.value)
    assert tfdist.predict(bare, val.x[:10]).shape == (10, 10)  # predicting needs no compile, as in Keras
    with pytest.raises(ModelError, match="must be a Keras model.*to predict"):
        tfdist.predict(object(), val.x)
    with pytest.raises(DataError, match=r"input takes examples of shape \(8, 8, 1\); received examples of shape "
                                        r"\(64,\)\. Fix: pass data shaped as"):
        tfdist.predict(history.model, val.x.reshape(len(val.x), 64))
    from tfdist import data as data_mod
    from tfdist.training.evaluation import _check_fits

    _check_fits(history.model, data_mod.as_source((val.x[..., 0], val.y)))  # not refused: Keras adds the last 1


_REPLICAS = textwrap.dedent(
    """
    import json, os, sys, tempfile
    import numpy as np
    import tfdist
    devices = tfdist.split_cpu(2)
    from tfdist.data import load_digits
    from test_evaluation import _builder

    train, val = load_digits()
    results = {}
    for keras_name in ("keras", "tf_keras"):
        for strategy in ("mirrored", "central_storage"):
            history = tfdist.fit(_builder(keras_name), (train.x, train.y), validation_data=(val.x, val.y), epochs=2,
                                 batch_size=64, strategy=strategy, devices=devices, seed=0, verbose=0)
            predicted = tfdist.predict(history.model, val.x, batch_size=64, verbose=0)
            results[f"{keras_name} {strategy}"] = {
                "replicas": history.tfdist.num_replicas,
                "predicted_accuracy": float(np.mean(np.argmax(predicted, axis=-1) == val.y)),
                "predicted_shape": list(predicted.shape),
                "last": {key: history.history[f"val_{key}"][-1] for key in ("loss", "accuracy")},
                "same_batch": tfdist.evaluate(history.model, val.x, val.y, batch_size=64, verbose=0),
                "other_batch": tfdist.evaluate(history.model, val.x, val.y, per_replica_batch_size=9, verbose=0),
            }
            try:
                tfdist.evaluate(history.model, val.x, val.y, batch_size=63)
            except tfdist.BatchSizeError as e:
                results[f"{keras_name} {strategy}"]["refused"] = str(e)
        # A model trained elsewhere, loaded from its file into a strategy's scope (its metrics not built yet).
        history = tfdist.fit(_builder(keras_name), (train.x, train.y), validation_data=(val.x, val.y), epochs=1,
                             batch_size=64, strategy="one_device", seed=0, verbose=0)
        path = os.path.join(tempfile.mkdtemp(), "model.keras")
        tfdist.save_model(history.model, path)
        for strategy in ("mirrored", "central_storage"):
            with tfdist.make_strategy(strategy, devices=devices).scope():
                loaded = __import__(keras_name).models.load_model(path)
            results[f"{keras_name} loaded {strategy}"] = {
                "last": {key: history.history[f"val_{key}"][-1] for key in ("loss", "accuracy")},
                "evaluated": tfdist.evaluate(loaded, val.x, val.y, batch_size=64, verbose=0)}
        # One example, a model's first evaluation: the second replica's part is empty.
        one_example_loss = float(__import__(keras_name).losses.SparseCategoricalCrossentropy(from_logits=True)(
            val.y[:1], tfdist.predict(history.model, val.x[:1], verbose=0)))
        for strategy in ("mirrored", "central_storage"):
            with tfdist.make_strategy(strategy, devices=devices).scope():
                loaded = __import__(keras_name).models.load_model(path)
            results[f"{keras_name} loaded {strategy}"].update(
                one_example=tfdist.evaluate(loaded, val.x[:1], val.y[:1], verbose=0), one_example_loss=one_example_loss)
    from test_evaluation import _two_outputs, _whole_set_output_losses
    x, y = val.x[:101], val.y[:101]
    for strategy in ("mirrored", "central_storage"):
        with tfdist.make_strategy(strategy, devices=devices).scope():
            model = _two_outputs("keras")
        results[f"keras outputs {strategy}"] = {
            "evaluated": tfdist.evaluate(model, (x, {"a": y.astype(np.float32), "b": y}), batch_size=16, verbose=0),
            "expected": _whole_set_output_losses(model, x, y)}
    print("RESULT " + json.dumps(results))
    """
)


def test_under_mirrored_and_central_storage_each_replica_evaluates_its_part_also_of_a_loaded_model(two_cpu_scripts):
    results = two_cpu_scripts("evaluation")  # _REPLICAS
    loaded = {name: results.pop(name) for name in list(results) if " loaded " in name}
    for strategy in ("mirrored", "central_storage"):  # 101 examples: the replicas' parts end in partial batches
        result = results.pop(f"keras outputs {strategy}")
        for key, value in result["expected"].items():
            assert result["evaluated"][key] == pytest.approx(value, rel=1e-5), (strategy, key)
    assert sorted(results) == ["keras central_storage", "keras mirrored", "tf_keras central_storage", "tf_keras mirrored"]
    assert len(loaded) == 4
    for name, result in loaded.items():  # one set of weights and statistics: any split of the examples agrees
        assert result["evaluated"]["accuracy"] == result["last"]["accuracy"], name
        assert result["evaluated"]["loss"] == pytest.approx(result["last"]["loss"], rel=1e-6), name
        assert result["one_example"]["loss"] == pytest.approx(result["one_example_loss"], rel=1e-5), name
    for name, result in results.items():
        assert result["replicas"] == 2, name
        assert result["same_batch"] == result["last"], name
        # predict reads the same parts: its outputs, put back in order, score what evaluate scored.
        assert result["predicted_shape"] == [359, 10], name
        assert result["predicted_accuracy"] == pytest.approx(result["last"]["accuracy"], abs=1e-7), name
        assert result["other_batch"]["accuracy"] == result["last"]["accuracy"], name
        assert result["other_batch"]["loss"] == pytest.approx(result["last"]["loss"], rel=1e-6), name
        assert "batch_size=63 is not divisible by replicas" in result["refused"], name
