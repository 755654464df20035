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



def test_a_signal_while_a_complete_runs_results_are_written_is_noted_not_fatal(caplog):
    before = signal.getsignal(signal.SIGTERM)
    with caplog.at_level("WARNING", logger="tfdist"):
        with preemption.DeferredSignals() as deferred:
            os.kill(os.getpid(), signal.SIGTERM)  # the default action would kill this process now
            os.kill(os.getpid(), signal.SIGUSR1)
            assert deferred.received == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before
    assert caplog.text.count("received after the run completed: finishing writing its results") == 1


@pytest.mark.parametrize("keras_name", ["keras", "tf_keras"])
def test_a_sigterm_after_the_last_step_exits_to_be_restarted_and_the_restart_finds_the_run_complete(tmp_path,
                                                                                                    keras_name):
    # fit logged "saving at the end of the current step, then exiting", then returned as if nothing had come: the
    # script went on past the scheduler's grace period into its SIGKILL.
    import tfdist
    from tfdist.checkpoint import layout

    keras = __import__(keras_name)

    class SigtermAtTheEnd(keras.callbacks.Callback):
        def on_train_end(self, logs=None):
            os.kill(os.getpid(), signal.SIGTERM)

    def fit(callbacks):
        return tfdist.fit(_builder(keras_name), "digits", epochs=1, batch_size=128, seed=5, strategy="one_device",
                          checkpoint_dir=str(tmp_path), callbacks=callbacks, verbose=0)

    with pytest.raises(SystemExit) as stopped:
        fit([SigtermAtTheEnd()])
    assert stopped.value.code == 75 and stopped.value.history.tfdist.global_step == 11  # what fit would have returned
    assert layout.latest_metadata(str(tmp_path)).complete
    again = fit([])
    assert again.tfdist.completed and again.tfdist.start_step == again.tfdist.global_step == 11

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


# --- Ctrl-C ----------------------------------------------------------------------------------
def test_ctrl_c_becomes_a_request_to_stop_and_a_second_one_interrupts_at_once(ctrl_c):
    before = signal.getsignal(signal.SIGINT)
    with preemption.PreemptionWatcher() as watcher:
        try:
            os.kill(os.getpid(), signal.SIGINT)
        except KeyboardInterrupt:  # a failure of this test, not the end of the test session
            pytest.fail("the first Ctrl-C interrupted at once")
        assert watcher.requested and watcher.interrupted and watcher.signal_name == "SIGINT"
        with pytest.raises(KeyboardInterrupt, match="Ctrl-C .* while already stopping: stopped at once.*resumes from the last checkpoint"):
            os.kill(os.getpid(), signal.SIGINT)
        with pytest.raises(KeyboardInterrupt, match="already stopping"):  # and a third, while that one unwinds
            watcher._handle_interrupt(signal.SIGINT, None)
    assert signal.getsignal(signal.SIGINT) is before


def test_a_second_ctrl_c_goes_to_the_handler_the_program_had(ctrl_c):
    calls = []
    before = signal.signal(signal.SIGINT, lambda signum, frame: calls.append(signum))
    try:
        with preemption.PreemptionWatcher() as watcher:
            os.kill(os.getpid(), signal.SIGINT)
            assert watcher.requested and calls == []
            os.kill(os.getpid(), signal.SIGINT)
            assert calls == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, before)


def test_ctrl_c_after_a_preemption_signal_interrupts_at_once(ctrl_c):
    with preemption.PreemptionWatcher() as watcher:
        os.kill(os.getpid(), signal.SIGTERM)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
        assert watcher.signal_name == "SIGTERM" and not watcher.interrupted


def test_an_ignored_ctrl_c_stays_ignored():
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with preemption.PreemptionWatcher() as watcher:
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGINT)
            assert not watcher.requested
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.mark.parametrize("saved, complete, expected", [
    (True, False, "interrupted by SIGINT at step 7, saved there: running again resumes at that step"),
    (False, False, "interrupted by SIGINT at step 7, not saved (no checkpoint_dir)"),
    (True, True, "interrupted by SIGINT after the run completed at step 7"),
])
def test_interrupted_is_a_keyboard_interrupt_that_says_where_training_stopped(saved, complete, expected):
    error = preemption.interrupted(7, saved=saved, complete=complete)
    assert type(error) is KeyboardInterrupt and str(error) == expected and (error.step, error.saved) == (7, saved)


@pytest.mark.parametrize("mine, theirs, stops_as", [
    ("SIGINT", None, "mine"),          # my Ctrl-C: every worker stops; I say so
    (None, "SIGINT", "elsewhere"),     # another worker's Ctrl-C: I stop as Ctrl-C too
    ("SIGINT", "SIGTERM", "preempted"),  # a preemption anywhere wins: the job is to be restarted
    (None, "SIGTERM", "preempted"),
])
def test_every_worker_stops_as_the_signal_the_workers_agreed_on(monkeypatch, ctrl_c, mine, theirs, stops_as):
    import tfdist

    # The other worker's flags, [preempted, interrupted, timed, chief's proposal], added in the all-reduce.
    other = [int(theirs == "SIGTERM"), int(theirs == "SIGINT"), 0, 0]
    monkeypatch.setattr(preemption, "sum_over_workers", lambda strategy, values: [a + b for a, b in zip(values, other)])
    agreement = preemption.Agreement(tfdist.make_strategy("one_device"), is_chief=True)
    unit = preemption.Preemption(watcher=preemption.PreemptionWatcher(), agreement=agreement)
    with unit.watcher:
        if mine:
            os.kill(os.getpid(), getattr(signal, mine))
        assert unit.check(3, timed=False, boundary=True) == (True, False)
        with pytest.raises((preemption.Preempted, KeyboardInterrupt)) as info:  # either: a failure, not the session's end
            unit.stop(3, saved=True)
    if stops_as == "preempted":
        assert type(info.value) is preemption.Preempted
    else:
        where = " on another worker" if stops_as == "elsewhere" else ""
        assert type(info.value) is KeyboardInterrupt
        assert str(info.value) == f"interrupted by SIGINT{where} at step 3, saved there: running again resumes at that step"


def _builder(keras_name: str):
    """BatchNormalization, Dropout and a decaying learning rate: the state an exact resume must carry."""
    def make():
        keras = __import__(keras_name)
        layers = keras.layers
        model = keras.Sequential([
            keras.Input((8, 8, 1)), layers.GaussianNoise(0.1), layers.Flatten(), layers.Dense(32),
            layers.BatchNormalization(), layers.Activation("relu"), layers.Dropout(0.2), layers.Dense(10),
        ])
        schedule = keras.optimizers.schedules.CosineDecay(0.05, decay_steps=33)
        model.compile(keras.optimizers.Adam(schedule), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
        return model

    return make


@pytest.mark.parametrize("keras_name", ["keras", "tf_keras"])
def test_ctrl_c_mid_epoch_saves_that_step_and_the_next_fit_ends_bit_identical(tmp_path, monkeypatch, ctrl_c,
                                                                             keras_name):
    import tfdist
    from tfdist.checkpoint import layout

    from conftest import assert_bit_identical, checkpoint_tensors

    def fit(directory):  # saves only at epoch ends (11 steps each): Ctrl-C at step 7 would lose 7 steps
        return tfdist.fit(_builder(keras_name), "digits", epochs=3, batch_size=128, seed=5, deterministic=True,
                          strategy="one_device", checkpoint_dir=str(directory), verbose=0)

    reference = fit(tmp_path / "ref")
    monkeypatch.setenv("TFDIST_FAULT", "int_at_step:7")
    with pytest.raises(KeyboardInterrupt, match="at step 7, saved there") as info:
        fit(tmp_path / "int")
    assert type(info.value) is KeyboardInterrupt and info.value.step == 7 and layout.latest_metadata(str(tmp_path / "int")).global_step == 7
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    monkeypatch.delenv("TFDIST_FAULT")
    resumed = fit(tmp_path / "int")
    assert resumed.tfdist.start_step == 7 and resumed.history == reference.history
    assert_bit_identical(checkpoint_tensors(str(tmp_path / "ref")), checkpoint_tensors(str(tmp_path / "int")))


@pytest.mark.timeout(300)
def test_a_script_stopped_by_ctrl_c_in_fit_exits_as_pythons_own_ctrl_c_does(procs, ctrl_c, tmp_path):
    # By SIGINT (130 in a shell, which stops a shell loop), not with status 1 as if it had handled it.
    import sys
    import textwrap

    from tfdist.checkpoint import layout

    from conftest import base_env

    script = textwrap.dedent(f"""
        import tfdist
        from tfdist.models import builder
        tfdist.fit(builder("linear", input_shape=(8, 8, 1), num_classes=10), "digits", epochs=2, batch_size=32,
                   seed=1, strategy="one_device", checkpoint_dir={str(tmp_path)!r}, verbose=0)
    """)
    code, out = procs.run([sys.executable, "-c", script], timeout=240, env=base_env(TFDIST_FAULT="int_at_step:3"))
    assert code == -signal.SIGINT, out[-3000:]
    assert "KeyboardInterrupt: interrupted by SIGINT at step 3, saved there" in out
    assert layout.latest_metadata(str(tmp_path)).global_step == 3


_SIGTERM_IN_SETUP = """
import os, signal, sys, time
import keras, tfdist

def build():  # the strategy exists (and TensorFlow's own SIGTERM handler with it); training has not begun
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
    print("trained on after SIGTERM", flush=True)
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(10)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model

tfdist.fit(build, "digits", epochs=1, batch_size=32, steps_per_epoch=2, verbose=0, strategy="multi_worker_mirrored",
           checkpoint_dir=sys.argv[1])
print("fit returned", flush=True)
"""


@pytest.mark.timeout(240)
def test_a_sigterm_before_training_begins_exits_to_be_restarted_though_tensorflow_swallows_it(procs, tmp_path):
    import json
    import sys

    from conftest import base_env, free_port

    from tfdist import env

    script = tmp_path / "setup_sigterm.py"
    script.write_text(_SIGTERM_IN_SETUP)
    config = {"cluster": {"worker": [f"127.0.0.1:{free_port()}"]}, "task": {"type": "worker", "index": 0}}
    code, out = procs.run([sys.executable, str(script), str(tmp_path / "run")], timeout=180,
                          env=base_env(TF_CONFIG=json.dumps(config)))
    assert code == env.EXIT_PREEMPTED, out[-3000:]
    assert "SIGTERM received before training began: exiting with code 75" in out
    assert "trained on after SIGTERM" not in out and "fit returned" not in out


@pytest.mark.parametrize("keras_name", ["keras", "tf_keras"])
def test_a_sigterm_during_an_epochs_validation_stops_at_that_epochs_save(tmp_path, keras_name):
    # It was acted on at the next step's end: the next epoch began (its callbacks ran) and one more step trained.
    import tfdist
    from tfdist.checkpoint import layout

    keras = __import__(keras_name)
    began = []

    class SigtermInValidation(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            began.append(epoch)

        def on_test_begin(self, logs=None):
            if began == [0]:
                os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(SystemExit) as stopped:
        tfdist.fit(_builder(keras_name), "digits", epochs=3, batch_size=128, seed=5, strategy="one_device",
                   checkpoint_dir=str(tmp_path), callbacks=[SigtermInValidation()], verbose=0)
    assert stopped.value.code == 75 and began == [0]
    assert layout.latest_metadata(str(tmp_path)).global_step == 11  # epoch 0's end

def test_a_sigterm_while_train_writes_the_model_lets_the_write_finish(tmp_path, monkeypatch, capsys):
    # The default action killed tfdist train there (exit 143, no message), its scratch copy of the model left behind.
    import tempfile

    from tfdist.cli import main
    from tfdist.training import export

    write = export.save_model

    handlers = []

    def sigterm_then_write(*args, **kwargs):
        handlers.append(signal.getsignal(signal.SIGTERM))
        if isinstance(getattr(handlers[-1], "__self__", None), preemption.DeferredSignals):  # else it would kill pytest
            os.kill(os.getpid(), signal.SIGTERM)
        return write(*args, **kwargs)

    monkeypatch.setattr(export, "save_model", sigterm_then_write)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "scratch"))
    (tmp_path / "scratch").mkdir()
    assert main(["train", "--model", "linear", "--epochs", "1", "--output-dir", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "model.keras").is_file() and "tfdist train: strategy one_device" in capsys.readouterr().out
    assert len(handlers) == 1 and isinstance(handlers[0].__self__, preemption.DeferredSignals)
    assert not any(name.startswith("tfdist-model-") for name in os.listdir(tmp_path / "scratch"))


def test_a_preemption_without_a_checkpoint_dir_does_not_claim_a_save(monkeypatch, caplog):
    import tfdist

    monkeypatch.setenv("TFDIST_FAULT", "term_at_step:3")
    with caplog.at_level("WARNING", logger="tfdist"), pytest.raises(SystemExit) as stopped:
        tfdist.fit(_builder("keras"), "digits", epochs=1, batch_size=128, seed=5, strategy="one_device", verbose=0)
    assert stopped.value.code == 75
    assert ("preempted by SIGTERM: stopped at step 3, not saved (no checkpoint_dir): a restart trains from the start; "
            "exiting with code 75") in caplog.text
    assert "saved at step" not in caplog.text


@pytest.mark.timeout(240)
def test_ctrl_c_to_tfdist_train_piped_into_tee_saves_its_step_and_exits_130(procs, tmp_path, ctrl_c):
    # A terminal's Ctrl-C reaches the whole pipeline `tfdist train ... 2>&1 | tee log`: tee is gone first, and the
    # next write raised BrokenPipeError mid-step, before the step was saved: exit 1 with a traceback.
    import sys

    from tfdist.checkpoint import layout

    from conftest import base_env

    out = tmp_path / "run"
    proc = procs.start([sys.executable, "-m", "tfdist", "train", "--model", "linear", "--epochs", "40",
                        "--save-every-steps", "100000", "--output-dir", str(out)], env=base_env())
    for line in proc.stdout:  # the pipe's reader goes away once training is under way, as tee does
        if line.startswith("Epoch 3/"):
            break
    proc.stdout.close()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == 130
    saved = layout.latest_metadata(str(out / "checkpoints")).global_step
    assert saved > 2 * 44  # the Ctrl-C's step in epoch 3, not epoch 2's end
    # The run started again resumes at that step. It ends with the epoch the step is in: the resume is what counts.
    epochs = str(saved // 44 + 1)
    code, again = procs.tfdist("train", "--model", "linear", "--epochs", epochs, "--save-every-steps", "100000",
                               "--output-dir", str(out), timeout=200)
    assert code == 0 and f"global step {saved}" in again, again[-2000:]



def test_tfdist_train_writes_the_model_of_a_run_a_sigterm_reached_after_its_last_step(tmp_path, monkeypatch, capsys):
    # fit exits with 75 there, as promised; tfdist train exited with it before writing model.keras, so a job not
    # restarted ended complete without its model file.
    from tfdist.checkpoint import layout
    from tfdist.cli import main

    monkeypatch.setenv("TFDIST_FAULT", "term_at_step:44")  # the last step: acted on after the epoch's validation
    out = tmp_path / "out"
    assert main(["train", "--model", "linear", "--epochs", "1", "--output-dir", str(out)]) == 0
    assert (out / "model.keras").is_file() and "step 44/44" in capsys.readouterr().out
    assert layout.latest_metadata(str(out / "checkpoints")).complete
