"""Chief-only callbacks and MLflow tracking: one MLflow run per training run, every epoch logged
once, the same run continued after a SIGKILL and resume (read back through MLflow's own API).

The same under a 2-worker launch: tests/test_outputs_launch.py."""

from __future__ import annotations

import json
import os
import signal
import sys

import numpy as np
import pytest
from conftest import base_env

import tfdist

pytest.importorskip("mlflow", reason="MLflow tracking needs the mlflow package (pip install 'tfdist[mlflow]')")

# A run of 3 epochs of 4 steps, saved every 2 steps, logged to MLflow in OUT/mlruns.
SCRIPT = """
import os, sys
import numpy as np
import keras
import tfdist

out = sys.argv[1]


def build():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Rescaling(0.5), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(3)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


class EpochLog(keras.callbacks.Callback):
    \"\"\"Appends 'TASK EPOCH COUNT' to OUT/epochs.txt at each epoch end; COUNT is checkpointed state.\"\"\"

    def __init__(self):
        super().__init__()
        self.count = 0

    def on_epoch_end(self, epoch, logs=None):
        self.count += 1
        with open(os.path.join(out, "epochs.txt"), "a") as f:
            f.write(f"{tfdist.task_role()} {epoch} {self.count}\\n")

    def state_dict(self):
        return {"count": self.count}

    def load_state_dict(self, state):
        self.count = state["count"]


rng = np.random.RandomState(0)
x, y = rng.rand(192, 6).astype("float32"), rng.randint(0, 3, 192)
callbacks = [keras.callbacks.TensorBoard(os.path.join(out, "tb")), tfdist.callbacks.chief_only(EpochLog()),
             tfdist.tracking.MLflowLogger(tfdist.tracking.default_uri(out), params={"note": "test"})]
history = tfdist.fit(build, (x, y), validation_data=(x[:64], y[:64]), epochs=3, steps_per_epoch=4, batch_size=16,
                     seed=1, verbose=0, checkpoint_dir=os.path.join(out, "ckpt"), save_every_steps=2,
                     callbacks=callbacks, profile_steps=(2, 3))
if history is not None:  # not on the evaluator task
    tfdist.export(history.model, os.path.join(out, "serving", "1"))
    if tfdist.is_chief():
        print(f"STARTED AT STEP {history.tfdist.start_step}", flush=True)
        np.save(os.path.join(out, "outputs.npy"), np.asarray(history.model(x[:16], training=False)))
"""


def mlflow_runs(out) -> list:
    """Every MLflow run in OUT/mlruns, read with MLflow's own client."""
    import mlflow

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for it for a file store
    client = mlflow.MlflowClient(tfdist.tracking.default_uri(str(out)))
    experiment = client.get_experiment_by_name("tfdist")
    assert experiment is not None, f"no MLflow experiment in {out}/mlruns"
    return client, client.search_runs([experiment.experiment_id])


def check_one_run_every_epoch_once(out, *, strategy: str, num_workers: int) -> None:
    """One finished MLflow run: each epoch's metrics once at step = epoch, the run's shape as
    parameters, the FitSummary as an artifact, and the resume recorded."""
    client, runs = mlflow_runs(out)
    assert len(runs) == 1, [r.info.run_id for r in runs]
    run = runs[0]
    assert run.info.status == "FINISHED"
    for key in ("loss", "accuracy", "val_loss"):
        assert [m.step for m in client.get_metric_history(run.info.run_id, key)] == [0, 1, 2], key
    params = run.data.params
    assert params["strategy"] == strategy and params["num_workers"] == str(num_workers)
    assert params["global_batch_size"] == "16" and params["note"] == "test"
    assert params["checkpoint_dir"] == os.path.join(str(out), "ckpt")
    assert "tfdist.resumed_from_step" in run.data.tags  # the killed run was continued, not started again
    local = client.download_artifacts(run.info.run_id, tfdist.tracking.SUMMARY_ARTIFACT, str(out / "downloaded"))
    with open(local) as f:
        summary = json.load(f)
    assert summary["global_step"] == 12 and summary["completed"] and summary["num_workers"] == num_workers


@pytest.mark.timeout(300)
def test_one_mlflow_run_logs_every_epoch_once_across_a_sigkill_and_resume(tmp_path, procs, monkeypatch, capsys):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    # Killed right after the save at the end of epoch 0 was started, its metrics logged. That
    # save is lost: the resumed run trains epoch 0's last steps again, and must not log it twice.
    code, out = procs.run([sys.executable, str(script), str(tmp_path)], timeout=120,
                          env=base_env(TFDIST_FAULT="kill_after_save:4"))
    assert code == -signal.SIGKILL, out[-3000:]
    lost = list((tmp_path / "ckpt").glob("ckpt-4.*"))
    assert lost
    for path in lost:
        path.unlink()
    monkeypatch.setattr(sys, "argv", [str(script), str(tmp_path)])
    exec(compile(SCRIPT, str(script), "exec"), {"__name__": "__main__"})  # resumed here: one TensorFlow start less
    assert "STARTED AT STEP 2" in capsys.readouterr().out
    check_one_run_every_epoch_once(tmp_path, strategy="one_device", num_workers=1)


def test_chief_only_skips_its_callback_on_other_tasks_and_keeps_its_state():
    import keras

    from tfdist.cluster import ClusterSpec

    class Counter(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.epochs = []

        def on_epoch_end(self, epoch, logs=None):
            self.epochs.append(epoch)

        def state_dict(self):
            return {"epochs": list(self.epochs)}

        def load_state_dict(self, state):
            self.epochs = list(state["epochs"])

    jobs = {"worker": ("127.0.0.1:1", "127.0.0.1:2")}
    chief, other = (ClusterSpec(jobs=jobs, task_type="worker", task_index=i, source="test") for i in (0, 1))
    wrapped = {name: tfdist.callbacks.chief_only(Counter(), cluster=spec) for name, spec in
               (("chief", chief), ("other", other))}
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    for cb in wrapped.values():
        model.fit(np.ones((4, 2)), np.ones((4, 1)), epochs=2, verbose=0, callbacks=[cb])
    assert wrapped["chief"].callback.epochs == [0, 1] and wrapped["other"].callback.epochs == []
    assert wrapped["chief"].state_dict() == {"epochs": [0, 1]}
    wrapped["other"].load_state_dict({"epochs": [0]})
    assert wrapped["other"].callback.epochs == [0]
    assert tfdist.is_chief(chief) and not tfdist.is_chief(other) and tfdist.task_role(other) == "worker:1"
    with pytest.raises(tfdist.ModelError, match=r"chief_only wraps a Keras callback; received int\. Fix: pass"):
        tfdist.callbacks.chief_only(3)
