"""Is the process closing a file dying of a signal?

When a writer is killed, the kernel closes its files during exit and FUSE
still delivers FLUSH.  At that moment ``/proc/<pid>/stat`` has PF_EXITING set
in ``flags`` (field 9) and ``exit_code`` (field 52) holds the terminating signal
(a normal exit shows ``status << 8``, i.e. low 7 bits zero).
"""

from __future__ import annotations

import os
import sys
import time

PF_EXITING = 0x00000004


def parse_stat(text: str) -> tuple[int, int | None]:
    """(flags, exit_code) from the text of /proc/<pid>/stat."""
    rest = text[text.rindex(")") + 2 :].split()
    flags = int(rest[6])  # field 9
    exit_code = int(rest[49]) if len(rest) > 49 else None  # field 52 (Linux >= 3.5)
    return flags, exit_code


def _read_proc(pid: int, name: str) -> str:
    """The text of /proc/<pid>/<name> (raw os calls: these run on request paths, e.g. every
    flush; no buffered-file setup per call).  Raises OSError."""
    fd = os.open(f"/proc/{pid}/{name}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        parts = []
        while True:
            b = os.read(fd, 8192)
            if not b:
                return b"".join(parts).decode("ascii", "replace")
            parts.append(b)
    finally:
        os.close(fd)


def exit_state(pid: int) -> tuple[int | None, int | None]:
    """(signal, status) of ``pid`` if it is exiting, its files still open being closed by the
    kernel: the signal it dies of, or the non-zero status of a normal exit (``exit(1)``,
    ``os._exit(2)``); (None, None) for a live process or a zero exit.  One read of /proc per call
    (it runs on every writer's flush).

    Unknown (no /proc, process already gone) counts as a live close; the format checks are the
    second line of defence.  macOS: the signal only (``darwin.killing_signal``)."""
    if pid <= 0:
        return None, None
    if sys.platform == "darwin":
        from ckptfs import darwin

        return darwin.killing_signal(pid), None
    try:
        flags, exit_code = parse_stat(_read_proc(pid, "stat"))
    except (OSError, ValueError, IndexError):
        return None, None
    if not flags & PF_EXITING or not exit_code:
        return None, None
    if exit_code & 0x7F:
        return exit_code & 0x7F, None
    return None, (exit_code >> 8) or None


def killing_signal(pid: int) -> int | None:
    """Signal number if ``pid`` is exiting because of a signal, else None (:func:`exit_state`)."""
    return exit_state(pid)[0]


# thread id -> (its process id, when read): a thread's process never changes while the thread
# lives, and its number is reused only after the kernel has handed out every other pid number
# since (pid_max, 32,768 at least), which no system does within TGID_TTL.  One request asks several
# times (writer tracking, visibility, groups): each read of /proc/PID/status costs ~20 us (issue 27)
TGID_TTL = 0.05
_tgids: dict[int, tuple[int, float]] = {}


def tgid(pid: int) -> int:
    """The process (thread group) id of thread ``pid``; ``pid`` itself if unknown.

    FUSE reports the calling *thread*; a group's writers are tracked per process
    so that a helper thread exiting is not taken for the writer dying.  An answer read within the
    last ``TGID_TTL`` seconds is reused (see ``_tgids``)."""
    now = time.monotonic()
    hit = _tgids.get(pid)
    if hit is not None and now - hit[1] < TGID_TTL:
        return hit[0]
    try:
        text = _read_proc(pid, "status")
        at = text.index("\nTgid:") + 6
        t = int(text[at:text.index("\n", at)])
    except (OSError, ValueError, IndexError):
        return pid
    if len(_tgids) >= 4096:
        _tgids.clear()
    _tgids[pid] = (t, now)
    return t


def parent(pid: int) -> int | None:
    """The parent process id of ``pid`` (None if unknown)."""
    try:
        text = _read_proc(pid, "stat")
        return int(text[text.rindex(")") + 2 :].split()[1])  # field 4
    except (OSError, ValueError, IndexError):
        return None


def is_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (or when /proc cannot tell)."""
    try:
        text = _read_proc(pid, "stat")
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        return text[text.rindex(")") + 2] not in "ZX"
    except (ValueError, IndexError):
        return True


def groups(pid: int) -> set[int]:
    """Supplementary group ids of ``pid`` (empty if unknown)."""
    try:
        for line in _read_proc(pid, "status").splitlines():
            if line.startswith("Groups:"):
                return {int(g) for g in line.split()[1:]}
    except (OSError, ValueError):
        pass
    return set()


# Syscall numbers of the calls a FUSE RENAME of a name to a hidden name can come from (libfuse
# hides an open file before an unlink or a rename over it): x86_64 and aarch64.
_RENAME_SYSCALLS = {"x86_64": {82, 264, 316}, "aarch64": {38, 276}}
_UNLINK_SYSCALLS = {"x86_64": {87, 263}, "aarch64": {35}}


def blocked_in(tid: int) -> str | None:
    """"rename" or "unlink" if thread ``tid`` is blocked in that system call now (from
    /proc/TID/syscall, root only); None when unknown (another call, another platform, no /proc)."""
    import platform

    arch = platform.machine()
    try:
        with open(f"/proc/{tid}/syscall") as f:
            nr = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    if nr in _RENAME_SYSCALLS.get(arch, ()):
        return "rename"
    if nr in _UNLINK_SYSCALLS.get(arch, ()):
        return "unlink"
    return None


def writers_under(directory: str) -> list[tuple[int, str, str]]:
    """(pid, command name, file) for every file at or under ``directory``, on its filesystem, that a
    process other than this one holds open for writing (from /proc/PID/fd and fdinfo); empty where
    /proc cannot tell."""
    root = os.path.realpath(directory).rstrip("/") + "/"
    try:
        dev = os.stat(directory).st_dev
    except OSError:
        return []
    me = os.getpid()
    out: list[tuple[int, str, str]] = []
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return out
    for pid in pids:
        if pid == me:
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if not target.startswith(root):
                continue
            try:
                if os.stat(f"/proc/{pid}/fd/{fd}").st_dev != dev:
                    continue  # on another filesystem (a dead mount's file: ENOTCONN below, skipped)
            except OSError:
                continue
            try:
                flags = next(int(ln.split()[1], 8) for ln in _read_proc(pid, f"fdinfo/{fd}").splitlines()
                             if ln.startswith("flags:"))
            except (OSError, StopIteration, ValueError, IndexError):
                continue
            if flags & (os.O_WRONLY | os.O_RDWR):
                try:
                    comm = _read_proc(pid, "comm").strip()
                except OSError:
                    comm = "?"
                out.append((pid, comm, target))
    return out


def holds_open(pid: int, path: str) -> bool:
    """Whether the process of thread ``pid`` has a file descriptor open on ``path`` (an absolute
    path as /proc/PID/fd shows it).  Read from the fd table's links, never by stat: the path may be
    on the mount this daemon serves.  False where /proc cannot tell."""
    t = tgid(pid)
    try:
        fds = os.listdir(f"/proc/{t}/fd")
    except OSError:
        return False
    for fd in fds[:4096]:
        try:
            if os.readlink(f"/proc/{t}/fd/{fd}") == path:
                return True
        except OSError:
            continue
    return False
