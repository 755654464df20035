"""The model as a checkpoint sees it: its state, without the functions Keras attaches to it.

Keras tracks the functions it compiles as children of the model -- ``predict_function`` at
the first ``predict`` (Keras 3 and tf_keras), ``test_function`` at the first validation
(tf_keras) -- and it creates them when first needed, in the middle of a run. TensorFlow's
asynchronous save walks the object graph in its writer thread: a function attached between
the walk's listing of the model's children and its numbering of them made the save fail
with a ``KeyError`` (seen in CI: a validation at an epoch's end while the save of a step
was being written). Functions hold no values, so the checkpoint leaves them out: its graph
then only changes when state is created, which the adapters do before the first save.

The variables' names and the object paths of everything else are those of
``tf.train.Checkpoint(model=model)``; checkpoints written before (with the functions' empty
nodes) restore unchanged.
"""

from __future__ import annotations

import functools
from typing import Any

# The Trackable methods through which an object holds values of its own. A model class that
# overrides one is saved as it is: the view forwards children only.
_OWN_VALUES = ("_serialize_to_tensors", "_restore_from_tensors", "_gather_saveables_for_checkpoint",
               "_copy_trackable_to_cpu")


def model_state(model: Any) -> Any:
    """What a checkpoint tracks for ``model``: a view of its children without functions, or
    the model itself if its class keeps values of its own (the view could not save them)."""
    import tensorflow as tf

    base = tf.__internal__.tracking.Trackable
    if any(getattr(type(model), name, None) is not getattr(base, name) for name in _OWN_VALUES):
        return model
    return _view_class()(model)


@functools.cache
def _view_class() -> type:
    import tensorflow as tf

    functions = (tf.types.experimental.PolymorphicFunction, tf.types.experimental.ConcreteFunction)

    class ModelState(tf.__internal__.tracking.Trackable):
        """The model's checkpoint children, functions left out; restores go to the model's
        own objects (the view has no values and no dependencies of its own)."""

        def __init__(self, model):
            self._model = model

        def _trackable_children(self, save_type="checkpoint", **kwargs):
            children = self._model._trackable_children(save_type, **kwargs)
            return {name: child for name, child in children.items() if not isinstance(child, functions)}

        def _lookup_dependency(self, name, cached_dependencies=None):
            child = self._model._lookup_dependency(name, cached_dependencies)
            return None if isinstance(child, functions) else child

    return ModelState
