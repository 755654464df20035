"""The one place tfdist reaches into private parts of TensorFlow and Keras, each entry failing loudly.

tfdist needs a few things no public API offers: the error of a background checkpoint write,
a model's layers in order, Keras' symbolic build. Every such access is a small named function
in a module of this package: ``tensorflow`` (TensorFlow's own internals), ``keras3``,
``tf_keras`` and ``keras_common`` (what both Keras share). Each says what it reaches, why no
public API does it, and the versions it was checked on. A missing private attribute raises
:class:`~tfdist.errors.CompatibilityError` naming the installed versions; no entry returns
``None`` in its place. ``versions`` states the supported range and warns outside it.
``tests/test_architecture.py`` keeps every other module away from these internals.
"""

from __future__ import annotations

from typing import Any

from tfdist.errors import CompatibilityError

def installed() -> str:
    """The installed TensorFlow, Keras and tf_keras versions, from the package metadata."""
    from importlib import metadata

    found = []
    for label, package in (("TensorFlow", "tensorflow"), ("Keras", "keras"), ("tf_keras", "tf-keras")):
        try:
            found.append(f"{label} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            found.append(f"{label} (not installed)")
    return ", ".join(found)


def missing(entry: str, what: str) -> CompatibilityError:
    """The error of an entry whose private target ``what`` is not there."""
    from tfdist._compat.versions import supported_range

    return CompatibilityError(
        f"tfdist._compat.{entry}: {what} is not there under {installed()}; tfdist is tested with "
        f"{supported_range()}. "
        "Fix: install a tested version set (docs/versions.md), or report the versions to tfdist."
    )


def private(obj: Any, name: str, entry: str) -> Any:
    """``obj.name``, a private attribute an entry relies on; raises when the object lacks it."""
    try:
        return getattr(obj, name)
    except AttributeError:
        raise missing(entry, f"{type(obj).__module__}.{type(obj).__name__}.{name}") from None


def require(obj: Any, name: str, entry: str) -> None:
    """Raises unless ``obj`` has the private attribute ``name`` that an entry is about to set."""
    if not hasattr(obj, name):
        raise missing(entry, f"{type(obj).__module__}.{type(obj).__name__}.{name}")
