"""The ``tfdist`` command: one subcommand a module, each with ``register`` and ``run``.

Subcommand modules import TensorFlow only inside ``run``, so ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import Sequence

from tfdist._version import __version__

COMMANDS = {
    "train": "tfdist.cli.train",
    "env": "tfdist.cli.env",
    "ckpt": "tfdist.cli.ckpt",
    "launch": "tfdist.cli.launch",
    "cluster": "tfdist.cli.cluster",
    "plan": "tfdist.cli.plan",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tfdist",
        description="Distributed Keras training on TensorFlow that never loses work.",
    )
    parser.add_argument("--version", action="version", version=f"tfdist {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for module_name in COMMANDS.values():
        importlib.import_module(module_name).register(subparsers)
    return parser


def setup_logging(verbose: bool = True) -> None:
    logger = logging.getLogger("tfdist")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("tfdist: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO if verbose else logging.WARNING)
    logger.propagate = False


def main(argv: Sequence[str] | None = None) -> int:
    from tfdist.env import EXIT_PEER_LOST, EXIT_USAGE
    from tfdist.errors import PeerUnavailableError, TfdistError

    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging()
    try:
        return int(args.func(args) or 0)
    except PeerUnavailableError as e:
        sys.stderr.write(f"tfdist: error: {e}\n")
        sys.stderr.flush()
        # TensorFlow's shutdown can block on the lost peer; leave without it.
        import os

        os._exit(EXIT_PEER_LOST)
    except TfdistError as e:
        sys.stderr.write(f"tfdist: error: {e}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        sys.stderr.write("tfdist: interrupted\n")
        return 130


def run() -> None:  # console-script entry point
    sys.exit(main())
