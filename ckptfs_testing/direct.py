"""Helpers for tests that drive the filesystem object directly (no mount)."""

from __future__ import annotations

import io
import os

import torch

from ckptfs.fs import Caller, CkptFS


def write_file(fs: CkptFS, path: str, data: bytes, pid: int = 0) -> None:
    """create + write + close (flush, release) of ``path`` by process ``pid``."""
    c = Caller(pid=pid)
    fh = fs.create(path, 0o644, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, c)
    try:
        fs.write(fh, data, 0, c)
        fs.flush(fh, c)
    finally:
        fs.release(fh, c)


def torch_bytes(x: float) -> bytes:
    """A small real ``torch.save`` archive."""
    buf = io.BytesIO()
    torch.save({"w": torch.full((4,), x)}, buf)
    return buf.getvalue()


def staging_leftovers(root: str | os.PathLike[str], fs: CkptFS) -> list[str]:
    """Files in ``root``'s ``.ckptfs/staging`` that are neither a version in use nor an empty file
    the staging pool holds (engine/pool.py P1): a leaked staging file."""
    from ckptfs.layout import STAGING

    pool = fs.staging.pool.held() if fs.staging.pool is not None else set()
    in_use = {v.staging for v in fs.pending.values()}
    return sorted(n for n in os.listdir(os.path.join(root, STAGING))
                  if f"{STAGING}/{n}" not in pool and f"{STAGING}/{n}" not in in_use)
