"""Mounting: ``ckptfs mount`` (background: :func:`spawn_daemon`; ``-f``: the daemon itself),
``umount``, ``recover``; and every ``mount`` option, the integrity ones included."""

from __future__ import annotations

import argparse
import errno
import logging
import math
import os
import shutil
import stat
import subprocess
import sys
import time

from ckptfs import META_DIR, __version__, procinfo, trust
from ckptfs.backing import OsBackingStore
from ckptfs.cli import mirror as mirror_cli
from ckptfs.cli.common import CliError, daemon_pid, fusermount, is_ckptfs_mount
from ckptfs.procinfo import is_alive
from ckptfs.xattrs import X_PID

log = logging.getLogger("ckptfs")


def _daemon_gone(d: str) -> bool:
    """Whether the ckptfs mount at ``d`` has lost its daemon.  Asked with a request that always
    reaches the daemon (getxattr: the kernel caches no extended attributes), never ``stat``, which
    the kernel answers from its attribute cache for up to ``--cache-timeout`` seconds after the
    daemon died (issue 24: 11 of 26 SIGKILLed daemons were taken for live mounts)."""
    try:
        os.getxattr(d, X_PID)
    except OSError as e:
        return e.errno in (errno.ENOTCONN, errno.ECONNABORTED)
    return False


def _unmount_stale(d: str) -> None:
    print(f"ckptfs: {d}: stale ckptfs mount (daemon gone); unmounting it", file=sys.stderr)
    res = fusermount(d, lazy=True)
    if res.returncode != 0:
        raise CliError(f"{d}: stale mount could not be removed: {res.stderr.strip()}") from None


def check_mountpoint(d: str) -> None:
    """Raise CliError unless ``d`` can take a new ckptfs mount (cleans stale ones)."""
    if is_ckptfs_mount(d) and _daemon_gone(d):
        _unmount_stale(d)
        return check_mountpoint(d)
    try:
        st = os.stat(d)
    except FileNotFoundError:
        raise CliError(f"{d}: no such directory") from None
    except OSError as e:
        if e.errno == errno.ENOTCONN and is_ckptfs_mount(d):
            _unmount_stale(d)
            return check_mountpoint(d)
        raise CliError(f"{d}: {e.strerror}") from None
    if not os.path.isdir(d) or not (st.st_mode & 0o170000) == 0o040000:
        raise CliError(f"{d}: not a directory")
    if is_ckptfs_mount(d) or daemon_pid(d) is not None:
        raise CliError(f"{d}: already a ckptfs mount (run: ckptfs umount {d})")


def check_unprivileged(euid: int, which=shutil.which, allow_other: bool = False,
                       fuse_conf: str = "/etc/fuse.conf") -> None:
    """Not root: mounting needs fusermount3 (the setuid helper of fuse3), and ``--allow-other``
    needs ``user_allow_other`` in /etc/fuse.conf (else fusermount3 refuses: a usage error, exit 2)."""
    if euid != 0 and which("fusermount3") is None:
        raise CliError("not root and fusermount3 is missing: install fuse3 (apt install fuse3) "
                       "or run ckptfs mount as root")
    if euid != 0 and allow_other:
        try:
            with open(fuse_conf) as f:
                ok = any(line.split("#", 1)[0].strip() == "user_allow_other" for line in f)
        except OSError:
            ok = False
        if not ok:
            raise CliError(f"--allow-other as a user needs 'user_allow_other' in {fuse_conf} "
                           "(ask root to add it), or mount as root")


def check_no_writers(d: str) -> None:
    """Refuse to mount over a directory a process is writing into: its open files stay on the
    directory underneath, so its writes would bypass ckptfs and vanish under the mount."""
    found = procinfo.writers_under(d)
    if found:
        pid, comm, path = found[0]
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise CliError(f"{d}: process {pid} ({comm}) has {path} open for writing{more}; its writes would "
                       f"bypass ckptfs and be hidden under the mount: stop it first, or pass --force")


def warn_weak_backing(backing: str) -> None:
    """Warn where the backing filesystem cannot make writes durable: ckptfs is only as durable as
    what it writes to (tmpfs and ramfs lose everything at power loss; NFS without ``sync`` may
    acknowledge an fsync that did not reach stable storage)."""
    from ckptfs.mounts import containing

    e = containing(backing)
    if e is None:
        return
    opts = set(e.options.split(",")) | set(e.super_options.split(","))
    if e.fstype in ("tmpfs", "ramfs"):
        why = f"{e.fstype} keeps nothing across a power loss or reboot"
    elif e.fstype.startswith("nfs") and "sync" not in opts:
        why = f"{e.fstype} mounted without 'sync' may acknowledge writes before they are stable"
    else:
        return
    print(f"ckptfs: warning: {backing} is on {e.fstype}: {why}; crash consistency holds, durability is "
          "only as good as the backing store", file=sys.stderr)


def check_fuse_available() -> None:
    dev = os.environ.get("CKPTFS_DEV_FUSE", "/dev/fuse")  # overridable for tests
    if sys.platform.startswith("linux") and not os.path.exists(dev):
        raise CliError(f"{dev} is missing: load the fuse module (modprobe fuse) "
                       "or give the container the device (--device /dev/fuse --cap-add SYS_ADMIN)")
    from ckptfs.fuse.adapter import FuseUnavailable, load_mfusepy

    try:
        load_mfusepy()
    except FuseUnavailable as e:
        raise CliError(str(e)) from None


# ----------------------------------------------------------------- commands
def cmd_mount(a: argparse.Namespace) -> int:
    d = os.path.abspath(a.dir)
    backing = os.path.abspath(a.backing) if a.backing else d
    mirror_cli.check_mount_args(a)
    check_mountpoint(d)
    if a.backing:
        if not os.path.isdir(backing):
            raise CliError(f"{a.backing}: backing directory does not exist")
        if is_ckptfs_mount(backing):
            raise CliError(f"{a.backing}: is itself a ckptfs mount")
    check_fuse_available()
    check_unprivileged(os.geteuid(), allow_other=a.allow_other)
    store = OsBackingStore(backing)
    try:
        trust.check_meta_dir(store, backing)  # before anything reads .ckptfs (issue 26)
    finally:
        store.shutdown()
    if not a.force:
        check_no_writers(backing)
    warn_weak_backing(backing)
    if a.metrics:
        from ckptfs.metrics import MetricsAddressError, check_bindable, parse_address

        try:
            check_bindable(*parse_address(a.metrics))  # a clear error now, before anything is mounted
        except MetricsAddressError as e:
            raise CliError(str(e)) from None
    if not a.foreground:
        return spawn_daemon(a, d)
    return run_foreground(a, d, backing)


def spawn_daemon(a: argparse.Namespace, d: str) -> int:
    """Start ``ckptfs mount -f`` detached and wait until it serves (or failed)."""
    rfd, wfd = os.pipe()
    argv = [sys.executable, "-m", "ckptfs", "mount", "-f", d, "--commit", a.commit]
    if a.backing:
        argv += ["--backing", a.backing]
    if a.no_format_check:
        argv.append("--no-format-check")
    if a.allow_other:
        argv.append("--allow-other")
    argv += ["--transport", a.transport, "--cache-timeout", str(a.cache_timeout)]
    if a.no_passthrough:
        argv.append("--no-passthrough")
    if a.metrics:
        argv += ["--metrics", a.metrics]
    for opt in ("keep_last", "keep_every", "idle_seal"):
        if getattr(a, opt) is not None:
            argv += ["--" + opt.replace("_", "-"), str(getattr(a, opt))]
    argv += _integrity_argv(a)
    argv += mirror_cli.mount_argv(a)
    env = dict(os.environ, CKPTFS_READY_FD=str(wfd))
    pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = pkg_root + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen(argv, env=env, pass_fds=(wfd,), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    os.close(wfd)
    try:
        with os.fdopen(rfd) as r:
            ready = r.read()
    except BaseException:
        # Ctrl-C while the daemon starts: it runs in its own session, so nothing else stops it,
        # and it mounted after this command had gone (the demo's Ctrl-C test left a mount behind
        # under load).  Stop it by its PID: SIGTERM unmounts what it mounted
        _stop_starting_daemon(proc, d)
        raise
    if ready.startswith("ready"):
        assert proc.stderr is not None
        proc.stderr.close()
        print(f"ckptfs: mounted {d} (daemon pid {proc.pid}, commit={a.commit})")
        return 0
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    rc = proc.wait()
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    raise CliError(lines[-1].removeprefix("ckptfs: error: ") if lines else "daemon exited during start",
                   rc if rc > 0 else 1)


def _stop_starting_daemon(proc: subprocess.Popen, d: str) -> None:
    """The daemon this command started, interrupted before it said ready: SIGTERM (its handler
    unmounts once it has mounted), then SIGKILL and a lazy unmount if it lingers."""
    import signal

    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    except OSError:
        pass
    if is_ckptfs_mount(d):
        fusermount(d, lazy=True)


def run_foreground(a: argparse.Namespace, d: str, backing: str) -> int:
    from ckptfs.fs import CkptFS
    from ckptfs.fuse.adapter import serve
    from ckptfs.log.journal import CorruptMetadata

    try:
        from ckptfs.fuse.session import NativeUnavailable
    except ImportError:  # (a platform without the native transport: nothing raises it)
        class NativeUnavailable(Exception):  # type: ignore[no-redef]
            pass

    store = OsBackingStore(backing)
    try:
        setup_logging(store, a.debug)
        rules = load_rules(store, a)
        try:
            fs = CkptFS(store, commit_mode=a.commit, check_formats=not a.no_format_check,
                        backing_label=backing, rules=rules, seal_parts=a.node_part, **_integrity_kwargs(a))
        except CorruptMetadata as e:
            raise CliError(f"{backing}: {e}; run 'ckptfs recover --rebuild {backing}'", 1) from None
        fs.mountpoint = os.path.realpath(d)
        log.info("ckptfs %s serving %s (backing %s, commit=%s)", __version__, d, backing, a.commit)
        if a.mirror:
            try:
                mirror_cli.start_mirror(fs, a)  # stops itself first at unmount (fs.on_shutdown)
            except CliError:
                fs.shutdown()
                raise
        if a.metrics:
            from ckptfs import metrics

            host, port = metrics.parse_address(a.metrics)
            try:
                metrics.serve(fs, host, port)
            except OSError as e:
                fs.shutdown()
                raise CliError(f"--metrics {a.metrics}: cannot serve: {e.strerror}") from None
            log.info("metrics at http://%s:%d/metrics", host, port)
        ready_fd = os.environ.pop("CKPTFS_READY_FD", None)
        if ready_fd:
            _signal_ready_when_mounted(d, int(ready_fd))
        try:
            serve(fs, d, allow_other=a.allow_other, debug=a.debug, transport=a.transport,
                  cache_timeout=a.cache_timeout, passthrough=not a.no_passthrough)
        except NativeUnavailable as e:
            fs.shutdown()
            raise CliError(f"cannot mount {d}: {e}{_device_hint()}", 2) from None
        log.info("unmounted %s", d)
    finally:
        store.shutdown()
    return 0


def _device_hint() -> str:
    """What to do where this user may not open ``/dev/fuse`` (fusermount3 opens it as the user)."""
    dev = os.environ.get("CKPTFS_DEV_FUSE", "/dev/fuse")
    if os.geteuid() == 0 or os.access(dev, os.R_OK | os.W_OK):
        return ""
    return (f" ({dev} is mode {stat.S_IMODE(os.stat(dev).st_mode):o}: uid {os.geteuid()} may not open it, "
            "and fusermount3 opens it as the user; make it 0666, as udev does on Debian, or mount as root)")


def load_rules(store: OsBackingStore, a: argparse.Namespace):
    """Group rules: defaults, then ``.ckptfs.toml`` in the backing root, then command-line flags."""
    import dataclasses

    from ckptfs.log.journal import read_whole
    from ckptfs.rules import CONFIG_NAME, ConfigError, RuleSet, parse_config

    rules = RuleSet()
    if store.exists(CONFIG_NAME):
        st, top = store.lstat(CONFIG_NAME), os.fstat(store.root_fd)
        if not stat.S_ISREG(st.st_mode):
            raise CliError(f"{CONFIG_NAME} is not a regular file (a link?): refused; ckptfs follows no link "
                           "it did not make", 2)
        if st.st_uid not in (0, os.geteuid(), top.st_uid) or st.st_mode & 0o022:
            # issue 26: another user's .ckptfs.toml in a shared (1777) root set keep_last = 1 and the
            # daemon deleted someone else's checkpoints
            raise CliError(f"{CONFIG_NAME} is owned by uid {st.st_uid} or writable by others: only the "
                           f"directory's owner (uid {top.st_uid}) or root configure ckptfs here; refused "
                           f"(if it is yours: chown {top.st_uid} {CONFIG_NAME} && chmod go-w {CONFIG_NAME})", 2)
        if st.st_size > 1 << 20:
            raise CliError(f"{CONFIG_NAME} is {st.st_size} bytes: not a configuration (at most 1 MiB)", 2)
        try:
            rules = parse_config(read_whole(store, CONFIG_NAME), CONFIG_NAME)
        except ConfigError as e:
            raise CliError(f"bad group configuration: {e}", 2) from None
    over = {k: v for k, v in (("keep_last", a.keep_last), ("keep_every", a.keep_every),
                               ("idle_seconds", a.idle_seal)) if v is not None}
    if getattr(a, "node_part", False):  # multi-node: a part sealed when idle (its marker lands elsewhere)
        over["rules"] = tuple(dataclasses.replace(r, idle_seal=True) for r in rules.rules)
    return dataclasses.replace(rules, **over) if over else rules


def _signal_ready_when_mounted(d: str, fd: int) -> None:
    """Tell the parent we serve as soon as the mount is live (background mode)."""
    import threading

    def wait() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if is_ckptfs_mount(d) and daemon_pid(d) == os.getpid():
                os.write(fd, b"ready\n")
                break
            time.sleep(0.02)
        os.close(fd)
        # from now on nothing may write to the parent's pipe
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)

    threading.Thread(target=wait, daemon=True).start()


def setup_logging(store: OsBackingStore, debug: bool) -> None:
    from ckptfs.log.journal import Journal

    trust.check_meta_dir(store, store.root_path if isinstance(store.root_path, str) else "")
    Journal(store).ensure_layout()
    fd = store.open(f"{META_DIR}/daemon.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    handler = logging.StreamHandler(os.fdopen(fd, "a", buffering=1))
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if debug else logging.INFO)


def cmd_umount(a: argparse.Namespace) -> int:
    d = os.path.abspath(a.dir)
    if not os.path.lexists(d):
        raise CliError(f"{d}: no such directory")
    if not is_ckptfs_mount(d):
        raise CliError(f"{d}: not a ckptfs mount")
    pid = daemon_pid(d)
    res = fusermount(d, lazy=a.lazy)
    if res.returncode != 0:
        msg = res.stderr.strip() or "unmount failed"
        hint = "" if a.lazy else " (files still open? close them, or use --lazy)"
        raise CliError(f"{d}: {msg}{hint}", 1)
    if pid is not None:
        deadline = time.monotonic() + a.timeout
        while is_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if is_alive(pid):
            raise CliError(f"daemon pid {pid} still finishing commits after {a.timeout}s", 1)
    print(f"ckptfs: unmounted {d}")
    return 0


def cmd_recover(a: argparse.Namespace) -> int:
    from ckptfs.log.journal import SNAPSHOT, CorruptMetadata
    from ckptfs.recovery import recover

    d = os.path.abspath(a.dir)
    if not os.path.isdir(d):
        raise CliError(f"{d}: no such directory")
    if is_ckptfs_mount(d):
        raise CliError(f"{d}: is mounted; the daemon recovers on mount")
    if not os.path.isdir(os.path.join(d, META_DIR)):
        raise CliError(f"{d}: not a ckptfs directory (no {META_DIR}): nothing to recover")
    store = OsBackingStore(d)
    try:
        if a.rebuild and store.exists(SNAPSHOT):
            bad = f"{SNAPSHOT}.corrupt.{int(time.time())}"
            store.rename(SNAPSHOT, bad)
            print(f"ckptfs: moved unreadable snapshot aside to {bad}; records start empty")
        try:
            rep = recover(store)
        except CorruptMetadata as e:
            raise CliError(f"{d}: {e}; rerun with --rebuild", 1) from None
        print(f"ckptfs: {rep.summary()}; {len(rep.files)} committed files")
    finally:
        store.shutdown()
    return 0


def _number(kind: type, least: float, what: str):
    """An argparse type: ``kind`` (int or float) of at least ``least``, with a one-line error."""
    def parse(v: str):
        try:
            n = kind(v)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {what}: {v!r}") from None
        if isinstance(n, float) and not math.isfinite(n):  # nan hung the mount, inf never sealed
            raise argparse.ArgumentTypeError(f"not a finite number: {v}")
        if n < least:
            raise argparse.ArgumentTypeError(f"must be >= {least}: {v}")
        return n
    return parse


_nonneg = _number(float, 0, "a number")  # seconds, rates
_count = _number(int, 0, "a whole number")  # generations
_positive = _number(int, 1, "a whole number")  # retention counts


def _add_integrity_args(m: argparse.ArgumentParser) -> None:
    m.add_argument("--on-corrupt", choices=("eio", "rollback"), default="eio",
                   help="corrupt committed file: fail with EIO (default) or serve its newest good kept generation")
    m.add_argument("--keep-generations", type=_count, default=None, metavar="N",
                   help="previous committed versions kept per overwritten file, every file (0 = none); "
                        "default: 1 where it serves, in checkpoint groups (a torn re-save rolls back "
                        "to it) and, with --on-corrupt rollback, every file")
    m.add_argument("--scrub-interval", type=_nonneg, default=86400.0, metavar="SECONDS",
                   help="background re-verification of all committed files every SECONDS (default 86400; 0 = off)")
    m.add_argument("--scrub-rate", type=_nonneg, default=64.0, metavar="MB/s",
                   help="read rate limit of the background scrub (default 64 MB/s; 0 = unlimited)")


def _integrity_argv(a: argparse.Namespace) -> list[str]:
    """The integrity options to pass on to the foreground daemon."""
    keep = [] if a.keep_generations is None else ["--keep-generations", str(a.keep_generations)]
    return ["--on-corrupt", a.on_corrupt, *keep,
            "--scrub-interval", str(a.scrub_interval), "--scrub-rate", str(a.scrub_rate)]


def _integrity_kwargs(a: argparse.Namespace) -> dict:
    return {"on_corrupt": a.on_corrupt, "keep_generations": a.keep_generations,
            "scrub_interval": a.scrub_interval, "scrub_rate_mb": a.scrub_rate}


def add_parsers(sub: argparse._SubParsersAction) -> None:
    m = sub.add_parser("mount", help="mount ckptfs over DIR (in place)")
    m.add_argument("dir")
    m.add_argument("--backing", help="serve this directory at DIR instead of DIR itself")
    m.add_argument("-f", "--foreground", action="store_true", help="stay in the foreground")
    m.add_argument("--commit", choices=("sync", "async"), default="sync",
                   help="sync: close() returns once durable (default); async: once staged")
    m.add_argument("--no-format-check", action="store_true",
                   help="commit any file closed by a live process, complete or not")
    m.add_argument("--allow-other", action="store_true", help="let other users access the mount")
    m.add_argument("--keep-last", type=_positive, metavar="K",
                   help="retention: keep the newest K sealed groups per directory (default: keep all)")
    m.add_argument("--keep-every", type=_positive, metavar="N",
                   help="retention: also keep every group whose step is a multiple of N")
    m.add_argument("--idle-seal", type=_nonneg, metavar="SECONDS",
                   help="seal marker-less groups after this long without activity (default 30)")
    m.add_argument("--debug", action="store_true")
    m.add_argument("--force", action="store_true",
                   help="mount even where processes have files under DIR open for writing")
    m.add_argument("--transport", choices=("auto", "kernel", "mfusepy"),
                   default=os.environ.get("CKPTFS_TRANSPORT", "auto"),
                   help="auto (default): our own /dev/fuse transport on Linux where it can mount "
                        "(root, or fusermount3), else mfusepy (libfuse; macOS)")
    m.add_argument("--cache-timeout", type=_nonneg, default=float(os.environ.get("CKPTFS_CACHE_TIMEOUT", 60)),
                   metavar="SECONDS", help="kernel entry/attribute cache timeout, native transport (default 60; "
                                           "every change the daemon makes is invalidated at once)")
    m.add_argument("--metrics", metavar="HOST:PORT",
                   help="serve Prometheus metrics at http://HOST:PORT/metrics (a bare PORT: 127.0.0.1)")
    m.add_argument("--no-passthrough", action="store_true",
                   help="serve reads through the daemon even where FUSE passthrough is available")
    _add_integrity_args(m)
    mirror_cli.add_mount_args(m)
    m.set_defaults(func=cmd_mount)

    u = sub.add_parser("umount", help="unmount, waiting for pending commits")
    u.add_argument("dir")
    u.add_argument("--lazy", action="store_true", help="detach now even if busy")
    u.add_argument("--timeout", type=float, default=300.0)
    u.set_defaults(func=cmd_umount)

    r = sub.add_parser("recover", help="run crash recovery on an unmounted directory")
    r.add_argument("dir")
    r.add_argument("--rebuild", action="store_true", help="set an unreadable snapshot aside")
    r.set_defaults(func=cmd_recover)
