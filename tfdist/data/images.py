"""ImageFolderSource: image files in one folder per class, read by index -- Keras'
``image_dataset_from_directory`` with an exact global shuffle and exact resume.

The listing is Keras' own: the class names are the sorted subdirectories of ``directory``
(or ``class_names``, in that order), and each class holds its files with an image suffix
(``.bmp .gif .jpeg .jpg .png``), found recursively, sorted by folder then name. Example ``i``
is the ``i``-th file of that listing; epoch ``e`` visits them in the arrays' permutation of
``(seed, e)``, so a resumed run reads exactly the files the uninterrupted run would have read.

Each image is read and decoded as Keras does (``tf.io.read_file``, ``tf.image.decode_image``,
``tf.image.resize`` to ``image_size``, after a centred crop to its aspect ratio with
``crop_to_aspect_ratio``, or padded with ``pad_to_aspect_ratio``): float32 pixels of 0-255 (also for ``"nearest"``, where
Keras keeps uint8: the same values), the labels as ``label_mode``
says. This is TensorFlow ops in the input pipeline, not Python, so it runs in tf.data's
threads without the GIL, under every strategy (parameter-server workers read the files by
path: use storage every worker reaches, such as ``gs://``), on any TensorFlow filesystem.

``validation_split`` (in ``fit``) holds out a fixed part of the files: the last fraction in
the order of a hash of each file's path under ``directory``, so the split does not depend on
the seed, stays the same on resume, and keeps each class's share about even.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
from typing import Any, Callable, Sequence

import numpy as np

from tfdist import _checks
from tfdist.errors import DataError

log = logging.getLogger("tfdist")

__all__ = ["ImageFolderSource", "FORMATS", "check_labelled", "check_same_classes", "class_names_of"]

FORMATS = (".bmp", ".gif", ".jpeg", ".jpg", ".png")
"""The file suffixes read as images (Keras' ``ALLOWLIST_FORMATS``), in any case."""

_MAGIC = (b"BM", b"GIF8", b"\xff\xd8\xff", b"\x89PNG")
"""How the files of each format begin."""
_NOT_AN_IMAGE = "tfdist: not a BMP, GIF, JPEG or PNG image:"
SCAN_SECONDS = 120.0
"""How long a failed decode may spend looking for the file TensorFlow did not name."""

COLOR_MODES = {"grayscale": 1, "rgb": 3, "rgba": 4}
LABEL_MODES = ("int", "categorical", "binary")
INTERPOLATIONS = ("bilinear", "nearest", "bicubic", "area", "lanczos3", "lanczos5", "gaussian", "mitchellcubic")


def _join(directory: str, name: str) -> str:
    return directory.rstrip("/") + "/" + name


def _walk(directory: str, top: str, prefix: str) -> list[str]:
    """The image files under ``top`` (at any depth), as paths under ``directory`` starting with
    ``prefix``, in Keras' order: sorted by folder, then by name."""
    import tensorflow as tf

    files = []
    for root, _, filenames in sorted(tf.io.gfile.walk(top), key=lambda entry: entry[0]):
        folder = (prefix + root[len(top):].replace("\\", "/")).strip("/")
        files += [f"{folder}/{f}" if folder else f for f in sorted(filenames) if f.lower().endswith(FORMATS)]
    return files


def _check_folder(directory: str) -> None:
    import tensorflow as tf

    if not tf.io.gfile.isdir(directory):
        raise DataError(f"the image folder does not exist or is not a directory; received directory={directory!r}. "
                        "Fix: pass the folder of images (directory/<class>/<image>, or any images for labels=None).")


def class_names_of(directory: str) -> tuple[str, ...]:
    """The class subfolders of ``directory``, sorted: the classes ``labels="inferred"`` numbers."""
    import tensorflow as tf

    gfile = tf.io.gfile
    _check_folder(directory)
    return tuple(sorted(name.rstrip("/") for name in gfile.listdir(directory)
                        if not name.startswith(".") and gfile.isdir(_join(directory, name.rstrip("/")))))


def _listing(directory: str, class_names: Sequence[str] | None) -> tuple[list[str], list[int], tuple[str, ...]]:
    """(each image's path under ``directory``, its class number, the class names), in Keras' order."""
    subdirs = list(class_names_of(directory))
    if class_names is not None:
        class_names = tuple(class_names)
        unknown = sorted(set(class_names) - set(subdirs))
        if unknown or not class_names or len(set(class_names)) != len(class_names):
            raise DataError(f"`class_names` must name distinct subfolders of {directory!r}; received "
                            f"class_names={list(class_names)!r} (subfolders: {subdirs}). Fix: pass some of the "
                            "subfolders' names, each once, or leave class_names out for all of them.")
    elif not subdirs:
        import tensorflow as tf

        if any(name.endswith((".tfrecord", ".tfrecords", ".tfr")) for name in tf.io.gfile.listdir(directory)):
            raise DataError(f"the folder holds TFRecord files, not class subfolders of images; received "
                            f"{directory!r}. Fix: pass its files as a glob, '{directory.rstrip('/')}/*.tfrecord' "
                            "(tfdist train: with --features SPEC.json).")
        raise DataError(f"the image folder has no class subfolders; received directory={directory!r}. Fix: put each "
                        "class's images in its own subfolder (directory/<class>/<image>), or pass labels=None (no "
                        "labels: to predict) or a list of labels, one per image.")
    names = class_names if class_names is not None else tuple(subdirs)
    files, labels = [], []
    for label, name in enumerate(names):
        files += _walk(directory, _join(directory, name), name)
        labels += [label] * (len(files) - len(labels))
    if not files:
        raise DataError(f"the image folder holds no images; received directory={directory!r} with classes "
                        f"{list(names)}. Fix: put files ending in {', '.join(FORMATS)} in the class subfolders.")
    return files, labels, names


def _listing_given(directory: str, labels: Sequence[int] | None) -> tuple[list[str], list[int], tuple[str, ...]]:
    """``labels=None`` or a list: every image under ``directory`` at any depth, in Keras' order,
    with no labels (zeros the predict step ignores) or with ``labels``, one per image in that order."""
    _check_folder(directory)
    files = _walk(directory, directory, "")
    if not files:
        raise DataError(f"the image folder holds no images; received directory={directory!r}. Fix: put files ending "
                        f"in {', '.join(FORMATS)} in it (at any depth).")
    if labels is None:
        return files, [0] * len(files), ()
    if len(labels) != len(files) or not all(_checks.is_int(v) and v >= 0 for v in labels):
        raise DataError(f"`labels` must hold one class number (0, 1, ...) per image, in the order of the images' "
                        f"paths; received {len(labels)} labels for {len(files)} images under {directory!r}"
                        f"{'' if len(labels) != len(files) else ', not all of them integers >= 0'}. Fix: pass "
                        "labels='inferred' (one subfolder per class), or one integer per image.")
    return files, [int(v) for v in labels], tuple(str(c) for c in range(max(int(v) for v in labels) + 1))


def _check_image_size(image_size: Any) -> tuple[int, int]:
    if not (isinstance(image_size, (tuple, list)) and len(image_size) == 2 and all(
            _checks.is_int(v) and v > 0 for v in image_size)):
        raise DataError(f"Invalid `image_size`; received image_size={image_size!r}. "
                        "Fix: pass (height, width) in pixels, e.g. (180, 180).")
    return int(image_size[0]), int(image_size[1])


def _central_crop(image: "Any", target_height: int, target_width: int) -> "Any":
    """The largest centred part of ``image`` with the aspect ratio of ``target_height x
    target_width``, computed as Keras' ``smart_resize`` does (the same sizes and offsets)."""
    import tensorflow as tf

    shape = tf.shape(image)
    height, width = shape[0], shape[1]
    crop_height = tf.cast(tf.cast(width * target_height, tf.float32) / target_width, tf.int32)
    crop_height = tf.maximum(tf.minimum(height, crop_height), 1)
    crop_width = tf.cast(tf.cast(height * target_width, tf.float32) / target_height, tf.int32)
    crop_width = tf.maximum(tf.minimum(width, crop_width), 1)
    top = tf.cast(tf.cast(height - crop_height, tf.float32) / 2, tf.int32)
    left = tf.cast(tf.cast(width - crop_width, tf.float32) / 2, tf.int32)
    return image[top:top + crop_height, left:left + crop_width, :]


class ImageFolderSource:
    """The images of ``directory/<class>/...``, with their class as the label.

    The listing, decoding and resizing are Keras' ``image_dataset_from_directory``'s, so the
    pixels and labels are the same. Example ``i`` is the ``i``-th file of the listing. Each epoch
    visits the files in a seeded permutation, so the shuffle is global and a resume is exact.

    Args:
      directory: The folder, on any TensorFlow filesystem: a local path or ``gs://...``.
      labels: ``"inferred"``: one subfolder per class. None: every image under ``directory`` at
        any depth, without labels: to predict, or to train a model that needs none (an
        autoencoder, a GAN). Or a list of class numbers, one per image in the order of their
        paths. Defaults to ``"inferred"``.
      image_size: ``(height, width)`` every image is resized to. Defaults to ``(256, 256)``.
      color_mode: ``"rgb"`` (3 channels), ``"grayscale"`` (1) or ``"rgba"`` (4).
        Defaults to ``"rgb"``.
      label_mode: ``"int"`` (class numbers, int32), ``"categorical"`` (one-hot float32) or
        ``"binary"`` (float32 0 or 1, two classes only). Defaults to ``"int"``.
      class_names: The classes to read, in the order that numbers them. Only with
        ``labels="inferred"``. Defaults to None: every subfolder, sorted.
      interpolation: The ``tf.image.resize`` method. Defaults to ``"bilinear"``.
      crop_to_aspect_ratio: Resize the largest centred crop with the aspect ratio of
        ``image_size``. Defaults to False.
      pad_to_aspect_ratio: Resize each image to fit, and pad it with black. Defaults to False.

    Raises:
      DataError: The folder is missing or holds no class subfolders or images, or an option is
        invalid.

    Examples:
        ```python
        import keras
        import tensorflow as tf
        import tfdist

        for label in ("cat", "dog"):   # 16 small PNG images in photos/cat and photos/dog
            tf.io.gfile.makedirs(f"photos/{label}")
            for i in range(8):
                pixels = tf.fill([12, 12, 3], 40 if label == "cat" else 200)
                tf.io.write_file(f"photos/{label}/{i}.png", tf.io.encode_png(tf.cast(pixels, tf.uint8)))

        model = keras.Sequential([keras.Input((12, 12, 3)), keras.layers.Rescaling(1 / 255),
                                  keras.layers.Flatten(), keras.layers.Dense(2)])
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        source = tfdist.ImageFolderSource("photos", image_size=(12, 12))
        tfdist.fit(model, source, epochs=2, batch_size=8, seed=0)
        ```
    """

    index_addressable = True

    def __init__(self, directory: str, *, labels: str | Sequence[int] | None = "inferred",
                 image_size: Sequence[int] = (256, 256), color_mode: str = "rgb",
                 label_mode: str = "int", class_names: Sequence[str] | None = None,
                 interpolation: str = "bilinear", crop_to_aspect_ratio: bool = False, pad_to_aspect_ratio: bool = False):
        if not isinstance(directory, str) or not directory:
            raise DataError(f"Invalid `directory`; received directory={directory!r}. Fix: pass the image folder's path.")
        self.image_size = _check_image_size(image_size)
        _checks.check_choice("color_mode", color_mode, COLOR_MODES, error=DataError)
        _checks.check_choice("label_mode", label_mode, LABEL_MODES, error=DataError)
        _checks.check_choice("interpolation", interpolation, INTERPOLATIONS, error=DataError)
        if crop_to_aspect_ratio and pad_to_aspect_ratio:
            raise DataError("an image is either cropped or padded to the aspect ratio; received crop_to_aspect_ratio=True "
                            "and pad_to_aspect_ratio=True. Fix: pass one of them.")
        self.crop_to_aspect_ratio, self.pad_to_aspect_ratio = bool(crop_to_aspect_ratio), bool(pad_to_aspect_ratio)
        self.directory = directory.rstrip("/") or directory
        self.color_mode, self.label_mode, self.interpolation = color_mode, label_mode, interpolation
        self.labelled = labels is not None
        if isinstance(labels, str) and labels == "inferred":
            files, labels, self.class_names = _listing(self.directory, class_names)
        elif labels is not None and (isinstance(labels, str) or not isinstance(labels, (Sequence, np.ndarray))):
            raise DataError(f"Invalid `labels`; received labels={labels!r}. Fix: pass 'inferred' (one subfolder per "
                            "class), None (no labels, to predict) or a list of class numbers, one per image.")
        elif class_names is not None:
            raise DataError(f"`class_names` names the class subfolders, read with labels='inferred' only; received "
                            f"class_names={list(class_names)!r} with labels="
                            f"{'None' if labels is None else 'a list'}. Fix: leave class_names out.")
        else:
            files, labels, self.class_names = _listing_given(self.directory, labels)
        if label_mode == "binary" and self.labelled and len(self.class_names) != 2:
            raise DataError(f"label_mode='binary' needs exactly 2 classes; received {len(self.class_names)} in "
                            f"{self.directory!r} ({list(self.class_names)}). Fix: use label_mode='int' or "
                            "'categorical', or pass two class_names.")
        self.files = np.array(files)
        self.labels = np.array(labels, np.int32)
        self.name = f"images in {self.directory}"
        if self.labelled:
            log.info("%s: %d images of %d classes", self.name, len(files), len(self.class_names))
        else:
            log.info("%s: %d images, no labels", self.name, len(files))

    @property
    def num_examples(self) -> int:
        return len(self.files)

    def paths(self) -> list[str]:
        """Each image's path (the folder's joined with its own under it), in the listing's order."""
        return [_join(self.directory, name) for name in self.files.tolist()]

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def channels(self) -> int:
        return COLOR_MODES[self.color_mode]

    @property
    def example_shape(self) -> tuple[int, int, int]:
        return (*self.image_size, self.channels)

    @property
    def example_bytes(self) -> int:
        """Bytes of one decoded example: its float32 pixels and label."""
        return 4 * (int(np.prod(self.example_shape)) + (self.num_classes if self.label_mode == "categorical" else 1))

    def fingerprint(self) -> str:
        """The listing and how it is decoded (not the files' bytes: reading them all would be a pass over the data)."""
        record = [self.files.tolist(), self.labels.tolist(), list(self.class_names), list(self.image_size),
                  self.color_mode, self.label_mode, self.interpolation]
        record += [] if self.labelled else ["unlabelled"]
        record += [name for name in ("crop_to_aspect_ratio", "pad_to_aspect_ratio") if getattr(self, name)]
        return hashlib.sha256(json.dumps(record).encode()).hexdigest()[:16]

    def _load(self, path: "Any") -> "Any":
        """One image, as Keras' ``image_dataset_from_directory`` reads it."""
        import tensorflow as tf

        contents = tf.io.read_file(path)
        known = tf.reduce_any([tf.equal(tf.strings.substr(contents, 0, len(magic)), magic) for magic in _MAGIC])
        readable = tf.debugging.Assert(known, [_NOT_AN_IMAGE, path], summarize=1)
        with tf.control_dependencies([readable]):  # TensorFlow's own error would not name the file
            image = tf.image.decode_image(contents, channels=self.channels, expand_animations=False)
        height, width = self.image_size
        if self.crop_to_aspect_ratio:
            image = tf.image.resize(_central_crop(image, height, width), self.image_size, method=self.interpolation)
        elif self.pad_to_aspect_ratio:
            image = tf.image.resize_with_pad(image, height, width, method=self.interpolation)
        else:
            image = tf.image.resize(image, self.image_size, method=self.interpolation)
        image = tf.cast(image, tf.float32)
        image.set_shape(self.example_shape)
        return image

    def _label(self, labels: "Any") -> "Any":
        import tensorflow as tf

        if self.label_mode == "categorical":
            return tf.one_hot(labels, self.num_classes, dtype=tf.float32)
        if self.label_mode == "binary":
            return tf.cast(labels, tf.float32)[:, None]
        return labels

    def _decode(self, paths: "Any", labels: "Any") -> Any:
        """``(images, labels)`` of a batch of paths (relative to the directory) and class numbers;
        the images alone when read with ``labels=None``, as Keras' ``fit`` takes data without labels."""
        import tensorflow as tf

        spec = tf.TensorSpec(self.example_shape, tf.float32)
        images = tf.map_fn(self._load, tf.strings.join([_join(self.directory, ""), paths]),
                           fn_output_signature=spec)
        return (images, self._label(labels)) if self.labelled else images

    def gather_fn(self, *, embed: bool = False) -> Callable:
        """``indices -> (images, labels)``: TensorFlow ops only, so the same under every strategy
        (``embed``, for parameter servers, needs nothing else: the paths are in the graph)."""
        import tensorflow as tf

        paths, labels = tf.constant(self.files, tf.string), tf.constant(self.labels)
        return lambda idx: self._decode(tf.gather(paths, idx), tf.gather(labels, idx))

    def sample(self, count: int) -> Any:
        """The first ``count`` examples as NumPy arrays: ``(images, labels)``, or the images alone
        (``labels=None``)."""
        import tensorflow as tf

        element = self._decode(tf.constant(self.files[:count], tf.string), tf.constant(self.labels[:count]))
        return tf.nest.map_structure(lambda t: t.numpy(), element)

    def failure_of(self, error: BaseException) -> DataError | None:
        """TensorFlow's error reading an image, as a DataError naming the file: one whose first bytes
        are no image's (the pipeline's assertion names it), or one that does not decode (TensorFlow
        does not name it: the files are decoded one by one, for at most ``SCAN_SECONDS``, to find it).
        ``None``: not an image of this source."""
        import re

        message = str(error)
        named = re.search(re.escape(_NOT_AN_IMAGE) + r"\] \[(.*?)\]", message)
        fix = "Fix: remove or replace the file, then run again (training resumes from its last checkpoint)."
        if named:
            path = named.group(1)
            if not path.startswith(_join(self.directory, "")):
                return None
            return DataError(f"a file with an image's suffix is not a BMP, GIF, JPEG or PNG image (by its first "
                             f"bytes); received {path!r} in {self.name}. {fix}")
        if "DecodeImage" not in message:
            return None
        reason = re.sub(r"\s+", " ", message.split("transformation with iterator:")[-1]).strip()
        reason = reason.split(": ", 1)[-1].split(" [[")[0][:200]
        path, checked = self._first_undecodable()
        if path is not None:
            return DataError(f"an image file does not decode ({reason}); received {path!r} in {self.name}. {fix}")
        if checked < self.num_examples:
            return DataError(f"an image file of {self.name} does not decode ({reason}); TensorFlow does not say which, "
                             f"and the first {checked} of {self.num_examples} files decode (checked for "
                             f"{SCAN_SECONDS:.0f} s). Fix: find it (e.g. decode each file with tf.image.decode_image) "
                             "and remove or replace it, then run again.")
        return None

    def _first_undecodable(self) -> tuple[str | None, int]:
        """(the first file of the listing that does not decode, or None; how many files were checked)."""
        import time

        import tensorflow as tf

        log.warning("an image of %s did not decode; looking for it (at most %.0f s)", self.name, SCAN_SECONDS)
        deadline = time.monotonic() + SCAN_SECONDS
        for i, path in enumerate(self.paths()):
            if time.monotonic() > deadline:
                return None, i
            try:
                self._load(tf.constant(path))  # as the pipeline reads it
            except (tf.errors.InvalidArgumentError, tf.errors.NotFoundError):
                return path, i + 1
        return None, self.num_examples

    def split(self, fraction: float) -> tuple["ImageFolderSource", "ImageFolderSource"]:
        """``validation_split``: (the training files, the last ``fraction`` of the files in the order
        of their paths' hashes), each in the listing's order (see the module)."""
        from tfdist.data.arrays import split_point

        cut = split_point(self.num_examples, fraction, name=self.name, unit="image")
        keys = [hashlib.sha256(f.encode()).digest() for f in self.files.tolist()]
        by_hash = np.array(sorted(range(self.num_examples), key=keys.__getitem__))
        return (self._subset(np.sort(by_hash[:cut]), "training"),
                self._subset(np.sort(by_hash[cut:]), "validation"))

    def _subset(self, indices: np.ndarray, part: str) -> "ImageFolderSource":
        subset = copy.copy(self)
        subset.files, subset.labels = self.files[indices], self.labels[indices]
        subset.name = f"{self.name} ({part}: {len(indices)})"
        return subset


def check_same_classes(train: Any, validation: Any) -> None:
    """Refuses a validation image folder whose classes are not the training folder's: each folder
    numbers its classes by its own subfolders, so other classes would be scored as other labels."""
    if not (isinstance(train, ImageFolderSource) and isinstance(validation, ImageFolderSource)):
        return
    if train.class_names != validation.class_names:
        raise DataError(
            f"the validation images' classes are not the training images'; received {list(validation.class_names)} in "
            f"{validation.directory!r} for {list(train.class_names)} in {train.directory!r}. Fix: give the validation "
            f"folder the same class subfolders, or (from Python) pass class_names={list(train.class_names)!r} to both "
            "ImageFolderSources."
        )


def check_labelled(source: Any, *, use: str) -> None:
    """Refuses images read without labels (``labels=None``) where the labels are needed."""
    if getattr(source, "labelled", True) is False:
        raise DataError(f"{use} needs labelled examples; received {source.name!r}, read with labels=None. Fix: "
                        "pass labels='inferred' (one subfolder per class) or a list of labels, or predict with it.")
