"""The ``tfdist`` command: one subcommand a module, each with ``register`` and ``run``.

Subcommand modules import TensorFlow only inside ``run``, so ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from typing import Sequence

from tfdist import _logs
from tfdist._version import __version__

COMMANDS = {
    "train": "tfdist.cli.train",
    "evaluate": "tfdist.cli.evaluate",
    "predict": "tfdist.cli.predict",
    "env": "tfdist.cli.env",
    "ckpt": "tfdist.cli.ckpt",
    "launch": "tfdist.cli.launch",
    "cluster": "tfdist.cli.cluster",
    "plan": "tfdist.cli.plan",
}


class _Parser(argparse.ArgumentParser):
    """A usage error is one line that names the command's ``--help``, not argparse's usage block
    first (tfdist train's runs to twenty lines). Subcommands' parsers are of this class too."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}. Fix: see `{self.prog} --help`.\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tfdist",
        description="Distributed Keras training on TensorFlow that never loses work.",
    )
    parser.add_argument("--version", action="version", version=f"tfdist {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="store_true", dest="show_tensorflow_logs",
        help="show TensorFlow's own start-up and C++ log lines (hidden by default unless TF_CPP_MIN_LOG_LEVEL is set)",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for module_name in COMMANDS.values():
        importlib.import_module(module_name).register(subparsers)
    return parser


def _refuse_unknown_options_without_command(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """``tfdist --bogus`` names ``--bogus``: argparse reports the missing COMMAND first, which
    hides the mistyped option (with a command, argparse names it itself)."""
    if any(arg in COMMANDS for arg in argv):
        return
    known = parser._option_string_actions  # noqa: SLF001 -- argparse's table of the options it takes
    unknown = [arg for arg in argv if arg.startswith("-") and arg.split("=")[0] not in known]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")


def _attach_negative_values(argv: list[str]) -> list[str]:
    """``--step-time -1s`` as ``--step-time=-1s``: argparse takes a value that starts with ``-``
    and is not a plain negative number for another option, and says only "expected one
    argument"; attached, the value reaches tfdist's own check, which names it and the fix. Up
    to ``--``: what follows is a launched command's."""
    out: list[str] = []
    for i, token in enumerate(argv):
        if token == "--":
            return out + argv[i:]
        if out and out[-1].startswith("--") and "=" not in out[-1] and re.match(r"-\.?\d", token):
            out[-1] = f"{out[-1]}={token}"
        else:
            out.append(token)
    return out


def _in_slurm_step() -> bool:
    """Inside an srun step of several tasks, where tfdist builds the cluster from Slurm's variables."""
    from tfdist.cluster import slurm_step_tasks

    tasks = slurm_step_tasks()
    return tasks is not None and tasks.isdigit() and int(tasks) > 1


def main(argv: Sequence[str] | None = None) -> int:
    from tfdist._pipes import survive_a_closed_output
    from tfdist.cli import _quiet

    parser = build_parser()
    argv = _attach_negative_values(list(sys.argv[1:] if argv is None else argv))
    _refuse_unknown_options_without_command(parser, argv)
    args = parser.parse_args(argv)
    _logs.setup()
    _quiet.set_verbose(args.show_tensorflow_logs)
    if _in_slurm_step():  # the cluster is read with TensorFlow's Slurm host-list helpers: its start-up lines hidden
        _quiet.import_tensorflow()
    with survive_a_closed_output():  # `tfdist train | tee log` stopped by Ctrl-C: tee is gone first
        return _run_command(args)


def _run_command(args) -> int:
    from tfdist.errors import PeerUnavailableError, TfdistError

    try:
        return int(args.func(args) or 0)
    except PeerUnavailableError as e:
        sys.stderr.write(f"tfdist: error: {e}\n")
        sys.stderr.flush()
        # TensorFlow's shutdown can block on the lost peer; leave without it.
        import os

        os._exit(e.exit_code)
    except TfdistError as e:  # one line, no traceback; 2 for bad input (see tfdist.errors)
        sys.stderr.write(f"tfdist: error: {e}\n")
        return e.exit_code
    except KeyboardInterrupt as e:  # fit's says where training stopped and what was saved
        sys.stderr.write(f"tfdist: {e}\n" if str(e) else "tfdist: interrupted\n")
        return 130


def run() -> None:  # console-script entry point
    try:
        code = main()
    except KeyboardInterrupt:  # Ctrl-C before a command began (e.g. while TensorFlow imports): nothing to save
        sys.stderr.write("tfdist: interrupted\n")
        code = 130
    sys.exit(code)
