"""The one copy of tfdist's argument checks (integers, numbers, choices) and their messages.

Every check raises the caller's exception class (a subclass of a built-in, from
``tfdist.errors``) with the message shape used everywhere: what is invalid, the value
received, and the fix. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Iterable

PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
"""Keras mixed-precision policies tfdist accepts (training and planning)."""
MAX_SEED = 2**32 - 1
"""The largest seed NumPy takes (``np.random.seed``): seeds are 0 to 2**32 - 1."""


def is_int(value: Any) -> bool:
    """True for Python and NumPy integers; False for bools (``True`` is not a count)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    """True for real numbers (ints, floats, NumPy scalars, infinities too); False for bools."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """True for finite real numbers (ints, floats, NumPy scalars); False for bools."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _kind(minimum: int) -> str:
    return "a positive integer" if minimum == 1 else f"an integer >= {minimum}"


def check_int(name: str, value: Any, *, error: type[Exception], minimum: int = 1, fix: str | None = None) -> None:
    """Raises ``error`` unless ``value`` is an integer >= ``minimum``."""
    if not is_int(value) or value < minimum:
        raise error(f"Invalid `{name}`; received {name}={value!r}. Fix: {fix or 'use ' + _kind(minimum) + '.'}")


def check_optional_int(name: str, value: Any, *, error: type[Exception], minimum: int = 1) -> None:
    """Like ``check_int``, but None passes."""
    if value is not None:
        check_int(name, value, error=error, minimum=minimum)


def check_number(
    name: str, value: Any, *, error: type[Exception], unit: str = "", allow_none: bool = False,
    allow_zero: bool = False,
) -> None:
    """Raises ``error`` unless ``value`` is a positive (or, with ``allow_zero``, >= 0) finite number."""
    if value is None and allow_none:
        return
    if not is_number(value) or value < 0 or (value == 0 and not allow_zero):
        kind = "a number >= 0" if allow_zero else "a positive number"
        raise error(f"Invalid `{name}`; received {name}={value!r}. Fix: use {kind}{' of ' + unit if unit else ''}.")


def check_choice(name: str, value: Any, choices: Iterable[str], *, error: type[Exception]) -> None:
    """Raises ``error`` unless ``value`` is one of ``choices``."""
    choices = tuple(choices)
    if value not in choices:
        raise error(f"Invalid `{name}`; received {name}={value!r}. Fix: use one of {', '.join(choices)}.")
