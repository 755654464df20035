"""tfdist._compat: every entry raises CompatibilityError when what it reaches is missing, works on the
installed TensorFlow and Keras, and fit's version check warns once outside the supported range."""

from __future__ import annotations

import logging

import pytest

from tfdist._compat import keras3 as keras3_compat
from tfdist._compat import keras_common as keras_compat
from tfdist._compat import tensorflow as tf_compat
from tfdist._compat import tf_keras as tf_keras_compat
from tfdist._compat import versions
from tfdist.errors import CompatibilityError, TfdistError


class Bare:
    """An object without any of the private attributes the entries reach."""


class BareModel:
    """Looks like a Keras model to ``owning_strategy`` (it has ``distribute_strategy``), without its privates."""

    distribute_strategy = None


class WriterWithoutError:
    """A checkpoint whose async helper lacks ``_async_error`` (a renamed attribute)."""

    def __init__(self):
        self._async_checkpointer_impl = Bare()


ENTRIES = [
    ("tensorflow.take_async_error", lambda: tf_compat.take_async_error(Bare())),
    ("tensorflow.take_async_error", lambda: tf_compat.take_async_error(WriterWithoutError())),
    ("tensorflow.async_copy_function", lambda: tf_compat.async_copy_function(WriterWithoutError())),
    ("tensorflow.end_async_writer", lambda: tf_compat.end_async_writer(WriterWithoutError())),
    ("tensorflow.omit_retracing_warning", lambda: tf_compat.omit_retracing_warning(Bare())),
    ("keras_common.sublayers", lambda: keras_compat.sublayers(Bare())),
    ("keras_common.owning_strategy", lambda: keras_compat.owning_strategy(BareModel())),
    ("keras_common.variable_key", lambda: keras_compat.variable_key(Bare(), None)),
    ("keras3.compile_config", lambda: keras3_compat.compile_config(Bare())),
    ("keras3.compiled_loss", lambda: keras3_compat.compiled_loss(Bare())),
    ("keras3.compiled_metrics", lambda: keras3_compat.compiled_metrics(Bare())),
    ("keras3.symbolic_build", lambda: keras3_compat.symbolic_build(Bare(), None)),
    ("tf_keras.compile_arguments", lambda: tf_keras_compat.compile_arguments(Bare())),
    ("tf_keras.is_graph_network", lambda: tf_keras_compat.is_graph_network(Bare())),
    ("tf_keras.cluster_coordinator", lambda: tf_keras_compat.cluster_coordinator(Bare())),
    ("tf_keras.set_schedule_rate_variable", lambda: tf_keras_compat.set_schedule_rate_variable(Bare(), None)),
    ("tf_keras.start_state", lambda: tf_keras_compat.start_state(Bare())),
    ("tf_keras.set_start_state", lambda: tf_keras_compat.set_start_state(Bare(), None)),
    ("tf_keras.train_counter", lambda: tf_keras_compat.train_counter(Bare())),
    ("tf_keras.take_tensor_logs", lambda: tf_keras_compat.take_tensor_logs(Bare())),
]


@pytest.mark.parametrize("entry, call", ENTRIES, ids=[f"{e}-{i}" for i, (e, _) in enumerate(ENTRIES)])
def test_an_entry_raises_naming_itself_and_the_versions_when_its_target_is_missing(entry, call):
    with pytest.raises(CompatibilityError) as raised:
        call()
    message = str(raised.value)
    assert f"tfdist._compat.{entry}:" in message
    assert "TensorFlow 2." in message and versions.supported_range() in message and "Fix:" in message
    assert isinstance(raised.value, TfdistError) and isinstance(raised.value, RuntimeError)


def test_a_random_layer_without_its_generator_attribute_raises():
    class Layer:
        _random_generator = Bare()

    with pytest.raises(CompatibilityError, match="random_generator"):
        tf_keras_compat.random_generator(Layer())
    assert tf_keras_compat.random_generator(Bare()) == (None, False)  # a layer that draws no random numbers


def test_a_missing_async_writer_is_no_error_and_a_kept_error_is_taken_once():
    class Helper:
        _async_error = OSError("disk full")

    class Checkpoint:
        _async_checkpointer_impl = None

    assert tf_compat.take_async_error(Checkpoint()) is None  # no async save yet
    checkpoint = Checkpoint()
    checkpoint._async_checkpointer_impl = Helper()
    assert isinstance(tf_compat.take_async_error(checkpoint), OSError)
    assert tf_compat.take_async_error(checkpoint) is None


def test_the_entries_work_on_the_installed_tensorflow_and_keras(tmp_path):
    import keras
    import tensorflow as tf
    import tf_keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.Dropout(0.5)])
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    assert [type(layer).__name__ for layer in keras_compat.sublayers(model)][-2:] == ["Dense", "Dropout"]
    assert keras3_compat.compile_config(model)["loss"] == "mse"
    assert keras_compat.owning_strategy(model) is None
    keras3_compat.global_seed_generator()

    old = tf_keras.Sequential([tf_keras.Input((3,)), tf_keras.layers.Dense(2)])
    old.compile(optimizer="sgd", loss="mse")
    assert tf_keras_compat.compile_arguments(old)["steps_per_execution"] == 1
    assert tf_keras_compat.start_state(old) is None and tf_keras_compat.cluster_coordinator(old) is None
    callback = tf_keras.callbacks.Callback()
    tf_keras_compat.take_tensor_logs(callback)
    assert tf_keras_compat.callback_takes_tensor_logs(callback)

    root = tf.train.Checkpoint(v=tf.Variable(1.0))
    root.write(str(tmp_path / "ckpt"), options=tf.train.CheckpointOptions(enable_async=True))
    root.sync()
    assert tf_compat.take_async_error(root) is None
    assert tf_compat.async_copy_function(root) is not None
    tf_compat.end_async_writer(root)
    assert tf_compat.async_copy_function(root) is None
    assert tf_compat.omit_retracing_warning(tf.function(lambda: 1)) is not None
    assert callable(tf_compat.slurm_resolver_module().expand_hostlist)


@pytest.mark.parametrize("installed, outside", [
    ({"tensorflow": "2.21.0", "keras": "3.15.1", "tf-keras": "2.21.0"}, []),
    ({"tensorflow": "2.17.1", "keras": "3.5.0", "tf-keras": None}, []),
    ({"tensorflow": "2.22.0rc1", "keras": "3.15.1", "tf-keras": "2.21.0"}, ["tensorflow 2.22.0rc1"]),
    ({"tensorflow": "2.16.2", "keras": "3.4.1", "tf-keras": "2.16.0"},
     ["tensorflow 2.16.2", "keras 3.4.1", "tf-keras 2.16.0"]),
])
def test_versions_outside_the_supported_range_are_named(installed, outside):
    assert versions.untested(installed) == outside


def test_an_untested_version_gets_one_warning_line(monkeypatch, caplog):
    monkeypatch.setattr(versions, "installed_versions", lambda: {"tensorflow": "2.99.0", "keras": "3.15.0"})
    monkeypatch.setattr(versions, "_warned", False)
    with caplog.at_level(logging.WARNING, logger="tfdist"):
        assert versions.warn_if_untested()
        assert not versions.warn_if_untested()
    lines = [r.getMessage() for r in caplog.records if "untested" in r.getMessage()]
    assert len(lines) == 1 and "tensorflow 2.99.0" in lines[0] and "tensorflow 2.17-2.21" in lines[0], lines
