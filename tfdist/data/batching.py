"""Batch arithmetic: global batch = grad_accum_steps x replicas x micro batch (no TensorFlow here).

The one place for it: ``BatchSizes.resolve`` for ``fit``, ``resolve_micro_and_accum`` and
``solve_grad_accum_steps`` for the planner (which also solves for the accumulation steps).
"""

from __future__ import annotations

import dataclasses

from tfdist import _checks
from tfdist.errors import BatchSizeError

DEFAULT_PER_REPLICA_BATCH = 32


def _check_positive(name: str, value) -> None:
    _checks.check_int(name, value, error=BatchSizeError)


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


def solve_grad_accum_steps(*, global_batch_size: int, replicas: int, max_micro_batch_size: int,
                           error: type[Exception] = BatchSizeError) -> int:
    """The smallest k with global % (k x replicas) == 0 and global / (k x replicas) <= max micro batch."""
    for k in range(1, global_batch_size // replicas + 1):
        if global_batch_size % (k * replicas) == 0 and global_batch_size // (k * replicas) <= max_micro_batch_size:
            return k
    below = global_batch_size - global_batch_size % replicas
    nearest = ", ".join(str(g) for g in (below, below + replicas) if g > 0)
    raise error(
        f"Invalid `global_batch_size`; received global_batch_size={global_batch_size}, which no number of "
        f"accumulation steps splits over {replicas} replicas (nodes x gpus_per_node) in micro batches of at most "
        f"max_micro_batch_size={max_micro_batch_size}. Fix: use a multiple of {replicas}, e.g. {nearest}."
    )


def resolve_micro_and_accum(
    *, replicas: int, micro: int | None, accum: int | None, global_batch: int | None, max_micro: int | None,
    error: type[Exception] = BatchSizeError,
) -> tuple[int, int]:
    """(micro_batch_size, grad_accum_steps) from whichever of them and the global batch are given."""
    if global_batch is None:
        if micro is None:
            raise error(
                "Missing `micro_batch_size`; received micro_batch_size=None and global_batch_size=None. "
                "Fix: pass micro_batch_size (and grad_accum_steps), or global_batch_size."
            )
        accum = accum or 1
    elif micro is not None and accum is not None:
        if accum * replicas * micro != global_batch:
            raise error(
                f"Invalid `global_batch_size`; received global_batch_size={global_batch}, but grad_accum_steps="
                f"{accum} x {replicas} replicas x micro_batch_size={micro} = {accum * replicas * micro}. "
                "Fix: pass only two of global_batch_size, grad_accum_steps and micro_batch_size."
            )
    elif micro is not None or accum is not None:
        name, known = ("micro_batch_size", micro) if micro is not None else ("grad_accum_steps", accum)
        if global_batch % (known * replicas):
            raise error(
                f"Invalid `global_batch_size`; received global_batch_size={global_batch}, which {name}={known} x "
                f"{replicas} replicas (nodes x gpus_per_node) does not divide. Fix: use a multiple of "
                f"{known * replicas}, or change {name}."
            )
        other = global_batch // (known * replicas)
        micro, accum = (micro, other) if micro is not None else (other, accum)
    elif max_micro is not None:
        accum = solve_grad_accum_steps(
            global_batch_size=global_batch, replicas=replicas, max_micro_batch_size=max_micro, error=error
        )
        micro = global_batch // (accum * replicas)
    else:
        if global_batch % replicas:
            raise error(
                f"Invalid `global_batch_size`; received global_batch_size={global_batch}, not divisible by "
                f"{replicas} replicas (nodes x gpus_per_node). Fix: use a multiple of {replicas}, or pass "
                "max_micro_batch_size to solve for the accumulation steps."
            )
        accum, micro = 1, global_batch // replicas
    if max_micro is not None and micro > max_micro:
        raise error(
            f"Invalid `micro_batch_size`; received micro_batch_size={micro}, above "
            f"max_micro_batch_size={max_micro}. Fix: raise grad_accum_steps or lower the batch."
        )
    return micro, accum
