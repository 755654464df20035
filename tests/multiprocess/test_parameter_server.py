"""parameter_server in real local processes: a chief, 2 workers and 1 ps, and a preempted restart."""

import sys

import pytest

from conftest import base_env, read_json

TRAIN = ["train", "--model", "cnn", "--epochs", "2", "--steps-per-epoch", "10", "--batch-size", "32", "--seed", "0",
         "--save-every-steps", "5", "--verbose", "0"]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("keras", ["3", "2"])
def test_chief_two_workers_one_ps_train_and_resume_after_preemption(procs, tmp_path, keras):
    def launch(out_dir, fault=None):
        return procs.tfdist(
            "launch", "--workers", "2", "--ps", "1", "--chief", "--max-restarts", "2", "--grace", "10", "--",
            sys.executable, "-m", "tfdist", *TRAIN, "--keras", keras, "--output-dir", str(out_dir),
            "--summary-json", str(out_dir / "summary.json"),
            timeout=400, env=base_env(**({"TFDIST_FAULT": fault} if fault else {})),
        )

    code, out = launch(tmp_path / "run")
    assert code == 0, out[-4000:]
    summary = read_json(tmp_path / "run" / "summary.json")
    assert summary["strategy"] == "parameter_server" and summary["num_workers"] == 2
    assert summary["all_reduce"] is None  # no all-reduce: variables live on the ps tasks
    assert summary["global_step"] == 20 and summary["completed"]
    assert "stopping worker:0, worker:1, ps:0" in out

    # The chief is preempted (SIGTERM) at step 12: it saves, exits 75, the cluster restarts and resumes there.
    code, out = launch(tmp_path / "preempted", fault="chief:0/term_at_step:12")
    assert code == 0, out[-4000:]
    assert "exiting with code 75" in out
    resumed = read_json(tmp_path / "preempted" / "summary.json")
    assert resumed["start_step"] == 12 and resumed["global_step"] == 20
