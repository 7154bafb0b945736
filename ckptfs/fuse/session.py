"""The native Linux transport: ``/dev/fuse`` opened and mounted by us, requests served by threads.

Life cycle (:func:`serve_native`): open ``/dev/fuse``; mount it (``mount(2)`` as root, else
``fusermount3`` hands us the fd over a socket, ``_FUSE_COMMFD``); answer INIT; serve requests on
worker threads until the kernel reports the connection gone (ENODEV: unmounted) or a signal asks
us to stop (we unmount); then ``fs.shutdown()``.

Threads: a pool that grows while every worker is busy (a flush may wait for a commit, a rewrite
for readers to close), up to ``MAX_WORKERS``; each reads whole requests with one ``readv`` into
its own buffer and writes each reply with one ``writev``.  Invalidations go out on their own
thread (:mod:`ckptfs.fuse.notify`): the kernel takes the inode locks a request in flight may hold.

Invariants:

S1  Every request but FORGET, BATCH_FORGET and INTERRUPT gets exactly one reply, also when its
    handler raised something other than OSError (EIO then, logged): no request hangs a process.
S2  The daemon never sends a request to its own mount (a killed daemon would hang on it).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import shutil
import signal
import socket
import stat
import subprocess
import threading
import time
from typing import Any

from ckptfs.engine.staged import Caller
from ckptfs.fs import CkptFS
from ckptfs.fuse import kernel as k
from ckptfs.fuse.notify import Notifier
from ckptfs.fuse.ops import Ops, Reply
from ckptfs.fuse.readahead import READ_AHEAD_KB, _fuse_devs_at, raise_readahead

log = logging.getLogger("ckptfs.fuse")

MAX_WRITE = 1 << 20  # 1 MiB per WRITE (max_pages 256)
BUFSIZE = MAX_WRITE + 4096  # a request: headers, names and up to MAX_WRITE bytes of data
MAX_WORKERS = 16  # each holds a 1 MiB request buffer (and a 1 MiB read buffer once it served a READ)
MS_NOSUID, MS_NODEV = 2, 4
MNT_DETACH = 2


class NativeUnavailable(Exception):
    """The native transport cannot mount here (no /dev/fuse, no rights, no fusermount3)."""


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def mount_options(allow_other: bool) -> str:
    return "default_permissions" + (",allow_other" if allow_other else "")


def kernel_mount(target: str, source: str, allow_other: bool, dev: str = "/dev/fuse") -> int:
    """Open ``/dev/fuse`` and mount it at ``target``; the connection's fd.  Not root: the setuid
    ``fusermount3`` opens the device and passes the fd back, so a ``/dev/fuse`` this user may not
    open (mode 0600) is no obstacle (issue 26: it was opened here first, and failed)."""
    if os.geteuid() != 0:
        return fusermount_mount(target, source, allow_other)
    try:
        fd = os.open(dev, os.O_RDWR | os.O_CLOEXEC)
    except OSError as e:
        raise NativeUnavailable(f"{dev}: {e.strerror}") from None
    if os.geteuid() == 0:
        st = os.stat(target)
        opts = (f"fd={fd},rootmode={stat.S_IFMT(st.st_mode):o},user_id={os.getuid()},"
                f"group_id={os.getgid()},{mount_options(allow_other)}")
        libc = _libc()
        if libc.mount(source.encode(), target.encode(), b"fuse.ckptfs", MS_NOSUID | MS_NODEV, opts.encode()) == 0:
            return fd
        err = ctypes.get_errno()
        os.close(fd)
        raise NativeUnavailable(f"mount({target}): {os.strerror(err)}")
    os.close(fd)
    return fusermount_mount(target, source, allow_other)  # (not reached: root mounts with mount(2))


def fusermount_mount(target: str, source: str, allow_other: bool) -> int:
    """Mount through the setuid ``fusermount3``, which passes the fd back (SCM_RIGHTS)."""
    exe = shutil.which("fusermount3")
    if exe is None:
        raise NativeUnavailable("fusermount3 not found (apt-get install fuse3)")
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        opts = f"rw,nosuid,nodev,fsname={source},subtype=ckptfs,{mount_options(allow_other)}"
        env = dict(os.environ, _FUSE_COMMFD=str(theirs.fileno()))
        proc = subprocess.run([exe, "-o", opts, "--", target], env=env, pass_fds=(theirs.fileno(),),
                              capture_output=True, text=True)
        theirs.close()
        if proc.returncode != 0:
            raise NativeUnavailable(f"fusermount3: {proc.stderr.strip() or proc.returncode}")
        _, fds, _, _ = socket.recv_fds(ours, 1, 1)
        if not fds:
            raise NativeUnavailable("fusermount3 passed no fd")
        os.set_inheritable(fds[0], False)
        return fds[0]
    finally:
        ours.close()
        if theirs.fileno() >= 0:
            theirs.close()


def unmount(target: str, lazy: bool = True) -> None:
    """Detach the mount at ``target`` (never a request to it: S2)."""
    if os.geteuid() == 0:
        if _libc().umount2(target.encode(), MNT_DETACH if lazy else 0) == 0:
            return
        log.info("umount2(%s): %s", target, os.strerror(ctypes.get_errno()))
        return
    exe = shutil.which("fusermount3")
    if exe:
        subprocess.run([exe, "-uz" if lazy else "-u", target], capture_output=True)


class Session:
    """One FUSE connection: INIT, the worker pool, replies (S1)."""

    def __init__(self, fd: int, ops: Ops, *, passthrough: bool = False, debug: bool = False) -> None:
        self.fd = fd
        self.ops = ops
        self.want_passthrough = passthrough
        self.passthrough = False  # negotiated
        self.debug = debug
        self.proto_minor = 0
        self.lock = threading.Lock()
        self.idle = 0
        self.workers: list[threading.Thread] = []
        self.done = threading.Event()
        self.stats = ops.fs.stats
        self.keys = {op: "fuse_" + name.lower() for op, name in k.NAMES.items()}  # request counters
        # microseconds spent in each opcode's handler, reply included (the ledger's profile: bench/ledger.py)
        self.us_keys = {op: "fuse_us_" + name.lower() for op, name in k.NAMES.items()}

    # ------------------------------------------------------------ replies
    def reply(self, unique: int, payload: Any) -> None:
        parts = payload if isinstance(payload, list) else [payload]
        total = k.OUT_HEADER.size + sum(len(p) for p in parts)
        try:
            os.writev(self.fd, [k.OUT_HEADER.pack(total, 0, unique), *parts])
        except OSError as e:
            if e.errno != errno.ENOENT:  # ENOENT: the request was interrupted meanwhile
                log.warning("reply to %d failed: %s", unique, e)

    def reply_err(self, unique: int, err: int) -> None:
        try:
            os.write(self.fd, k.OUT_HEADER.pack(k.OUT_HEADER.size, -err, unique))
        except OSError as e:
            if e.errno != errno.ENOENT:
                log.warning("error reply to %d failed: %s", unique, e)

    # ------------------------------------------------------------ INIT
    def init(self) -> None:
        buf = bytearray(BUFSIZE)
        while True:
            try:
                os.readv(self.fd, [buf])
                break
            except InterruptedError:
                continue
        length, opcode, unique, *_ = k.IN_HEADER.unpack_from(buf)
        if opcode != k.INIT:
            raise NativeUnavailable(f"first request was opcode {opcode}, not INIT")
        major, minor, max_ra, kflags, kflags2 = k.INIT_IN.unpack_from(buf, k.IN_HEADER.size)
        if major != k.KERNEL_MAJOR or minor < 31:
            self.reply_err(unique, errno.EPROTO)
            raise NativeUnavailable(f"kernel FUSE protocol {major}.{minor} is too old (need 7.31)")
        self.proto_minor = min(minor, k.KERNEL_MINOR)
        # no HANDLE_KILLPRIV: the kernel clears setuid/setgid on a write by another user itself
        # (pjdfstest chmod/12)
        # DONT_MASK: CREATE, MKDIR and MKNOD carry the creator's umask unapplied, so a directory's
        # default ACL is inherited without it, as natively (ckptfs/acl.py); every one of them applies it
        want = (k.ASYNC_READ | k.ATOMIC_O_TRUNC | k.BIG_WRITES | k.PARALLEL_DIROPS | k.AUTO_INVAL_DATA
                | k.ASYNC_DIO | k.MAX_PAGES | k.INIT_EXT | k.DONT_MASK)
        flags = kflags & want
        flags2 = 0
        if kflags & k.INIT_EXT and kflags2 & k.DIRECT_IO_ALLOW_MMAP:
            # shared mappings of direct-I/O handles (a checkpoint file's writer: np.memmap("w+");
            # the kernel keeps them coherent).  Isolated readers never share the writer's node
            # (nodes.py T5), so the writer's mapped pages reach nobody who must not see them
            flags2 |= k.DIRECT_IO_ALLOW_MMAP
        if self.want_passthrough and kflags & k.INIT_EXT and kflags2 & k.PASSTHROUGH:
            flags2 |= k.PASSTHROUGH
            self.passthrough = True
        out = k.INIT_OUT.pack(k.KERNEL_MAJOR, self.proto_minor, max_ra, flags & 0xFFFFFFFF, 64, 48, MAX_WRITE, 1,
                              MAX_WRITE // 4096, 0, flags2, 1 if self.passthrough else 0, 0)
        self.reply(unique, out)
        log.info("FUSE %d.%d (kernel %d.%d): flags=%#x flags2=%#x max_readahead=%d passthrough=%s",
                 k.KERNEL_MAJOR, self.proto_minor, major, minor, flags, flags2, max_ra, self.passthrough)

    # ------------------------------------------------------------ serving
    def start(self, n: int = 2) -> None:
        for _ in range(n):
            self._spawn()

    def _spawn(self) -> None:
        with self.lock:
            if len(self.workers) >= MAX_WORKERS:
                return
            t = threading.Thread(target=self._worker, name=f"ckptfs-fuse-{len(self.workers)}", daemon=True)
            self.workers.append(t)
            self.idle += 1
        t.start()

    def _worker(self) -> None:
        buf = bytearray(BUFSIZE)
        view = memoryview(buf)
        fd = self.fd
        while not self.done.is_set():
            try:
                n = os.readv(fd, [buf])
            except OSError as e:
                if e.errno in (errno.EINTR, errno.EAGAIN, errno.ENOENT):
                    continue  # ENOENT: the request was interrupted before we read it
                if e.errno != errno.ENODEV:
                    log.error("reading /dev/fuse: %s", e)
                self.done.set()
                break
            with self.lock:
                self.idle -= 1
                spawn = self.idle == 0
            if spawn:
                self._spawn()
            try:
                self.dispatch(view[:n])
            finally:
                with self.lock:
                    self.idle += 1

    def dispatch(self, req: memoryview) -> None:
        length, opcode, unique, nid, uid, gid, pid, extlen, _ = k.IN_HEADER.unpack_from(req)
        body = req[k.IN_HEADER.size:length - extlen * 8]
        ops = self.ops
        self.stats[self.keys.get(opcode, "fuse_other")] += 1
        if opcode == k.FORGET:
            ops.forget(nid, k.FORGET_IN.unpack_from(body)[0])
            return
        if opcode == k.BATCH_FORGET:
            count, _ = k.BATCH_FORGET_IN.unpack_from(body)
            off = k.BATCH_FORGET_IN.size
            for _i in range(count):
                fnid, nl = k.FORGET_ONE.unpack_from(body, off)
                off += k.FORGET_ONE.size
                ops.forget(fnid, nl)
            return
        if opcode == k.INTERRUPT:
            return  # every handler runs to completion; its reply answers the interrupted request
        if opcode == k.DESTROY:
            self.reply(unique, b"")
            self.done.set()
            return
        handler = ops.table.get(opcode)
        if handler is None:
            self.reply_err(unique, errno.ENOSYS)
            return
        node = ops.nodes.get(nid)
        if self.debug:
            log.debug("%s node=%d(%s) pid=%d", k.NAMES.get(opcode, opcode), nid,
                      node.path if node else None, pid)
        t0 = time.perf_counter()
        try:
            out = handler(node, nid, Caller(uid, gid, pid), body)
        except Reply:
            return
        except OSError as e:
            if self.debug:
                log.debug("%s node=%d -> %s", k.NAMES.get(opcode, opcode), nid, e)
            code = e.errno or errno.EIO
            if code == errno.ENOENT and node is not None and node.replaced and opcode in ops.ON_NODE:
                code = errno.ESTALE  # T6: its name was renamed over; the VFS looks the name up again
            self.reply_err(unique, code)
            self.stats[self.us_keys[opcode]] += int((time.perf_counter() - t0) * 1e6)
            return
        except Exception:
            log.exception("%s on node %d failed", k.NAMES.get(opcode, opcode), nid)
            self.reply_err(unique, errno.EIO)
            return
        self.reply(unique, out)
        self.stats[self.us_keys[opcode]] += int((time.perf_counter() - t0) * 1e6)


def serve_native(fs: CkptFS, mountpoint: str, *, allow_other: bool = False, debug: bool = False,
                 timeout: float = 0.0, passthrough: bool = True) -> None:
    """Mount ``fs`` at ``mountpoint`` with the native transport and serve until unmounted."""
    os.umask(0)  # every create applies the creator's umask itself (FUSE_DONT_MASK, ckptfs/acl.py)
    target = os.path.realpath(mountpoint)
    before = _fuse_devs_at(target)
    fd = kernel_mount(target, f"ckptfs:{fs.backing_label}"[:200], allow_other)
    ops = Ops(fs, timeout=timeout)
    session = Session(fd, ops, passthrough=passthrough and os.geteuid() == 0, debug=debug)
    notifier = Notifier(fd, ops)
    stopping = threading.Event()

    def stop(signum: int, frame: Any) -> None:
        if not stopping.is_set():
            stopping.set()
            log.info("signal %d: unmounting %s", signum, target)
            threading.Thread(target=unmount, args=(target,), daemon=True).start()

    old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        session.init()
        if session.passthrough:
            from ckptfs.fuse.passthrough import Passthrough

            Passthrough(fd, ops).install()
        fs.stats["transport_native"] = 1
        ra_kb = int(os.environ.get("CKPTFS_READ_AHEAD_KB", READ_AHEAD_KB))
        if ra_kb > 0:
            threading.Thread(target=raise_readahead, args=(target, before, ra_kb),
                             name="ckptfs-readahead", daemon=True).start()
        notifier.start(fs.events)
        session.start()
        while not session.done.wait(0.5):
            if stopping.is_set() and not _mounted(target, before):
                break
        session.done.set()
    finally:
        notifier.stop()
        for s, h in old.items():
            signal.signal(s, h)
        if not session.done.is_set() or stopping.is_set():
            unmount(target)
        fs.shutdown()
        try:
            os.close(fd)
        except OSError:
            pass
        log.info("native transport stopped")


def _mounted(target: str, before: list[str]) -> bool:
    return any(d not in before for d in _fuse_devs_at(target))
