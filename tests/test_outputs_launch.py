"""A run's outputs under a 2-worker `tfdist launch` with an evaluator, the chief SIGKILLed once:
one SavedModel that serves the model's outputs, one MLflow run with every epoch once, one
profile, a chief_only callback's lines from the chief alone, and the evaluator task of a Python
``fit`` job scoring the checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import base_env
from test_evaluator import eval_steps
from test_profile import profiles
from test_tracking import SCRIPT, check_one_run_every_epoch_once

pytest.importorskip("mlflow", reason="MLflow tracking needs the mlflow package (pip install 'tfdist[mlflow]')")


@pytest.mark.timeout(400)
def test_a_python_fit_job_of_two_workers_killed_and_resumed_writes_each_output_once(tmp_path, procs):
    import tensorflow as tf

    out = procs.launch_script(tmp_path / "train.py", SCRIPT, tmp_path,
                              cluster=["--workers", "2", "--evaluator", "--max-restarts", "1", "--grace", "5"],
                              env=base_env(TFDIST_FAULT="worker:0/kill_at_step:7"), timeout=360)
    assert "kill_at_step at step 7" in out  # the chief died once; the cluster was restarted and resumed
    check_one_run_every_epoch_once(tmp_path, strategy="multi_worker_mirrored", num_workers=2)
    # The chief_only callback wrote from the chief alone, its count restored on resume.
    lines = [line.split() for line in (tmp_path / "epochs.txt").read_text().splitlines()]
    assert lines == [["worker:0", "0", "1"], ["worker:0", "1", "2"], ["worker:0", "2", "3"]]
    assert len(profiles(tmp_path / "tb")) == 1  # steps 2-3, before the kill; the resumed run is past them
    assert sorted(p.name for p in (tmp_path / "serving").iterdir()) == ["1"]
    signature = tf.saved_model.load(str(tmp_path / "serving" / "1")).signatures["serving_default"]
    (name,) = signature.structured_input_signature[1]
    x = np.random.RandomState(0).rand(192, 6).astype("float32")[:16]
    (served,) = signature(**{name: tf.constant(x)}).values()
    np.testing.assert_allclose(served.numpy(), np.load(tmp_path / "outputs.npy"), rtol=1e-5, atol=1e-5)
    assert 12 in eval_steps(tmp_path / "tb" / "eval")  # the evaluator task scored the complete checkpoint
