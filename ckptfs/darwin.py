"""The macOS (Darwin, macFUSE) implementations of ckptfs' OS-specific pieces.  NOT YET RUN ON A MAC:
each is unit-tested on Linux against the structures of Apple's headers (``tests/test_darwin.py``),
which is all this project can check today.

The OS-specific pieces, and where each platform's implementation lives (:data:`PIECES`):

=================  =============================================  =============================================
piece              Linux                                          Darwin (this module)
=================  =============================================  =============================================
durable sync       ``fsync`` (``backing.durable_sync``)           ``fcntl(F_FULLFSYNC)``: plain fsync leaves
                                                                  data in the drive cache (``backing.py``)
dying writer       ``/proc/PID/stat``: PF_EXITING and the exit    ``sysctl(CTL_KERN, KERN_PROC, KERN_PROC_PID)``:
                   code's signal (``procinfo.killing_signal``)    ``kp_proc.p_flag & P_WEXIT`` and ``p_xstat``
                                                                  (:func:`killing_signal`)
mount table        ``/proc/self/mountinfo`` (``mounts.py``)       ``getfsstat(2)``: ``struct statfs``
                                                                  (:func:`mounts`)
readahead          the FUSE bdi's ``read_ahead_kb`` (root;        per file: ``fcntl(F_RDAHEAD, 1)``
                   ``fuse/readahead.py``)                         (:func:`enable_readahead`)
=================  =============================================  =============================================

The parsers take bytes, so they run (and are tested) anywhere; only the calls into libc need Darwin.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from dataclasses import dataclass

PIECES = {
    "durable sync": ("ckptfs.backing.durable_sync", "ckptfs.backing.durable_sync (F_FULLFSYNC)"),
    "dying writer": ("ckptfs.procinfo.killing_signal", "ckptfs.darwin.killing_signal"),
    "mount table": ("ckptfs.mounts.read_mountinfo", "ckptfs.darwin.mounts"),
    "readahead": ("ckptfs.fuse.readahead.raise_readahead", "ckptfs.darwin.enable_readahead"),
}

# <sys/sysctl.h>, <sys/proc.h>, <sys/mount.h>, <sys/fcntl.h>
CTL_KERN, KERN_PROC, KERN_PROC_PID = 1, 14, 1
P_WEXIT = 0x00002000  # p_flag: the process is exiting
SZOMB = 5  # p_stat: a zombie
MFSTYPENAMELEN, MAXPATHLEN = 16, 1024
MNT_NOWAIT = 2
F_RDAHEAD = 45


class ExternProc(ctypes.Structure):
    """``struct extern_proc`` (<sys/proc.h>), 64-bit: the fields ckptfs reads and everything before
    and between them, so the offsets are the compiler's."""

    _fields_ = [
        ("p_un", ctypes.c_byte * 16),  # union { struct { proc *p_forw, *p_back } ; struct timeval }
        ("p_vmspace", ctypes.c_void_p),
        ("p_sigacts", ctypes.c_void_p),
        ("p_flag", ctypes.c_int),
        ("p_stat", ctypes.c_char),
        ("p_pid", ctypes.c_int32),
        ("p_oppid", ctypes.c_int32),
        ("p_dupfd", ctypes.c_int),
        ("user_stack", ctypes.c_void_p),
        ("exit_thread", ctypes.c_void_p),
        ("p_debugger", ctypes.c_int),
        ("sigwait", ctypes.c_int),
        ("p_estcpu", ctypes.c_uint),
        ("p_cpticks", ctypes.c_int),
        ("p_pctcpu", ctypes.c_uint32),
        ("p_wchan", ctypes.c_void_p),
        ("p_wmesg", ctypes.c_char_p),
        ("p_swtime", ctypes.c_uint),
        ("p_slptime", ctypes.c_uint),
        ("p_realtimer", ctypes.c_byte * 32),  # struct itimerval
        ("p_rtime", ctypes.c_byte * 16),  # struct timeval
        ("p_uticks", ctypes.c_uint64),
        ("p_sticks", ctypes.c_uint64),
        ("p_iticks", ctypes.c_uint64),
        ("p_traceflag", ctypes.c_int),
        ("p_tracep", ctypes.c_void_p),
        ("p_siglist", ctypes.c_int),
        ("p_textvp", ctypes.c_void_p),
        ("p_holdcnt", ctypes.c_int),
        ("p_sigmask", ctypes.c_uint32),
        ("p_sigignore", ctypes.c_uint32),
        ("p_sigcatch", ctypes.c_uint32),
        ("p_priority", ctypes.c_ubyte),
        ("p_usrpri", ctypes.c_ubyte),
        ("p_nice", ctypes.c_char),
        ("p_comm", ctypes.c_char * 17),  # MAXCOMLEN + 1
        ("p_pgrp", ctypes.c_void_p),
        ("p_addr", ctypes.c_void_p),
        ("p_xstat", ctypes.c_ushort),  # the exit status (wait(2) form) once it is exiting
        ("p_acflag", ctypes.c_ushort),
        ("p_ru", ctypes.c_void_p),
    ]


KINFO_PROC_SIZE = 648  # sizeof(struct kinfo_proc) on 64-bit macOS: extern_proc (296) + eproc (352)


class Statfs64(ctypes.Structure):
    """``struct statfs`` with 64-bit inodes (<sys/mount.h>, the only layout of arm64 and of
    ``getfsstat`` on x86_64 since 10.6 with ``_DARWIN_FEATURE_64_BIT_INODE``)."""

    _fields_ = [
        ("f_bsize", ctypes.c_uint32),
        ("f_iosize", ctypes.c_int32),
        ("f_blocks", ctypes.c_uint64),
        ("f_bfree", ctypes.c_uint64),
        ("f_bavail", ctypes.c_uint64),
        ("f_files", ctypes.c_uint64),
        ("f_ffree", ctypes.c_uint64),
        ("f_fsid", ctypes.c_int32 * 2),
        ("f_owner", ctypes.c_uint32),
        ("f_type", ctypes.c_uint32),
        ("f_flags", ctypes.c_uint32),
        ("f_fssubtype", ctypes.c_uint32),
        ("f_fstypename", ctypes.c_char * MFSTYPENAMELEN),
        ("f_mntonname", ctypes.c_char * MAXPATHLEN),
        ("f_mntfromname", ctypes.c_char * MAXPATHLEN),
        ("f_flags_ext", ctypes.c_uint32),
        ("f_reserved", ctypes.c_uint32 * 7),
    ]


STATFS64_SIZE = 2168  # sizeof(struct statfs) with 64-bit inodes


@dataclass(frozen=True)
class ProcState:
    flags: int
    stat: int
    xstat: int


def parse_kinfo_proc(buf: bytes) -> ProcState:
    """The fields of a ``struct kinfo_proc`` that the dying-writer check needs."""
    if len(buf) < ctypes.sizeof(ExternProc):
        raise ValueError(f"kinfo_proc too short: {len(buf)} bytes")
    p = ExternProc.from_buffer_copy(buf[:ctypes.sizeof(ExternProc)])
    return ProcState(p.p_flag, ord(p.p_stat), p.p_xstat)


def signal_of(state: ProcState) -> int | None:
    """As ``procinfo.killing_signal``: the signal a process is exiting by, or None (alive, exiting
    normally, or unknown).  Darwin sets ``p_xstat`` (wait(2) form) before ``P_WEXIT``."""
    if not state.flags & P_WEXIT:
        return None
    sig = state.xstat & 0x7F
    return sig or None


def parse_statfs(buf: bytes) -> tuple[str, str, str]:
    """(mountpoint, fstype, source) of one ``struct statfs``."""
    s = Statfs64.from_buffer_copy(buf[:ctypes.sizeof(Statfs64)])
    dec = sys.getfilesystemencoding()
    return s.f_mntonname.decode(dec, "surrogateescape"), s.f_fstypename.decode(), \
        s.f_mntfromname.decode(dec, "surrogateescape")


def _libc() -> ctypes.CDLL:
    if sys.platform != "darwin":
        raise OSError("ckptfs.darwin: only on macOS")
    return ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def killing_signal(pid: int) -> int | None:
    """Darwin's dying-writer check: ``sysctl(KERN_PROC_PID)``; None where it cannot tell."""
    if pid <= 0:
        return None
    try:
        libc = _libc()
    except OSError:
        return None
    mib = (ctypes.c_int * 4)(CTL_KERN, KERN_PROC, KERN_PROC_PID, pid)
    buf = ctypes.create_string_buffer(KINFO_PROC_SIZE)
    size = ctypes.c_size_t(KINFO_PROC_SIZE)
    if libc.sysctl(mib, 4, buf, ctypes.byref(size), None, 0) != 0 or size.value == 0:
        return None
    return signal_of(parse_kinfo_proc(buf.raw[:size.value]))


def mounts() -> list[tuple[str, str, str]]:
    """Darwin's mount table: ``getfsstat(2)``, (mountpoint, fstype, source) per mount."""
    libc = _libc()
    n = libc.getfsstat(None, 0, MNT_NOWAIT)
    if n <= 0:
        return []
    arr = (Statfs64 * n)()
    n = libc.getfsstat(arr, ctypes.sizeof(arr), MNT_NOWAIT)
    return [parse_statfs(bytes(arr[i])) for i in range(max(n, 0))]


def enable_readahead(fd: int) -> None:
    """Darwin has no per-mount read-ahead knob for FUSE; ask for it per open file."""
    import fcntl

    fcntl.fcntl(fd, F_RDAHEAD, 1)
