"""tfdist.save_model: the trained model as one .keras file on any filesystem, written atomically,
and read back with the Keras that wrote it. tfdist.export: a SavedModel that serves the outputs
of predict in a fresh process.

Every worker of a multi-worker run taking part is tested in tests/multiprocess (tfdist train
writes the model through it) and tests/test_outputs_launch.py (tfdist.export)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import script_result

import tfdist
from tfdist.errors import ModelError


def _trained(keras_name: str):
    keras = __import__(keras_name)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.BatchNormalization(),
                              keras.layers.Dense(2)])
    model.compile("adam", "mse")
    model.fit(np.ones((16, 4), np.float32), np.zeros((16, 2), np.float32), epochs=1, verbose=0)
    return keras, model


@pytest.mark.parametrize("keras_name", ["keras", "tf_keras"])
def test_a_model_written_to_another_filesystem_loads_with_its_keras_and_the_same_weights(keras_name, tmp_path):
    import tensorflow as tf

    keras, model = _trained(keras_name)
    target = f"ram://{tmp_path}/deep/er/model.keras"  # ram:// stands in for gs://; its directories are made
    tfdist.save_model(model, target)
    local = str(tmp_path / "copy.keras")
    tf.io.gfile.copy(target, local)
    loaded = keras.models.load_model(local)
    assert all(np.array_equal(a, b) for a, b in zip(model.get_weights(), loaded.get_weights()))
    assert not [name for name in tf.io.gfile.listdir(f"ram://{tmp_path}/deep/er") if name != "model.keras"]

    # tfdist's reader picks the Keras that wrote the file, and reads it from that filesystem.
    from tfdist.training.export import load_model

    again = load_model(target, strategy=tfdist.make_strategy("one_device"))
    assert type(again).__module__.startswith(keras_name + ".")
    assert all(np.array_equal(a, b) for a, b in zip(model.get_weights(), again.get_weights()))

    tfdist.save_model(model, str(tmp_path / "new" / "model.keras"))  # a local directory that does not exist yet
    assert len(keras.models.load_model(tmp_path / "new" / "model.keras").get_weights()) == len(model.get_weights())
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == ["model.keras"]


def test_a_name_keras_cannot_write_is_refused_in_one_line_with_the_fix(tmp_path):
    _, model = _trained("keras")
    for bad in ("model.h5", str(tmp_path / "model"), str(tmp_path / ".keras")):
        with pytest.raises(ModelError, match=r"ends in \.keras; received path=.*Fix: name a file such as model\.keras"):
            tfdist.save_model(model, bad)
    assert list(tmp_path.iterdir()) == []


_SERVE = """
import json, sys
import numpy as np
import tensorflow as tf

x = np.load(sys.argv[2])
outputs = {}
for path in sys.argv[1].split(","):
    signature = tf.saved_model.load(path).signatures["serving_default"]
    (name,) = signature.structured_input_signature[1]
    (result,) = signature(**{name: tf.constant(x)}).values()
    outputs[path] = result.numpy().tolist()
print("RESULT " + json.dumps(outputs))
"""


def _with_preprocessing(keras_name: str):
    """A builder of a compiled model whose first layer is preprocessing (a Normalization adapted to the data)."""
    def build():
        keras = __import__(keras_name)
        norm = keras.layers.Normalization()
        norm.adapt(np.arange(40, dtype=np.float32).reshape(10, 4))
        model = keras.Sequential([keras.Input((4,)), norm, keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(3)])
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    return build


def test_a_savedmodel_served_in_a_fresh_process_gives_the_outputs_of_predict_under_either_keras(tmp_path, procs):
    rng = np.random.RandomState(0)
    x, y = (rng.rand(64, 4) * 40).astype(np.float32), rng.randint(0, 3, 64)
    paths, expected = [], {}
    for keras_name in ("keras", "tf_keras"):
        history = tfdist.fit(_with_preprocessing(keras_name), (x, y), epochs=1, batch_size=16, seed=0, verbose=0,
                             strategy="one_device")
        path = str(tmp_path / keras_name / "serving" / "1")
        assert tfdist.export(history.model, path) == path
        tfdist.export(history.model, path)  # an earlier SavedModel is replaced
        assert sorted(p.name for p in (tmp_path / keras_name / "serving").iterdir()) == ["1"]
        paths.append(path)
        expected[path] = history.model.predict(x, verbose=0)
    np.save(tmp_path / "x.npy", x)
    served = script_result(procs, _SERVE, ",".join(paths), str(tmp_path / "x.npy"))
    for path in paths:
        np.testing.assert_allclose(np.array(served[path]), expected[path], rtol=1e-5, atol=1e-5)


def test_an_export_to_another_filesystem_is_whole_and_a_bad_path_is_refused_in_one_line(tmp_path):
    import tensorflow as tf

    from tfdist.errors import StorageError

    _, model = _trained("keras")
    target = f"ram://{tmp_path}/serving/1"  # ram:// stands in for gs://: no directory renames there
    tfdist.export(model, target)
    tfdist.export(model, target)
    assert tf.io.gfile.listdir(f"ram://{tmp_path}/serving") == ["1"]
    assert "saved_model.pb" in tf.io.gfile.listdir(target)
    with pytest.raises(ModelError, match=r"a SavedModel is a directory, not a \.keras file; received "
                                         r"path='m\.keras'\. Fix: name a directory such as serving/1"):
        tfdist.export(model, "m.keras")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me")
    with pytest.raises(StorageError, match=r"would replace a file or a directory that is not a SavedModel; received "
                                           r"path=.*notes.*Fix: name a new directory"):
        tfdist.export(model, str(tmp_path / "notes"))
    assert (tmp_path / "notes" / "todo.txt").read_text() == "keep me"
