"""``python -m tfdist`` runs the command line."""

from tfdist.cli import run

run()
