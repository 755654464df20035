"""The sidecar evaluator: evaluates every new checkpoint of a run as it appears."""

from __future__ import annotations

import logging
import time
from typing import Any

from tfdist import data as data_mod
from tfdist.checkpoint import layout

log = logging.getLogger("tfdist")


def run_sidecar(
    model_builder: Any,
    validation_data: Any,
    *,
    checkpoint_dir: str,
    log_dir: str | None,
    batch_size: int = 256,
    poll_seconds: float = 2.0,
    max_idle_seconds: float | None = None,
) -> list[dict]:
    """Evaluates each new checkpoint in ``checkpoint_dir`` until the run's complete one.

    Metrics go to TensorBoard under ``log_dir`` (step = the checkpoint's global step) and
    the log. Returns one dictionary of metrics per evaluated checkpoint. Stops after the
    checkpoint marked complete, or after ``max_idle_seconds`` without a new one.
    """
    import tensorflow as tf

    model = model_builder()
    source = data_mod.as_source(validation_data)
    data_mod.check_labelled(source, use="evaluation")
    dataset = data_mod.validation_dataset(source, batch_size)
    writer = tf.summary.create_file_writer(log_dir) if log_dir else None
    seen: set[str] = set()
    results: list[dict] = []
    idle_since = time.monotonic()
    log.info("evaluator: watching %s", checkpoint_dir)
    while True:
        paths = layout.checkpoint_paths(checkpoint_dir)
        fresh = [p for p in paths if p not in seen]
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
        if metadata.complete:
            return results
