"""docs/ray.md's recipe on a local Ray cluster: 2 workers of Ray Train's TensorflowTrainer run
``tfdist.fit``; one is killed after a save, Ray restarts the group, and fit resumes at that step.
Skipped, with the reason, where Ray is not installed (``pip install tfdist[ray]``)."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import sys

import pytest

from conftest import base_env

RECIPE = pathlib.Path(__file__).resolve().parent / "_ray_fit.py"


@pytest.mark.timeout(600)
def test_a_worker_killed_under_ray_train_is_restarted_by_ray_and_resumes_at_the_saved_step(procs, tmp_path):
    if importlib.util.find_spec("ray") is None or importlib.util.find_spec("ray.train") is None:
        pytest.skip("Ray Train is not installed: pip install 'tfdist[ray]'")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # worker:1 kills itself (SIGKILL) right after the save at step 10: Ray sees its actor die.
    code, out = procs.run([sys.executable, str(RECIPE), str(run_dir), "worker:1/kill_after_save:10"], timeout=540,
                          env=base_env(RAY_DEDUP_LOGS="0"))
    assert code == 0, out[-4000:]
    assert "kill_after_save at step 10: sending SIGKILL to itself" in out, out[-4000:]
    results = [json.loads((run_dir / f"result-{rank}.json").read_text()) for rank in (0, 1)]
    assert results == [{"strategy": "multi_worker_mirrored", "num_workers": 2, "start_step": 10, "global_step": 40}] * 2
