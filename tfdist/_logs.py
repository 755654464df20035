"""tfdist's log lines (``tfdist: ...`` on stderr, logger ``tfdist``).

The command line sets them up for itself. ``fit``, ``evaluate`` and ``predict`` show them to a
Python user who has not configured logging (as Lightning does for its own logger): the strategy
chosen, the batch sizes, the checkpoint a run resumed from. Python alone would show warnings only.
TensorFlow's retracing warning about the functions tfdist makes once per fit is kept quiet
(``without_retracing_warning``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
import weakref
from typing import Any, Callable

NAME = "tfdist"
FORMAT = "tfdist: %(message)s"

# Root handlers that appeared while a public call showed the lines itself: a library running in
# it added them, not the user (absl's logging functions call logging.basicConfig() when the root
# logger has no handler; TensorFlow's first asynchronous save does). They do not count as the
# user's configuration in later calls, whose lines they would drop (the root logger's level).
_ADDED_BY_LIBRARIES: "weakref.WeakSet[logging.Handler]" = weakref.WeakSet()


class StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record is emitted (a notebook or a test may
    replace it after the handler was made; a handler bound to the old one writes to a closed stream)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):  # StreamHandler.__init__ assigns it
        pass


def without_retracing_warning(function: Any) -> Any:
    """``function``, a ``tf.function`` tfdist makes once per ``fit``, without TensorFlow's
    "excessive retracing" warning (``_compat.tensorflow.omit_retracing_warning``): TensorFlow counts
    traces by the code, not the object, so a notebook's later fits were warned of a retracing
    loop that is not there, naming tfdist's own functions."""
    from tfdist._compat import tensorflow as tf_compat

    return tf_compat.omit_retracing_warning(function)


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
    handler on the ``tfdist`` or the root logger, other than one a library added during an earlier
    call) and ``verbose`` is not 0. They go there only: a root handler that appears meanwhile (a
    library's module-level ``logging.warning`` call adds one) does not print them a second time."""
    logger, root = logging.getLogger(NAME), logging.getLogger()
    before = list(root.handlers)
    if verbose == 0 or logger.handlers or [h for h in root.handlers if h not in _ADDED_BY_LIBRARIES]:
        try:
            yield
        finally:  # a verbose=0 call too: its handlers must not silence the next call's lines
            _ADDED_BY_LIBRARIES.update(h for h in root.handlers if h not in before)
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
        _ADDED_BY_LIBRARIES.update(h for h in root.handlers if h not in before)


def shows_logs(function: Callable) -> Callable:
    """``shown(verbose)`` around a public function that takes ``verbose=``."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        with shown(kwargs.get("verbose", "auto")):
            return function(*args, **kwargs)

    return wrapper
