"""``tfdist ckpt list|inspect|verify``: what a checkpoint directory holds, and whether it reads back.

``list`` needs only the file system; ``inspect`` and ``verify`` import TensorFlow inside ``run``.
"""

from __future__ import annotations

import argparse
import json
import time

from tfdist.cli import _quiet


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "ckpt",
        help="list, inspect or verify the checkpoints of a directory",
        description="Looks into a checkpoint directory written by tfdist (or by tf.train.CheckpointManager). "
        "Reads only; changes nothing.",
    )
    commands = parser.add_subparsers(dest="ckpt_command", metavar="{list,inspect,verify}")
    commands.required = True

    listing = commands.add_parser(
        "list",
        help="the complete checkpoints, oldest first, and any incomplete files",
        description="Lists the checkpoints the `checkpoint` state file names (oldest first) with global step, "
        "epoch, step in epoch, save time, size and whether the run was complete, then the checkpoint-like "
        "files it does not name (saves in flight or interrupted, moved-aside checkpoints).",
    )
    listing.add_argument("directory", metavar="DIR", help="a checkpoint directory")
    listing.add_argument("--json", action="store_true", help="print one JSON array")

    inspect = commands.add_parser(
        "inspect",
        help="the metadata and saved variables of the latest (or a given) checkpoint",
        description="Prints the tfdist metadata of a checkpoint and its saved variables (name, shape, dtype) "
        "with their count, parameters and bytes.",
    )
    inspect.add_argument("path", metavar="DIR_OR_PREFIX", help="a directory (its latest checkpoint) or DIR/ckpt-N")
    inspect.add_argument("--json", action="store_true", help="print one JSON object")

    verify = commands.add_parser(
        "verify",
        help="read every tensor back and check the files; exit 1 if any checkpoint is bad",
        description="Reads every tensor of the latest checkpoint (every listed one with --all); TensorFlow "
        "checks each tensor's checksum. Also checks that the index, every data shard and the metadata "
        "exist, that no shard is truncated, and that the metadata's global step matches. Exit status: "
        "0 all good, 1 any checkpoint corrupt or incomplete, 2 bad arguments.",
    )
    verify.add_argument("path", metavar="DIR", help="a checkpoint directory (or a prefix DIR/ckpt-N)")
    verify.add_argument("--all", action="store_true", dest="every", help="verify every listed checkpoint")
    verify.add_argument("--json", action="store_true", help="print one JSON array")
    parser.set_defaults(func=run)


def _when(seconds: float | None) -> str:
    return "-" if seconds is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


def _text(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _table(rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells).rstrip())
    return lines


def run_list(args: argparse.Namespace) -> int:
    from tfdist import storage
    from tfdist.checkpoint import ownership
    from tfdist.checkpoint.inspect import checkpoint_dir, list_checkpoints
    from tfdist.planning.units import format_bytes

    if storage.is_url(args.directory):  # a local directory is listed without TensorFlow
        _quiet.import_tensorflow()
    entries = list_checkpoints(args.directory)
    if args.json:
        print(json.dumps([e.to_json() for e in entries], indent=2))
        return 0
    listed = [e for e in entries if e.listed]
    kept = [e for e in entries if e.kept]
    others = [e for e in entries if not e.listed and not e.kept]
    if listed:
        print(f"{len(listed)} checkpoint(s) in {storage.dirname(listed[0].path)}, oldest first:")
        rows = [["step", "epoch", "in epoch", "saved", "size", "run complete", "checkpoint"]]
        for e in listed:
            note = "  (latest)" if e is listed[-1] else ""
            note += f"  problem: {e.problem}" if e.problem else ""
            rows.append([
                _text(e.global_step), _text(e.epoch), _text(e.step_in_epoch), _when(e.saved_at),
                format_bytes(e.size_bytes), _text(e.complete), storage.basename(e.path) + note,
            ])
        print("\n".join("  " + line for line in _table(rows, right={0, 1, 2, 4})))
    else:
        print(f"no complete checkpoint in {args.directory} (no `checkpoint` state file naming one)")
    if kept:
        print(f"kept by keep_every_hours (complete; TensorFlow's manager no longer lists them): {len(kept)}")
        for e in kept:
            print(f"  {storage.basename(e.path)}  step {_text(e.global_step)}  {format_bytes(e.size_bytes)}  "
                  f"{_when(e.saved_at)}")
    if others:
        print(f"incomplete (not named in the state file `checkpoint`): {len(others)}")
        for e in others:
            print(f"  {storage.basename(e.path)}  {format_bytes(e.size_bytes)}  {_when(e.saved_at)}  {e.problem}")
    writer = ownership.current(checkpoint_dir(args.directory))
    if writer is not None:
        print(f"writer: {writer.describe()}" + ("" if writer.ended_at is not None else " (still running, or killed)"))
    return 0


def _metadata_lines(metadata: dict) -> list[str]:
    from tfdist.checkpoint import layout

    width = max(len(k) for k in metadata)
    lines = []
    for key in sorted(metadata):
        value = metadata[key]
        if key == layout.SAVED_AT and isinstance(value, (int, float)):
            text = f"{_when(value)} ({value})"
        elif key == layout.HISTORY and isinstance(value, list):
            text = f"{len(value)} epoch(s)"
            if value and isinstance(value[-1], dict):
                last = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in value[-1].items())
                text += f"; last: {last}"
        else:
            text = json.dumps(value) if isinstance(value, (dict, list, str)) else _text(value)
        lines.append(f"  {key.ljust(width)}  {text}")
    return lines


def run_inspect(args: argparse.Namespace) -> int:
    from tfdist import storage
    from tfdist.checkpoint import layout

    _quiet.import_tensorflow()
    from tfdist.checkpoint.inspect import inspect_checkpoint
    from tfdist.planning.units import format_bytes

    info = inspect_checkpoint(args.path)
    if args.json:
        print(json.dumps(info, indent=2, default=float))
        return 0
    print(f"checkpoint {info['path']}  ({format_bytes(info['size_bytes'])} in {len(info['files'])} file(s))")
    metadata = info["metadata"]
    if metadata:
        print(f"metadata ({storage.basename(info['metadata_path'])}):")
        print("\n".join(_metadata_lines(metadata)))
    else:
        print(f"metadata: none ({storage.basename(info['metadata_path'])} is missing or unreadable)")
    summary = info["summary"]
    print(f"variables: {summary['count']}, {summary['parameters']:,} parameters, {format_bytes(summary['bytes'])}")
    for group, counts in sorted(summary["groups"].items()):
        print(f"  {group}: {counts['count']} variable(s), {counts['parameters']:,} parameters, "
              f"{format_bytes(counts['bytes'])}")
    rows = [["name", "shape", "dtype"]]
    for v in info["variables"]:
        rows.append([layout.short_key(v["name"]), str(v["shape"]), v["dtype"] or "-"])
    print("\n".join("  " + line for line in _table(rows, right=set())))
    return 0


def run_verify(args: argparse.Namespace) -> int:
    _quiet.import_tensorflow()
    from tfdist.checkpoint.inspect import verify
    from tfdist.env import EXIT_FAILED, EXIT_OK
    from tfdist.planning.units import format_bytes

    results, leftovers = verify(args.path, every=args.every)
    if args.json:  # the incomplete files are noted, not verified: ok is unknown
        notes = [{"path": e.path, "ok": None, "problem": e.problem, "verified": False} for e in leftovers]
        print(json.dumps([r.to_json() for r in results] + notes, indent=2))
    else:
        for r in results:
            if r.ok:
                print(f"OK    {r.path}  ({r.tensors} tensors, {format_bytes(r.bytes_read)} read, checksums match)")
            else:
                print(f"BAD   {r.path}: {r.problem}")
        for e in leftovers:
            print(f"note  {e.path}: incomplete, not verified: {e.problem}")
    return EXIT_OK if all(r.ok for r in results) else EXIT_FAILED


_RUN = {"list": run_list, "inspect": run_inspect, "verify": run_verify}


def run(args: argparse.Namespace) -> int:
    from tfdist import storage

    path = getattr(args, "directory", None) or args.path
    if storage.is_url(path):  # a scheme TensorFlow lacks, or storage it cannot reach: one line with the fix
        _quiet.import_tensorflow()
        storage.check_supported(path, what="the path")
    return _RUN[args.ckpt_command](args)
