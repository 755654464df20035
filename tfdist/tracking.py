"""Experiment tracking: a run's parameters, per-epoch metrics and summary in MLflow, once per run.

``MLflowLogger`` is a callback of either Keras for ``tfdist.fit``. The chief alone writes:

* when training begins, the run's parameters: its strategy, replicas, batch sizes, epochs,
  steps, seed and checkpoint directory, and the ``params`` given;
* at every epoch's end, that epoch's metrics, at step = the epoch (from 0);
* when ``fit`` returns, the ``FitSummary`` as the artifact ``fit_summary.json``, and the run ends.

The MLflow run id is part of the callback's state, saved in every checkpoint. A resumed run
(after a preemption, a crash, a SIGKILL) continues the same MLflow run. An epoch already logged
before the interruption is not logged twice.

Needs the ``mlflow`` package: ``pip install 'tfdist[mlflow]'``.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Mapping

from tfdist.callbacks import either_keras_callback, is_chief
from tfdist.errors import ModelError

log = logging.getLogger("tfdist")

__all__ = ["MLflowLogger", "default_uri"]

SUMMARY_ARTIFACT = "fit_summary.json"
"""The artifact of an MLflow run that holds the run's ``FitSummary``."""
DEFAULT_EXPERIMENT = "tfdist"


def default_uri(directory: str) -> str:
    """The MLflow file store in ``directory``: ``file:<directory>/mlruns``.

    Args:
      directory: the run's output directory, such as ``tfdist train --output-dir``.

    Returns:
      The tracking URI of the store, with ``directory`` made absolute.
    """
    return "file:" + os.path.join(os.path.abspath(directory), "mlruns")


def _require_mlflow() -> None:
    import importlib.util

    if importlib.util.find_spec("mlflow") is None:
        raise ModelError("MLflowLogger logs to MLflow, which is not installed; received no mlflow package. Fix: pip "
                         "install 'tfdist[mlflow]' (or pip install mlflow).")


def _text(value: Any) -> str:
    return str(value)[:6000]  # MLflow's limit on a parameter's value


class MLflowLogger(either_keras_callback()):
    """Logs a ``tfdist.fit`` run to MLflow once, from the chief, across resumes.

    Args:
      tracking_uri: where MLflow stores runs: ``file:/path/mlruns`` (a file store, no server),
        ``sqlite:///mlflow.db``, ``http://host:5000``... Default: ``MLFLOW_TRACKING_URI``, else
        ``file:./mlruns``.
      experiment: the MLflow experiment's name (created if missing).
      run_name: the MLflow run's name (default: MLflow's).
      params: more parameters to log, e.g. the script's options. The run's shape (``strategy``,
        ``num_replicas``...) is logged under its own names, and wins over a parameter of the same name.
      cluster: the ``tfdist.ClusterSpec`` that says which task is the chief (default: detected).

    Raises:
      ModelError: the mlflow package is not installed.

    Example::

        history = tfdist.fit(build, data, checkpoint_dir="runs/a/checkpoints",
                             callbacks=[tfdist.tracking.MLflowLogger("file:runs/a/mlruns")])
    """

    def __init__(self, tracking_uri: str | None = None, *, experiment: str = DEFAULT_EXPERIMENT,
                 run_name: str | None = None, params: Mapping[str, Any] | None = None, cluster=None):
        super().__init__()
        _require_mlflow()
        self.tracking_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or default_uri(".")
        self.experiment = experiment
        self.run_name = run_name
        self.logged_params = dict(params or {})
        """The parameters given to log besides the run's shape (Keras' own ``params`` are its loop's)."""
        self.run_id: str | None = None
        """The MLflow run's id, once the chief has created or resumed it."""
        self._given_cluster = cluster
        self._chief: bool | None = None
        self._client = None
        self._run_params: dict[str, Any] = {}
        self._logged: set[tuple[str, int]] = set()

    # --- checkpointed state (tfdist saves it in every checkpoint) ------------------------
    def state_dict(self) -> dict:
        return {"run_id": self.run_id}

    def load_state_dict(self, state: dict) -> None:
        if isinstance(state.get("run_id"), str):
            self.run_id = state["run_id"]

    # --- tfdist's run hooks --------------------------------------------------------------
    def on_run_begin(self, run: Mapping[str, Any]) -> None:
        """Before training: the run's shape (strategy, replicas, batch sizes...), logged as parameters.
        A new run starts a new MLflow run; a resumed one gets its id back from the checkpoint after this."""
        self._run_params = dict(run)
        self.run_id, self._client, self._logged = None, None, set()

    def on_run_end(self, summary) -> None:
        """After training: the ``FitSummary`` as an artifact, and the MLflow run ends."""
        if not self._is_chief() or self.run_id is None:
            return
        client = self._mlflow()
        client.log_dict(self.run_id, summary.as_dict(), SUMMARY_ARTIFACT)
        client.set_terminated(self.run_id, "FINISHED")
        log.info("MLflow run %s ended (%s, experiment %r)", self.run_id, self.tracking_uri, self.experiment)

    # --- Keras hooks ---------------------------------------------------------------------
    def on_epoch_begin(self, epoch, logs=None):
        if self._is_chief() and self._client is None:  # after tfdist put back a resumed run's state
            self._start()

    def on_epoch_end(self, epoch, logs=None):
        if not self._is_chief():
            return
        if self._client is None:
            self._start()
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(key, float(value), now, int(epoch)) for key, value in sorted((logs or {}).items())
                   if (key, int(epoch)) not in self._logged and _is_number(value)]
        if metrics:
            self._mlflow().log_batch(self.run_id, metrics=metrics)
            self._logged.update((m.key, m.step) for m in metrics)

    # --- MLflow --------------------------------------------------------------------------
    def _is_chief(self) -> bool:
        if self._chief is None:
            self._chief = is_chief(self._given_cluster)
        return self._chief

    def _mlflow(self):
        if self._client is None:
            import mlflow

            if self.tracking_uri.startswith("file:") or "://" not in self.tracking_uri:
                # MLflow 3 asks for an opt-in to its file store, the one store that needs no server or database.
                os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            self._client = mlflow.MlflowClient(tracking_uri=self.tracking_uri)
        return self._client

    def _start(self) -> None:
        """Continues the MLflow run of the checkpoint's state, or creates one."""
        client = self._mlflow()
        if self.run_id is not None:
            try:
                run = client.get_run(self.run_id)
            except Exception as e:  # noqa: BLE001 -- MLflow raises MlflowException for a run it does not know
                log.warning("MLflow run %s of the checkpoint is not in %s (%s); starting a new one", self.run_id,
                            self.tracking_uri, str(e).splitlines()[0][:200])
                self.run_id = None
            else:
                self._resume(run)
                return
        experiment = client.get_experiment_by_name(self.experiment)
        experiment_id = (experiment.experiment_id if experiment is not None
                         else client.create_experiment(self.experiment))
        tags = {"tfdist.checkpoint_dir": str(self._run_params.get("checkpoint_dir"))}
        run = client.create_run(experiment_id, run_name=self.run_name, tags=tags)
        self.run_id = run.info.run_id
        self._log_params(client, {})
        log.info("MLflow run %s started in %s (experiment %r)", self.run_id, self.tracking_uri, self.experiment)

    def _resume(self, run) -> None:
        client = self._mlflow()
        if run.info.status != "RUNNING":
            client.update_run(self.run_id, status="RUNNING")
        for key in run.data.metrics:  # epochs logged before the interruption, after the checkpoint resumed from
            self._logged.update((key, m.step) for m in client.get_metric_history(self.run_id, key))
        self._log_params(client, dict(run.data.params))
        client.set_tag(self.run_id, "tfdist.resumed_from_step", str(self._run_params.get("start_step")))
        log.info("MLflow run %s continued in %s (the run resumed)", self.run_id, self.tracking_uri)

    def _log_params(self, client, logged: Mapping[str, str]) -> None:
        """The run's and the user's parameters; one logged before with another value (a resume
        with other options) is kept, and the new value logged as a tag."""
        from mlflow.entities import Param

        # The run's shape wins over a parameter of the same name (tfdist train's --strategy auto: the one chosen).
        values = {**self.logged_params, **{k: v for k, v in self._run_params.items() if k != "start_step"}}
        fresh = [Param(key, _text(value)) for key, value in sorted(values.items()) if key not in logged]
        changed = {key: _text(value) for key, value in values.items() if key in logged and logged[key] != _text(value)}
        for start in range(0, len(fresh), 100):  # MLflow's limit of parameters per batch
            client.log_batch(self.run_id, params=fresh[start:start + 100])
        for key, value in changed.items():
            client.set_tag(self.run_id, f"tfdist.resumed_with.{key}", value)


def _is_number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True
