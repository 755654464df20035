"""ImageFolderSource: Keras' image_dataset_from_directory listing and pixels, exact resume mid-epoch with the
images and the checkpoints on storage that is not a local disk, a validation split fixed by the paths, every
strategy (mirrored here; parameter servers in test_parameter_server), and refusals that name the fix."""

from __future__ import annotations

import os
import shutil
import textwrap

import numpy as np
import pytest

import tfdist
from tfdist.data.images import ImageFolderSource
from tfdist.errors import DataError, ModelError

from conftest import Crash, crash_after, same_weights

CLASSES = ("cat", "dog", "eel")


def write_images(directory: str, per_class: int = 12, *, seed: int = 0) -> str:
    """``per_class`` images of each class under ``directory`` (any TensorFlow filesystem): PNG and JPEG of
    assorted sizes, some in a nested folder, plus files that are not images; each class's images are
    brighter in its own channel, so the classes can be learnt."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    for label, name in enumerate(CLASSES):
        for i in range(per_class):
            folder = f"{directory}/{name}" + ("/nested" if i % 4 == 0 else "")
            tf.io.gfile.makedirs(folder)
            h, w = rng.integers(10, 24, 2)
            pixels = rng.integers(0, 120, (h, w, 3)).astype(np.uint8)
            pixels[..., label] += 120
            if i % 2:
                tf.io.write_file(f"{folder}/{i:02d}.png", tf.io.encode_png(pixels))
            else:
                tf.io.write_file(f"{folder}/{i:02d}.JPG", tf.io.encode_jpeg(pixels))
        tf.io.write_file(f"{directory}/{name}/notes.txt", "not an image")
    tf.io.gfile.makedirs(f"{directory}/.cache")  # hidden: not a class (as in Keras)
    return directory


def _model():
    import keras

    model = keras.Sequential([
        keras.Input((16, 16, 3)), keras.layers.Rescaling(1 / 255), keras.layers.Conv2D(4, 3, use_bias=False),
        keras.layers.BatchNormalization(), keras.layers.Activation("relu"), keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dropout(0.1), keras.layers.Dense(3)])
    schedule = keras.optimizers.schedules.CosineDecay(0.05, 40)
    model.compile(keras.optimizers.Adam(schedule), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def _fit(data, **kwargs):
    options = dict(epochs=3, batch_size=8, strategy="one_device", seed=3, deterministic=True, verbose=0)
    options.update(kwargs)
    return tfdist.fit(_model, data, **options)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_images(str(tmp_path_factory.mktemp("images")))


@pytest.mark.parametrize("options", [dict(), dict(color_mode="grayscale", label_mode="categorical", interpolation="area"),
                                     dict(class_names=["eel", "cat"], label_mode="binary", interpolation="nearest"),
                                     dict(crop_to_aspect_ratio=True), dict(pad_to_aspect_ratio=True, color_mode="grayscale")])
def test_the_listing_pixels_and_labels_are_keras_image_dataset_from_directory(folder, options):
    import keras

    source = ImageFolderSource(folder, image_size=(12, 10), **options)
    expected = keras.utils.image_dataset_from_directory(folder, image_size=(12, 10), shuffle=False, batch_size=None,
                                                        verbose=False, **options)
    x_keras = np.stack([x.numpy() for x, _ in expected])
    y_keras = np.stack([y.numpy() for _, y in expected])
    x, y = source.sample(100)
    assert source.num_examples == len(x_keras) == (24 if "class_names" in options else 36)
    assert source.class_names == tuple(expected.class_names)
    assert x.dtype == np.float32 and x.shape == x_keras.shape  # Keras' "nearest" keeps uint8; the same values
    assert np.array_equal(x, x_keras) and np.array_equal(y, y_keras) and y.dtype == y_keras.dtype
    assert any("/nested/" in f for f in source.files) and not any(f.endswith(".txt") for f in source.files)


def test_labels_none_or_a_list_read_every_image_at_any_depth_as_keras_does(folder):
    import keras

    expected = keras.utils.image_dataset_from_directory(folder, labels=None, image_size=(12, 10), shuffle=False,
                                                        batch_size=None, verbose=False)
    x_keras = np.stack([x.numpy() for x in expected])
    unlabelled = ImageFolderSource(folder, labels=None, image_size=(12, 10))
    assert not unlabelled.labelled and unlabelled.num_examples == len(x_keras) == 36
    assert np.array_equal(unlabelled.sample(100), x_keras)  # the images alone, as Keras gives them
    given = [i % 2 for i in range(36)]  # one per image, in the order of the paths
    expected = keras.utils.image_dataset_from_directory(folder, labels=given, label_mode="binary", image_size=(12, 10),
                                                        shuffle=False, batch_size=None, verbose=False)
    source = ImageFolderSource(folder, labels=np.array(given), label_mode="binary", image_size=(12, 10))
    x, y = source.sample(100)
    assert np.array_equal(x, x_keras) and np.array_equal(y, np.stack([y.numpy() for _, y in expected]))
    assert source.labelled and source.num_classes == 2 and source.fingerprint() != unlabelled.fingerprint()
    # Images without labels train a model that needs none (an autoencoder's own train_step); a
    # classifier's compiled loss needs labels, and validating or evaluating on them is refused.
    with pytest.raises(ModelError, match=r"compiled with a loss.*received data without labels.*Fix: pass \(x, y\)"):
        _fit(ImageFolderSource(folder, labels=None, image_size=(16, 16)), epochs=1)
    with pytest.raises(DataError, match=r"validation needs labelled examples"):
        _fit(ImageFolderSource(folder, image_size=(16, 16)), epochs=1,
             validation_data=ImageFolderSource(folder, labels=None, image_size=(16, 16)))
    with pytest.raises(DataError, match=r"received 3 labels for 36 images under .*Fix: pass labels='inferred'"):
        ImageFolderSource(folder, labels=[0, 1, 2])
    with pytest.raises(DataError, match=r"received 36 labels for 36 images under .*, not all of them integers >= 0"):
        ImageFolderSource(folder, labels=[-1] * 36)
    with pytest.raises(DataError, match=r"Invalid `labels`; received labels='infered'. Fix: pass 'inferred'"):
        ImageFolderSource(folder, labels="infered")
    with pytest.raises(DataError, match=r"class_names=\['cat'\] with labels=None. Fix: leave class_names out"):
        ImageFolderSource(folder, labels=None, class_names=["cat"])


def test_a_crash_mid_epoch_resumes_bit_identically_with_images_and_checkpoints_off_the_local_disk(tmp_path):
    images = write_images("ram://" + str(tmp_path / "images"))  # stands in for gs://, as the checkpoints do
    directory = "ram://" + str(tmp_path / "ckpt")

    def source():
        return tfdist.ImageFolderSource(images, image_size=(16, 16))

    reference = _fit(source(), validation_split=0.25)
    assert reference.tfdist.global_step == 9  # 27 training images: 3 steps of 8 an epoch
    with pytest.raises(Crash):
        _fit(source(), validation_split=0.25, checkpoint_dir=directory, save_every_steps=2, callbacks=[crash_after(6)])
    resumed = _fit(source(), validation_split=0.25, checkpoint_dir=directory, save_every_steps=2)
    assert resumed.tfdist.start_step == 4 and resumed.tfdist.global_step == 9
    assert same_weights(resumed.model, reference.model)
    assert resumed.history["val_loss"] == reference.history["val_loss"]  # the interrupted epochs' too
    assert reference.history["accuracy"][-1] > reference.history["accuracy"][0]
    # Other images (another listing) are other data: refused, as for arrays.
    with pytest.raises(tfdist.CheckpointMismatchError, match="data"):
        _fit(tfdist.ImageFolderSource(images, image_size=(16, 16), class_names=["dog", "eel"]),
             checkpoint_dir=directory, epochs=4)


def test_the_validation_split_is_fixed_by_the_paths_and_evaluates_every_held_out_image(folder):
    source = ImageFolderSource(folder, image_size=(16, 16))
    train, val = source.split(0.25)
    assert (train.num_examples, val.num_examples) == (27, 9)
    assert sorted([*train.files, *val.files]) == sorted(source.files)
    again = ImageFolderSource(folder, image_size=(16, 16), label_mode="categorical").split(0.25)[1]
    assert list(again.files) == list(val.files)  # not the seed, not the label mode: the paths
    assert len(set(val.labels.tolist())) > 1  # not the last class's files
    history = _fit(source, epochs=1, validation_split=0.25)
    x, y = val.sample(100)
    evaluated = history.model.evaluate(x, y, verbose=0, return_dict=True)
    np.testing.assert_allclose(history.history["val_loss"][-1], evaluated["loss"], rtol=1e-5)
    np.testing.assert_allclose(history.history["val_accuracy"][-1], evaluated["accuracy"], rtol=1e-6)


def test_defects_are_named_with_the_fix(tmp_path, folder):
    with pytest.raises(DataError, match=r"does not exist .*received directory='.*missing'.*Fix"):
        ImageFolderSource(str(tmp_path / "missing"))
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "a.png").write_bytes(b"")
    with pytest.raises(DataError, match=r"no class subfolders.*Fix: put each class's images in its own subfolder"):
        ImageFolderSource(str(tmp_path / "flat"))
    (tmp_path / "records").mkdir()
    (tmp_path / "records" / "train-0.tfrecord").write_bytes(b"")
    with pytest.raises(DataError, match=r"holds TFRecord files, not class subfolders of images; received '.*records'\. "
                                        r"Fix: pass its files as a glob, '.*records/\*\.tfrecord'"):
        ImageFolderSource(str(tmp_path / "records"))
    (tmp_path / "flat" / "cat").mkdir()
    with pytest.raises(DataError, match=r"holds no images.*classes \['cat'\].*Fix"):
        ImageFolderSource(str(tmp_path / "flat"))
    with pytest.raises(DataError, match=r"class_names=\['cow'\] .*subfolders: \['cat', 'dog', 'eel'\].*Fix"):
        ImageFolderSource(folder, class_names=["cow"])
    with pytest.raises(DataError, match=r"label_mode='binary' needs exactly 2 classes; received 3.*Fix"):
        ImageFolderSource(folder, label_mode="binary")
    with pytest.raises(DataError, match=r"Invalid `image_size`; received image_size=180.*Fix: pass \(height, width\)"):
        ImageFolderSource(folder, image_size=180)
    with pytest.raises(DataError, match=r"Invalid `color_mode`; received color_mode='RGB'. Fix: use one of grayscale"):
        ImageFolderSource(folder, color_mode="RGB")
    with pytest.raises(DataError, match=r"either cropped or padded.*received crop_to_aspect_ratio=True and "
                                        r"pad_to_aspect_ratio=True. Fix: pass one of them"):
        ImageFolderSource(folder, crop_to_aspect_ratio=True, pad_to_aspect_ratio=True)
    with pytest.raises(DataError, match=r"validation_split=0.99 of 36 images leaves no training images"):
        ImageFolderSource(folder).split(0.99)
    # A validation folder without one of the classes would number the others differently.
    partial = str(tmp_path / "validation")
    shutil.copytree(os.path.join(folder, "cat"), os.path.join(partial, "cat"))
    shutil.copytree(os.path.join(folder, "eel"), os.path.join(partial, "eel"))
    with pytest.raises(DataError, match=r"classes are not the training images'; received \['cat', 'eel'\] .* for "
                                        r"\['cat', 'dog', 'eel'\].*Fix: give the validation folder the same class"):
        _fit(ImageFolderSource(folder, image_size=(16, 16)), epochs=1,
             validation_data=ImageFolderSource(partial, image_size=(16, 16)))


def test_a_file_that_is_not_an_image_or_does_not_decode_fails_the_run_naming_the_file(tmp_path, folder):
    import tensorflow as tf

    broken = str(tmp_path / "broken")
    shutil.copytree(folder, broken)
    with open(os.path.join(broken, "dog", "05.png"), "wb") as f:
        f.write(b"not a png")
    with pytest.raises(DataError, match=r"is not a BMP, GIF, JPEG or PNG image \(by its first bytes\); received "
                                        r"'.*broken/dog/05.png' in images in .*broken. Fix: remove or replace the file"):
        _fit(ImageFolderSource(broken, image_size=(16, 16)), epochs=1, shuffle=False)
    # A PNG cut short passes the first-bytes check and fails to decode, in an error that names no file:
    # the files are decoded one by one to name it (here in the validation images).
    png = tf.io.encode_png(np.full((20, 20, 3), 7, np.uint8)).numpy()
    with open(os.path.join(broken, "dog", "05.png"), "wb") as f:
        f.write(png[:len(png) // 2])
    source = ImageFolderSource(broken, image_size=(16, 16))
    with pytest.raises(DataError, match=r"an image file does not decode \(Invalid PNG data, size \d+\); received "
                                        r"'.*broken/dog/05.png' in images in .*broken \(validation: 9\). Fix: remove"):
        _fit(source, epochs=1, validation_split=0.25)
    with pytest.raises(DataError, match=r"an image file does not decode .*received '.*broken/dog/05.png'"):
        tfdist.predict(_model(), source, batch_size=8, verbose=0)
    # Past the time allowed for looking, the error says how far it looked.
    import tfdist.data.images as images_mod

    original, images_mod.SCAN_SECONDS = images_mod.SCAN_SECONDS, 0.0
    try:
        with pytest.raises(DataError, match=r"does not decode \(Invalid PNG data.*TensorFlow does not say which, and "
                                            r"the first 0 of 36 files decode"):
            tfdist.predict(_model(), source, batch_size=8, verbose=0)
    finally:
        images_mod.SCAN_SECONDS = original


_MIRRORED = textwrap.dedent(
    """
    import json, sys
    import tfdist
    devices = tfdist.split_cpu(2)
    from conftest import crash_and_resume
    from test_data_images import _fit

    folder = sys.argv[1]
    result = crash_and_resume(_fit, lambda: tfdist.ImageFolderSource(folder, image_size=(16, 16)), crash_at=5,
                              save_every=2, strategy="mirrored", devices=devices, validation_split=0.25)
    print("RESULT " + json.dumps(result))
    """
)


def test_under_mirrored_a_crash_resumes_bit_identically_validation_included(two_cpu_scripts):
    result = two_cpu_scripts("images")  # _MIRRORED on a folder of write_images
    assert result["replicas"] == 2 and result["from"] == 4 and result["same"], result
    assert result["val_loss"][0] == result["val_loss"][1], result


def _augmented(keras_name: str):
    """The Keras image tutorials' model: random flips, rotations, zooms and contrast in front of the network."""
    def build():
        keras = __import__(keras_name)
        layers = keras.layers
        model = keras.Sequential([
            keras.Input((16, 16, 3)), layers.RandomFlip("horizontal"), layers.RandomRotation(0.1), layers.RandomZoom(0.1),
            layers.RandomContrast(0.2), layers.Rescaling(1 / 255), layers.Conv2D(4, 3), layers.BatchNormalization(),
            layers.Activation("relu"), layers.GlobalAveragePooling2D(), layers.Dropout(0.1), layers.Dense(3)])
        model.compile(keras.optimizers.Adam(keras.optimizers.schedules.CosineDecay(0.05, 40)),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
        return model

    return build


@pytest.mark.parametrize("keras_name", ["keras", "tf_keras"])
def test_random_augmentation_layers_draw_the_same_numbers_after_a_resume(tmp_path, folder, keras_name):
    # Their random state is in the checkpoint: a resumed run flips, rotates and zooms as the uninterrupted one.
    def fit(**kwargs):
        return tfdist.fit(_augmented(keras_name), tfdist.ImageFolderSource(folder, image_size=(16, 16)), epochs=3,
                          batch_size=8, strategy="one_device", seed=3, deterministic=True, verbose=0,
                          validation_split=0.25, **kwargs)

    reference = fit()
    with pytest.raises(Crash):
        fit(checkpoint_dir=str(tmp_path), save_every_steps=2, callbacks=[crash_after(6, keras_name)])
    resumed = fit(checkpoint_dir=str(tmp_path), save_every_steps=2)
    assert resumed.tfdist.start_step == 4
    assert same_weights(resumed.model, reference.model)
    assert resumed.history["val_loss"] == reference.history["val_loss"]
