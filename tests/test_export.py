"""tfdist.save_model: the trained model as one .keras file on any filesystem, written atomically,
and read back with the Keras that wrote it.

Every worker of a multi-worker run taking part is tested in tests/multiprocess (tfdist train
writes the model through it)."""

from __future__ import annotations

import numpy as np
import pytest

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
