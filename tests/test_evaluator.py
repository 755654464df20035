"""The sidecar evaluator evaluates each new checkpoint and stops after the run's complete one."""

import glob

import numpy as np
import pytest

import tfdist
from tfdist.training.evaluator import run_sidecar


def _tiny():
    import tf_keras

    model = tf_keras.Sequential([tf_keras.Input((5,)), tf_keras.layers.Dense(8, activation="relu"),
                                 tf_keras.layers.Dense(2)])
    model.compile("adam", tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def test_evaluates_the_newest_checkpoint_writes_tensorboard_and_stops_at_the_complete_one(tmp_path):
    rng = np.random.RandomState(0)
    x = rng.rand(200, 5).astype(np.float32)
    y = (x[:, 0] > 0.5).astype(np.int64)
    tfdist.fit(_tiny, (x, y), epochs=2, batch_size=20, strategy="one_device", seed=0, verbose=0,
               checkpoint_dir=str(tmp_path / "ckpt"), save_every_steps=5)
    results = run_sidecar(_tiny, (x, y), checkpoint_dir=str(tmp_path / "ckpt"), log_dir=str(tmp_path / "eval"),
                          poll_seconds=0.1, max_idle_seconds=30)
    assert results and results[-1]["global_step"] == 20  # the complete checkpoint ends the watch
    assert 0.0 <= results[-1]["accuracy"] <= 1.0 and np.isfinite(results[-1]["loss"])
    assert glob.glob(str(tmp_path / "eval" / "events.out.tfevents.*"))


def test_stops_when_no_checkpoint_appears(tmp_path):
    results = run_sidecar(_tiny, (np.zeros((4, 5), np.float32), np.zeros(4, np.int64)),
                          checkpoint_dir=str(tmp_path / "none"), log_dir=None, poll_seconds=0.05, max_idle_seconds=0.3)
    assert results == []


def eval_steps(log_dir):
    import tensorflow as tf

    steps = []
    for path in sorted(glob.glob(str(log_dir / "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            steps += [event.step for value in event.summary.value if value.tag == "eval/loss"]
    return steps


@pytest.mark.timeout(120)
def test_an_evaluator_started_again_skips_the_checkpoints_it_evaluated_and_scores_one_saved_again(tmp_path):
    rng = np.random.RandomState(0)
    x = rng.rand(200, 5).astype(np.float32)
    y = (x[:, 0] > 0.5).astype(np.int64)
    ckpt, eval_dir = tmp_path / "ckpt", tmp_path / "eval"
    tfdist.fit(_tiny, (x, y), epochs=1, batch_size=20, strategy="one_device", seed=0, verbose=0,
               checkpoint_dir=str(ckpt), save_every_steps=5)  # complete at step 10
    first = run_sidecar(_tiny, (x, y), checkpoint_dir=str(ckpt), log_dir=str(eval_dir),
                        poll_seconds=0.05, max_idle_seconds=0.3)
    assert [r["global_step"] for r in first] == [10]
    # The cluster restarts: the evaluator starts again on the same checkpoints, and since the run's
    # complete one was evaluated, it stops at once (it waited for a checkpoint that never comes).
    again = run_sidecar(_tiny, (x, y), checkpoint_dir=str(ckpt), log_dir=str(eval_dir),
                        poll_seconds=0.05, max_idle_seconds=600)
    assert again == []
    assert eval_steps(eval_dir) == [10]
    # A checkpoint written again under the same name (a new run in the directory) is new.
    from tfdist.checkpoint import layout

    path = layout.checkpoint_paths(str(ckpt))[-1]
    metadata = layout.read_metadata(path)
    layout.write_metadata(path, layout.Metadata(dict(metadata.raw, saved_at=metadata.saved_at + 1)))
    third = run_sidecar(_tiny, (x, y), checkpoint_dir=str(ckpt), log_dir=str(eval_dir),
                        poll_seconds=0.05, max_idle_seconds=0.3)
    assert [r["global_step"] for r in third] == [10]
