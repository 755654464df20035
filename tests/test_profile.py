"""fit(profile_steps=...): a TensorBoard profile of the chosen steps, written once, by the chief.

The same under a 2-worker launch (tfdist train --profile-steps too): tests/test_outputs_launch.py."""

from __future__ import annotations

import numpy as np
import pytest

import tfdist
from tfdist.errors import ModelError


def profiles(log_dir) -> list:
    """The profile files under LOG_DIR/train/plugins/profile (one folder per profiling session)."""
    return sorted(p for p in (log_dir / "train" / "plugins" / "profile").glob("*/*") if p.is_file())


def _build():
    import keras

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(2)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_a_profile_of_the_chosen_steps_is_written_once_into_the_tensorboard_log_dir(tmp_path):
    import keras

    rng = np.random.RandomState(0)
    data = (rng.rand(64, 4).astype(np.float32), rng.randint(0, 2, 64))
    board = keras.callbacks.TensorBoard(str(tmp_path / "tb"))
    tfdist.fit(_build, data, epochs=2, batch_size=16, seed=0, verbose=0, strategy="one_device", callbacks=[board],
               profile_steps=(3, 6))  # across the end of epoch 0 (4 steps an epoch)
    (written,) = profiles(tmp_path / "tb")
    assert written.name.endswith(".xplane.pb") and written.stat().st_size > 0


def test_profile_steps_that_cannot_be_profiled_are_refused_in_one_line_with_the_fix():
    data = (np.zeros((8, 4), np.float32), np.zeros(8, np.int64))
    for bad in ((0, 3), (5, 2), "10,20", (1, 2, 3)):
        with pytest.raises(ModelError, match=r"Invalid `profile_steps`; received profile_steps=.*Fix: pass the first"):
            tfdist.fit(_build, data, epochs=1, batch_size=4, verbose=0, profile_steps=bad)
    with pytest.raises(ModelError, match=r"writes a TensorBoard profile into the log directory of a TensorBoard "
                                         r"callback; received none in callbacks\. Fix: add "
                                         r"keras\.callbacks\.TensorBoard"):
        tfdist.fit(_build, data, epochs=1, batch_size=4, verbose=0, strategy="one_device", profile_steps=2)
