"""A smoke subset for the oldest supported TensorFlow/Keras/tf_keras set, run by ``.ci/oldest.sh``.

The file name keeps it out of the main suite (which collects ``test_*.py``): the newest set runs
the full suite, and these drills would repeat what it covers there. Each drill runs the command
line in fresh processes: ``tfdist train`` on digits, a Keras 3 and a tf_keras model under
mirrored on 2 logical CPUs killed with SIGKILL and resumed bit-identically, a 2-worker launch.
"""

from __future__ import annotations

import sys

import pytest

from conftest import assert_bit_identical, base_env, checkpoint_tensors

STEPS = 8  # one epoch of 8 steps of 32 digits; a save every 2 steps
KILL_AT = 5  # after the save of step 4 was started, before the end
TRAIN = ["train", "--epochs", "1", "--steps-per-epoch", str(STEPS), "--batch-size", "32", "--seed", "7",
         "--deterministic", "--save-every-steps", "2", "--no-save-model", "--verbose", "0"]


def test_the_oldest_set_is_installed():
    import keras
    import tensorflow as tf
    import tf_keras

    from tfdist._compat import versions

    assert (tf.__version__, keras.__version__, tf_keras.__version__) == ("2.17.1", "3.5.0", "2.17.0")
    assert not versions.untested(versions.installed_versions())


@pytest.mark.parametrize("keras", ["3", "2"])
def test_mirrored_training_resumes_bit_identical_after_a_sigkill(procs, tmp_path, keras):
    args = [*TRAIN, "--keras", keras, "--strategy", "mirrored", "--cpu-devices", "2"]
    code, out = procs.tfdist(*args, "--output-dir", str(tmp_path / "reference"), timeout=400)
    assert code == 0, out[-3000:]
    assert f"step {STEPS}/{STEPS}" in out, out[-3000:]
    killed = ["--output-dir", str(tmp_path / "killed")]
    code, out = procs.tfdist(*args, *killed, timeout=400, env=base_env(TFDIST_FAULT=f"kill_at_step:{KILL_AT}"))
    assert code == -9, f"expected the SIGKILL at step {KILL_AT}; exit {code}\n{out[-3000:]}"
    code, out = procs.tfdist(*args, *killed, timeout=400)
    assert code == 0 and "resum" in out.lower(), out[-3000:]
    assert_bit_identical(checkpoint_tensors(str(tmp_path / "reference" / "checkpoints")),
                         checkpoint_tensors(str(tmp_path / "killed" / "checkpoints")))


def test_two_launched_workers_train(procs, tmp_path):
    code, out = procs.tfdist("launch", "--workers", "2", "--", sys.executable, "-m", "tfdist", *TRAIN,
                             "--output-dir", str(tmp_path), timeout=500)
    assert code == 0, out[-4000:]
    assert "multi_worker_mirrored" in out and f"step {STEPS}/{STEPS}" in out, out[-4000:]
