"""The model as a checkpoint sees it: its state, without the functions Keras attaches to it.

Reaches TensorFlow's private object-graph protocol: ``tf.__internal__.tracking.Trackable``,
its ``_trackable_children`` and ``_lookup_dependency``. No public API lets a checkpoint leave
some of an object's children out. Checked on TensorFlow 2.17.1 and 2.21.0.

Keras tracks the functions it compiles as children of the model that runs them --
``predict_function`` at the first ``predict`` (Keras 3 and tf_keras), ``test_function`` at
the first validation (tf_keras) -- and it creates them when first needed, in the middle of a
run, for a nested model too (a callback calling ``encoder.predict``). TensorFlow's
asynchronous save walks the object graph in its writer thread. A function attached between
the walk's listing of the model's children and its numbering of them fails the save with a
``KeyError``. Functions hold no values, so the checkpoint leaves them out. Its graph then only
changes when state is created, which the adapters do before the first save.

The variables' names and the object paths of everything else are those the model itself
gives; checkpoints written before (with the functions' empty nodes) restore unchanged. Not
seen through: a model held by a layer that is not a model (``TimeDistributed(encoder)``); a
``predict`` of such an inner model during a save can still fail that save.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from tfdist._compat import missing

# The Trackable methods through which an object holds values of its own. An object whose class
# overrides one is saved as it is: a view forwards children only.
_OWN_VALUES = ("_serialize_to_tensors", "_restore_from_tensors", "_gather_saveables_for_checkpoint",
               "_copy_trackable_to_cpu")


def model_state(model: Any) -> Any:
    """What a checkpoint tracks for ``model``: a view of its children without functions, or the
    model itself if its class keeps values of its own (a view could not save them). The Keras
    models nested in it, directly or in lists and dicts, are seen the same way."""
    return _Views().of(model)


class _Views:
    """One view per object: the object graph has one node per object (a model reached by two
    names stays one node). Made by whichever thread walks the graph first, under a lock."""

    def __init__(self):
        self._lock = threading.Lock()
        self._made: dict[int, tuple[Any, Any]] = {}  # id(obj) -> (obj, its view); obj kept alive

    def of(self, obj: Any) -> Any:
        if not _may_hold_functions(obj):
            return obj
        with self._lock:
            if id(obj) not in self._made:
                self._made[id(obj)] = (obj, _view_class()(obj, self))
            return self._made[id(obj)][1]


@functools.cache
def _tracking() -> Any:
    """TensorFlow's ``tf.__internal__.tracking`` namespace, with the parts used here checked."""
    import tensorflow as tf

    tracking = getattr(getattr(tf, "__internal__", None), "tracking", None)
    for name in ("Trackable", "TrackableDataStructure"):
        if getattr(tracking, name, None) is None:
            raise missing("tracking.model_state", f"tf.__internal__.tracking.{name}")
    for name in ("_trackable_children", "_lookup_dependency", *_OWN_VALUES):
        if not hasattr(tracking.Trackable, name):
            raise missing("tracking.model_state", f"Trackable.{name}")
    return tracking


def _may_hold_functions(obj: Any) -> bool:
    """A Keras model, or a list or dict of a model's that may hold one, without values of its own.
    Layers and everything else are left as they are: tfdist's root reaches metrics (layers, in
    tf_keras) by another path too, and two objects for one node would warn at restore."""
    tracking = _tracking()
    container = isinstance(obj, tracking.TrackableDataStructure)
    if not (container or callable(getattr(type(obj), "make_predict_function", None))):
        return False
    base = tracking.Trackable
    return all(getattr(type(obj), name, None) is getattr(base, name) for name in _OWN_VALUES)


@functools.cache
def _view_class() -> type:
    import tensorflow as tf

    functions = (tf.types.experimental.PolymorphicFunction, tf.types.experimental.ConcreteFunction)

    class StateView(_tracking().Trackable):
        """An object's checkpoint children, functions left out; restores go to its own
        objects (the view has no values and no dependencies of its own)."""

        def __init__(self, obj, views: _Views):
            self._obj, self._views = obj, views

        def _trackable_children(self, save_type="checkpoint", **kwargs):
            children = self._obj._trackable_children(save_type, **kwargs)
            return {name: self._views.of(child) for name, child in children.items() if not isinstance(child, functions)}

        def _lookup_dependency(self, name, cached_dependencies=None):
            child = self._obj._lookup_dependency(name, cached_dependencies)
            return None if isinstance(child, functions) else self._views.of(child)

    return StateView
