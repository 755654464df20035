"""multi_worker_mirrored in real local processes: launch, exact resume after a kill, no hangs.

The model is the built-in ``resnet`` (input noise, batch normalization, dropout, a decaying
learning rate): each worker's replica keeps its own BatchNormalization statistics, which a
resume must give back to it."""

import glob
import json
import re
import sys
import time

import numpy as np
import pytest

from conftest import assert_bit_identical, base_env, checkpoint_tensors, free_port, launched_job, read_json

TRAIN = ["train", "--model", "resnet", "--epochs", "3", "--steps-per-epoch", "8", "--per-replica-batch-size", "16",
         "--seed", "1", "--deterministic", "--save-every-steps", "4", "--verbose", "0"]
SYNC_CLUSTER = ["--workers", "2", "--max-restarts", "0"]  # tfdist launch's flags for a script's cluster


def _launch(procs, out_dir, *train_args, workers=2, fault=None, restarts=2, timeout=300):
    environ = base_env(**({"TFDIST_FAULT": fault} if fault else {}))
    return procs.tfdist(
        "launch", "--workers", str(workers), "--max-restarts", str(restarts), "--grace", "10", "--",
        sys.executable, "-m", "tfdist", *TRAIN, *train_args, "--output-dir", str(out_dir),
        "--summary-json", str(out_dir / "summary.json"), timeout=timeout, env=environ,
    )


@pytest.mark.timeout(900)
def test_two_workers_train_and_a_killed_worker_is_recovered_bit_identically(procs, tmp_path):
    reference, interrupted = tmp_path / "reference", tmp_path / "interrupted"
    code, out = _launch(procs, reference)
    assert code == 0, out[-4000:]
    summary = read_json(reference / "summary.json")
    assert summary["strategy"] == "multi_worker_mirrored" and summary["num_replicas"] == 2
    assert summary["all_reduce"] == "ring"  # auto on CPUs
    assert summary["num_workers"] == 2 and summary["global_step"] == 24 and summary["global_batch_size"] == 32

    # worker:1 is SIGKILLed after step 11: the launcher restarts the cluster, which resumes. On that
    # restart, SIGTERM reaches worker:1 alone at step 18: the workers agree on a step, both save
    # there and exit with 75, the launcher restarts the cluster again, and the run ends identical.
    code, out = _launch(procs, interrupted, fault="worker:1/kill_at_step:11,worker:1/term_at_step:18@1")
    assert code == 0, out[-4000:]
    assert "kill_at_step at step 11" in out and "(restart 1)" in out
    assert "[worker:1] tfdist: SIGTERM received" in out and "exited with code 75" in out and "(restart 2)" in out
    assert "preempted by another worker's signal" in out  # worker:0 saved and stopped with it
    resumed = read_json(interrupted / "summary.json")
    assert 18 <= resumed["start_step"] < 24 and resumed["global_step"] == 24, resumed  # where the workers agreed
    assert re.search(r"resuming from .*global step (4|8) ", out), out[-4000:]  # the last completed save before the kill
    assert_bit_identical(checkpoint_tensors(str(reference / "checkpoints")),
                         checkpoint_tensors(str(interrupted / "checkpoints")))
    assert resumed["final_loss"] == summary["final_loss"]
    assert _history(interrupted) == _history(reference)  # every epoch's metrics, the resumed ones too
    # The chief wrote the trained model (every worker took part in saving it); it is the same model.
    assert _model_weights(interrupted) and all(
        np.array_equal(a, b) for a, b in zip(_model_weights(reference), _model_weights(interrupted)))
    # worker:1's local copies of the checkpoints: the killed task's were emptied by its restart,
    # which removed the directory when it ended, so no copy is left behind.
    from tfdist import storage

    scratch = storage.task_scratch_path(purpose="ckpt", task_name="worker:1", key=str(interrupted / "checkpoints"))
    assert not glob.glob(scratch + "*"), glob.glob(scratch + "*")

    # A checkpoint of 2 workers restores under one_device (same global batch) and continues,
    # without TensorFlow's warnings about the per-replica values one replica cannot use.
    code, out = procs.tfdist(*TRAIN, "--epochs", "4", "--strategy", "one_device", "--per-replica-batch-size", "32",
                             "--output-dir", str(reference), "--summary-json", str(tmp_path / "one.json"),
                             timeout=240, env=base_env())
    assert code == 0, out[-4000:]
    one = read_json(tmp_path / "one.json")
    assert one["strategy"] == "one_device" and one["start_step"] == 24 and one["global_step"] == 32
    assert "saved by 2 replicas, this run has 1" in out
    assert not [line for line in out.splitlines() if "could not be found" in line or "Unresolved object" in line]
    # 2 workers of one replica -> one machine with 2 replicas: each replica gets its own state back.
    code, out = procs.tfdist(*TRAIN, "--epochs", "4", "--strategy", "mirrored", "--cpu-devices", "2",
                             "--output-dir", str(interrupted), "--summary-json", str(tmp_path / "mirrored.json"),
                             timeout=240, env=base_env())
    assert code == 0, out[-4000:]
    mirrored = read_json(tmp_path / "mirrored.json")
    assert mirrored["strategy"] == "mirrored" and mirrored["start_step"] == 24 and mirrored["global_step"] == 32
    assert "saved by" not in out and "could not be found" not in out


def _model_weights(out_dir) -> list:
    import keras

    return keras.models.load_model(out_dir / "model.keras").get_weights()


def _history(out_dir):
    return read_json(out_dir / "checkpoints" / "ckpt-24.tfdist.json")["history"]


def _tf_config(ports, index):
    return json.dumps({"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]}, "task": {"type": "worker", "index": index}})


@pytest.mark.timeout(180)
def test_a_peer_that_never_starts_gives_an_error_naming_it_within_the_timeout(procs, tmp_path):
    ports = [free_port(), free_port()]
    start = time.monotonic()
    code, out = procs.tfdist(*TRAIN, "--output-dir", str(tmp_path), timeout=150,
                             env=base_env(TF_CONFIG=_tf_config(ports, 0), TFDIST_STARTUP_TIMEOUT="3"))
    elapsed = time.monotonic() - start
    assert code == 76, out[-3000:]
    assert elapsed < 60
    line = next(line for line in out.splitlines() if line.startswith("tfdist: error:"))
    assert f"worker:1 (127.0.0.1:{ports[1]})" in line and "did not come up within 3 s" in line
    assert "Fix: start every task listed in TF_CONFIG (or use `tfdist launch`)" in line


@pytest.mark.timeout(240)
def test_a_peer_that_dies_mid_run_ends_the_survivor_without_a_launcher(procs, tmp_path):
    ports = [free_port(), free_port()]
    scratch = tmp_path / "tmp"  # worker:1's local copies of the checkpoints: killed and never restarted, it keeps them
    scratch.mkdir()
    started = [
        procs.start([sys.executable, "-m", "tfdist", *TRAIN, "--output-dir", str(tmp_path / "run")],
                    env=base_env(TF_CONFIG=_tf_config(ports, i), TFDIST_FAULT="worker:1/kill_at_step:6",
                                 TMPDIR=str(scratch)))
        for i in range(2)
    ]
    out1, _ = started[1].communicate(timeout=200)
    assert started[1].returncode == -9, out1[-2000:]
    died = time.monotonic()
    out0, _ = started[0].communicate(timeout=120)
    assert started[0].returncode != 0, out0[-3000:]
    assert time.monotonic() - died < 60
    assert "tfdist: error:" in out0 and "Traceback" not in out0.split("tfdist: error:")[-1]


# Keras 3 only: tf_keras accumulates in its own train_step under every strategy, which mirrored and
# central_storage check (test_fit.py), and tf_keras evaluates on two workers in the test after this one.
@pytest.mark.timeout(600)
def test_gradient_accumulation_matches_the_large_batch_on_two_workers(procs, tmp_path):
    common = ["--model", "linear", "--keras", "3", "--epochs", "1", "--steps-per-epoch", "6", "--save-every-steps", "100"]
    code, out = _launch(procs, tmp_path / "big", *common, "--per-replica-batch-size", "16")
    assert code == 0, out[-4000:]
    code, out = _launch(procs, tmp_path / "acc", *common, "--per-replica-batch-size", "8", "--grad-accum-steps", "2")
    assert code == 0, out[-4000:]
    big, acc = read_json(tmp_path / "big" / "summary.json"), read_json(tmp_path / "acc" / "summary.json")
    assert big["global_batch_size"] == acc["global_batch_size"] == 32 and acc["micro_batch_size"] == 8
    a = checkpoint_tensors(str(tmp_path / "big" / "checkpoints"))
    b = checkpoint_tensors(str(tmp_path / "acc" / "checkpoints"))
    # Keras 3 checkpoints keep the weights under the optimizer's _trainable_variables
    model_keys = [k for k in a if "/_trainable_variables/" in k]
    assert len(model_keys) >= 2, sorted(a)
    for key in model_keys:
        np.testing.assert_allclose(a[key], b[key], atol=2e-5, err_msg=key)
    iterations = "optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"
    assert a[iterations] == b[iterations] == 6  # one optimizer iteration per accumulated step
    # Both workers took part in writing the trained model (tfdist.save_model); the chief's file
    # loads and holds the checkpoint's weights.
    import keras

    loaded = keras.models.load_model(tmp_path / "acc" / "model.keras")
    kernel = next(b[k] for k in model_keys if b[k].ndim == 2)
    assert any(np.array_equal(w, kernel) for w in loaded.get_weights())
    # tfdist evaluate on both workers loads that file in their strategy's scope and scores the held-out
    # digits as the run's last validation did (each worker's replica evaluating half of them).
    scores = tmp_path / "scores.json"
    code, out = procs.tfdist("launch", "--workers", "2", "--max-restarts", "0", "--", sys.executable, "-m", "tfdist",
                             "evaluate", str(tmp_path / "acc" / "model.keras"), "--json", str(scores),
                             timeout=240, env=base_env())
    assert code == 0, out[-4000:]
    result = read_json(scores)
    assert result["examples"] == 359 and result["accuracy"] == acc["val_accuracy"]
    assert "strategy multi_worker_mirrored, 2 replica(s)" in out
    # tfdist predict: each worker's replica predicts half; the chief writes all, in order.
    code, out = procs.tfdist("launch", "--workers", "2", "--max-restarts", "0", "--", sys.executable, "-m",
                             "tfdist", "predict", str(tmp_path / "acc" / "model.keras"), "--output",
                             str(tmp_path / "predicted.npy"), timeout=240, env=base_env())
    assert code == 0 and "strategy multi_worker_mirrored, 2 replica(s)" in out, out[-4000:]
    from tfdist.data import load_digits

    np.testing.assert_allclose(np.load(tmp_path / "predicted.npy"), loaded.predict(load_digits()[1].x, verbose=0),
                               rtol=1e-5, atol=1e-6)


# One launched job of two workers runs the fits of the three tests below in turn, each in its own
# directory, then tests/test_keras3.py's program on two workers: every worker start costs ~7 s of
# CPU in imports, and six jobs would start 10 more. argv: the job's directory. Each part prints
# "PART <part> <keras>" on every worker before it starts.
AFTER_FIT_SCRIPT = """
import glob, json, os, sys
import numpy as np
import tfdist
from tfdist.data import load_digits
from test_evaluation import _builder

job = sys.argv[1]
train, val = load_digits()
task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]


def evaluate(keras_name, out):
    history = tfdist.fit(_builder(keras_name), (train.x, train.y), validation_data=(val.x, val.y), epochs=2,
                         batch_size=64, seed=0, verbose=0)
    predicted = tfdist.predict(history.model, val.x, batch_size=64, verbose=0)
    json.dump({"strategy": history.tfdist.strategy,
               "predicted": predicted.tolist(), "labels": val.y.tolist(),
               "last": {key: history.history["val_" + key][-1] for key in ("loss", "accuracy")},
               "same_batch": tfdist.evaluate(history.model, val.x, val.y, batch_size=64),
               "other_batch": tfdist.evaluate(history.model, (val.x, val.y), per_replica_batch_size=9, verbose=0)},
              open(f"{out}/worker{task}.json", "w"))


def callback_files(keras_name, out):
    keras = __import__(keras_name)
    x = np.random.default_rng(0).random((128, 8)).astype("float32")
    y = (x.sum(axis=1) > 4).astype("int32")

    def build():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)])
        model.compile(keras.optimizers.SGD(0.05), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    weights = "w-{epoch:02d}.weights.h5" if keras_name == "keras" else "w-{epoch:02d}.h5"
    best = "best.keras" if keras_name == "keras" else "best.h5"
    callbacks = [
        keras.callbacks.ModelCheckpoint(os.path.join(out, weights), save_weights_only=True),
        keras.callbacks.ModelCheckpoint(os.path.join(out, best), monitor="val_loss", save_best_only=True),
        keras.callbacks.CSVLogger(os.path.join(out, "log.csv")),
        keras.callbacks.TensorBoard(os.path.join(out, "tb")),
    ]
    tfdist.fit(build, (x, y), epochs=3, batch_size=32, seed=1, verbose=0, validation_data=(x, y), callbacks=callbacks)
    paths = [str(getattr(cb, a)) for cb, a in zip(callbacks, ("filepath", "filepath", "filename", "log_dir"))]
    print(f"PATHS {keras_name} " + json.dumps(paths), flush=True)


def xla(keras_name, out):
    keras = __import__(keras_name)

    def build():
        model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(10)])
        model.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      jit_compile=True)
        return model

    history = tfdist.fit(build, (train.x, train.y), epochs=1, steps_per_epoch=3, batch_size=32, seed=0, verbose=0)
    print("TRAINED", keras_name, history.tfdist.strategy, history.tfdist.global_step, flush=True)


def keras3_loop(keras_name, out):
    import test_keras3

    json.dump(test_keras3.program_multi_worker(), open(f"{out}/worker{task}.json", "w"))


for part, kerases in ((evaluate, ("keras", "tf_keras")), (callback_files, ("keras", "tf_keras")),
                      (xla, ("keras", "tf_keras")), (keras3_loop, ("keras",))):
    for keras_name in kerases:
        out = os.path.join(job, f"{part.__name__}-{keras_name}")
        os.makedirs(out, exist_ok=True)
        print(f"PART {part.__name__} {keras_name}", flush=True)
        part(keras_name, out)
"""


def after_fit_run(reference_runs):
    """The job of AFTER_FIT_SCRIPT, made once for this file and tests/test_keras3.py: its directory
    and the launch's output."""
    return launched_job(reference_runs, AFTER_FIT_SCRIPT, cluster=SYNC_CLUSTER)


@pytest.fixture(scope="module")
def after_fit(reference_runs):
    return after_fit_run(reference_runs)


def part_lines(out: str, task: str, part: str) -> str:
    """The lines that ``task`` printed to stdout while it ran ``part`` ("evaluate keras") of a job
    whose tasks print "PART <part>" before each part."""
    lines, current = [], None
    for line in out.splitlines():
        if line.startswith(f"[{task}] PART "):
            current = line.split(" PART ", 1)[1].strip()
        elif line.startswith(f"[{task}] ") and current == part:
            lines.append(line)
    return "\n".join(lines)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("keras", ["keras", "tf_keras"])
def test_after_fit_every_worker_evaluates_and_predicts_its_part_and_gets_the_whole_sets_results(after_fit, keras):
    # Keras 3's own model.evaluate fails here (a PerReplica value it cannot convert); tfdist.evaluate
    # runs fit's validation on its own: each worker's replica reads half of the examples.
    job, out = after_fit
    first, second = read_json(job / f"evaluate-{keras}" / "worker0.json"), read_json(job / f"evaluate-{keras}" / "worker1.json")
    assert first == second
    assert first["strategy"] == "multi_worker_mirrored"
    assert first["same_batch"] == first["last"]
    # Every worker got all 359 outputs, in order: they score what the validation scored.
    predicted = np.asarray(first["predicted"])
    assert predicted.shape == (359, 10)
    accuracy = float(np.mean(np.argmax(predicted, axis=-1) == np.asarray(first["labels"])))
    assert accuracy == pytest.approx(first["last"]["accuracy"], abs=1e-7)
    assert first["other_batch"]["accuracy"] == first["last"]["accuracy"]
    assert first["other_batch"]["loss"] == pytest.approx(first["last"]["loss"], rel=1e-6)
    # Progress shows on the chief only: 6 steps, as each replica evaluates 180 (or 179) of 359 examples, 32 at a time.
    assert "[worker:0] 6/6 - " in part_lines(out, "worker:0", f"evaluate {keras}")
    assert "[worker:1] 6/6" not in part_lines(out, "worker:1", f"evaluate {keras}")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("keras", ["keras", "tf_keras"])
def test_the_chief_alone_writes_the_files_of_the_users_callbacks(after_fit, keras):
    # Every worker runs the callbacks; Keras 3's ModelCheckpoint, TensorBoard and both Kerases'
    # CSVLogger know nothing of workers: two writers of one HDF5 file fail the job (a file lock),
    # of one .keras file corrupt it, and a CSV file gets every row twice.
    import csv
    import os

    job, printed = after_fit
    out = job / f"callback_files-{keras}"
    keras_module = __import__(keras)
    suffix = ".weights.h5" if keras == "keras" else ".h5"
    assert sorted(os.listdir(out)) == sorted(["best" + (".keras" if keras == "keras" else ".h5"), "log.csv", "tb",
                                              *(f"w-0{e}{suffix}" for e in (1, 2, 3))])
    model = keras_module.models.load_model(str(next(out.glob("best.*"))))
    assert model.count_params() == 8 * 8 + 8 + 8 * 2 + 2
    with open(out / "log.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert [row[0] for row in rows] == ["epoch", "0", "1", "2"]
    assert len(glob.glob(str(out / "tb" / "train" / "events.out.tfevents.*"))) == 1
    # Each worker's callbacks name the user's paths again after fit; worker 1's scratch files are gone.
    paths = [json.loads(line.split(f"PATHS {keras} ", 1)[1]) for line in printed.splitlines() if f"PATHS {keras} " in line]
    assert len(paths) == 2 and paths[0] == paths[1] and all(p.startswith(str(out)) for p in paths[0])


@pytest.mark.timeout(600)
def test_jit_compile_on_cpu_workers_trains_without_xla_and_says_so(after_fit):
    # XLA compiles NCCL's collectives only: every worker failed its first step ("Only compiling NCCL/auto collective
    # is supported, got: ring"), after Keras 3's loop had logged that the steps were compiled with XLA.
    _, out = after_fit
    for name in ("keras", "tf_keras"):
        assert out.count(f"TRAINED {name} multi_worker_mirrored 3") == 2, out[-4000:]
    assert out.count("jit_compile=True is not applied under multi_worker_mirrored with the ring all-reduce") == 4
    assert "compiled with XLA" not in out
