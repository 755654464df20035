"""Tests of ``tfdist ckpt list|inspect|verify`` on real checkpoints written by ``tfdist.fit``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tfdist.checkpoint import inspect as ckpt_tools
from tfdist.checkpoint.layout import METADATA_SUFFIX
from tfdist.cli import main

DATA = "ckpt-8.data-00000-of-00001"
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A finished one-epoch run of 8 steps saved every 2 steps: ckpt-4, ckpt-6, ckpt-8 are kept."""
    import tf_keras

    import tfdist

    def build():
        model = tf_keras.Sequential([
            tf_keras.layers.Input((8,)),
            tf_keras.layers.Dense(4, activation="relu"),
            tf_keras.layers.Dense(1),
        ])
        model.compile(optimizer="adam", loss="mse")
        return model

    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 8)).astype("float32")
    y = rng.normal(size=(256, 1)).astype("float32")
    directory = str(tmp_path_factory.mktemp("run") / "ckpts")
    tfdist.fit(build, (x, y), epochs=1, batch_size=32, checkpoint_dir=directory, save_every_steps=2,
               seed=0, verbose=0)
    return directory


@pytest.fixture
def copy(run_dir, tmp_path):
    """A private copy of the run's directory, to damage."""
    target = str(tmp_path / "ckpts")
    shutil.copytree(run_dir, target)
    return target


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = main(["ckpt", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def cli_json(capsys, *argv):
    code, out, _ = cli(capsys, *argv, "--json")
    return code, json.loads(out)


def flip_byte(path: str, position: int) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)
        f.seek(position)
        f.write(bytes([byte[0] ^ 0xFF]))


# --- list ---------------------------------------------------------------------------------
def test_list_json_gives_the_complete_checkpoints_oldest_first(run_dir, capsys):
    code, entries = cli_json(capsys, "list", run_dir)
    assert code == 0
    assert [e["global_step"] for e in entries] == [4, 6, 8]
    assert [(e["epoch"], e["step_in_epoch"]) for e in entries] == [(0, 4), (0, 6), (1, 0)]
    assert [e["complete"] for e in entries] == [False, False, True]
    assert all(e["listed"] and e["problem"] is None for e in entries)
    last = entries[-1]
    assert {"path", "global_step", "epoch", "step_in_epoch", "saved_at", "size_bytes", "complete"} <= set(last)
    assert last["path"] == os.path.join(os.path.abspath(run_dir), "ckpt-8")
    files = [os.path.join(run_dir, f) for f in os.listdir(run_dir) if f.startswith("ckpt-8.") and ".tfdist" not in f]
    assert last["size_bytes"] == sum(os.path.getsize(f) for f in files) > 0
    with open(os.path.join(run_dir, "ckpt-8" + METADATA_SUFFIX)) as f:
        assert last["saved_at"] == json.load(f)["saved_at"]


def test_list_table_marks_the_latest_and_sizes_for_humans(run_dir, capsys):
    code, out, _ = cli(capsys, "list", run_dir)
    assert code == 0
    assert "3 checkpoint(s)" in out and "ckpt-8  (latest)" in out
    assert " kB " in out and "incomplete" not in out


def test_list_reports_files_the_state_file_does_not_name_as_incomplete(copy, capsys):
    os.mkdir(os.path.join(copy, "ckpt-10_temp"))  # a save in flight
    with open(os.path.join(copy, "ckpt-10_temp", "part-00000-of-00001.data-00000-of-00001"), "wb") as f:
        f.write(b"x" * 10)
    for suffix in (".index", ".data-00000-of-00001"):  # an orphan the manager no longer lists
        shutil.copy(os.path.join(copy, "ckpt-4" + suffix), os.path.join(copy, "ckpt-2" + suffix))
    code, entries = cli_json(capsys, "list", copy)
    assert code == 0
    assert [e["global_step"] for e in entries if e["listed"]] == [4, 6, 8]
    incomplete = {os.path.basename(e["path"]): e for e in entries if not e["listed"]}
    assert set(incomplete) == {"ckpt-2", "ckpt-10"}
    assert "in flight" in incomplete["ckpt-10"]["problem"]
    assert "not named in the state file" in incomplete["ckpt-2"]["problem"]
    code, out, _ = cli(capsys, "list", copy)
    assert code == 0 and "incomplete" in out and "ckpt-10" in out and "ckpt-2 " in out


def test_checkpoints_keep_every_hours_kept_are_listed_as_kept_and_verified(copy, capsys):
    # TensorFlow's manager stops listing the checkpoints keep_every_hours keeps: they were shown
    # as "incomplete" and never verified. Here the state file is written as the manager leaves it.
    from tfdist.checkpoint import layout

    layout.write_state(copy, [os.path.join(copy, "ckpt-6"), os.path.join(copy, "ckpt-8")])
    code, out, _ = cli(capsys, "list", copy)
    assert code == 0 and "kept by keep_every_hours (complete; TensorFlow's manager no longer lists them): 1" in out
    assert "ckpt-4  step 4" in out and "incomplete" not in out
    _, entries = cli_json(capsys, "list", copy)
    assert [(e["global_step"], e["listed"], e["kept"], e["problem"]) for e in entries] == [
        (6, True, False, None), (8, True, False, None), (4, False, True, None)]
    code, out, _ = cli(capsys, "verify", copy, "--all")
    assert code == 0 and [line.split()[1].rsplit("/", 1)[-1] for line in out.splitlines()] == [
        "ckpt-4", "ckpt-6", "ckpt-8"]


def test_list_a_directory_of_one_checkpoint_without_state_file_or_metadata(run_dir, tmp_path, capsys):
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("ckpt-4.index", "ckpt-4.data-00000-of-00001"):
        shutil.copy(os.path.join(run_dir, name), bare / name)
    code, out, _ = cli(capsys, "list", str(bare))
    assert code == 0 and "incomplete (not named in the state file `checkpoint`): 1" in out and "ckpt-4" in out


def test_list_json_names_each_entrys_files_and_a_replaced_checkpoint_by_a_pattern_of_them(copy, capsys):
    import glob

    for name in os.listdir(copy):  # an earlier ckpt-6 moved aside before the same step was saved again
        if name.startswith("ckpt-6."):
            shutil.copy(os.path.join(copy, name), os.path.join(copy, name + ".replaced-20261125-000000"))
    code, entries = cli_json(capsys, "list", copy)
    assert code == 0
    for entry in entries:
        assert entry["files"] and all(os.path.isfile(f) for f in entry["files"])
    (replaced,) = [e for e in entries if not e["listed"]]
    assert "moved aside" in replaced["problem"]
    assert sorted(glob.glob(replaced["path"])) == sorted(replaced["files"])
    assert all(f.endswith(".replaced-20261125-000000") for f in replaced["files"])
    code, out, _ = cli(capsys, "list", copy)
    assert code == 0 and "ckpt-6.*.replaced-20261125-000000" in out


@pytest.mark.parametrize("name", ["ckpt-6", "ckpt-6.index", "ckpt-6.data-00000-of-00001"])
def test_list_given_a_checkpoint_says_to_list_its_directory_or_inspect_it(run_dir, capsys, name):
    code, out, err = cli(capsys, "list", os.path.join(run_dir, name))
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "takes a checkpoint directory" in err
    assert f"tfdist ckpt list {os.path.abspath(run_dir)}" in err
    assert f"tfdist ckpt inspect {os.path.join(os.path.abspath(run_dir), 'ckpt-6')}" in err


def test_list_names_the_run_that_writes_the_directory(copy, capsys):
    from tfdist.checkpoint import ownership

    code, out, _ = cli(capsys, "list", copy)
    assert code == 0 and f"writer: pid {os.getpid()} on " in out and ", ended " in out  # the fixture's run ended
    writer = ownership.claim(copy)  # a run that is writing now (or was killed)
    code, out, _ = cli(capsys, "list", copy)
    assert code == 0 and f"writer: {writer.describe()} (still running, or killed)" in out


def test_list_works_with_a_relative_directory(run_dir, capsys, monkeypatch):
    monkeypatch.chdir(os.path.dirname(run_dir))
    code, entries = cli_json(capsys, "list", os.path.basename(run_dir))
    assert code == 0 and [e["global_step"] for e in entries] == [4, 6, 8]
    assert all(e["problem"] is None for e in entries)


# --- inspect --------------------------------------------------------------------------------
def test_every_command_accepts_a_runs_output_directory(run_dir, tmp_path, capsys):
    # `tfdist train --output-dir OUT` keeps its checkpoints in OUT/checkpoints.
    output_dir = tmp_path / "out"
    shutil.copytree(run_dir, output_dir / "checkpoints")
    (output_dir / "tensorboard").mkdir()
    code, entries = cli_json(capsys, "list", str(output_dir))
    assert code == 0 and [e["global_step"] for e in entries] == [4, 6, 8]
    code, info = cli_json(capsys, "inspect", str(output_dir))
    assert code == 0 and info["path"] == str(output_dir / "checkpoints" / "ckpt-8")
    code, results = cli_json(capsys, "verify", str(output_dir))
    assert code == 0 and [r["ok"] for r in results] == [True]


def test_inspect_json_gives_metadata_and_variables_of_the_latest(run_dir, capsys):
    code, info = cli_json(capsys, "inspect", run_dir)
    assert code == 0
    assert info["path"].endswith("ckpt-8")
    metadata = info["metadata"]
    assert metadata["global_step"] == 8 and metadata["complete"] is True and metadata["seed"] == 0
    assert metadata["strategy"] and metadata["global_batch_size"] == 32
    variables = {v["name"]: v for v in info["variables"]}
    kernel = variables["model/layer_with_weights-0/kernel/.ATTRIBUTES/VARIABLE_VALUE"]
    assert (kernel["shape"], kernel["dtype"], kernel["parameters"], kernel["bytes"]) == ([8, 4], "float32", 32, 128)
    summary = info["summary"]
    assert summary["groups"]["model"]["parameters"] == 8 * 4 + 4 + 4 * 1 + 1
    assert summary["count"] == len(variables) - 1  # the serialized object graph is not a variable
    assert summary["parameters"] == sum(v["parameters"] for v in info["variables"])


def test_inspect_a_given_prefix_prints_readable_text(run_dir, capsys):
    code, out, _ = cli(capsys, "inspect", os.path.join(run_dir, "ckpt-4"))
    assert code == 0
    assert "ckpt-4.tfdist.json" in out and "global_step" in out
    assert "model/layer_with_weights-0/kernel  [8, 4]  float32" in out
    assert "parameters" in out


# --- verify ---------------------------------------------------------------------------------
def test_verify_all_good_checkpoints_exits_0(run_dir, capsys):
    code, results = cli_json(capsys, "verify", run_dir, "--all")
    assert code == 0
    assert [os.path.basename(r["path"]) for r in results] == ["ckpt-4", "ckpt-6", "ckpt-8"]
    assert all(r["ok"] and r["problem"] is None for r in results)
    code, out, _ = cli(capsys, "verify", run_dir)
    assert code == 0 and out.startswith("OK") and "ckpt-8" in out and "ckpt-6" not in out


def test_verify_json_notes_the_incomplete_files_as_not_verified(copy, capsys):
    os.mkdir(os.path.join(copy, "ckpt-10_temp"))  # a save in flight: noted, and not a failure
    code, results = cli_json(capsys, "verify", copy)
    assert code == 0
    assert [(os.path.basename(r["path"]), r["ok"], r["verified"]) for r in results] == [
        ("ckpt-8", True, True), ("ckpt-10", None, False)]
    assert "in flight" in results[-1]["problem"]


def test_inspect_counts_keras_3_weights_in_the_model_group_though_saved_under_the_optimizer(tmp_path, capsys):
    import keras

    import tfdist

    def build():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), keras.layers.BatchNormalization(),
                                  keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
        return model

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 8)).astype("float32"), rng.normal(size=(64, 1)).astype("float32")
    tfdist.fit(build, (x, y), epochs=1, batch_size=32, checkpoint_dir=str(tmp_path), seed=0, verbose=0)
    code, info = cli_json(capsys, "inspect", str(tmp_path))
    assert code == 0
    assert any(v["name"].startswith("optimizer/_trainable_variables/") for v in info["variables"])  # how it saves
    groups = info["summary"]["groups"]
    weights = 8 * 4 + 4 + 4 * 4 + 4 * 1 + 1  # Dense, BatchNormalization (gamma, beta, mean, variance), Dense
    assert groups["model"]["parameters"] == weights
    trainable = weights - 2 * 4  # Adam keeps two slots per trainable weight, plus its step and rate
    assert groups["optimizer"]["parameters"] == 2 * trainable + 2
    assert {v["group"] for v in info["variables"] if v["name"].startswith("optimizer/_trainable")} == {"model"}


@pytest.fixture(params=["index-parsed", "tensorflow-only"])
def parse_index(request, monkeypatch):
    """Runs a test with tfdist's own index reading, and without it (TensorFlow's reader alone)."""
    if request.param == "tensorflow-only":
        def unreadable(prefix):
            raise ValueError("disabled by the test")

        monkeypatch.setattr(ckpt_tools, "read_index", unreadable)
    return request.param


def test_verify_catches_a_truncated_data_file(copy, capsys, parse_index):
    path = os.path.join(copy, DATA)
    os.truncate(path, os.path.getsize(path) // 2)
    code, out, err = cli(capsys, "verify", copy)
    assert code == 1
    assert out.startswith("BAD") and len(out.strip().splitlines()) == 1 and "Traceback" not in out + err
    assert DATA in out
    if parse_index == "index-parsed":
        assert "truncated" in out


def test_verify_catches_a_flipped_byte_in_the_middle_of_the_data_file(copy, capsys, parse_index):
    path = os.path.join(copy, DATA)
    flip_byte(path, os.path.getsize(path) // 2)
    code, results = cli_json(capsys, "verify", copy)
    assert code == 1
    (result,) = results
    assert result["ok"] is False and "Checksum does not match" in result["problem"]


def test_verify_catches_a_flipped_byte_in_the_last_tensor(copy, capsys):
    path = os.path.join(copy, DATA)
    flip_byte(path, os.path.getsize(path) - 2)
    code, results = cli_json(capsys, "verify", copy)
    assert code == 1 and results[0]["ok"] is False


def test_verify_catches_a_missing_data_shard(copy, capsys, parse_index):
    os.remove(os.path.join(copy, DATA))
    code, out, _ = cli(capsys, "verify", copy)
    assert code == 1 and out.startswith("BAD")
    if parse_index == "index-parsed":  # the index says how many shards there are
        assert f"missing data shard {DATA}" in out
    else:
        assert "missing data files (ckpt-8.data-*)" in out


def test_verify_names_the_missing_shard_from_the_file_names_too(copy, capsys, monkeypatch):
    monkeypatch.setattr(ckpt_tools, "read_index", lambda prefix: 1 / 0)  # judge by the names alone
    os.rename(os.path.join(copy, DATA), os.path.join(copy, "ckpt-8.data-00001-of-00002"))
    code, out, _ = cli(capsys, "verify", copy)
    assert code == 1 and "missing data shard ckpt-8.data-00000-of-00002" in out


def test_verify_catches_a_missing_or_damaged_index(copy, capsys):
    flip_byte(os.path.join(copy, "ckpt-8.index"), 40)
    os.remove(os.path.join(copy, "ckpt-6.index"))
    code, results = cli_json(capsys, "verify", copy, "--all")
    assert code == 1
    by_name = {os.path.basename(r["path"]): r for r in results}
    assert by_name["ckpt-4"]["ok"]
    assert "missing index file ckpt-6.index" == by_name["ckpt-6"]["problem"]
    assert "ckpt-8.index" in by_name["ckpt-8"]["problem"]


def test_verify_checks_the_metadata_file_and_its_step(copy, capsys):
    os.remove(os.path.join(copy, "ckpt-4" + METADATA_SUFFIX))
    meta = os.path.join(copy, "ckpt-8" + METADATA_SUFFIX)
    with open(meta) as f:
        data = json.load(f)
    data["global_step"] = 9
    with open(meta, "w") as f:
        json.dump(data, f)
    code, results = cli_json(capsys, "verify", copy, "--all")
    assert code == 1
    assert [r["ok"] for r in results] == [False, True, False]
    assert "missing metadata file ckpt-4.tfdist.json" in results[0]["problem"]
    assert "global_step=9" in results[2]["problem"] and "8" in results[2]["problem"]


def test_list_shows_a_state_file_rolled_back_to_an_earlier_checkpoint(copy, capsys):
    state = os.path.join(copy, "checkpoint")
    with open(state) as f:
        text = f.read()
    with open(state, "w") as f:
        f.write(text.replace('model_checkpoint_path: "ckpt-8"', 'model_checkpoint_path: "ckpt-6"'))
    code, entries = cli_json(capsys, "list", copy)
    listed = [os.path.basename(e["path"]) for e in entries if e["listed"]]
    assert code == 0 and listed == ["ckpt-4", "ckpt-6"], entries
    later = [e for e in entries if os.path.basename(e["path"]) == "ckpt-8"]
    assert later and later[0]["problem"].startswith("after ckpt-6, which the state file names as its latest: a roll-back")


def test_checkpoints_of_a_plain_checkpoint_manager_are_listed_and_verified_without_problems(tmp_path, capsys):
    import tensorflow as tf

    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=tf.Variable([1.0, 2.0])), str(tmp_path), max_to_keep=3)
    for _ in range(2):
        manager.save()
    code, entries = cli_json(capsys, "list", str(tmp_path))
    assert code == 0 and [e["problem"] for e in entries] == [None, None], entries  # no metadata is not missing
    code, results = cli_json(capsys, "verify", str(tmp_path), "--all")
    assert code == 0 and all(r["ok"] for r in results)
    # In a directory tfdist writes, a checkpoint without its metadata is one with a problem.
    (tmp_path / "ckpt-9.tfdist.json").write_text("{}")
    code, entries = cli_json(capsys, "list", str(tmp_path))
    assert [e["problem"] for e in entries if e["listed"]] == ["missing metadata file ckpt-1.tfdist.json",
                                                               "missing metadata file ckpt-2.tfdist.json"]


def test_verify_checks_only_the_latest_unless_all(copy, capsys):
    flip_byte(os.path.join(copy, "ckpt-4.data-00000-of-00001"), 100)
    assert cli(capsys, "verify", copy)[0] == 0
    code, out, _ = cli(capsys, "verify", copy, "--all")
    assert code == 1
    assert [line.split()[0] for line in out.strip().splitlines()] == ["BAD", "OK", "OK"]


def test_verify_a_prefix(copy, capsys):
    flip_byte(os.path.join(copy, DATA), 100)
    assert cli(capsys, "verify", os.path.join(copy, "ckpt-6"))[0] == 0
    assert cli(capsys, "verify", os.path.join(copy, "ckpt-8"))[0] == 1


def test_read_index_agrees_with_tensorflow(run_dir):
    import tensorflow as tf

    prefix = os.path.join(run_dir, "ckpt-8")
    header, entries = ckpt_tools.read_index(prefix)
    assert header.num_shards == 1
    assert {k.decode() for k in entries} == set(tf.train.load_checkpoint(prefix).get_variable_to_shape_map())
    end = max(e.offset + e.size for e in entries.values())
    assert end == os.path.getsize(os.path.join(run_dir, DATA))


# --- bad arguments --------------------------------------------------------------------------
def test_missing_directory_is_one_line_exit_2_without_traceback(tmp_path, capsys):
    missing = str(tmp_path / "nowhere")
    # As a process (what a shell sees), then every command in this one.
    proc = subprocess.run([sys.executable, "-m", "tfdist", "ckpt", "verify", missing],
                          capture_output=True, text=True, env=ENV, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert len([line for line in proc.stderr.splitlines() if line.startswith("tfdist")]) == 1
    for command in ("list", "inspect", "verify"):
        code, out, err = cli(capsys, command, missing)
        assert code == 2 and out == "", err
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("tfdist") and missing in lines[0] and "Fix:" in lines[0]
    # ram:// is each process's own memory: a new command's is empty, and the error says so.
    proc = subprocess.run([sys.executable, "-m", "tfdist", "ckpt", "list", "ram://run/checkpoints"],
                          capture_output=True, text=True, env=ENV, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "does not exist in this process's memory (ram://)" in proc.stderr and "Fix: look into them from that " \
        "process" in proc.stderr, proc.stderr


@pytest.mark.parametrize("command", ["list", "inspect", "verify"])
def test_a_file_or_an_empty_directory_is_a_usage_error(tmp_path, capsys, command):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("not a checkpoint")
    code, out, err = cli(capsys, command, str(empty))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "no complete checkpoint" in err and str(empty) in err
    if command == "list":
        code, _, err = cli(capsys, command, str(empty / "notes.txt"))
        assert code == 2 and "not a directory" in err


def test_help_and_list_errors_do_not_import_tensorflow(tmp_path):
    code = (
        "import sys\n"
        "from tfdist.cli import main\n"
        f"assert main(['ckpt', 'list', {str(tmp_path / 'nowhere')!r}]) == 2\n"
        "try:\n    main(['ckpt', 'verify', '--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
        "assert 'tensorflow' not in sys.modules, 'tensorflow was imported'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=120)
    assert proc.returncode == 0, proc.stderr
