"""``ckptfs status DIR``: the daemon's state (mounted) or the records on disk (unmounted), as JSON."""

from __future__ import annotations

import argparse
import json
import os

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
        for k in ("stats", "aborts", "corrupt", "metadata", "scrub", "quarantine", "gc_report"):
            if k in out:
                out[k] = json.loads(out[k])
        out["mounted"] = True
    else:
        from ckptfs.log.journal import CorruptMetadata, Journal
        from ckptfs.log.metadata import load_trusted

        store = OsBackingStore(d)
        try:
            loaded = load_trusted(Journal(store))
        except CorruptMetadata as e:
            raise CliError(f"{d}: {e}", 1) from None
        finally:
            store.shutdown()
        st = loaded.state
        aborts = st.aborts + [e for e in st.entries if e.get("op") == "abort"]
        out = {"mounted": False, "committed_files": len(st.files),
               "journal_entries": len(st.entries), "aborts": aborts[-10:],
               "metadata": {"status": "corrupt" if loaded.problems else "ok", "problems": loaded.problems}}
    print(json.dumps(out, indent=2))
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("status", help="daemon state, commits and aborted versions")
    s.add_argument("dir")
    s.set_defaults(func=cmd_status)
