"""``fit(validation_split=..., validation_freq=...)``: Keras' meaning in both Kerases, one-line
refusals, and the rhythm of validation kept through a resume."""

from __future__ import annotations

import numpy as np
import pytest

import tfdist
from tfdist.errors import DataError

from conftest import Crash, assert_bit_identical, checkpoint_tensors, crash_after, same_weights

KERASES = ["keras", "tf_keras"]
_RNG = np.random.RandomState(3)
N = 100
X = _RNG.rand(N, 6).astype(np.float32)
Y = (X[:, 0] * 2.2 + X[:, 1] * 1.1).astype(np.int64)  # classes 0..3
W = _RNG.uniform(0.5, 1.5, N).astype(np.float32)
CUT = 75  # validation_split=0.25 holds out the last 25 examples


def build(keras_name: str):
    def make():
        keras = __import__(keras_name)
        keras.utils.set_random_seed(5)
        model = keras.Sequential([
            keras.Input((6,)), keras.layers.Dense(16, use_bias=False), keras.layers.BatchNormalization(),
            keras.layers.Activation("relu"), keras.layers.Dense(4),
        ])
        lr = keras.optimizers.schedules.ExponentialDecay(0.05, 4, 0.8)
        model.compile(keras.optimizers.SGD(lr, momentum=0.5),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
        return model

    return make


def _fit(data, keras_name, **kwargs):
    options = dict(epochs=2, batch_size=25, strategy="one_device", seed=4, deterministic=True, verbose=0)
    options.update(kwargs)
    return tfdist.fit(build(keras_name), data, **options)


@pytest.mark.parametrize("keras_name", KERASES)
def test_validation_split_holds_out_the_last_examples_as_keras_fit_does(keras_name):
    ours = _fit((X, Y), keras_name, validation_split=0.25, shuffle=False)
    assert ours.tfdist.steps_per_epoch == CUT // 25
    theirs = build(keras_name)()
    theirs.fit(X, Y, validation_split=0.25, batch_size=25, epochs=2, shuffle=False, verbose=0)
    assert same_weights(ours.model, theirs)
    assert ours.history["val_loss"] == pytest.approx(theirs.history.history["val_loss"], rel=1e-6)
    # Sample weights are split with the examples; the split is taken before the shuffle.
    split = _fit((X, Y, W), keras_name, validation_split=0.25)
    explicit = _fit((X[:CUT], Y[:CUT], W[:CUT]), keras_name, validation_data=(X[CUT:], Y[CUT:], W[CUT:]))
    assert same_weights(split.model, explicit.model)
    assert split.history == explicit.history and len(split.history["val_loss"]) == 2


@pytest.mark.parametrize("keras_name", KERASES)
def test_validation_freq_validates_every_nth_epoch_and_a_resumed_run_keeps_the_rhythm(tmp_path, keras_name):
    data, validation = (X[:CUT], Y[:CUT]), (X[CUT:], Y[CUT:])
    options = dict(epochs=4, validation_data=validation, validation_freq=2, save_every_steps=2)
    reference = _fit(data, keras_name, checkpoint_dir=str(tmp_path / "ref"), **options)
    assert len(reference.history["loss"]) == 4 and len(reference.history["val_loss"]) == 2
    every_epoch = _fit(data, keras_name, epochs=2, validation_data=validation)
    assert reference.history["val_loss"][0] == every_epoch.history["val_loss"][1]  # after epoch 2, not epoch 1
    with pytest.raises(Crash):  # at the last step of epoch 3: the run resumes from step 8, mid-epoch
        _fit(data, keras_name, checkpoint_dir=str(tmp_path / "int"), callbacks=[crash_after(9, keras_name)], **options)
    resumed = _fit(data, keras_name, checkpoint_dir=str(tmp_path / "int"), **options)
    assert resumed.tfdist.start_step == 8 and resumed.tfdist.global_step == 12
    assert resumed.history == reference.history
    assert_bit_identical(checkpoint_tensors(str(tmp_path / "ref")), checkpoint_tensors(str(tmp_path / "int")))


def _dataset():
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices((X, Y))


@pytest.mark.parametrize("data,options,match", [
    ((X, Y), dict(validation_split=0.2, validation_data=(X, Y)),
     r"both validation_data and validation_split=0.2 were given. Fix: pass one of them"),
    ("digits", dict(validation_split=0.2), r"in-memory arrays only; received data='digits'. Fix: leave validation_split out"),
    (_dataset, dict(validation_split=0.2), r"in-memory arrays and image folders only; received data of type \w*Dataset\w*. Fix: pass validation_data"),
    ((X, Y), dict(validation_split=1.0), r"Invalid `validation_split`; received validation_split=1.0. Fix: pass a fraction"),
    ((X, Y), dict(validation_split=-0.1), r"received validation_split=-0.1"),
    ((X, Y), dict(validation_split=True), r"received validation_split=True"),
    ((X, Y), dict(validation_split="0.2"), r"received validation_split='0.2'"),
    ((X, Y), dict(validation_split=float("nan")), r"received validation_split=nan"),
    ((X[:4], Y[:4]), dict(validation_split=0.9), r"validation_split=0.9 of 4 examples leaves no training examples"),
    ((X, Y), dict(validation_freq=0), r"Invalid `validation_freq`; received validation_freq=0. Fix: pass the number"),
    ((X, Y), dict(validation_freq=1.5), r"received validation_freq=1.5"),
])
def test_bad_validation_arguments_get_a_one_line_error_before_training(data, options, match):
    with pytest.raises(DataError, match=match) as info:
        _fit(data() if callable(data) else data, "keras", **options)
    assert "\n" not in str(info.value)
