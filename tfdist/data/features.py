"""A feature spec (a small JSON file) that turns serialized ``tf.train.Example`` records into ``(x, y)`` batches.

The spec names the feature of the input and of the label::

    {"x": {"key": "image", "dtype": "string", "decode": "png", "shape": [28, 28, 1], "scale": 255},
     "y": {"key": "label", "dtype": "int64"},
     "num_classes": 10}

* ``dtype``: how the feature is stored: ``float32`` (float_list), ``int64`` (int64_list) or
  ``string`` (bytes_list).
* ``shape``: the shape of one example's value (after decoding); default ``[]``.
* ``decode`` (``string`` features only): ``png``, ``jpeg`` or ``image`` (any image format;
  ``shape`` gives height, width, channels), or ``raw:DTYPE`` (``tf.io.decode_raw``, e.g.
  ``raw:uint8``, reshaped to ``shape``).
* ``scale``: ``x`` is cast to float32 and divided by it (e.g. 255 for 8-bit pixels).
* ``num_classes``: the number of label classes (``tfdist train`` builds its model with it).
"""

from __future__ import annotations

import json
from typing import Any, Callable

from tfdist.errors import DataError

STORED = ("float32", "int64", "string")
RAW = ("uint8", "int8", "uint16", "int16", "int32", "int64", "float16", "float32", "float64")
IMAGES = ("png", "jpeg", "image")
_FIELDS = {"key", "dtype", "shape", "decode", "scale"}


def _bad(where: str, field: str, value: Any, fix: str) -> DataError:
    return DataError(f"invalid feature spec {where}: field {field!r}: received {value!r}. Fix: {fix}.")


def read_spec(path: str) -> dict:
    """The JSON spec at ``path`` (any TensorFlow filesystem)."""
    import tensorflow as tf

    try:
        with tf.io.gfile.GFile(path, "r") as f:
            text = f.read()
    except tf.errors.OpError as e:
        raise DataError(f"cannot read the feature spec; received --features {path!r} ({type(e).__name__}). "
                        "Fix: pass the path of a JSON file (or tfds:NAME).") from None
    try:
        spec = json.loads(text)
    except ValueError as e:
        raise DataError(f"the feature spec is not valid JSON; received {path!r} ({e}). "
                        'Fix: write e.g. {"x": {"key": "image", "dtype": "float32", "shape": [8, 8, 1]}, '
                        '"y": {"key": "label", "dtype": "int64"}, "num_classes": 10}.') from None
    return spec


def _check_feature(spec: Any, name: str, where: str) -> dict:
    if not isinstance(spec, dict):
        raise _bad(where, name, spec, f'give {name} as an object, e.g. {{"key": "image", "dtype": "float32", "shape": [8, 8]}}')
    unknown = sorted(set(spec) - _FIELDS)
    if unknown:
        raise _bad(where, f"{name}.{unknown[0]}", spec[unknown[0]], f"use only the fields {', '.join(sorted(_FIELDS))}")
    key = spec.get("key")
    if not isinstance(key, str) or not key:
        raise _bad(where, f"{name}.key", key, "give the name of the feature in the records")
    dtype = spec.get("dtype")
    if dtype not in STORED:
        raise _bad(where, f"{name}.dtype", dtype, f"use one of {', '.join(STORED)} (how the feature is stored)")
    shape = spec.get("shape", [])
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
        raise _bad(where, f"{name}.shape", shape, "give a list of positive integers, e.g. [28, 28, 1] ([] for a scalar)")
    decode = spec.get("decode")
    if decode is not None:
        if dtype != "string":
            raise _bad(where, f"{name}.decode", decode, 'decode applies to "string" features; drop it or set "dtype": "string"')
        if decode in IMAGES:
            if len(shape) != 3 or shape[-1] not in (1, 3, 4):
                raise _bad(where, f"{name}.shape", shape, "give [height, width, channels] with 1, 3 or 4 channels for images")
        elif not (isinstance(decode, str) and decode.startswith("raw:") and decode[4:] in RAW):
            raise _bad(where, f"{name}.decode", decode, f"use png, jpeg, image or raw:DTYPE with DTYPE one of {', '.join(RAW)}")
    scale = spec.get("scale")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float)) or scale <= 0):
        raise _bad(where, f"{name}.scale", scale, "give a positive number (x is divided by it), or leave it out")
    return spec


def check_spec(spec: Any, *, where: str = "") -> dict:
    """Validates a spec; every error names the field, the value and the fix."""
    if not isinstance(spec, dict):
        raise DataError(f"invalid feature spec {where}: received {type(spec).__name__}, not an object. "
                        'Fix: write {"x": {...}, "y": {...}, "num_classes": N}.')
    unknown = sorted(set(spec) - {"x", "y", "num_classes"})
    if unknown:
        raise _bad(where, unknown[0], spec[unknown[0]], "use only the fields x, y and num_classes")
    for name in ("x", "y"):
        if name not in spec:
            raise _bad(where, name, None, f'give {name}, e.g. "{name}": {{"key": "...", "dtype": "..."}}')
        _check_feature(spec[name], name, where)
    if spec["y"].get("decode") is not None or spec["y"]["dtype"] == "string":
        raise _bad(where, "y.dtype", spec["y"]["dtype"], "store labels as int64 (class numbers) or float32")
    classes = spec.get("num_classes")
    if classes is not None and (isinstance(classes, bool) or not isinstance(classes, int) or classes < 1):
        raise _bad(where, "num_classes", classes, "give a positive integer")
    return spec


def parse_fn_from_spec(spec: dict, *, where: str = "") -> Callable:
    """``parse_fn(serialized) -> (x, y)`` for a checked spec: x as float32 (when scaled or decoded), y as stored.
    ``where``: the spec's file, named when the records do not fit it (the function's ``spec_file``)."""
    import tensorflow as tf

    xs, ys = spec["x"], spec["y"]
    stored = {"float32": tf.float32, "int64": tf.int64, "string": tf.string}

    def feature(s):
        shape = [] if s.get("decode") else s.get("shape", [])
        return tf.io.FixedLenFeature(shape, stored[s["dtype"]])

    features = {xs["key"]: feature(xs)}
    features[ys["key"]] = feature(ys)
    x_shape = list(xs.get("shape", []))

    def decode(x):
        how = xs.get("decode")
        if how is None:
            return x
        if how.startswith("raw:"):
            raw = tf.io.decode_raw(x, getattr(tf, how[4:]))
            return tf.reshape(raw, [-1, *x_shape])
        decoder = {"png": tf.io.decode_png, "jpeg": tf.io.decode_jpeg}.get(how)
        channels = x_shape[-1]

        def one(s):
            image = decoder(s, channels=channels) if decoder else tf.io.decode_image(s, channels=channels, expand_animations=False)
            return tf.ensure_shape(image, x_shape)

        return tf.map_fn(one, x, fn_output_signature=tf.TensorSpec(x_shape, tf.uint8))

    def parse(serialized):
        parsed = tf.io.parse_example(serialized, features)
        x = decode(parsed[xs["key"]])
        if xs.get("scale") is not None or xs.get("decode") is not None:
            x = tf.cast(x, tf.float32) / float(xs.get("scale") or 1)
        return x, parsed[ys["key"]]

    parse.spec_file = where
    return parse
