"""Training on TFRecord files: mirrored resume after SIGKILL is bit-identical, a new topology keeps the order,
validation metrics are those of the whole set, and malformed --data is a one-line error."""

import glob
import json
import sys

import numpy as np
import pytest

from conftest import REPO, assert_bit_identical, base_env, checkpoint_tensors, read_json
from test_data_files import write_digits

TRAIN = ["train", "--model", "cnn", "--epochs", "3", "--steps-per-epoch", "12", "--seed", "3", "--deterministic",
         "--save-every-steps", "5", "--verbose", "0"]


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    return write_digits(tmp_path_factory.mktemp("digits"))


def _train(procs, digits, out, *extra, fault=None):
    environ = base_env(**({"TFDIST_FAULT": fault} if fault else {}))
    return procs.tfdist(*TRAIN, "--data", digits["train"], "--features", digits["features"],
                        "--validation-data", digits["validation"], "--output-dir", str(out),
                        "--summary-json", str(out / "summary.json"), *extra, env=environ, timeout=300)


def _metadata(out):
    from tfdist.checkpoint import layout

    return layout.latest_metadata(str(out / "checkpoints"))


@pytest.fixture(scope="module")
def mirrored_drill(reference_runs):
    """A mirrored run on files, and the same run killed at step 17 and resumed by the command the
    shell makes of an unquoted glob; then the uninterrupted run continued under one_device (in a
    copy). Made once per suite: the directory holding the runs, their outputs and the
    killed run's recorded data fingerprint."""
    import shutil

    from conftest import Processes

    mirrored = ["--strategy", "mirrored", "--cpu-devices", "2", "--per-replica-batch-size", "16"]

    def make(root):
        digits = write_digits(root / "digits")
        reference, killed = root / "reference", root / "killed"
        with Processes() as procs:
            code, out = _train(procs, digits, reference, *mirrored)
            assert code == 0, out[-4000:]
            (root / "reference.out").write_text(out)
            code, out = _train(procs, digits, killed, *mirrored, fault="kill_at_step:17")  # the quoted glob
            assert code == -9, out[-4000:]
            (root / "fingerprint").write_text(_metadata(killed).run_value("data_fingerprint"))
            # The same command with the glob unquoted reaches tfdist as several paths, in the shell's order.
            expanded = sorted(glob.glob(digits["train"]), reverse=True)
            assert len(expanded) > 1
            code, out = procs.tfdist(*TRAIN, *mirrored, "--data", *expanded, "--features", digits["features"],
                                     "--validation-data", *glob.glob(digits["validation"]), "--output-dir",
                                     str(killed), "--summary-json", str(killed / "summary.json"), env=base_env(),
                                     timeout=300)
            (root / "resumed.out").write_text(f"{code}\n{out}")
            # 2 replicas -> 1, from a copy of the uninterrupted run.
            shutil.copytree(reference, root / "one_device")
            code, out = _train(procs, digits, root / "one_device", "--strategy", "one_device",
                               "--per-replica-batch-size", "32", "--epochs", "4")
            (root / "one_device.out").write_text(f"{code}\n{out}")

    return reference_runs(["test_data_training", "mirrored drill"], make)


def _exited(path):
    code, out = path.read_text().split("\n", 1)
    return int(code), out


@pytest.mark.timeout(900)  # the drill is made in the setup of the first test that asks for it
def test_mirrored_on_files_resumes_bit_identically_and_a_new_topology_keeps_the_order(mirrored_drill):
    reference, killed = mirrored_drill / "reference", mirrored_drill / "killed"
    assert "input pipeline 0 of 1 reads stream(s) 0-1 of 2" in (mirrored_drill / "reference.out").read_text()
    summary = read_json(reference / "summary.json")
    assert summary["strategy"] == "mirrored" and summary["num_replicas"] == 2 and summary["global_step"] == 36
    order = _metadata(reference).data_order
    assert order["streams"] == 2 and order["layout"] == "tfrecord-blocks-1"

    code, out = _exited(mirrored_drill / "resumed.out")  # the killed command again: resumes mid-epoch
    assert code == 0, out[-4000:]
    resumed = read_json(killed / "summary.json")
    assert resumed["start_step"] in (12, 15) and resumed["global_step"] == 36  # the last save that completed
    assert_bit_identical(checkpoint_tensors(str(reference / "checkpoints")), checkpoint_tensors(str(killed / "checkpoints")))
    assert _metadata(killed).history == _metadata(reference).history  # val_loss included

    # 2 replicas -> 1: the recorded 2 streams are kept, so every step reads the examples it would have.
    code, out = _exited(mirrored_drill / "one_device.out")
    assert code == 0, out[-4000:]
    one = read_json(mirrored_drill / "one_device" / "summary.json")
    assert one["strategy"] == "one_device" and one["start_step"] == 36 and one["global_step"] == 48
    assert _metadata(mirrored_drill / "one_device").data_order == order
    assert "reads stream(s) 0-1 of 2" in out


@pytest.mark.timeout(900)
def test_an_unquoted_glob_the_shell_expanded_is_the_same_data_as_the_glob(mirrored_drill):
    # `--data DIR/train-*.tfrecord` without quotes reaches tfdist as several paths, in the shell's order:
    # the drill resumed its killed run (started with the quoted glob) with them.
    code, out = _exited(mirrored_drill / "resumed.out")
    assert code == 0, out[-4000:]  # not refused as another run's data: same files, same order
    summary = read_json(mirrored_drill / "killed" / "summary.json")
    assert summary["start_step"] in (12, 15) and summary["global_step"] == 36
    fingerprint = (mirrored_drill / "fingerprint").read_text()
    assert _metadata(mirrored_drill / "killed").run_value("data_fingerprint") == fingerprint


def test_malformed_npz_is_a_one_line_error_with_exit_code_2(procs, tmp_path):
    np.savez(tmp_path / "short.npz", x=np.zeros((10, 4), np.float32), y=np.zeros(7, np.int64))
    code, out = procs.tfdist("train", "--data", str(tmp_path / "short.npz"), "--output-dir", str(tmp_path / "run"),
                             timeout=120, env=base_env())
    assert code == 2, out[-3000:]
    errors = [line for line in out.splitlines() if line.startswith("tfdist: error:")]
    assert len(errors) == 1 and "Traceback" not in out
    assert "received x with 10 rows and y with 7" in errors[0] and "Fix:" in errors[0]


def test_every_malformed_data_input_is_named_with_the_fix(tmp_path, digits, capsys):
    from tfdist.cli import main

    np.savez(tmp_path / "objects.npz", x=np.zeros((4, 2)), y=np.array([1, -2, 0, 1]))
    (tmp_path / "notzip.npz").write_text("not an archive")
    np.savez(tmp_path / "half.npz", x=np.zeros((4, 2)), y=np.zeros(4), x_val=np.zeros((2, 2)))
    np.savez(tmp_path / "shape.npz", x=np.zeros((4, 2)), y=np.zeros(4), x_val=np.zeros((2, 3)), y_val=np.zeros(2))
    bad_spec = tmp_path / "spec.json"
    bad_spec.write_text(json.dumps({"x": {"key": "image", "dtype": "uint8"}, "y": {"key": "label", "dtype": "int64"}}))
    no_classes = tmp_path / "noclasses.json"
    spec = json.loads(open(digits["features"]).read())
    spec.pop("num_classes")
    no_classes.write_text(json.dumps(spec))
    cases = [
        (["--data", str(tmp_path / "objects.npz")], "labels must be class numbers"),
        (["--data", str(tmp_path / "notzip.npz")], "cannot read the .npz file"),
        (["--data", str(tmp_path / "half.npz")], "x_val without its pair"),
        (["--data", str(tmp_path / "shape.npz")], "differ in example shape"),
        (["--data", str(tmp_path / "missing.npz")], "cannot read the .npz file"),
        (["--data", "imagenet"], "unknown data; received data='imagenet'"),
        (["--data", digits["train"]], "needs a feature spec"),
        (["--data", digits["train"], "--features", str(bad_spec)], "field 'x.dtype': received 'uint8'"),
        (["--data", digits["train"], "--features", str(tmp_path / "nope.json")], "cannot read the feature spec"),
        (["--data", digits["train"], "--features", str(no_classes)], "number of classes"),
        (["--data", f"{tmp_path}/none-*.tfrecord", "--features", digits["features"]], "no file matches"),
        (["--data", "digits", "--features", digits["features"]], "--features applies to TFRecord files only"),
        (["--data", "tfds:"], "no data set name"),
        (["--data", "digits", digits["train"].replace("*", "00000")], "--data takes one data set or TFRecord files"),
        (["--data", *sorted(glob.glob(digits["train"]))], "needs a feature spec; received 4 files"),
    ]
    for args, text in cases:
        code = main(["train", *args, "--output-dir", str(tmp_path / "run"), "--epochs", "1"])
        err = capsys.readouterr().err
        errors = [line for line in err.splitlines() if line.startswith("tfdist: error:")]
        assert code == 2 and len(errors) == 1, (args, err[-2000:])
        assert text in errors[0] and "Fix:" in errors[0], (args, errors[0])


_VALIDATION = """
import sys, numpy as np
sys.path.insert(0, {tests!r})
from tfdist import data
from test_data_files import write_digits
paths = write_digits({directory!r})
train, _ = data.load(paths["train"], features=paths["features"])
val = data.load(paths["validation"], features=paths["features"])[0]
# Making file sources (globbing, indexing) must not start TensorFlow's runtime: split_cpu fails if it did.
from tfdist.strategy import split_cpu
devices = split_cpu(2)
import tensorflow as tf, tf_keras
rng = np.random.RandomState(0)
arrays = data.ArraySource(rng.rand(65, 8, 8, 1).astype(np.float32), rng.randint(0, 10, 65))
def build():
    m = tf_keras.Sequential([tf_keras.layers.Flatten(input_shape=(8, 8, 1)), tf_keras.layers.Dense(10)])
    m.compile(loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return m
tf_keras.utils.set_random_seed(1)
strategies = {{"one": tf.distribute.OneDeviceStrategy("/cpu:0"), "two": tf.distribute.MirroredStrategy(devices)}}
models = {{}}
for name, strategy in strategies.items():
    with strategy.scope():
        models[name] = build()
models["two"].set_weights(models["one"].get_weights())
for label, source in (("files", val), ("arrays", arrays)):
    results = {{}}
    for name, strategy in strategies.items():
        replicas = strategy.num_replicas_in_sync
        sizes = data.BatchSizes.resolve(num_replicas=replicas, batch_size=32)
        ds, steps = data.validation_input(source, sizes, strategy=strategy)
        results[name] = models[name].evaluate(ds, steps=steps, return_dict=True, verbose=0)
    x, y = source.sample(source.num_examples)
    logits = models["one"].predict(x, verbose=0)
    exact = float(np.mean(tf_keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)))
    print("RESULT", label, source.num_examples, results["one"]["loss"], results["two"]["loss"], exact,
          results["one"]["accuracy"], results["two"]["accuracy"], float(np.mean(np.argmax(logits, 1) == y)))
"""


@pytest.mark.timeout(300)
def test_validation_is_split_between_replicas_and_its_metrics_are_those_of_the_whole_set(procs, tmp_path):
    script = _VALIDATION.format(tests=f"{REPO}/tests", directory=str(tmp_path / "digits"))
    code, out = procs.run([sys.executable, "-c", script], timeout=240, env=base_env())
    assert code == 0, out[-4000:]
    rows = [line.split()[1:] for line in out.splitlines() if line.startswith("RESULT")]
    assert [r[0] for r in rows] == ["files", "arrays"]
    for label, n, *values in rows:
        # 65 examples over 2 replicas in batches of 16: one replica gets an empty last batch.
        one_loss, two_loss, exact, one_acc, two_acc, exact_acc = map(float, values)
        assert one_loss == pytest.approx(exact, rel=1e-5) and two_loss == pytest.approx(exact, rel=1e-5), label
        assert one_acc == two_acc == pytest.approx(exact_acc, abs=1e-6), label
