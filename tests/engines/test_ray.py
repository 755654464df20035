"""docs/ray.md's recipe on a local Ray cluster: 2 workers of Ray Train's TensorflowTrainer run
``tfdist.fit``; one is killed after a save, Ray restarts the group, and fit resumes at that step
and ends bit-identical to the same run uninterrupted (on the same Ray cluster, before it).
Skipped, with the reason, where Ray is not installed (``pip install tfdist[ray]``)."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import sys

import pytest

from conftest import assert_bit_identical, base_env, checkpoint_tensors

RECIPE = pathlib.Path(__file__).resolve().parent / "_ray_fit.py"


@pytest.mark.timeout(600)
def test_a_worker_killed_under_ray_train_is_restarted_by_ray_and_resumes_at_the_saved_step(procs, tmp_path):
    if importlib.util.find_spec("ray") is None or importlib.util.find_spec("ray.train") is None:
        pytest.skip("Ray Train is not installed: pip install 'tfdist[ray]'")
    reference, run_dir = tmp_path / "uninterrupted", tmp_path / "run"
    reference.mkdir()
    run_dir.mkdir()
    # First the run uninterrupted; then, on the same Ray cluster, worker:1 kills itself (SIGKILL)
    # right after the save at step 10: Ray sees its actor die.
    code, out = procs.run([sys.executable, str(RECIPE), str(reference), "", str(run_dir), "worker:1/kill_after_save:10"],
                          timeout=540, env=base_env(RAY_DEDUP_LOGS="0"))
    assert code == 0, out[-4000:]
    assert out.count("kill_after_save at step 10: sending SIGKILL to itself") == 1, out[-4000:]
    done = {"strategy": "multi_worker_mirrored", "num_workers": 2, "global_step": 40}
    for directory, start_step in ((reference, 0), (run_dir, 10)):
        results = [json.loads((directory / f"result-{rank}.json").read_text()) for rank in (0, 1)]
        assert results == [{**done, "start_step": start_step}] * 2
    assert_bit_identical(checkpoint_tensors(str(run_dir)), checkpoint_tensors(str(reference)))
