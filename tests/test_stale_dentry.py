"""A new file whose writer was killed is never committed, but the kernel may
still hold its dentry (entry timeout): re-creating the path at once must work."""

from __future__ import annotations

import os
import signal

from conftest import Mount


def test_recreate_after_killed_writer_of_new_file(mnt: Mount) -> None:
    path = mnt.path / "new.bin"
    for attempt in range(3):
        pid = os.fork()
        if pid == 0:
            with open(path, "wb") as f:
                f.write(b"x" * 100_000)
                f.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status)
        assert not path.exists()  # the dying writer's version is not committed
        with open(path, "wb") as f:  # O_CREAT|O_TRUNC through a possibly stale dentry
            f.write(b"complete %d" % attempt)
        assert path.read_bytes() == b"complete %d" % attempt
        os.unlink(path)


def test_killed_truncating_writer_never_visible(mnt: Mount) -> None:
    """Found by the resume campaign: a reader right after the kill saw an empty `latest` pointer
    (the kernel's cached size 0 of the killed O_TRUNC; fixed by invalidating the path, kcache.py)."""
    path = mnt.path / "latest"
    path.write_text("5")
    for _ in range(5):
        pid = os.fork()
        if pid == 0:
            with open(path, "w"):  # O_TRUNC, then killed before writing, the file still open
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(0)
        _, st = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(st)
        assert path.read_text() == "5"
        assert os.stat(path).st_size == 1
