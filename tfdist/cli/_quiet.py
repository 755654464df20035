"""A quiet TensorFlow start for the CLI: its C++ start-up lines are hidden, tfdist's own lines stay.

Importing TensorFlow and initializing its devices prints lines such as the CPU feature guard,
oneDNN's notice, CUDA probing on a machine without a GPU ("Could not find cuda drivers",
"failed call to cuInit") and absl's "All log messages before absl::InitializeLog()". Some are
printed before TensorFlow reads ``TF_CPP_MIN_LOG_LEVEL``, so no variable hides them all.
``import_tensorflow`` sets that variable (INFO and WARNING hidden) and runs the import and the
device discovery with the process's stderr (file descriptor 2) sent to a temporary file; the
known start-up lines are dropped and everything else is written to stderr as it came. A user
who set ``TF_CPP_MIN_LOG_LEVEL`` themselves, or passed ``tfdist --verbose``, sees everything.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile

from tfdist import env

_NOISE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|[IW]\d{4} .*"  # C++ INFO and WARNING lines: I0000 00:00:1795419972.085526  14325 file.cc:31] ...
    r"|E\d{4} .*(cuInit|cuda_platform|cuda drivers|Unable to register cu(DNN|FFT|BLAS) factory).*"
    r"|.*oneDNN custom operations are on.*|.*cpu_feature_guard.*"
    r"|To enable the following instructions: .*|.*rebuild TensorFlow with the appropriate compiler flags\.)$"
)
_verbose = False


def set_verbose(verbose: bool) -> None:
    """``tfdist --verbose``: leave TensorFlow's logging alone."""
    global _verbose
    _verbose = verbose


def is_noise(line: str) -> bool:
    return _NOISE.match(line.rstrip("\n")) is not None


def import_tensorflow():
    """Imports TensorFlow and discovers its devices, hiding the start-up lines; returns the module."""
    if "tensorflow" in sys.modules or _verbose or env.get(env.TF_CPP_MIN_LOG_LEVEL) is not None:
        import tensorflow as tf

        return tf
    os.environ[env.TF_CPP_MIN_LOG_LEVEL] = env.QUIET_TF_CPP_MIN_LOG_LEVEL
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow as tf

            tf.config.list_physical_devices()  # initializes the platforms (CUDA probing prints here)
        except BaseException:
            _restore(saved, captured, keep_everything=True)
            raise
        _restore(saved, captured, keep_everything=False)
    return tf


def _restore(saved: int, captured, *, keep_everything: bool) -> None:
    sys.stderr.flush()
    os.dup2(saved, 2)
    os.close(saved)
    captured.seek(0)
    text = captured.read().decode("utf-8", errors="replace")
    kept = [line for line in text.splitlines(keepends=True) if keep_everything or not is_noise(line)]
    if kept:
        sys.stderr.write("".join(kept))
        sys.stderr.flush()
