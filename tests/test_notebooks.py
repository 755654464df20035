"""The notebooks in notebooks/ run end to end and compute what they claim.

Each notebook is executed with nbclient in a kernel of this interpreter (a kernelspec
installed into a temporary JUPYTER_PATH, so no global Jupyter setup is needed or used),
with a temporary working directory. Each notebook's last cell prints one JSON line with
the numbers it computed; the tests assert on those. One more test drives a kernel directly:
Jupyter's interrupt during ``tfdist.fit``, then the cell run again.
"""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "notebooks")
KERNEL_NAME = "tfdist-test"
CELL_TIMEOUT = 240


@pytest.fixture(scope="module")
def kernel_path(tmp_path_factory):
    """A JUPYTER_PATH entry holding a kernelspec that starts ``sys.executable -m ipykernel_launcher``."""
    from ipykernel.kernelspec import install

    prefix = tmp_path_factory.mktemp("jupyter")
    install(kernel_name=KERNEL_NAME, display_name="tfdist test kernel", prefix=str(prefix))
    return str(prefix / "share" / "jupyter")


def run_notebook(name: str, kernel_path: str, workdir, monkeypatch) -> tuple[dict, float]:
    """Executes notebooks/NAME in ``workdir``; returns its last JSON line and the seconds it took."""
    monkeypatch.setenv("JUPYTER_PATH", kernel_path)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    monkeypatch.delenv("TF_CONFIG", raising=False)  # the notebooks are about this machine alone
    with open(os.path.join(NOTEBOOKS, name)) as f:
        nb = nbformat.read(f, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        timeout=CELL_TIMEOUT,
        kernel_name=KERNEL_NAME,
        resources={"metadata": {"path": str(workdir)}},
    )
    start = time.monotonic()
    client.execute()
    seconds = time.monotonic() - start
    print(f"{name}: {seconds:.1f} s")
    last = [cell for cell in nb.cells if cell.cell_type == "code"][-1]
    text = "".join(out.get("text", "") for out in last.outputs if out.output_type == "stream")
    lines = [line for line in text.splitlines() if line.startswith("{")]
    assert lines, f"{name}: its last cell printed no JSON line; outputs: {last.outputs!r}"
    return json.loads(lines[-1]), seconds


def assert_nothing_written(workdir) -> None:
    assert not os.listdir(workdir), f"the notebook wrote into its working directory: {os.listdir(workdir)}"


def test_kernel_is_this_interpreter(kernel_path):
    with open(os.path.join(kernel_path, "kernels", KERNEL_NAME, "kernel.json")) as f:
        spec = json.load(f)
    assert spec["argv"][0] == sys.executable


@pytest.mark.plot
@pytest.mark.timeout(300)
def test_quickstart(kernel_path, tmp_path, monkeypatch):
    result, _ = run_notebook("01_quickstart.ipynb", kernel_path, tmp_path, monkeypatch)
    assert result["mirrored_strategy"] == "mirrored"
    assert result["num_replicas"] == 2
    assert result["auto_strategy"] == result["one_device_strategy"]
    assert result["epochs"] >= 2
    assert result["mirrored_val_accuracy"] > 0.5  # it learned something
    # The model saved with tfdist.save_model and loaded back scores what the run reported.
    assert result["saved_model_val_accuracy"] == pytest.approx(result["one_device_val_accuracy"], abs=1e-6)
    # tfdist.evaluate under mirrored, with the batch the run validated with, gives that validation's accuracy.
    assert result["mirrored_evaluated_accuracy"] == result["mirrored_val_accuracy"]
    # tfdist.predict's outputs, every example once in order, score the same (each replica its part, as evaluate).
    assert result["mirrored_predicted_accuracy"] == pytest.approx(result["mirrored_evaluated_accuracy"], abs=1e-6)
    assert_nothing_written(tmp_path)


@pytest.mark.timeout(300)
def test_resume(kernel_path, tmp_path, monkeypatch):
    result, _ = run_notebook("02_resume.ipynb", kernel_path, tmp_path, monkeypatch)
    assert result["killed_returncode"] == -9
    assert result["start_step"] > 0
    assert result["start_step"] == result["killed_at_step"]
    assert result["resumed_from"] == f"ckpt-{result['start_step']}"
    assert result["global_step"] > result["start_step"]
    assert result["variables_compared"] > 10
    assert result["bit_identical"] is True
    assert result["epoch_logs_same"] is True  # the per-epoch lines it prints say "same", as the tensors are
    assert_nothing_written(tmp_path)


@pytest.mark.plot
@pytest.mark.timeout(300)
def test_plan(kernel_path, tmp_path, monkeypatch):
    result, _ = run_notebook("03_plan.ipynb", kernel_path, tmp_path, monkeypatch)
    assert result["step_time_source"] == "measured"
    assert result["step_time"] > 0
    assert result["params"] > 0
    assert result["global_batch_size"] == 32
    assert result["estimated_seconds"] is not None and result["estimated_seconds"] > 0
    assert result["measured_epoch_seconds"] > 0
    assert result["ratio"] > 0
    assert result["plot_bytes"] > 1000  # a real PNG
    assert_nothing_written(tmp_path)


_INTERRUPT_SETUP = """
import json, time
import numpy as np
import keras
import tfdist

def build():
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(32),
                              keras.layers.BatchNormalization(), keras.layers.Activation("relu"),
                              keras.layers.Dropout(0.2), keras.layers.Dense(10)])
    model.compile(keras.optimizers.Adam(keras.optimizers.schedules.CosineDecay(0.01, 88)),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model

class Steps(keras.callbacks.Callback):  # prints each step; slow enough for the interrupt to land mid-run
    def __init__(self, pause):
        super().__init__()
        self.pause, self.seen = pause, 0
    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        print(f"STEP {self.seen}", flush=True)
        time.sleep(self.pause)

def run(directory, pause=0.0):
    return tfdist.fit(build, "digits", epochs=2, batch_size=32, seed=7, deterministic=True, verbose=0,
                      strategy="one_device", checkpoint_dir=directory, callbacks=[Steps(pause)])
"""


def _execute(client, manager, code: str, *, interrupt_at: str | None = None, timeout: float = CELL_TIMEOUT):
    """Runs ``code`` in the kernel; interrupts it (as Jupyter's button does) once ``interrupt_at``
    was printed. Returns (printed text, error name or None, error value or None)."""
    import queue

    msg_id = client.execute(code)
    text, error, deadline, interrupted = "", (None, None), time.monotonic() + timeout, False
    while time.monotonic() < deadline:
        try:
            msg = client.get_iopub_msg(timeout=1)
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            text += content["text"]
            if interrupt_at and not interrupted and interrupt_at in text:
                manager.interrupt_kernel()
                interrupted = True
        elif kind == "error":
            error = (content["ename"], content["evalue"])
        elif kind == "status" and content["execution_state"] == "idle":
            return text, *error
    raise AssertionError(f"the cell did not finish within {timeout} s; it printed: {text[-2000:]}")


@pytest.mark.timeout(300)
def test_interrupting_the_kernel_during_fit_saves_and_the_cell_run_again_resumes_bit_identical(
        kernel_path, tmp_path, monkeypatch):
    import re

    from jupyter_client.manager import start_new_kernel

    monkeypatch.setenv("JUPYTER_PATH", kernel_path)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    monkeypatch.delenv("TF_CONFIG", raising=False)
    manager, client = start_new_kernel(kernel_name=KERNEL_NAME, cwd=str(tmp_path))
    try:
        _, error, _ = _execute(client, manager, _INTERRUPT_SETUP)
        assert error is None
        text, error, value = _execute(client, manager, f"run({str(tmp_path / 'int')!r}, pause=0.05)",
                                      interrupt_at="STEP 10\n")
        assert error == "KeyboardInterrupt", (error, value, text[-2000:])
        stopped = int(re.search(r"at step (\d+), saved there", value).group(1))
        assert 10 <= stopped < 88 and f"STEP {stopped}\n" in text and f"STEP {stopped + 1}\n" not in text

        text, error, value = _execute(client, manager, f"""
resumed = run({str(tmp_path / 'int')!r})
reference = run({str(tmp_path / 'ref')!r})
print(json.dumps({{"start_step": resumed.tfdist.start_step, "global_step": resumed.tfdist.global_step,
                  "same_history": resumed.history == reference.history,
                  "same_weights": all(np.array_equal(a, b) for a, b in
                                      zip(resumed.model.get_weights(), reference.model.get_weights()))}}))
""")
        assert error is None, (error, value)
        result = json.loads(text.strip().splitlines()[-1])
        assert result == {"start_step": stopped, "global_step": 88, "same_history": True, "same_weights": True}
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
