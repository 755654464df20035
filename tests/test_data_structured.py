"""Data with several inputs (a dict or list of arrays) and per-example sample weights, from every
source, through both Kerases: gathered by index, weighted in training and validation, resumed exactly."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

import tfdist
from tfdist import data
from tfdist.data.arrays import hash_arrays
from tfdist.errors import DataError

from conftest import Crash, assert_bit_identical, checkpoint_tensors, crash_after

_RNG = np.random.RandomState(5)
N = 192
X = {"image": _RNG.rand(N, 4, 4, 1).astype(np.float32), "meta": _RNG.rand(N, 3).astype(np.float32)}
Y = ((X["meta"].sum(1) + X["image"].mean((1, 2, 3))) * 1.9).astype(np.int64) % 3
W = _RNG.uniform(0.2, 2.0, N).astype(np.float32)


def build(keras_name: str = "keras", *, dropout: float = 0.2, synchronized: bool = False):
    """A two-input functional model with BatchNormalization, dropout and a decaying learning rate."""

    def make():
        keras = __import__(keras_name)
        image, meta = keras.Input((4, 4, 1), name="image"), keras.Input((3,), name="meta")
        h = keras.layers.Concatenate()([keras.layers.Flatten()(image), meta])
        h = keras.layers.Dense(16, use_bias=False)(h)
        h = keras.layers.Activation("relu")(keras.layers.BatchNormalization(synchronized=synchronized)(h))
        out = keras.layers.Dense(3)(keras.layers.Dropout(dropout)(h))
        model = keras.Model({"image": image, "meta": meta}, out)
        lr = keras.optimizers.schedules.ExponentialDecay(0.02, 10, 0.9)
        model.compile(keras.optimizers.Adam(lr), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
        return model

    return make


def _fit(data_, keras_name="keras", *, model=None, **kwargs):
    options = dict(epochs=2, batch_size=32, strategy="one_device", seed=4, deterministic=True, verbose=0)
    options.update(kwargs)
    return tfdist.fit(model or build(keras_name), data_, **options)


# --- the sources -----------------------------------------------------------------------------------


def test_arrays_of_several_inputs_and_weights_are_gathered_by_index_in_their_structure():
    import tensorflow as tf

    y2 = (Y, Y.astype(np.float32)[:, None])  # two outputs
    source = data.as_source((X, y2, W))
    assert source.num_examples == N and source.example_shape == {"image": (4, 4, 1), "meta": (3,)}
    assert source.example_bytes == 4 * 16 + 4 * 3 + 8 + 4 + 4
    idx = np.array([5, 0, 77])
    for embed in (False, True):
        x, (y_a, y_b), w = source.gather_fn(embed=embed)(tf.constant(idx))
        assert sorted(x) == ["image", "meta"] and x["image"].shape == (3, 4, 4, 1)
        np.testing.assert_array_equal(x["meta"], X["meta"][idx])
        np.testing.assert_array_equal(y_a, Y[idx])
        np.testing.assert_array_equal(y_b, y2[1][idx])
        np.testing.assert_array_equal(w, W[idx])
    x, y, w = source.sample(4)
    np.testing.assert_array_equal(x["image"], X["image"][:4])
    np.testing.assert_array_equal(w, W[:4])
    # A list of inputs is several inputs too; a plain list of numbers is one array.
    assert data.ArraySource([X["image"], X["meta"]], Y).example_shape == ((4, 4, 1), (3,))
    assert data.ArraySource([[1.0, 2.0], [3.0, 4.0]], [0, 1]).example_shape == (2,)


def test_the_fingerprint_of_one_x_and_one_y_is_unchanged_and_names_count_for_several():
    x, y = X["meta"], Y
    # Checkpoints written before several inputs existed must still match their data on resume.
    assert data.ArraySource(x, y).fingerprint() == hash_arrays(x, y)
    renamed = {"image": X["image"], "extra": X["meta"]}
    assert data.ArraySource(X, Y).fingerprint() != data.ArraySource(renamed, Y).fingerprint()
    assert data.ArraySource(X, Y).fingerprint() != data.ArraySource(X, Y, W).fingerprint()


def test_structured_data_with_a_wrong_row_count_or_type_names_the_array():
    with pytest.raises(DataError, match=r"x\['meta'\] of shape \(9, 3\).*Fix: pass arrays with the same first dimension"):
        data.ArraySource({"image": X["image"], "meta": np.zeros((9, 3))}, Y)
    with pytest.raises(DataError, match=r"sample_weight of shape \(5,\)"):
        data.as_source((X, Y, np.ones(5)))
    with pytest.raises(DataError, match=r"x\['meta'\] must be numbers or strings; received an array of Python objects \(NoneType\)"):
        data.ArraySource({"image": X["image"], "meta": np.array([None] * N)}, Y)
    with pytest.raises(DataError, match=r"received tuple of length 4\. Fix: pass \(x, y\) or \(x, y, sample_weight\)"):
        data.as_source((X, Y, W, W))
    with pytest.raises(DataError, match=r"labels in several arrays.*received y as a dict"):
        data.num_classes(data.ArraySource(X["meta"], {"a": Y}))


def test_a_dataset_and_files_keep_the_sample_weight(tmp_path):
    import tensorflow as tf

    stream = data.StreamSource(tf.data.Dataset.from_tensor_slices((X, Y, W)))
    assert stream.example_shape == {"image": (4, 4, 1), "meta": (3,)}
    x, y, w = stream.sample(3)
    np.testing.assert_array_equal(w, W[:3])
    np.testing.assert_array_equal(x["meta"], X["meta"][:3])

    files = _write_records(tmp_path)
    source = data.TFRecordSource(files, _parse)
    assert source.example_shape == {"image": (4, 4, 1), "meta": (3,)}
    x, y, w = source.sample(5)
    np.testing.assert_array_equal(w, W[:5])
    np.testing.assert_array_equal(x["image"], X["image"][:5])


def _write_records(directory) -> str:
    import tensorflow as tf

    def feature(values, kind):
        return tf.train.Feature(**{kind: (tf.train.FloatList if kind == "float_list" else tf.train.Int64List)(
            value=np.ravel(values).tolist())})

    for part in range(2):
        with tf.io.TFRecordWriter(str(directory / f"part-{part}.tfrecord")) as writer:
            for i in range(part * N // 2, (part + 1) * N // 2):
                example = tf.train.Example(features=tf.train.Features(feature={
                    "image": feature(X["image"][i], "float_list"), "meta": feature(X["meta"][i], "float_list"),
                    "label": feature(Y[i], "int64_list"), "weight": feature(W[i], "float_list")}))
                writer.write(example.SerializeToString())
    return str(directory / "part-*.tfrecord")


def _parse(serialized):
    import tensorflow as tf

    f = tf.io.parse_example(serialized, {
        "image": tf.io.FixedLenFeature([4, 4, 1], tf.float32), "meta": tf.io.FixedLenFeature([3], tf.float32),
        "label": tf.io.FixedLenFeature([], tf.int64), "weight": tf.io.FixedLenFeature([], tf.float32)})
    return {"image": f["image"], "meta": f["meta"]}, f["label"], f["weight"]


# --- training ----------------------------------------------------------------------------------------


def _initial_weights(keras_name: str):
    """A callback of the model's Keras that records the trainable weights as training starts."""
    keras = __import__(keras_name)

    class Initial(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.weights = [v.numpy() for v in self.model.trainable_variables]

    return Initial()


@pytest.mark.parametrize("keras_name", ["keras", "tf_keras"])
def test_sample_weights_weigh_training_and_validation_from_every_source(tmp_path, keras_name):
    import tensorflow as tf

    zero = np.zeros(N, np.float32)
    files = _write_records(tmp_path)

    def zero_weights(serialized):
        x, y, w = _parse(serialized)
        return x, y, tf.zeros_like(w)

    # Weight 0 on every example: no gradient, so no trainable weight moves, whatever the source.
    # The sources become the same weighted batches before either Keras sees them: tf_keras takes the
    # files, the source that parses its weights itself.
    sources = [(X, Y, zero), tf.data.Dataset.from_tensor_slices((X, Y, zero))] if keras_name == "keras" else []
    for source in sources + [tfdist.TFRecordSource(files, zero_weights)]:
        initial = _initial_weights(keras_name)
        trained = _fit(source, keras_name, epochs=1, callbacks=[initial])
        after = [v.numpy() for v in trained.model.trainable_variables]
        assert len(after) == 5  # dense kernel, gamma, beta, dense kernel and bias
        for a, b in zip(after, initial.weights):
            np.testing.assert_array_equal(a, b, err_msg=type(source).__name__)
    # Validation weights count: doubling them doubles the validation loss of the same trained model.
    initial = _initial_weights(keras_name)
    once = _fit((X, Y, W), keras_name, epochs=1, validation_data=(X, Y, W), callbacks=[initial])
    assert any(not np.array_equal(v.numpy(), b) for v, b in zip(once.model.trainable_variables, initial.weights))
    twice = _fit((X, Y, W), keras_name, epochs=1, validation_data=(X, Y, 2 * W))
    np.testing.assert_allclose(twice.history["val_loss"][0], 2 * once.history["val_loss"][0], rtol=1e-6)
    assert twice.history["loss"] == once.history["loss"]


@pytest.mark.parametrize("keras_name,accum", [("keras", 1), ("tf_keras", 2)])
def test_a_two_input_weighted_run_killed_mid_epoch_resumes_bit_identically(tmp_path, keras_name, accum):
    options = dict(epochs=2, grad_accum_steps=accum, validation_data=(X, Y, W), save_every_steps=4)
    reference = _fit((X, Y, W), keras_name, checkpoint_dir=str(tmp_path / "ref"), **options)
    with pytest.raises(Crash):
        _fit((X, Y, W), keras_name, checkpoint_dir=str(tmp_path / "int"), callbacks=[crash_after(9, keras_name)], **options)
    resumed = _fit((X, Y, W), keras_name, checkpoint_dir=str(tmp_path / "int"), **options)
    assert resumed.tfdist.start_step == 8 and resumed.tfdist.global_step == 12
    assert resumed.history == reference.history
    assert_bit_identical(checkpoint_tensors(str(tmp_path / "ref")), checkpoint_tensors(str(tmp_path / "int")))


# Two replicas need two logical CPUs, set before TensorFlow's runtime starts: conftest.two_cpu_scripts
# runs this in a fresh process.
_MIRRORED = textwrap.dedent(
    """
    import json, os, sys
    import tfdist
    devices = tfdist.split_cpu(2)
    import numpy as np
    from test_data_structured import X, Y, W, build, _fit
    from conftest import Crash, checkpoint_tensors, crash_after

    # No dropout and synchronized statistics: two replicas then train as one device does.
    root = sys.argv[1]
    options = dict(epochs=2, validation_data=(X, Y, W), save_every_steps=4, model=build(dropout=0.0, synchronized=True))
    one = _fit((X, Y, W), **options)
    ref = _fit((X, Y, W), strategy="mirrored", devices=devices, checkpoint_dir=root + "/ref", **options)
    try:
        _fit((X, Y, W), strategy="mirrored", devices=devices, checkpoint_dir=root + "/int", callbacks=[crash_after(7, "keras")],
             **options)
    except Crash:
        pass
    resumed = _fit((X, Y, W), strategy="mirrored", devices=devices, checkpoint_dir=root + "/int", **options)
    a, b = checkpoint_tensors(root + "/ref"), checkpoint_tensors(root + "/int")
    out = {"replicas": ref.tfdist.num_replicas, "start": resumed.tfdist.start_step,
           "same_history": resumed.history == ref.history, "one": one.history, "mirrored": ref.history,
           "differ": sorted(k for k in a if k not in b or not np.array_equal(a[k], b[k])) + sorted(set(b) - set(a))}
    print("RESULT " + json.dumps(out))
    """
)


def test_mirrored_two_input_weighted_run_matches_one_device_and_resumes_bit_identically(two_cpu_scripts):
    result = two_cpu_scripts("structured")  # _MIRRORED
    assert result["replicas"] == 2 and result["start"] == 6
    assert result["same_history"] and result["differ"] == []
    for key, values in result["one"].items():  # the same global batches, weights and metrics as one device
        atol = 1.5 / N if "accuracy" in key else 1e-5
        np.testing.assert_allclose(result["mirrored"][key], values, rtol=1e-4, atol=atol, err_msg=key)


@pytest.mark.parametrize("keras_name", ["keras", "tf_keras"])
def test_a_list_of_inputs_of_different_shapes_trains_as_keras_reads_it(keras_name):
    # tf.data would stack a list in an element into one tensor (failing for different shapes); tfdist
    # passes it as several inputs, as Keras' model.fit([xa, xb], y) does.
    import tfdist

    keras = __import__(keras_name)

    def build():
        a, b = keras.Input((3,), name="a"), keras.Input((2,), name="b")
        model = keras.Model([a, b], keras.layers.Dense(4, kernel_initializer="ones")(keras.layers.Concatenate()([a, b])))
        model.compile(keras.optimizers.SGD(0.01), "mse")
        return model

    rng = np.random.default_rng(0)
    xa, xb = rng.normal(size=(40, 3)).astype("float32"), rng.normal(size=(40, 2)).astype("float32")
    y = rng.normal(size=(40, 4)).astype("float32")
    options = dict(epochs=3, batch_size=8, strategy="one_device", seed=0, deterministic=True, verbose=0)
    as_list = tfdist.fit(build, ([xa, xb], y), **options)
    as_tuple = tfdist.fit(build, ((xa, xb), y), **options)
    assert as_list.history["loss"] == as_tuple.history["loss"]
    assert as_list.history["loss"][-1] < as_list.history["loss"][0]
    outputs = tfdist.predict(as_list.model, [xa, xb], verbose=0)
    np.testing.assert_allclose(outputs, as_list.model.predict([xa, xb], verbose=0), atol=1e-5)


def _sequences():
    """Variable-length token sequences (text), unbatched: elements of shape (None,)."""
    import tensorflow as tf

    rng = np.random.default_rng(5)
    lengths = rng.integers(2, 12, size=96)
    tokens = [rng.integers(1, 50, size=n).astype(np.int32) for n in lengths]
    labels = (lengths > 6).astype(np.int64)
    return tf.data.Dataset.from_generator(lambda: zip(tokens, labels), output_signature=(
        tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.int64))).apply(tf.data.experimental.assert_cardinality(96))


def test_variable_length_sequences_from_a_dataset_are_padded_per_batch_and_resume_bit_identically(tmp_path):
    import keras

    def build():
        model = keras.Sequential([keras.Input((None,), dtype="int32"), keras.layers.Embedding(50, 8, mask_zero=True),
                                  keras.layers.GRU(8), keras.layers.Dense(2)])
        model.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    options = dict(epochs=2, batch_size=16, seed=0, deterministic=True, strategy="one_device", verbose=0,
                   validation_data=_sequences(), save_every_steps=4)
    reference = tfdist.fit(build, _sequences(), checkpoint_dir=str(tmp_path / "ref"), **options)
    with pytest.raises(Crash):
        tfdist.fit(build, _sequences(), checkpoint_dir=str(tmp_path / "int"), callbacks=[crash_after(9)], **options)
    resumed = tfdist.fit(build, _sequences(), checkpoint_dir=str(tmp_path / "int"), **options)
    assert resumed.tfdist.start_step == 8 and resumed.history == reference.history
    assert_bit_identical(checkpoint_tensors(str(tmp_path / "ref")), checkpoint_tensors(str(tmp_path / "int")))
    # Padded batches of the user's own: its batches are the global batches, as Keras' fit takes them.
    padded = tfdist.fit(build, _sequences().padded_batch(16), epochs=1, seed=0, strategy="one_device", verbose=0)
    assert padded.tfdist.global_batch_size == 16 and padded.tfdist.global_step >= 1
