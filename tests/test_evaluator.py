"""The sidecar evaluator evaluates each new checkpoint and stops after the run's complete one."""

import glob

import numpy as np

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
