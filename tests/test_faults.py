"""TFDIST_FAULT fault injection (tfdist/training/faults.py)."""

from __future__ import annotations

import signal

import pytest

from tfdist.errors import ClusterConfigError
from tfdist.training import faults


@pytest.fixture
def sent(monkeypatch):
    """The signals a task sends itself, instead of sending them."""
    signals: list[int] = []
    monkeypatch.setattr(faults.os, "kill", lambda pid, sig: signals.append(sig))
    return signals


def test_a_fault_fires_once_at_its_step_on_its_task_and_on_the_first_run_only(sent, capsys):
    environ = {"TFDIST_FAULT": "worker:1/kill_at_step:3,term_at_step:5"}
    mine = faults.Faults(task_name="worker:1", environ=environ)
    for step in range(1, 8):
        for event in ("kill_at_step", "term_at_step"):
            mine.fire(event, step)
    assert sent == [signal.SIGKILL, signal.SIGTERM]
    assert "kill_at_step at step 3: sending SIGKILL" in capsys.readouterr().err
    other = faults.Faults(task_name="worker:0", environ=environ)
    other.fire("kill_at_step", 3)
    other.fire("term_at_step", 5)  # no prefix: every task
    restarted = faults.Faults(task_name="worker:1", environ=dict(environ, TFDIST_RESTART="1"))
    restarted.fire("kill_at_step", 3)
    assert sent == [signal.SIGKILL, signal.SIGTERM, signal.SIGTERM]


def test_a_fault_marked_with_a_restart_fires_on_that_run_of_the_cluster_only(sent):
    environ = {"TFDIST_FAULT": "worker:1/kill_at_step:3,worker:1/term_at_step:7@1,int_at_step:9@2"}
    runs = {}
    for restart in ("0", "1", "2", "3"):
        sent.clear()
        task = faults.Faults(task_name="worker:1", environ=dict(environ, TFDIST_RESTART=restart))
        for step in range(1, 12):
            for event in ("kill_at_step", "term_at_step", "int_at_step"):
                task.fire(event, step)
        runs[restart] = list(sent)
    assert runs == {"0": [signal.SIGKILL], "1": [signal.SIGTERM], "2": [signal.SIGINT], "3": []}
    assert faults.parse("term_at_step:7@1", task_name="chief:0") == {("term_at_step", 7): signal.SIGTERM}


def test_with_steps_per_execution_a_fault_fires_at_the_first_reported_step_after_its_own(sent, capsys):
    # steps_per_execution=4: the loop reports steps 4, 8, 12; step 6 is never reported.
    task = faults.Faults(task_name="chief:0", environ={"TFDIST_FAULT": "kill_at_step:6,kill_after_save:6"})
    for step in (4, 8, 12):
        task.fire("kill_at_step", step)
        task.fire("kill_after_save", step)
    assert sent == [signal.SIGKILL, signal.SIGKILL]
    err = capsys.readouterr().err
    assert "kill_at_step at step 8 (asked for step 6: the first step end reported at or after it)" in err
    assert "kill_after_save at step 8 (asked for step 6" in err


def test_a_fault_of_a_step_before_the_resume_point_never_fires(sent):
    # A run resumed at step 8: kill_at_step:5 and :8 were the part done before; :10 is ahead.
    task = faults.Faults(task_name="chief:0", start_step=8,
                         environ={"TFDIST_FAULT": "kill_at_step:5,kill_at_step:8,term_at_step:10"})
    for step in (12, 16):
        task.fire("kill_at_step", step)
        task.fire("term_at_step", step)
    assert sent == [signal.SIGTERM]


def test_a_malformed_item_is_refused_with_the_fix():
    with pytest.raises(ClusterConfigError, match=r"invalid TFDIST_FAULT item; received 'kill:3'. Fix: write "
                                                  r"\[ROLE:INDEX/\]EVENT:STEP"):
        faults.parse("kill:3", task_name="chief:0")
