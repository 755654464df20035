"""Models written as keras.io writes them (tests/keras_patterns.py) train through ``tfdist.fit``
under every synchronous strategy, resume bit-identically after a SIGKILL, and equal plain
``model.fit`` on one device."""

from __future__ import annotations

import os
import random
import sys

import numpy as np
import pytest

from conftest import SIGKILL_DRILL_GRACE, assert_bit_identical, base_env, checkpoint_tensors, read_json

HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER = os.path.join(HERE, "keras_patterns.py")
STEPS = 12  # 96 examples, global batch 16, 2 epochs; a save every 2 steps


def _env(**extra):
    return base_env(PYTHONPATH=HERE + os.pathsep + base_env()["PYTHONPATH"], **extra)


# A part of the matrix; benchmarks/keras_patterns.py runs every pattern under every strategy.
CELLS = [("one_device", "gan"), ("one_device", "vae"), ("mirrored", "gan"), ("central_storage", "counter")]


@pytest.fixture(scope="module")
def sigkilled(reference_runs):
    """Every cell trained uninterrupted, and trained with one SIGKILL each, by repeating one
    command of the driver until it completes (each run resumes one cell and is killed in the
    next): the root of both runs and the step of the kills."""
    items = ",".join(f"{strategy}:{pattern}" for strategy, pattern in CELLS)

    def make(root):
        from conftest import Processes

        kill_at = random.randint(3, STEPS - 1)  # after the first save (step 2), before the end
        (root / "kill_at").write_text(str(kill_at))
        with Processes() as procs:
            def drive(directory, kill):
                return procs.run([sys.executable, DRIVER, "one_device", str(root / directory), items, str(kill)],
                                 timeout=300, env=_env())

            code, out = drive("reference", 0)
            assert code == 0, out[-3000:]
            for strategy, pattern in CELLS:
                code, out = drive("killed", kill_at)
                assert code == -9, f"expected the SIGKILL of {strategy}:{pattern} at step {kill_at}; exit {code}\n{out[-3000:]}"
            code, out = drive("killed", kill_at)
            assert code == 0, out[-3000:]

    root = reference_runs(["keras_patterns", items, "sigkilled"], make)
    return root, int((root / "kill_at").read_text())


@pytest.mark.parametrize("strategy, pattern", CELLS)
def test_a_keras_io_model_resumes_bit_identical_after_a_sigkill(sigkilled, strategy, pattern):
    root, kill_at = sigkilled
    name = f"{strategy}-{pattern}"
    # The step it resumed from: the last save complete before the kill (saves are asynchronous).
    assert 0 <= read_json(root / "killed" / f"{name}.json")["from"] < kill_at
    assert_bit_identical(checkpoint_tensors(str(root / "reference" / name)),
                         checkpoint_tensors(str(root / "killed" / name)))


_LAUNCHED_GAN = """
import os, sys
import keras, tensorflow as tf
import keras_patterns
from tfdist import env
tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})  # as the driver does
fault, root = os.environ.pop("TFDIST_FAULT"), sys.argv[1]
if env.restart() == 0:  # the cluster's first run trains the uninterrupted reference first
    keras.backend.clear_session()
    keras_patterns.fit("gan", "multi_worker_mirrored", os.path.join(root, "reference"))
os.environ["TFDIST_FAULT"] = fault
keras.backend.clear_session()
keras_patterns.fit("gan", "multi_worker_mirrored", os.path.join(root, "killed"))
"""


def test_a_gan_under_two_launched_workers_resumes_bit_identical_after_a_sigkill(procs, tmp_path):
    # One launched job: the workers train the reference, then the run worker 1 kills itself in;
    # the restarted cluster resumes that run.
    kill_at = random.randint(3, STEPS - 1)
    out = procs.launch_script(tmp_path / "gan.py", _LAUNCHED_GAN, tmp_path, cluster=["--workers", "2", *SIGKILL_DRILL_GRACE],
                              timeout=300, env=_env(TFDIST_FAULT=f"worker:1/kill_at_step:{kill_at}"))
    assert f"kill_at_step at step {kill_at}" in out and "1 cluster restart(s)" in out, out[-4000:]
    assert_bit_identical(checkpoint_tensors(str(tmp_path / "reference")), checkpoint_tensors(str(tmp_path / "killed")))


@pytest.mark.parametrize("pattern", ["gan", "vae", "autoencoder", "counter", "strings"])
def test_one_device_equals_plain_model_fit_bit_for_bit(pattern):
    import keras
    import keras_patterns

    import tfdist

    keras.utils.set_random_seed(4)
    reference = keras_patterns.BUILDERS[pattern]()
    initial = reference.get_weights()
    data = keras_patterns.data(pattern)
    x, y = (data, None) if not isinstance(data, tuple) else data
    if isinstance(x, dict):  # Keras' own fit refuses NumPy arrays of strings ("Invalid dtype: object"): tensors
        import tensorflow as tf

        x = {key: tf.constant(value.astype(str)) if value.dtype == object else value for key, value in x.items()}
    keras.utils.set_random_seed(7)
    reference.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)

    def build():
        keras.utils.set_random_seed(4)
        model = keras_patterns.BUILDERS[pattern]()
        model.set_weights(initial)
        return model

    keras.utils.set_random_seed(7)
    history = tfdist.fit(build, data, batch_size=16, epochs=2, shuffle=False, strategy="one_device", seed=7, verbose=0)
    trained, expected = history.model.get_weights(), reference.get_weights()
    assert len(trained) == len(expected)
    assert all(np.array_equal(a, b) for a, b in zip(trained, expected))


def test_data_without_labels_for_a_compiled_loss_under_keras_own_train_step_is_refused_in_one_line():
    import keras

    import tfdist
    from tfdist.errors import ModelError

    def plain():
        model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(64)])
        model.compile("adam", "mse")
        return model

    import keras_patterns

    with pytest.raises(ModelError, match=r"received data without labels.*Fix: pass \(x, y\)"):
        tfdist.fit(plain, keras_patterns.images(), batch_size=16, strategy="one_device", verbose=0)


def test_validating_a_model_with_nothing_to_compute_is_refused_in_one_line():
    import keras_patterns

    import tfdist
    from tfdist.errors import ModelError

    x = keras_patterns.images()
    with pytest.raises(ModelError, match="Keras' own test_step needs.*Fix: leave validation_data"):
        tfdist.fit(keras_patterns.vae, x, validation_data=x[:32], batch_size=16, strategy="one_device", verbose=0)


def _tf_keras_gan():
    import tensorflow as tf
    import tf_keras

    class GAN(tf_keras.Model):
        def __init__(self, discriminator, generator, **kwargs):
            super().__init__(**kwargs)
            self.discriminator, self.generator = discriminator, generator
            self.rng = tf.random.Generator.from_seed(1337)  # checkpointed with the model

        def compile(self, d_optimizer, g_optimizer, loss_fn):
            super().compile()
            self.d_optimizer, self.g_optimizer, self.loss_fn = d_optimizer, g_optimizer, loss_fn

        def train_step(self, real):
            n = tf.shape(real)[0]
            fake = self.generator(self.rng.normal((n, 4)))
            labels = tf.concat([tf.ones((n, 1)), tf.zeros((n, 1))], 0)
            with tf.GradientTape() as tape:
                d_loss = self.loss_fn(labels, self.discriminator(tf.concat([fake, real], 0)))
            self.d_optimizer.apply_gradients(zip(tape.gradient(d_loss, self.discriminator.trainable_weights),
                                                 self.discriminator.trainable_weights))
            with tf.GradientTape() as tape:
                g_loss = self.loss_fn(tf.zeros((n, 1)), self.discriminator(self.generator(self.rng.normal((n, 4)))))
            self.g_optimizer.apply_gradients(zip(tape.gradient(g_loss, self.generator.trainable_weights),
                                                 self.generator.trainable_weights))
            return {"d_loss": d_loss, "g_loss": g_loss}

    layers = tf_keras.layers
    discriminator = tf_keras.Sequential([layers.Flatten(input_shape=(8, 8, 1)), layers.Dense(16, activation="relu"),
                                         layers.Dense(1)])
    generator = tf_keras.Sequential([layers.Dense(64, activation="sigmoid", input_shape=(4,)), layers.Reshape((8, 8, 1))])
    model = GAN(discriminator, generator)
    # tf_keras refuses a loss object's default reduction inside any tf.distribute strategy, one device
    # included (its own fit too): the per-example losses are averaged here.
    loss = tf_keras.losses.BinaryCrossentropy(from_logits=True, reduction="none")
    model.compile(tf_keras.optimizers.Adam(1e-3), tf_keras.optimizers.Adam(1e-3),
                  lambda y, p: tf.reduce_mean(loss(y, p)))
    return model


def _crashed_and_resumed(tmp_path, build, data, *, keras_name: str = "keras", **options):
    """``fit(build, data())`` never interrupted, then crashed after step 7 (saves every 2 steps) and run
    again: returns the resumed run's History and the reference's checkpoint tensors, after checking
    that the resumed run's final checkpoint is bit-identical to them."""
    import tfdist
    from conftest import Crash, crash_after

    options = dict(epochs=2, seed=0, deterministic=True, strategy="one_device", verbose=0, save_every_steps=2,
                   **options)
    tfdist.fit(build, data(), checkpoint_dir=str(tmp_path / "reference"), **options)
    with pytest.raises(Crash):
        tfdist.fit(build, data(), checkpoint_dir=str(tmp_path / "crashed"), callbacks=[crash_after(7, keras_name)],
                   **options)
    resumed = tfdist.fit(build, data(), checkpoint_dir=str(tmp_path / "crashed"), **options)
    assert resumed.tfdist.start_step > 0
    reference = checkpoint_tensors(str(tmp_path / "reference"))
    assert_bit_identical(reference, checkpoint_tensors(str(tmp_path / "crashed")))
    return resumed, reference


def test_a_tf_keras_gan_on_images_without_labels_resumes_bit_identical(tmp_path):
    import keras_patterns

    _, names = _crashed_and_resumed(tmp_path, _tf_keras_gan, keras_patterns.images, keras_name="tf_keras",
                                    batch_size=16)
    assert any("d_optimizer" in name for name in names) and any("g_optimizer" in name for name in names)


def test_a_pydataset_of_inputs_alone_trains_a_vae_and_resumes_bit_identical(tmp_path):
    import keras
    import keras_patterns

    class Images(keras.utils.PyDataset):
        def __len__(self):
            return 6

        def __getitem__(self, index):
            return keras_patterns.images()[index * 16:(index + 1) * 16]  # no labels

    resumed, _ = _crashed_and_resumed(tmp_path, keras_patterns.vae, Images)
    assert resumed.tfdist.global_batch_size == 16


def test_tfrecord_files_parsed_to_inputs_alone_train_an_autoencoder_and_resume_bit_identical(tmp_path):
    import keras_patterns
    import tensorflow as tf

    import tfdist

    images = keras_patterns.images()
    path = str(tmp_path / "images.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for image in images:
            writer.write(tf.io.serialize_tensor(image).numpy())

    def parse(serialized):  # no label: the records hold the images only
        images = tf.map_fn(lambda s: tf.io.parse_tensor(s, tf.float32), serialized, fn_output_signature=tf.float32)
        return tf.ensure_shape(images, [None, 8, 8, 1])

    def source():
        return tfdist.TFRecordSource(path, parse)

    _crashed_and_resumed(tmp_path, keras_patterns.autoencoder, source, batch_size=16)


def test_a_gan_on_a_batched_pipeline_of_images_alone_resumes_bit_identical(tmp_path):
    import keras_patterns
    import tensorflow as tf

    def images():  # the user's own pipeline: shuffled, batched, prefetched; no labels
        # A shuffle's seeds are fixed when the dataset is made, from the global seed then: as in a
        # fresh process, each run makes its dataset under the same global seed.
        tf.random.set_seed(5)
        return (tf.data.Dataset.from_tensor_slices(keras_patterns.images()).shuffle(96, seed=1)
                .batch(16, drop_remainder=True).prefetch(2))

    _crashed_and_resumed(tmp_path, keras_patterns.gan, images)


def _tf_keras_drawing_and_counting():
    """A tf_keras autoencoder with Keras' own train_step whose layers draw from a generator and
    count their calls in a variable, whatever ``training`` is: any call before the first step shows."""
    import tensorflow as tf
    import tf_keras

    class Noise(tf_keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.rng = tf.random.Generator.from_seed(3)

        def call(self, x):
            return x + 0.1 * self.rng.normal(tf.shape(x))

    class Counting(tf_keras.layers.Layer):
        def build(self, shape):
            self.calls = self.add_weight(name="calls", shape=(), initializer="zeros", trainable=False, dtype="int64")

        def call(self, x):
            self.calls.assign_add(1)
            return x

    layers = tf_keras.layers
    inputs = tf_keras.Input((8, 8, 1))
    hidden = Counting()(Noise()(layers.Dropout(0.3)(layers.Dense(8)(layers.Flatten()(inputs)))))
    model = tf_keras.Model(inputs, layers.Reshape((8, 8, 1))(layers.Dense(64, activation="sigmoid")(hidden)))
    model.compile(tf_keras.optimizers.Adam(1e-3), "mse")
    return model


@pytest.mark.parametrize("build", [_tf_keras_gan, _tf_keras_drawing_and_counting])
def test_tf_keras_one_device_equals_its_own_fit_bit_for_bit(build):
    # tf_keras' random layers draw other numbers inside a strategy than outside any: the reference
    # is tf_keras' own fit in the scope of a OneDeviceStrategy on the device tfdist trains on.
    import keras_patterns
    import tf_keras

    import tfdist

    x = keras_patterns.images()
    data = x if build is _tf_keras_gan else (x, x)
    # tfdist.fit switches this on for every tf_keras model it builds: random layers keep their
    # state in tf.random.Generator variables. The reference is built the same way.
    tf_keras.backend.experimental.enable_tf_random_generator()
    with tfdist.make_strategy("one_device").tf.scope():
        tf_keras.utils.set_random_seed(4)
        reference = build()
    initial = reference.get_weights()
    tf_keras.utils.set_random_seed(7)
    reference.fit(*((data,) if build is _tf_keras_gan else data), batch_size=16, epochs=2, shuffle=False, verbose=0)

    def same_start():
        tf_keras.utils.set_random_seed(4)
        model = build()
        model.set_weights(initial)
        return model

    tf_keras.utils.set_random_seed(7)
    history = tfdist.fit(same_start, data, batch_size=16, epochs=2, shuffle=False, strategy="one_device", seed=7,
                         verbose=0)
    trained, expected = history.model.get_weights(), reference.get_weights()
    assert len(trained) == len(expected)
    assert all(np.array_equal(a, b) for a, b in zip(trained, expected))


def test_the_unused_default_optimizer_of_a_tf_keras_gan_stays_out_of_the_checkpoint(tmp_path):
    import keras_patterns

    import tfdist

    tfdist.fit(_tf_keras_gan, keras_patterns.images(), batch_size=16, epochs=1, strategy="one_device", verbose=0,
               checkpoint_dir=str(tmp_path))
    names = checkpoint_tensors(str(tmp_path))
    assert any(name.startswith("model/d_optimizer/_variables/") for name in names)
    slots = [name for name in names if name.startswith("optimizer/_variables/")]
    assert not slots, slots


def test_a_save_that_fails_on_the_state_says_so_and_not_check_free_space(tmp_path, monkeypatch):
    # A Keras 3 variable whose host copy is not prepared fails the background save's copy (the
    # first async save of a GAN whose optimizers were built at its first step did): not a storage failure.
    import re

    import keras_patterns

    import tfdist
    from tfdist._compat import keras3 as keras3_compat
    from tfdist.errors import CheckpointError, CheckpointIOError

    monkeypatch.setattr(keras3_compat, "copy_to_cpu_once", lambda variable: None)
    with pytest.raises(CheckpointError) as raised:
        keras_patterns.fit("counter", "one_device", str(tmp_path / "async"), epochs=1, steps_per_epoch=4)
    message = str(raised.value)
    assert not isinstance(raised.value, CheckpointIOError) and "\n" not in message
    assert re.search(r"failed before anything was written: the training state could not be copied .*"
                     r"ValueError: tf.function only supports singleton tf.Variables.*Fix: save synchronously", message)
    assert "free space" not in message and "in user code" not in message
    history = keras_patterns.fit("counter", "one_device", str(tmp_path / "sync"), epochs=1, steps_per_epoch=4,
                                 checkpoint_options=tfdist.CheckpointOptions(async_save=False))
    assert history.tfdist.global_step == 4


def test_an_image_folder_read_without_labels_trains_a_gan_and_resumes_bit_identical(tmp_path):
    import keras_patterns
    import tensorflow as tf

    import tfdist

    for i, image in enumerate((keras_patterns.images() * 255).astype(np.uint8)):
        folder = tmp_path / "images" / f"part{i % 3}"  # labels=None: every image at any depth, no classes
        folder.mkdir(parents=True, exist_ok=True)
        tf.io.write_file(str(folder / f"{i:03d}.png"), tf.io.encode_png(image))

    def source():
        return tfdist.ImageFolderSource(str(tmp_path / "images"), labels=None, image_size=(8, 8),
                                        color_mode="grayscale")

    _, names = _crashed_and_resumed(tmp_path, keras_patterns.gan, source, batch_size=16)
    assert any(name.startswith("model/d_optimizer/") for name in names)
    assert any(name.startswith("model/g_optimizer/") for name in names)
    assert not [name for name in names if name.startswith("optimizer/_variables/")]  # the unused default RMSprop


_SHARDED = """
import json, socket
import numpy as np
import keras
import tensorflow as tf
import tfdist

def port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

spec = tf.train.ClusterSpec({"chief": [f"localhost:{port()}"], "worker": [f"localhost:{port()}"],
                             "ps": [f"localhost:{port()}", f"localhost:{port()}"]})
for job, count in (("worker", 1), ("ps", 2)):
    for index in range(count):
        tf.distribute.Server(spec, job_name=job, task_index=index, protocol="grpc")
resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(spec, rpc_layer="grpc", task_type="chief", task_id=0)
strategy = tf.distribute.experimental.ParameterServerStrategy(  # as TensorFlow's parameter-server tutorial makes it
    resolver, variable_partitioner=tf.distribute.experimental.partitioners.FixedShardsPartitioner(2))

def build():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dense(3)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model

x, y = np.random.rand(64, 8).astype("float32"), np.random.randint(0, 3, 64)
try:
    tfdist.fit(build, (x, y), batch_size=16, steps_per_epoch=2, epochs=1, strategy=strategy, verbose=0)
    print("RESULT " + json.dumps({"error": None}))
except Exception as e:
    print("RESULT " + json.dumps({"error": type(e).__name__, "message": str(e)}))
"""


def test_a_keras_3_model_on_variables_a_partitioner_shards_is_refused_in_one_line(procs):
    import re

    from conftest import script_result

    result = script_result(procs, _SHARDED, timeout=120)
    assert result["error"] == "ModelError", result
    assert "\n" not in result["message"]
    assert re.search(r"cannot train on variables split by a variable_partitioner; received 4 sharded variable\(s\) "
                     r"\(sequential/dense/kernel, .*Fix: make the ParameterServerStrategy without variable_partitioner",
                     result["message"]), result["message"]


def test_tfdist_train_takes_a_users_subclassed_model_of_either_keras():
    # `tfdist train --model MODULE:FUNCTION`: a subclass lives in the user's module, its Keras in its base classes.
    import keras_patterns

    from tfdist import models

    for function, keras in ((keras_patterns.counter, "3"), (keras_patterns.gan, "3"), (_tf_keras_gan, "2")):
        build = models.user_builder(function, name=f"keras_patterns:{function.__name__}", input_shape=(8, 8, 1),
                                    num_classes=3, keras=keras)
        assert type(build()).__module__ in ("keras_patterns", "test_keras_patterns")


def test_tf_keras_models_tfdist_cannot_feed_are_refused_in_one_line_before_training():
    import keras_patterns
    import tf_keras

    import tfdist
    from tfdist.errors import ModelError

    def plain():
        model = tf_keras.Sequential([tf_keras.layers.Flatten(input_shape=(8, 8, 1)), tf_keras.layers.Dense(64)])
        model.compile("adam", "mse")
        return model

    x = keras_patterns.images()
    with pytest.raises(ModelError, match=r"received data without labels.*Fix: pass \(x, y\).*tf_keras 2\.\d+"):
        tfdist.fit(plain, x, batch_size=16, strategy="one_device", verbose=0)
    with pytest.raises(ModelError, match=r"has no call\(\) method, which Keras' own test_step needs.*Fix: leave "
                                         r"validation_data"):
        tfdist.fit(_tf_keras_gan, x, validation_data=x[:32], batch_size=16, strategy="one_device", verbose=0)
