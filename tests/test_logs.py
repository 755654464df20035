"""tfdist's log lines: shown to a Python user who configured no logging, left to those who did."""

import logging

from tfdist import _logs


def _unconfigured(monkeypatch):
    logger = logging.getLogger(_logs.NAME)
    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # pytest's own capture handlers, for this test
    monkeypatch.setattr(logger, "handlers", [])
    monkeypatch.setattr(logger, "propagate", True)
    logger.setLevel(logging.NOTSET)
    monkeypatch.setattr(logger, "level", logging.NOTSET)
    return logger


def test_info_lines_reach_stderr_while_a_public_call_runs_when_nothing_else_would_show_them(monkeypatch, capsys):
    logger = _unconfigured(monkeypatch)

    @_logs.shows_logs
    def fit(*, verbose="auto"):
        logger.info("resuming from ckpt-40")
        return verbose

    assert fit() == "auto" and fit.__name__ == "fit"
    assert capsys.readouterr().err == "tfdist: resuming from ckpt-40\n"
    assert fit(verbose=0) == 0 and capsys.readouterr().err == ""  # verbose=0: silent, as Keras' fit
    assert logger.handlers == [] and logger.level == logging.NOTSET and logger.propagate  # as it was
    logger.info("after the call")
    assert capsys.readouterr().err == ""


def test_a_root_handler_a_library_adds_during_a_call_neither_doubles_nor_hides_the_lines(monkeypatch, capsys):
    logger = _unconfigured(monkeypatch)
    with _logs.shown("auto"):
        # absl's logging functions (TensorFlow's first asynchronous save) call logging.basicConfig():
        logging.warning("a library's own line")  # on the root logger with no handler: adds one
        assert logging.getLogger().handlers
        logger.warning("SIGTERM received")
    assert capsys.readouterr().err.count("SIGTERM received") == 1
    # A second call (a notebook's next fit, or fit again after Ctrl-C) still shows its INFO lines:
    # that handler is not the user's configuration.
    with _logs.shown("auto"):
        logger.info("resuming from ckpt-40")
    assert capsys.readouterr().err == "tfdist: resuming from ckpt-40\n"


def test_a_root_handler_a_library_adds_during_a_silent_call_does_not_silence_the_next(monkeypatch, capsys):
    logger = _unconfigured(monkeypatch)
    with _logs.shown(0):  # fit(verbose=0) first in a notebook: its first asynchronous save adds one
        logging.warning("a library's own line")
        assert logging.getLogger().handlers
    capsys.readouterr()
    with _logs.shown("auto"):  # then fit() again: its lines show
        logger.info("resuming from ckpt-40")
    assert capsys.readouterr().err == "tfdist: resuming from ckpt-40\n"


def test_a_user_who_configured_logging_gets_the_lines_through_their_own_handlers_only(monkeypatch, capsys):
    logger = _unconfigured(monkeypatch)
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    monkeypatch.setattr(logging.getLogger(), "handlers", [Keep()])
    with _logs.shown("auto"):
        logger.warning("a warning")
        assert logger.handlers == []
    assert records == ["a warning"] and capsys.readouterr().err == ""
