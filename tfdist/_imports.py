"""Work that waits for a package to be imported: ``when_imported`` runs it right after the import.

tfdist prepares tf_keras (its seed, its random generators) before a model function runs, and
that function may or may not import tf_keras. Importing it up front costs every Keras 3 process
a third of a second; ``when_imported`` prepares it at the moment something imports it instead.
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from types import ModuleType
from typing import Callable

_waiting: dict[str, list[Callable[[ModuleType], None]]] = {}
_lock = threading.Lock()


def when_imported(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Calls ``callback(module)`` now if the top-level package ``name`` is imported, else right
    after its first import, before the importer gets the module.

    Args:
      name: a top-level package name, such as ``"tf_keras"``.
      callback: takes the imported module. An exception it raises propagates to the importer.
    """
    with _lock:
        module = sys.modules.get(name)
        if module is None:
            _waiting.setdefault(name, []).append(callback)
            if _FINDER not in sys.meta_path:
                sys.meta_path.insert(0, _FINDER)
            return
    callback(module)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds a waited-for package with the other finders and gives it a loader that runs the work."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _waiting:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _ThenRun(spec.loader)
        return spec


class _ThenRun(importlib.abc.Loader):
    """The package's own loader, followed by the work waiting for the package."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        module.__loader__ = module.__spec__.loader = self.loader  # the package keeps its own loader
        with _lock:
            callbacks = _waiting.pop(module.__name__, [])
        for callback in callbacks:
            callback(module)

    def __getattr__(self, name):  # the rest of the loader's interface: get_resource_reader, get_source, ...
        return getattr(self.loader, name)


_FINDER = _AfterImport()
