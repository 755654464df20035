"""The Keras adapters keep the KerasAdapter Protocol: every method defined, with its signature."""

import inspect

import pytest

from tfdist.training.adapter import KerasAdapter
from tfdist.training.keras2 import TfKeras
from tfdist.training.keras3 import Keras3

ADAPTERS = [Keras3, TfKeras]
METHODS = sorted(name for name, value in vars(KerasAdapter).items()
                 if inspect.isfunction(value) and not name.startswith("_"))


def _shape(function) -> list:
    """A signature without annotations: each parameter's name, kind and default."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


def test_the_protocol_lists_every_method_the_adapters_share():
    shared = set.intersection(*({n for n, v in vars(a).items() if inspect.isfunction(v) and not n.startswith("_")}
                                for a in ADAPTERS))
    assert set(METHODS) == shared
    assert {"check", "prepare", "run", "evaluate", "history"} <= set(METHODS)


def test_every_protocol_method_is_documented():
    assert [name for name in METHODS if not inspect.getdoc(getattr(KerasAdapter, name))] == []


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda a: a.__name__)
def test_an_adapter_defines_every_method_with_the_protocols_signature(adapter):
    for name in METHODS:
        assert name in vars(adapter), f"{adapter.__name__} inherits {name} from the Protocol instead of defining it"
        assert _shape(vars(adapter)[name]) == _shape(getattr(KerasAdapter, name)), name
    assert isinstance(adapter.name, str) and adapter.name


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda a: a.__name__)
def test_an_adapter_made_with_a_strategy_is_a_keras_adapter(adapter):
    import tensorflow as tf

    from tfdist import strategy

    made = adapter(tf.distribute.OneDeviceStrategy("/cpu:0"))
    assert isinstance(made, KerasAdapter)
    assert isinstance(made.strategy, strategy.OneDevice)


def test_the_signature_check_catches_a_renamed_parameter():
    class Renamed:
        def prepare(self, model, *, sample, accumulate: int) -> None:
            pass

    assert _shape(Renamed.prepare) != _shape(KerasAdapter.prepare)
