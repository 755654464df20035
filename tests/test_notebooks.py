"""The notebooks in notebooks/ run end to end and compute what they claim.

Each notebook is executed with nbclient in a kernel of this interpreter (a kernelspec
installed into a temporary JUPYTER_PATH, so no global Jupyter setup is needed or used),
with a temporary working directory. Each notebook's last cell prints one JSON line with
the numbers it computed; the tests assert on those.
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


@pytest.mark.timeout(300)
def test_quickstart(kernel_path, tmp_path, monkeypatch):
    result, _ = run_notebook("01_quickstart.ipynb", kernel_path, tmp_path, monkeypatch)
    assert result["mirrored_strategy"] == "mirrored"
    assert result["num_replicas"] == 2
    assert result["auto_strategy"] == result["one_device_strategy"]
    assert result["epochs"] >= 2
    assert result["mirrored_val_accuracy"] > 0.5  # it learned something
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
    assert_nothing_written(tmp_path)


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
