"""A user's own tf.data pipeline under multi_worker_mirrored in real processes: each worker reads its own files,
a SIGKILLed run resumes at the exact batch and ends bit-identical, a new worker count is said."""

import json
import shutil
import sys

import pytest

from conftest import SIGKILL_DRILL_GRACE, assert_bit_identical, base_env, checkpoint_tensors
from test_data_user_pipeline import write_records

# argv: data dir, checkpoint dir ('-' for none; each form trains in its subdirectory), forms (batched, fn or
# batched,fn: one fit after the other), epochs.
SCRIPT = '''
import glob, json, os, sys
import numpy as np
import tensorflow as tf
import keras
import tfdist

data, ckpt, forms, epochs = sys.argv[1], sys.argv[2], sys.argv[3].split(","), int(sys.argv[4])
strategy = tfdist.make_strategy()  # before any op, as multi_worker_mirrored needs (then the pipeline)
files = sorted(glob.glob(os.path.join(data, "*.tfrecord")))
read = tf.Variable(0, dtype=tf.int64)  # records this worker parsed


def parse(record):
    read.assign_add(1)
    example = tf.io.parse_single_example(record, {"x": tf.io.FixedLenFeature([4], tf.float32),
                                                  "y": tf.io.FixedLenFeature([], tf.int64)})
    return example["x"], example["y"]


def pipeline(batch):
    tf.random.set_seed(7)
    return (tf.data.TFRecordDataset(files).map(parse).shuffle(32, seed=2).batch(batch, drop_remainder=True)
            .prefetch(2))


def dataset_fn(context):  # as the tf.distribute tutorials write it
    tf.random.set_seed(7)
    names = tf.data.Dataset.from_tensor_slices(files).shard(context.num_input_pipelines, context.input_pipeline_id)
    return (names.interleave(tf.data.TFRecordDataset, cycle_length=1).map(parse).shuffle(32, seed=2)
            .batch(context.get_per_replica_batch_size(32), drop_remainder=True).prefetch(2))


def build():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)])
    model.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


class Count(keras.callbacks.Callback):  # records read by training alone (not the first batch read to build)
    def on_train_begin(self, logs=None):
        read.assign(0)


for form in forms:
    history = tfdist.fit(build, pipeline(32) if form == "batched" else dataset_fn, epochs=epochs, seed=1,
                         strategy=strategy, deterministic=True, verbose=0, callbacks=[Count()], save_every_steps=5,
                         checkpoint_dir=None if ckpt == "-" else os.path.join(ckpt, form))
    summary = history.tfdist
    print("RESULT " + json.dumps({"form": form, "read": int(read.numpy()), "start": summary.start_step,
                                  "step": summary.global_step, "workers": summary.num_workers,
                                  "loss": history.history["loss"]}), flush=True)
'''

CLUSTER = ["--workers", "2", "--max-restarts", "1", *SIGKILL_DRILL_GRACE]


@pytest.fixture(scope="module")
def records(reference_runs):
    """4 TFRecord files of 128 examples (x: 4 floats, y: a class of 2), written once for both xdist workers."""
    return reference_runs(["user pipeline records"], lambda directory: write_records(directory, per_file=128, seed=0))


def _results(out: str, form: str) -> list:
    results = [json.loads(line.split("RESULT ", 1)[1]) for line in out.splitlines() if "RESULT " in line]
    return [result for result in results if result["form"] == form]


@pytest.fixture(scope="module")
def references(reference_runs, records):
    """One uninterrupted job of two workers that trains both forms, one after the other, made once
    for both xdist workers: its checkpoint directory (a subdirectory a form) and its output."""
    from conftest import Processes

    def make(directory):
        with Processes() as procs:
            out = procs.launch_script(directory / "train.py", SCRIPT, records, directory / "checkpoints", "batched,fn",
                                      2, cluster=CLUSTER, timeout=500)
        (directory / "out.txt").write_text(out)

    directory = reference_runs(["user pipeline reference", SCRIPT, str(records), *CLUSTER], make)
    return directory / "checkpoints", (directory / "out.txt").read_text()


@pytest.mark.timeout(900)
@pytest.mark.parametrize("form", ["batched", "fn"])
def test_two_workers_read_their_own_files_and_a_sigkilled_worker_resumes_bit_identically(procs, tmp_path, records,
                                                                                           references, form):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    alone = {"read": 2 * 4 * 128}  # one worker alone reads every record once per epoch (measured for one form)
    if form == "batched":
        code, out = procs.run([sys.executable, str(script), str(records), "-", form, "2"], timeout=300)
        assert code == 0, out[-3000:]
        (alone,) = _results(out, form)
        assert alone["workers"] == 1 and alone["step"] == 32 and alone["read"] >= 2 * 4 * 128

    # The uninterrupted run of this form: the shared job's.
    checkpoints, out = references
    reference, interrupted = checkpoints / form, tmp_path / "interrupted"
    both = _results(out, form)
    assert len(both) == 2 and all(r["workers"] == 2 and r["step"] == 32 for r in both)
    assert all(r["read"] <= 0.55 * alone["read"] for r in both), (both, alone)  # each its own files

    # worker:1 is SIGKILLed after step 13; the launcher restarts both, which resume from step 10.
    out = procs.launch_script(script, SCRIPT, records, interrupted, form, 2, cluster=CLUSTER, timeout=400,
                              env=base_env(TFDIST_FAULT="worker:1/kill_at_step:13"))
    assert "kill_at_step at step 13" in out and "(restart 1)" in out, out[-3000:]
    resumed = _results(out, form)
    assert all(r["start"] == 10 for r in resumed), resumed
    # No replay: after the restore a worker reads about the 22 remaining steps' records, not the 10 before.
    assert all(r["read"] <= (22 / 32) * max(b["read"] for b in both) + 40 for r in resumed), (resumed, both)
    assert [r["loss"] for r in resumed] == [r["loss"] for r in both]
    assert_bit_identical(checkpoint_tensors(str(reference)), checkpoint_tensors(str(interrupted / form)))

    if form == "batched":  # elastic: the 2-worker run goes on at one worker (2 more epochs), which says what differs
        shutil.copytree(reference, tmp_path / "elastic" / form)  # the shared job's directory stays as it was
        code, out = procs.run([sys.executable, str(script), str(records), str(tmp_path / "elastic"), form, "3"],
                              timeout=300)
        assert code == 0, out[-3000:]
        (more,) = _results(out, form)
        assert more["start"] == 32 and more["step"] == 48
        assert "was saved at step 32 by 2 worker(s) in file mode, and this run has 1 worker(s) in slice mode" in out
