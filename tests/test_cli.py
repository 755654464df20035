"""The command line's common behaviour: a quiet TensorFlow start, exit codes by kind of error."""

from __future__ import annotations

import os

import textwrap

import numpy as np
import pytest

from tfdist import env, errors
from tfdist.cli import _quiet

from conftest import base_env

_START_UP = ("absl::InitializeLog", "cudart_stub", "cuda_platform", "oneDNN custom operations", "cpu_feature_guard")


@pytest.mark.timeout(240)
def test_tensorflow_start_up_lines_are_hidden_unless_asked_for(procs):
    environ = base_env()
    del environ[env.TF_CPP_MIN_LOG_LEVEL]  # as a user has it: unset
    code, quiet = procs.tfdist("env", env=environ, timeout=120)
    assert code == 0, quiet[-2000:]
    assert "strategy:" in quiet and "tensorflow" in quiet
    assert not [line for line in quiet.splitlines() if any(k in line for k in _START_UP)], quiet[-2000:]
    code, loud = procs.tfdist("--verbose", "env", env=environ, timeout=120)
    assert code == 0 and "strategy:" in loud
    # This machine (no GPU) prints CUDA probing lines at least; --verbose lets them through.
    assert any(k in loud for k in _START_UP), loud[-2000:]
    # Inside an srun step the cluster is read with TensorFlow's host-list helpers: still quiet.
    slurm = dict(environ, SLURM_JOB_ID="1", SLURM_PROCID="0", SLURM_STEP_NUM_TASKS="2",
                 SLURM_STEP_NODELIST="node[1-2]", SLURM_STEP_TASKS_PER_NODE="1(x2)")
    code, quiet = procs.tfdist("env", env=slurm, timeout=120)
    assert code == 0 and "(from Slurm)" in quiet, quiet[-2000:]
    assert not [line for line in quiet.splitlines() if any(k in line for k in _START_UP)], quiet[-2000:]


@pytest.mark.parametrize(
    "line, noise",
    [
        ("WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n", True),
        ("I0000 00:00:1795419972.085526   14325 cudart_stub.cc:31] Could not find cuda drivers on your machine.", True),
        ("E0000 00:00:1795419976.094123   14325 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error", True),
        ("E0000 00:00:1795419976.094123   14325 collective_ops.cc:12] Collective ops is aborted by: peer lost", False),
        ("Traceback (most recent call last):", False),
        ("tfdist: strategy one_device: no GPU on this machine; using the CPU", False),
    ],
)
def test_only_known_start_up_lines_are_dropped(line, noise):
    assert _quiet.is_noise(line) is noise


def test_exit_codes_tell_bad_input_from_failures():
    assert errors.ModelError("x").exit_code == errors.DataError("x").exit_code == env.EXIT_USAGE
    assert errors.StorageError("x").exit_code == env.EXIT_USAGE
    assert errors.CheckpointIOError("x").exit_code == env.EXIT_FAILED  # a restart may succeed
    assert errors.PeerUnavailableError("x").exit_code == env.EXIT_PEER_LOST
    assert errors.describe(IndexError()) == "IndexError"  # an exception without a message
    assert errors.describe(ValueError("first\nsecond")) == "ValueError: first"
    # A graph's error lists the frames where its node was defined first: the line after them names the problem.
    graph = ValueError("Graph execution error:\n\nDetected at node Parse defined at (most recent call last):\n"
                       "  File \"train.py\", line 3, in parse\n\nFeature: y (data type: int64) is required.\n"
                       "\t [[{{node Parse}}]] [Op:__inference_parse_11]")
    assert errors.describe(graph) == "ValueError: Feature: y (data type: int64) is required."


@pytest.mark.parametrize("argv, named", [
    (["--bogus"], "unrecognized arguments: --bogus."),
    (["--bogus", "-x=1"], "unrecognized arguments: --bogus -x=1."),
    (["--bogus", "train"], "unrecognized arguments: --bogus."),
    ([], "the following arguments are required: COMMAND."),
])
def test_a_usage_error_names_the_mistyped_option_with_or_without_a_command(argv, named, capsys):
    from tfdist.cli import main

    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert capsys.readouterr().err == f"tfdist: error: {named} Fix: see `tfdist --help`.\n"


@pytest.mark.parametrize("seed", ["-1", "4294967296"])
def test_a_seed_numpy_cannot_take_is_refused_in_one_line(seed, capsys):
    # Was a 31-line NumPy traceback ("Seed must be between 0 and 2**32 - 1").
    from tfdist.cli import main

    with pytest.raises(SystemExit) as info:
        main(["train", "--seed", seed])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1
    assert f"argument --seed: expected a whole number from 0 to 4294967295; received '{seed}'" in err


@pytest.mark.parametrize("flag, path, reason", [
    ("--output-dir", "afile", "(it is a file)"),
    ("--output-dir", "afile/run", "('afile' is a file)"),
    ("--checkpoint-dir", "afile", "(it is a file)"),
])
def test_an_output_or_checkpoint_directory_that_is_a_file_is_named_with_the_flag(flag, path, reason, tmp_path,
                                                                                 monkeypatch, capsys):
    # Was blamed on --save-model (a flag not passed), or named `checkpoint_dir`, "not writable (File exists)".
    from tfdist.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    assert main(["train", "--epochs", "1", flag, path]) == 2
    err = capsys.readouterr().err
    assert f"the {flag} is not writable; received {flag}={path!r} {reason}" in err and "save-model" not in err


@pytest.mark.parametrize("flag", ["--checkpoint-dir", "--output-dir"])
def test_a_checkpoint_given_as_a_directory_is_refused_before_anything_creates_it(flag, tmp_path, monkeypatch, capsys):
    # The writability check made the folder runs/ckpt-40/, after which nothing saw a checkpoint
    # there: a fresh run from step 0 started inside the run's checkpoint directory.
    from tfdist.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "ckpt-40.index").write_bytes(b"")
    assert main(["train", "--epochs", "1", flag, "runs/ckpt-40"]) == 2
    err = capsys.readouterr().err
    assert f"{flag} names a checkpoint, not a directory; received {flag}='runs/ckpt-40'" in err
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["ckpt-40.index"]


@pytest.mark.parametrize("seed", [-1, 2**32, 1.5, True])
def test_fit_refuses_a_seed_numpy_cannot_take(seed):
    import tfdist
    from tfdist.errors import DataError

    with pytest.raises(DataError, match=r"Invalid `seed`; received seed=.*Fix: use an integer from 0 to 2\*\*32 - 1"):
        tfdist.fit(lambda: None, "digits", seed=seed)


def test_train_class_weight_and_validation_freq_flags_are_parsed_refused_in_one_line_and_used(tmp_path, capsys):
    import json

    from tfdist.cli import main
    from tfdist.cli.train import _class_weight

    assert _class_weight("0=1,3=5.5") == {0: 1.0, 3: 5.5}
    for bad in ("0:1", "a=1", "0=-1", "-1=2", "0=nan", "0=inf", "0=1,", "0=1,0=2"):
        with pytest.raises(SystemExit) as info:
            main(["train", f"--class-weight={bad}"])
        assert info.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert "expected CLASS=WEIGHT pairs" in err and repr(bad) in err, err
    with pytest.raises(SystemExit) as info:
        main(["train", "--validation-freq", "0"])
    assert info.value.code == 2 and "--validation-freq" in capsys.readouterr().err
    # Every class weighs 0: nothing to learn from, so the loss is 0; validation every 2nd epoch: none in 1.
    zero = ",".join(f"{c}=0" for c in range(10))
    summary = tmp_path / "summary.json"
    assert main(["train", "--class-weight", zero, "--epochs", "1", "--steps-per-epoch", "2", "--verbose", "0",
                 "--validation-freq", "2", "--output-dir", str(tmp_path / "run"), "--summary-json", str(summary)]) == 0
    record = json.loads(summary.read_text())
    assert record["final_loss"] == 0.0 and record["val_accuracy"] is None


def test_train_summary_says_when_a_complete_run_went_past_the_epochs_asked_for():
    from types import SimpleNamespace

    from tfdist.cli.train import _step

    assert _step(SimpleNamespace(global_step=44, epochs=2, steps_per_epoch=44)) == "step 44/88"
    assert _step(SimpleNamespace(global_step=264, epochs=2, steps_per_epoch=44)) == (
        "step 264 (a complete run, past the 88 steps of --epochs 2)")


def test_predict_class_names_refuse_a_missing_folder_and_a_class_named_twice(tmp_path):
    from tfdist.cli.predict import _resolve_class_names

    assert _resolve_class_names("cat, dog") == ("cat", "dog")
    with pytest.raises(errors.DataError, match=r"--class-names names no folder; received --class-names='.*nope'"):
        _resolve_class_names(str(tmp_path / "nope"))
    with pytest.raises(errors.DataError, match="names a class twice; received --class-names='a,b,a'"):
        _resolve_class_names("a,b,a")


def test_train_refuses_before_training_what_it_could_not_write_or_would_write_among_checkpoints(tmp_path, capsys):
    from tfdist.cli import main

    (tmp_path / "afile").write_text("")
    run = tmp_path / "run"
    cases = [
        (["--save-model", str(tmp_path / "afile" / "m.keras")], "--save-model cannot be written: its folder"),
        (["--summary-json", str(tmp_path)], "--summary-json names a directory, not a file"),
        (["--summary-json", str(run / "checkpoints" / "checkpoint")], "would be written among the run's checkpoints"),
        (["--learning-rate", "nan"], "expected a positive, finite number, received 'nan'"),
        (["--summary-json", "ram://run/summary.json"], "--summary-json is in this process's memory (ram://), which "
                                                       "is gone when the command exits"),
        (["--checkpoint-dir", "ram://run/checkpoints"], "--checkpoint-dir is in this process's memory (ram://)"),
    ]
    np.savez(tmp_path / "features.npz", x=np.zeros((40, 5), np.float32), y=np.zeros(40, np.int64))
    cases.append((["--data", str(tmp_path / "features.npz")], "the cnn model takes images (height x width"))
    for extra, expected in [*cases, (["--output-dir", "ram://run"], "--output-dir is in this process's memory")]:
        try:
            code = main(["train", "--epochs", "1", "--output-dir", str(run), *extra])
        except SystemExit as e:  # argparse
            code = e.code
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and expected in err[-1] and "Traceback" not in "\n".join(err), (extra, err[-3:])
    assert not (run / "checkpoints").exists()  # nothing trained
    assert main(["train", "--epochs", "1", "--steps-per-epoch", "2", "--verbose", "0", "--output-dir", str(run)]) == 0
    capsys.readouterr()
    assert main(["train", "--epochs", "1", "--output-dir", str(run / "checkpoints")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--output-dir is a checkpoint directory" in err and repr(str(run)) in err, err


@pytest.mark.timeout(240)
def test_train_writes_the_trained_model_as_a_keras_file_that_loads_and_scores_as_the_run(tmp_path, capsys):
    import json

    import keras

    from tfdist.cli import main
    from tfdist.data import load_digits

    out, summary = tmp_path / "run", tmp_path / "summary.json"
    args = ["train", "--epochs", "1", "--steps-per-epoch", "3", "--verbose", "0", "--output-dir", str(out),
            "--summary-json", str(summary)]
    assert main(args) == 0
    model = keras.models.load_model(out / "model.keras")
    validation = load_digits()[1]
    scores = model.evaluate(validation.x, validation.y, verbose=0, return_dict=True)
    assert scores["accuracy"] == pytest.approx(json.loads(summary.read_text())["val_accuracy"], abs=1e-6)
    first = model.get_weights()
    # Run again, the complete run writes the same model again (e.g. after its file was lost).
    (out / "model.keras").unlink()
    assert main(args) == 0
    again = keras.models.load_model(out / "model.keras").get_weights()
    assert len(again) == len(first) and all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not [p.name for p in out.iterdir() if ".tmp-" in p.name]

    elsewhere = tmp_path / "models" / "digits.keras"
    assert main([*args[:-4], "--output-dir", str(tmp_path / "b"), "--save-model", str(elsewhere)]) == 0
    assert elsewhere.is_file() and not (tmp_path / "b" / "model.keras").exists()
    assert main([*args[:-4], "--output-dir", str(tmp_path / "c"), "--no-save-model"]) == 0
    assert not (tmp_path / "c" / "model.keras").exists()
    capsys.readouterr()
    assert main([*args[:-4], "--output-dir", str(tmp_path / "d"), "--save-model", str(tmp_path / "model.h5")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "ends in .keras" in err and "model.h5" in err and "Fix:" in err, err
    assert not (tmp_path / "d").exists()  # refused before anything was trained or written


@pytest.mark.timeout(240)
def test_train_reads_a_folder_of_images_resized_and_rescaled_for_the_built_in_model(tmp_path, capsys):
    import json

    import keras

    from test_data_images import write_images
    from tfdist.cli import main
    from tfdist.cli._args import image_size as _image_size
    from tfdist.data import ImageFolderSource

    assert _image_size("96x128") == (96, 128) and _image_size("64") == (64, 64)
    for bad in ("0", "axb", "1x2x3", "", "100000x100000"):
        with pytest.raises(SystemExit) as info:
            main(["train", f"--image-size={bad}"])
        assert info.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert "expected HEIGHTxWIDTH" in err and repr(bad) in err, err
    assert main(["train", "--image-size", "16", "--output-dir", str(tmp_path / "digits")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "an image size applies to a folder of images only; received data='digits'" in err and "Fix:" in err, err

    folder = write_images(str(tmp_path / "images"))
    out, summary = tmp_path / "run", tmp_path / "summary.json"
    assert main(["train", "--data", folder, "--image-size", "16x12", "--epochs", "2", "--batch-size", "8",
                 "--verbose", "0", "--output-dir", str(out), "--summary-json", str(summary)]) == 0
    record = json.loads(summary.read_text())
    assert record["global_step"] == 2 * (28 // 8)  # 36 images, 8 of them (a fixed fifth) held out for validation
    assert record["val_accuracy"] is not None
    model = keras.models.load_model(out / "model.keras")
    assert model.input_shape == (None, 16, 12, 3) and model.output_shape == (None, 3)
    images, _ = ImageFolderSource(folder, image_size=(16, 12)).sample(4)  # 0-255: the model rescales them
    assert np.isfinite(model.predict(images, verbose=0)).all()
    # tfdist evaluate reads every image of a folder at the model's input size (16x12).
    scores = tmp_path / "scores.json"
    assert main(["evaluate", str(out / "model.keras"), "--data", folder, "--verbose", "0", "--json", str(scores)]) == 0
    assert json.loads(scores.read_text())["examples"] == 36
    # tfdist predict reads every image under a folder, class subfolders or not, and names each by its path.
    flat = tmp_path / "new_images"
    flat.mkdir()
    for i, name in enumerate(sorted(ImageFolderSource(folder, labels=None).files)[:5]):
        (flat / f"{i}_{os.path.basename(name)}").write_bytes((tmp_path / "images" / name).read_bytes())
    capsys.readouterr()
    assert main(["evaluate", str(out / "model.keras"), "--data", str(flat), "--verbose", "0"]) == 2  # no labels
    assert "the image folder has no class subfolders" in capsys.readouterr().err
    assert main(["predict", str(out / "model.keras"), "--data", str(flat), "--output", str(tmp_path / "new.npz"),
                 "--verbose", "0"]) == 0
    images = ImageFolderSource(str(flat), labels=None, image_size=(16, 12))
    with np.load(tmp_path / "new.npz") as written:
        assert list(written["paths"]) == [f"{flat}/{f}" for f in images.files] and len(images.files) == 5
        np.testing.assert_allclose(written["outputs"], model.predict(images.sample(5), verbose=0), rtol=1e-5,
                                   atol=1e-6)
    assert main(["predict", str(out / "model.keras"), "--data", str(flat), "--output", str(tmp_path / "new.csv"),
                 "--class-names", folder, "--verbose", "0"]) == 0
    header = (tmp_path / "new.csv").read_text().splitlines()[0]
    assert header == "path,class,output_cat,output_dog,output_eel"  # the training folder's classes, in its order


def test_evaluate_reads_the_trained_model_file_and_scores_the_held_out_split_as_the_run(tmp_path, capsys):
    import json

    from tfdist.cli import main

    out, summary, scores = tmp_path / "run", tmp_path / "summary.json", tmp_path / "scores.json"
    assert main(["train", "--epochs", "1", "--steps-per-epoch", "3", "--verbose", "0", "--output-dir", str(out),
                 "--summary-json", str(summary)]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(out / "model.keras"), "--verbose", "0", "--json", str(scores)]) == 0
    printed = capsys.readouterr().out
    result = json.loads(scores.read_text())
    assert result["examples"] == 359 and result["accuracy"] == json.loads(summary.read_text())["val_accuracy"]
    assert f"tfdist evaluate: loss {result['loss']:.4f}; accuracy {result['accuracy']:.4f} (359 examples" in printed
    # Arrays in an .npz file: every example of x and y (there is no x_val).
    from tfdist.data import load_digits

    validation = load_digits()[1]
    np.savez(tmp_path / "test.npz", x=validation.x[:50], y=validation.y[:50])
    assert main(["evaluate", str(out / "model.keras"), "--data", str(tmp_path / "test.npz"), "--verbose", "0",
                 "--batch-size", "7", "--json", str(scores)]) == 0
    assert json.loads(scores.read_text())["examples"] == 50

    for argv, expected in (
        ([str(tmp_path / "model.h5")], "tfdist reads Keras model files, whose name ends in .keras; received MODEL="),
        ([str(tmp_path / "missing.keras")], "no such model file; received MODEL="),
        ([str(out / "checkpoints" / "ckpt-3")], "A checkpoint holds no model architecture: while a run trains, an "
                                                "evaluator task scores each of its checkpoints"),
        ([str(out)], "A checkpoint holds no model architecture"),
        ([str(summary.with_suffix(".keras"))], "is not a Keras model file"),
        ([str(out / "model.keras"), "--features", "spec.json"], "--features applies to TFRecord files only"),
    ):
        if "is not a Keras" in expected:
            summary.with_suffix(".keras").write_text("{}")
        capsys.readouterr()
        assert main(["evaluate", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert expected in err and "Fix:" in err, err


def test_a_model_file_saved_without_compile_predicts_and_evaluate_says_how_to_compile_it(tmp_path, capsys):
    import keras

    from tfdist.cli import main

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.save(tmp_path / "bare.keras")
    x = np.random.default_rng(0).random((9, 4)).astype(np.float32)
    np.savez(tmp_path / "xy.npz", x=x, y=np.zeros(9, np.int64))
    common = [str(tmp_path / "bare.keras"), "--data", str(tmp_path / "xy.npz"), "--verbose", "0"]
    assert main(["predict", *common, "--output", str(tmp_path / "out.npy")]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), model.predict(x, verbose=0), rtol=1e-5, atol=1e-6)
    capsys.readouterr()
    assert main(["evaluate", *common]) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert "Traceback" not in err and "is not compiled" in last and "save the model compiled" in last
    assert last.startswith("tfdist: error: ") and "builder" not in last


def test_a_model_file_with_custom_classes_is_loaded_after_import_module_and_refused_in_one_line_without(
        tmp_path, monkeypatch, procs):
    import importlib

    import keras

    (tmp_path / "tfdist_test_layers.py").write_text(textwrap.dedent("""
        import keras

        @keras.saving.register_keras_serializable(package="tfdist_test")
        class Doubled(keras.layers.Layer):
            def call(self, x):
                return x * 2.0
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    layers = importlib.import_module("tfdist_test_layers")
    model = keras.Sequential([keras.Input((4,)), layers.Doubled(), keras.layers.Dense(3)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.save(tmp_path / "custom.keras")
    np.savez(tmp_path / "xy.npz", x=np.ones((6, 4), np.float32), y=np.zeros(6, np.int64))
    common = ["evaluate", "custom.keras", "--data", "xy.npz", "--verbose", "0"]
    code, out = procs.tfdist(*common, cwd=tmp_path, timeout=120)  # a fresh process: the class is not registered
    assert code == 2 and "Traceback" not in out, out[-3000:]
    assert ("uses 'Doubled', a class or function that is not loaded. Fix: import the module that defines "
            "and registers it") in out and "--import MODULE" in out, out[-3000:]
    code, out = procs.tfdist(*common, "--import", "tfdist_test_layers", cwd=tmp_path, timeout=120)
    assert code == 0 and "tfdist evaluate: loss" in out, out[-3000:]
    code, out = procs.tfdist(*common, "--import", "no_such_module", cwd=tmp_path, timeout=120)
    assert code == 2 and "--import cannot import 'no_such_module'" in out and "Traceback" not in out, out[-3000:]


def test_predict_writes_a_model_with_two_outputs_as_one_array_each_in_an_npz(tmp_path, capsys):
    import keras

    from tfdist.cli import main

    inputs = keras.Input((4,))
    model = keras.Model(inputs, {"score": keras.layers.Dense(1, name="score")(inputs),
                                 "kind": keras.layers.Dense(3, name="kind")(inputs)})
    model.compile("sgd", {"score": "mse", "kind": keras.losses.SparseCategoricalCrossentropy(from_logits=True)})
    model.save(tmp_path / "two.keras")
    x = np.random.default_rng(0).random((23, 4)).astype(np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    expected = model.predict(x, verbose=0)
    common = ["predict", str(tmp_path / "two.keras"), "--data", str(tmp_path / "x.npz"), "--verbose", "0"]
    assert main([*common, "--output", str(tmp_path / "out.npz"), "--batch-size", "5"]) == 0
    with np.load(tmp_path / "out.npz") as written:
        assert sorted(written.files) == ["kind", "score"]
        for name in ("kind", "score"):
            np.testing.assert_allclose(written[name], expected[name], rtol=1e-5, atol=1e-6)
    for suffix in ("npy", "csv"):
        capsys.readouterr()
        assert main([*common, "--output", str(tmp_path / f"out.{suffix}")]) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert f"a .{suffix} file holds one output; received --output" in err and "2 outputs. Fix: name an .npz" in err
        assert not (tmp_path / f"out.{suffix}").exists()


@pytest.mark.timeout(240)
def test_predict_writes_the_outputs_of_every_example_in_order_as_csv_npy_or_npz(tmp_path, capsys, procs):
    import csv

    import keras

    from tfdist.cli import main
    from tfdist.data import load_digits

    out = tmp_path / "run"
    assert main(["train", "--epochs", "1", "--steps-per-epoch", "3", "--verbose", "0", "--output-dir", str(out)]) == 0
    model_file = str(out / "model.keras")
    expected = keras.models.load_model(model_file).predict(load_digits()[1].x, verbose=0)  # the held-out digits
    # .npy: the outputs, in order, whatever the batch (7 leaves a part batch).
    assert main(["predict", model_file, "--output", str(tmp_path / "p.npy"), "--batch-size", "7", "--verbose", "0"]) == 0
    assert "tfdist predict: wrote" in capsys.readouterr().out
    np.testing.assert_allclose(np.load(tmp_path / "p.npy"), expected, rtol=1e-5, atol=1e-6)
    # Two replicas (mirrored, on two logical CPUs): each predicts its part; the file holds them in order.
    code, printed = procs.tfdist("predict", model_file, "--output", str(tmp_path / "m.npy"), "--per-replica-batch-size", "5",
                                 "--strategy", "mirrored", "--cpu-devices", "2", timeout=180, env=base_env())
    assert code == 0 and "strategy mirrored, 2 replica(s)" in printed, printed[-3000:]
    np.testing.assert_allclose(np.load(tmp_path / "m.npy"), expected, rtol=1e-5, atol=1e-6)
    # .npz of inputs without labels (only x); its outputs under "outputs".
    np.savez(tmp_path / "inputs.npz", x=load_digits()[1].x[:40])
    assert main(["predict", model_file, "--data", str(tmp_path / "inputs.npz"), "--output", str(tmp_path / "p.npz"),
                 "--verbose", "0"]) == 0
    with np.load(tmp_path / "p.npz") as written:
        assert written.files == ["outputs"]
        np.testing.assert_allclose(written["outputs"], expected[:40], rtol=1e-5, atol=1e-6)
    # .csv: index, the most likely class by name, each class's probability (--softmax: the model outputs logits).
    names = "zero,one,two,three,four,five,six,seven,eight,nine"
    assert main(["predict", model_file, "--output", str(tmp_path / "p.csv"), "--softmax", "--class-names", names,
                 "--verbose", "0"]) == 0
    with open(tmp_path / "p.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["index", "class", *(f"output_{name}" for name in names.split(","))]
    probabilities = np.array([[float(v) for v in row[2:]] for row in rows[1:]])
    assert [int(row[0]) for row in rows[1:]] == list(range(359))
    assert [row[1] for row in rows[1:]] == [names.split(",")[i] for i in expected.argmax(axis=1)]
    np.testing.assert_allclose(probabilities, keras.ops.softmax(expected).numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)

    for argv, expected_error in (
        (["--output", str(tmp_path / "p.txt")], "argument --output: expected a file name ending in .csv, .npy, .npz; "
                                                "received"),
        (["--output", str(tmp_path / "p.csv"), "--class-names", "a,b"],
         "--class-names names one class per output of a classifier; received 2 names (a, b) for outputs of shape "
         "(None, 10). Fix: name 10 classes"),
        (["--output", str(tmp_path / "p.csv"), "--data", str(tmp_path / "p.npz")],
         "the .npz file must hold the inputs as an array named x; received"),
    ):
        capsys.readouterr()
        try:
            code = main(["predict", model_file, *argv])
        except SystemExit as e:  # argparse: a usage error
            code = e.code
        assert code == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert expected_error in err, err
