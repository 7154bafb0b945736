"""The Python API for training and resume scripts: :func:`status`, :func:`latest`, :func:`wait_sealed`.

Each works on a mounted directory (through the daemon's status xattrs, ``user.ckptfs.*``) and on
an unmounted one (from its metadata, read-only: :mod:`ckptfs.offline`).  ``ckptfs latest DIR``
is :func:`latest` on the command line::

    import ckptfs
    resume_from = ckptfs.latest("/ckpts/run1")          # None: start from scratch
    ckptfs.wait_sealed("/ckpts/run1/checkpoint-500", timeout=600)

Invariants: nothing here changes a directory (no control verb is set); a group is returned by
:func:`latest` only if it is sealed (its manifest and COMMIT are durable), a file only if it is
committed; the order between groups is the one retention and recovery use (the higher step, then
the later seal: ``GroupState.order``).
"""

from __future__ import annotations

import calendar
import json
import os
import re
import time
from typing import Any

from ckptfs import META_DIR, offline
from ckptfs.engine.seals import OPEN, SEALED
from ckptfs.layout import parent
from ckptfs.mounts import find_backing_root, find_mount_root
from ckptfs.rules import CHECKPOINT_FILES
from ckptfs.xattrs import PREFIX, X_ATTRS, X_GROUPS, X_STATUS

__all__ = ["NotCkptfs", "status", "latest", "wait_sealed"]


class NotCkptfs(ValueError):
    """The path is neither in a ckptfs mount nor in a directory ckptfs has managed."""


def _where(path: str) -> tuple[str, str, bool]:
    """(root, path relative to it, mounted) for ``path``, as the command line finds it (the
    mountpoint above it, else the managed directory); raises FileNotFoundError, NotCkptfs."""
    if not os.path.lexists(path):
        raise FileNotFoundError(2, "no such file or directory", path)
    root = find_mount_root(path)
    mounted = root is not None
    if root is None:
        root = find_backing_root(path)
    if root is None:
        raise NotCkptfs(f"{path}: not inside a ckptfs mount or a directory ckptfs has managed "
                        f"(no {META_DIR}/ above it)")
    return root, os.path.relpath(os.path.abspath(path), root).removeprefix("."), mounted


def status(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What ckptfs says about a file or directory: ``{"status": ..., ...}``.

    Mounted: every status attribute the daemon serves for it (``status``: committed / writing /
    corrupt / untracked ... for a file, open / sealed / corrupt for a group; ``size``,
    ``blake3``, ``generation``, ``committed_at``, ``group`` ...; names without the
    ``user.ckptfs.`` prefix).  Unmounted: a recorded file's record (``status: committed``), a
    group's state (``status``: sealed, or torn for one a crash left open), else ``untracked``;
    ``mounted`` says which."""
    root, rel, mounted = _where(os.fspath(path))
    if mounted:
        attrs = json.loads(os.getxattr(os.fspath(path), X_ATTRS))
        out: dict[str, Any] = {k.removeprefix(PREFIX): v for k, v in attrs.items()}
        out["mounted"] = True
        return out
    r = offline.state(root)
    rec = r.files.get(rel)
    if rec is not None:
        return {"status": "committed", "mounted": False, **rec.to_json()}
    g = r.groups.get(rel)
    if g is not None:
        return {**g.to_json(), "status": g.state, "mounted": False}
    return {"status": "untracked", "mounted": False}


def _groups_in(root: str, rel: str, mounted: bool) -> list[dict[str, Any]]:
    if mounted:
        return list(json.loads(os.getxattr(os.path.join(root, rel), X_GROUPS)))
    r = offline.state(root)
    return [g.to_json() for g in r.groups.values() if parent(g.path) == rel]


def _order(g: dict[str, Any]) -> tuple[int, float]:
    return (g["step"] if g.get("step") is not None else -1, g.get("sealed_at") or 0.0)


def _epoch(iso: str | None) -> float:
    try:
        return calendar.timegm(time.strptime(iso or "", "%Y-%m-%dT%H:%M:%SZ"))
    except ValueError:
        return 0.0


_RESUMABLE = re.compile(CHECKPOINT_FILES, re.IGNORECASE)


def resumable_file(name: str) -> bool:
    """Whether a file named ``name`` is a checkpoint a trainer resumes from (``model.pt``,
    ``epoch=3-step=100.ckpt``, ``x.safetensors``...): never a log, a pointer text (``latest``,
    ``latest.txt``), JSON or a piece of a DCP save (``.metadata``)."""
    return not name.startswith(".") and _RESUMABLE.fullmatch(name) is not None


def latest(directory: str | os.PathLike[str]) -> str | None:
    """The path of the newest sealed group directly in ``directory`` (the higher step, then the
    later seal), or, where it holds no sealed group, of its newest committed checkpoint file (the
    latest commit; files directly in it only, :func:`resumable_file`: issue 25 found it naming
    ``train.log`` and ``latest.txt``).  None if it holds neither."""
    d = os.fspath(directory)
    if not os.path.isdir(d):
        raise NotADirectoryError(20, "not a directory", d)
    root, rel, mounted = _where(d)
    sealed = [g for g in _groups_in(root, rel, mounted) if g.get("state") == SEALED]
    if sealed:
        return os.path.join(root, max(sealed, key=_order)["path"])
    if mounted:
        newest: tuple[float, int, str] | None = None
        for e in os.scandir(d):
            if not e.is_file(follow_symlinks=False) or not resumable_file(e.name):
                continue
            try:
                a = json.loads(os.getxattr(e.path, X_ATTRS))
            except OSError:
                continue
            if a.get(X_STATUS) == "committed":
                # the xattr says the second (ISO 8601, UTC); within one, the later write wins.  (Its
                # mtime's fraction added to the commit second put a file written at x.995 and
                # committed at x+1.003 after one written and committed at x+1.05: test_api, under load)
                key = (_epoch(a.get(PREFIX + "committed_at")), e.stat(follow_symlinks=False).st_mtime_ns, e.path)
                if newest is None or key > newest:
                    newest = key
        return newest[2] if newest else None
    best: tuple[float, str] | None = None
    for p, rec in offline.state(root).files.items():
        if (parent(p) == rel and resumable_file(os.path.basename(p))
                and (best is None or (rec.committed_at, p) > best)):
            best = (rec.committed_at, os.path.join(root, p))
    return best[1] if best else None


def wait_sealed(path: str | os.PathLike[str], timeout: float | None = None, poll: float = 0.1) -> str:
    """Wait until ``path`` is sealed, and return it; or, for a directory holding groups, until
    none of them is open, and return :func:`latest` of it.  Raises TimeoutError after
    ``timeout`` seconds (None: no limit), RuntimeError if the group ends torn or corrupt (its
    reason; a mount moves a torn group out of sight, so it vanishing while waited for is that
    too), NotCkptfs / FileNotFoundError for a path ckptfs does not manage or that is not there."""
    p = os.fspath(path)
    deadline = None if timeout is None else time.monotonic() + timeout
    seen = False
    while True:
        try:
            st = status(p)
        except FileNotFoundError:
            if not seen:
                raise
            # a mount moves a torn group out of sight when it finds it (its writer died unsealed)
            raise RuntimeError(f"{p}: torn: moved out of sight while waiting (see `ckptfs ls --all`)") from None
        seen = True
        state = st.get("status")
        if state == SEALED:
            return p
        if state in ("torn", "corrupt"):
            raise RuntimeError(f"{p}: {state}: {st.get('error') or st.get('reason') or 'no reason recorded'}")
        if state != OPEN:  # not a group: a directory of groups?
            root, rel, mounted = _where(p)
            if not os.path.isdir(p):
                raise NotADirectoryError(20, f"neither a group nor a directory of groups (status {state})", p)
            if not any(g.get("state") == OPEN for g in _groups_in(root, rel, mounted)):
                got = latest(p)
                if got is None:
                    raise FileNotFoundError(2, "no sealed group or committed file in it", p)
                return got
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"{p}: not sealed after {timeout} s (status {state})")
        time.sleep(poll)
