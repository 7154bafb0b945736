"""The ``ckptfs`` argument parser and ``main``: the one module that imports the command modules.

Imports go one way: this module -> command modules (mount, status, integrity,
groups) -> common.  ``ckptfs verify`` spans two of them (files: integrity;
groups: groups), so it is put together here.
"""

from __future__ import annotations

import argparse
import os
import sys

from ckptfs import __version__
from ckptfs.cli import groups, integrity, mount, status
from ckptfs.cli.common import CliError, locate


def cmd_verify(a: argparse.Namespace) -> int:
    """``ckptfs verify``: every committed file against its digests (integrity), then every
    group at or under PATH against its manifest and COMMIT (G1, files added after the seal).
    One summary line for both, its verdict the exit status's (0 OK, 1 FAILED)."""
    rc, words = integrity.verify_files(a)
    inside = True
    try:
        locate(a.path)
    except CliError:
        inside = False  # not inside a ckptfs directory: verify_files said so
    if inside and os.path.isdir(a.path):
        grc, gwords = groups.verify_groups(a)
        rc, words = max(rc, grc), f"{words} and {gwords}"
    integrity.summary_line(rc, words, a.json)
    return rc


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ckptfs", description="crash-consistent checkpoint filesystem")
    p.add_argument("--version", action="version", version=f"ckptfs {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)
    mount.add_parsers(sub)  # mount, umount, recover
    status.add_parsers(sub)
    integrity.add_parsers(sub)  # verify, scrub, forget
    groups.add_parsers(sub)  # ls, show, seal, gc
    sub.choices["verify"].set_defaults(func=cmd_verify)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except CliError as e:
        print(f"ckptfs: error: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # whoever read the output stopped (`ckptfs ls | head`): end quietly, as ls does (no
        # traceback; the exit status a shell reports for SIGPIPE).  Python's final flush of stdout
        # would fail again, so stdout goes to /dev/null first.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except OSError:
            pass
        return 141
