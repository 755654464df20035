"""Preemption: the signal watcher, and how the workers of a job agree to save together."""

import os
import signal

import pytest

from tfdist.training import preemption


def test_a_signal_becomes_a_request_and_the_previous_handler_comes_back():
    before = signal.getsignal(signal.SIGUSR1)
    with preemption.PreemptionWatcher() as watcher:
        assert not watcher.requested
        os.kill(os.getpid(), signal.SIGUSR1)
        assert watcher.requested and watcher.signal_name == "SIGUSR1"
    assert signal.getsignal(signal.SIGUSR1) is before


@pytest.mark.parametrize("steps, seconds, expected", [
    (10, 0.1, 100),        # 10 ms steps: agree every 100 steps, about once a second
    (1, 4.0, 1),           # steps slower than the period: every step
    (5, 0.0, 1),           # nothing measured yet
    (0, 1.0, 1),
    (10**9, 1.0, preemption.MAX_AGREE_INTERVAL),
])
def test_agreements_come_about_once_a_period(steps, seconds, expected):
    assert preemption.agree_interval(steps=steps, seconds=seconds, period=1.0) == expected


def test_the_chief_sets_the_agreement_cadence_from_the_measured_step_time(monkeypatch):
    import tfdist

    clock = {"now": 100.0}
    monkeypatch.setattr(preemption.time, "monotonic", lambda: clock["now"])
    chief = preemption.Agreement(tfdist.make_strategy("one_device"), is_chief=True, period=1.0)
    assert chief.due(1)
    assert chief.agree(1, [False, True]) == [False, True]
    assert chief.due(2)  # the first interval is one step: nothing measured yet
    clock["now"] += 0.02  # one step took 20 ms
    assert chief.agree(2, [True, False]) == [True, False]
    assert not chief.due(3) and chief.due(4)  # the interval at most doubles: 2 steps
    step, intervals = 4, []
    for _ in range(6):  # steps of 1/64 s: 4, 8, 16, 32, then 1 s / (1/64 s) = 64, 64
        clock["now"] += (step - chief._last[0]) / 64
        chief.agree(step, [False])
        intervals.append(chief._next_step - step)
        step = chief._next_step
    assert intervals == [4, 8, 16, 32, 64, 64] and not chief.due(step - 1) and chief.due(step)
    worker = preemption.Agreement(tfdist.make_strategy("one_device"), is_chief=False, period=1.0)
    worker.agree(1, [False])
    clock["now"] += 5.0
    worker.agree(2, [False])
    assert worker.due(3)  # alone, a non-chief gets no proposal: every step


def test_workers_also_agree_where_every_worker_pauses_anyway(monkeypatch):
    import tfdist

    clock = {"now": 100.0}
    monkeypatch.setattr(preemption.time, "monotonic", lambda: clock["now"])
    agreement = preemption.Agreement(tfdist.make_strategy("one_device"), is_chief=True, period=1.0)
    unit = preemption.Preemption(watcher=preemption.PreemptionWatcher(), agreement=agreement)
    assert unit.check(1, timed=False) == (False, False)
    for step in (2, 4, 8):  # fast steps: the next agreement is far away
        clock["now"] += 0.001 * step
        unit.check(step, timed=False)
    assert not agreement.due(9)
    unit.watcher._event.set()  # a signal arrived
    assert unit.check(9, timed=True) == (False, False)  # not an agreed step: no worker acts alone
    assert unit.check(10, timed=False, boundary=True) == (True, False)  # a save or an epoch's end
