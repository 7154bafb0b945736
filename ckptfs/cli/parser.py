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
from ckptfs.cli import groups, integrity, mirror, mount, status
from ckptfs.cli.common import CliError, locate
from ckptfs.trust import UntrustedMetadata


def cmd_verify(a: argparse.Namespace) -> int:
    """``ckptfs verify``: every committed file against its digests (integrity), then every
    group at or under PATH against its manifest and COMMIT (G1, files added after the seal).
    One summary line for both, its verdict the exit status's (0 OK, 1 FAILED).  ``s3://...``:
    the mirror's committed groups (cli/mirror.py)."""
    if a.path.startswith("s3://"):
        return mirror.cmd_verify_remote(a)
    rc, words = integrity.verify_files(a)
    inside = True
    try:
        locate(a.path)
    except CliError:
        inside = False  # not inside a ckptfs directory: verify_files said so
    if inside and os.path.isdir(a.path):
        grc, gwords = groups.verify_groups(a)
        rc = 1 if 1 in (rc, grc) else max(rc, grc)  # (a problem found beats "not yours to verify": 2)
        words = f"{words} and {gwords}"
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
    mirror.add_parsers(sub)  # restore
    sub.choices["verify"].set_defaults(func=cmd_verify)
    return p


# mount(8) options that are the kernel's or mount's own business, not ckptfs's (fstab, systemd)
_MOUNT_NOISE = {"rw", "ro", "dev", "nodev", "suid", "nosuid", "exec", "noexec", "auto", "noauto", "user",
                "nouser", "users", "defaults", "nofail", "_netdev", "relatime", "noatime", "atime", "sync",
                "async", "dirsync", "lazytime", "silent", "loud"}
_FLAG_OPTIONS = {"no_format_check", "allow_other", "no_passthrough", "force", "debug"}


def helper_argv(argv: list[str], parser: argparse.ArgumentParser | None = None) -> list[str] | None:
    """fuse3's mount helper (``mount -t fuse.ckptfs SRC DIR -o OPTS``: /etc/fstab, systemd .mount
    units) runs ``ckptfs SRC DIR -o rw,commit=async,keep_last=3,...``; the ``ckptfs mount`` argv
    for it, or None if ``argv`` is an ordinary command line.  ``key=value`` becomes
    ``--key value`` (``_`` as ``-``), a bare ``no_passthrough`` ``--no-passthrough``; mount's own
    options (rw, dev, suid, noauto, x-systemd.*, ...) are dropped.  SRC == DIR mounts in place."""
    if len(argv) < 2 or not (os.path.isabs(argv[0]) and os.path.isabs(argv[1])):
        return None  # (a command's name is never an absolute path)
    src, dst, rest = argv[0], argv[1], argv[2:]
    opts: list[str] = []
    while rest:
        if rest[0] == "-o" and len(rest) > 1:
            opts += [o for o in rest[1].split(",") if o]
            rest = rest[2:]
        else:
            raise CliError(f"mount helper: unexpected argument {rest[0]!r} (want: SRC DIR -o OPTIONS)")
    sub = next(a for a in (parser or build_parser())._actions if isinstance(a, argparse._SubParsersAction))
    known = set(sub.choices["mount"]._option_string_actions)
    out = ["mount", dst]
    if os.path.realpath(src) != os.path.realpath(dst):
        out += ["--backing", src]
    for o in opts:
        key, eq, value = o.partition("=")
        if key in _MOUNT_NOISE or key.startswith("x-"):
            continue
        flag = "--" + key.replace("_", "-")
        if flag not in known:
            raise CliError(f"mount option {o!r}: not a ckptfs option (see ckptfs mount --help)")
        if eq:
            out += [flag, value]
        elif key in _FLAG_OPTIONS:
            out.append(flag)
        else:
            raise CliError(f"mount option {o!r}: not a ckptfs option (see ckptfs mount --help)")
    return out


PATH_ARGS = ("dir", "path", "group", "files", "backing")  # the commands' paths (positional; --backing)


def _refuse_empty_paths(args: argparse.Namespace) -> None:
    """An empty path names nothing (``ls ''``: No such file or directory); ``os.path.abspath('')``
    would make it the current directory, so ``ckptfs mount "$UNSET"`` mounted wherever the shell
    stood and ``recover ''`` recovered it."""
    for name in PATH_ARGS:
        v = getattr(args, name, None)
        for x in v if isinstance(v, list) else [v]:
            if isinstance(x, str) and x == "":
                raise CliError(f"'': no such file or directory (an empty {name.upper()} argument)")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        helper = helper_argv(argv, parser)
    except CliError as e:
        print(f"ckptfs: error: {e}", file=sys.stderr)
        return e.code
    args = parser.parse_args(helper if helper is not None else argv)
    try:
        _refuse_empty_paths(args)
        rc = args.func(args)
        sys.stdout.flush()  # here, where a reader gone away is handled below, not at interpreter exit
        return rc
    except CliError as e:
        print(f"ckptfs: error: {e}", file=sys.stderr)
        return e.code
    except UntrustedMetadata as e:
        print(f"ckptfs: error: {e}", file=sys.stderr)  # nothing was read, changed or deleted
        return 2
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
