"""The tf_keras callbacks that connect Keras' ``fit`` loop to tfdist's training controller.

It hooks into tf_keras at two points its own ``BackupAndRestore`` uses: the model's start state
(``maybe_load_initial_counters_from_ckpt`` tells ``fit`` the epoch and step to start at) and
batch logs left as tensors (batch hooks run under parameter servers too); both through
``tfdist._compat.tf_keras``.
"""

from __future__ import annotations

import tf_keras

from tfdist._compat import tf_keras as tf_keras_compat
from tfdist.training.controller import Controller


class _StartAt:
    """Tells tf_keras' fit loop the (epoch, step) to start at."""

    def __init__(self, epoch: int, step: int):
        self.epoch, self.step = epoch, step

    def maybe_load_initial_counters_from_ckpt(self, steps_per_epoch, initial_epoch, mode=None):
        return self.epoch, self.step


class EpochBeginCallback(tf_keras.callbacks.Callback):
    """Reports each epoch's beginning to a ``Controller`` before the user's callbacks see it
    (it comes first): a resumed epoch's metric accumulators and learning rate are put back."""

    def __init__(self, controller: Controller):
        super().__init__()
        tf_keras_compat.take_tensor_logs(self)
        self.controller = controller

    def on_epoch_begin(self, epoch, logs=None):
        resumed = isinstance(tf_keras_compat.start_state(self.model), _StartAt)
        if resumed:
            tf_keras_compat.set_start_state(self.model, None)
        self.controller.on_epoch_begin(epoch, resumed_mid_epoch=resumed)  # Keras has just reset the metrics


class TrainingCallback(tf_keras.callbacks.Callback):
    """Reports tf_keras' batch and epoch boundaries to a ``Controller``; starts a resumed run mid-epoch
    (with ``EpochBeginCallback`` first in the list).

    It comes after the user's callbacks: a save at a step or an epoch's end holds what they
    did there (ReduceLROnPlateau's new learning rate, their counters), and their state is put
    back after their own ``on_train_begin`` reset it."""

    def __init__(self, controller: Controller):
        super().__init__()
        # Batch logs are never read here, so tf_keras may pass them unresolved: this is
        # what lets the batch hooks (step-level saves) run under ParameterServerStrategy.
        tf_keras_compat.take_tensor_logs(self)
        self.controller = controller

    def on_train_begin(self, logs=None):
        start = self.controller.start
        if start.mid_epoch:
            tf_keras_compat.set_start_state(self.model, _StartAt(start.epoch, start.step_in_epoch))
        # tf_keras' fit sets its step counter to 0, and TensorBoard writes batch summaries at that
        # step: a resumed run's would start again at 1 (Keras 3's TensorBoard keeps its own count).
        counter = tf_keras_compat.train_counter(self.model)
        if counter is not None:
            counter.assign(start.global_step)
        self.controller.on_train_begin()

    def on_epoch_begin(self, epoch, logs=None):
        self.controller.after_epoch_begin()

    def on_train_batch_end(self, batch, logs=None):
        # ``batch`` is the last step of this call within the epoch (steps_per_execution > 1: every k-th).
        self.controller.on_step_end(self.controller.epoch * self.controller.steps_per_epoch + batch + 1)

    def on_epoch_end(self, epoch, logs=None):
        self.controller.on_epoch_end(epoch, tf_keras_compat.logs_as_python(logs or {}),
                                     stopping=bool(self.model.stop_training))

    def on_train_end(self, logs=None):
        self.controller.on_train_end(stopped_early=bool(self.model.stop_training))
