"""macOS pieces (ckptfs/darwin.py), tested on Linux against the structures of Apple's headers: the
sizes the headers give, and the decisions taken from recorded field values.  Nothing here has run
on a Mac (README says so)."""

from __future__ import annotations

import ctypes
import importlib
import signal
import sys

import pytest

from ckptfs import darwin
from ckptfs.mounts import CKPTFS_FSTYPE, darwin_fstype


def test_the_structures_have_the_sizes_of_apples_headers() -> None:
    # sizeof(struct kinfo_proc) == 648 on 64-bit macOS: struct extern_proc (296) + struct eproc (352)
    assert ctypes.sizeof(darwin.ExternProc) == 296 and darwin.KINFO_PROC_SIZE == 648
    assert ctypes.sizeof(darwin.Statfs64) == darwin.STATFS64_SIZE == 2168
    assert darwin.ExternProc.p_flag.offset == 32 and darwin.ExternProc.p_pid.offset == 40
    assert darwin.Statfs64.f_mntonname.offset == 88


def _kinfo(flags: int, xstat: int, pid: int = 4242) -> bytes:
    p = darwin.ExternProc(p_flag=flags, p_stat=b"\x02", p_pid=pid, p_xstat=xstat, p_comm=b"python3.11")
    return bytes(p) + bytes(darwin.KINFO_PROC_SIZE - ctypes.sizeof(p))  # + struct eproc


@pytest.mark.parametrize(("flags", "xstat", "want"), [
    (0x4004, 0, None),  # alive (P_CONTROLT | P_EXEC-like bits, no P_WEXIT)
    (darwin.P_WEXIT | 0x4, signal.SIGKILL, signal.SIGKILL),  # killed by SIGKILL, exiting
    (darwin.P_WEXIT, signal.SIGTERM, signal.SIGTERM),
    (darwin.P_WEXIT, 3 << 8, None),  # exit(3): exiting, but not by a signal
    (0, signal.SIGKILL, None),  # a stale status without P_WEXIT: not dying
])
def test_a_dying_writer_is_read_from_kinfo_proc(flags: int, xstat: int, want: int | None) -> None:
    st = darwin.parse_kinfo_proc(_kinfo(flags, xstat))
    assert (st.flags, st.xstat) == (flags, xstat)
    assert darwin.signal_of(st) == want


def test_a_short_kinfo_proc_is_refused() -> None:
    with pytest.raises(ValueError):
        darwin.parse_kinfo_proc(b"\0" * 100)


def test_the_mount_table_is_read_from_statfs() -> None:
    s = darwin.Statfs64(f_fstypename=b"macfuse", f_mntonname=b"/Users/me/ckpts",
                        f_mntfromname=b"ckptfs:/Users/me/ckpts")
    mp, fstype, src = darwin.parse_statfs(bytes(s))
    assert (mp, fstype, src) == ("/Users/me/ckpts", "macfuse", "ckptfs:/Users/me/ckpts")
    assert darwin_fstype(fstype, src) == CKPTFS_FSTYPE
    assert darwin_fstype("macfuse", "sshfs@host:") == "macfuse" and darwin_fstype("apfs", "/dev/disk1s1") == "apfs"


def test_every_os_specific_piece_is_named_with_both_implementations() -> None:
    for piece, paths in darwin.PIECES.items():
        for dotted in paths:
            mod, _, name = dotted.split(" ")[0].rpartition(".")
            assert callable(getattr(importlib.import_module(mod), name)), (piece, dotted)


@pytest.mark.skipif(sys.platform == "darwin", reason="the Linux side of the check")
def test_off_darwin_the_calls_do_nothing_harmful() -> None:
    assert darwin.killing_signal(1) is None  # cannot tell: a live close, as on Linux without /proc
    with pytest.raises(OSError):
        darwin.mounts()
