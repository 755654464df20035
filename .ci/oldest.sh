#!/usr/bin/env bash
# CI: the oldest supported TensorFlow/Keras/tf_keras set (.ci/oldest-constraints.txt) in its own
# virtual environment, with a smoke subset (tests/oldest_smoke.py): tfdist train, a Keras 3 and a
# tf_keras model killed with SIGKILL and resumed bit-identically under mirrored, a 2-worker launch.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${TFDIST_OLDEST_VENV:-.venv-oldest}"
start=$(date +%s)
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/pip" install --quiet -c .ci/oldest-constraints.txt ".[test]"
"$venv/bin/python" -m pip check
installed=$(date +%s)
export TF_CPP_MIN_LOG_LEVEL=2
"$venv/bin/python" -m pytest -q tests/oldest_smoke.py
echo "oldest set: install $((installed - start)) s, smoke $(($(date +%s) - installed)) s"
