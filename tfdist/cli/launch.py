"""``tfdist launch``: run a command as every task of a local cluster, restarting it on failure."""

from __future__ import annotations

import argparse
import sys

_EPILOG = """\
failure policy:
  synchronous job (no --ps): a task that fails stops the others, and the whole
    cluster restarts on fresh ports with TFDIST_RESTART=<n>, at most --max-restarts times.
  parameter-server job (--ps M): the chief's exit ends the job; a dead worker restarts
    alone on its port; a dead ps or chief restarts the whole cluster.
  the evaluator is a sidecar: stopped when training ends, never restarted alone. There,
    tfdist train and a Python script's tfdist.fit score each new checkpoint.
  exit code 75 (preempted) restarts like any failure and counts towards --max-restarts.
  exit code 2 (bad input: a refused model, bad data, an invalid option) ends the launch
    at once with code 2: a restart would fail the same way. A Python script that dies of a
    tfdist bad-input error exits with 2 too when launched.
  the same failure twice in a row (same task, same exit code other than 75) before any
    task trained a step ends the launch after one restart, with that task's last lines.

security: tasks listen on --host (127.0.0.1 by default). TensorFlow's gRPC has no
authentication: run a cluster on other addresses only inside a trusted network.

example:
  tfdist launch --workers 2 -- tfdist train --epochs 1
"""


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "launch",
        usage="tfdist launch --workers N [--ps M] [--chief] [--evaluator] [--max-restarts K]\n"
        "                     [--port-base P] [--host HOST] [--startup-timeout S] [--grace S]\n"
        "                     [--finish-timeout S] [--evaluator-timeout S]\n"
        "                     -- COMMAND [ARGS...]",
        help="run a command as every task of a local cluster (TF_CONFIG, free ports, restarts)",
        description="Starts the tasks of a cluster on this machine, each running COMMAND with its own "
        "TF_CONFIG on free ports; prefixes every output line with the task's name; forwards Ctrl-C "
        "and SIGTERM; restarts after failures. Exits with the job's exit code.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # Numbers are read as text and converted in run(), so that a bad value gives
    # tfdist's one-line error rather than argparse's usage text.
    parser.add_argument("--workers", metavar="N", help="worker tasks (required, at least 1)")
    parser.add_argument("--ps", metavar="M", default="0", help="parameter-server tasks (default 0); implies --chief")
    parser.add_argument("--chief", action="store_true", help="add a chief task")
    parser.add_argument("--evaluator", action="store_true", help="add an evaluator sidecar task")
    parser.add_argument(
        "--max-restarts", metavar="K", default="3",
        help="whole-cluster restarts (and lone restarts per worker in a ps job) allowed (default 3)",
    )
    parser.add_argument(
        "--port-base", metavar="P", default=None,
        help="use consecutive free ports from P (default: any free ports)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address every task binds (default 127.0.0.1)")
    parser.add_argument(
        "--startup-timeout", metavar="S", default=None,
        help="seconds each task waits for its peers (sets TFDIST_STARTUP_TIMEOUT; default: inherited or 60)",
    )
    parser.add_argument(
        "--grace", metavar="S", default="30",
        help="seconds between SIGTERM and SIGKILL when tasks are stopped (default 30)",
    )
    parser.add_argument(
        "--finish-timeout", metavar="S", default="60",
        help="seconds the other training tasks have to exit after the chief (else worker 0) exited 0; one still "
        "running then is stopped, and that is a failure (default 60)",
    )
    parser.add_argument(
        "--evaluator-timeout", metavar="S", default="600",
        help="seconds the --evaluator has, after training finished, to evaluate the last checkpoint and exit; then "
        "it is stopped (default 600)",
    )
    parser.add_argument(
        "command", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARGS...]",
        help="the command every task runs, after `--`",
    )
    parser.set_defaults(func=run)


def _number(flag: str, raw: str | None, kind: type, example: str):
    from tfdist.errors import LaunchError

    if raw is None:
        return None
    try:
        return kind(raw)
    except ValueError:
        noun = "an integer" if kind is int else "a number"
        raise LaunchError(f"{flag} must be {noun}; received {flag} {raw!r}. Fix: pass e.g. {flag} {example}.") from None


def options_from_args(args: argparse.Namespace):
    """The ``LaunchOptions`` of parsed ``tfdist launch`` arguments."""
    from tfdist.errors import LaunchError
    from tfdist.launch import LaunchOptions

    if args.workers is None:
        raise LaunchError("--workers is missing; received no --workers. Fix: pass --workers N, e.g. --workers 2.")
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    return LaunchOptions(
        command=command,
        workers=_number("--workers", args.workers, int, "2"),
        ps=_number("--ps", args.ps, int, "1"),
        chief=args.chief,
        evaluator=args.evaluator,
        max_restarts=_number("--max-restarts", args.max_restarts, int, "3"),
        port_base=_number("--port-base", args.port_base, int, "20000"),
        host=args.host,
        startup_timeout=_number("--startup-timeout", args.startup_timeout, float, "60"),
        grace=_number("--grace", args.grace, float, "30"),
        finish_timeout=_number("--finish-timeout", args.finish_timeout, float, "60"),
        evaluator_timeout=_number("--evaluator-timeout", args.evaluator_timeout, float, "600"),
    )


def run(args: argparse.Namespace) -> int:
    from tfdist.launch import Launcher

    options = options_from_args(args)
    if args.evaluator_timeout != "600" and not args.evaluator:
        sys.stderr.write("tfdist: warning: --evaluator-timeout changes nothing without --evaluator (there is no "
                         "evaluator task to wait for).\n")
    result = Launcher(options=options).run()
    return result.exit_code
