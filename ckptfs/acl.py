"""POSIX ACL inheritance for files the mount creates away from their directory (the staged versions
of new files, ``engine/staged.py``), as the kernel computes it when a file is created in a directory
with a default ACL (``posix_acl_create`` in ``fs/posix_acl.c``).

Natively, a new file or directory in a directory whose ``system.posix_acl_default`` is set gets
that ACL as its access ACL, each entry masked by the mode the creator asked for, and the creator's
umask is *not* applied; in a directory without one the umask is applied and no ACL is made.  A
file made in place on the backing filesystem (``mkdir``, ``mknod``) gets this from the backing
filesystem itself, given the unmasked mode (FUSE_DONT_MASK; the daemon runs with umask 0).  A new
regular file through the mount is made in ``.ckptfs/staging`` and renamed into its directory at
commit, so the inheritance is computed here and set on the staged file.

Invariant (transparency): for every default ACL, mode and umask, :func:`create_mode` gives the mode
and access ACL ext4 gives a file created natively
(``tests/test_acl.py::test_inheritance_matches_the_kernel``, a property test against the kernel).

The value format is the kernel's ``posix_acl_xattr``: a little-endian u32 version (2), then
entries of (u16 tag, u16 perm, u32 id)."""

from __future__ import annotations

import struct

ACCESS = "system.posix_acl_access"
DEFAULT = "system.posix_acl_default"

VERSION = 2
HEADER = struct.Struct("<I")
ENTRY = struct.Struct("<HHI")
MAX_ENTRIES = 4096  # hostile input: a value is bounded (ext4 holds ~500 in a block)

USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20

Entry = tuple[int, int, int]  # (tag, perm, id)


def parse(value: bytes) -> list[Entry] | None:
    """The entries of an ACL xattr value; None where it is not a well-formed version-2 ACL (then it
    is not used: the file gets what a directory without a default ACL gives)."""
    if len(value) < HEADER.size or (len(value) - HEADER.size) % ENTRY.size:
        return None
    if HEADER.unpack_from(value)[0] != VERSION:
        return None
    n = (len(value) - HEADER.size) // ENTRY.size
    if n > MAX_ENTRIES:
        return None
    out = [ENTRY.unpack_from(value, HEADER.size + i * ENTRY.size) for i in range(n)]
    tags = [t for t, _p, _i in out]
    if not all(t in (USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER) for t in tags):
        return None
    if tags.count(USER_OBJ) != 1 or tags.count(GROUP_OBJ) != 1 or tags.count(OTHER) != 1 or tags.count(MASK) > 1:
        return None
    return [(t, p & 7, i) for t, p, i in out]


def encode(entries: list[Entry]) -> bytes:
    return HEADER.pack(VERSION) + b"".join(ENTRY.pack(t, p, i) for t, p, i in entries)


def inherit(default: list[Entry], mode: int) -> tuple[int, list[Entry] | None]:
    """``posix_acl_create_masq``: the new file's permission bits and its access ACL (None where the
    ACL says no more than the mode, as the kernel then stores none)."""
    perm = mode & 0o777
    out: list[Entry] = []
    equiv = True
    group_at = mask_at = -1
    for t, p, i in default:
        if t == USER_OBJ:
            p &= (perm >> 6) & 7
            perm = (perm & ~0o700) | (p << 6)
        elif t in (USER, GROUP):
            equiv = False
        elif t == GROUP_OBJ:
            group_at = len(out)
        elif t == OTHER:
            p &= perm & 7
            perm = (perm & ~0o007) | p
        elif t == MASK:
            mask_at = len(out)
            equiv = False
        out.append((t, p, i))
    at = mask_at if mask_at >= 0 else group_at
    t, p, i = out[at]
    p &= (perm >> 3) & 7
    out[at] = (t, p, i)
    perm = (perm & ~0o070) | (p << 3)
    return (mode & ~0o777) | perm, (None if equiv else out)


def create_mode(default_value: bytes | None, mode: int, umask: int | None) -> tuple[int, bytes | None]:
    """(mode, access ACL value or None) of a new file asked for with ``mode`` by a creator whose
    umask is ``umask`` (None: already applied by the kernel), in a directory whose default ACL
    value is ``default_value`` (None: it has none)."""
    default = parse(default_value) if default_value else None
    if not default:
        return (mode & ~umask if umask is not None else mode), None
    got, access = inherit(default, mode)
    return got, (encode(access) if access is not None else None)


def in_place_mode(default_value: bytes | None, mode: int, umask: int | None) -> int:
    """The mode to ask the backing filesystem for when the mount makes a node in place (``mkdir``,
    ``mknod``): unmasked where the directory has a default ACL (the backing filesystem inherits it
    then, ignoring the umask, as natively), else less the creator's umask."""
    if umask is None or (default_value and parse(default_value)):
        return mode
    return mode & ~umask
