"""How processes ended: the Linux process-events connector (netlink ``NETLINK_CONNECTOR``,
``CN_IDX_PROC``), read by one daemon thread.

Why: "the process that made a checkpoint directory has exited" says nothing on its own (``mkdir -p
step_100`` exits at once; issue 10), but a maker that was *killed* (or failed) before it wrote a
file into the directory is evidence of an interrupted save.  Only the kernel knows how a process
that is not our child ended; it tells through this connector.  Needs CAP_NET_ADMIN (the daemon runs
as root for ``allow_other`` and chown); without it ``available`` is False and callers fall back to
weaker evidence.  Linux only.
"""

from __future__ import annotations

import collections
import logging
import os
import socket
import struct
import sys
import threading
import time

log = logging.getLogger("ckptfs.exits")

NETLINK_CONNECTOR = 11
CN_IDX_PROC = 1
CN_VAL_PROC = 1
PROC_CN_MCAST_LISTEN = 1
PROC_EVENT_EXIT = 0x80000000
NLMSG_DONE = 3
_NLHDR = struct.Struct("=IHHII")
_CNHDR = struct.Struct("=IIIIHH")
_EVHDR = struct.Struct("=IIQ")
_EXIT = struct.Struct("=IIII")
REMEMBER = 65536  # exits kept (newest)


def _kernel_at_least(major: int, minor: int) -> bool:
    try:
        got = tuple(int(x) for x in os.uname().release.split("-")[0].split(".")[:2])
    except ValueError:
        return False
    return got >= (major, minor)


class ExitWatcher:
    """Remembers the wait status of processes (thread-group leaders) that exited since it started."""

    def __init__(self) -> None:
        self.available = False
        self.status: collections.OrderedDict[int, tuple[int, float]] = collections.OrderedDict()
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self._sock: socket.socket | None = None
        if not sys.platform.startswith("linux") or os.environ.get("CKPTFS_EXIT_EVENTS") == "0":
            return  # (CKPTFS_EXIT_EVENTS=0: tests of the fallback)
        try:
            s = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_CONNECTOR)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
            s.bind((0, CN_IDX_PROC))
            op = struct.pack("=I", PROC_CN_MCAST_LISTEN)
            if _kernel_at_least(6, 6):
                # struct proc_input: exit events only (the connector otherwise sends every fork,
                # exec, uid change... of the whole machine, each parsed here: ~10% of the daemon's
                # CPU in a small-file save on a busy machine).  Older kernels ignore a message of
                # this size entirely, so they get the plain op.
                op += struct.pack("=I", PROC_EVENT_EXIT)
            cn = _CNHDR.pack(CN_IDX_PROC, CN_VAL_PROC, 0, 0, len(op), 0) + op
            s.send(_NLHDR.pack(_NLHDR.size + len(cn), NLMSG_DONE, 0, 0, os.getpid()) + cn)
        except OSError as e:
            log.info("process exit events unavailable (%s): a killed maker of an empty checkpoint "
                     "directory is recognised only if it wrote a sibling group", e)
            return
        self._sock = s
        self.available = True
        threading.Thread(target=self._run, name="ckptfs-exits", daemon=True).start()

    def _run(self) -> None:
        assert self._sock is not None
        while True:
            try:
                data = self._sock.recv(1 << 16)
            except OSError as e:
                if getattr(e, "errno", None) == 105:  # ENOBUFS: events lost under a burst; carry on
                    log.warning("process exit events lost (burst)")
                    continue
                log.warning("process exit events stopped: %s", e)
                self.available = False
                return
            try:
                self._parse(data)
            except Exception:  # never a silent death: callers fall back to weaker evidence
                log.exception("process exit events: unparsable message; no longer used")
                self.available = False
                return

    def _parse(self, data: bytes) -> None:
        off = 0
        while off + _NLHDR.size <= len(data):
            ln = _NLHDR.unpack_from(data, off)[0]
            if ln < _NLHDR.size or off + ln > len(data):
                return
            body = off + _NLHDR.size + _CNHDR.size
            if body + _EVHDR.size + _EXIT.size <= off + ln:
                what = _EVHDR.unpack_from(data, body)[0]
                if what == PROC_EVENT_EXIT:
                    pid, tgid, code, _sig = _EXIT.unpack_from(data, body + _EVHDR.size)
                    if pid == tgid:
                        self._record(tgid, code)
            off += (ln + 3) & ~3

    def _record(self, tgid: int, code: int) -> None:
        with self.cond:
            self.status[tgid] = (code, time.monotonic())
            self.status.move_to_end(tgid)
            while len(self.status) > REMEMBER:
                self.status.popitem(last=False)
            self.cond.notify_all()

    def wait_status(self, tgid: int, timeout: float = 1.0) -> int | None:
        """The raw wait status of exited process ``tgid`` (signal in the low 7 bits, exit code in
        bits 8-15), waiting up to ``timeout`` for its event; None if unknown."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while tgid not in self.status:
                left = deadline - time.monotonic()
                if left <= 0 or not self.available:
                    return None
                self.cond.wait(left)
            return self.status[tgid][0]


def interrupted(status: int | None) -> str:
    """Why a wait status means the process did not finish normally ("" if it exited 0 or unknown)."""
    if status is None:
        return ""
    if status & 0x7F:
        return f"killed by signal {status & 0x7F}"
    if status >> 8:
        return f"exited with status {status >> 8}"
    return ""


_shared: ExitWatcher | None = None
_shared_lock = threading.Lock()


def watcher() -> ExitWatcher:
    """The daemon's one watcher (started on first use)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = ExitWatcher()
        return _shared
