"""Class weights (Keras' ``class_weight``): every training example weighed by its label's class.

``fit(..., class_weight={0: 1.0, 1: 5.0})`` multiplies each training example's sample weight
(1 where the data has none) by the weight of its class, in the input pipeline: both Kerases,
every strategy and gradient accumulation see the same weights, and a resumed run the same
batches. As in Keras, validation data is not weighed, the model must have one output, and
the label of an example is its class number (shape ``(n,)`` or ``(n, 1)``, rounded) or a
one-hot row (shape ``(n, classes)``, its argmax). Unlike Keras 3, which gives classes left out
of the dict the weight 0 on a dataset and 1 on arrays, a class left out weighs 1 everywhere;
and a ``sample_weight`` in the data is multiplied, as tf_keras does, rather than refused.

The weights are part of the run: the checkpoint records them, and a resume with other weights
is refused unless ``allow_changes``.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from tfdist import _checks
from tfdist.errors import DataError

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

_FIX = "pass a dict of class number to weight, e.g. class_weight={0: 1.0, 1: 5.0}"


@dataclasses.dataclass(frozen=True)
class ClassWeights:
    """Validated class weights: ``weights[c]`` for the classes given, 1 for any other class."""

    weights: Mapping[int, float]

    def __post_init__(self):
        if not isinstance(self.weights, Mapping) or not self.weights:
            raise DataError(f"Invalid `class_weight`; received class_weight={self.weights!r}. Fix: {_FIX}.")
        for key, value in self.weights.items():
            if not _checks.is_int(key) or key < 0:
                raise DataError(f"Invalid class number in `class_weight`; received key {key!r}. Fix: use integers "
                                f">= 0 (the class numbers of the labels) as keys; {_FIX}.")
            if not _checks.is_number(value) or value < 0:
                raise DataError(f"Invalid weight of class {key} in `class_weight`; received {value!r}. "
                                "Fix: use a finite number >= 0.")
        object.__setattr__(self, "weights", {int(k): float(v) for k, v in sorted(self.weights.items())})

    @classmethod
    def of(cls, value: Any) -> "ClassWeights | None":
        """``value`` (a dict, a ``ClassWeights`` or None) validated."""
        if value is None or isinstance(value, cls):
            return value
        return cls(value)

    def record(self) -> dict[str, float]:
        """The weights as JSON keeps them (string keys), for the checkpoint's metadata."""
        return {str(k): v for k, v in self.weights.items()}

    def table(self) -> np.ndarray:
        """``table[c]``: the weight of class ``c`` for ``c`` up to the largest class given."""
        table = np.ones(max(self.weights) + 1, np.float32)
        for key, value in self.weights.items():
            table[key] = value
        return table

    def check_labels(self, sample: tuple, *, source_name: str = "the data") -> None:
        """Refuses labels ``weigh`` cannot map to one class per example; ``sample`` is
        ``source.sample(n)``: ``(x, y)`` or ``(x, y, sample_weight)``, batched."""
        if not isinstance(sample, tuple) or len(sample) < 2:
            raise DataError(f"`class_weight` weighs examples by their labels; received data without labels "
                            f"({source_name}). Fix: pass (x, y), or leave class_weight out.")
        y = sample[1]
        if isinstance(y, (dict, list, tuple)):
            raise DataError(
                f"`class_weight` needs a model with one output; received labels that are "
                f"{'a dict' if isinstance(y, dict) else 'a list or tuple'} of arrays in {source_name}. "
                "Fix: pass one label array, or weigh the examples with a sample_weight instead."
            )
        _label_kind(np.shape(y), np.asarray(y).dtype, source_name=source_name)

    def weigh(self, *element: "tf.Tensor") -> tuple:
        """``(x, y[, sample_weight]) -> (x, y, sample_weight * class weight of y)`` for ``Dataset.map``."""
        import tensorflow as tf

        x, y = element[0], element[1]
        kind = _label_kind(tuple(y.shape), y.dtype.as_numpy_dtype, source_name="the training batches")
        if kind == "one-hot":
            classes = tf.argmax(y, axis=-1, output_type=tf.int32)
        else:
            labels = tf.reshape(y, [-1]) if kind == "column" else y
            classes = tf.cast(tf.round(labels) if labels.dtype.is_floating else labels, tf.int32)
        values = self.table()
        table = tf.constant(values)
        known = (classes >= 0) & (classes < len(values))
        weights = tf.where(known, tf.gather(table, tf.clip_by_value(classes, 0, len(values) - 1)), 1.0)
        if len(element) < 3:
            return x, y, weights
        sample_weight = element[2]
        weights = tf.reshape(weights, tf.concat([tf.shape(weights), tf.ones([sample_weight.shape.rank - 1], tf.int32)], 0))
        return x, y, sample_weight * tf.cast(weights, sample_weight.dtype)


def _label_kind(shape: tuple, dtype, *, source_name: str) -> str:
    """How a batch of labels names its classes: ``numbers`` (n,), ``column`` (n, 1), ``one-hot`` (n, classes)."""
    if len(shape) == 1:
        return "numbers"
    if len(shape) == 2 and shape[1] == 1:
        return "column"
    if len(shape) == 2 and np.issubdtype(np.dtype(dtype), np.floating):
        return "one-hot"
    raise DataError(
        f"`class_weight` needs one class per example: labels of shape (n,) or (n, 1) (class numbers) or (n, classes) "
        f"(one-hot floats); received labels of shape {_with_n(shape)} and dtype {np.dtype(dtype).name} in {source_name}. "
        "Fix: weigh the examples with a sample_weight instead (e.g. per time step), or leave class_weight out."
    )


def _with_n(shape: tuple) -> str:
    """``(n, 3)`` for a batch of labels of shape ``(batch, 3)``."""
    return "(" + ", ".join(["n", *(str(d) for d in shape[1:])]) + ("," if len(shape) == 1 else "") + ")"
