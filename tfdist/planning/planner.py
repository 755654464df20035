"""Training plan arithmetic: batch sizes, steps, memory, checkpoint cost and time, before a run.

Everything here is arithmetic on numbers the user gives. TensorFlow is imported only to
count the parameters of a named or saved model and to measure a step (``measure``).

The formulas (see docs/plan.md for a worked example):

* global batch = grad_accum_steps x nodes x gpus_per_node x micro_batch_size;
  steps per epoch = samples // global batch (the remainder is dropped each epoch);
  total steps = epochs x steps per epoch. A step is one optimizer update.
* memory per replica = weights (params x 4) + 16-bit weight copies (params x 2, mixed
  precision only) + gradients (trainable x 4) + accumulator (trainable x 4, when
  grad_accum_steps > 1) + optimizer slots (slots x trainable x 4) + activations
  (bytes per sample x micro batch), where trainable is the trainable parameters (all of
  them unless known: BatchNormalization's moving statistics, for one, are not).
* checkpoint bytes = params x 4 + trainable x 4 x optimizer_slots + CHECKPOINT_OVERHEAD_BYTES;
  required write bandwidth = checkpoint bytes / stall window.
* Young/Daly interval = sqrt(2 x checkpoint write seconds x MTBF); work lost per failure
  = min(interval, training seconds) / 2 + restart seconds.
* step seconds = step_time x grad_accum_steps + ring all-reduce seconds (a measured step_time
  is the measured accumulated step / grad_accum_steps), with the ring
  all-reduce = 2 (n - 1) / n x gradient bytes / link bandwidth for n replicas.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

from tfdist import _checks
from tfdist.data.batching import resolve_micro_and_accum
from tfdist.errors import PlanError
from tfdist.planning.measure import check_keras
from tfdist.planning.units import format_bytes, format_seconds, parse_bytes, parse_count, parse_duration

PRECISIONS = _checks.PRECISIONS
BYTES_PER_PARAM = 4  # weights, gradients and optimizer slots are float32 in every precision
CHECKPOINT_OVERHEAD_BYTES = 64_000  # index, object graph, metadata: ~10 kB for a small model, a few hundred B a variable
DEFAULT_STALL_WINDOW = 30.0  # seconds training may pause to write one checkpoint
DEFAULT_MTBF = 86_400.0  # seconds between failures that stop the job (1 day)
DEFAULT_RESTART_SECONDS = 300.0  # seconds from a failure to training again (reschedule, restore)
DEFAULT_LINK_BANDWIDTH = 10e9  # bytes/s of the slowest link of the all-reduce ring (10 GB/s)
DEFAULT_MAX_GPUS = 64
_DERIVED = (  # the numbers a plan derives from its inputs, in to_dict's order
    "replicas", "global_batch_size", "steps_per_epoch", "dropped_samples_per_epoch", "total_steps",
    "gradient_bytes", "checkpoint_bytes", "required_write_bytes_per_sec", "checkpoint_write_seconds",
    "checkpoint_interval_seconds", "checkpoint_interval_steps", "checkpoint_count",
    "lost_seconds_per_failure", "allreduce_seconds", "compute_seconds_per_step", "step_seconds",
    "train_seconds", "checkpoint_overhead_seconds", "estimated_seconds", "expected_failures",
    "expected_lost_seconds",
)
_NUMERIC_INPUTS = (
    "samples", "epochs", "micro_batch_size", "grad_accum_steps", "nodes", "gpus_per_node", "params",
    "optimizer_slots", "activation_bytes", "step_time", "stall_window", "mtbf", "write_bandwidth",
    "link_bandwidth", "restart_seconds",
)


# --- formulas ------------------------------------------------------------------------------
def ring_allreduce_seconds(*, replicas: int, gradient_bytes: float, link_bandwidth: float) -> float:
    """Seconds of one ring all-reduce: 2 (n - 1) / n x gradient bytes / link bandwidth (0 for n = 1)."""
    return 2 * (replicas - 1) / replicas * gradient_bytes / link_bandwidth


def young_daly_interval(*, write_seconds: float, mtbf: float) -> float:
    """Young/Daly first-order optimal seconds of work between checkpoints: sqrt(2 x write x MTBF)."""
    return math.sqrt(2 * write_seconds * mtbf)


# --- validation ---------------------------------------------------------------------------
def check_int(name: str, value: Any, *, minimum: int = 1) -> None:
    _checks.check_int(name, value, error=PlanError, minimum=minimum)


def _check_number(name: str, value: Any, *, unit: str, allow_none: bool = False, allow_zero: bool = False) -> None:
    _checks.check_number(name, value, error=PlanError, unit=unit, allow_none=allow_none, allow_zero=allow_zero)


@dataclasses.dataclass(frozen=True)
class Memory:
    """Bytes one replica holds during a training step; ``activations_bytes`` is None when unknown."""

    weights_bytes: int
    weight_copies_bytes: int
    gradients_bytes: int
    accumulator_bytes: int
    optimizer_bytes: int
    activations_bytes: int | None

    @property
    def total_bytes(self) -> int | None:
        if self.activations_bytes is None:
            return None
        return self.static_bytes + self.activations_bytes

    @property
    def static_bytes(self) -> int:
        """Everything but activations: what a replica holds whatever the micro batch."""
        return (
            self.weights_bytes + self.weight_copies_bytes + self.gradients_bytes
            + self.accumulator_bytes + self.optimizer_bytes
        )

    def to_dict(self) -> dict[str, int | None]:
        return {**dataclasses.asdict(self), "static_bytes": self.static_bytes, "total_bytes": self.total_bytes}


@dataclasses.dataclass(frozen=True)
class ScalingPoint:
    """The estimate for one number of GPUs with the micro batch and accumulation steps held fixed."""

    gpus: int
    global_batch_size: int
    total_steps: int
    dropped_samples_per_epoch: int
    allreduce_seconds: float
    step_seconds: float
    train_seconds: float
    efficiency: float  # throughput / (gpus x throughput on one GPU)


@dataclasses.dataclass(frozen=True)
class Plan:
    """A training plan: its inputs, validated, and every derived number as a property.

    [`plan`][tfdist.plan] builds it. The derived numbers include ``replicas``,
    ``global_batch_size``, ``steps_per_epoch``, ``total_steps``, ``memory``,
    ``checkpoint_bytes``, ``checkpoint_interval_seconds`` (Young/Daly), ``step_seconds``,
    ``train_seconds`` and ``estimated_seconds``. A number that needs an unknown input is None.

    Attributes:
      samples: Training examples per epoch.
      micro_batch_size: Examples per replica per forward and backward pass.
      epochs: The number of epochs. Defaults to 1.
      grad_accum_steps: Micro batches whose gradients make one optimizer step. Defaults to 1.
      nodes: The number of machines. Defaults to 1.
      gpus_per_node: Replicas per machine. Defaults to 1.
      params: The model's parameters, trainable or not. Defaults to None: unknown.
      trainable_params: The trainable ones among ``params``. Defaults to None: all of them.
      model: The model name or path the parameters came from, for the report. Defaults to None.
      optimizer_slots: Float32 values the optimizer keeps per parameter: 2 for Adam, 0 for SGD.
        Defaults to 2.
      precision: ``"float32"``, ``"mixed_float16"`` or ``"mixed_bfloat16"``.
        Defaults to ``"float32"``.
      activation_bytes: Activation bytes per example kept for the backward pass.
        Defaults to None: unknown.
      step_time: Seconds of one replica's train step on one micro batch, without the
        all-reduce. A measured step with accumulation is stored divided by ``grad_accum_steps``.
        Defaults to None: unknown.
      step_time_source: ``"given"`` or ``"measured"``. Defaults to None.
      keras: The Keras that counted and measured ``model``: ``"3"`` or ``"2"``. Defaults to ``"3"``.
      measured_peak_bytes: The peak memory of the measurement. Defaults to None.
      measured_peak_source: Where ``measured_peak_bytes`` came from. Defaults to None.
      stall_window: Seconds training may pause to write one checkpoint. Defaults to 30.
      mtbf: Mean seconds between failures that stop the whole job. For N nodes with a per-node
        MTBF m, it is about m / N. Defaults to one day.
      write_bandwidth: The checkpoint storage's bytes per second. Defaults to None: the write takes
        the whole stall window.
      link_bandwidth: Bytes per second of the slowest link of the all-reduce ring.
        Defaults to 10 GB/s.
      restart_seconds: Seconds from a failure until training runs again. Defaults to 300.

    Raises:
      PlanError: A value is of the wrong type or out of range.

    Examples:
        ```python
        import tfdist

        plan = tfdist.Plan(samples=60_000, micro_batch_size=64, epochs=10, nodes=2, gpus_per_node=2)
        print(plan.global_batch_size, plan.steps_per_epoch, plan.total_steps)   # 256 234 2340
        ```
    """

    samples: int
    micro_batch_size: int
    epochs: int = 1
    grad_accum_steps: int = 1
    nodes: int = 1
    gpus_per_node: int = 1
    params: int | None = None
    trainable_params: int | None = None
    model: str | None = None
    optimizer_slots: int = 2
    precision: str = "float32"
    activation_bytes: float | None = None
    step_time: float | None = None
    step_time_source: str | None = None
    keras: str = "3"
    measured_peak_bytes: int | None = None
    measured_peak_source: str | None = None
    stall_window: float = DEFAULT_STALL_WINDOW
    mtbf: float = DEFAULT_MTBF
    write_bandwidth: float | None = None
    link_bandwidth: float = DEFAULT_LINK_BANDWIDTH
    restart_seconds: float = DEFAULT_RESTART_SECONDS

    def __post_init__(self):
        for name in ("samples", "micro_batch_size", "epochs", "grad_accum_steps", "nodes", "gpus_per_node"):
            check_int(name, getattr(self, name))
        _checks.check_optional_int("params", self.params, error=PlanError)
        _checks.check_optional_int("trainable_params", self.trainable_params, error=PlanError, minimum=0)
        if self.trainable_params is not None and (self.params is None or self.trainable_params > self.params):
            raise PlanError(
                f"Invalid `trainable_params`; received trainable_params={self.trainable_params}, "
                f"params={self.params}. Fix: give the model's parameter count too, no smaller than its trainable ones."
            )
        check_int("optimizer_slots", self.optimizer_slots, minimum=0)
        check_keras(self.keras)
        _checks.check_choice("precision", self.precision, PRECISIONS, error=PlanError)
        _check_number(
            "activation_bytes", self.activation_bytes, unit="bytes per sample", allow_none=True, allow_zero=True
        )
        _check_number("step_time", self.step_time, unit="seconds", allow_none=True)
        _check_number("stall_window", self.stall_window, unit="seconds")
        _check_number("mtbf", self.mtbf, unit="seconds")
        _check_number("write_bandwidth", self.write_bandwidth, unit="bytes per second", allow_none=True)
        _check_number("link_bandwidth", self.link_bandwidth, unit="bytes per second")
        _check_number("restart_seconds", self.restart_seconds, unit="seconds", allow_zero=True)
        if self.global_batch_size > self.samples:
            raise PlanError(
                f"Invalid `global_batch_size`; received global_batch_size={self.global_batch_size} "
                f"(grad_accum_steps={self.grad_accum_steps} x {self.replicas} replicas x "
                f"micro_batch_size={self.micro_batch_size}) for samples={self.samples}: not one step fits in an "
                "epoch. Fix: use a global batch no larger than the samples."
            )
        self._check_finite()

    def _check_finite(self) -> None:
        """Refuses inputs whose derived numbers overflow a float, e.g. a 1e300 s step for 1e15 epochs."""
        for name in ("memory", *_DERIVED):
            try:
                value = getattr(self, name)
                finite = name == "memory" or value is None or math.isfinite(value)
                value = f"{value} (not finite)"
            except (OverflowError, ValueError):  # int(inf), int(nan), an int too large for a float
                value, finite = "too large for a float", False
            if not finite:
                received = ", ".join(
                    f"{k}={getattr(self, k)!r}" for k in _NUMERIC_INPUTS if getattr(self, k) is not None
                )
                raise PlanError(
                    f"Invalid plan inputs: `{name}` is {value}; received {received}. "
                    "Fix: use realistic values (smaller counts and durations, larger bandwidths)."
                )

    # --- batch arithmetic -------------------------------------------------------------
    @property
    def replicas(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def global_batch_size(self) -> int:
        return self.grad_accum_steps * self.replicas * self.micro_batch_size

    @property
    def steps_per_epoch(self) -> int:
        return self.samples // self.global_batch_size

    @property
    def dropped_samples_per_epoch(self) -> int:
        return self.samples % self.global_batch_size

    @property
    def total_steps(self) -> int:
        return self.epochs * self.steps_per_epoch

    # --- memory and checkpoint ----------------------------------------------------------
    @property
    def memory(self) -> Memory | None:
        """Bytes per replica; None when the parameter count is unknown."""
        if self.params is None:
            return None
        p, t = self.params, self.trained_params
        activations = self.activation_bytes
        return Memory(
            weights_bytes=p * BYTES_PER_PARAM,
            weight_copies_bytes=p * 2 if self.precision != "float32" else 0,
            gradients_bytes=t * BYTES_PER_PARAM,
            accumulator_bytes=t * BYTES_PER_PARAM if self.grad_accum_steps > 1 else 0,
            optimizer_bytes=self.optimizer_slots * t * BYTES_PER_PARAM,
            activations_bytes=None if activations is None else int(round(activations * self.micro_batch_size)),
        )

    @property
    def trained_params(self) -> int | None:
        """The parameters with gradients and optimizer slots: the trainable ones, all if unknown."""
        return self.params if self.trainable_params is None else self.trainable_params

    @property
    def gradient_bytes(self) -> int | None:
        """Bytes all-reduced per optimizer step (float32 gradients, also under mixed precision)."""
        return None if self.params is None else self.trained_params * BYTES_PER_PARAM

    @property
    def checkpoint_bytes(self) -> int | None:
        if self.params is None:
            return None
        slots = self.trained_params * self.optimizer_slots
        return (self.params + slots) * BYTES_PER_PARAM + CHECKPOINT_OVERHEAD_BYTES

    @property
    def required_write_bytes_per_sec(self) -> float | None:
        return None if self.params is None else self.checkpoint_bytes / self.stall_window

    @property
    def checkpoint_write_seconds(self) -> float | None:
        if self.params is None:
            return None
        if self.write_bandwidth is None:
            return self.stall_window
        return self.checkpoint_bytes / self.write_bandwidth

    @property
    def checkpoint_interval_seconds(self) -> float | None:
        if self.params is None:
            return None
        return young_daly_interval(write_seconds=self.checkpoint_write_seconds, mtbf=self.mtbf)

    @property
    def no_save_falls_due(self) -> bool:
        """Whether the checkpoint interval is longer than the training (both known)."""
        interval, train = self.checkpoint_interval_seconds, self.train_seconds
        return interval is not None and train is not None and interval > train

    @property
    def lost_seconds_per_failure(self) -> float | None:
        """Expected work lost by one failure: half an interval redone, plus the restart; in a run
        shorter than the interval (no save falls due), half the run."""
        interval = self.checkpoint_interval_seconds
        if interval is None:
            return None
        return (self.train_seconds if self.no_save_falls_due else interval) / 2 + self.restart_seconds

    # --- time ---------------------------------------------------------------------------
    @property
    def allreduce_seconds(self) -> float | None:
        """Ring all-reduce seconds per optimizer step (0 on one replica; None if params unknown)."""
        if self.replicas == 1:
            return 0.0
        if self.params is None:
            return None
        return ring_allreduce_seconds(
            replicas=self.replicas, gradient_bytes=self.gradient_bytes, link_bandwidth=self.link_bandwidth
        )

    @property
    def compute_seconds_per_step(self) -> float | None:
        return None if self.step_time is None else self.step_time * self.grad_accum_steps

    @property
    def step_seconds(self) -> float | None:
        if self.compute_seconds_per_step is None or self.allreduce_seconds is None:
            return None
        return self.compute_seconds_per_step + self.allreduce_seconds

    @property
    def train_seconds(self) -> float | None:
        return None if self.step_seconds is None else self.total_steps * self.step_seconds

    @property
    def checkpoint_interval_steps(self) -> int | None:
        """The Young/Daly interval in optimizer steps (at least 1), e.g. for a save frequency."""
        if self.step_seconds is None or self.checkpoint_interval_seconds is None:
            return None
        return max(1, int(self.checkpoint_interval_seconds // self.step_seconds))

    @property
    def checkpoint_count(self) -> int | None:
        steps = self.checkpoint_interval_steps
        return None if steps is None else self.total_steps // steps

    @property
    def checkpoint_overhead_seconds(self) -> float | None:
        """Training paused to write checkpoints (each write counted in full, as a synchronous save)."""
        if self.checkpoint_count is None:
            return None
        return self.checkpoint_count * self.checkpoint_write_seconds

    @property
    def estimated_seconds(self) -> float | None:
        """Training plus checkpoint writes; with params unknown, training only."""
        if self.train_seconds is None:
            return None
        return self.train_seconds + (self.checkpoint_overhead_seconds or 0.0)

    @property
    def expected_failures(self) -> float | None:
        return None if self.estimated_seconds is None else self.estimated_seconds / self.mtbf

    @property
    def expected_lost_seconds(self) -> float | None:
        if self.expected_failures is None or self.lost_seconds_per_failure is None:
            return None
        return self.expected_failures * self.lost_seconds_per_failure

    def scaling(self, gpus: Sequence[int] | None = None) -> tuple[ScalingPoint, ...]:
        """Training time and efficiency on each GPU count, the micro batch and accumulation fixed.

        The global batch grows with the GPUs: weak scaling. GPU counts whose global batch
        exceeds the samples are left out.

        Args:
          gpus: The GPU counts. Defaults to None: powers of two up to max(64, replicas).

        Returns:
          One ``ScalingPoint`` per GPU count, with its step time, training time and efficiency.

        Raises:
          PlanError: The plan has no step time or no parameter count.
        """
        if self.step_time is None or self.params is None:
            raise PlanError(
                "Invalid `step_time`/`params` for a scaling estimate; received "
                f"step_time={self.step_time!r}, params={self.params!r}. Fix: give both a step time "
                "(or measure it) and a parameter count (or a model)."
            )
        if gpus is None:
            top = max(DEFAULT_MAX_GPUS, self.replicas)
            gpus = [2**i for i in range(int(math.ceil(math.log2(top))) + 1)]
        points, base = [], self.step_time * self.grad_accum_steps  # one GPU: no all-reduce
        for n in gpus:
            check_int("gpus", n)
            global_batch = self.grad_accum_steps * n * self.micro_batch_size
            if global_batch > self.samples:
                break
            allreduce = ring_allreduce_seconds(
                replicas=n, gradient_bytes=self.gradient_bytes, link_bandwidth=self.link_bandwidth
            )
            step = base + allreduce
            steps = self.epochs * (self.samples // global_batch)
            dropped = self.samples % global_batch
            points.append(ScalingPoint(n, global_batch, steps, dropped, allreduce, step, steps * step, base / step))
        return tuple(points)

    # --- report -------------------------------------------------------------------------
    @property
    def warnings(self) -> tuple[str, ...]:
        """Notes on the plan, such as samples dropped each epoch, one line each."""
        notes = []
        if self.dropped_samples_per_epoch:
            notes.append(
                f"{self.dropped_samples_per_epoch} of {self.samples} samples are dropped each epoch "
                f"(not a multiple of the global batch {self.global_batch_size})."
            )
        if self.write_bandwidth is not None and self.checkpoint_write_seconds > self.stall_window:
            notes.append(
                f"write bandwidth {format_bytes(self.write_bandwidth)}/s is below the required "
                f"{format_bytes(self.required_write_bytes_per_sec)}/s: a checkpoint takes "
                f"{format_seconds(self.checkpoint_write_seconds)}, longer than the stall window."
            )
        if self.no_save_falls_due:
            notes.append(
                f"the checkpoint interval ({format_seconds(self.checkpoint_interval_seconds)}) is longer than the "
                f"training ({format_seconds(self.train_seconds)}): no checkpoint falls due before the end."
            )
        return tuple(notes)

    def to_dict(self) -> dict[str, Any]:
        """Every input and derived number, JSON-ready (None where unknown)."""
        out = dataclasses.asdict(self)
        out.update({name: getattr(self, name) for name in _DERIVED})
        out["dropped_samples"] = self.epochs * self.dropped_samples_per_epoch
        memory = self.memory
        out["memory"] = None if memory is None else memory.to_dict()
        out["warnings"] = list(self.warnings)
        return out


# --- the plan -------------------------------------------------------------------------------
def plan(
    *,
    samples: int | str,
    epochs: int = 1,
    micro_batch_size: int | None = None,
    nodes: int = 1,
    gpus_per_node: int = 1,
    grad_accum_steps: int | None = None,
    global_batch_size: int | None = None,
    max_micro_batch_size: int | None = None,
    params: int | str | None = None,
    trainable_params: int | str | None = None,
    model: str | None = None,
    input_shape: Sequence[int] | None = None,
    num_classes: int | None = None,
    step_time: float | str | None = None,
    measure: bool = False,
    measure_steps: int = 20,
    measure_warmup: int = 3,
    strategy: Any = "auto",
    keras: str = "3",
    optimizer_slots: int = 2,
    precision: str = "float32",
    activation_bytes: float | str | None = None,
    stall_window: float | str = DEFAULT_STALL_WINDOW,
    mtbf: float | str = DEFAULT_MTBF,
    write_bandwidth: float | str | None = None,
    link_bandwidth: float | str = DEFAULT_LINK_BANDWIDTH,
    restart_seconds: float | str = DEFAULT_RESTART_SECONDS,
) -> Plan:
    """Plans a data-parallel training run before it starts.

    Give the batch as ``micro_batch_size``, with ``grad_accum_steps``. Or give a target
    ``global_batch_size`` with ``max_micro_batch_size``: the fewest accumulation steps that fit
    are solved for. Give the model as ``params`` or as ``model``. Give the step time as
    ``step_time``, or measure it with ``measure=True``. Durations and bandwidths also take text
    such as ``"30s"``, ``"24h"`` or ``"10GB/s"``, and counts such as ``"1.2M"``. The formulas are
    in the [planning guide](../plan.md).

    Args:
      samples: Training examples per epoch, such as ``60000`` or ``"1.2M"``.
      epochs: The number of epochs. Defaults to 1.
      micro_batch_size: Examples per replica per forward and backward pass. Defaults to None:
        solved from ``global_batch_size``.
      nodes: The number of machines. Defaults to 1.
      gpus_per_node: Replicas per machine. Defaults to 1.
      grad_accum_steps: Micro batches whose gradients make one optimizer step. Defaults to None:
        1, or solved from ``global_batch_size``.
      global_batch_size: The examples of one optimizer step, over all replicas. Defaults to None.
      max_micro_batch_size: The largest micro batch that fits a replica's memory, used to solve
        for ``grad_accum_steps``. Defaults to None.
      params: The model's parameters, all of them, such as ``"7B"``. Give this or ``model``.
        Defaults to None.
      trainable_params: How many of ``params`` are trainable, with gradients and optimizer slots.
        Defaults to None: all of them.
      model: A built-in model name (``"cnn"``, ``"resnet"``, ``"mlp"``, ``"linear"``, ``"wide"``)
        or a saved model's path. Its parameters are counted with TensorFlow. Defaults to None.
      input_shape: The input shape of a built-in ``model``, without the batch. Defaults to None:
        the digits' ``(8, 8, 1)``.
      num_classes: The classes of a built-in ``model``. Defaults to None: 10.
      step_time: Seconds of one replica's train step on one micro batch, without the all-reduce.
        Defaults to None: unknown, so no times are planned.
      measure: Time the step with a short real run of ``model`` on this machine. Defaults to False.
      measure_steps: The steps timed when measuring. Defaults to 20.
      measure_warmup: The steps run before timing, when measuring. Defaults to 3.
      strategy: The strategy of the measuring run: a name, a [`Strategy`][tfdist.Strategy] or a
        ``tf.distribute.Strategy``. Defaults to ``"auto"``.
      keras: The Keras that builds and measures ``model``: ``"3"`` (``import keras``, timed in
        tfdist's own loop) or ``"2"`` (tf_keras, timed with its ``model.fit``). Defaults to ``"3"``.
      optimizer_slots: Float32 values the optimizer keeps per parameter: 2 for Adam, 0 for SGD.
        Defaults to 2.
      precision: ``"float32"``, ``"mixed_float16"`` or ``"mixed_bfloat16"``.
        Defaults to ``"float32"``.
      activation_bytes: Activation bytes per example kept for the backward pass, such as
        ``"2MB"``. Defaults to None: unknown, so the memory is not planned.
      stall_window: Seconds training may pause to write one checkpoint. Defaults to 30.
      mtbf: Mean seconds between failures that stop the whole job. Defaults to one day.
      write_bandwidth: The checkpoint storage's bytes per second. Defaults to None: the write
        takes the whole stall window.
      link_bandwidth: Bytes per second of the slowest link of the all-reduce ring.
        Defaults to 10 GB/s.
      restart_seconds: Seconds from a failure until training runs again. Defaults to 300.

    Returns:
      The [`Plan`][tfdist.Plan]: the inputs and every derived number, such as
        ``steps_per_epoch``, ``train_seconds`` and ``checkpoint_interval_steps``.

    Raises:
      PlanError: A value is invalid, two arguments conflict, or the global batch does not divide
        into replicas and micro batches.

    Examples:
        ```python
        import tfdist

        plan = tfdist.plan(samples="1.2M", epochs=90, global_batch_size=1024, max_micro_batch_size=128,
                           nodes=2, gpus_per_node=4, params="25M", step_time=0.25)
        print(plan.grad_accum_steps, plan.steps_per_epoch, round(plan.train_seconds / 3600, 1))   # 1 1171 ...
        ```
    """
    samples = parse_count(samples, name="samples") if isinstance(samples, str) else samples
    params = parse_count(params, name="params") if isinstance(params, str) else params
    if isinstance(trainable_params, str):
        trainable_params = parse_count(trainable_params, name="trainable_params")
    for name, value in (("samples", samples), ("nodes", nodes), ("gpus_per_node", gpus_per_node)):
        check_int(name, value)
    batch_args = (
        ("micro_batch_size", micro_batch_size), ("grad_accum_steps", grad_accum_steps),
        ("global_batch_size", global_batch_size), ("max_micro_batch_size", max_micro_batch_size),
    )
    for name, value in batch_args:
        _checks.check_optional_int(name, value, error=PlanError)
    check_int("measure_steps", measure_steps)
    check_int("measure_warmup", measure_warmup, minimum=0)
    micro, accum = resolve_micro_and_accum(
        replicas=nodes * gpus_per_node, micro=micro_batch_size, accum=grad_accum_steps,
        global_batch=global_batch_size, max_micro=max_micro_batch_size, error=PlanError,
    )
    if params is not None and model is not None:
        raise PlanError(
            f"Conflicting `params` and `model`; received params={params!r}, model={model!r}. Fix: pass one of them."
        )
    if trainable_params is not None and model is not None:
        raise PlanError(
            f"Conflicting `trainable_params` and `model`; received trainable_params={trainable_params!r}, "
            f"model={model!r}. Fix: leave trainable_params out; the model's trainable parameters are counted."
        )
    if step_time is not None and measure:
        raise PlanError(
            f"Conflicting `step_time` and `measure`; received step_time={step_time!r}, measure=True. "
            "Fix: give a step time or measure it, not both."
        )
    if measure and model is None:
        raise PlanError(
            "Missing `model` for `measure`; received model=None. Fix: pass a built-in model name or a saved "
            "model path to measure, or give step_time."
        )
    bandwidth = None
    if write_bandwidth is not None:
        bandwidth = parse_bytes(write_bandwidth, name="write_bandwidth", per_second=True)
    fields = dict(
        samples=samples, epochs=epochs, micro_batch_size=micro, grad_accum_steps=accum, nodes=nodes,
        gpus_per_node=gpus_per_node, params=params, trainable_params=trainable_params, model=model,
        optimizer_slots=optimizer_slots,
        precision=precision, keras=keras,
        activation_bytes=None if activation_bytes is None else parse_bytes(activation_bytes, name="activation_bytes"),
        step_time=None if step_time is None else parse_duration(step_time, name="step_time"),
        step_time_source=None if step_time is None else "given",
        stall_window=parse_duration(stall_window, name="stall_window"),
        mtbf=parse_duration(mtbf, name="mtbf"),
        write_bandwidth=bandwidth,
        link_bandwidth=parse_bytes(link_bandwidth, name="link_bandwidth", per_second=True),
        restart_seconds=parse_duration(restart_seconds, name="restart_seconds"),
    )
    result = Plan(**fields)  # validates everything before any TensorFlow work
    if measure or model is not None:
        from tfdist.planning.measure import builtin_params, measure_step_time
    if measure:
        m = measure_step_time(
            model=model, micro_batch_size=micro, strategy=strategy, steps=measure_steps, warmup=measure_warmup,
            grad_accum_steps=accum, precision=precision, optimizer_slots=optimizer_slots, input_shape=input_shape,
            num_classes=num_classes, keras=keras,
        )
        fields.update(
            params=m.params, trainable_params=m.trainable_params, step_time=m.step_seconds / accum, step_time_source="measured",
            measured_peak_bytes=m.peak_bytes, measured_peak_source=m.peak_source,
        )
        if fields["activation_bytes"] is None and m.device.startswith("GPU") and m.peak_bytes is not None:
            static = Plan(**fields).memory.static_bytes  # the measured step had the accumulator too
            fields["activation_bytes"] = max(0, m.peak_bytes - static) / micro  # GPU:0 holds one replica
        result = Plan(**fields)
    elif model is not None:
        total, trainable = builtin_params(model, input_shape=input_shape, num_classes=num_classes, keras=keras)
        result = dataclasses.replace(result, params=total, trainable_params=trainable)
    return result
