"""``fit(checkpoint_options=..., strategy_options=...)``: the options classes reach the run, a
value given twice differently is refused, and a keyword that moved into a class names it."""

from __future__ import annotations

import os

import numpy as np
import pytest

import tfdist
from tfdist import CheckpointOptions, StrategyOptions
from tfdist.errors import CheckpointError, StrategyError
from tfdist.training import run

X = np.random.RandomState(0).rand(40, 4).astype(np.float32)
Y = (X[:, 0] > 0.5).astype(np.int64)


def build():
    import keras

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _fit(**kwargs):
    options = dict(epochs=1, batch_size=10, strategy="one_device", seed=0, verbose=0)
    return tfdist.fit(build, (X, Y), **{**options, **kwargs})


@pytest.mark.parametrize("name", sorted(run._MOVED))
def test_a_keyword_that_moved_into_an_options_class_names_the_class_and_its_fix_works(name):
    value = {"keep": 5, "resume": False, "async_save": False, "allow_changes": True, "all_reduce": "ring",
             "bytes_per_pack": 1024}.get(name, 30.0)
    with pytest.raises(TypeError) as raised:
        _fit(**{name: value})
    message = str(raised.value)
    assert "\n" not in message and f"received {name}={value!r}" in message
    argument, fix = message.split("Fix: pass ")[1].rstrip(".").split("=", 1)
    options = eval(fix, {"tfdist": tfdist})  # the fix, as written, makes the options
    assert argument == run._MOVED[name][0] and getattr(options, name) == value


def test_several_moved_keywords_get_one_fix_per_class_and_an_unknown_one_is_named():
    with pytest.raises(TypeError, match=r"received keep=5, all_reduce='ring', async_save=False\. Fix: pass "
                                        r"checkpoint_options=tfdist\.CheckpointOptions\(keep=5, async_save=False\) and "
                                        r"strategy_options=tfdist\.StrategyOptions\(all_reduce='ring'\)\.$"):
        _fit(keep=5, all_reduce="ring", async_save=False)
    with pytest.raises(TypeError, match=r"^fit\(\) got an unexpected keyword argument 'epoch'\. Fix: see "
                                        r"help\(tfdist\.fit\)"):
        _fit(epoch=2)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(checkpoint_dir="a", checkpoint_options=CheckpointOptions(directory="b")), CheckpointError,
     r"`checkpoint_dir` and `checkpoint_options.directory` differ; received checkpoint_dir='a' and "
     r"checkpoint_options.directory='b'\. Fix:"),
    (dict(checkpoint_options=CheckpointOptions(keep=2)), CheckpointError,
     r"checkpoint_options was given without a directory.*Fix: pass checkpoint_dir=DIR"),
    (dict(checkpoint_dir="a", save_every_steps=3, checkpoint_options=CheckpointOptions(save_every_steps=4)),
     CheckpointError, r"`save_every_steps` and `checkpoint_options.save_every_steps` differ"),
    (dict(checkpoint_dir="a", checkpoint_options={"keep": 2}), CheckpointError,
     r"Invalid `checkpoint_options`; received dict\. Fix: pass tfdist\.CheckpointOptions"),
    (dict(devices=["/cpu:0"], strategy_options=StrategyOptions(devices=["/cpu:1"])), StrategyError,
     r"`devices` and `strategy_options.devices` differ"),
    (dict(strategy_options="ring"), StrategyError, r"Invalid `strategy_options`; received str"),
    (dict(devices="/cpu:0"), StrategyError, r"Invalid `devices`; received devices='/cpu:0'"),
])
def test_options_given_twice_differently_or_of_the_wrong_type_are_refused_before_training(tmp_path, monkeypatch,
                                                                                         kwargs, error, match):
    monkeypatch.chdir(tmp_path)  # nothing may be created for the relative directories above
    with pytest.raises(error, match=match) as raised:
        _fit(**kwargs)
    assert "\n" not in str(raised.value) and os.listdir(tmp_path) == []


@pytest.mark.parametrize("kwargs, match", [
    (dict(keep=0), r"Invalid `keep`"),
    (dict(async_save="no"), r"Invalid `async_save`; received async_save='no'\. Fix: pass True or False\."),
    (dict(directory=""), r"Invalid `checkpoint_dir`"),
    (dict(save_every_seconds=-1), r"save_every_seconds"),
])
def test_checkpoint_options_check_their_values_when_made(kwargs, match):
    with pytest.raises(CheckpointError, match=match):
        CheckpointOptions(**kwargs)


def test_checkpoint_options_reach_the_run_with_the_directory_given_either_way(tmp_path):
    from tfdist.checkpoint import layout

    first = str(tmp_path / "first")
    options = CheckpointOptions(directory=first, keep=1, async_save=False)
    history = _fit(save_every_steps=1, checkpoint_options=options)
    assert history.tfdist.checkpoint_dir == first
    assert [os.path.basename(p) for p in layout.checkpoint_paths(first)] == ["ckpt-4"]  # keep=1
    # The same directory given to fit and in the options; resume=False then refuses its checkpoints.
    with pytest.raises(CheckpointError, match=r"resume=False was given but .* holds 1 checkpoint"):
        _fit(checkpoint_dir=first, checkpoint_options=CheckpointOptions(directory=first, resume=False))


def test_strategy_options_reach_make_strategy_with_fits_devices(monkeypatch):
    received = {}

    class Stop(Exception):
        pass

    def make_strategy(name, **kwargs):
        received.update(kwargs, name=name)
        raise Stop()

    monkeypatch.setattr(run.strategy_mod, "make_strategy", make_strategy)
    with pytest.raises(Stop):
        _fit(strategy="mirrored", devices=["/cpu:0"],
             strategy_options=StrategyOptions(all_reduce="reduce_to_one", collective_timeout=9, startup_timeout=7))
    assert received["name"] == "mirrored" and received["devices"] == ("/cpu:0",)
    assert (received["all_reduce"], received["bytes_per_pack"]) == ("reduce_to_one", 0)
    assert (received["collective_timeout"], received["startup_timeout"]) == (9, 7)
