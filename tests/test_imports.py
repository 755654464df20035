"""when_imported runs its work after a package's import; fit leaves tf_keras unimported for a
Keras 3 model and seeds it as before when it is imported later."""

from __future__ import annotations

import importlib
import json
import sys

import numpy as np
import pytest

from conftest import base_env
from tfdist._imports import when_imported


@pytest.fixture
def package(tmp_path, monkeypatch):
    """The name of a package on sys.path that nothing has imported."""
    (tmp_path / "waited_for").mkdir()
    (tmp_path / "waited_for" / "__init__.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "waited_for"
    sys.modules.pop("waited_for", None)


def test_work_on_an_imported_package_runs_at_once():
    seen = []
    when_imported("json", seen.append)
    assert seen == [json]


def test_work_waits_for_the_import_and_runs_once_before_the_importer_gets_the_module(package):
    seen = []
    when_imported(package, lambda module: seen.append(module.VALUE))
    when_imported(package, lambda module: setattr(module, "VALUE", 2))
    assert seen == []
    module = importlib.import_module(package)
    assert seen == [1] and module.VALUE == 2
    sys.modules.pop(package)
    module = importlib.import_module(package)  # imported again: the work is not done twice
    assert seen == [1] and module.VALUE == 1


def test_an_error_in_the_work_reaches_the_importer(package):
    def fail(module):
        raise RuntimeError("prepared wrongly")

    when_imported(package, fail)
    with pytest.raises(RuntimeError, match="prepared wrongly"):
        importlib.import_module(package)


_SEEDED = """
import json, random
{first}
from tfdist.training import model
model.set_seed(7)
random.random()  # another draw from Python's generator: tf_keras' own generator is not it
import tf_keras
layer = tf_keras.layers.Dense(3)
layer.build((None, 4))
print(json.dumps(layer.kernel.numpy().tolist()))
"""


def test_tf_keras_imported_after_the_seed_draws_what_it_draws_when_imported_before(procs):
    kernels = []
    for first in ("import tf_keras", ""):
        code, out = procs.run([sys.executable, "-c", _SEEDED.format(first=first)], timeout=120, env=base_env())
        assert code == 0, out[-3000:]
        kernels.append(json.loads(out.strip().splitlines()[-1]))
    np.testing.assert_array_equal(kernels[0], kernels[1])


_KERAS3_FIT = """
import sys
import keras, numpy as np, tfdist

def build():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    return model

tfdist.fit(build, np.ones((16, 4), "float32"), np.ones((16, 2), "float32"), epochs=1, batch_size=8, seed=1,
           verbose=0)
print("tf_keras imported:", "tf_keras" in sys.modules)
"""


def test_a_keras3_fit_does_not_import_tf_keras(procs):
    code, out = procs.run([sys.executable, "-c", _KERAS3_FIT], timeout=120, env=base_env())
    assert code == 0, out[-3000:]
    assert "tf_keras imported: False" in out
