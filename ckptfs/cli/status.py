"""``ckptfs status DIR``: the daemon's state (mounted) or the records on disk (unmounted), as JSON."""

from __future__ import annotations

import argparse
import json
import os
import time

from ckptfs.backing import OsBackingStore
from ckptfs.cli.common import CliError, is_ckptfs_mount
from ckptfs.xattrs import PREFIX, X_ATTRS


def cmd_status(a: argparse.Namespace) -> int:
    d = os.path.abspath(a.dir)
    if not os.path.isdir(d):
        raise CliError(f"{d}: no such directory")
    if is_ckptfs_mount(d):
        attrs = json.loads(os.getxattr(d, X_ATTRS))  # status attributes are never listed
        out = {k.removeprefix(PREFIX): v for k, v in attrs.items()}
        for k in ("stats", "aborts", "corrupt", "metadata", "scrub", "quarantine", "gc_report", "mirror", "space"):
            if k in out:
                out[k] = json.loads(out[k])
        out["mounted"] = True
    else:
        from ckptfs import META_DIR
        from ckptfs.layout import space_held
        from ckptfs.log.journal import CorruptMetadata, Journal
        from ckptfs.log.metadata import load_trusted

        if not os.path.isdir(os.path.join(d, META_DIR)):
            raise CliError(f"{d}: not a ckptfs directory (no {META_DIR}; never mounted)")
        store = OsBackingStore(d)
        try:
            loaded = load_trusted(Journal(store))
            space = space_held(store)
        except CorruptMetadata as e:
            raise CliError(f"{d}: {e}", 1) from None
        finally:
            store.shutdown()
        st = loaded.state
        aborts = st.aborts + [e for e in st.entries if e.get("op") == "abort"]
        out = {"mounted": False, "committed_files": len(st.files),
               "journal_entries": len(st.entries), "aborts": aborts[-10:],
               "metadata": {"status": "corrupt" if loaded.problems else "ok", "problems": loaded.problems},
               "space": space}
    print(json.dumps(out, indent=2))
    return 0


WATCH_KEYS = (("commits", "commits"), ("bytes_committed", "bytes"), ("aborts", "aborts"),
              ("corrupt_detected", "corrupt"), ("slow_commits", "slow"), ("commit_queue_depth", "queued"))


def watch_line(d: str) -> str:
    """One line of ``ckptfs status --watch``: the counters the metrics endpoint serves (metrics.py),
    read from the status xattrs, so it works without ``--metrics``."""
    from ckptfs.xattrs import X_GROUPS, X_MIRROR, X_SCRUB, X_STATS

    st = json.loads(os.getxattr(d, X_STATS))
    groups = json.loads(os.getxattr(d, X_GROUPS))
    scrub = json.loads(os.getxattr(d, X_SCRUB))
    parts = [f"{label} {st.get(key, 0):,}" for key, label in WATCH_KEYS]
    states: dict[str, int] = {}
    for g in groups:
        states[g["state"]] = states.get(g["state"], 0) + 1
    parts.append("groups " + (" ".join(f"{k}={v}" for k, v in sorted(states.items())) or "none"))
    if scrub.get("state") == "running" and scrub.get("bytes_total"):
        parts.append(f"scrub {100 * scrub.get('bytes_done', 0) / scrub['bytes_total']:.0f}%")
    else:
        parts.append(f"scrub {scrub.get('state', 'idle')}")
    try:
        mirror = json.loads(os.getxattr(d, X_MIRROR))
    except OSError:
        mirror = None  # not mirrored
    if mirror is not None:
        parts.append(f"mirror queue {mirror['queue']} pinned {mirror['pinned_groups']}"
                     + (" ALERT" if mirror.get("alert") else "")
                     + (f" error: {mirror['last_error'][:60]}" if mirror.get("last_error") else ""))
    return time.strftime("%H:%M:%S ") + "  ".join(parts)


def cmd_watch(a: argparse.Namespace) -> int:
    d = os.path.abspath(a.dir)
    if not is_ckptfs_mount(d):
        raise CliError(f"{d}: not a ckptfs mount (--watch shows a running daemon)")
    n = 0
    try:
        while a.count is None or n < a.count:
            if n:
                time.sleep(a.interval)
            print(watch_line(d), flush=True)
            n += 1
    except KeyboardInterrupt:
        pass
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("status", help="daemon state, commits and aborted versions")
    s.add_argument("dir")
    s.add_argument("--watch", action="store_true", help="one line of live counters every --interval seconds")
    s.add_argument("--interval", type=float, default=1.0, metavar="SECONDS")
    s.add_argument("--count", type=int, metavar="N", help="--watch: stop after N lines")
    s.add_argument("--json", action="store_true", help="(the default output is JSON already)")
    s.set_defaults(func=lambda a: cmd_watch(a) if a.watch else cmd_status(a))
