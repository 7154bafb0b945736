"""Command line: ``ckptfs mount|umount|recover|status|verify|scrub|forget|ls|show|seal|gc``.

Modules: ``parser`` (argument parser, ``main``), one per command family
(``mount``, ``status``, ``integrity``, ``groups``) and ``common`` (``CliError``,
locating the ckptfs directory of a path).  Every user error ends in one line
``ckptfs: error: ...`` and exit status 2 (1 for operational failures), never a
traceback.
"""

from __future__ import annotations

from ckptfs.cli.parser import build_parser, main
from ckptfs.mounts import is_ckptfs_mount

__all__ = ["build_parser", "is_ckptfs_mount", "main"]
