"""Argument types and values the commands share (no TensorFlow here)."""

from __future__ import annotations

import argparse
import math

from tfdist import _checks


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, received {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, received {text!r}")
    return value


def nonnegative_int(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number, 0 or more; received {text!r}")
    return int(text)


MAX_SEED = _checks.MAX_SEED


def seed(text: str) -> int:
    if not text.isdigit() or int(text) > MAX_SEED:
        raise argparse.ArgumentTypeError(f"expected a whole number from 0 to {MAX_SEED}; received {text!r}")
    return int(text)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, received {text!r}") from None
    if not 0 < value < math.inf:  # NaN fails it too
        raise argparse.ArgumentTypeError(f"expected a positive, finite number, received {text!r}")
    return value


MAX_IMAGE_SIDE = 8192
"""The largest side --image-size takes: one 8192x8192 RGB image is 800 MB in float32."""


def image_size(text: str) -> tuple[int, int]:
    """``64`` -> ``(64, 64)``; ``96x128`` -> ``(96, 128)`` (height x width)."""
    parts = text.lower().split("x")
    try:
        size = tuple(int(part) for part in parts)
        if len(size) not in (1, 2) or min(size) < 1 or max(size) > MAX_IMAGE_SIDE:
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected HEIGHTxWIDTH or one side, of 1 to {MAX_IMAGE_SIDE} pixels, e.g. "
                                         f"180x180 or 180; received {text!r}") from None
    return (size[0], size[-1])


def one_or_files(values, flag: str):
    """One ``--data`` value, or several files (an unquoted glob the shell expanded), sorted as a
    glob's matches are: the same files give the same order, and the same data fingerprint."""
    if values is None or isinstance(values, str):
        return values
    if len(values) == 1:
        return values[0]
    from tfdist.data.loading import names_a_data_set

    named = [v for v in values if names_a_data_set(v)]
    if named:
        from tfdist.errors import DataError

        raise DataError(f"{flag} takes one data set or TFRecord files; received {len(values)} values, among them "
                        f"{named[0]!r}. Fix: pass one data set, or only TFRecord files (a glob, quoted or not).")
    return sorted(values)


def model_name(text: str) -> str:
    """A built-in model's name, or ``MODULE:FUNCTION`` naming a function that builds a compiled model."""
    from tfdist.models import MODELS

    module, sep, function = text.partition(":")
    if text in MODELS or (sep and module and function.isidentifier()
                          and all(part.isidentifier() for part in module.split("."))):
        return text
    raise argparse.ArgumentTypeError(f"expected a built-in model ({', '.join(sorted(MODELS))}) or MODULE:FUNCTION, "
                                     f"e.g. my_pkg.models:build; received {text!r}")


def step_range(text: str) -> tuple[int, int]:
    """``10,20`` -> ``(10, 20)``; ``10`` -> ``(10, 10)``: global steps, from 1, first not after last."""
    parts = text.split(",")
    try:
        first, last = (int(parts[0]), int(parts[-1])) if len(parts) in (1, 2) else (0, 0)
        if not 1 <= first <= last:
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected FIRST,LAST global steps (from 1, first not after last), e.g. "
                                         f"10,20; received {text!r}") from None
    return first, last
