"""tfdist's log lines (``tfdist: ...`` on stderr, logger ``tfdist``).

The command line sets them up for itself. ``fit``, ``evaluate`` and ``predict`` show them to a
Python user who has not configured logging (as Lightning does for its own logger): the strategy
chosen, the batch sizes, the checkpoint a run resumed from. Python alone would show warnings only.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
from typing import Any, Callable

NAME = "tfdist"
FORMAT = "tfdist: %(message)s"


class StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record is emitted (a notebook or a test may
    replace it after the handler was made; a handler bound to the old one writes to a closed stream)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):  # StreamHandler.__init__ assigns it
        pass


def _handler() -> logging.Handler:
    handler = StderrHandler()
    handler.setFormatter(logging.Formatter(FORMAT))
    return handler


def setup(verbose: bool = True) -> None:
    """The command line's logging: INFO (or WARNING), not passed on to the root logger."""
    logger = logging.getLogger(NAME)
    if not logger.handlers:
        logger.addHandler(_handler())
    logger.setLevel(logging.INFO if verbose else logging.WARNING)
    logger.propagate = False


@contextlib.contextmanager
def shown(verbose: Any):
    """While the block runs, tfdist's INFO lines go to stderr if nothing else would show them (no
    handler on the ``tfdist`` or the root logger) and ``verbose`` is not 0. They go there only: a
    root handler that appears meanwhile (a library's module-level ``logging.warning`` call adds
    one) does not print them a second time."""
    logger = logging.getLogger(NAME)
    if verbose == 0 or logger.handlers or logging.getLogger().handlers:
        yield
        return
    handler, level, propagate = _handler(), logger.level, logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    if level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def shows_logs(function: Callable) -> Callable:
    """``shown(verbose)`` around a public function that takes ``verbose=``."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        with shown(kwargs.get("verbose", "auto")):
            return function(*args, **kwargs)

    return wrapper
