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


_XLA_ON_TWO_CPUS = """
import json, logging
import tfdist
devices = tfdist.split_cpu(2)
import tf_keras
from tfdist.data import load_digits

records = []
handler = logging.Handler()
handler.emit = lambda record: records.append(record.getMessage())
logging.getLogger("tfdist").addHandler(handler)

def build():
    model = tf_keras.Sequential([tf_keras.Input((8, 8, 1)), tf_keras.layers.Conv2D(4, 3), tf_keras.layers.Flatten(),
                                 tf_keras.layers.Dense(10)])
    model.compile(tf_keras.optimizers.Adam(0.01), tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=True)
    return model

train, _ = load_digits()
out = {}
for name in ("mirrored", "central_storage"):
    del records[:]
    history = tfdist.fit(build, (train.x, train.y), epochs=1, batch_size=64, strategy=name, devices=devices, seed=1,
                         verbose=0)
    out[name] = {"loss": history.history["loss"], "jit_compile": history.model.jit_compile,
                 "not_applied": [m for m in records if "jit_compile=True is not applied" in m]}
print("RESULT " + json.dumps(out))
"""


@pytest.mark.timeout(300)
def test_jit_compile_under_mirrored_on_cpu_devices_trains_without_xla_and_says_so(procs):
    # tf_keras' own fit compiled the replicas' step with XLA, which placed it on CPU:0: "Trying to access resource
    # .../replica_1/... located in device CPU:1 from device CPU:0", a traceback at the first step.
    from conftest import script_result

    result = script_result(procs, _XLA_ON_TWO_CPUS)
    mirrored, central = result["mirrored"], result["central_storage"]
    assert mirrored["not_applied"] == ["jit_compile=True is not applied to replicas on 2 CPU devices; the steps run "
                                       "without XLA"]
    assert mirrored["jit_compile"] is False and np.isfinite(mirrored["loss"][0])
    # Central storage keeps the variables on one device, where XLA reaches them: it stays on.
    assert central["not_applied"] == [] and central["jit_compile"] is True and np.isfinite(central["loss"][0])
