"""TFRecord files under 2-worker multi_worker_mirrored (real processes): each worker reads its own stream, a killed
worker is recovered bit-identically, and validation metrics equal a one-device evaluation of the same weights."""

import sys

import pytest

from conftest import SIGKILL_DRILL_GRACE, assert_bit_identical, base_env, checkpoint_tensors
from test_data_files import write_digits

TRAIN = ["train", "--model", "cnn", "--epochs", "2", "--steps-per-epoch", "8", "--per-replica-batch-size", "16",
         "--seed", "1", "--deterministic", "--save-every-steps", "4", "--verbose", "0"]


def _launch(procs, out_dir, digits, fault=None):
    environ = base_env(**({"TFDIST_FAULT": fault} if fault else {}))
    return procs.tfdist(
        "launch", "--workers", "2", "--max-restarts", "2", *SIGKILL_DRILL_GRACE, "--",
        sys.executable, "-m", "tfdist", *TRAIN, "--data", digits["train"], "--features", digits["features"],
        "--validation-data", digits["validation"], "--output-dir", str(out_dir), timeout=400, env=environ,
    )


@pytest.mark.timeout(900)
def test_two_workers_read_their_own_streams_resume_bit_identically_and_validate_the_whole_set(procs, tmp_path):
    from tfdist import data, models
    from tfdist.checkpoint.layout import latest_metadata
    from tfdist.training.evaluator import run_sidecar

    digits = write_digits(tmp_path / "digits")
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    code, out = _launch(procs, reference, digits)
    assert code == 0, out[-4000:]
    # Each worker reads the stream of its one replica, and nothing else.
    assert "[worker:0] tfdist: input pipeline 0 of 2 reads stream(s) 0 of 2" in out
    assert "[worker:1] tfdist: input pipeline 1 of 2 reads stream(s) 1 of 2" in out

    code, out = _launch(procs, killed, digits, fault="worker:1/kill_at_step:11")
    assert code == 0, out[-4000:]
    assert "kill_at_step at step 11" in out and "(restart 1)" in out
    assert_bit_identical(checkpoint_tensors(str(reference / "checkpoints")), checkpoint_tensors(str(killed / "checkpoints")))
    history = latest_metadata(str(reference / "checkpoints")).history
    assert latest_metadata(str(killed / "checkpoints")).history == history

    # The workers each evaluated half of the validation files; one process evaluating all of it
    # with the final weights finds the same loss and accuracy.
    validation, _ = data.load(digits["validation"], features=digits["features"])
    builder = models.builder("cnn", input_shape=(8, 8, 1), num_classes=10, learning_rate=2e-3)
    (result,) = run_sidecar(builder, validation, checkpoint_dir=str(reference / "checkpoints"), log_dir=None,
                            batch_size=32, poll_seconds=0.1, max_idle_seconds=5)
    assert result["global_step"] == 16
    assert result["loss"] == pytest.approx(history[-1]["val_loss"], rel=1e-5)
    assert result["accuracy"] == pytest.approx(history[-1]["val_accuracy"], abs=1e-6)
