"""A Keras PyDataset (Keras 3) or Sequence (tf_keras) as fit's data: whole batches in a seeded order, the
dataset's batch size as the global batch, exact resume mid-epoch under one device and mirrored, validation
of every example (the smaller last batch's too), and refusals that name the fix."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

import tfdist
from tfdist.data.pydataset import PyDatasetSource
from tfdist.errors import BatchSizeError, DataError

from conftest import Crash, crash_after, same_weights

_RNG = np.random.RandomState(5)
X = _RNG.rand(200, 6).astype(np.float32)
Y = (X.sum(1) * 1.7).astype(np.int64) % 3


def batches(keras_name: str = "keras", x=X, y=Y, batch: int = 16, **kwargs):
    """``keras_name``'s PyDataset (Keras 3) or Sequence (tf_keras) over ``x``, ``y``; it records every index read."""
    keras = __import__(keras_name)
    base = keras.utils.PyDataset if keras_name == "keras" else keras.utils.Sequence

    class Batches(base):
        def __init__(self):
            super().__init__(**kwargs)
            self.read = []

        def __len__(self):
            return -(-len(x) // batch)

        def __getitem__(self, index):
            self.read.append(index)
            part = slice(index * batch, (index + 1) * batch)
            return x[part], y[part]

    return Batches()


def _model(keras_name: str = "keras"):
    keras = __import__(keras_name)
    model = keras.Sequential([
        keras.Input((6,)), keras.layers.Dense(16, use_bias=False), keras.layers.BatchNormalization(),
        keras.layers.Activation("relu"), keras.layers.Dropout(0.2), keras.layers.Dense(3)])
    schedule = keras.optimizers.schedules.CosineDecay(0.02, 60)
    model.compile(keras.optimizers.Adam(schedule), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def _fit(data, keras_name="keras", **kwargs):
    options = dict(epochs=2, strategy="one_device", seed=1, deterministic=True, verbose=0)
    options.update(kwargs)
    return tfdist.fit(lambda: _model(keras_name), data, **options)


@pytest.mark.parametrize("keras_name", ["keras", "tf_keras"])
def test_in_order_a_python_dataset_trains_bit_identically_to_its_arrays(keras_name):
    dataset = batches(keras_name)
    from_batches = _fit(dataset, keras_name, shuffle=False)
    # 200 examples in batches of 16: 12 whole batches train, the last 8 examples are left out, as 192 arrays.
    from_arrays = _fit((X[:192], Y[:192]), keras_name, shuffle=False, batch_size=16)
    assert from_batches.tfdist.global_batch_size == 16 and from_batches.tfdist.global_step == 24
    assert same_weights(from_batches.model, from_arrays.model)
    assert from_batches.history["loss"] == from_arrays.history["loss"]


def test_each_epoch_visits_every_whole_batch_once_in_a_seeded_order_of_batches():
    source = PyDatasetSource(batches())  # 13 batches of 16, the last of 8
    assert (source.num_examples, source.training_examples, source.full_batches) == (200, 192, 12)
    positions = np.arange(192)

    def order(seed, epoch):
        return source.example_order(seed, epoch, True, positions).numpy()

    first = order(1, 0)
    as_batches = first.reshape(12, 16)
    assert (as_batches - as_batches[:, :1] == np.arange(16)).all()  # each step of 16 is one whole batch, rows in order
    assert sorted(as_batches[:, 0] // 16) == list(range(12))  # every whole batch once
    assert not (first == positions).all()
    assert not (order(1, 1) == first).all() and not (order(2, 0) == first).all()
    assert (order(1, 0) == first).all()
    assert (source.example_order(1, 0, False, positions).numpy() == positions).all()


def test_a_global_batch_that_joins_or_splits_the_datasets_batches_reads_each_batch_once_per_epoch():
    for global_batch, steps in ((32, 6), (8, 24)):
        dataset = batches()
        history = _fit(dataset, batch_size=global_batch, epochs=1)
        assert history.tfdist.global_step == steps
        trained = dataset.read[2:]  # after batch 0 and the last one, read to learn the batch size and length
        assert sorted(trained) == sorted(set(trained)) and set(trained) <= set(range(12)), (global_batch, dataset.read)
        assert len(trained) >= 11  # batch 0 may come from the cache


def test_a_crash_mid_epoch_resumes_at_the_next_batch_bit_identically(tmp_path):
    directory = "ram://" + str(tmp_path / "ckpt")  # storage that is not a local disk (stands in for gs://)
    reference = _fit(batches(), epochs=3)
    with pytest.raises(Crash):
        _fit(batches(), epochs=3, checkpoint_dir=directory, save_every_steps=4, callbacks=[crash_after(17)])
    resumed = _fit(batches(), epochs=3, checkpoint_dir=directory, save_every_steps=4)
    assert resumed.tfdist.global_step == 36 and resumed.tfdist.start_step == 16
    assert same_weights(resumed.model, reference.model)


def test_a_dataset_that_augments_at_random_still_resumes(tmp_path):
    """Its batches differ in every process: the data's identity is its shape, not its values."""
    import keras

    class Noisy(keras.utils.PyDataset):
        def __len__(self):
            return 12

        def __getitem__(self, index):
            part = slice(index * 16, (index + 1) * 16)
            return X[part] + np.random.normal(0, 0.01, X[part].shape).astype(np.float32), Y[part]

    directory = str(tmp_path / "ckpt")
    assert PyDatasetSource(Noisy()).fingerprint() == PyDatasetSource(Noisy()).fingerprint()
    with pytest.raises(Crash):
        _fit(Noisy(), checkpoint_dir=directory, save_every_steps=4, callbacks=[crash_after(6)])
    resumed = _fit(Noisy(), checkpoint_dir=directory, save_every_steps=4)
    assert resumed.tfdist.start_step == 4 and resumed.tfdist.global_step == 24
    # Another length or example shape is another data set: refused, as for arrays.
    with pytest.raises(tfdist.CheckpointMismatchError, match="data"):
        _fit(batches(x=X[:160], y=Y[:160]), checkpoint_dir=directory, epochs=3)


def test_validation_reads_every_example_the_smaller_last_batch_included():
    history = _fit(batches(), epochs=1, validation_data=batches(x=X[:50], y=Y[:50], batch=16))
    evaluated = history.model.evaluate(X[:50], Y[:50], verbose=0, return_dict=True)
    np.testing.assert_allclose(history.history["val_loss"][-1], evaluated["loss"], rtol=1e-5)
    np.testing.assert_allclose(history.history["val_accuracy"][-1], evaluated["accuracy"], rtol=1e-6)


def test_dicts_of_inputs_and_sample_weights_come_through():
    import keras

    class Weighted(keras.utils.PyDataset):
        def __len__(self):
            return 4

        def __getitem__(self, index):
            part = slice(index * 16, (index + 1) * 16)
            return {"a": X[part, :3], "b": X[part, 3:]}, Y[part], np.full(16, 2.0, np.float32)

    def build():
        a, b = keras.Input((3,), name="a"), keras.Input((3,), name="b")
        out = keras.layers.Dense(3)(keras.layers.Concatenate()([a, b]))
        model = keras.Model({"a": a, "b": b}, out)
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    history = tfdist.fit(build, Weighted(), epochs=1, seed=1, verbose=0, shuffle=False)
    assert history.tfdist.global_step == 4
    reference = build()
    reference.set_weights(tfdist.fit(build, Weighted(), epochs=1, seed=1, verbose=0, shuffle=False,
                                     steps_per_epoch=1).model.get_weights())
    # weight 2 doubles the loss of the batch it weighs
    first = Weighted()[1]
    plain = reference.evaluate(first[0], first[1], verbose=0)
    weighted = reference.evaluate(first[0], first[1], sample_weight=first[2], verbose=0)
    np.testing.assert_allclose(weighted, 2 * plain, rtol=1e-5)


def test_defects_are_named_with_the_fix():
    import keras

    class Endless(keras.utils.PyDataset):
        @property
        def num_batches(self):
            return None

        def __getitem__(self, index):
            return X[:16], Y[:16]

    with pytest.raises(DataError, match=r"no length .*Fix: define __len__"):
        tfdist.fit(_model, Endless(), epochs=1, verbose=0)

    class Images(keras.utils.PyDataset):
        def __len__(self):
            return 3

        def __getitem__(self, index):
            return [X[:16], Y[:16], Y[:16], Y[:16]]

    with pytest.raises(DataError, match=r"Images\[0\] must return x, \(x, y\) .*received list of length 4.*Fix"):
        PyDatasetSource(Images())

    class Inputs(Images):  # x alone, as Keras hands it to a train_step that needs no labels
        def __getitem__(self, index):
            return X[:16]

    assert PyDatasetSource(Inputs()).sample(2).shape == (2, *X.shape[1:])

    class Ragged(Images):
        def __getitem__(self, index):
            return np.array([[1.0], [1.0, 2.0]], dtype=object), Y[:2]

    with pytest.raises(DataError, match=r"Ragged\[0\] x must be a numeric or string array; .*Python objects.*Fix"):
        PyDatasetSource(Ragged())

    with pytest.raises(DataError, match="parameter-server workers cannot run"):
        PyDatasetSource(batches()).gather_fn(embed=True)


def test_an_error_raised_while_training_reads_is_raised_by_fit_as_the_datasets_own(tmp_path):
    """Not TensorFlow's InvalidArgumentError around it: the user's exception, traceback and all."""
    import keras

    class Missing(keras.utils.PyDataset):
        def __len__(self):
            return 12

        def __getitem__(self, index):
            if index == 7:
                raise FileNotFoundError(f"no such file: image-{index}.png")
            part = slice(index * 16, (index + 1) * 16)
            return X[part], Y[part]

    with pytest.raises(FileNotFoundError, match="image-7.png") as raised:
        _fit(Missing(), shuffle=False, checkpoint_dir=str(tmp_path / "ckpt"), save_every_steps=2)
    assert any("raised by Missing in tfdist's input pipeline" in note for note in raised.value.__notes__)
    assert any(frame.name == "__getitem__" for frame in __import__("traceback").extract_tb(raised.value.__traceback__))

    class Ragged(Missing):
        def __getitem__(self, index):
            size = 10 if index == 3 else 16
            return X[:size], Y[:size]

    with pytest.raises(DataError, match=r"Ragged\[3\] holds 10 examples, batch 0 holds 16.*Fix"):
        _fit(Ragged(), shuffle=False, validation_data=batches())
    with pytest.raises(DataError, match=r"Ragged\[3\] holds 10 examples"):  # in validation, too
        _fit(batches(), validation_data=Ragged())

    class Padded(Missing):  # each batch padded to its own longest sequence, as Keras' fit takes them
        def __getitem__(self, index):
            part = slice(index * 16, (index + 1) * 16)
            return np.pad(X[part], ((0, 0), (0, index % 2))), Y[part]

    with pytest.raises(DataError, match=r"Padded\[\d+\] x has examples of shape \(7,\), batch 0's have \(6,\): .*by "
                                        r"example position.*Fix: pad every batch to one length .*tfdist pads per batch"):
        _fit(Padded(), shuffle=False)


def test_a_dataset_batch_the_replicas_do_not_divide_is_refused_with_the_fix():
    with pytest.raises(BatchSizeError, match=r"hold 16 examples, which replicas x grad_accum_steps = 3 .*Fix: pass "
                                             r"batch_size= a multiple of 3"):
        _fit(batches(), grad_accum_steps=3)
    assert _fit(batches(), grad_accum_steps=2, epochs=1).tfdist.micro_batch_size == 8


_MIRRORED = textwrap.dedent(
    """
    import json
    import tfdist
    devices = tfdist.split_cpu(2)
    from conftest import crash_and_resume
    from test_data_pydataset import X, Y, _fit, batches

    result = crash_and_resume(_fit, batches, crash_at=17, save_every=5, strategy="mirrored", devices=devices, epochs=2,
                              validation_data=batches(x=X[:50], y=Y[:50], batch=16))
    print("RESULT " + json.dumps(result))
    """
)


def test_under_mirrored_a_crash_resumes_bit_identically_validation_included(two_cpu_scripts):
    result = two_cpu_scripts("pydataset")  # _MIRRORED
    assert result["replicas"] == 2 and result["from"] == 15 and result["same"], result
    # Each replica validates with its own BatchNormalization statistics (as Keras does), so the figure is
    # not model.evaluate's; it is the uninterrupted run's, to the bit.
    assert result["val_loss"][0] == result["val_loss"][1], result
