"""``fit(class_weight=...)``: validated, mapped from every kind of label, trained exactly as Keras'
own ``model.fit(class_weight=...)``, from arrays and files, and resumed exactly."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

import tfdist
from tfdist.data.class_weights import ClassWeights
from tfdist.errors import CheckpointMismatchError, DataError

from conftest import Crash, assert_bit_identical, checkpoint_tensors, crash_after, same_weights

KERASES = ["keras", "tf_keras"]
_RNG = np.random.RandomState(7)
N = 160
X = _RNG.rand(N, 6).astype(np.float32)
Y = (X[:, 0] * 2.2 + X[:, 1] * 1.1).astype(np.int64)  # classes 0..3, unbalanced
W = _RNG.uniform(0.5, 1.5, N).astype(np.float32)
CW = {0: 0.5, 1: 2.0, 3: 4.0}  # class 2 left out: weighs 1


def _per_example(y: np.ndarray) -> np.ndarray:
    return np.array([CW.get(int(c), 1.0) for c in y], np.float32)


def build(keras_name: str = "keras", *, dropout: float = 0.1):
    def make():
        keras = __import__(keras_name)
        keras.utils.set_random_seed(11)
        model = keras.Sequential([
            keras.Input((6,)), keras.layers.Dense(16, use_bias=False), keras.layers.BatchNormalization(),
            keras.layers.Activation("relu"), keras.layers.Dropout(dropout), keras.layers.Dense(4),
        ])
        lr = keras.optimizers.schedules.ExponentialDecay(0.05, 5, 0.8)
        model.compile(keras.optimizers.SGD(lr, momentum=0.5),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True), weighted_metrics=["accuracy"])
        return model

    return make


def _fit(data_, keras_name="keras", **kwargs):
    options = dict(epochs=2, batch_size=32, strategy="one_device", seed=4, deterministic=True, verbose=0)
    options.update(kwargs)
    return tfdist.fit(build(keras_name), data_, **options)


# --- the weights -------------------------------------------------------------------------------------


@pytest.mark.parametrize("value,match", [
    ({}, r"received class_weight=\{\}. Fix: pass a dict"),
    ([1.0, 2.0], r"received class_weight=\[1.0, 2.0\]"),
    ({"0": 1.0}, r"received key '0'. Fix: use integers >= 0"),
    ({True: 1.0}, r"received key True"),
    ({-1: 1.0}, r"received key -1"),
    ({0: -0.5}, r"weight of class 0 .* received -0.5. Fix: use a finite number >= 0"),
    ({0: float("nan")}, r"weight of class 0 .* received nan"),
])
def test_invalid_class_weights_get_a_one_line_error_naming_the_value_and_the_fix(value, match):
    with pytest.raises(DataError, match=match) as info:
        ClassWeights.of(value)
    assert "\n" not in str(info.value)


def test_class_weights_are_recorded_as_json_keeps_them_and_fill_left_out_classes_with_one():
    weights = ClassWeights.of({np.int64(3): 4, 0: 0.5, 1: np.float32(2.0)})
    assert weights.weights == {0: 0.5, 1: 2.0, 3: 4.0} and ClassWeights.of(weights) is weights
    assert json.loads(json.dumps(weights.record())) == weights.record() == {"0": 0.5, "1": 2.0, "3": 4.0}
    np.testing.assert_array_equal(weights.table(), [0.5, 2.0, 1.0, 4.0])
    assert ClassWeights.of(None) is None


def test_each_kind_of_label_maps_to_its_class_weight_and_a_sample_weight_is_multiplied():
    import tensorflow as tf

    weights = ClassWeights.of(CW)
    labels = np.array([0, 1, 2, 3, 7, -1])  # 2: left out; 7 and -1: not in the table
    expected = np.array([0.5, 2.0, 1.0, 4.0, 1.0, 1.0], np.float32)
    x = tf.zeros([6, 2])
    for y in (labels, labels[:, None], labels.astype(np.float32) + 0.2, np.eye(8, dtype=np.float32)[[0, 1, 2, 3, 7, 7]]):
        _, y_out, w = weights.weigh(x, tf.constant(y))
        np.testing.assert_array_equal(w.numpy(), expected, err_msg=str(y.shape))
        np.testing.assert_array_equal(y_out.numpy(), y)
    given = np.arange(1, 7, dtype=np.float32)
    for sample_weight in (given, given[:, None], np.repeat(given[:, None], 3, axis=1)):
        _, _, w = weights.weigh(x, tf.constant(labels), tf.constant(sample_weight))
        assert w.shape == sample_weight.shape
        np.testing.assert_allclose(w.numpy(), sample_weight * expected.reshape((6,) + (1,) * (sample_weight.ndim - 1)))


@pytest.mark.parametrize("y,match", [
    ({"a": Y}, r"one output; received labels that are a dict of arrays"),
    ([Y, Y], r"one output; received labels that are a list or tuple of arrays"),
    (np.stack([Y, Y, Y], axis=1), r"received labels of shape \(n, 3\) and dtype int64"),
    (np.zeros((N, 2, 4), np.float32), r"received labels of shape \(n, 2, 4\) and dtype float32"),
])
def test_labels_without_one_class_per_example_are_refused_before_training(y, match):
    with pytest.raises(DataError, match=match) as info:
        _fit((X, y), class_weight=CW)
    assert "\n" not in str(info.value) and "Fix:" in str(info.value)


# --- training ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("keras_name", KERASES)
def test_fit_with_class_weight_trains_bit_identically_to_keras_fit_with_class_weight(keras_name):
    # No dropout: tf_keras draws its masks from op seeds that depend on the graph a loop builds.
    ours = tfdist.fit(build(keras_name, dropout=0.0), (X, Y), epochs=2, batch_size=32, strategy="one_device", seed=4,
                      deterministic=True, verbose=0, shuffle=False, class_weight=CW)
    theirs = build(keras_name, dropout=0.0)()
    # Keras 3 gives a class left out of the dict the weight 0 in some paths: name every class.
    theirs.fit(X, Y, batch_size=32, epochs=2, shuffle=False, verbose=0, class_weight={**CW, 2: 1.0})
    assert same_weights(ours.model, theirs)
    assert ours.history["loss"] == pytest.approx(theirs.history.history["loss"], rel=1e-6)
    unweighted = build(keras_name, dropout=0.0)()
    unweighted.fit(X, Y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    assert not same_weights(unweighted, theirs)


@pytest.mark.parametrize("keras_name,accum", [("keras", 2), ("tf_keras", 1)])
def test_class_weight_from_files_equals_the_same_sample_weights_and_multiplies_a_given_one(tmp_path, keras_name, accum):
    import tensorflow as tf

    with tf.io.TFRecordWriter(str(tmp_path / "data.tfrecord")) as writer:
        for x, y, w in zip(X, Y, W):
            writer.write(tf.train.Example(features=tf.train.Features(feature={
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=x)),
                "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[y])),
                "w": tf.train.Feature(float_list=tf.train.FloatList(value=[w]))})).SerializeToString())

    def parse(weighed_by):
        def fn(serialized):
            f = tf.io.parse_example(serialized, {"x": tf.io.FixedLenFeature([6], tf.float32),
                                                 "y": tf.io.FixedLenFeature([], tf.int64),
                                                 "w": tf.io.FixedLenFeature([], tf.float32)})
            return (f["x"], f["y"]) if weighed_by is None else (f["x"], f["y"], weighed_by(f))
        return fn

    table = tf.constant([0.5, 2.0, 1.0, 4.0])
    files = str(tmp_path / "data.tfrecord")
    options = dict(grad_accum_steps=accum, batch_size=32)
    by_class = _fit(tfdist.TFRecordSource(files, parse(None)), keras_name, class_weight=CW, **options)
    by_sample = _fit(tfdist.TFRecordSource(files, parse(lambda f: tf.gather(table, f["y"]))), keras_name, **options)
    assert same_weights(by_class.model, by_sample.model)
    both = _fit((X, Y, W), keras_name, class_weight=CW, **options)
    product = _fit((X, Y, W * _per_example(Y)), keras_name, **options)
    assert same_weights(both.model, product.model) and not same_weights(both.model, by_class.model)


@pytest.mark.parametrize("keras_name", KERASES)
def test_a_class_weighted_run_killed_mid_epoch_resumes_bit_identically_and_refuses_other_weights(tmp_path, keras_name):
    options = dict(epochs=2, class_weight=CW, save_every_steps=3, validation_data=(X, Y))
    reference = _fit((X, Y), keras_name, checkpoint_dir=str(tmp_path / "ref"), **options)
    with pytest.raises(Crash):
        _fit((X, Y), keras_name, checkpoint_dir=str(tmp_path / "int"), callbacks=[crash_after(7, keras_name)], **options)
    with pytest.raises(CheckpointMismatchError, match=r"class_weight: checkpoint \{'0': 0.5, '1': 2.0, '3': 4.0\}, "
                                                      r"this run \{'0': 1.0, '1': 1.0\}"):
        _fit((X, Y), keras_name, checkpoint_dir=str(tmp_path / "int"), **{**options, "class_weight": {0: 1, 1: 1}})
    resumed = _fit((X, Y), keras_name, checkpoint_dir=str(tmp_path / "int"), **options)
    assert resumed.tfdist.start_step == 6 and resumed.tfdist.global_step == 10
    assert resumed.history == reference.history
    assert_bit_identical(checkpoint_tensors(str(tmp_path / "ref")), checkpoint_tensors(str(tmp_path / "int")))


# Two replicas need two logical CPUs, set before TensorFlow's runtime starts: conftest.two_cpu_scripts
# runs this in a fresh process.
_MIRRORED = textwrap.dedent(
    """
    import json
    import tfdist
    devices = tfdist.split_cpu(2)
    from test_data_class_weights import CW, X, Y, _fit, _per_example
    from conftest import same_weights

    options = dict(strategy="mirrored", devices=devices, grad_accum_steps=2, epochs=1)
    by_class = _fit((X, Y), class_weight=CW, **options)
    by_sample = _fit((X, Y, _per_example(Y)), **options)
    unweighted = _fit((X, Y), **options)
    print("RESULT " + json.dumps({"replicas": by_class.tfdist.num_replicas,
                                  "same": same_weights(by_class.model, by_sample.model),
                                  "weighed": not same_weights(by_class.model, unweighted.model)}))
    """
)


def test_mirrored_replicas_weigh_their_parts_of_the_batch_by_class(two_cpu_scripts):
    result = two_cpu_scripts("class_weights")  # _MIRRORED
    assert result == {"replicas": 2, "same": True, "weighed": True}
