"""The TensorFlow, Keras and tf_keras versions tfdist supports, and one warning outside them.

The range runs from the oldest set ``.ci/oldest.sh`` tests to the newest set the full suite
tests (docs/versions.md). Reading the versions imports nothing: it asks the package metadata.
"""

from __future__ import annotations

import logging
import re

log = logging.getLogger("tfdist")

# (oldest, newest) release series of each distribution, both ends tested.
SUPPORTED = {
    "tensorflow": ((2, 17), (2, 21)),
    "keras": ((3, 5), (3, 15)),
    "tf-keras": ((2, 17), (2, 21)),
}

_warned = False


def _series(version: str) -> tuple[int, int] | None:
    """(major, minor) of a version string such as ``2.21.0`` or ``2.17.0rc1``; None if it has none."""
    found = re.match(r"(\d+)\.(\d+)", version)
    return (int(found.group(1)), int(found.group(2))) if found else None


def supported_range() -> str:
    """The supported range in words, e.g. ``tensorflow 2.17-2.21, keras 3.5-3.15, tf-keras 2.17-2.21``."""
    return ", ".join(f"{name} {lo[0]}.{lo[1]}-{hi[0]}.{hi[1]}" for name, (lo, hi) in SUPPORTED.items())


def untested(installed: dict[str, str | None]) -> list[str]:
    """``name version`` of each installed distribution outside its supported range.

    Args:
        installed: distribution name to its version, or None where it is not installed (skipped).

    Returns:
        The ones outside ``SUPPORTED``, in its order; empty when every one is inside.
    """
    outside = []
    for name, (lo, hi) in SUPPORTED.items():
        version = installed.get(name)
        series = _series(version) if version else None
        if version and (series is None or not lo <= series <= hi):
            outside.append(f"{name} {version}")
    return outside


def installed_versions() -> dict[str, str | None]:
    """The installed version of each distribution in ``SUPPORTED`` (None when not installed)."""
    from importlib import metadata

    found: dict[str, str | None] = {}
    for name in SUPPORTED:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def warn_if_untested() -> bool:
    """Logs one warning line, once per process, when an installed version is outside the supported range.

    Returns:
        True when this call logged the warning.
    """
    global _warned
    if _warned:
        return False
    outside = untested(installed_versions())
    if not outside:
        return False
    _warned = True
    log.warning("tfdist is untested with %s; it is tested with %s (docs/versions.md)",
                ", ".join(outside), supported_range())
    return True
