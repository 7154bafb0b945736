"""ckptfs: a crash-consistent FUSE filesystem for training checkpoints.

The Python API for scripts (:mod:`ckptfs.api`): ``ckptfs.status(path)``, ``ckptfs.latest(dir)``,
``ckptfs.wait_sealed(path, timeout)``; imported on first use, so the daemon and the command line
do not pay for it.
"""

from typing import Any

__version__ = "0.1.0"
META_DIR = ".ckptfs"

_API = ("status", "latest", "wait_sealed", "NotCkptfs")


def __getattr__(name: str) -> Any:
    if name in _API:
        from ckptfs import api

        return getattr(api, name)
    raise AttributeError(f"module 'ckptfs' has no attribute {name!r}")
