"""The sidecar evaluator: evaluates every new checkpoint of a run as it appears."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from tfdist import data as data_mod
from tfdist import storage
from tfdist.checkpoint import layout

log = logging.getLogger("tfdist")

#: In ``log_dir``: the checkpoints already evaluated, so that an evaluator restarted with its
#: cluster does not score (and write to TensorBoard) the same checkpoint again.
EVALUATED_FILE = "evaluated.json"


def run_evaluator(
    model: Any,
    validation_data: Any,
    *,
    checkpoint_dir: str,
    log_dir: str | None = None,
    batch_size: int = 256,
    poll_seconds: float = 2.0,
    max_idle_seconds: float | None = None,
) -> list[dict]:
    """Evaluates each new checkpoint in ``checkpoint_dir`` until the run's complete one.

    This is the evaluator task of a cluster (``tfdist launch --evaluator``): a sidecar that
    scores the training's checkpoints as they appear, while the workers train. ``tfdist.fit``
    calls it on the evaluator task, so one training script serves every task. Metrics go to
    TensorBoard under ``log_dir`` (step = the checkpoint's global step) and to the log. It
    stops after the checkpoint marked complete, or after ``max_idle_seconds`` without a new one.

    With a ``log_dir``, the checkpoints evaluated are recorded there (:data:`EVALUATED_FILE`):
    an evaluator started again (its cluster restarted) skips them, and a checkpoint written
    again under the same name counts as new.

    Args:
      model: The compiled model the run trains, or the function that builds it, as for ``fit``.
      validation_data: The data to score each checkpoint on, in any form ``fit`` takes.
      checkpoint_dir: The run's checkpoint directory (``fit``'s ``checkpoint_dir``).
      log_dir: Where the TensorBoard summaries go (default: none).
      batch_size: Examples per evaluation batch.
      poll_seconds: Seconds between looks for a new checkpoint.
      max_idle_seconds: Stop after this long without a new checkpoint (default: wait on).

    Returns:
      One dictionary of metrics (and ``global_step``) per evaluated checkpoint.
    """
    from tfdist.training import model as model_mod

    return _watch(model if model_mod.is_model(model) else model(), validation_data, checkpoint_dir=checkpoint_dir,
                  log_dir=log_dir, batch_size=batch_size, poll_seconds=poll_seconds, max_idle_seconds=max_idle_seconds)


def run_sidecar(model_builder: Any, validation_data: Any, **kwargs) -> list[dict]:
    """:func:`run_evaluator` with a function that builds the model."""
    return run_evaluator(model_builder, validation_data, **kwargs)


def for_fit(model: Any, data: Any, validation_data: Any, *, checkpoint_dir: str | None, callbacks,
            task_name: str) -> None:
    """``fit`` on the evaluator task: :func:`run_evaluator` on ``validation_data`` (else ``data``),
    its TensorBoard summaries under the log directory of a TensorBoard in ``callbacks`` (``/eval``)."""
    from tfdist.errors import ModelError
    from tfdist.training.profiling import tensorboard_of

    if checkpoint_dir is None:
        raise ModelError(f"tfdist.fit does not train on the evaluator task: it scores the run's checkpoints; received "
                         f"task {task_name} and no checkpoint_dir. Fix: pass checkpoint_dir= to fit (the same on "
                         "every task), or leave the evaluator out.")
    board = tensorboard_of(callbacks)
    log_dir = storage.join(str(board.log_dir), "eval") if board is not None else None
    run_evaluator(model, validation_data if validation_data is not None else data, checkpoint_dir=checkpoint_dir,
                  log_dir=log_dir)


def _watch(model, validation_data, *, checkpoint_dir, log_dir, batch_size, poll_seconds, max_idle_seconds):
    """Evaluates each new checkpoint of ``checkpoint_dir`` with ``model`` (see :func:`run_evaluator`)."""
    import tensorflow as tf

    source = data_mod.as_source(validation_data)
    data_mod.check_labelled(source, use="evaluation")
    dataset = data_mod.validation_dataset(source, batch_size)
    writer = tf.summary.create_file_writer(log_dir) if log_dir else None
    record = _Record(log_dir)
    seen: set[str] = set()
    results: list[dict] = []
    idle_since = time.monotonic()
    log.info("evaluator: watching %s", checkpoint_dir)
    checked = None  # the newest checkpoint evaluated before this evaluator started, once checked
    while True:
        paths = layout.checkpoint_paths(checkpoint_dir)
        seen.update(p for p in paths if p not in seen and record.has(p))
        fresh = [p for p in paths if p not in seen]
        if not fresh and paths and paths[-1] != checked and record.has(paths[-1]):
            checked = paths[-1]  # a finished run started again: its complete checkpoint was evaluated
            if (layout.read_metadata(checked) or layout.Metadata({})).complete:
                log.info("evaluator: %s, the run's complete checkpoint, was evaluated before; stopping",
                         storage.basename(checked))
                return results
        if not fresh:
            if max_idle_seconds is not None and time.monotonic() - idle_since > max_idle_seconds:
                log.info("evaluator: no new checkpoint for %.0f s; stopping", max_idle_seconds)
                return results
            time.sleep(poll_seconds)
            continue
        path = fresh[-1]  # the newest; older unseen ones are skipped, as a sidecar does
        seen.update(fresh)
        idle_since = time.monotonic()
        metadata = layout.read_metadata(path) or layout.Metadata({})
        try:
            tf.train.Checkpoint(model=model).restore(path).expect_partial()
        except tf.errors.OpError as e:
            log.warning("evaluator: cannot read %s (%s); skipping it", path, type(e).__name__)
            continue
        metrics = model.evaluate(dataset, verbose=0, return_dict=True)
        step = metadata.global_step if metadata.global_step is not None else len(results)
        metrics = {key: float(value) for key, value in metrics.items()}
        results.append(dict(metrics, global_step=step))
        log.info("evaluator: step %d: %s", step, ", ".join(f"{k}={v:.4f}" for k, v in metrics.items()))
        if writer is not None:
            with writer.as_default(step=step):
                for key, value in metrics.items():
                    tf.summary.scalar(f"eval/{key}", value)
            writer.flush()
        record.add(fresh, keep=paths)  # once written; the older ones skipped too
        if metadata.complete:
            return results


class _Record:
    """The checkpoints already evaluated (name and save time), kept in ``log_dir``."""

    def __init__(self, log_dir: str | None):
        self._path = storage.join(log_dir, EVALUATED_FILE) if log_dir else None
        self._entries: dict[str, float | None] = {}
        if self._path is None:
            return
        try:
            raw = json.loads(storage.read_text(self._path))
            self._entries = {str(k): v for k, v in raw["evaluated"].items()}
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            log.warning("evaluator: cannot read %s (%s); evaluating the checkpoints again", self._path, e)
        if self._entries:
            log.info("evaluator: %d checkpoint(s) already evaluated, as %s records", len(self._entries), self._path)

    def has(self, path: str) -> bool:
        name = storage.basename(path)
        return name in self._entries and self._entries[name] == _saved_at(path)

    def add(self, paths: list[str], *, keep: list[str]) -> None:
        if self._path is None:
            return
        names = {storage.basename(p) for p in keep}  # a deleted checkpoint will not come back
        self._entries = {k: v for k, v in self._entries.items() if k in names}
        self._entries.update((storage.basename(p), _saved_at(p)) for p in paths)
        storage.makedirs(storage.dirname(self._path))
        storage.write_atomic(self._path, json.dumps({"evaluated": self._entries}, indent=1, sort_keys=True))


def _saved_at(path: str) -> float | None:
    metadata = layout.read_metadata(path)
    return metadata.saved_at if metadata is not None else None
