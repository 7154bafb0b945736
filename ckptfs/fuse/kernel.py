"""The Linux FUSE wire protocol: opcodes, flags and struct layouts (``include/uapi/linux/fuse.h``).

Only what the native transport (:mod:`ckptfs.fuse.session`) uses.  Every struct is little-endian
with the kernel's natural alignment spelled out as explicit fields, so ``struct.calcsize`` of each
format equals the C ``sizeof`` (checked in ``tests/test_kernel_proto.py``).
"""

from __future__ import annotations

import struct

KERNEL_MAJOR = 7
KERNEL_MINOR = 40  # 7.40: passthrough (FUSE_PASSTHROUGH, backing ids); the kernel answers with min(its, ours)
ROOT_ID = 1

# ---------------------------------------------------------------- opcodes
LOOKUP, FORGET, GETATTR, SETATTR, READLINK, SYMLINK = 1, 2, 3, 4, 5, 6
MKNOD, MKDIR, UNLINK, RMDIR, RENAME, LINK, OPEN, READ, WRITE, STATFS, RELEASE = 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18
FSYNC, SETXATTR, GETXATTR, LISTXATTR, REMOVEXATTR, FLUSH, INIT = 20, 21, 22, 23, 24, 25, 26
OPENDIR, READDIR, RELEASEDIR, FSYNCDIR, GETLK, SETLK, SETLKW, ACCESS, CREATE = 27, 28, 29, 30, 31, 32, 33, 34, 35
INTERRUPT, BMAP, DESTROY, IOCTL, POLL, NOTIFY_REPLY, BATCH_FORGET, FALLOCATE = 36, 37, 38, 39, 40, 41, 42, 43
READDIRPLUS, RENAME2, LSEEK, COPY_FILE_RANGE, SETUPMAPPING, REMOVEMAPPING, SYNCFS, TMPFILE, STATX = (
    44, 45, 46, 47, 48, 49, 50, 51, 52)

NAMES = {v: k for k, v in globals().items() if k.isupper() and isinstance(v, int) and 1 <= v <= 52
         and k not in ("KERNEL_MAJOR", "KERNEL_MINOR", "ROOT_ID")}

# ---------------------------------------------------------------- INIT flags
ASYNC_READ = 1 << 0
POSIX_LOCKS = 1 << 1
ATOMIC_O_TRUNC = 1 << 3
BIG_WRITES = 1 << 5
DONT_MASK = 1 << 6
FLOCK_LOCKS = 1 << 10
HAS_IOCTL_DIR = 1 << 11
AUTO_INVAL_DATA = 1 << 12
DO_READDIRPLUS = 1 << 13
ASYNC_DIO = 1 << 15
WRITEBACK_CACHE = 1 << 16
PARALLEL_DIROPS = 1 << 18
HANDLE_KILLPRIV = 1 << 19
MAX_PAGES = 1 << 22
HANDLE_KILLPRIV_V2 = 1 << 28
INIT_EXT = 1 << 30
# flags2 (bit n of flags2 is bit 32+n of the 64-bit flag word)
PASSTHROUGH = 1 << (37 - 32)
DIRECT_IO_ALLOW_MMAP = 1 << (36 - 32)

# ---------------------------------------------------------------- open flags (reply)
FOPEN_DIRECT_IO = 1 << 0
FOPEN_KEEP_CACHE = 1 << 1
FOPEN_CACHE_DIR = 1 << 3
FOPEN_NOFLUSH = 1 << 5
FOPEN_PASSTHROUGH = 1 << 7

# ---------------------------------------------------------------- setattr valid bits
FATTR_MODE, FATTR_UID, FATTR_GID, FATTR_SIZE = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FATTR_ATIME, FATTR_MTIME, FATTR_FH, FATTR_ATIME_NOW, FATTR_MTIME_NOW = 1 << 4, 1 << 5, 1 << 6, 1 << 7, 1 << 8
FATTR_CTIME = 1 << 10

GETATTR_FH = 1 << 0
RELEASE_FLUSH = 1 << 0
FSYNC_FDATASYNC = 1 << 0

# ---------------------------------------------------------------- notifications (unique 0, error = code)
NOTIFY_INVAL_INODE = 2
NOTIFY_INVAL_ENTRY = 3
NOTIFY_DELETE = 6
NOTIFY_INC_EPOCH = 8  # 7.44 (Linux 6.16): every dentry from before is revalidated at its next use; takes no lock

# ---------------------------------------------------------------- ioctls on /dev/fuse
DEV_IOC_CLONE = 0x8004E500  # _IOR(229, 0, uint32_t)
DEV_IOC_BACKING_OPEN = 0x4010E501  # _IOW(229, 1, struct fuse_backing_map)
DEV_IOC_BACKING_CLOSE = 0x4004E502  # _IOW(229, 2, uint32_t)

# ---------------------------------------------------------------- structs
IN_HEADER = struct.Struct("<IIQQIIIHH")  # len opcode unique nodeid uid gid pid total_extlen padding
OUT_HEADER = struct.Struct("<IiQ")  # len error unique
# ino size blocks atime mtime ctime, atime/mtime/ctime nsec, mode nlink uid gid rdev blksize flags
ATTR = struct.Struct("<QQQQQQIIIIIIIIII")
ENTRY_OUT = struct.Struct("<QQQQII" + ATTR.format[1:])  # nodeid generation entry_valid attr_valid *_nsec attr
ATTR_OUT = struct.Struct("<QII" + ATTR.format[1:])  # attr_valid attr_valid_nsec dummy attr
INIT_IN = struct.Struct("<IIIII")  # major minor max_readahead flags flags2 (then unused[11])
INIT_OUT = struct.Struct("<IIIIHHIIHHIIH22x")
GETATTR_IN = struct.Struct("<IIQ")  # getattr_flags dummy fh
SETATTR_IN = struct.Struct("<IIQQQQQQIIIIIIII")
MKNOD_IN = struct.Struct("<IIII")  # mode rdev umask padding
MKDIR_IN = struct.Struct("<II")  # mode umask
RENAME_IN = struct.Struct("<Q")  # newdir
RENAME2_IN = struct.Struct("<QII")  # newdir flags padding
LINK_IN = struct.Struct("<Q")  # oldnodeid
OPEN_IN = struct.Struct("<II")  # flags open_flags
CREATE_IN = struct.Struct("<IIII")  # flags mode umask open_flags
OPEN_OUT = struct.Struct("<QIi")  # fh open_flags backing_id
RELEASE_IN = struct.Struct("<QIIQ")  # fh flags release_flags lock_owner
FLUSH_IN = struct.Struct("<QIIQ")  # fh unused padding lock_owner
READ_IN = struct.Struct("<QQIIQII")  # fh offset size read_flags lock_owner flags padding
WRITE_IN = READ_IN  # fh offset size write_flags lock_owner flags padding
WRITE_OUT = struct.Struct("<II")
STATFS_OUT = struct.Struct("<QQQQQIIII24x")  # blocks bfree bavail files ffree bsize namelen frsize padding spare
FSYNC_IN = struct.Struct("<QII")  # fh fsync_flags padding
FALLOCATE_IN = struct.Struct("<QQQII")  # fh offset length mode padding
COPY_FILE_RANGE_IN = struct.Struct("<QQQQQQQ")  # fh_in off_in nodeid_out fh_out off_out len flags
IOCTL_IN = struct.Struct("<QIIQII")  # fh flags cmd arg in_size out_size
IOCTL_OUT = struct.Struct("<iIII")  # result flags in_iovs out_iovs
FS_IOC_GETFLAGS, FS_IOC_FSGETXATTR = 0x80086601, 0x801C581F  # what fuse_fileattr_get asks (lsattr)
SETXATTR_IN = struct.Struct("<II")  # size flags (no FUSE_SETXATTR_EXT)
GETXATTR_IN = struct.Struct("<II")  # size padding
GETXATTR_OUT = struct.Struct("<II")
FORGET_IN = struct.Struct("<Q")
BATCH_FORGET_IN = struct.Struct("<II")
FORGET_ONE = struct.Struct("<QQ")
INTERRUPT_IN = struct.Struct("<Q")
DIRENT = struct.Struct("<QQII")  # ino off namelen type
NOTIFY_INVAL_INODE_OUT = struct.Struct("<Qqq")  # ino off len
NOTIFY_INVAL_ENTRY_OUT = struct.Struct("<QII")  # parent namelen flags
BACKING_MAP = struct.Struct("<iIQ")  # fd flags padding

MASK64 = (1 << 64) - 1


def split_time(ns: int) -> tuple[int, int]:
    """(seconds, nanoseconds) of a nanosecond timestamp, as the wire wants them (u64 seconds)."""
    s, n = divmod(int(ns), 1_000_000_000)
    return s & MASK64, n


def pack_attr(st: dict, blksize: int = 4096) -> tuple:
    """The ``fuse_attr`` fields of a ``CkptFS.getattr`` dict (``st_*`` keys, times in ns)."""
    a, an = split_time(st.get("st_atime", 0))
    m, mn = split_time(st.get("st_mtime", 0))
    c, cn = split_time(st.get("st_ctime", 0))
    return (st.get("st_ino", 0) & MASK64, st.get("st_size", 0), st.get("st_blocks", 0), a, m, c, an, mn, cn,
            st.get("st_mode", 0), st.get("st_nlink", 1), st.get("st_uid", 0), st.get("st_gid", 0),
            st.get("st_rdev", 0) & 0xFFFFFFFF, st.get("st_blksize", blksize) or blksize, 0)


def dirent(ino: int, off: int, name: bytes, dtype: int) -> bytes:
    """One ``fuse_dirent``, padded to 8 bytes."""
    rec = DIRENT.pack(ino & MASK64, off, len(name), dtype) + name
    return rec + b"\0" * (-len(rec) % 8)


def sec_nsec(seconds: float) -> tuple[int, int]:
    """A cache timeout as the (seconds, nanoseconds) pair of entry/attr replies."""
    s = int(seconds)
    return s, int((seconds - s) * 1e9)
