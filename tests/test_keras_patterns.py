"""Models written as keras.io writes them (tests/keras_patterns.py) train through ``tfdist.fit``
under every synchronous strategy, resume bit-identically after a SIGKILL, and equal plain
``model.fit`` on one device."""

from __future__ import annotations

import os
import random
import sys

import numpy as np
import pytest

from conftest import assert_bit_identical, base_env, checkpoint_tensors

HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER = os.path.join(HERE, "keras_patterns.py")
STEPS = 12  # 96 examples, global batch 16, 2 epochs; a save every 2 steps


def _env(**extra):
    return base_env(PYTHONPATH=HERE + os.pathsep + base_env()["PYTHONPATH"], **extra)


def _result(out: str) -> dict:
    import json

    return json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])


def _drive(procs, strategy, root, pattern, kill_at):
    code, out = procs.run([sys.executable, DRIVER, strategy, str(root), pattern, str(kill_at)], timeout=240,
                          env=_env())
    return code, out


@pytest.mark.parametrize("strategy, pattern", [
    ("one_device", "gan"), ("one_device", "vae"), ("one_device", "autoencoder"),
    ("mirrored", "gan"), ("mirrored", "strings"),
    ("central_storage", "vae"), ("central_storage", "counter"),
])
def test_a_keras_io_model_resumes_bit_identical_after_a_sigkill(procs, tmp_path, strategy, pattern):
    kill_at = random.randint(3, STEPS - 1)  # after the first save (step 2), before the end
    code, out = _drive(procs, strategy, tmp_path / "reference", pattern, 0)
    assert code == 0, out[-3000:]
    code, out = _drive(procs, strategy, tmp_path / "killed", pattern, kill_at)
    assert code == -9, f"expected the SIGKILL at step {kill_at}; exit {code}\n{out[-3000:]}"
    code, out = _drive(procs, strategy, tmp_path / "killed", pattern, kill_at)
    assert code == 0, out[-3000:]
    # The step it resumed from: the last save complete before the kill (saves are asynchronous).
    assert 0 <= _result(out)[pattern]["from"] < kill_at
    assert_bit_identical(checkpoint_tensors(str(tmp_path / "reference" / pattern)),
                         checkpoint_tensors(str(tmp_path / "killed" / pattern)))


def test_a_gan_under_two_launched_workers_resumes_bit_identical_after_a_sigkill(procs, tmp_path):
    def launch(root, fault):
        code, out = procs.run([sys.executable, "-m", "tfdist", "launch", "--workers", "2", "--", sys.executable, DRIVER,
                               "multi_worker_mirrored", str(root), "gan", "0"], timeout=300,
                              env=_env(**({"TFDIST_FAULT": fault} if fault else {})))
        assert code == 0, out[-4000:]
        return out

    launch(tmp_path / "reference", None)
    out = launch(tmp_path / "killed", f"worker:1/kill_at_step:{random.randint(3, STEPS - 1)}")
    assert "restart" in out, out[-4000:]
    assert_bit_identical(checkpoint_tensors(str(tmp_path / "reference" / "gan")),
                         checkpoint_tensors(str(tmp_path / "killed" / "gan")))


def test_the_unused_default_optimizer_of_a_gan_stays_out_of_the_checkpoint(tmp_path):
    import keras_patterns

    keras_patterns.fit("gan", "one_device", str(tmp_path))
    names = checkpoint_tensors(str(tmp_path))
    assert any(name.startswith("model/d_optimizer/") for name in names)
    assert any(name.startswith("model/g_optimizer/") for name in names)
    slots = [name for name in names if name.startswith("optimizer/_variables/")]
    assert not slots, slots


@pytest.mark.parametrize("pattern", ["gan", "vae", "autoencoder", "counter", "strings"])
def test_one_device_equals_plain_model_fit_bit_for_bit(pattern):
    import keras
    import keras_patterns

    import tfdist

    keras.utils.set_random_seed(4)
    reference = keras_patterns.BUILDERS[pattern]()
    initial = reference.get_weights()
    data = keras_patterns.data(pattern)
    x, y = (data, None) if not isinstance(data, tuple) else data
    if isinstance(x, dict):  # Keras' own fit refuses NumPy arrays of strings ("Invalid dtype: object"): tensors
        import tensorflow as tf

        x = {key: tf.constant(value.astype(str)) if value.dtype == object else value for key, value in x.items()}
    keras.utils.set_random_seed(7)
    reference.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)

    def build():
        keras.utils.set_random_seed(4)
        model = keras_patterns.BUILDERS[pattern]()
        model.set_weights(initial)
        return model

    keras.utils.set_random_seed(7)
    history = tfdist.fit(build, data, batch_size=16, epochs=2, shuffle=False, strategy="one_device", seed=7, verbose=0)
    trained, expected = history.model.get_weights(), reference.get_weights()
    assert len(trained) == len(expected)
    assert all(np.array_equal(a, b) for a, b in zip(trained, expected))
