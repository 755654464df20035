"""docs/ray.md's recipe: ``tfdist.fit`` in every worker of Ray Train's ``TensorflowTrainer``.

Run as ``python _ray_fit.py CHECKPOINT_DIR TFDIST_FAULT [CHECKPOINT_DIR TFDIST_FAULT ...]``:
one training run a pair, one after the other on one local Ray cluster (an empty
``TFDIST_FAULT`` for none). Each worker writes what its fit returned to
``CHECKPOINT_DIR/result-RANK.json``.
"""

import tfdist  # noqa: I001 -- first: a preemption signal from here on exits 75

import json
import os
import sys

import ray
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.tensorflow import TensorflowTrainer


def train(config):
    """Every Ray worker runs this. Ray wrote its TF_CONFIG: tfdist.fit trains under multi_worker_mirrored."""
    import ray.train
    from tfdist.models import builder

    os.environ.update(config["env"])
    history = tfdist.fit(builder("linear", input_shape=(8, 8, 1), num_classes=10), "digits", epochs=2,
                         steps_per_epoch=20, batch_size=32, seed=1, checkpoint_dir=config["checkpoint_dir"],
                         save_every_steps=5, checkpoint_options=tfdist.CheckpointOptions(async_save=False), verbose=0)
    s = history.tfdist
    rank = ray.train.get_context().get_world_rank()
    with open(os.path.join(config["checkpoint_dir"], f"result-{rank}.json"), "w") as f:
        json.dump({"strategy": s.strategy, "num_workers": s.num_workers, "start_step": s.start_step,
                   "global_step": s.global_step}, f)


def main(*runs: str) -> None:
    ray.init(num_cpus=2, include_dashboard=False)
    for checkpoint_dir, fault in zip(runs[::2], runs[1::2]):
        trainer = TensorflowTrainer(
            train,
            # Set in every run: a worker process Ray reuses keeps no fault of the run before.
            train_loop_config={"checkpoint_dir": checkpoint_dir, "env": {"TFDIST_FAULT": fault}},
            scaling_config=ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={"CPU": 1}),
            # A worker that dies restarts the whole group once; each fit resumes from checkpoint_dir.
            run_config=RunConfig(storage_path=os.path.join(checkpoint_dir, "ray"),
                                 failure_config=FailureConfig(max_failures=1)),
        )
        trainer.fit()


if __name__ == "__main__":
    main(*sys.argv[1:])
