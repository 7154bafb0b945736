"""What lives where in the backing directory, and the tree helpers every layer moves it with.

Everything ckptfs keeps for itself is under ``.ckptfs/`` in the backing directory (invisible
through the mount, I4); everything else is the user's files, plain::

    .ckptfs/journal.<epoch>    intent journal (log/journal.py)
    .ckptfs/snapshot           compacted journal state
    .ckptfs/staging/<uuid>     shadow copies being written (engine/staged.py), and empty files
                               made ahead for new versions (engine/pool.py)
    .ckptfs/pool/<uuid>        (where an earlier version made those: recovery empties it)
    .ckptfs/generations/<id>   kept previous versions of overwritten files (engine/generations.py)
    .ckptfs/groups/<id>.*      group MANIFEST and COMMIT (engine/seals.py)
    .ckptfs/quarantine/<id>    torn and corrupt groups moved aside (engine/quarantine.py lists them)
    .ckptfs/quarantine/<id>.resave  the files of a torn re-save a rollback moved aside
    .ckptfs/trash/<id>         files of a sealed group being deleted (G9)
    .ckptfs/daemon.log         the daemon's log
    .ckptfs-committed/         (virtual, mount only) the committed view

Paths are relative to the backing root, without a leading slash ("" is the root).  Every helper
here works through a :class:`~ckptfs.backing.BackingStore` (or on in-memory tables keyed by path).
"""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING

from ckptfs import META_DIR

if TYPE_CHECKING:
    from ckptfs.backing import BackingStore

SNAPSHOT = f"{META_DIR}/snapshot"
STAGING = f"{META_DIR}/staging"
POOL = f"{META_DIR}/pool"
GEN_DIR = f"{META_DIR}/generations"
GROUPS = f"{META_DIR}/groups"
QUARANTINE = f"{META_DIR}/quarantine"
TRASH = f"{META_DIR}/trash"
DAEMON_LOG = f"{META_DIR}/daemon.log"
COMMITTED_VIEW = ".ckptfs-committed"


MAX_PATH_BYTES = 1 << 16  # longest path any metadata may name (PATH_MAX is per call; _at chains fds)


def safe_rel(path: object, meta: str | None = None) -> bool:
    """Whether ``path``, read from metadata someone else may have written (journal, snapshot,
    group records, upload journal, a remote MANIFEST), names something inside the backing root:
    a non-empty relative path of non-empty segments, none ``.`` or ``..``, no NUL, bounded length
    (issue 26: a planted journal entry made root move a file to ``../moved_by_root.txt``).  With
    ``meta``: a path under that ``.ckptfs/`` directory (a generation, a quarantine row); without:
    a user path, never under ``.ckptfs/``."""
    if not isinstance(path, str) or not path or "\0" in path or len(path) > MAX_PATH_BYTES // 4:
        return False
    if path.startswith("/") or any(seg in ("", ".", "..") for seg in path.split("/")):
        return False
    if meta is not None:
        return path.startswith(meta + "/")
    return not is_meta(path)


def journal_path(epoch: int) -> str:
    return f"{META_DIR}/journal.{epoch}"


def is_meta(path: str) -> bool:
    return path == META_DIR or path.startswith(META_DIR + "/")


def is_view(path: str) -> bool:
    return path == COMMITTED_VIEW or path.startswith(COMMITTED_VIEW + "/")


def parent(path: str) -> str:
    return os.path.dirname(path)


def under(path: str, top: str) -> bool:
    """``path`` is ``top`` or inside it ("" contains everything)."""
    return top == "" or path == top or path.startswith(top + "/")


def move_prefix(mapping: dict, src: str, dst: str) -> None:
    """Rename key ``src`` and every key under ``src/`` to live under ``dst``."""
    pre = src + "/"
    for key in [k for k in mapping if k == src or k.startswith(pre)]:
        mapping[dst + key[len(src) :]] = mapping.pop(key)


def swap_prefix(mapping: dict, a: str, b: str) -> None:
    """Exchange key ``a`` (and every key under ``a/``) with key ``b`` (and those under ``b/``):
    ``rename(a, b, RENAME_EXCHANGE)``.  Neither may lie under the other."""
    under_a = {k: mapping.pop(k) for k in [k for k in mapping if k == a or k.startswith(a + "/")]}
    under_b = {k: mapping.pop(k) for k in [k for k in mapping if k == b or k.startswith(b + "/")]}
    for k, v in under_a.items():
        mapping[b + k[len(a):]] = v
    for k, v in under_b.items():
        mapping[a + k[len(b):]] = v


def drop_prefix(mapping: dict, path: str) -> list:
    """Remove key ``path`` and every key under ``path/``; the removed values."""
    pre = path + "/"
    return [mapping.pop(key) for key in [k for k in mapping if k == path or k.startswith(pre)]]


def rmtree(store: BackingStore, path: str) -> None:
    """Remove ``path`` and everything under it through the store."""
    try:
        st = store.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        for name in store.listdir(path):
            rmtree(store, f"{path}/{name}")
        store.rmdir(path)
    else:
        store.unlink(path)


def move_group(store: BackingStore, path: str, to: str) -> None:
    """Move a group directory into .ckptfs (quarantine or trash); idempotent."""
    top = os.path.dirname(to)
    if not store.exists(top):
        store.mkdir(top, 0o700)
        store.fsync_dir(parent(top))
    if store.exists(path) and not store.exists(to):
        store.rename(path, to)
        store.fsync_dir(parent(path))
        store.fsync_dir(top)
    elif store.exists(path):
        # a power loss persisted the earlier move with both names: the moved copy is complete, so
        # the old name goes (found by the model checker, weak model, crash during recovery)
        rmtree(store, path)
        store.fsync_dir(parent(path))


def copy_owner_mode(store: BackingStore, src: str, dst: str) -> None:
    """Give directory ``dst`` the owner, group and mode of ``src`` (best effort: a daemon that is not
    root keeps its own uid)."""
    try:
        st = store.lstat(src)
    except OSError:
        return
    try:
        store.chown(dst, st.st_uid, st.st_gid)
    except OSError:
        pass
    store.chmod(dst, stat.S_IMODE(st.st_mode))


def move_tree_back(store: BackingStore, src: str, dst: str) -> None:
    """Move every file under ``src`` back to the same place under ``dst`` (a name already at
    ``dst`` wins), then remove ``src``: the undo of :func:`move_group`; idempotent.  A directory it
    makes again gets the owner and mode ``src``'s kept (issue 26: an undone deletion came back
    ``root:root 0755``, its user unable to remove it)."""
    if not store.exists(dst):
        store.mkdir(dst, 0o700)
        copy_owner_mode(store, src, dst)
        store.fsync_dir(parent(dst))
    if not store.exists(src):
        return
    for name in store.listdir(src):
        s, d = f"{src}/{name}", f"{dst}/{name}"
        if stat.S_ISDIR(store.lstat(s).st_mode):
            move_tree_back(store, s, d)
        elif not store.exists(d):
            store.rename(s, d)
    store.fsync_dir(dst)
    rmtree(store, src)


def space_held(store: BackingStore) -> dict[str, int]:
    """Bytes (allocated blocks) ckptfs holds under ``.ckptfs/`` out of the user's sight, by kind:
    kept generations, quarantined groups, staging files, trash (issue 25: 174 MB of generations
    beside 174 MB of visible data, with ``du`` through the mount showing half)."""
    out: dict[str, int] = {}
    for kind, top in (("generations", GEN_DIR), ("quarantine", QUARANTINE), ("staging", STAGING),
                      ("trash", TRASH)):
        total, todo = 0, [top]
        while todo:
            d = todo.pop()
            try:
                entries = store.scandir(d)
            except OSError:
                continue
            for name, _ino, kind_bits in entries:
                p = f"{d}/{name}"
                if kind_bits == stat.S_IFDIR:
                    todo.append(p)
                    continue
                try:
                    st = store.lstat(p)
                except OSError:
                    continue
                total += st.st_blocks * 512 if st.st_nlink == 1 else 0  # a link shares its blocks
        out[kind] = total
    return out
