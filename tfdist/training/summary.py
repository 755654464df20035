"""What a run did: ``FitSummary``, attached to the History that ``fit`` returns as ``history.tfdist``."""

from __future__ import annotations

import dataclasses

_ACCURACY_KEYS = ("val_accuracy", "val_sparse_categorical_accuracy", "val_acc")


@dataclasses.dataclass(frozen=True)
class FitSummary:
    """What a run did; ``fit`` attaches it to the returned History as ``history.tfdist``.

    ``all_reduce`` is the gradient all-reduce tfdist chose for ``mirrored`` or
    ``multi_worker_mirrored`` (``nccl``, ``ring``, ``hierarchical_copy``, ``reduce_to_one``);
    None for the other strategies and for a ``tf.distribute.Strategy`` passed in by the user.
    """

    strategy: str
    num_replicas: int
    num_workers: int
    all_reduce: str | None
    global_batch_size: int
    per_replica_batch_size: int
    micro_batch_size: int
    grad_accum_steps: int
    epochs: int
    steps_per_epoch: int
    global_step: int
    start_step: int
    resumed_from: str | None
    completed: bool
    final_loss: float | None
    val_accuracy: float | None
    examples_per_sec: float | None
    wall_seconds: float
    checkpoint_dir: str | None
    seed: int

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def summarize(
    *,
    strategy: str,
    num_replicas: int,
    num_workers: int,
    all_reduce: str | None,
    sizes,
    plan,
    global_step: int,
    start_step: int,
    resumed_from: str | None,
    history: list[dict],
    train_seconds: float,
    wall_seconds: float,
    checkpoint_dir: str | None,
    completed: bool | None = None,
) -> FitSummary:
    """The summary of a run from its shape (``sizes``: BatchSizes, ``plan``: DataPlan), where it
    started and ended, its per-epoch ``history`` and its timings. ``completed`` defaults to
    whether every planned step ran."""
    last = history[-1] if history else {}
    accuracy_key = next((k for k in _ACCURACY_KEYS if k in last), None)
    steps_run = global_step - start_step
    return FitSummary(
        strategy=strategy,
        num_replicas=num_replicas,
        num_workers=num_workers,
        all_reduce=all_reduce,
        global_batch_size=sizes.global_batch_size,
        per_replica_batch_size=sizes.per_replica_batch_size,
        micro_batch_size=sizes.micro_batch_size,
        grad_accum_steps=sizes.grad_accum_steps,
        epochs=plan.epochs,
        steps_per_epoch=plan.steps_per_epoch,
        global_step=global_step,
        start_step=start_step,
        resumed_from=resumed_from,
        completed=global_step >= plan.total_steps if completed is None else completed,
        final_loss=last.get("loss"),
        val_accuracy=last.get(accuracy_key) if accuracy_key else None,
        examples_per_sec=(steps_run * sizes.global_batch_size / train_seconds) if train_seconds > 0 and steps_run else None,
        wall_seconds=wall_seconds,
        checkpoint_dir=checkpoint_dir,
        seed=plan.seed,
    )
