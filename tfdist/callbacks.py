"""Callbacks that know which task they run on: ``is_chief``, ``task_role`` and ``chief_only``.

Every worker of a multi-worker run calls ``fit``, so every worker runs the callbacks. A callback
that writes outside the model (a tracker, a notifier, a file) must write once per run: on the
chief. tfdist already sends the files of Keras' ``ModelCheckpoint``, ``TensorBoard`` and
``CSVLogger`` to a scratch directory on the other workers. Wrap any other writer in
``chief_only``. Leave unwrapped a callback that changes training (``EarlyStopping``,
``ReduceLROnPlateau``, a learning-rate schedule): every worker must take the same decision.

A callback may also have the methods ``on_run_begin(run)`` and ``on_run_end(summary)``. ``fit``
calls the first before training, with the run's shape as a dict (``strategy``, ``num_replicas``,
``num_workers``, batch sizes, ``epochs``, ``steps_per_epoch``, ``seed``, ``checkpoint_dir``,
``start_step``). It calls the second with the ``FitSummary`` when training is done.
``tfdist.tracking.MLflowLogger`` uses both.

Importing this module imports no TensorFlow.
"""

from __future__ import annotations

import functools
from typing import Any

from tfdist._compat import tf_keras as tf_keras_compat
from tfdist.errors import ModelError

__all__ = ["is_chief", "task_role", "chief_only"]


def is_chief(cluster=None) -> bool:
    """Whether this task is the chief: the one that writes a run's files, logs and exports.

    The chief is the ``chief`` task, else ``worker:0``; a process outside any cluster is its
    own chief. The cluster is detected as ``fit`` detects it (``TF_CONFIG``, then Slurm).

    Args:
      cluster: a ``tfdist.ClusterSpec`` to ask instead (default: detected).

    Returns:
      True on the chief, False on every other task.

    Raises:
      ClusterConfigError: ``TF_CONFIG`` or the Slurm variables describe an invalid cluster.
    """
    return _cluster(cluster).is_chief


def task_role(cluster=None) -> str:
    """This task's role and index, as ``fit`` logs it: ``"chief:0"``, ``"worker:1"``, ``"ps:0"``,
    ``"evaluator:0"``, or ``"local"`` outside any cluster.

    Args:
      cluster: a ``tfdist.ClusterSpec`` to ask instead (default: detected).

    Returns:
      The role and index, such as ``"worker:1"``.

    Raises:
      ClusterConfigError: ``TF_CONFIG`` or the Slurm variables describe an invalid cluster.
    """
    return _cluster(cluster).task_name


def _cluster(cluster):
    if cluster is not None:
        return cluster
    from tfdist.cluster import detect

    return detect()


@functools.lru_cache(maxsize=None)
def either_keras_callback() -> type:
    """A callback base class that both Keras 3 and tf_keras accept in their callback lists."""
    import keras
    import tf_keras

    class EitherKerasCallback(keras.callbacks.Callback, tf_keras.callbacks.Callback):
        """A Keras callback of either Keras (Keras 3's ``Callback`` first in the MRO)."""

        def __init__(self):
            keras.callbacks.Callback.__init__(self)
            tf_keras_compat.init_callback_attributes(self)  # tf_keras hands over Python numbers

    return EitherKerasCallback


def run_begins(callbacks, run: dict) -> None:
    """Calls ``on_run_begin(run)`` of the callbacks that have it (``fit``, before training).

    Args:
      callbacks: the callbacks passed to ``fit``, or None.
      run: the run's shape (strategy, replicas, batch sizes, epochs...); each callback gets a copy.
    """
    for cb in callbacks or ():
        if callable(getattr(cb, "on_run_begin", None)):
            cb.on_run_begin(dict(run))


def run_ends(callbacks, summary) -> None:
    """Calls ``on_run_end(summary)`` of the callbacks that have it (``fit``, with its ``FitSummary``).

    Args:
      callbacks: the callbacks passed to ``fit``, or None.
      summary: the run's ``FitSummary``.
    """
    for cb in callbacks or ():
        if callable(getattr(cb, "on_run_end", None)):
            cb.on_run_end(summary)


_HOOKS = ("on_run_begin", "on_run_end", "on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end",
          "on_train_batch_begin", "on_train_batch_end", "on_test_begin", "on_test_end", "on_test_batch_begin",
          "on_test_batch_end",
          "on_predict_begin", "on_predict_end", "on_predict_batch_begin", "on_predict_batch_end",
          "on_batch_begin", "on_batch_end")


def chief_only(callback: Any, *, cluster=None) -> Any:
    """``callback`` run on the chief alone: on every other task its hooks are skipped.

    Use it for a callback that writes outside the model: a tracker (MLflow, Weights & Biases),
    a notifier, a file of its own. It then writes once per run under every strategy. A callback
    that changes training (stops it, sets the learning rate) must not be wrapped: every worker
    must take the same decision.

    A wrapped callback with ``state_dict()`` and ``load_state_dict(state)`` keeps its state in
    every checkpoint, as an unwrapped one does: a resumed run gives it back.

    Args:
      callback: a Keras 3 or tf_keras callback.
      cluster: the ``tfdist.ClusterSpec`` that says which task is the chief (default: detected
        when training begins, as ``fit`` detects it).

    Returns:
      A callback of either Keras that forwards every hook to ``callback`` on the chief.

    Raises:
      ModelError: ``callback`` is not a Keras callback.

    Example::

        tfdist.fit(build, data, callbacks=[tfdist.callbacks.chief_only(MyTracker())])
    """
    if not callable(getattr(callback, "on_epoch_end", None)) or not callable(getattr(callback, "set_model", None)):
        raise ModelError(f"chief_only wraps a Keras callback; received {type(callback).__name__}. Fix: pass an "
                         "instance of a keras.callbacks.Callback (or tf_keras.callbacks.Callback) subclass.")
    return _chief_only_class()(callback, cluster)


@functools.lru_cache(maxsize=None)
def _chief_only_class() -> type:
    base = either_keras_callback()

    class ChiefOnly(base):
        """Forwards every hook to the wrapped callback on the chief alone."""

        def __init__(self, callback, cluster):
            super().__init__()
            self.callback = callback
            self._given_cluster = cluster
            self._chief: bool | None = None
            tf_keras_compat.take_tensor_logs(self, tf_keras_compat.callback_takes_tensor_logs(callback))

        @property
        def chief(self) -> bool:
            if self._chief is None:
                self._chief = is_chief(self._given_cluster)
            return self._chief

        def set_model(self, model):
            super().set_model(model)
            self.callback.set_model(model)

        def set_params(self, params):
            super().set_params(params)
            self.callback.set_params(params)

        def state_dict(self) -> dict:
            saved = getattr(self.callback, "state_dict", None)
            return saved() if callable(saved) else {}

        def load_state_dict(self, state: dict) -> None:
            load = getattr(self.callback, "load_state_dict", None)
            if callable(load):
                load(state)

        def __repr__(self) -> str:
            return f"chief_only({self.callback!r})"

    def forward(name):
        def hook(self, *args, **kwargs):
            method = getattr(self.callback, name, None)  # on_run_begin/on_run_end are optional
            if self.chief and method is not None:
                method(*args, **kwargs)

        hook.__name__ = name
        return hook

    for name in _HOOKS:
        setattr(ChiefOnly, name, forward(name))
    for mode in ("train", "test", "predict"):  # tf_keras skips batch hooks no callback implements
        name = f"_implements_{mode}_batch_hooks"
        setattr(ChiefOnly, name, lambda self, _n=name: bool(getattr(self.callback, _n, lambda: True)()))
    return ChiefOnly
