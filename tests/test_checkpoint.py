"""Exact resume: runs killed at any moment and started again end bit-identical to a run never interrupted.

Each scenario runs the real ``tfdist train`` in subprocesses, with the built-in ``resnet``: input
noise, batch normalization (per-replica moving statistics under mirrored), dropout and a
decaying learning rate, as real CNNs have. Kills (and a Ctrl-C) are placed with
``TFDIST_FAULT`` (a task kills itself at an exact step, or right after starting an async
save) rather than by racing a timer; one test also kills from outside.
"""

import glob
import hashlib
import os
import json
import re
import shutil
import signal
import sys
import textwrap
import threading

import numpy as np
import pytest

from tfdist import CheckpointOptions

from conftest import Processes as _Processes
from conftest import (assert_bit_identical, base_env, checkpoint_tensors, process_state, read_json, same_weights,
                      script_result, wait_for)

TRAIN = ["train", "--model", "resnet", "--epochs", "3", "--steps-per-epoch", "8", "--batch-size", "32", "--seed", "4",
         "--deterministic", "--save-every-steps", "3", "--verbose", "0"]
TOTAL = 24
STRATEGY_ARGS = {
    "one_device": ["--strategy", "one_device"],
    "mirrored": ["--strategy", "mirrored", "--cpu-devices", "2"],
    "central_storage": ["--strategy", "central_storage", "--cpu-devices", "2"],
}


def _train(procs, out_dir, extra=(), fault=None, timeout=240):
    environ = base_env(**({"TFDIST_FAULT": fault} if fault else {}))
    return procs.tfdist(*TRAIN, *extra, "--output-dir", str(out_dir), "--summary-json", str(out_dir / "summary.json"),
                        timeout=timeout, env=environ)


def _reference(reference_runs, args=STRATEGY_ARGS["one_device"] + ["--keras", "3"]):
    """The uninterrupted run of ``args``, made once for every test that compares against it."""
    def make(directory):
        with _Processes() as procs:
            code, out = _train(procs, directory, args)
            assert code == 0, out[-3000:]

    return reference_runs(["test_checkpoint", *TRAIN, *args], make)


def _resumed_at(out: str) -> int:
    """The global step a run resumed from (0 if it started fresh), from its log."""
    if "resuming from" not in out:
        return 0
    return int(out.split("resuming from")[1].split("global step ")[1].split(" ")[0])


def _history(out_dir):
    prefix = max(glob.glob(str(out_dir / "checkpoints" / "ckpt-*.tfdist.json")), key=lambda p: int(p.split("-")[-1].split(".")[0]))
    return read_json(prefix)["history"]


# Every interruption on mirrored (Keras 3); on one_device, central_storage and with tf_keras, the
# two that meet a save (mid-epoch while one is in flight, and just after an epoch's save): the
# signals' handling is the same code under every strategy, and each start costs ~15 s.
# tests/test_signal_moments.py signals one_device runs at restore, first trace and final save.
KILL_VARIANTS = [("mirrored", "3", "all"), ("one_device", "3", "saves"), ("central_storage", "3", "saves"),
                 ("mirrored", "2", "saves")]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("strategy,keras,interruptions", KILL_VARIANTS)
def test_killed_at_any_moment_and_restarted_ends_bit_identical(procs, ctrl_c, tmp_path, reference_runs, strategy, keras,
                                                              interruptions):
    every = interruptions == "all"
    args = [*STRATEGY_ARGS[strategy], "--keras", keras]
    reference, interrupted = _reference(reference_runs, args), tmp_path / "interrupted"

    # 1. SIGKILL mid-epoch (step 5 of 8; the save of step 3 may still be in flight).
    code, out = _train(procs, interrupted, args, fault="kill_at_step:5")
    assert code == -signal.SIGKILL, out[-3000:]
    if every:
        # 2. SIGKILL on an epoch's last step, before the epoch's end (validation, its save) ran.
        code, out = _train(procs, interrupted, args, fault="kill_at_step:8")
        assert code == -signal.SIGKILL, out[-3000:]
        assert _resumed_at(out) in (0, 3)  # 0: step 3's save had not completed, so nothing was listed
    # 3. SIGKILL right after an epoch ended, while the asynchronous save of step 16 is in flight.
    code, out = _train(procs, interrupted, args, fault="kill_after_save:16")
    assert code == -signal.SIGKILL, out[-3000:]
    assert _resumed_at(out) in (0, 3, 6)
    if every:
        # 4. SIGTERM (preemption) at step 20: saves there and exits with 75.
        code, out = _train(procs, interrupted, args, fault="term_at_step:20")
        assert code == 75, out[-3000:]
        # Resumed from a completed save: every 3 steps and epoch ends, 16 if its save finished before the kill.
        assert _resumed_at(out) in (3, 6, 8, 9, 12, 15, 16)
        # 5. Ctrl-C (SIGINT) at step 22, which no save policy saves: saved there, exit 130.
        code, out = _train(procs, interrupted, args, fault="int_at_step:22")
        assert code == 130 and "tfdist: interrupted by SIGINT at step 22, saved there" in out, out[-3000:]
        assert _resumed_at(out) == 20
    # 6. The same command again runs to the end.
    code, out = _train(procs, interrupted, args)
    assert code == 0, out[-3000:]
    summary = read_json(interrupted / "summary.json")
    if every:
        assert summary["start_step"] == 22 and summary["resumed_from"].endswith("ckpt-22")
    else:  # from a completed save: every 3 steps and epoch ends, 16 if its save finished before the kill
        assert summary["start_step"] in (8, 9, 12, 15, 16), summary["start_step"]
    assert summary["global_step"] == TOTAL and summary["strategy"] == strategy

    assert_bit_identical(checkpoint_tensors(str(reference / "checkpoints")),
                         checkpoint_tensors(str(interrupted / "checkpoints")))
    expected = read_json(reference / "summary.json")
    assert summary["final_loss"] == expected["final_loss"] and summary["val_accuracy"] == expected["val_accuracy"]
    assert _history(interrupted) == _history(reference)

    if every:  # a run that already finished reports it instead of training again
        code, out = _train(procs, interrupted, args)
        assert code == 0 and "already complete at step 24" in out
        assert read_json(interrupted / "summary.json")["start_step"] == TOTAL


@pytest.mark.timeout(300)
def test_sigterm_from_outside_saves_and_the_rerun_is_identical(procs, tmp_path, reference_runs):
    reference, interrupted = _reference(reference_runs), tmp_path / "interrupted"
    args = [sys.executable, "-m", "tfdist", *TRAIN, "--epochs", "3", "--output-dir", str(interrupted),
            "--summary-json", str(interrupted / "summary.json")]
    proc = procs.start(args, env=base_env())
    wait_for(lambda: os.path.exists(interrupted / "checkpoints" / "checkpoint") or proc.poll() is not None,
             timeout=120, what="the first checkpoint")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode in (75, 0), out[-3000:]  # 0 only if the run finished before the signal landed
    if proc.returncode == 75:
        assert "SIGTERM received" in out and "exiting with code 75" in out
    code, out = _train(procs, interrupted)
    assert code == 0, out[-3000:]
    assert_bit_identical(checkpoint_tensors(str(reference / "checkpoints")),
                         checkpoint_tensors(str(interrupted / "checkpoints")))


@pytest.mark.timeout(300)
def test_a_frozen_run_that_comes_back_after_another_took_over_stops_without_writing(procs, tmp_path, reference_runs):
    # Split brain: run 1 freezes (a paused VM, a pod cut off) and a replacement starts the same
    # command. When run 1 wakes up, it must not save over the replacement's checkpoints.
    from tfdist.checkpoint import layout

    reference, shared = _reference(reference_runs), tmp_path / "shared"
    args = [sys.executable, "-m", "tfdist", *TRAIN, "--output-dir", str(shared)]
    frozen = procs.start(args, env=base_env(TFDIST_FAULT="stop_at_step:5"))
    wait_for(lambda: process_state(frozen.pid) == "T" or frozen.poll() is not None, timeout=120,
             what="run 1 to stop itself at step 5")
    writer = layout.writer_path(str(shared / "checkpoints"))
    first_claim = read_json(writer)
    assert first_claim["pid"] == frozen.pid

    code, out = _train(procs, shared)  # the replacement: resumes from what run 1 saved, runs to the end
    assert code == 0, out[-3000:]
    assert f"pid {frozen.pid} on" in out and "did not end cleanly" in out
    assert read_json(writer)["ended_at"] is not None, "a run that ended marks its record as ended"
    assert_bit_identical(checkpoint_tensors(str(reference / "checkpoints")), checkpoint_tensors(str(shared / "checkpoints")))
    before = _tree_digest(shared / "checkpoints")

    os.kill(frozen.pid, signal.SIGCONT)
    out, _ = frozen.communicate(timeout=120)
    assert frozen.returncode == 2, out[-3000:]  # bad input: a launcher does not restart it
    errors = [line for line in out.splitlines() if line.startswith("tfdist: error:")]
    assert len(errors) == 1 and "another run started writing the checkpoint directory" in errors[0]
    # Step 6, or step 3 if its save was still in flight when the run froze (its files are not kept).
    assert re.search(r"stops without saving step (3|6)\b", errors[0]) and "Fix:" in errors[0], errors[0]
    assert "Traceback" not in out, out[-3000:]
    assert _tree_digest(shared / "checkpoints") == before, "the frozen run wrote into the directory after waking up"


def test_a_save_that_fails_after_another_run_took_over_reports_the_takeover(tmp_path, monkeypatch):
    # A run frozen mid-save wakes up after a replacement took over; the replacement removed the
    # save's temporary files as an interrupted write's, so the write fails: the takeover is the news.
    from tfdist.checkpoint import layout, ownership
    from tfdist.checkpoint.checkpointer import Checkpointer
    from tfdist.errors import CheckpointTakenOverError

    written = Checkpointer._written

    def taken_over_and_removed(self, save_path):
        if layout.step_of(save_path) == 9:
            ownership.claim(str(tmp_path))
            raise OSError(2, "No such file or directory", save_path + "_temp")
        written(self, save_path)

    monkeypatch.setattr(Checkpointer, "_written", taken_over_and_removed)
    with pytest.raises(CheckpointTakenOverError, match="another run started writing the checkpoint directory .*stops "
                                                       "without saving step 9"):
        _fit(tmp_path)


def test_the_writer_record_is_claimed_checked_and_released_by_its_own_run_only(tmp_path, caplog):
    from tfdist.checkpoint import layout, ownership
    from tfdist.errors import CheckpointIOError, CheckpointTakenOverError

    directory = str(tmp_path)
    assert ownership.current(directory) is None
    first = ownership.claim(directory)
    assert ownership.current(directory) == first and first.pid == os.getpid()
    ownership.check(directory, first, step=3)  # still ours: nothing happens
    with caplog.at_level("INFO", logger="tfdist"):
        second = ownership.claim(directory)
    assert "did not end cleanly" in caplog.text and first.describe() in caplog.text
    with pytest.raises(CheckpointTakenOverError, match=r"another run started writing .* stops without saving step 6"):
        ownership.check(directory, first, step=6)
    ownership.release(directory, first)  # not first's record any more: left alone
    assert ownership.current(directory) == second
    ownership.release(directory, second)
    ended = ownership.current(directory)
    assert ended.token == second.token and ended.ended_at is not None and "ended" in ended.describe()
    # A frozen run that wakes up after the run that replaced it ended still stops.
    with pytest.raises(CheckpointTakenOverError, match="ended"):
        ownership.check(directory, first, step=6)
    caplog.clear()
    with caplog.at_level("INFO", logger="tfdist"):
        third = ownership.claim(directory)
    assert "did not end cleanly" not in caplog.text  # the previous run ended
    os.remove(layout.writer_path(directory))
    ownership.check(directory, third, step=9)  # a record that vanished is written again
    assert ownership.current(directory) == third
    with open(layout.writer_path(directory), "w") as f:
        f.write("{not json")
    assert ownership.current(directory) is None  # a damaged record is no claim
    # A record that cannot be read (here: a folder at its name; on gs://, an outage) is not taken for a
    # missing one, which would be written over another run's claim.
    os.remove(layout.writer_path(directory))
    os.mkdir(layout.writer_path(directory))
    with pytest.raises(CheckpointIOError, match=r"reading the record of the run that writes .* failed: .*Fix:"):
        ownership.check(directory, third, step=12)
    assert os.path.isdir(layout.writer_path(directory))


def _tree_digest(directory) -> dict:
    return {
        os.path.relpath(p, directory): hashlib.sha256(open(p, "rb").read()).hexdigest()
        for p in sorted(glob.glob(os.path.join(directory, "**"), recursive=True, include_hidden=True))
        if os.path.isfile(p)
    }  # hidden files too: the record of the run that writes the directory (.tfdist-writer.json)


def _tiny():
    import tf_keras

    model = tf_keras.Sequential([tf_keras.Input((6,)), tf_keras.layers.Dense(16, activation="relu"),
                                 tf_keras.layers.Dropout(0.3), tf_keras.layers.Dense(3)])
    model.compile(tf_keras.optimizers.Adam(0.01), tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], steps_per_execution=3)
    return model


_RNG = np.random.RandomState(0)
_X = _RNG.rand(300, 6).astype(np.float32)
_Y = (_X.sum(1) * 1.7).astype(np.int64) % 3


class _Crash(Exception):
    pass


def _crash_at(step):
    """A callback that fails at the end of ``step`` (before tfdist saves that step)."""
    import tf_keras

    class Crash(tf_keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch + 1 == step:
                raise _Crash()

    return Crash()


def _fit(directory, data=None, **kwargs):
    import tfdist

    options = dict(epochs=2, batch_size=20, seed=2, deterministic=True, strategy="one_device", verbose=0,
                   checkpoint_dir=str(directory), save_every_steps=3)
    options.update(kwargs)
    return tfdist.fit(_tiny, data if data is not None else (_X, _Y), **options)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """``_fit``'s run never interrupted, made once for the tests that compare against it:
    (its History, its checkpoint directory). Tests only read it."""
    directory = tmp_path_factory.mktemp("uninterrupted")
    return _fit(directory), directory


def test_fit_ends_its_background_writer_so_that_a_notebook_kernel_frees_each_model(tmp_path, monkeypatch):
    # TensorFlow's async writer thread waits for saves until the process exits, and its atexit
    # hook holds the model: one thread and one model per fit in a kernel that runs many. And
    # TensorFlow counts the traces of each fit's writer's copy function together: from the
    # fifth fit on it warned of "excessive retracing".
    import threading
    import weakref

    from conftest import collect_garbage

    def writers():
        return [t for t in threading.enumerate() if "async_save" in t.name]

    from tensorflow.python.eager.polymorphic_function import polymorphic_function

    traces = []  # (function, warning omitted): TensorFlow warns at most twice a process, so ask its detector
    detector = polymorphic_function._frequent_tracing_detector_manager
    monkeypatch.setattr(type(detector), "called_with_tracing",
                        lambda self, key, function, omit: traces.append((getattr(function, "__name__", ""), omit)))
    before = set(writers())
    models = []
    for i in range(2):
        history = _fit(tmp_path / str(i), epochs=1)
        models.append(weakref.ref(history.model))
        del history
    collect_garbage()
    assert set(writers()) <= before
    assert [ref() for ref in models] == [None, None]
    copies = [omit for name, omit in traces if name == "_copy_to_cpu"]
    assert copies and all(copies)


def test_an_error_inside_fit_lets_the_save_in_flight_finish_before_it_propagates(tmp_path):
    # A callback fails in the execution after the background save of step 9 started (the user's
    # callbacks run before tfdist saves a step, so step 12 is not saved): when the error reaches
    # the caller, that checkpoint is complete, so a fit called next in this process resumes there.
    from tfdist.checkpoint import layout

    with pytest.raises(_Crash):
        _fit(tmp_path, callbacks=[_crash_at(12)], batch_size=4, epochs=1)
    paths = layout.checkpoint_paths(str(tmp_path))
    assert paths and layout.step_of(paths[-1]) == 9
    assert not [name for name in os.listdir(tmp_path) if "_temp" in name]


def test_a_background_save_that_fails_is_reported_even_when_it_is_the_last(tmp_path, monkeypatch):
    # TensorFlow's Checkpoint.sync does not raise what failed in its writer thread (it prints it at
    # exit, and the process ends with 0): a run whose last save failed must not report success.
    from tfdist.checkpoint import layout
    from tfdist.checkpoint.checkpointer import Checkpointer
    from tfdist.errors import CheckpointIOError

    written = Checkpointer._written

    def disk_full_at_the_end(self, save_path):
        if layout.step_of(save_path) == 30:
            raise OSError(28, "No space left on device")
        written(self, save_path)

    monkeypatch.setattr(Checkpointer, "_written", disk_full_at_the_end)
    with pytest.raises(CheckpointIOError, match=r"saving a checkpoint to .* failed: OSError: .*No space left on device"):
        _fit(tmp_path)
    assert layout.step_of(layout.checkpoint_paths(str(tmp_path))[-1]) == 27  # the failed save is not listed
    monkeypatch.undo()
    resumed = _fit(tmp_path)
    assert resumed.tfdist.start_step == 27 and resumed.tfdist.global_step == 30


def test_a_metadata_file_that_cannot_be_written_fails_the_save_in_one_line(tmp_path, monkeypatch):
    # The filesystem turns read-only (or fills up) between a save's tensors and its metadata.
    from tfdist.checkpoint import layout
    from tfdist.errors import CheckpointIOError

    write_metadata = layout.write_metadata

    def read_only_at_step_9(prefix, metadata):
        if layout.step_of(prefix) == 9:
            raise OSError(30, "Read-only file system", prefix + ".tfdist.json.tmp")
        write_metadata(prefix, metadata)

    monkeypatch.setattr(layout, "write_metadata", read_only_at_step_9)
    with pytest.raises(CheckpointIOError, match=r"saving a checkpoint to .* failed: OSError: .*Read-only file system"
                                                r".*Fix: check free space, permissions"):
        _fit(tmp_path)
    monkeypatch.undo()
    assert _fit(tmp_path).tfdist.start_step == 6  # a checkpoint without its metadata is not resumed from


def test_steps_per_execution_above_one_resumes_exactly(tmp_path, uninterrupted):
    reference, ref_dir = uninterrupted
    with pytest.raises(_Crash):
        _fit(tmp_path / "int", callbacks=[_crash_at(12)])  # executions of 3 steps: batch ends at 3, 6, 9, 12
    resumed = _fit(tmp_path / "int")
    assert resumed.tfdist.start_step == 9 and resumed.tfdist.global_step == 30
    assert_bit_identical(checkpoint_tensors(str(ref_dir)), checkpoint_tensors(str(tmp_path / "int")))
    assert reference.history["loss"] == resumed.history["loss"]


def test_a_signal_at_an_epochs_last_step_lets_the_epoch_finish_first(tmp_path, monkeypatch, uninterrupted):
    from tfdist.checkpoint import layout

    reference, ref_dir = uninterrupted
    monkeypatch.setenv("TFDIST_FAULT", "term_at_step:15")  # the last step of epoch 0
    with pytest.raises(SystemExit) as info:
        _fit(tmp_path / "int")
    assert info.value.code == 75
    saved = layout.latest_metadata(str(tmp_path / "int"))
    assert saved.global_step == 15 and len(saved.history) == 1  # the epoch was recorded before stopping
    monkeypatch.delenv("TFDIST_FAULT")
    resumed = _fit(tmp_path / "int")
    assert resumed.tfdist.start_step == 15 and resumed.history == reference.history
    assert_bit_identical(checkpoint_tensors(str(ref_dir)), checkpoint_tensors(str(tmp_path / "int")))


def test_a_dataset_of_unknown_length_resumes_exactly(tmp_path):
    import tensorflow as tf

    def stream():
        return tf.data.Dataset.from_tensor_slices((_X, _Y)).filter(lambda x, y: y >= 0)

    _fit(tmp_path / "ref", data=stream())
    with pytest.raises(_Crash):
        _fit(tmp_path / "int", data=stream(), callbacks=[_crash_at(12)])
    resumed = _fit(tmp_path / "int", data=stream())
    assert resumed.tfdist.start_step == 9 and resumed.tfdist.steps_per_epoch == 15
    assert_bit_identical(checkpoint_tensors(str(tmp_path / "ref")), checkpoint_tensors(str(tmp_path / "int")))


def test_a_mismatched_checkpoint_is_refused_and_left_untouched(tmp_path, caplog):
    from tfdist.errors import CheckpointMismatchError

    _fit(tmp_path, epochs=1)
    before = _tree_digest(tmp_path)
    with pytest.raises(CheckpointMismatchError) as info:
        _fit(tmp_path, epochs=2, batch_size=30)
    message = str(info.value)
    assert "global_batch_size: checkpoint 20, this run 30" in message and "allow_changes=True" in message
    assert "pass batch_size=20 (--batch-size 20: the command line's default is 32 per replica)" in message
    with pytest.raises(CheckpointMismatchError, match="data_fingerprint: .*300 examples.*300 examples.* -- the same "
                                                      "description, other first examples: the data changed, or it"):
        _fit(tmp_path, epochs=2, data=(_X[::-1].copy(), _Y[::-1].copy()))
    # The fingerprints come with what they stand for.
    with pytest.raises(CheckpointMismatchError,
                       match=r"data_fingerprint: checkpoint '\w+' \(arrays: 300 examples\), this run '\w+' \(arrays: 240 "):
        _fit(tmp_path, epochs=2, data=(_X[:240], _Y[:240]))
    assert _tree_digest(tmp_path) == before
    with caplog.at_level("INFO", logger="tfdist"):
        changed = _fit(tmp_path, epochs=2, batch_size=30,  # deliberate change
                       checkpoint_options=CheckpointOptions(allow_changes=True))
    assert changed.tfdist.start_step == 15 and changed.tfdist.global_step == 20
    assert caplog.text.count("resuming despite changes") == 1
    assert "saved with micro batches" not in caplog.text  # it says "same step and data order": not so here
    # 15 steps of 20 were one epoch; at 10 steps of 30 an epoch, step 15 is in the second: said, with the fix.
    assert ("saved at 15 steps per epoch (global step 15: epoch 1, step 0), this run has 10. A run's position is "
            "its global step, so it goes on at epoch 1, step 5, and epochs=2 ends at step 20; for N more epochs of "
            "this run, pass epochs=2+N") in caplog.text



def test_a_checkpoint_past_the_end_of_the_run_asked_for_is_refused_with_the_epochs_to_pass(tmp_path):
    # It returned a History without a model (tfdist train then failed with a traceback writing it), said the run
    # was complete, and the next call did the same: a larger batch (allow_changes) or fewer epochs ends the run
    # before the step the checkpoint is at.
    import tf_keras

    from tfdist.errors import CheckpointMismatchError

    class CrashInSecondEpoch(tf_keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            if self.epoch == 1 and batch + 1 == 15:  # step 30's end, before it is saved: the last save is 27
                raise _Crash()

    with pytest.raises(_Crash):
        _fit(tmp_path, epochs=2, callbacks=[CrashInSecondEpoch()])
    def checkpoints():  # the writer record is this run's own, taken at the restore: checkpoints untouched
        return {name: digest for name, digest in _tree_digest(tmp_path).items() if name != ".tfdist-writer.json"}

    before = checkpoints()
    with pytest.raises(CheckpointMismatchError, match=re.escape(
            "is at global step 27, and this run ends at step 20 (epochs=2 at 10 steps per epoch): nothing is left to "
            "train. Fix: pass epochs=3 or more (--epochs) to go on from it")):
        _fit(tmp_path, epochs=2, batch_size=30, checkpoint_options=CheckpointOptions(allow_changes=True))
    with pytest.raises(CheckpointMismatchError, match=r"ckpt-27 is at global step 27, and this run ends at step 15 "
                                                      r"\(epochs=1 at 15 steps per epoch\).*pass epochs=2 or more"):
        _fit(tmp_path, epochs=1)
    assert checkpoints() == before
    going_on = _fit(tmp_path, epochs=3, batch_size=30, checkpoint_options=CheckpointOptions(allow_changes=True))
    assert going_on.model is not None and going_on.tfdist.start_step == 27 and going_on.tfdist.global_step == 30



def test_a_resume_at_other_steps_per_epoch_records_each_epoch_of_the_run_once(tmp_path):
    # The saved epochs from the resumed one on were kept beside the new run's: 4 epochs in a 3-epoch run's History.
    import tf_keras

    class CrashInThirdEpoch(tf_keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            if self.epoch == 2 and batch + 1 == 6:  # step 36's end: the last save is 33, in epoch 2 of 15 steps
                raise _Crash()

    with pytest.raises(_Crash):
        _fit(tmp_path, epochs=3, callbacks=[CrashInThirdEpoch()])
    resumed = _fit(tmp_path, epochs=3, batch_size=10,  # 30 steps an epoch: step 33 is in epoch 1
                   checkpoint_options=CheckpointOptions(allow_changes=True))
    assert resumed.tfdist.start_step == 33 and resumed.tfdist.global_step == 90
    assert resumed.epoch == [0, 1, 2] and len(resumed.history["loss"]) == 3

def test_a_resume_with_other_micro_batches_for_the_same_global_batch_says_so(tmp_path, caplog):
    # Accepted (the global batch is the run's), but silently, where a change of replicas is said.
    _fit(tmp_path, epochs=1, grad_accum_steps=2)
    with caplog.at_level("INFO", logger="tfdist"):
        resumed = _fit(tmp_path, epochs=2)
    assert resumed.tfdist.start_step == 15 and resumed.tfdist.global_step == 30
    assert ("the checkpoint was saved with micro batches of 10 (2 accumulation step(s)), this run has 20 (1): same step "
            "and data order, but batch statistics (BatchNormalization) are over the new micro batches") in caplog.text



def test_a_resume_with_xla_switched_says_the_run_no_longer_ends_bit_identical(tmp_path, caplog):
    # Accepted, as a change of kernels is, but it was silent: the final weights differed by up to 0.05.
    _fit(tmp_path, epochs=1)

    def with_xla():
        model = _tiny()
        model.compile(model.optimizer, model.loss, metrics=["accuracy"], steps_per_execution=3, jit_compile=True)
        return model

    import tfdist

    with caplog.at_level("WARNING", logger="tfdist"):
        resumed = tfdist.fit(with_xla, (_X, _Y), epochs=2, batch_size=20, seed=2, strategy="one_device", verbose=0,
                             checkpoint_dir=str(tmp_path), save_every_steps=3)
    assert resumed.tfdist.start_step == 15
    assert ("the checkpoint was saved with jit_compile=False, this run has jit_compile=True: it goes on from the same "
            "step, but does not end bit-identical to a run that kept it") in caplog.text

def test_a_change_of_precision_is_a_change_of_the_run_and_named(tmp_path, caplog):
    # It was not recorded: under Keras 3, float32 <-> mixed_float16 made every checkpoint "corrupt" (start a fresh run,
    # said the fix), and float32 <-> mixed_bfloat16 went on without a word.
    import tfdist
    from tfdist.errors import CheckpointMismatchError
    from tfdist.models import builder

    def fit(directory, precision, **options):
        return tfdist.fit(builder("linear", input_shape=(8, 8, 1), num_classes=10, keras="3"), "digits",
                          batch_size=128, seed=1, strategy="one_device", verbose=0, checkpoint_dir=str(directory),
                          mixed_precision=precision, **options)

    fit(tmp_path, None, epochs=2, steps_per_epoch=5)  # float32, complete at step 10
    before = _tree_digest(tmp_path)
    with pytest.raises(CheckpointMismatchError, match=re.escape(
            "precision: checkpoint 'float32', this run 'mixed_bfloat16' -- to go on in the checkpoint's, leave "
            "mixed_precision out (no --mixed-precision)")):
        fit(tmp_path, "mixed_bfloat16", epochs=3, steps_per_epoch=5)
    for allow in (False, True):  # Keras 3's loss-scale optimizer holds other variables: not even deliberately
        with pytest.raises(CheckpointMismatchError, match="written in float32, this run is in mixed_float16; under "
                                                          "Keras 3 mixed_float16's optimizer holds a loss scale"):
            fit(tmp_path, "mixed_float16", epochs=3, steps_per_epoch=5,
                checkpoint_options=CheckpointOptions(allow_changes=allow))
    assert _tree_digest(tmp_path) == before
    with caplog.at_level("WARNING", logger="tfdist"):
        resumed = fit(tmp_path, "mixed_bfloat16", epochs=3, steps_per_epoch=5,
                      checkpoint_options=CheckpointOptions(allow_changes=True))
    assert resumed.tfdist.start_step == 10 and "resuming despite changes (allow_changes): precision:" in caplog.text
    # Checkpoints written before the precision was recorded: the dtypes differ, which is no damage.
    older = tmp_path / "older"
    fit(older, None, epochs=1, steps_per_epoch=5)
    for path in older.glob("ckpt-*.tfdist.json"):
        record = json.loads(path.read_text())
        del record["precision"]
        path.write_text(json.dumps(record))
    with pytest.raises(CheckpointMismatchError, match=r"hold other variables than this run's model and optimizer; "
                                                      r"received 1 checkpoint\(s\) .*another mixed_precision\?"):
        fit(older, "mixed_float16", epochs=2, steps_per_epoch=5)

def test_starting_over_in_a_directory_with_checkpoints_is_refused_and_deletes_nothing(tmp_path, procs):
    from tfdist.errors import CheckpointError

    _fit(tmp_path, epochs=1)
    before = _tree_digest(tmp_path)
    # A fresh run there would let the retention policy (keep=3) delete the earlier run's checkpoints.
    with pytest.raises(CheckpointError, match=r"resume=False was given but .* holds 3 checkpoint\(s\).*ckpt-15.*Fix:"):
        _fit(tmp_path, epochs=1, batch_size=10, checkpoint_options=CheckpointOptions(resume=False))
    assert _tree_digest(tmp_path) == before
    code, out = procs.tfdist("train", "--no-resume", "--checkpoint-dir", str(tmp_path), "--output-dir", str(tmp_path / "out"),
                             timeout=60)
    assert code == 2 and "--no-resume was given" in out and "Traceback" not in out, out[-2000:]
    assert _tree_digest(tmp_path) == before


def _as_killed(directory) -> None:
    """The record of the run that wrote ``directory`` as a killed run leaves it: not ended."""
    from tfdist.checkpoint import layout

    path = directory / layout.WRITER_FILE
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "ended_at": None}))


def test_a_save_the_state_file_never_listed_is_made_again_in_its_place_not_kept_as_a_copy(tmp_path, caplog,
                                                                                      uninterrupted):
    from tfdist.checkpoint import layout

    reference, ref_dir = uninterrupted
    _fit(tmp_path, epochs=1)  # 15 steps: saves at 3, 6, 9, 12, (keep 3) and 15
    # Killed after step 15's files were written, before the state file listed them (an async save in flight):
    # the state file lists up to 12, and the run's record as the directory's writer never says it ended.
    layout.write_state(str(tmp_path), [str(tmp_path / "ckpt-9"), str(tmp_path / "ckpt-12")])
    _as_killed(tmp_path)
    with caplog.at_level("INFO", logger="tfdist"):
        resumed = _fit(tmp_path, epochs=2)
    assert resumed.tfdist.start_step == 12 and resumed.history == reference.history
    assert "removed ckpt-15: this run's save of that step, never listed" in caplog.text
    assert not glob.glob(str(tmp_path / "*.replaced-*"))
    assert_bit_identical(checkpoint_tensors(str(ref_dir)), checkpoint_tensors(str(tmp_path)))
    # Killed while TensorFlow renamed the data into place, before it wrote the index: the same.
    half = tmp_path / "half"
    _fit(half, epochs=1)
    layout.write_state(str(half), [str(half / "ckpt-9"), str(half / "ckpt-12")])
    os.remove(half / "ckpt-15.index")
    _as_killed(half)
    caplog.clear()
    with caplog.at_level("INFO", logger="tfdist"):
        assert _fit(half, epochs=2).tfdist.start_step == 12
    assert "removed ckpt-15: this run's save of that step, never listed" in caplog.text
    assert not glob.glob(str(half / "*.replaced-*"))
    # Two checkpoints past the listed ones are no kill's (one save is in flight at a time): a
    # state file rolled back by hand. They are kept aside, not removed.
    rolled = tmp_path / "rolled"
    _fit(rolled, epochs=1)
    layout.write_state(str(rolled), [str(rolled / "ckpt-9")])
    assert _fit(rolled, epochs=2).tfdist.start_step == 9
    assert glob.glob(str(rolled / "ckpt-12.index.replaced-*")) and glob.glob(str(rolled / "ckpt-15.index.replaced-*"))


def test_a_corrupt_latest_checkpoint_falls_back_to_the_previous_one(tmp_path, caplog):
    _fit(tmp_path, epochs=1)  # 15 steps: saves at 3, 6, 9, 12, (keep 3) and 15
    latest = max(glob.glob(str(tmp_path / "ckpt-*.index")), key=lambda p: int(p.split("-")[-1].split(".")[0]))
    data_file = glob.glob(latest.replace(".index", ".data-*"))[0]
    with open(data_file, "r+b") as f:
        f.truncate(os.path.getsize(data_file) // 2)
    with caplog.at_level("WARNING", logger="tfdist"):
        resumed = _fit(tmp_path, epochs=2)
    assert "cannot be read" in caplog.text and "falling back" in caplog.text
    assert resumed.tfdist.start_step == 12 and resumed.tfdist.global_step == 30
    assert glob.glob(data_file + ".replaced-*"), "the corrupt checkpoint must be kept aside, not overwritten"
    # The step saved again (15) was later deleted by retention (keep=3): its metadata went with it,
    # though the files kept aside still carry its name; what is left is listed as kept aside only.
    from tfdist.checkpoint import inspect

    assert sorted(os.path.basename(p) for p in glob.glob(str(tmp_path / "ckpt-*.tfdist.json"))) == [
        "ckpt-24.tfdist.json", "ckpt-27.tfdist.json", "ckpt-30.tfdist.json"]
    unlisted = [info for info in inspect.list_checkpoints(str(tmp_path)) if not info.listed]
    assert unlisted and all("moved aside" in info.problem for info in unlisted), [i.problem for i in unlisted]


def test_a_lost_or_damaged_state_file_resumes_from_the_checkpoints_beside_it_and_still_refuses_another_run(
        tmp_path, caplog):
    from tfdist.errors import CheckpointError, CheckpointMismatchError

    _fit(tmp_path, epochs=1)  # 15 steps; keeps 9, 12 and 15
    (tmp_path / "checkpoint").unlink()  # deleted (or never copied with the rest)
    from tfdist.checkpoint import inspect

    found = inspect.list_checkpoints(str(tmp_path))
    assert len(found) == 3 and all("resumes from the newest of these" in info.problem for info in found)
    before = _tree_digest(tmp_path)
    with pytest.raises(CheckpointMismatchError, match="global_batch_size: checkpoint 20, this run 30"):
        _fit(tmp_path, epochs=2, batch_size=30)
    with pytest.raises(CheckpointError, match=r"holds 3 checkpoint\(s\).*ckpt-15"):
        _fit(tmp_path, epochs=2, checkpoint_options=CheckpointOptions(resume=False))
    assert _tree_digest(tmp_path) == before
    with caplog.at_level("WARNING", logger="tfdist"):
        resumed = _fit(tmp_path, epochs=2)
    assert resumed.tfdist.start_step == 15 and resumed.tfdist.global_step == 30
    assert "no readable state file" in caplog.text and "newest ckpt-15" in caplog.text
    assert all((tmp_path / f"ckpt-{step}.index").exists() for step in (9, 12, 15))  # unlisted, never deleted
    (tmp_path / "checkpoint").write_text("")  # emptied: TensorFlow's manager would fail on it
    # tfdist ckpt reads what a run would resume from: listed as found beside it, verified by its tensors.
    found = [9, 12, 15, 24, 27, 30]  # the first run's, unlisted since the second ran, and the second's
    assert [info.global_step for info in inspect.list_checkpoints(str(tmp_path)) if info.global_step] == found
    results, _ = inspect.verify(str(tmp_path), every=True)
    assert [(os.path.basename(r.path), r.ok) for r in results] == [(f"ckpt-{step}", True) for step in found]
    again = _fit(tmp_path, epochs=3)
    assert again.tfdist.start_step == 30 and again.tfdist.global_step == 45
    assert len(glob.glob(str(tmp_path / "checkpoint.replaced-*"))) == 1
    # A complete run whose state file is lost writes it again when it is started: its directory reads as before.
    (tmp_path / "checkpoint").unlink()
    assert _fit(tmp_path, epochs=3).tfdist.start_step == 45
    assert [info.global_step for info in inspect.list_checkpoints(str(tmp_path)) if info.listed] == [45]


def test_a_checkpoint_of_the_other_keras_is_refused_even_with_allow_changes(tmp_path):
    import keras

    import tfdist
    from tfdist.errors import CheckpointMismatchError

    def keras3():
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)])
        model.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    _fit(tmp_path, epochs=1, save_every_steps=None)  # tf_keras
    before = _tree_digest(tmp_path)
    with pytest.raises(CheckpointMismatchError, match=r"another Keras \(keras: checkpoint 'tf_keras', this run "
                                                      r"'keras'\).*Fix: train with tf_keras \(--keras 2"):
        tfdist.fit(keras3, (_X, _Y), epochs=2, batch_size=20, seed=2, strategy="one_device", verbose=0,
                   checkpoint_dir=str(tmp_path), checkpoint_options=CheckpointOptions(allow_changes=True))
    assert _tree_digest(tmp_path) == before



def test_checkpoints_of_another_model_under_allow_changes_are_refused_as_such_not_as_corrupt(tmp_path, procs,
                                                                                         reference_runs):
    import tf_keras

    import tfdist
    from tfdist.errors import CheckpointMismatchError

    def wider():
        model = tf_keras.Sequential([tf_keras.Input((6,)), tf_keras.layers.Dense(24, activation="relu"),
                                     tf_keras.layers.Dense(3)])
        model.compile(tf_keras.optimizers.Adam(0.01), tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    _fit(tmp_path, epochs=1)  # keeps 9, 12 and 15
    before = _tree_digest(tmp_path)
    with pytest.raises(CheckpointMismatchError, match=r"hold other variables than this run's model and optimizer; "
                                                      r"received 3 checkpoint\(s\) that do not match .*Fix: build the "
                                                      r"model and optimizer the run was saved with"):
        tfdist.fit(wider, (_X, _Y), epochs=2, batch_size=20, seed=2, strategy="one_device", verbose=0,
                   checkpoint_dir=str(tmp_path), checkpoint_options=CheckpointOptions(allow_changes=True))
    assert _tree_digest(tmp_path) == before
    # The command line: one line, exit 2 (tfdist launch does not restart it), nothing changed. The run of
    # another model is a copy of tests/test_signal_moments.py's: linear, 4 steps, saved every 2.
    from test_signal_moments import uninterrupted_run

    out_dir = tmp_path / "cli"
    shutil.copytree(uninterrupted_run(reference_runs), out_dir)
    before = _tree_digest(out_dir / "checkpoints")
    code, out = procs.tfdist("train", "--model", "mlp", "--epochs", "2", "--steps-per-epoch", "4", "--batch-size", "16",
                             "--seed", "1", "--allow-changes", "--output-dir", str(out_dir), timeout=120, env=base_env())
    assert code == 2 and "Traceback" not in out, out[-3000:]
    assert "hold other variables than this run's model and optimizer" in out and "corrupt" not in out, out[-3000:]
    assert "unrestored values" not in out and "could not be found" not in out, out[-3000:]  # no page after the line
    assert _tree_digest(out_dir / "checkpoints") == before  # the writer's record too: the refused run wrote nothing


def test_fewer_epochs_than_a_complete_run_trained_return_its_model_and_say_so(tmp_path, caplog):
    done = _fit(tmp_path, epochs=2)
    with caplog.at_level("INFO", logger="tfdist"):
        again = _fit(tmp_path, epochs=1)
    assert again.tfdist.start_step == again.tfdist.global_step == done.tfdist.global_step == 30
    assert same_weights(again.model, done.model)
    assert "global step 30 (end of epoch 1; 15 steps per epoch)" in caplog.text  # not "epoch 2, step 0"
    assert ("epochs=1 (--epochs) is fewer than the 2 that run trained: returning its model after 2 epochs, as it "
            "ended. Fix: for a 1-epoch run, use another checkpoint_dir") in caplog.text


def _bytes_of(directory) -> set:
    """The digests of the checkpoints' index and data files, under whatever names they have now."""
    return {digest for name, digest in _tree_digest(directory).items() if ".index" in name or ".data-" in name}


def test_a_state_file_edited_to_name_an_earlier_checkpoint_rolls_the_run_back_to_it(tmp_path, caplog):
    from tfdist.checkpoint import layout

    done = _fit(tmp_path, epochs=2, checkpoint_options=CheckpointOptions(keep=5))  # keeps 18, 21, 24, 27 and 30
    before = _bytes_of(tmp_path)
    state = tmp_path / layout.STATE_FILE
    # An operator's roll-back: the first line names ckpt-21 (tf.train.latest_checkpoint's answer).
    state.write_text(state.read_text().replace('model_checkpoint_path: "ckpt-30"', 'model_checkpoint_path: "ckpt-21"'))
    assert [os.path.basename(p) for p in layout.checkpoint_paths(str(tmp_path))] == ["ckpt-18", "ckpt-21"]
    with caplog.at_level("INFO", logger="tfdist"):
        again = _fit(tmp_path, epochs=2, checkpoint_options=CheckpointOptions(keep=5))
    assert again.tfdist.start_step == 21 and again.tfdist.global_step == 30
    assert "names ckpt-21 as its latest checkpoint, before ckpt-24, ckpt-27, ckpt-30: rolling the run back" in caplog.text
    assert same_weights(again.model, done.model)  # deterministic: the same steps again
    assert before <= _bytes_of(tmp_path)  # nothing deleted: the later checkpoints were moved aside, not saved over
    assert len(glob.glob(str(tmp_path / "ckpt-30.*.replaced-*"))) >= 2
    # The checkpoints up to the roll-back stay listed (and under retention), not forgotten by the manager.
    assert [os.path.basename(p) for p in layout.checkpoint_paths(str(tmp_path), listed_only=True)] == [
        "ckpt-18", "ckpt-21", "ckpt-24", "ckpt-27", "ckpt-30"]


def test_a_checkpoint_after_a_hand_written_state_file_is_moved_aside_when_the_last_run_ended_cleanly(tmp_path):
    # One checkpoint past the listed ones looks like this run's own save that a kill cut short
    # (which the next run saves over), unless the run that wrote it ended cleanly: then it is an
    # operator's roll-back (the state file written to end at ckpt-27), and ckpt-30 is kept.
    from tfdist.checkpoint import layout

    _fit(tmp_path, epochs=2, checkpoint_options=CheckpointOptions(keep=5))
    layout.write_state(str(tmp_path), [str(tmp_path / f"ckpt-{step}") for step in (18, 21, 24, 27)])
    again = _fit(tmp_path, epochs=2, checkpoint_options=CheckpointOptions(keep=5))
    assert again.tfdist.start_step == 27
    assert len(glob.glob(str(tmp_path / "ckpt-30.*.replaced-*"))) >= 2


def test_a_checkpoint_prefix_given_as_checkpoint_dir_is_refused_not_trained_into(tmp_path):
    from tfdist.errors import CheckpointError

    _fit(tmp_path, epochs=1)
    before = _tree_digest(tmp_path)
    with pytest.raises(CheckpointError, match=r"checkpoint_dir names a checkpoint, not a directory; received "
                                              r"checkpoint_dir='.*/ckpt-12' \(ckpt-12.index is there\)\. Fix: pass "
                                              r"its directory .*'Roll back to an earlier checkpoint'"):
        _fit(tmp_path / "ckpt-12", epochs=2)
    assert _tree_digest(tmp_path) == before


def test_a_roll_back_to_a_checkpoint_keep_every_hours_kept_is_refused_not_ignored(tmp_path):
    # The manager stops listing what keep_every_hours keeps: naming one in the state file was
    # silently ignored, and the run went on from its latest checkpoint.
    from tfdist.checkpoint import layout
    from tfdist.errors import CheckpointError

    _fit(tmp_path, epochs=1, checkpoint_options=CheckpointOptions(keep=2, keep_every_hours=1e-9))
    listed = layout.checkpoint_paths(str(tmp_path), listed_only=True)
    assert [layout.step_of(p) for p in listed] == [12, 15] and (tmp_path / "ckpt-6.index").exists()
    state = (tmp_path / "checkpoint").read_text()
    (tmp_path / "checkpoint").write_text(state.replace('model_checkpoint_path: "ckpt-15"',
                                                       'model_checkpoint_path: "ckpt-6"'))
    before = _tree_digest(tmp_path)
    with pytest.raises(CheckpointError, match=r"names ckpt-6 as its latest checkpoint, but does not list it "
                                              r"\(keep_every_hours kept it.*Fix: to go on from it, copy its files"):
        _fit(tmp_path, epochs=2, checkpoint_options=CheckpointOptions(keep=2, keep_every_hours=1e-9))
    assert _tree_digest(tmp_path) == before


def test_the_latest_checkpoints_deleted_by_hand_leave_the_run_resuming_from_the_newest_one_left(tmp_path, caplog):
    from tfdist.checkpoint import layout

    done = _fit(tmp_path, epochs=2, checkpoint_options=CheckpointOptions(keep=5))
    for step in (27, 30):  # the operator removes the checkpoints after a divergence
        for path in glob.glob(str(tmp_path / f"ckpt-{step}.*")):
            os.remove(path)
    with caplog.at_level("INFO", logger="tfdist"):
        again = _fit(tmp_path, epochs=2, checkpoint_options=CheckpointOptions(keep=5))
    assert again.tfdist.start_step == 24 and again.tfdist.global_step == 30
    assert "lists ckpt-27, ckpt-30, whose files are gone: it now lists the checkpoints up to ckpt-24" in caplog.text
    assert same_weights(again.model, done.model)
    assert [os.path.basename(p) for p in layout.checkpoint_paths(str(tmp_path), listed_only=True)] == [
        "ckpt-18", "ckpt-21", "ckpt-24", "ckpt-27", "ckpt-30"]


def test_a_relative_checkpoint_dir_resumes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _fit("relative", epochs=1)
    assert _fit("relative", epochs=2).tfdist.start_step == 15


def test_an_unwritable_checkpoint_dir_is_a_clear_error(tmp_path):
    from tfdist.errors import CheckpointError

    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(CheckpointError) as info:
        _fit(blocker / "checkpoints")
    assert "not writable" in str(info.value) and "Fix:" in str(info.value)


def test_a_failing_background_write_is_raised_and_earlier_checkpoints_stay(tmp_path, monkeypatch):
    """A write that fails in the background (a full disk, say) surfaces as CheckpointError."""
    import tensorflow as tf

    from tfdist.checkpoint import layout
    from tfdist.errors import CheckpointError

    _fit(tmp_path, epochs=1)
    before = _tree_digest(tmp_path)
    real_sync = tf.train.Checkpoint.sync
    calls = {"n": 0}

    def failing_sync(self):
        # The first sync (restore) passes; the next, before the first save, reports that a write
        # failed. (Failing a later one would be a fake: the write before it really succeeds, and
        # TensorFlow's CheckpointManager then deletes the oldest checkpoint as `keep` says, from
        # the write's callback in the background -- whether before the test looks is a race.)
        calls["n"] += 1
        if calls["n"] > 1:
            raise tf.errors.ResourceExhaustedError(None, None, "No space left on device")
        return real_sync(self)

    monkeypatch.setattr(tf.train.Checkpoint, "sync", failing_sync)
    with pytest.raises(CheckpointError, match="No space left on device.*this save did not change the earlier checkpoints"):
        _fit(tmp_path, epochs=3)
    monkeypatch.setattr(tf.train.Checkpoint, "sync", real_sync)
    for name, digest in before.items():
        if name not in (layout.STATE_FILE, layout.WRITER_FILE) and not name.endswith(layout.METADATA_SUFFIX):
            assert _tree_digest(tmp_path).get(name) == digest, name


# The scripts of the tests of replicas' state. One process runs them both (_replica_results), after
# configuring its logical CPU devices before TensorFlow starts; each adds its part to ``results``.
_REPLICAS_START = textwrap.dedent(
    """
    import json
    import tfdist
    devices = tfdist.split_cpu(3)
    results = {}
    """
)

_REPLICA_METRICS = textwrap.dedent(
    """
    import sys, tempfile
    import numpy as np
    import tensorflow as tf
    import tf_keras
    from tfdist import checkpoint as ckpt_mod
    from tfdist.training import model as keras_model

    def build():
        m = tf_keras.Sequential([tf_keras.Input((3,)), tf_keras.layers.BatchNormalization(),
                                 tf_keras.layers.BatchNormalization(synchronized=True), tf_keras.layers.Dense(2)])
        m.compile("sgd", tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
        return m

    strategy = tfdist.make_strategy("mirrored", devices=devices[:2])
    adapter, model = keras_model.resolve(build, strategy)
    adapter.prepare(model, sample=(np.zeros((4, 3), np.float32), np.zeros((4,), np.int64)), grad_accum_steps=1)
    loss = model.metrics[0]
    per_replica = tf.constant([[3.0e7, 0.37, 1.1], [5.0, 2.9e-3, 7.7]])  # replica r adds row r

    @tf.function
    def update():
        def step():
            row = tf.gather(per_replica, tf.distribute.get_replica_context().replica_id_in_sync_group)
            for value in tf.unstack(row):
                loss.update_state(value)
        strategy.run(step)

    statistics = [v for layer in model.layers[:2] for v in (layer.moving_mean, layer.moving_variance)]

    @tf.function
    def move_statistics():  # each replica's statistics move its own way, as with its own batches
        def step():
            replica = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group, tf.float32)
            for v in statistics:
                v.assign(v * 0.9 + 0.1 * (replica + 1.0) * tf.constant([0.3, 1.7e-3, 11.0]))
        strategy.run(step)

    def components():
        return [[float(c.numpy()) for c in v.values] for v in loss.variables]

    def replica_statistics():
        return [[c.numpy().tolist() for c in v.values] for v in statistics]

    def checkpointer(directory):
        options = ckpt_mod.CheckpointOptions(directory=directory, async_save=False)
        run = ckpt_mod.RunMetadata(global_batch_size=4, data_fingerprint="d", model_fingerprint="m", seed=0)
        return ckpt_mod.Checkpointer(options=options, state=adapter.state(model), strategy=strategy, is_chief=True,
                                     task_name="worker:0", run_metadata=run)

    directory = tempfile.mkdtemp()
    update()
    move_statistics()
    before, statistics_before = components(), replica_statistics()
    checkpointer(directory).save(global_step=5, epoch=0, step_in_epoch=5, history=[])
    update()  # the state moves on, then the run dies
    move_statistics()
    loss.reset_state()
    resumed = checkpointer(directory)
    resumed.restore()
    statistics_after = replica_statistics()  # back right after the restore
    resumed.restore_metrics()
    results["metrics"] = {"before": before, "after": components(), "result": float(loss.result()),
                          "statistics_before": statistics_before, "statistics_after": statistics_after}
    """
)


@pytest.fixture(scope="module")
def _replica_results():
    """What _REPLICA_METRICS and _REPLICA_COUNTS found, run in one process."""
    script = _REPLICAS_START + _REPLICA_METRICS + _REPLICA_COUNTS + '\nprint("RESULT " + json.dumps(results))\n'
    with _Processes() as procs:
        return script_result(procs, script, timeout=480)


@pytest.mark.timeout(500)
def test_each_replica_gets_its_own_on_read_state_back(_replica_results):
    """Mirrored: a plain checkpoint would give each replica half the summed metric total and
    the mean of the BatchNormalization statistics (synchronized or not); the resumed run's
    float operations would then differ from an uninterrupted run's."""
    result = _replica_results["metrics"]
    total, count = result["before"]
    assert total[0] != total[1] and count == [3.0, 3.0]
    assert result["after"] == result["before"]
    assert all(values[0] != values[1] for values in result["statistics_before"])  # the replicas differ
    assert result["statistics_after"] == result["statistics_before"]


def _checkpointer(build, directory, *, keep: int):
    """(model, Checkpointer) of a one-device run of ``build``'s model, saving asynchronously."""
    import tfdist
    from tfdist import checkpoint as ckpt_mod
    from tfdist.training import model as keras_model

    strategy = tfdist.make_strategy("one_device")
    adapter, model = keras_model.resolve(build, strategy)
    adapter.prepare(model, sample=(_X[:4], _Y[:4]), grad_accum_steps=1)
    run = ckpt_mod.RunMetadata(global_batch_size=20, data_fingerprint="d", model_fingerprint="m", seed=0)
    return model, ckpt_mod.Checkpointer(options=ckpt_mod.CheckpointOptions(directory=str(directory), keep=keep),
                                        state=adapter.state(model), strategy=strategy, is_chief=True,
                                        task_name="worker:0", run_metadata=run)


def test_the_checkpointer_reports_when_a_background_save_was_written(tmp_path):
    from tfdist.checkpoint import layout

    _, checkpointer = _checkpointer(_tiny, tmp_path, keep=1)
    for step in (1, 2):
        path = checkpointer.save(global_step=step, epoch=0, step_in_epoch=step, history=[])
        checkpointer.sync()
        assert checkpointer.last_write_seconds is not None and checkpointer.last_write_seconds > 0
        assert layout.checkpoint_paths(str(tmp_path)) == [path]  # written, listed, and the older one swept
    checkpointer.close()


class _Hold:
    """Stops TensorFlow's writer thread once, inside its walk of the object graph."""

    def __init__(self):
        self.entered, self.release = threading.Event(), threading.Event()

    def pause(self) -> None:
        self.entered.set()
        self.release.wait(60)


def _gated_model(keras_name: str, hold: _Hold):
    """A tiny model whose last layer pauses the first background walk of the object graph that
    reaches it: after the walk listed the model's children, before it serializes them."""
    keras = __import__(keras_name)

    class Gate(keras.layers.Layer):
        armed = False

        def call(self, inputs):
            return inputs

        def _trackable_children(self, save_type="checkpoint", **kwargs):
            children = super()._trackable_children(save_type, **kwargs)
            if Gate.armed and threading.current_thread() is not threading.main_thread():
                Gate.armed = False
                hold.pause()
            return children

    def build():
        encoder = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8), keras.layers.BatchNormalization()],
                                   name="encoder")
        model = keras.Sequential([keras.Input((6,)), encoder, keras.layers.Dense(3), Gate()])
        model.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    return build, Gate


@pytest.mark.parametrize("keras_name", ["keras", "tf_keras"])
def test_a_function_keras_creates_during_a_background_save_does_not_break_it(tmp_path, keras_name):
    """Keras adds ``predict_function`` (tf_keras also ``test_function``, at the first
    validation) to a model, nested ones too, when it first needs it, possibly while
    TensorFlow's writer thread walks the object graph: the walk then met a child it had not
    numbered (KeyError) and the save failed. Functions hold no state; the checkpoint leaves
    them out."""
    from tfdist.checkpoint import layout

    hold = _Hold()
    build, gate = _gated_model(keras_name, hold)
    model, checkpointer = _checkpointer(build, tmp_path, keep=2)
    try:
        checkpointer.save(global_step=1, epoch=0, step_in_epoch=1, history=[])
        checkpointer.sync()
        gate.armed = True
        path = checkpointer.save(global_step=2, epoch=0, step_in_epoch=2, history=[])
        assert hold.entered.wait(60), "the writer thread did not reach the gate layer"
        encoder = model.get_layer("encoder")
        assert getattr(model, "predict_function", None) is None and getattr(encoder, "predict_function", None) is None
        model.predict(_X[:4], verbose=0)  # creates predict_function while the writer thread is paused
        encoder.predict(_X[:4], verbose=0)  # as a callback showing the encoder's outputs would
        assert model.predict_function is not None and encoder.predict_function is not None
    finally:
        hold.release.set()
    checkpointer.sync()
    assert layout.checkpoint_paths(str(tmp_path))[-1] == path
    checkpointer.close()

    # The same variable names as tf.train.Checkpoint(model=..., optimizer=...), whose checkpoint
    # -- with the functions' nodes -- restores through the view.
    import tensorflow as tf
    from tfdist._compat import tracking

    plain = tf.train.Checkpoint(model=model, optimizer=model.optimizer).write(str(tmp_path / "plain" / "ckpt"))
    def keys(checkpoint):
        return sorted(k for k, _ in tf.train.list_variables(checkpoint) if k.startswith(("model/", "optimizer/")))

    assert keys(path) == keys(plain) and len(keys(path)) >= 8
    saved = [w.copy() for w in model.get_weights()]
    model.set_weights([w + 1.0 for w in saved])
    tf.train.Checkpoint(model=tracking.model_state(model)).read(plain).assert_existing_objects_matched()
    assert all(np.array_equal(a, b) for a, b in zip(model.get_weights(), saved))


def test_a_ram_filesystem_checkpoint_dir_resumes_exactly_and_writes_nothing_locally(tmp_path, monkeypatch, capsys,
                                                                                    uninterrupted):
    """``ram://`` stands in for gs:// / s3:// / hdfs://: every read, write, listing and removal
    must go through TensorFlow's filesystem layer, none through the local disk."""
    import tensorflow as tf

    from tfdist.checkpoint import inspect, layout
    from tfdist.cli import main

    reference, ref_dir = uninterrupted
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    directory = "ram://tfdist-test/run"
    with pytest.raises(_Crash):
        _fit(directory, callbacks=[_crash_at(12)])
    resumed = _fit(directory)
    assert resumed.tfdist.start_step == 9 and resumed.tfdist.global_step == 30
    assert resumed.history == reference.history
    assert_bit_identical(checkpoint_tensors(str(ref_dir)), checkpoint_tensors(directory))
    # Retention (keep=3) and the metadata of deleted checkpoints went through the filesystem layer too.
    listed = [info for info in inspect.list_checkpoints(directory) if info.listed]
    assert [info.global_step for info in listed] == [24, 27, 30] and all(info.problem is None for info in listed)
    assert sorted(n for n in tf.io.gfile.listdir(directory) if n.endswith(layout.METADATA_SUFFIX)) == [
        f"ckpt-{s}{layout.METADATA_SUFFIX}" for s in (24, 27, 30)]
    assert main(["ckpt", "list", directory, "--json"]) == 0
    assert [e["global_step"] for e in json.loads(capsys.readouterr().out)] == [24, 27, 30]
    # A corrupt latest checkpoint: the previous one is used, the corrupt one kept aside.
    data_file = next(p for p in layout.checkpoint_files(f"{directory}/ckpt-30") if layout.is_data_file(p))
    with tf.io.gfile.GFile(data_file, "rb") as f:
        content = f.read()
    tf.io.gfile.remove(data_file)  # ram:// appends to an existing file instead of truncating it
    with tf.io.gfile.GFile(data_file, "wb") as f:
        f.write(content[: len(content) // 2])
    assert _fit(directory, epochs=3).tfdist.start_step == 27
    assert any(".replaced-" in n for n in tf.io.gfile.listdir(directory))
    # Nothing local: no folder named "ram:", no file in the working directory.
    assert os.listdir(workdir) == []
    # Each process has its own ram://: a job of several tasks is refused before anything starts.
    from tfdist.cluster import parse_tf_config
    from tfdist.errors import StorageError

    two = parse_tf_config({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, "task": {"type": "worker", "index": 0}})
    with pytest.raises(StorageError, match=r"checkpoint_dir is in one process's memory \(ram://\), which each of the "
                                           r"job's 2 tasks holds apart"):
        _fit(directory, cluster=two)


def _leave_interrupted_writes(directory, *, age: float) -> dict:
    """What writes killed mid-way leave in a checkpoint directory, last changed ``age`` seconds
    ago (negative: in the future, i.e. after the next run begins); returns {name: is_dir}."""
    import time

    stamp = time.time() - age
    made = {"ckpt-40_temp": True, "ckpt-41.tfdist.json.tmp-1234": False, "checkpoint.tmp5b7e2c": False,
            ".tfdist-write-test-0a1b2c3d": False}
    for name, is_dir in made.items():
        path = directory / name
        if is_dir:
            path.mkdir()
            (path / "part-00000-of-00001.data-00000-of-00001.tempstate123").write_bytes(b"\0" * 4096)
            os.utime(path / "part-00000-of-00001.data-00000-of-00001.tempstate123", (stamp, stamp))
        else:
            path.write_text("partial")
        os.utime(path, (stamp, stamp))
    return made


def test_resuming_removes_an_old_checkpoints_files_its_killed_deletion_left_without_index(tmp_path, caplog):
    # The retention policy deletes the index first: a SIGKILL then left the data shard and the
    # metadata of an old checkpoint for good (found by a loop of random kills).
    import shutil
    import time

    hourly = CheckpointOptions(keep=2, keep_every_hours=1e-9)
    _fit(tmp_path, epochs=1, checkpoint_options=hourly)  # ckpt-3, 6, 9 kept by keep_every_hours
    stamp = time.time() - 60
    for suffix in (".data-00000-of-00001", ".tfdist.json"):
        shutil.copy(tmp_path / f"ckpt-12{suffix}", tmp_path / f"ckpt-4{suffix}")  # an index-less ckpt-4
        os.utime(tmp_path / f"ckpt-4{suffix}", (stamp, stamp))
    with caplog.at_level("INFO", logger="tfdist"):
        assert _fit(tmp_path, epochs=2, checkpoint_options=hourly).tfdist.start_step == 15
    names = os.listdir(tmp_path)
    assert not [name for name in names if name.startswith("ckpt-4.")], names
    assert "ckpt-4.data-00000-of-00001" in caplog.text
    assert {"ckpt-3.index", "ckpt-6.index", "ckpt-9.index", "ckpt-9.data-00000-of-00001"} <= set(names)


def test_resuming_removes_what_killed_writes_left_and_nothing_else(tmp_path, caplog):
    # A save killed mid-way leaves ckpt-N_temp/ (as large as a checkpoint) and temporary files;
    # saves every N seconds fall on other steps after a resume, so nothing else would remove them.
    _fit(tmp_path, epochs=1)
    replaced = tmp_path / "ckpt-3.index.replaced-20261125-000000"  # a corrupt checkpoint moved aside: kept
    replaced.write_text("kept")
    left = _leave_interrupted_writes(tmp_path, age=60)
    kept_before = _tree_digest(tmp_path)
    with caplog.at_level("INFO", logger="tfdist"):
        resumed = _fit(tmp_path, epochs=2)
    assert resumed.tfdist.start_step == 15
    names = os.listdir(tmp_path)
    assert not set(left) & set(names), names
    assert replaced.name in names and "ckpt-30.index" in names
    assert "removed what 4 interrupted write(s) left" in caplog.text and "ckpt-40_temp/ (4.1 kB)" in caplog.text
    assert _tree_digest(tmp_path)[replaced.name] == kept_before[replaced.name]

    # Changed after the run began: another process may still be writing there, so it stays.
    left = _leave_interrupted_writes(tmp_path, age=-3600)
    caplog.clear()
    with caplog.at_level("INFO", logger="tfdist"):
        _fit(tmp_path, epochs=3)
    assert set(left) <= set(os.listdir(tmp_path))
    assert "may be another process's write in flight" in caplog.text


def test_a_directory_of_another_run_keeps_what_killed_writes_left(tmp_path):
    from tfdist.errors import CheckpointMismatchError

    _fit(tmp_path, epochs=1)
    left = _leave_interrupted_writes(tmp_path, age=60)
    before = _tree_digest(tmp_path)
    with pytest.raises(CheckpointMismatchError):
        _fit(tmp_path, epochs=2, batch_size=30)
    assert _tree_digest(tmp_path) == before and set(left) <= set(os.listdir(tmp_path))


def test_on_a_remote_filesystem_killed_writes_are_removed_through_it_and_kept_when_their_age_is_unknown(
        tmp_path, monkeypatch, caplog):
    import tensorflow as tf

    from tfdist import storage

    directory = "ram://tfdist-test/leftovers"
    _fit(directory, epochs=1)

    def leave():
        tf.io.gfile.makedirs(f"{directory}/ckpt-40_temp")
        for name in ("ckpt-40_temp/part-00000-of-00001.index", "ckpt-41.tfdist.json.tmp-0a1b2c3d"):
            with tf.io.gfile.GFile(f"{directory}/{name}", "wb") as f:
                f.write(b"partial")

    # ram:// reports no modification times (gs:// does, for objects): an age it cannot know keeps them.
    leave()
    with caplog.at_level("INFO", logger="tfdist"):
        _fit(directory, epochs=2)
    assert {"ckpt-40_temp", "ckpt-41.tfdist.json.tmp-0a1b2c3d"} <= set(tf.io.gfile.listdir(directory))
    assert "of unknown age" in caplog.text
    # With the times an object store gives, they are removed through TensorFlow's filesystem layer.
    monkeypatch.setattr(storage, "mtime", lambda path: 1.0e9)
    _fit(directory, epochs=3)
    left = [n for n in tf.io.gfile.listdir(directory) if "_temp" in n or ".tmp" in n]
    assert left == [] and tf.io.gfile.exists(f"{directory}/ckpt-45.index")


def test_a_task_started_again_reuses_its_scratch_directory_instead_of_leaving_another(tmp_path):
    # A non-chief worker saves to a local throw-away directory and removes it when it ends; a
    # killed one cannot, so its restart must empty and reuse it rather than add a checkpoint copy.
    from tfdist import storage

    key = str(tmp_path / "run" / "checkpoints")
    first = storage.task_scratch_dir(purpose="ckpt", task_name="worker:1", key=key)
    with open(os.path.join(first, "ckpt-8.data-00000-of-00001"), "wb") as f:
        f.write(b"\0" * 100)
    again = storage.task_scratch_dir(purpose="ckpt", task_name="worker:1", key=key)
    assert again == first == storage.task_scratch_path(purpose="ckpt", task_name="worker:1", key=key)
    assert os.listdir(again) == []
    other = storage.task_scratch_dir(purpose="ckpt", task_name="worker:2", key=key)
    elsewhere = storage.task_scratch_dir(purpose="ckpt", task_name="worker:1", key=key + "2")
    assert len({first, other, elsewhere}) == 3
    # A name held by something else (here a link) is neither followed nor emptied: a fresh directory is used.
    for path in (first, other, elsewhere):
        os.rmdir(path)
    target = tmp_path / "not-yours"
    target.mkdir()
    (target / "keep").write_text("x")
    os.symlink(target, first)
    try:
        fresh = storage.task_scratch_dir(purpose="ckpt", task_name="worker:1", key=key)
        assert fresh != first and os.path.isdir(fresh) and os.listdir(target) == ["keep"]
        os.rmdir(fresh)
    finally:
        os.remove(first)


def test_a_scheme_tensorflow_cannot_open_is_refused_before_training(tmp_path, capsys):
    from tfdist.cli import main
    from tfdist.errors import StorageError

    with pytest.raises(StorageError, match=r"no filesystem for the scheme s3://; received checkpoint_dir='s3://bucket/run'.*tensorflow-io"):
        _fit("s3://bucket/run")
    assert main(["train", "--output-dir", "s3://bucket/run", "--epochs", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "received --output-dir='s3://bucket/run'" in err and "Fix:" in err


_REPLICA_COUNTS = textwrap.dedent(
    """
    import shutil, tempfile
    import numpy as np
    import tensorflow as tf
    from test_evaluation import _builder

    def fit(keras_name, replicas, epochs, directory):
        strategy = dict(strategy="one_device") if replicas == 1 else dict(strategy="mirrored", devices=devices[:replicas])
        return tfdist.fit(_builder(keras_name), "digits", epochs=epochs, batch_size=48, steps_per_epoch=6, seed=0,
                          deterministic=True, checkpoint_dir=directory, save_every_steps=4, verbose=0, **strategy)

    for keras_name in ("keras", "tf_keras"):
        # More replicas than wrote the checkpoint: 1 -> 2 -> 3, each run going on where the last stopped.
        more = tempfile.mkdtemp()
        steps = [fit(keras_name, replicas, epochs, more).tfdist for replicas, epochs in ((1, 1), (2, 2))]
        two = tempfile.mkdtemp()  # the run as 2 replicas finished its second epoch
        shutil.copytree(more, two, dirs_exist_ok=True)
        steps.append(fit(keras_name, 3, 3, more).tfdist)
        results[keras_name + " more"] = [[s.num_replicas, s.start_step, s.global_step] for s in steps]
        # That finished run of 2 replicas, started again on 3 and on 1: each replica starts from the mean of the
        # saved replicas' BatchNormalization statistics (a checkpoint of Keras 3's holds the first replica's).
        reader = tf.compat.v1.train.NewCheckpointReader(tf.train.latest_checkpoint(two))
        saved = [reader.get_tensor(name) for name in sorted(reader.get_variable_to_shape_map())
                 if name.startswith("replica_state/r2_v") and reader.get_tensor(name).dtype == np.float32]
        for replicas in (3, 1):
            copy = tempfile.mkdtemp()
            shutil.copytree(two, copy, dirs_exist_ok=True)
            model = fit(keras_name, replicas, 2, copy).model
            statistics = [np.asarray(w) for w in model.non_trainable_weights if "moving" in w.name]
            results[f"{keras_name} 2 -> {replicas}"] = {
                "statistics": len(statistics),
                "mean": [any(np.allclose(w, per.mean(axis=0), rtol=0, atol=1e-6) for per in saved) for w in statistics],
                "first": [any(np.array_equal(w, per[0]) for per in saved) for w in statistics],
                "replicas_differ": [bool(np.any(per[0] != per[1])) for per in saved],
            }
    """
)


@pytest.mark.timeout(500)
def test_a_checkpoint_resumes_on_more_or_fewer_replicas_from_the_mean_of_their_statistics(_replica_results):
    results = _replica_results
    for keras_name in ("keras", "tf_keras"):
        # Each run resumes at the step the last one ended: a checkpoint without per-replica values, or with
        # another replica count's, is not refused as unreadable.
        assert results[keras_name + " more"] == [[1, 0, 6], [2, 6, 12], [3, 12, 18]], keras_name
        for replicas in (3, 1):
            result = results[f"{keras_name} 2 -> {replicas}"]
            assert result["statistics"] == 2 and all(result["replicas_differ"]), result
            assert all(result["mean"]) and not any(result["first"]), (keras_name, replicas, result)


def _loss_scaled(keras_name: str):
    """mixed_float16 with a dynamic loss scale that moves both ways within a few steps: it starts
    low, doubles after every 2 finite steps and halves (skipping the update) on an overflow."""
    def build():
        keras = __import__(keras_name)
        layers = keras.layers
        model = keras.Sequential([
            keras.Input((8, 8, 1)), layers.Conv2D(8, 3), layers.BatchNormalization(), layers.Activation("relu"),
            layers.Flatten(), layers.Dropout(0.1), layers.Dense(10), layers.Activation("linear", dtype="float32"),
        ])
        inner = keras.optimizers.Adam(keras.optimizers.schedules.CosineDecay(0.05, 40))
        optimizer = keras.mixed_precision.LossScaleOptimizer(inner, initial_scale=2.0 ** 16, dynamic_growth_steps=2)
        model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
        return model

    return build


@pytest.mark.parametrize("keras_name", ["keras", "tf_keras"])
def test_mixed_precision_resumes_with_the_loss_scale_where_it_was(tmp_path, keras_name):
    import tfdist

    from conftest import Crash, crash_after

    def fit(directory, **kwargs):
        return tfdist.fit(_loss_scaled(keras_name), "digits", epochs=2, batch_size=128, seed=3, deterministic=True,
                          strategy="one_device", mixed_precision="mixed_float16", verbose=0,
                          checkpoint_dir=str(directory), save_every_steps=4, **kwargs)

    def scale(model):  # Keras 3's LossScaleOptimizer, tf_keras' LossScaleOptimizerV3
        optimizer = model.optimizer
        return float(optimizer.dynamic_scale if hasattr(optimizer, "dynamic_scale") else optimizer.loss_scale)

    reference = fit(tmp_path / "ref")
    with pytest.raises(Crash):
        fit(tmp_path / "int", callbacks=[crash_after(9, keras_name)])
    saved = checkpoint_tensors(str(tmp_path / "int"))
    at_step_8 = [float(v) for k, v in saved.items() if k.endswith(("dynamic_scale/.ATTRIBUTES/VARIABLE_VALUE",
                                                                   "current_loss_scale/.ATTRIBUTES/VARIABLE_VALUE"))]
    assert len(at_step_8) == 1 and at_step_8[0] != 2.0 ** 16  # the scale had moved before the crash
    resumed = fit(tmp_path / "int")
    assert resumed.tfdist.start_step == 8 and scale(resumed.model) == scale(reference.model) != at_step_8[0]
    assert resumed.history["loss"] == reference.history["loss"]
    assert reference.history["loss"][-1] < reference.history["loss"][0]  # it trained, not only skipped steps
    assert_bit_identical(checkpoint_tensors(str(tmp_path / "ref")), checkpoint_tensors(str(tmp_path / "int")))
