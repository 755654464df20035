"""`tfdist train --model MODULE:FUNCTION`: the user's own model, with every other flag working
as for the built-in ones (data, checkpoints, the model file, SavedModel export, MLflow,
profiling, the sidecar evaluator), under one_device and a 2-worker launch."""

from __future__ import annotations

import sys
import textwrap

import pytest
from conftest import base_env
from test_evaluator import eval_steps
from test_profile import profiles
from test_tracking import mlflow_runs

# Written as users_models.py in the working directory: a tf_keras model (the Keras is told from
# the module's imports), one that is not compiled, and a Keras 3 one.
MODULE = textwrap.dedent("""
    import keras
    import tf_keras


    def build(input_shape, num_classes):
        model = tf_keras.Sequential([tf_keras.Input(input_shape), tf_keras.layers.Rescaling(1 / 16),
                                     tf_keras.layers.Flatten(), tf_keras.layers.Dense(num_classes)], name="mine")
        model.compile("adam", tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
        return model


    def uncompiled():
        return keras.Sequential([keras.Input((8, 8)), keras.layers.Flatten(), keras.layers.Dense(10)])


    def build_keras3(num_classes, **ignored):
        model = keras.Sequential([keras.Input((8, 8)), keras.layers.Flatten(), keras.layers.Dense(num_classes)])
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
        return model
""")


@pytest.fixture
def users_module(tmp_path, monkeypatch):
    """users_models.py in a fresh working directory; sys.path and sys.modules as they were after."""
    (tmp_path / "users_models.py").write_text(MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "users_models", raising=False)
    yield tmp_path
    sys.modules.pop("users_models", None)


def _last_error(capsys) -> str:
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.timeout(300)
def test_train_takes_a_users_model_function_and_writes_every_output_for_it(users_module, capsys):
    import tensorflow as tf
    import tf_keras

    from tfdist.cli import main

    out = users_module / "run"
    args = ["train", "--model", "users_models:build", "--epochs", "2", "--steps-per-epoch", "3", "--verbose", "0",
            "--output-dir", str(out), "--save-every-steps", "2"]
    assert main([*args, "--export-savedmodel", str(out / "serving" / "1"), "--profile-steps", "2,3", "--mlflow"]) == 0
    model = tf_keras.models.load_model(out / "model.keras")  # tf_keras, told from the module's imports
    assert model.name == "mine"
    signature = tf.saved_model.load(str(out / "serving" / "1")).signatures["serving_default"]
    (name,) = signature.structured_input_signature[1]
    x = tf.random.uniform((4, 8, 8), maxval=16, seed=1)
    (served,) = signature(**{name: x}).values()
    assert float(tf.reduce_max(tf.abs(served - model(x)))) < 1e-5
    assert len(profiles(out / "tensorboard")) == 1
    client, (run,) = mlflow_runs(out)
    assert run.data.params["model"] == "users_models:build" and run.data.params["keras"] == "2"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val_accuracy")] == [0, 1]
    capsys.readouterr()
    assert main(["evaluate", str(out / "model.keras"), "--verbose", "0"]) == 0
    assert "tfdist evaluate: loss" in capsys.readouterr().out

    refused = {
        "users_models:missing": "--model names no function 'missing' in module 'users_models'",
        "no_such_module:build": "--model cannot import 'no_such_module'",
        "users_models:uncompiled": "--model users_models:uncompiled returned a model that is not compiled. Fix:",
    }
    for spec, message in refused.items():
        assert main(["train", "--model", spec, "--epochs", "1", "--output-dir", str(users_module / spec)]) == 2
        error = _last_error(capsys)
        assert message in error and "Fix:" in error, error
    assert main(["train", "--model", "users_models:build_keras3", "--keras", "2", "--epochs", "1", "--output-dir",
                 str(users_module / "k")]) == 2
    assert "returned a keras model, and --keras 2 means tf_keras. Fix: pass --keras 3." in _last_error(capsys)
    with pytest.raises(SystemExit):
        main(["train", "--model", "not a model"])
    assert "expected a built-in model" in capsys.readouterr().err
    (users_module / "docs").mkdir()
    (users_module / "docs" / "notes.txt").write_text("keep")
    for path, message in ((out / "checkpoints" / "serving", "among the run's checkpoints"),
                          (users_module / "docs", "would replace a file or a directory that is not a SavedModel")):
        assert main([*args, "--export-savedmodel", str(path)]) == 2
        error = _last_error(capsys)
        assert message in error and "Fix:" in error, error


@pytest.mark.timeout(400)
def test_a_users_model_trains_on_two_workers_with_the_sidecar_evaluator_from_the_command_line(tmp_path, procs):
    (tmp_path / "users_models.py").write_text(MODULE)
    out = tmp_path / "run"
    code, log = procs.tfdist(
        "launch", "--workers", "2", "--evaluator", "--", sys.executable, "-m", "tfdist", "train",
        "--model", "users_models:build", "--epochs", "2", "--steps-per-epoch", "3", "--verbose", "0",
        "--output-dir", str(out), "--export-savedmodel", str(out / "serving" / "1"), "--profile-steps", "2,3",
        "--mlflow", timeout=360, cwd=tmp_path, env=base_env())
    assert code == 0, log[-4000:]
    assert (out / "model.keras").is_file() and sorted(p.name for p in (out / "serving").iterdir()) == ["1"]
    assert len(profiles(out / "tensorboard")) == 1
    client, (run,) = mlflow_runs(out)
    assert run.data.params["strategy"] == "multi_worker_mirrored" and run.data.params["num_workers"] == "2"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [0, 1]
    assert 6 in eval_steps(out / "tensorboard" / "eval")  # the evaluator scored the user's model's last checkpoint
