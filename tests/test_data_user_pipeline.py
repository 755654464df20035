"""A user's own tf.data pipeline through tfdist.fit: a batched dataset or a dataset_fn(input_context), trained as Keras'
fit trains it, resumed at the exact batch from its saved position, its limits said in one line."""

from __future__ import annotations

import glob
import logging
import os

import numpy as np
import pytest

import tfdist
from tfdist import data as tfdata
from tfdist.errors import BatchSizeError, DataError

from conftest import Crash, crash_after, same_weights, script_result

_RNG = np.random.RandomState(0)
X = _RNG.rand(100, 4).astype(np.float32)
Y = (X.sum(1) > 2).astype(np.int32)
W = _RNG.rand(100).astype(np.float32)


def _model(labels: bool = True, keras_name: str = "keras"):
    keras = __import__(keras_name)

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)])
    if not labels:  # (x,) batches: the loss is the model's own (add_loss)
        model.add(keras.layers.ActivityRegularization(l2=0.1))
    model.compile(keras.optimizers.SGD(0.1),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True) if labels else None,
                  metrics=["accuracy"] if labels else None)
    return model


def _batched(*parts, reshuffle=True, batch=16, drop_remainder=False):
    import tensorflow as tf

    tf.random.set_seed(7)  # the op seeds of shuffle depend on the global seed a previous fit left
    return (tf.data.Dataset.from_tensor_slices(parts).shuffle(100, seed=1, reshuffle_each_iteration=reshuffle)
            .batch(batch, drop_remainder=drop_remainder).prefetch(2))


def _keras_fit(data, epochs, labels=True):
    import keras

    keras.utils.set_random_seed(1)
    return _model(labels).fit(data, epochs=epochs, verbose=0).history


@pytest.mark.parametrize("parts, epochs, reshuffle", [
    ((X, Y), 2, False),          # (x, y), every epoch the same order
    ((X, Y, W), 1, True),        # (x, y, sample_weight), a short last batch
    ((X,), 1, True),             # (x,): no labels
])
def test_a_batched_pipeline_trains_as_keras_fit_trains_it(parts, epochs, reshuffle):
    labels = len(parts) > 1
    expected = _keras_fit(_batched(*parts, reshuffle=reshuffle), epochs, labels)
    history = tfdist.fit(lambda: _model(labels), _batched(*parts, reshuffle=reshuffle), epochs=epochs, seed=1,
                         verbose=0, strategy="one_device")
    assert history.history == expected
    assert history.tfdist.global_batch_size == 16 and history.tfdist.global_step == 7 * epochs


def test_a_repeated_pipeline_needs_steps_per_epoch_and_its_batch_is_the_global_batch():
    data = _batched(X, Y).repeat()
    with pytest.raises(DataError, match=r"never ends.*Fix: pass steps_per_epoch"):
        tfdist.fit(_model, data, epochs=1, seed=1, verbose=0, strategy="one_device")
    with pytest.raises(BatchSizeError, match=r"batches hold 16 examples a step; received batch_size=32\. Fix"):
        tfdist.fit(_model, data, epochs=1, steps_per_epoch=3, batch_size=32, seed=1, verbose=0, strategy="one_device")
    history = tfdist.fit(_model, data, epochs=2, steps_per_epoch=3, seed=1, verbose=0, strategy="one_device",
                         validation_data=_batched(X[:40], Y[:40]))
    assert history.tfdist.global_step == 6 and len(history.history["val_loss"]) == 2
    logs = tfdist.evaluate(history.model, _batched(X[:40], Y[:40]), verbose=0)
    assert logs["loss"] == pytest.approx(history.history["val_loss"][-1], rel=1e-5)


def test_what_is_batched_is_read_from_the_pipeline_graph():
    import tensorflow as tf

    from tfdist.data.user_pipeline import is_batched

    base = tf.data.Dataset.from_tensor_slices((X, Y))
    assert is_batched(base.batch(8)) and is_batched(base.batch(8, drop_remainder=True).map(lambda x, y: (x * 2, y)))
    assert is_batched(base.padded_batch(8).prefetch(1)) and is_batched(base.repeat().batch(4).take(3))
    assert not is_batched(base) and not is_batched(base.batch(8).unbatch()) and not is_batched(base.map(lambda x, y: (x, y)))
    # The unbatched form is the stream tfdist batches itself.
    assert isinstance(tfdata.as_source(base), tfdata.StreamSource)
    assert isinstance(tfdata.as_source(base.batch(8, drop_remainder=True)), tfdata.UserPipeline)


def test_refusals_name_the_input_and_the_fix():
    import tensorflow as tf

    with pytest.raises(DataError, match=r"takes the input context; received .*Fix: def dataset_fn\(input_context\)"):
        tfdata.as_source(lambda: _batched(X, Y))
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with pytest.raises(DataError, match=r"received a tf.distribute.DistributedDataset\. Fix: pass the dataset"):
        tfdata.as_source(strategy.experimental_distribute_dataset(_batched(X, Y)))
    with pytest.raises(DataError, match=r"cannot train under parameter_server; .*Fix: use multi_worker_mirrored"):
        tfdata.user_pipeline.check_strategy(tfdata.UserPipeline(_batched(X, Y)), coordinated=True)
    with pytest.raises(DataError, match=r"class_weight applies to data tfdist batches; .*Fix: map each batch"):
        tfdist.fit(_model, _batched(X, Y), class_weight={0: 1.0, 1: 2.0}, seed=1, verbose=0, strategy="one_device")


def write_records(directory, *, files: int = 4, per_file: int = 64, seed: int = 1) -> list[str]:
    """``files`` TFRecord files of ``per_file`` examples (``x``: 4 floats, ``y``: a class of 2); their paths."""
    import tensorflow as tf

    rng = np.random.RandomState(seed)
    paths = []
    for f in range(files):
        paths.append(os.path.join(str(directory), f"part-{f}.tfrecord"))
        with tf.io.TFRecordWriter(paths[-1]) as writer:
            for _ in range(per_file):
                x = rng.rand(4).astype(np.float32)
                features = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=x)),
                            "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(x.sum() > 2)]))}
                writer.write(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())
    return paths


def _tfrecord_pipeline(paths, counter):
    """Shuffled, mapped, batched, prefetched, as TensorFlow's tutorials write it; ``counter`` counts parsed records."""
    import tensorflow as tf

    def parse(record):
        counter.assign_add(1)
        example = tf.io.parse_single_example(record, {"x": tf.io.FixedLenFeature([4], tf.float32),
                                                      "y": tf.io.FixedLenFeature([], tf.int64)})
        return example["x"], example["y"]

    tf.random.set_seed(7)
    return tf.data.TFRecordDataset(paths).map(parse).shuffle(50, seed=2).batch(16).prefetch(2)


@pytest.mark.timeout(300)
def test_a_crashed_run_resumes_at_the_exact_batch_without_reading_the_steps_before_it(tmp_path):
    import tensorflow as tf

    paths, counter = write_records(tmp_path), tf.Variable(0, dtype=tf.int64)
    options = dict(epochs=3, seed=1, verbose=0, strategy="one_device", deterministic=True)
    reference = tfdist.fit(_model, _tfrecord_pipeline(paths, counter), **options)
    assert reference.tfdist.global_step == 48
    directory = str(tmp_path / "ckpt")
    with pytest.raises(Crash):
        tfdist.fit(_model, _tfrecord_pipeline(paths, counter), checkpoint_dir=directory, save_every_steps=5,
                   callbacks=[crash_after(43)], **options)
    counter.assign(0)
    resumed = tfdist.fit(_model, _tfrecord_pipeline(paths, counter), checkpoint_dir=directory, save_every_steps=5,
                         **options)
    assert resumed.tfdist.start_step == 40 and same_weights(resumed.model, reference.model)
    assert resumed.history == reference.history
    # 8 steps of 16 after the restore, plus the first batch read to build the model (a shuffle buffer of 50):
    # replaying the 40 steps before would have parsed 640 more.
    assert 8 * 16 <= int(counter.numpy()) <= 8 * 16 + 2 * (50 + 16 * 3)
    # Each saved position holds the shuffle buffer (50 records of 4 floats and a label), a few KB; old ones go.
    states = sorted(glob.glob(os.path.join(directory, "input", "slice-1w-0", "*.index")))
    assert 1 <= len(states) <= 4
    data_files = glob.glob(os.path.join(directory, "input", "slice-1w-0", "ckpt-48.data-*"))
    assert data_files and sum(os.path.getsize(p) for p in data_files) < 64 * 1024


def test_a_pipeline_whose_state_cannot_be_saved_trains_with_a_warning_and_resumes_by_skipping(tmp_path, caplog):
    import tensorflow as tf

    def generated():
        yield from zip(X, Y)

    def data():
        return tf.data.Dataset.from_generator(generated, output_signature=(
            tf.TensorSpec([4], tf.float32), tf.TensorSpec([], tf.int32))).batch(20)

    directory = str(tmp_path / "ckpt")
    with caplog.at_level(logging.WARNING, logger="tfdist"):
        with pytest.raises(Crash):
            tfdist.fit(_model, data(), epochs=2, steps_per_epoch=5, seed=1, verbose=0, strategy="one_device",
                       checkpoint_dir=directory, save_every_steps=2, callbacks=[crash_after(3)])
        resumed = tfdist.fit(_model, data(), epochs=2, steps_per_epoch=5, seed=1, verbose=0, strategy="one_device",
                             checkpoint_dir=directory, save_every_steps=2)
    assert resumed.tfdist.start_step == 2 and resumed.tfdist.global_step == 10
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("uses Dataset.from_generator, whose state TensorFlow cannot save" in w and "Fix:" in w for w in warnings)
    assert any("skips the 2 step(s) before step 2, reading them again" in w for w in warnings)
    assert not os.path.exists(os.path.join(directory, "input"))


_TWO_CPUS = """
import json
import numpy as np
import tensorflow as tf
import tfdist
devices = tfdist.split_cpu(2)
import keras
from test_data_user_pipeline import X, Y, _batched, _model

def dataset_fn(context):  # per-replica batches of 8: 12 per pass, 6 steps of 2 replicas
    return _batched(X[:96], Y[:96], reshuffle=False, batch=context.get_per_replica_batch_size(16))

strategy = tf.distribute.MirroredStrategy(devices)
out = {}
for form, data in (("batched", lambda: _batched(X, Y, reshuffle=False)), ("fn", lambda: dataset_fn)):
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = _model()
    given = data() if form == "batched" else strategy.distribute_datasets_from_function(dataset_fn)
    out[form] = {"keras": model.fit(given, epochs=2, verbose=0).history}
    for name in ("mirrored", "central_storage") if form == "batched" else ("mirrored",):
        history = tfdist.fit(_model, data(), epochs=2, seed=1, verbose=0, strategy=name,
                             devices=devices)
        out[form][name] = {"history": history.history, "replicas": history.tfdist.num_replicas,
                           "steps": history.tfdist.global_step}
print("RESULT " + json.dumps(out))
"""


@pytest.mark.timeout(300)
def test_under_mirrored_and_central_storage_both_forms_train_as_keras_fit_under_mirrored(procs):
    out = script_result(procs, _TWO_CPUS)
    for form, steps in (("batched", 14), ("fn", 12)):
        runs = out[form]
        assert runs["mirrored"]["replicas"] == 2 and runs["mirrored"]["steps"] == steps
        assert runs["mirrored"]["history"] == runs["keras"]  # Keras' own fit under MirroredStrategy, same pipeline
    # Central storage sums the same per-replica gradients in another order: equal up to rounding.
    for key, values in out["batched"]["central_storage"]["history"].items():
        np.testing.assert_allclose(values, out["batched"]["keras"][key], rtol=1e-5)


def test_a_tf_keras_model_trains_on_a_user_pipeline_and_resumes_by_replaying_it(tmp_path, caplog):
    import tf_keras

    def build():
        return _model(keras_name="tf_keras")

    tf_keras.utils.set_random_seed(1)
    expected = build().fit(_batched(X, Y), epochs=2, verbose=0).history
    options = dict(epochs=2, seed=1, verbose=0, strategy="one_device")
    reference = tfdist.fit(build, _batched(X, Y), **options)
    assert reference.history == expected  # tf_keras' own fit, the same pipeline
    directory = str(tmp_path / "ckpt")
    with pytest.raises(Crash):
        tfdist.fit(build, _batched(X, Y), checkpoint_dir=directory, save_every_steps=3,
                   callbacks=[crash_after(5, "tf_keras")], **options)
    with caplog.at_level(logging.WARNING, logger="tfdist"):
        resumed = tfdist.fit(build, _batched(X, Y), checkpoint_dir=directory, save_every_steps=3, **options)
    assert resumed.tfdist.start_step == 3 and same_weights(resumed.model, reference.model)
    assert any("tf_keras' fit reads a user pipeline ahead of its steps" in r.getMessage() and "Fix:" in r.getMessage()
               for r in caplog.records)


class _Workers:
    """A stand-in strategy of ``workers`` workers with one replica each, seen from worker ``worker``."""

    def __init__(self, workers: int, worker: int):
        self.num_replicas_in_sync, self._context = workers, (workers, worker)

    def distribute_datasets_from_function(self, dataset_fn):
        import tensorflow as tf

        workers, worker = self._context
        return dataset_fn(tf.distribute.InputContext(workers, worker, workers))


def test_a_new_worker_count_keeps_the_examples_of_every_global_step_where_each_worker_reads_all(tmp_path, caplog):
    # No files: every worker reads the whole pipeline and keeps its slice of every global batch (slice mode).
    directory = str(tmp_path)
    one = tfdata.UserPipeline(_batched(X, Y)).bind(_Workers(1, 0))
    whole = [next(one.iterator) for _ in range(6)]  # the global batches of steps 0-5 on one worker
    halves = []
    for worker in (0, 1):
        pipeline = tfdata.UserPipeline(_batched(X, Y)).bind(_Workers(2, worker))
        assert pipeline.mode == "slice"
        reader = tfdata.WorkerInput(pipeline, None, directory=directory, start_step=0)
        halves.append([pipeline.slice_of(next(reader.iterator)) for _ in range(4)])
        reader.save(4)
    for step in range(4):  # two workers together train on the global batch of one
        np.testing.assert_array_equal(np.concatenate([halves[0][step][0], halves[1][step][0]]), whole[step][0])
    with caplog.at_level(logging.INFO, logger="tfdist"):
        resumed = tfdata.WorkerInput(tfdata.UserPipeline(_batched(X, Y)).bind(_Workers(1, 0)), None,
                                     directory=directory, start_step=4)
    assert "slice-2w-0" in resumed.restored_from
    assert any("read by 2 worker(s) at step 4, now by 1" in r.getMessage() for r in caplog.records)
    for step in (4, 5):  # one worker now reads the global batches of steps 4 and 5, as it would have
        np.testing.assert_array_equal(next(resumed.iterator)[0], whole[step][0])


def test_a_dataset_fn_and_a_fixed_batch_train_under_one_device_as_keras_fit_trains_what_they_give():
    # drop_remainder=True gives batches a static first dimension: still the user's own batched pipeline.
    import tensorflow as tf

    def dataset_fn(context):
        return _batched(X, Y, reshuffle=False, batch=context.get_per_replica_batch_size(32), drop_remainder=True)

    expected = _keras_fit(dataset_fn(tf.distribute.InputContext()), 2)
    for data in (dataset_fn, dataset_fn(tf.distribute.InputContext())):
        history = tfdist.fit(_model, data, epochs=2, seed=1, verbose=0, strategy="one_device")
        assert history.history == expected
        assert history.tfdist.global_batch_size == 32 and history.tfdist.global_step == 6  # 100 // 32 a pass


def test_a_new_worker_count_where_no_saved_position_applies_warns_that_the_examples_differ(tmp_path, caplog):
    # Saved by 2 workers reading their own files (file mode) or shards (fn mode); resumed by one worker.
    import tensorflow as tf

    paths = write_records(tmp_path, files=2, per_file=16)

    def batched():
        return tf.data.TFRecordDataset(paths).batch(8)

    def dataset_fn(context):
        names = tf.data.Dataset.from_tensor_slices(paths).shard(context.num_input_pipelines, context.input_pipeline_id)
        return names.interleave(tf.data.TFRecordDataset).batch(context.get_per_replica_batch_size(8))

    for name, make in (("file", lambda: tfdata.UserPipeline(batched())),
                       ("fn", lambda: tfdata.UserPipeline(dataset_fn=dataset_fn))):
        directory = str(tmp_path / name)
        for worker in (0, 1):
            pipeline = make().bind(_Workers(2, worker))
            assert pipeline.mode == name
            reader = tfdata.WorkerInput(pipeline, None, directory=directory, start_step=0)
            next(reader.iterator)
            reader.save(1)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="tfdist"):
            resumed = tfdata.WorkerInput(make().bind(_Workers(1, 0)), None, directory=directory, start_step=1)
        assert resumed.restored_from is None
        (warning,) = [r.getMessage() for r in caplog.records if "was saved at step 1" in r.getMessage()]
        assert f"by 2 worker(s) in {name} mode" in warning and "\n" not in warning
        assert "the steps from here see other examples than the interrupted run would have" in warning, warning
