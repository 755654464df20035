"""The engine tests: real Slurm, network namespaces and Ray, each skipped with its reason where
the machine cannot run it. They carry the ``engine`` mark, which the README's test command leaves
out (pytest.ini); ``python -m pytest -m engine tests/engines`` runs them, as ``.ci/run`` does."""

from __future__ import annotations

import pathlib

import pytest

ENGINES = pathlib.Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before -m deselects by mark
def pytest_collection_modifyitems(config, items):
    for item in items:
        if ENGINES in pathlib.Path(item.path).parents:
            item.add_marker(pytest.mark.engine)
