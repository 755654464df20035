"""The user's callbacks keep their state across a resume (tfdist/training/callback_state.py)."""

from __future__ import annotations

import csv
import json
import logging

import numpy as np
import pytest

import tfdist
from tfdist.checkpoint import layout
from tfdist.errors import ModelError
from tfdist.training.callback_state import CallbackState

from conftest import Crash, assert_bit_identical, checkpoint_tensors, crash_after

KERASES = ["keras", "tf_keras"]


def _through_json(state: dict) -> dict:
    return json.loads(json.dumps(state))


@pytest.mark.parametrize("keras_name", KERASES)
def test_built_in_callbacks_get_their_counters_back_after_on_train_begin_reset_them(keras_name):
    keras = __import__(keras_name)
    cbs = keras.callbacks
    before = [cbs.ReduceLROnPlateau(monitor="loss", patience=3), cbs.EarlyStopping(monitor="val_loss", patience=5),
              cbs.ModelCheckpoint("unused.keras", monitor="loss", save_best_only=True)]
    for cb in before:
        cb.on_train_begin() if hasattr(cb, "_reset") else None
    before[0].wait, before[0].cooldown_counter, before[0].best = 2, 1, np.float32(0.25)
    before[1].wait, before[1].best, before[1].best_epoch = 4, np.float64(0.5), 3
    before[2].best = 0.125
    saved = CallbackState(before, model=None).capture()

    after = [cbs.ReduceLROnPlateau(monitor="loss", patience=3), cbs.EarlyStopping(monitor="val_loss", patience=5),
             cbs.ModelCheckpoint("unused.keras", monitor="loss", save_best_only=True)]
    state = CallbackState(after, model=None)
    state.resume_from(_through_json(saved), arrays_restored=False)
    for cb in after:
        cb.on_train_begin()  # resets ReduceLROnPlateau's and EarlyStopping's counters
    state.restore()
    assert (after[0].wait, after[0].cooldown_counter, after[0].best) == (2, 1, 0.25)
    assert (after[1].wait, after[1].best, after[1].best_epoch) == (4, 0.5, 3)
    assert after[2].best == 0.125
    assert sorted(saved) == ["0:ReduceLROnPlateau", "1:EarlyStopping", "2:ModelCheckpoint"]



@pytest.mark.parametrize("keras_name", KERASES)
def test_a_complete_run_started_again_gives_back_its_callbacks_as_the_run_left_them(keras_name, tmp_path):
    # They came back as constructed: a script printing early_stopping.stopped_epoch after fit printed 0 the second time.
    from tfdist.models import builder

    keras = __import__(keras_name)

    def run():
        stop = keras.callbacks.EarlyStopping(monitor="val_loss", patience=1, min_delta=10.0)  # stops after epoch 1
        plateau = keras.callbacks.ReduceLROnPlateau(monitor="val_loss", patience=5)
        history = tfdist.fit(builder("linear", input_shape=(8, 8, 1), num_classes=10,
                                     keras="3" if keras_name == "keras" else "2"),
                             "digits", epochs=5, batch_size=128, seed=1, strategy="one_device", verbose=0,
                             checkpoint_dir=str(tmp_path), callbacks=[stop, plateau])
        return (stop.stopped_epoch, stop.wait, stop.best, plateau.best, history.epoch, history.tfdist.global_step)

    first = run()
    assert first[0] == 1 and first[-1] == 22  # stopped after 2 of 5 epochs
    assert run() == first

def test_a_callback_with_state_dict_keeps_its_own_state_and_its_keras_base_class_state():
    import keras

    class CountingReducer(keras.callbacks.ReduceLROnPlateau):
        def __init__(self):
            super().__init__(monitor="loss")
            self.batches = 0

        def state_dict(self):
            return {"batches": self.batches, "seen": [np.int64(1), 2.5]}

        def load_state_dict(self, state):
            self.batches = state["batches"]

    first = CountingReducer()
    first.on_train_begin()
    first.batches, first.wait = 17, 2
    saved = _through_json(CallbackState([first], model=None).capture())
    assert saved["0:CountingReducer"]["state_dict"] == {"batches": 17, "seen": [1, 2.5]}

    second = CountingReducer()
    state = CallbackState([second], model=None)
    state.resume_from(saved, arrays_restored=False)
    second.on_train_begin()
    state.restore()
    assert (second.batches, second.wait) == (17, 2)


def test_a_state_json_cannot_hold_is_refused_at_the_start_naming_the_callback_and_value():
    import keras

    class Holder(keras.callbacks.Callback):
        def state_dict(self):
            return {"table": np.zeros((2, 2))}

        def load_state_dict(self, state):
            pass

    with pytest.raises(ModelError, match=r"numpy.ndarray at 0:Holder.state_dict\(\)\['table'\].*Fix:"):
        CallbackState([Holder()], model=None).restore()


def test_callbacks_that_changed_since_the_checkpoint_start_afresh_with_a_warning(caplog):
    import keras

    saved = CallbackState([keras.callbacks.EarlyStopping()], model=None).capture()
    changed = [keras.callbacks.ReduceLROnPlateau(), keras.callbacks.EarlyStopping()]
    state = CallbackState(changed, model=None)
    state.resume_from(saved, arrays_restored=False)
    with caplog.at_level(logging.WARNING, logger="tfdist"):
        state.restore()
    message = " ".join(r.getMessage() for r in caplog.records)
    assert "0:ReduceLROnPlateau, 1:EarlyStopping start afresh; the saved state of 0:EarlyStopping is not used" in message


@pytest.mark.parametrize("keras_name", KERASES)
def test_a_csv_logger_appends_in_a_resumed_run_only(keras_name, tmp_path):
    keras = __import__(keras_name)
    fresh, resumed = keras.callbacks.CSVLogger(str(tmp_path / "a.csv")), keras.callbacks.CSVLogger(str(tmp_path / "b.csv"))
    CallbackState([fresh], model=None).prepare(resuming=False)
    CallbackState([resumed], model=None).prepare(resuming=True)
    assert (fresh.append, resumed.append) == (False, True)


def test_a_resumed_csv_logger_loses_the_rows_written_after_its_checkpoint_and_keeps_the_rest(tmp_path):
    import keras

    path = tmp_path / "log.csv"
    # An earlier run's rows (epochs 0-3), then this run's, killed after epoch 3's row and before
    # the checkpoint of that epoch's end was complete: it resumes in epoch 2.
    earlier = "epoch;loss\r\n0;0.9\r\n1;0.8\r\n2;0.7\r\n3;0.6\r\n"
    path.write_text(earlier + "0;0.5\r\n1;0.4\r\n2;0.3\r\n3;0.2\r\n", newline="")
    logger = keras.callbacks.CSVLogger(str(path), separator=";")
    CallbackState([logger], model=None).prepare(resuming=True, epoch=2)
    assert path.read_bytes().decode() == earlier + "0;0.5\r\n1;0.4\r\n"
    assert logger.append
    before = path.stat().st_mtime_ns
    CallbackState([logger], model=None).prepare(resuming=True, epoch=2)  # nothing more to take off
    assert path.stat().st_mtime_ns == before
    CallbackState([keras.callbacks.CSVLogger(str(tmp_path / "absent.csv"))], model=None).prepare(resuming=True, epoch=1)
    assert not (tmp_path / "absent.csv").exists()


# Runs in each directory given, one after the other: a run started again, then the uninterrupted one.
_KILLED_CSV_RUN = """
import sys, numpy as np, keras, tfdist
x = np.random.default_rng(0).random((40, 8)).astype("float32")
y = (x.sum(axis=1) > 4).astype("int32")
def build():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8), keras.layers.BatchNormalization(),
                              keras.layers.Dense(2)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model
for directory in sys.argv[1:]:
    tfdist.fit(build, (x, y), epochs=4, batch_size=8, seed=1, strategy="one_device", verbose=0,
               checkpoint_dir=directory + "/ckpt", callbacks=[keras.callbacks.CSVLogger(directory + "/log.csv")])
"""


@pytest.mark.timeout(300)
def test_a_run_killed_while_an_epochs_save_is_in_flight_writes_that_epochs_csv_row_once(procs, tmp_path):
    import signal
    import sys

    from conftest import base_env

    def run(*directories, fault=None):
        environ = base_env(**({"TFDIST_FAULT": fault} if fault else {}))
        return procs.run([sys.executable, "-c", _KILLED_CSV_RUN, *map(str, directories)], timeout=240, env=environ)

    # 5 steps an epoch: killed as epoch 1's end save starts, after its row was written.
    code, out = run(tmp_path / "killed", fault="kill_after_save:10")
    assert code == -signal.SIGKILL, out[-3000:]
    # Started again; the same process then makes the uninterrupted run.
    code, out = run(tmp_path / "killed", tmp_path / "reference")
    assert code == 0, out[-3000:]
    reference = _rows(tmp_path / "reference" / "log.csv")
    assert [row[0] for row in reference] == ["epoch", "0", "1", "2", "3"]
    assert _rows(tmp_path / "killed" / "log.csv") == reference


# --- whole runs ------------------------------------------------------------------------------
def _build(keras_name: str):
    def make():
        keras = __import__(keras_name)
        model = keras.Sequential([
            keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(32),
            keras.layers.BatchNormalization(), keras.layers.Activation("relu"), keras.layers.Dropout(0.1),
            keras.layers.Dense(10),
        ])
        model.compile(keras.optimizers.SGD(0.2, momentum=0.5),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
        return model

    return make


def _callbacks(keras_name: str, csv_path, *, crash_at: int | None = None) -> list:
    """Fresh callbacks, as a new process has them. ``min_delta`` so large that only the first
    epoch improves: the learning rate halves after every later epoch, and the run stops early."""
    keras = __import__(keras_name)

    class Counter(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.batches = 0

        def on_train_batch_end(self, batch, logs=None):
            self.batches += 1

        def state_dict(self):
            return {"batches": self.batches}

        def load_state_dict(self, state):
            self.batches = state["batches"]

    cbs = [
        keras.callbacks.ReduceLROnPlateau(monitor="loss", patience=1, factor=0.5, min_delta=10.0),
        keras.callbacks.EarlyStopping(monitor="loss", patience=3, min_delta=10.0, restore_best_weights=True),
        keras.callbacks.CSVLogger(str(csv_path)),
        Counter(),
    ]
    return cbs + ([crash_after(crash_at, keras_name)] if crash_at else [])


def _fit(keras_name, directory, csv_path, **kwargs):
    return tfdist.fit(_build(keras_name), "digits", epochs=8, batch_size=128, seed=3, deterministic=True,
                      strategy="one_device", checkpoint_dir=str(directory), verbose=0, **kwargs)


def _rows(path) -> list[list[str]]:
    with open(path, newline="") as f:
        return list(csv.reader(f))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """``get(keras_name)``: the run with ``_callbacks`` never interrupted, made once a Keras:
    (its History, its callbacks, its directory holding ``ref`` and ``ref.csv``). Tests only read it."""
    runs = {}

    def get(keras_name):
        if keras_name not in runs:
            directory = tmp_path_factory.mktemp(f"uninterrupted-{keras_name}")
            cbs = _callbacks(keras_name, directory / "ref.csv")
            runs[keras_name] = (_fit(keras_name, directory / "ref", directory / "ref.csv", callbacks=cbs), cbs, directory)
        return runs[keras_name]

    return get


@pytest.mark.parametrize("keras_name", KERASES)
@pytest.mark.parametrize("crash_at,save_every_steps,resumed_at", [(27, 5, 25), (24, None, 22)],
                         ids=["mid-epoch", "after-an-epoch-end"])
def test_stateful_callbacks_make_an_interrupted_run_end_as_one_never_interrupted(
        tmp_path, uninterrupted, keras_name, crash_at, save_every_steps, resumed_at):
    reference, reference_cbs, ref_dir = uninterrupted(keras_name)
    # 11 steps an epoch; epochs 1 and 2 halve the learning rate; epoch 3 stops the run with epoch 0's weights.
    assert reference.epoch == [0, 1, 2, 3] and reference.tfdist.global_step == 44
    lr_key = "learning_rate" if "learning_rate" in reference.history else "lr"
    assert reference.history[lr_key] == pytest.approx([0.2, 0.2, 0.1, 0.05])

    with pytest.raises(Crash):
        _fit(keras_name, tmp_path / "int", tmp_path / "int.csv", save_every_steps=save_every_steps,
             callbacks=_callbacks(keras_name, tmp_path / "int.csv", crash_at=crash_at))
    resumed_cbs = _callbacks(keras_name, tmp_path / "int.csv")
    resumed = _fit(keras_name, tmp_path / "int", tmp_path / "int.csv", callbacks=resumed_cbs,
                   save_every_steps=save_every_steps)
    assert resumed.tfdist.start_step == resumed_at
    assert resumed.epoch == reference.epoch and resumed.history == reference.history
    assert resumed_cbs[3].batches == reference_cbs[3].batches == 44
    assert resumed_cbs[1].stopped_epoch == reference_cbs[1].stopped_epoch == 3
    assert _rows(tmp_path / "int.csv") == _rows(ref_dir / "ref.csv") and len(_rows(ref_dir / "ref.csv")) == 5
    assert_bit_identical(checkpoint_tensors(str(ref_dir / "ref")), checkpoint_tensors(str(tmp_path / "int")))
    # EarlyStopping put epoch 0's weights back into the model (the checkpoints hold the last step's
    # training state): the resumed run had them from the checkpoint it resumed from.
    final = checkpoint_tensors(str(ref_dir / "ref"))
    saved_best = final[f"{layout.CALLBACKS}/cb1_EarlyStopping/0{layout.VALUE_SUFFIX}"]
    trained = [v for k, v in final.items() if v.shape == (64, 32) and not k.startswith(layout.CALLBACKS)]
    best, again = reference.model.get_weights(), resumed.model.get_weights()
    assert np.array_equal(saved_best, best[0]) and trained and not any(np.array_equal(t, best[0]) for t in trained)
    assert len(best) == len(again) and all(np.array_equal(a, b) for a, b in zip(best, again))
    # Called again, the complete run trains nothing and returns the model as the run returned it:
    # EarlyStopping's best weights, not the last step's (which the final checkpoint holds).
    complete = _fit(keras_name, tmp_path / "int", tmp_path / "int.csv",
                    callbacks=_callbacks(keras_name, tmp_path / "int.csv"), save_every_steps=save_every_steps)
    assert complete.tfdist.start_step == complete.tfdist.global_step == 44 and complete.history == reference.history
    assert all(np.array_equal(a, b) for a, b in zip(best, complete.model.get_weights()))


@pytest.mark.parametrize("keras_name", KERASES)
def test_a_run_interrupted_after_early_stopping_decided_is_complete_when_started_again(tmp_path, uninterrupted,
                                                                                     keras_name):
    # The stopping epoch's save is the run's last: a run preempted or killed after it (before its
    # on_train_end) is complete, as the uninterrupted one, and does not train further epochs.
    keras = __import__(keras_name)

    class CrashAtTheEnd(keras.callbacks.Callback):
        def on_train_end(self, logs=None):  # after EarlyStopping decided; before tfdist's on_train_end
            raise Crash("interrupted after the stopping epoch's save")

    reference, _, ref_dir = uninterrupted(keras_name)
    assert reference.epoch == [0, 1, 2, 3] and reference.tfdist.global_step == 44  # of 88: stopped early
    with pytest.raises(Crash):
        _fit(keras_name, tmp_path / "int", tmp_path / "int.csv",
             callbacks=[*_callbacks(keras_name, tmp_path / "int.csv"), CrashAtTheEnd()])
    again = _fit(keras_name, tmp_path / "int", tmp_path / "int.csv",
                 callbacks=_callbacks(keras_name, tmp_path / "int.csv"))
    assert again.tfdist.start_step == again.tfdist.global_step == 44
    assert again.epoch == reference.epoch and again.history == reference.history
    assert _rows(tmp_path / "int.csv") == _rows(ref_dir / "ref.csv")  # no row of an epoch 4
    # EarlyStopping's best weights (epoch 0's), as the uninterrupted run returned them.
    assert all(np.array_equal(a, b) for a, b in zip(reference.model.get_weights(), again.model.get_weights()))
    assert_bit_identical(checkpoint_tensors(str(ref_dir / "ref")), checkpoint_tensors(str(tmp_path / "int")))


@pytest.mark.parametrize("keras_name,legacy", [("keras", False), ("tf_keras", False), ("tf_keras", True)],
                         ids=["keras", "tf_keras", "tf_keras-legacy-optimizer"])
def test_a_scheduler_relative_to_the_current_learning_rate_is_applied_once_to_the_epoch_a_run_resumes_in(
        tmp_path, keras_name, legacy):
    """Keras' own LearningRateScheduler example form, ``lr * factor`` at each epoch's beginning:
    the resumed epoch's beginning sees the learning rate that epoch began with, not the
    checkpoint's (which holds the change already), and the run ends as one never interrupted.
    (A tf_keras legacy optimizer makes its learning-rate variable at its first step unless tfdist
    makes it before restoring.)"""
    keras = __import__(keras_name)

    def build():
        model = _build(keras_name)()
        if legacy:
            model.compile(keras.optimizers.legacy.SGD(0.2, momentum=0.5),
                          keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
        return model

    def callbacks(crash_at=None):
        halve = keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr * 0.5 if epoch else lr)
        return [halve] + ([crash_after(crash_at, keras_name)] if crash_at else [])

    def fit(name, cbs):
        return tfdist.fit(build, "digits", epochs=3, batch_size=128, seed=3, deterministic=True,
                          strategy="one_device", checkpoint_dir=str(tmp_path / name), save_every_steps=4, verbose=0,
                          callbacks=cbs)

    reference = fit("ref", callbacks())
    lr_key = "learning_rate" if "learning_rate" in reference.history else "lr"
    assert reference.history[lr_key] == pytest.approx([0.2, 0.1, 0.05])
    with pytest.raises(Crash):
        fit("int", callbacks(crash_at=26))  # epoch 2 (11 steps an epoch), saved at step 24
    resumed = fit("int", callbacks())
    assert resumed.tfdist.start_step == 24
    assert resumed.history == reference.history
    assert_bit_identical(checkpoint_tensors(str(tmp_path / "ref")), checkpoint_tensors(str(tmp_path / "int")))


def test_adding_or_removing_early_stopping_with_best_weights_on_resume_still_resumes(tmp_path, caplog):
    import keras

    with pytest.raises(Crash):
        tfdist.fit(_build("keras"), "digits", epochs=3, batch_size=128, seed=3, strategy="one_device", verbose=0,
                   checkpoint_dir=str(tmp_path / "run"), save_every_steps=5,
                   callbacks=[_callbacks("keras", tmp_path / "x.csv", crash_at=13)[-1]])
    with caplog.at_level(logging.WARNING, logger="tfdist"):
        added = tfdist.fit(_build("keras"), "digits", epochs=2, batch_size=128, seed=3, strategy="one_device", verbose=0,
                           checkpoint_dir=str(tmp_path / "run"), save_every_steps=5,
                           callbacks=[keras.callbacks.EarlyStopping(monitor="loss", restore_best_weights=True)])
    assert added.tfdist.start_step == 11 and added.tfdist.global_step == 22
    assert "0:EarlyStopping start afresh" in caplog.text
    removed = tfdist.fit(_build("keras"), "digits", epochs=3, batch_size=128, seed=3, strategy="one_device", verbose=0,
                         checkpoint_dir=str(tmp_path / "run"))
    assert removed.tfdist.start_step == 22 and removed.tfdist.global_step == 33


def _small(keras_name):
    keras = __import__(keras_name)

    def build():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)])
        model.compile(keras.optimizers.SGD(0.05), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
        return model

    x = np.random.default_rng(0).random((48, 8)).astype("float32")
    return keras, build, (x, (x.sum(axis=1) > 4).astype("int32"))


@pytest.mark.parametrize("keras_name", KERASES)
def test_a_resumed_csv_logger_keeps_the_files_columns_when_only_some_epochs_validate(tmp_path, keras_name):
    # validation_freq=2: the first run's first epoch has no val_* keys, the resumed run's first
    # epoch (epoch 1) has them; the resumed logger must write under the file's header.
    keras, build, data = _small(keras_name)
    options = dict(epochs=4, batch_size=8, seed=1, deterministic=True, strategy="one_device", verbose=0,
                   validation_data=data, validation_freq=2)

    def callbacks(name):  # the scheduler logs the learning rate: the logger adds a val_ column for it too
        return [keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr * 0.9),
                keras.callbacks.CSVLogger(str(tmp_path / name))]

    tfdist.fit(build, data, callbacks=callbacks("ref.csv"), **options)
    with pytest.raises(Crash):
        tfdist.fit(build, data, checkpoint_dir=str(tmp_path / "int"), save_every_steps=4,
                   callbacks=[*callbacks("int.csv"), crash_after(9, keras_name)], **options)
    resumed = tfdist.fit(build, data, checkpoint_dir=str(tmp_path / "int"), save_every_steps=4,
                         callbacks=callbacks("int.csv"), **options)
    assert resumed.tfdist.start_step == 8
    assert _rows(tmp_path / "int.csv") == _rows(tmp_path / "ref.csv") and len(_rows(tmp_path / "ref.csv")) == 5


@pytest.mark.parametrize("keras_name", KERASES)
def test_a_run_a_callback_stopped_mid_epoch_keeps_its_csv_rows_when_started_again(tmp_path, keras_name):
    keras, build, data = _small(keras_name)

    class StopAtStep3(keras.callbacks.Callback):  # as TerminateOnNaN does at a NaN loss
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:
                self.model.stop_training = True

    def run():
        return tfdist.fit(build, data, epochs=3, batch_size=8, seed=1, strategy="one_device", verbose=0,
                          checkpoint_dir=str(tmp_path / "ckpt"),
                          callbacks=[StopAtStep3(), keras.callbacks.CSVLogger(str(tmp_path / "log.csv"))])

    assert run().tfdist.global_step == 3
    rows = _rows(tmp_path / "log.csv")
    assert len(rows) == 2
    again = run()  # complete: trains nothing, and takes no row off to be written again
    assert again.tfdist.start_step == again.tfdist.global_step == 3
    assert _rows(tmp_path / "log.csv") == rows


def test_tf_keras_tensorboard_batch_steps_go_on_from_the_resumed_step(tmp_path):
    # tf_keras' fit sets the step counter TensorBoard writes batch summaries at to 0.
    keras, build, data = _small("tf_keras")
    seen = []

    class Steps(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(int(self.model._train_counter.numpy()))

    options = dict(epochs=2, batch_size=8, seed=1, strategy="one_device", verbose=0,
                   checkpoint_dir=str(tmp_path / "ckpt"), save_every_steps=4)
    with pytest.raises(Crash):
        tfdist.fit(build, data, callbacks=[crash_after(9, "tf_keras")], **options)
    resumed = tfdist.fit(build, data, callbacks=[Steps()], **options)
    assert resumed.tfdist.start_step == 8 and seen == list(range(9, 13))


@pytest.mark.parametrize("keras_name", KERASES)
def test_a_resumed_epoch_calls_callbacks_with_the_uninterrupted_runs_epoch_and_batch(tmp_path, keras_name):
    # What README tells users to key their own callbacks' records by.
    keras, build, data = _small(keras_name)

    class Calls(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.calls = []

        def on_train_batch_end(self, batch, logs=None):
            self.calls.append((self.epoch, batch))

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

    options = dict(epochs=2, batch_size=8, seed=1, strategy="one_device", verbose=0, save_every_steps=4)
    reference = Calls()
    tfdist.fit(build, data, callbacks=[reference], checkpoint_dir=str(tmp_path / "ref"), **options)
    assert reference.calls == [(e, b) for e in range(2) for b in range(6)]
    with pytest.raises(Crash):
        tfdist.fit(build, data, callbacks=[crash_after(9, keras_name)], checkpoint_dir=str(tmp_path / "ckpt"),
                   **options)
    resumed = Calls()
    history = tfdist.fit(build, data, callbacks=[resumed], checkpoint_dir=str(tmp_path / "ckpt"), **options)
    assert history.tfdist.start_step == 8 and resumed.calls == reference.calls[8:]
