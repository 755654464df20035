"""Batch arithmetic: global batch = grad_accum_steps x replicas x micro batch (no TensorFlow here)."""

from __future__ import annotations

import dataclasses
import numbers

from tfdist.errors import BatchSizeError

DEFAULT_PER_REPLICA_BATCH = 32


def _check_positive(name: str, value) -> None:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
        raise BatchSizeError(f"Invalid `{name}`; received {name}={value!r}. Fix: use a positive integer.")


@dataclasses.dataclass(frozen=True)
class BatchSizes:
    """global batch = grad_accum_steps x replicas x micro batch (per replica, per micro step)."""

    global_batch_size: int
    micro_batch_size: int
    num_replicas: int
    grad_accum_steps: int = 1

    def __post_init__(self):
        for name in ("global_batch_size", "micro_batch_size", "num_replicas", "grad_accum_steps"):
            _check_positive(name, getattr(self, name))
        product = self.grad_accum_steps * self.num_replicas * self.micro_batch_size
        if product != self.global_batch_size:
            raise BatchSizeError(
                f"global batch {self.global_batch_size} != grad_accum_steps {self.grad_accum_steps} x replicas "
                f"{self.num_replicas} x micro batch {self.micro_batch_size} = {product}. "
                "Fix: give only one of batch_size and per_replica_batch_size."
            )

    @property
    def per_replica_batch_size(self) -> int:
        """Examples one replica consumes per optimizer step (all its micro batches)."""
        return self.grad_accum_steps * self.micro_batch_size

    @classmethod
    def resolve(
        cls,
        *,
        num_replicas: int,
        batch_size: int | None = None,
        per_replica_batch_size: int | None = None,
        grad_accum_steps: int = 1,
    ) -> "BatchSizes":
        """Fills in the batch size that was not given; raises BatchSizeError if they do not divide.

        ``batch_size`` is the global batch of one optimizer step; ``per_replica_batch_size``
        is the micro batch one replica computes at a time.
        """
        for name, value in (("batch_size", batch_size), ("per_replica_batch_size", per_replica_batch_size),
                            ("grad_accum_steps", grad_accum_steps)):
            if value is not None:
                _check_positive(name, value)
        divisor = num_replicas * grad_accum_steps
        if batch_size is None:
            micro = per_replica_batch_size or DEFAULT_PER_REPLICA_BATCH
            return cls(micro * divisor, micro, num_replicas, grad_accum_steps)
        if batch_size % divisor:
            lower = max(divisor, batch_size // divisor * divisor)
            raise BatchSizeError(
                f"batch_size={batch_size} is not divisible by replicas x grad_accum_steps = "
                f"{num_replicas} x {grad_accum_steps} = {divisor}. "
                f"Fix: use a multiple of {divisor}, e.g. {lower} or {lower + divisor}, or pass per_replica_batch_size."
            )
        micro = batch_size // divisor
        if per_replica_batch_size is not None and per_replica_batch_size != micro:
            raise BatchSizeError(
                f"batch_size={batch_size} and per_replica_batch_size={per_replica_batch_size} disagree: with "
                f"{num_replicas} replica(s) and grad_accum_steps={grad_accum_steps} the micro batch is {micro}. "
                "Fix: pass only one of them."
            )
        return cls(batch_size, micro, num_replicas, grad_accum_steps)

    def describe(self) -> str:
        accum = f" x {self.grad_accum_steps} accumulation steps" if self.grad_accum_steps > 1 else ""
        return (
            f"global batch {self.global_batch_size} = {self.num_replicas} replica(s) x micro batch "
            f"{self.micro_batch_size}{accum}"
        )
