"""parameter_server in real local processes: a chief, 2 workers and 1 ps, and a preempted restart."""

import sys

import numpy as np
import pytest

from conftest import base_env, launched_job, read_json
from multiprocess.test_multi_worker import part_lines

TRAIN = ["train", "--model", "cnn", "--epochs", "2", "--steps-per-epoch", "10", "--batch-size", "32", "--seed", "0",
         "--save-every-steps", "5", "--verbose", "0"]
PS_CLUSTER = ["--workers", "2", "--ps", "1", "--chief"]  # tfdist launch's flags for a script's cluster


@pytest.mark.timeout(600)
@pytest.mark.parametrize("keras", ["3", "2"])
def test_chief_two_workers_one_ps_train_and_resume_after_preemption(procs, tmp_path, keras):
    # The chief is preempted (SIGTERM) at step 12: it saves, exits 75, the cluster restarts and
    # resumes there. (One launch: each starts 4 TensorFlow processes, on CI's 2 cores.)
    code, out = procs.tfdist(
        "launch", "--workers", "2", "--ps", "1", "--chief", "--max-restarts", "2", "--grace", "10", "--",
        sys.executable, "-m", "tfdist", *TRAIN, "--keras", keras, "--output-dir", str(tmp_path / "run"),
        "--summary-json", str(tmp_path / "run" / "summary.json"),
        timeout=400, env=base_env(TFDIST_FAULT="chief:0/term_at_step:12"),
    )
    assert code == 0, out[-4000:]
    assert "exiting with code 75" in out
    summary = read_json(tmp_path / "run" / "summary.json")
    assert summary["start_step"] == 12 and summary["global_step"] == 20 and summary["completed"]
    assert summary["strategy"] == "parameter_server" and summary["num_workers"] == 2
    assert summary["all_reduce"] is None  # no all-reduce: variables live on the ps tasks
    assert "stopping worker:0, worker:1, ps:0" in out
    # The chief wrote the trained model, read from the ps tasks, as a file of the model's Keras.
    keras_module = __import__("keras" if keras == "3" else "tf_keras")
    model = keras_module.models.load_model(tmp_path / "run" / "model.keras")
    assert model.count_params() > 0 and np.isfinite(model.predict(np.zeros((2, 8, 8, 1)), verbose=0)).all()


@pytest.mark.timeout(400)
def test_serving_tasks_stop_by_themselves_when_the_chief_has_finished_the_run(procs, tmp_path):
    # Without tfdist launch (compose, plain pods, Slurm) nothing stops a ps or worker task: it
    # would serve until killed. Each task looks at the run's checkpoints and the chief.
    import json
    import subprocess

    from conftest import free_port

    run_dir = tmp_path / "run"
    # The second time, on the finished run, the chief trains nothing; the tasks stop all the same.
    for attempt, says in ((1, "step 4/4"), (2, "already complete")):
        jobs = {"chief": [f"127.0.0.1:{free_port()}"], "worker": [f"127.0.0.1:{free_port()}"],
                "ps": [f"127.0.0.1:{free_port()}"]}
        tasks = {}
        for role in jobs:
            tf_config = json.dumps({"cluster": jobs, "task": {"type": role, "index": 0}})
            tasks[role] = procs.start([sys.executable, "-m", "tfdist", "train", "--model", "mlp", "--epochs", "1",
                                       "--steps-per-epoch", "4", "--batch-size", "32", "--output-dir", str(run_dir)],
                                      env=base_env(TF_CONFIG=tf_config, TFDIST_FAULT="", PYTHONUNBUFFERED="1"))
        out, _ = tasks["chief"].communicate(timeout=300)
        assert tasks["chief"].returncode == 0 and says in out, out[-3000:]
        for role in ("worker", "ps"):
            try:
                out, _ = tasks[role].communicate(timeout=60)
            except subprocess.TimeoutExpired:
                pytest.fail(f"{role}:0 still serving 60 s after the chief finished (start {attempt})")
            assert tasks[role].returncode == 0, out[-3000:]
            assert f"is complete and its chief stopped: {role}:0 stops serving" in out


# One launched job of a chief, two workers and a ps runs the fits of the tests below in turn, each
# with its own checkpoint directory, then tests/test_keras3.py's program on parameter servers. The ps
# and the workers serve every fit of the chief until it ends: one job starts 4 TensorFlow processes
# where four would start 16. argv: the job's directory, the image folder. Each part prints
# "PART <part>" on the chief before it starts.
PS_JOB_SCRIPT = """
import json, os, sys
import numpy as np
import tfdist
from test_data_images import _model

job, images = sys.argv[1], sys.argv[2]


def weighted(keras_version, out_dir):
    if keras_version == "2":
        import tf_keras as keras
    else:
        import keras

    rng = np.random.default_rng(0)
    x = {"a": rng.normal(size=(256, 6)).astype("float32"), "b": rng.normal(size=(256, 3)).astype("float32")}
    y = (x["a"][:, 0] > 0).astype("int32")
    weight = (y == 0).astype("float32")  # 0 for class 1; class_weight gives class 0 the weight 0

    def build():
        a, b = keras.Input((6,), name="a"), keras.Input((3,), name="b")
        h = keras.layers.Concatenate()([a, b])
        h = keras.layers.Dense(8, activation="relu", kernel_initializer=keras.initializers.Constant(0.1))(h)
        out = keras.layers.Dense(2, kernel_initializer=keras.initializers.Constant(0.1))(h)
        model = keras.Model({"a": a, "b": b}, out)
        model.compile(optimizer=keras.optimizers.SGD(0.1),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    history = tfdist.fit(build, (x, y, weight), class_weight={0: 0.0}, batch_size=32, epochs=2, steps_per_epoch=4,
                         seed=0, verbose=0, checkpoint_dir=out_dir)
    if history is None:  # a worker or the ps: it served the chief's run
        return
    weights = history.model.get_weights()
    # The chief evaluates on its own (each example once, read from the ps tasks); a copy of the
    # model outside the cluster, with the same weights, evaluates the same examples.
    evaluated = tfdist.evaluate(history.model, {"a": x["a"][:101], "b": x["b"][:101]}, y[:101], batch_size=8)
    plain = build()
    plain.set_weights(weights)
    json.dump({"strategy": history.tfdist.strategy, "global_step": history.tfdist.global_step,
               "loss": history.history["loss"], "weights": [w.tolist() for w in weights], "evaluated": evaluated,
               "plain": plain.evaluate({"a": x["a"][:101], "b": x["b"][:101]}, y[:101], batch_size=101, verbose=0),
               "predicted": tfdist.predict(history.model, x, batch_size=8, verbose=0).tolist(),
               "plain_predicted": plain.predict(x, verbose=0).tolist()},
              open(out_dir + ".json", "w"))


def image_files(out_dir):
    source = tfdist.ImageFolderSource(images, image_size=(16, 16))
    history = tfdist.fit(_model, source, validation_split=0.25, batch_size=8, epochs=2, steps_per_epoch=3, seed=0,
                         verbose=0, checkpoint_dir=out_dir)
    if history is None:
        return
    json.dump({"strategy": history.tfdist.strategy, "global_step": history.tfdist.global_step,
               "loss": history.history["loss"], "val_loss": history.history["val_loss"]}, open(out_dir + ".json", "w"))


def keras3_loop(out_dir):
    import test_keras3

    result = test_keras3.program_parameter_server()
    if result is not None:
        json.dump(result, open(out_dir + ".json", "w"))


for part, run in (("weighted 3", lambda out_dir: weighted("3", out_dir)),
                  ("weighted 2", lambda out_dir: weighted("2", out_dir)), ("images", image_files),
                  ("keras3 loop", keras3_loop)):
    print(f"PART {part}", flush=True)
    run(os.path.join(job, part.replace(" ", "-")))
"""


def ps_job_run(reference_runs):
    """The job of PS_JOB_SCRIPT, made once for this file and tests/test_keras3.py: its directory and
    the launch's output."""
    from test_data_images import write_images

    return launched_job(reference_runs, PS_JOB_SCRIPT, cluster=PS_CLUSTER,
                        args=lambda job: [write_images(str(job / "images"))])


@pytest.fixture(scope="module")
def ps_job(reference_runs):
    return ps_job_run(reference_runs)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("keras", ["3", "2"])
def test_two_input_data_with_sample_and_class_weights_reaches_parameter_server_workers(ps_job, keras):
    # Every example weighs 0, class 0 by its class weight and class 1 by its sample weight: a dataset
    # function that dropped either would train (loss > 0, weights move).
    job, out = ps_job
    result = read_json(job / f"weighted-{keras}.json")
    assert result["strategy"] == "parameter_server" and result["global_step"] == 8
    assert result["loss"] == [0.0, 0.0]
    kernel1, bias1, kernel2, bias2 = (np.asarray(w, np.float32) for w in result["weights"])
    assert np.all(kernel1 == np.float32(0.1)) and np.all(kernel2 == np.float32(0.1))  # as initialized
    assert not bias1.any() and not bias2.any()
    assert result["evaluated"]["loss"] == pytest.approx(result["plain"], rel=1e-6) and result["plain"] > 0
    np.testing.assert_allclose(result["predicted"], result["plain_predicted"], atol=1e-6)  # all 256, in order
    # The chief's progress: 101 examples, 8 at a time.
    assert "[chief:0] 13/13 - " in part_lines(out, "chief:0", f"weighted {keras}")


@pytest.mark.timeout(600)
def test_image_files_are_read_and_decoded_by_parameter_server_workers(ps_job):
    """The workers' pipelines read the images by path and decode them with TensorFlow ops (no Python)."""
    job, _ = ps_job
    result = read_json(job / "images.json")
    assert result["strategy"] == "parameter_server" and result["global_step"] == 6
    assert len(result["val_loss"]) == 2 and np.isfinite(result["loss"] + result["val_loss"]).all()
