"""Human units for the planner: sizes (500MB, 10GB/s), durations (30s, 1h30m), counts (1.2M)."""

from __future__ import annotations

import decimal
import re

from tfdist import _checks
from tfdist.errors import PlanError

_SI = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15}
_IEC = {"ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40, "pi": 2**50}
_COUNT_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}
_SECONDS = {"ms": 1e-3, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}
_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)(?:e([+-]?\d+))?"


def _number(mantissa: str, exponent: str | None) -> float:
    """The float of ``mantissa`` x 10**``exponent``, inf past float's range (never an exact power of ten:
    ``1e99999999`` would take forever to compute)."""
    return float(f"{mantissa}e{exponent or 0}")


def parse_bytes(text: str | float, *, name: str = "value", per_second: bool = False) -> float:
    """Bytes (or bytes/s) from a number or a size such as ``500MB``, ``1.5GiB``, ``10GB/s``, ``100Gbit/s``.

    ``k/M/G/T`` are powers of 1000, ``Ki/Mi/Gi/Ti`` powers of 1024; ``B`` (or nothing) means
    bytes and ``bit`` bits. A bandwidth such as ``25Gb/s`` (a lowercase ``b`` after a prefix,
    bits in network specifications) is refused as ambiguous.
    """
    if _checks.is_real(text):
        return float(text)
    example = "10GB/s or 1.25e9" if per_second else "500MB, 1.5GiB or 5e8"
    match = re.fullmatch(_NUMBER + r"\s*([kmgtp]i?)?(b|bit|bits|byte|bytes)?(/s)?", str(text).strip().lower())
    if not match or (match.group(5) and not per_second):
        raise PlanError(f"Invalid `{name}`; received {name}={text!r}. Fix: use a size such as {example}, not negative.")
    prefix, unit = match.group(3) or "", match.group(4) or "b"
    if per_second and prefix and re.search(r"i?b(/s)?$", str(text).strip()):  # 25Gb/s: bits, as network specs write it
        shown = match.group(1) + (f"e{match.group(2)}" if match.group(2) else "") + prefix[0].upper() + prefix[1:]
        raise PlanError(
            f"Ambiguous `{name}`; received {name}={text!r}: a lowercase b after {prefix[0].upper()} means bits in "
            f"network specifications, bytes here. Fix: write {shown}bit/s for bits or {shown}B/s for bytes."
        )
    scale = _IEC[prefix] if prefix.endswith("i") else _SI[prefix]
    return _number(match.group(1), match.group(2)) * scale / (8 if unit.startswith("bit") else 1)


def parse_duration(text: str | float, *, name: str = "value") -> float:
    """Seconds from a number or a duration such as ``500ms``, ``30s``, ``5m``, ``24h``, ``2d``, ``1h30m``."""
    if _checks.is_real(text):
        return float(text)
    parts = re.findall(_NUMBER + r"\s*([a-z]*)\s*", str(text).strip().lower())
    joined = "".join(re.findall(r"\S+", str(text).lower()))
    rebuilt = "".join(f"{m}{'e' + e if e else ''}{u}" for m, e, u in parts)
    if not parts or rebuilt != joined or any(u not in _SECONDS and u != "" for _, _, u in parts):
        raise PlanError(
            f"Invalid `{name}`; received {name}={text!r}. Fix: use seconds or a duration such as 30s, 5m, 24h, "
            "not negative."
        )
    return sum(_number(m, e) * _SECONDS[u or "s"] for m, e, u in parts)


MAX_COUNT_TEXT = "1e18"
MAX_COUNT = float(MAX_COUNT_TEXT)
"""Counts above are refused: no run has that many samples, parameters or steps."""


def parse_count(text: str | int, *, name: str = "value") -> int:
    """A whole number from ``1000``, ``1_000``, ``1e6``, ``60k``, ``1.2M`` or ``7B`` (billions)."""
    if _checks.is_int(text):
        return int(text)
    match = re.fullmatch("(-?)" + _NUMBER + r"([kmbgt]?)", str(text).strip().lower().replace("_", "").replace(",", ""))
    value = None
    # Exactly, in decimal (1e30 is not float's 1000000000000000019884624838656), within a sane range.
    if match and abs(_number(match.group(2), match.group(3)) * _COUNT_SUFFIX[match.group(4)]) <= MAX_COUNT:
        value = decimal.Decimal(f"{match.group(1)}{match.group(2)}e{match.group(3) or 0}") * _COUNT_SUFFIX[match.group(4)]
    if value is None or value != value.to_integral_value():
        raise PlanError(
            f"Invalid `{name}`; received {name}={text!r}. Fix: use a whole number up to {MAX_COUNT_TEXT} such as "
            "1000, 60k or 1.2M."
        )
    return int(value)


def format_bytes(value: float | None) -> str:
    """``1.23 GB``-style text (powers of 1000)."""
    if value is None:
        return "-"
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} B"


def format_seconds(value: float | None) -> str:
    """``2 h 13 min``-style text."""
    if value is None:
        return "-"
    if value == 0:
        return "0 s"
    if value < 1e-3:
        return f"{value * 1e6:.3g} µs"
    if value < 1:
        return f"{value * 1e3:.3g} ms"
    if value < 60:
        return f"{value:.3g} s"
    if value < 3600:
        return f"{int(value // 60)} min {value % 60:.0f} s"
    if value < 86400:
        return f"{int(value // 3600)} h {value % 3600 / 60:.0f} min"
    return f"{int(value // 86400)} d {value % 86400 / 3600:.0f} h"
