"""The tf_keras side of fit (tfdist/training/keras2.py) where it differs from tf_keras' own behaviour."""

from __future__ import annotations

import numpy as np
import pytest

from tfdist.training import keras2


@pytest.mark.parametrize("race_free", [False, True])
def test_batch_normalization_keeps_a_concurrent_update_of_its_moving_statistics(race_free):
    # On parameter servers another worker updates the moving mean between this worker's read
    # and its write. tf_keras' fused layer (4-D inputs) assigns the new average and writes over
    # that update; the non-fused one subtracts (moving - batch) (1 - m) and keeps it.
    import tf_keras

    model = tf_keras.Sequential([tf_keras.Input((2, 2, 3)), tf_keras.layers.BatchNormalization(momentum=0.9)])
    layer = model.layers[0]
    assert layer.fused
    x = np.arange(24, dtype="float32").reshape(2, 2, 2, 3)

    def another_worker_first(update):
        def wrapped(variable, *args):
            if variable is layer.moving_mean:
                variable.assign_add(np.full(3, 100.0, "float32"))  # after the layer read it for the batch
            return update(variable, *args)
        return wrapped

    layer._assign_new_value = another_worker_first(layer._assign_new_value)  # the fused update
    layer._assign_moving_average = another_worker_first(layer._assign_moving_average)
    if race_free:
        keras2.race_free_moving_statistics(model)
        assert not layer.fused
    layer(x, training=True)
    batch = x.reshape(-1, 3).mean(axis=0)
    expected = 0.9 * 100.0 + 0.1 * batch if race_free else 0.1 * batch
    np.testing.assert_allclose(layer.moving_mean.numpy(), expected, rtol=1e-5)
