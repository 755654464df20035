"""The state of the user's callbacks, saved with every checkpoint and put back on resume.

Keras' stateful callbacks keep their counters in Python: ``ReduceLROnPlateau`` its patience
and best value, ``EarlyStopping`` the same and the best weights, ``ModelCheckpoint`` its best
value and batch count, ``TensorBoard`` the step of its batch summaries. A resumed run that
starts them afresh reduces the learning rate and stops at other epochs than a run never
interrupted. tfdist saves them with each checkpoint and puts them back after the callbacks'
own ``on_train_begin`` (which resets them):

* the callbacks of the registry below (either Keras, a subclass included): their attributes
  go to the checkpoint's metadata (``callbacks``), ``EarlyStopping(restore_best_weights=True)``'s
  best weights to variables of the checkpoint itself (``callbacks/``), written when they change;
* any callback with ``state_dict()`` (a dict of numbers, strings, lists, dicts) and
  ``load_state_dict(state)``, as in Lightning: its own state, besides the registry's.

A ``CSVLogger`` of a resumed run appends to its file instead of starting it again, after taking
off the rows written after the checkpoint it resumes from (the run writes them again).
Callbacks are matched to the saved state by position and class; what does not match starts
afresh, with a warning.

A run resumed mid-epoch calls the callbacks' ``on_epoch_begin`` for that epoch again, and a
callback that sets the learning rate from its current value there -- ``LearningRateScheduler``
with ``lambda epoch, lr: lr * 0.9``, as Keras' own example, or a user's warm-up -- would apply
its change twice: the checkpoint's learning rate already holds it. So the learning rate each
epoch began with (before ``on_epoch_begin``) is saved too; the resumed epoch's callbacks see
that value, and training then goes on with the checkpoint's own.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Sequence

from tfdist._compat import keras_common as keras_compat
from tfdist.errors import ModelError

log = logging.getLogger("tfdist")

__all__ = ["CallbackState", "REGISTRY"]

REGISTRY: dict[str, tuple[str, ...]] = {
    "EarlyStopping": ("wait", "stopped_epoch", "best", "best_epoch"),
    "ReduceLROnPlateau": ("wait", "cooldown_counter", "best"),
    "ModelCheckpoint": ("best", "epochs_since_last_save", "_batches_seen_since_last_saving", "_last_batch_seen",
                        "_current_epoch"),
    "TensorBoard": ("_global_train_batch", "_global_test_batch"),
}
"""Class name of a callback of Keras 3 or tf_keras -> the attributes that hold its state
(an attribute one Keras lacks is skipped)."""

_KERAS_PACKAGES = ("keras", "tf_keras")
_BEST_WEIGHTS = "best_weights"
_EPOCH_BEGIN_LR = "learning_rate_at_epoch_begin"
"""The key of the learning rate the current epoch began with (callbacks' keys hold a colon)."""


def keras_class(callback, names) -> str | None:
    """The name of ``callback``'s nearest base class of either Keras that is one of ``names``."""
    for cls in type(callback).__mro__:
        if cls.__name__ in names and cls.__module__.split(".")[0] in _KERAS_PACKAGES:
            return cls.__name__
    return None


def _registered(callback) -> str | None:
    """The registry's name for ``callback`` (a user's subclass of a registered callback included)."""
    return keras_class(callback, REGISTRY)


def _has_protocol(callback) -> bool:
    return callable(getattr(callback, "state_dict", None)) and callable(getattr(callback, "load_state_dict", None))


def _keeps_best_weights(callback) -> bool:
    return _registered(callback) == "EarlyStopping" and bool(getattr(callback, "restore_best_weights", False))


def learning_rate_variable(optimizer) -> Any:
    """The variable holding ``optimizer``'s learning rate (either Keras, a loss-scale wrapper's
    inner optimizer), or None when it is a schedule or a function (nothing sets it)."""
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)
    for candidate in keras_compat.learning_rate_candidates(optimizer):
        if callable(getattr(candidate, "assign", None)) and callable(getattr(candidate, "numpy", None)):
            return candidate
    return None


def _plain(value: Any, *, where: str) -> Any:
    """``value`` as JSON holds it: NumPy and TensorFlow scalars become Python numbers."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v, where=f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, where=f"{where}[{i}]") for i, v in enumerate(value)]
    numpy = getattr(value, "numpy", None)  # a TensorFlow scalar
    item = getattr(numpy() if callable(numpy) else value, "item", None)
    if callable(item) and getattr(value, "ndim", getattr(value, "shape", None)) in (0, ()):
        return _plain(item(), where=where)
    raise ModelError(
        f"a callback's state must be numbers, strings, lists and dicts to be checkpointed; received "
        f"{type(value).__module__}.{type(value).__name__} at {where}. Fix: return plain values from "
        "state_dict() (arrays as lists), or keep that value out of it."
    )


def _read_csv(path: str) -> str | None:
    """A CSVLogger file's text; None if there is no file yet, or not one CSVLogger wrote."""
    from tfdist import storage

    try:
        return storage.read_text(path)
    except (OSError, UnicodeDecodeError):
        return None


def _drop_rows_from(path: str, text: str, *, separator: str, epoch: int) -> None:
    """Takes off the end of the CSVLogger file ``path`` (its ``text``) the rows of epochs ``epoch``
    and later: the last ones, up to a row of an earlier epoch (rows above it, of another run,
    stay). The file is replaced atomically, and left as it is when there is nothing to take off."""
    import csv

    from tfdist import storage

    lines = text.splitlines(keepends=True)
    keep = len(lines)
    while keep > 1:  # line 0 is the header
        fields = next(csv.reader([lines[keep - 1]], delimiter=separator), [])
        if not fields or not fields[0].strip().isdigit() or int(fields[0]) < epoch:
            break
        keep -= 1
    if keep == len(lines):
        return
    storage.write_atomic(path, "".join(lines[:keep]))
    log.info("CSVLogger(%r): took off %d row(s) of epoch %d on, written after the checkpoint this run resumes "
             "from; the run writes them again", path, len(lines) - keep, epoch)


def _csv_columns(text: str, *, separator: str) -> list[str] | None:
    """The columns after ``epoch`` of the header of a CSVLogger file's ``text``; None without one.
    A resumed CSVLogger takes its columns from the rows of its first epoch, which may have other
    keys than the first run's first epoch (with validation_freq > 1, one validated, the other
    not): it appends under the file's header instead."""
    import csv

    header = text.splitlines()[:1]
    fields = next(csv.reader(header, delimiter=separator), []) if header else []
    return fields[1:] if len(fields) > 1 and fields[0] == "epoch" else None


class CallbackState:
    """The state of ``callbacks`` for one run's checkpoints.

    Args:
      callbacks: the user's callbacks, in the order given to ``fit``.
      model: the built model (its weights' shapes size the best-weights variables).
    """

    def __init__(self, callbacks: Sequence[Any] | None, *, model):
        self._callbacks = list(callbacks or ())
        self._keys = {id(cb): f"{i}:{type(cb).__name__}" for i, cb in enumerate(self._callbacks)}
        self._stateful = [cb for cb in self._callbacks if _registered(cb) or _has_protocol(cb)]
        self.arrays = None
        """A ``tf.Module`` of the best-weights variables, saved in the checkpoint (None if none is needed)."""
        self._slots: dict[str, list] = {}
        self._assigned: dict[str, int] = {}
        keepers = [cb for cb in self._stateful if _keeps_best_weights(cb)]
        if keepers:
            self._make_slots(keepers, model)
        self._saved: dict | None = None
        self._arrays_restored = False
        self._optimizer = getattr(model, "optimizer", None)
        self._epoch_begin_lr: float | None = None
        self._resumed_lr: Any = None
        self._csv_columns: dict[int, list[str]] = {}

    def _make_slots(self, keepers, model) -> None:
        import tensorflow as tf

        self.arrays = tf.Module(name="callbacks")
        with tf.device("/cpu:0"):
            for cb in keepers:
                key = self._keys[id(cb)]
                slot = [tf.Variable(tf.zeros(w.shape, dtype=_dtype(w)), trainable=False) for w in model.weights]
                self._slots[key] = slot
                setattr(self.arrays, _attribute(key), slot)

    # --- before and after the callbacks' on_train_begin ------------------------------------
    def prepare(self, *, resuming: bool, epoch: int = 0) -> None:
        """Before the run's callbacks start: a resumed run's CSVLogger appends to its file, from
        which the rows of ``epoch`` (the one the run resumes in) and later are taken off first:
        they were written after the checkpoint it resumes from, and the run writes them again."""
        if not resuming:
            return
        for cb in self._callbacks:
            if not keras_class(cb, ("CSVLogger",)):
                continue
            if not cb.append:
                cb.append = True
                log.info("CSVLogger(%r) appends to its file in this resumed run", getattr(cb, "filename", "?"))
            path, separator = str(getattr(cb, "filename", "")), getattr(cb, "sep", ",")
            text = _read_csv(path)
            if text is None:
                continue
            _drop_rows_from(path, text, separator=separator, epoch=epoch)
            columns = _csv_columns(text, separator=separator)
            if columns:
                self._csv_columns[id(cb)] = columns

    def resume_from(self, saved: dict | None, *, arrays_restored: bool) -> None:
        """The state a checkpoint recorded (``Metadata.callbacks``), to be put back by :meth:`restore`."""
        self._saved = saved if isinstance(saved, dict) else None
        self._arrays_restored = arrays_restored

    def restore(self) -> None:
        """After the callbacks' ``on_train_begin``: puts the saved state back; checks the
        current state can be saved. A complete run started again calls it without training, so
        its callbacks end as the run left them."""
        self.capture(assign=False)  # a state JSON cannot hold is refused now, not at the first save
        for cb in self._callbacks:  # the columns of the file it appends to (its on_train_begin forgot them)
            if id(cb) in self._csv_columns:
                cb.keys = list(self._csv_columns[id(cb)])
        if self._saved is None:
            return
        unmatched = dict(self._saved)
        unmatched.pop(_EPOCH_BEGIN_LR, None)
        fresh = []
        for cb in self._stateful:
            key = self._keys[id(cb)]
            entry = unmatched.pop(key, None)
            if entry is None:
                fresh.append(key)
                continue
            for name, value in (entry.get("attributes") or {}).items():  # saved only where the class had it
                setattr(cb, name, value)  # also one tf_keras sets in on_train_begin, not called for a complete run
            if "state_dict" in entry and _has_protocol(cb):
                cb.load_state_dict(entry["state_dict"])
            if entry.get(_BEST_WEIGHTS):
                self._restore_best_weights(cb, key)
        changes = ([f"{', '.join(fresh)} start afresh"] if fresh else []) + (
            [f"the saved state of {', '.join(sorted(unmatched))} is not used"] if unmatched else [])
        if changes:
            log.warning("callbacks changed since the checkpoint: %s", "; ".join(changes))

    def _restore_best_weights(self, cb, key: str) -> None:
        if key in self._slots and self._arrays_restored:
            cb.best_weights = [v.numpy() for v in self._slots[key]]
            self._assigned[key] = id(cb.best_weights)
        else:
            log.warning("%s: the best weights saved with the checkpoint could not be read back; restore_best_weights "
                        "restores only best weights seen from now on", key)

    def weights_at_end(self) -> list | None:
        """The weights a complete run's model ended with if not the last step's: the best weights
        of the last ``EarlyStopping(restore_best_weights=True)`` that held some (its ``on_train_end``
        put them into the model), read from the checkpoint; None otherwise."""
        if self._saved is None or not self._arrays_restored:
            return None
        weights = None
        for cb in self._stateful:
            key = self._keys[id(cb)]
            if key in self._slots and (self._saved.get(key) or {}).get(_BEST_WEIGHTS):
                weights = [v.numpy() for v in self._slots[key]]
        return weights

    # --- around the callbacks' on_epoch_begin ----------------------------------------------
    def before_epoch_begin(self, *, resumed_mid_epoch: bool) -> None:
        """Before the callbacks' ``on_epoch_begin``: records the learning rate the epoch begins
        with; in the epoch a run resumes in, puts back the one it began with then."""
        variable = learning_rate_variable(self._optimizer)  # tf_keras' legacy optimizers make it late
        if variable is None:
            return
        saved = (self._saved or {}).get(_EPOCH_BEGIN_LR) if resumed_mid_epoch else None
        if isinstance(saved, (int, float)) and not isinstance(saved, bool):
            self._resumed_lr = variable.numpy()
            variable.assign(saved)
        self._epoch_begin_lr = float(variable.numpy())

    def after_epoch_begin(self) -> None:
        """After the callbacks' ``on_epoch_begin``: the resumed epoch goes on with the checkpoint's learning rate."""
        if self._resumed_lr is not None:
            learning_rate_variable(self._optimizer).assign(self._resumed_lr)
            self._resumed_lr = None

    # --- at every save -------------------------------------------------------------------
    def capture(self, *, assign: bool = True) -> dict:
        """The callbacks' state for the checkpoint's metadata; with ``assign``, best weights
        that changed since the last save are copied into their variables."""
        state = {}
        for cb in self._stateful:
            key = self._keys[id(cb)]
            entry: dict[str, Any] = {}
            name = _registered(cb)
            if name:
                entry["attributes"] = {
                    a: _plain(getattr(cb, a), where=f"{key}.{a}") for a in REGISTRY[name] if hasattr(cb, a)
                }
            if _has_protocol(cb):
                entry["state_dict"] = _plain(cb.state_dict(), where=f"{key}.state_dict()")
            if key in self._slots:
                weights = getattr(cb, _BEST_WEIGHTS, None)
                entry[_BEST_WEIGHTS] = weights is not None
                if assign and weights is not None and self._assigned.get(key) != id(weights):
                    self._assign(key, weights)
            json.dumps(entry, allow_nan=True)
            state[key] = entry
        if self._epoch_begin_lr is not None:
            state[_EPOCH_BEGIN_LR] = self._epoch_begin_lr
        return state

    def _assign(self, key: str, weights) -> None:
        slot = self._slots[key]
        if len(weights) != len(slot):
            raise ModelError(
                f"{key}: best_weights holds {len(weights)} arrays, the model {len(slot)} weights. Fix: let "
                "EarlyStopping take its best weights from the model it monitors."
            )
        for variable, value in zip(slot, weights):
            variable.assign(value)
        self._assigned[key] = id(weights)


def _attribute(key: str) -> str:
    """A Python name for a callback's key ("2:EarlyStopping" -> "cb2_EarlyStopping")."""
    index, _, name = key.partition(":")
    return f"cb{index}_{name}"


def _dtype(weight) -> Any:
    dtype = weight.dtype
    return getattr(dtype, "base_dtype", dtype)

