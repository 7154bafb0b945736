"""The mirror on the command line: ``mount --mirror`` options, ``ckptfs restore``, ``ckptfs verify s3://``.

Exit status: 0 done / everything verified, 1 an operational failure (a corrupt or missing object,
the store unreachable, nothing committed), 2 bad usage.  ``--json`` prints one JSON document on
stdout; progress goes to stderr on a terminal (or with ``--progress``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys
from typing import Any

from ckptfs.cli.common import CliError, is_ckptfs_mount

MiB = 1 << 20
_SIZE_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?", re.I)


def size_arg(v: str) -> int:
    """``10G``, ``512MiB``, ``1048576``: bytes (argparse type)."""
    m = _SIZE_RE.fullmatch(v.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {v!r} (e.g. 512M, 20G)")
    unit = (m.group(2) or "B").upper()[0]
    return int(float(m.group(1)) * {"B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[unit])


def _url(v: str) -> str:
    from ckptfs.mirror.remote import parse_url

    try:
        parse_url(v)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return v


def add_mount_args(m: argparse.ArgumentParser) -> None:
    g = m.add_argument_group("tiered mirror (docs/mirror.md)")
    g.add_argument("--mirror", type=_url, metavar="s3://BUCKET/PREFIX",
                   help="upload every sealed group (and committed files outside groups) to this S3 prefix; "
                        "endpoint and credentials from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ... and ~/.aws")
    g.add_argument("--mirror-node", metavar="NAME", help="this node's name in multi-node groups (default: hostname)")
    g.add_argument("--node-part", action="store_true",
                   help="multi-node saves: this node holds only part of each checkpoint; a group whose "
                        "completion record lands on another node is sealed here when idle (--idle-seal), and "
                        "its remote COMMIT waits for every node's files")
    g.add_argument("--remote-keep-last", type=int, metavar="K", default=0,
                   help="remote retention: keep the newest K committed groups per directory (default: all)")
    g.add_argument("--mirror-pin-cap", type=size_arg, metavar="SIZE", default=0,
                   help="raise an alert (status, metrics) when sealed groups not yet committed remotely "
                        "exceed SIZE (e.g. 200G); seals are never blocked")
    g.add_argument("--mirror-part-size", type=size_arg, metavar="SIZE", default=64 * MiB,
                   help="multipart part size, a multiple of 1 MiB (default 64M)")
    g.add_argument("--mirror-threads", type=int, metavar="N", default=8, help="parallel uploads (default 8)")


def mount_argv(a: argparse.Namespace) -> list[str]:
    """The mirror options to pass on to the foreground daemon."""
    if not a.mirror:
        return []
    out = ["--mirror", a.mirror, "--remote-keep-last", str(a.remote_keep_last), "--mirror-pin-cap",
           str(a.mirror_pin_cap), "--mirror-part-size", str(a.mirror_part_size), "--mirror-threads",
           str(a.mirror_threads)]
    if a.mirror_node:
        out += ["--mirror-node", a.mirror_node]
    if a.node_part:
        out.append("--node-part")
    return out


def check_mount_args(a: argparse.Namespace) -> None:
    if (a.node_part or a.remote_keep_last or a.mirror_node) and not a.mirror:
        raise CliError("--node-part, --remote-keep-last and --mirror-node need --mirror s3://BUCKET/PREFIX")
    if a.mirror_part_size % MiB or a.mirror_part_size < 5 * MiB:
        raise CliError("--mirror-part-size must be a multiple of 1 MiB, at least 5M")
    if a.mirror_threads < 1 or a.remote_keep_last < 0:
        raise CliError("--mirror-threads must be >= 1 and --remote-keep-last >= 0")


def remote_for(url: str):  # type: ignore[no-untyped-def]
    from ckptfs.mirror.remote import Remote, parse_url

    try:
        return Remote(parse_url(url))
    except ValueError as e:
        raise CliError(str(e)) from None
    except Exception as e:  # botocore: no region, bad endpoint
        raise CliError(f"{url}: cannot make an S3 client: {e}", 1) from None


def start_mirror(fs: Any, a: argparse.Namespace) -> Any:
    """In the daemon: the uploader for ``--mirror`` (MirrorRefused: a clear error, nothing mounted)."""
    from ckptfs.mirror.remote import MirrorRefused
    from ckptfs.mirror.uploader import Mirror

    remote = remote_for(a.mirror)
    try:
        return Mirror(fs, remote, a.mirror_node or socket.gethostname(), part_size=a.mirror_part_size,
                      threads=a.mirror_threads, pin_cap=a.mirror_pin_cap, remote_keep_last=a.remote_keep_last,
                      node_part=a.node_part).start()
    except MirrorRefused as e:
        raise CliError(str(e), 1) from None


def _bar(a: argparse.Namespace):  # type: ignore[no-untyped-def]
    from ckptfs.integrity.verify import ProgressBar

    on = a.progress or (sys.stderr.isatty() and not a.json)
    return (lambda total: ProgressBar(total, on)) if on else None


def cmd_restore(a: argparse.Namespace) -> int:
    from ckptfs.mirror.remote import RemoteError
    from ckptfs.mirror.restore import RestoreError, restore

    dest = os.path.abspath(a.dir)
    if not os.path.isdir(dest):
        raise CliError(f"{a.dir}: no such directory (make it first)")
    remote = remote_for(a.url)
    mounted = is_ckptfs_mount(dest)
    try:
        rep = restore(remote, dest, a.group, threads=a.threads, mounted=mounted, replace=a.replace,
                      progress_factory=_bar(a))
    except (RestoreError, RemoteError) as e:
        if a.json:
            print(json.dumps({"ok": False, "error": str(e)}))
        raise CliError(f"restore failed: {e}", 1) from None
    if a.json:
        print(json.dumps({"ok": True, **rep}, sort_keys=True))
    else:
        mib = rep["bytes"] / MiB
        print(f"ckptfs: restored {rep['group']} ({rep['files']} files, {mib:.1f} MiB, "
              f"{mib / max(rep['seconds'], 1e-6):.0f} MiB/s) into {rep['into']}: sealed")
    return 0


def cmd_verify_remote(a: argparse.Namespace) -> int:
    from ckptfs.mirror.remote import RemoteError
    from ckptfs.mirror.restore import RestoreError, verify

    remote = remote_for(a.path)
    bar = None
    try:
        if a.read_data:
            from ckptfs.mirror.restore import committed_groups

            total = 0
            if _bar(a):
                from ckptfs.mirror.restore import load_manifest

                total = sum(load_manifest(remote, g).bytes for g in committed_groups(remote))
                bar = _bar(a)(total)  # type: ignore[misc]
        found = verify(remote, a.group, read_data=a.read_data, progress=bar)
    except (RestoreError, RemoteError) as e:
        raise CliError(f"verify {a.path}: {e}", 1) from None
    finally:
        if bar is not None:
            bar.finish()
    bad = [f for f in found if not f["ok"]]
    if a.json:
        print(json.dumps(found, sort_keys=True))
    else:
        for f in found:
            if f["ok"]:
                print(f"ok      {f['group']} ({f['files']} files, {f['bytes'] / MiB:.1f} MiB)")
            else:
                for p in f["problems"]:
                    print(f"FAILED  {f['group']}: {p}")
    how = "objects read and hashed" if a.read_data else "sizes and checksums"
    print(f"ckptfs: verified {len(found)} remote groups ({how}): {'FAILED' if bad or not found else 'OK'}"
          + ("" if found else " (no committed group)"), file=sys.stderr if a.json else sys.stdout)
    return 1 if bad or not found else 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("restore", help="restore the newest (or a named) committed group from the mirror")
    r.add_argument("url", type=_url, metavar="s3://BUCKET/PREFIX")
    r.add_argument("dir", help="directory to restore into (a ckptfs mount, or an unmounted directory)")
    r.add_argument("--group", metavar="NAME", help="the group's path or name (default: the newest committed)")
    r.add_argument("--replace", action="store_true", help="restore over an existing directory of that name")
    r.add_argument("--threads", type=int, default=8, help="parallel ranged GETs (default 8)")
    r.add_argument("--progress", action="store_true", help="progress bar on stderr even when not a tty")
    r.add_argument("--json", action="store_true", help="one JSON summary on stdout")
    r.set_defaults(func=cmd_restore)
