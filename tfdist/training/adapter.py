"""The Keras adapter Protocol: what ``fit``, ``evaluate`` and ``predict`` ask of a model's Keras.

``training.model.resolve`` returns an adapter with the model: ``keras3.Keras3`` or
``keras2.TfKeras``. Everything after asks the adapter, never which Keras it has. Each adapter
subclasses :class:`KerasAdapter`, and ``tests/test_adapter.py`` checks that both
define every method with the Protocol's signature.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover
    from tfdist.checkpoint import TrainingState
    from tfdist.data import DataPlan
    from tfdist.strategy_kinds import Strategy
    from tfdist.training.controller import Controller

__all__ = ["KerasAdapter"]


@runtime_checkable
class KerasAdapter(Protocol):
    """One Keras's side of a ``fit``, ``evaluate`` or ``predict`` call, under one strategy.

    An adapter is made with the strategy (``Adapter(strategy)``) and holds no model: every
    method takes the model it acts on. Every process of a cluster calls the same methods in
    the same order.

    Attributes:
      name: the Keras it adapts, as logs and checkpoints name it (``"keras3"``, ``"tf_keras"``).
      strategy: the tfdist strategy the model trains under.
    """

    name: str
    strategy: "Strategy"

    def check(self, model: Any, *, use: str = "fit") -> None:
        """Refuses, in one line, a model this Keras cannot ``use`` (``fit``, ``evaluate`` or ``predict``).

        Raises:
          ModelError: the model is not compiled, mixes Kerases, or asks for what the strategy cannot run.
        """

    def in_scope(self, model: Any) -> Any:
        """The model with its variables in the strategy: itself, or a copy rebuilt in the scope."""

    def after_build(self, model: Any) -> None:
        """Runs once the model is built in the scope: warnings about what the user built."""

    def prepare(self, model: Any, *, sample: Any, grad_accum_steps: int) -> None:
        """Creates every variable of the model now (layers, optimizer slots, metrics), so that a
        checkpoint restores into them; installs gradient accumulation over ``grad_accum_steps``.

        Args:
          sample: one micro batch as the model's ``train_step`` receives it.
          grad_accum_steps: micro batches per optimizer step.
        """

    def state(self, model: Any) -> "TrainingState":
        """What a checkpoint holds of the model: the model, its optimizer, random and metric state,
        and each replica's own value of what replicas update on their own."""

    def fingerprint(self, model: Any) -> str:
        """The model's structure as a short digest; a resume refuses a checkpoint of another structure."""

    def for_workers(self, dataset_fn: Callable) -> Any:
        """Training data where each worker reads its own steps: ``dataset_fn`` handed over the way
        this Keras's loop wants it."""

    def validation_for_workers(self, dataset_fn: Callable) -> Any:
        """Validation data where each worker reads its own steps, as :meth:`for_workers`."""

    def settle(self, model: Any) -> None:
        """Waits for every step scheduled on workers, before the state is read or saved."""

    def run(self, model: Any, controller: "Controller", *, train_data: Any, validation_data: Any,
            validation_steps: int | None, validation_freq: int, plan: "DataPlan", callbacks: Sequence[Any] | None,
            verbose: int) -> Any:
        """Trains from the controller's start to the plan's end; returns this Keras's History.

        Args:
          controller: the run's controller, told of every step and epoch boundary.
          train_data: the batches of the steps from the controller's start on.
          validation_data: the validation input, or None.
          validation_steps: batches per validation (None: read to the end).
          validation_freq: validate after every ``validation_freq``-th epoch.
          plan: the run's data plan (steps per epoch, epochs).
          callbacks: the user's callbacks.
          verbose: Keras' verbosity.
        """

    def prepare_evaluation(self, model: Any, *, sample: Any) -> None:
        """Creates the compiled loss and metric variables an evaluation needs (a model just loaded).

        Args:
          sample: one batch as the model's ``test_step`` receives it.
        """

    def evaluate(self, model: Any, data: Any, *, steps: int | None, callbacks: Sequence[Any],
                 verbose: int) -> dict:
        """One pass of the model's test step over distributed ``data`` (at most ``steps`` batches);
        returns the logs, the metrics of every example read."""

    def history(self, previous: list[dict], keras_history: Any = None) -> Any:
        """This Keras's History of every epoch of the run: ``previous`` (earlier starts), then ``keras_history``'s."""
