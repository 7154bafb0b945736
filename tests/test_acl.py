"""POSIX ACLs through the mount: a directory's default ACL is inherited by what is created in it,
and the creator's umask applies only where there is none, as on ext4 (ckptfs/acl.py).

The oracle is the kernel itself: the same creations in a native directory of the same filesystem.
The mount's new regular files are made in ``.ckptfs/staging`` and renamed into place, so they
inherited nothing before (a shared project directory's ``setfacl -d -m g:team:rwX`` did not reach
a new checkpoint); and the kernel applied the umask before the daemon saw the mode, so a
directory's default ACL was masked by it where ext4 ignores it."""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

import pytest
from conftest import Mount, run_py
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptfs import acl

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the ACLs name other users: root sets them")


def _acl_value(entries: list[tuple[int, int, int]]) -> bytes:
    return acl.encode(entries)


NOID = 0xFFFFFFFF


@st.composite
def default_acls(draw) -> list[tuple[int, int, int]]:
    """A valid default ACL: the three base entries, named users and groups (ascending ids), and a
    mask wherever there is a named entry (the kernel requires one), sometimes also without."""
    perm = st.integers(0, 7)
    users = sorted(draw(st.sets(st.integers(1, 70000), max_size=3)))
    groups = sorted(draw(st.sets(st.integers(1, 70000), max_size=3)))
    out = [(acl.USER_OBJ, draw(perm), NOID)]
    out += [(acl.USER, draw(perm), u) for u in users]
    out.append((acl.GROUP_OBJ, draw(perm), NOID))
    out += [(acl.GROUP, draw(perm), g) for g in groups]
    if users or groups or draw(st.booleans()):
        out.append((acl.MASK, draw(perm), NOID))
    out.append((acl.OTHER, draw(perm), NOID))
    return out


def _made(d: Path, name: str, mode: int, umask: int, kind: str) -> tuple[int, bytes | None]:
    old = os.umask(umask)
    try:
        p = d / name
        if kind == "file":
            os.close(os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, mode))
        else:
            os.mkdir(p, mode)
    finally:
        os.umask(old)
    try:
        access = os.getxattr(p, acl.ACCESS)
    except OSError as e:
        assert e.errno == errno.ENODATA, e
        access = None
    return stat.S_IMODE(os.lstat(p).st_mode), access


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(default=st.one_of(st.none(), default_acls()), mode=st.integers(0, 0o7777), umask=st.integers(0, 0o777),
       kind=st.sampled_from(["file", "dir"]))
def test_inheritance_matches_the_kernel(tmp_path: Path, default, mode: int, umask: int, kind: str) -> None:
    """acl.create_mode gives, for every default ACL, mode and umask, the mode and access ACL the
    kernel gives a file (or directory) created natively in such a directory."""
    d = tmp_path / f"d{os.urandom(6).hex()}"
    d.mkdir()
    if default is not None:
        os.setxattr(d, acl.DEFAULT, _acl_value(default))
    value = os.getxattr(d, acl.DEFAULT) if default is not None else None
    got_mode, got_access = _made(d, "new", mode, umask, kind)
    want_mode, want_access = acl.create_mode(value, mode, umask)
    if kind == "dir":
        want_mode &= ~(stat.S_ISUID | stat.S_ISGID)  # mkdir keeps neither (ext4), nor the sticky bit's absence matters
        got_mode &= ~(stat.S_ISUID | stat.S_ISGID)
    else:
        want_mode &= 0o7777
    assert (oct(got_mode), got_access) == (oct(want_mode & 0o7777), want_access)
    if default is not None and kind == "dir":
        assert acl.in_place_mode(value, mode, umask) == mode  # mkdir in place: the backing inherits
    elif default is None:
        assert acl.in_place_mode(value, mode, umask) == mode & ~umask


def test_a_malformed_default_acl_value_is_not_used() -> None:
    """What cannot be parsed gives what a directory without a default ACL gives (hostile input)."""
    good = _acl_value([(acl.USER_OBJ, 7, NOID), (acl.GROUP_OBJ, 5, NOID), (acl.OTHER, 0, NOID)])
    for bad in (b"", b"\x02\x00\x00", good[:-1], b"\x01\x00\x00\x00" + good[4:], good + good[4:12],
                _acl_value([(acl.USER_OBJ, 7, NOID), (0x40, 7, NOID), (acl.GROUP_OBJ, 5, NOID), (acl.OTHER, 0, NOID)]),
                b"\x02\x00\x00\x00" + b"\x01\x00\x07\x00\xff\xff\xff\xff" * (acl.MAX_ENTRIES + 1)):
        assert acl.create_mode(bad, 0o666, 0o022) == (0o644, None)
        assert acl.in_place_mode(bad, 0o777, 0o022) == 0o755
    assert acl.create_mode(good, 0o666, 0o022) == (0o640, None)  # equivalent to a mode: no ACL stored


MAKE = r"""
import json, os, stat, sys
d, umask = sys.argv[1], int(sys.argv[2], 8)
os.umask(umask)
def mkfile(name, mode):
    fd = os.open(os.path.join(d, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY, mode)
    os.write(fd, b"data\n")
    os.close(fd)
mkfile("notes.txt", 0o666)
mkfile("model.pt", 0o644)
mkfile("run.sh", 0o777)
os.mkdir(os.path.join(d, "step_1"), 0o777)
mkfile("step_1/model.pt", 0o666)
os.mknod(os.path.join(d, "plain.dat"), 0o666 | stat.S_IFREG)
os.mkfifo(os.path.join(d, "fifo"), 0o666)
out = {}
for name in sorted(["notes.txt", "model.pt", "run.sh", "step_1", "step_1/model.pt", "plain.dat", "fifo"]):
    p = os.path.join(d, name)
    got = [oct(stat.S_IMODE(os.lstat(p).st_mode))]
    for x in ("system.posix_acl_access", "system.posix_acl_default"):
        try:
            got.append(os.getxattr(p, x, follow_symlinks=False).hex())
        except OSError as e:
            got.append(e.errno)
    out[name] = got
print(json.dumps(out))
"""

TEAM = [(acl.USER_OBJ, 7, NOID), (acl.USER, 6, 65534), (acl.GROUP_OBJ, 5, NOID), (acl.GROUP, 7, 4242),
        (acl.MASK, 7, NOID), (acl.OTHER, 0, NOID)]


def _tree(root: Path, default: list | None, umask: int) -> dict:
    d = root / "shared"
    d.mkdir()
    if default is not None:
        os.setxattr(d, acl.DEFAULT, _acl_value(default))
    return json.loads(run_py(MAKE.replace("sys.argv[1], int(sys.argv[2], 8)", f"{str(d)!r}, {umask}")).stdout)


@pytest.mark.parametrize("umask", [0o022, 0o077])
@pytest.mark.parametrize("default", [TEAM, None], ids=["default-acl", "no-acl"])
def test_new_files_and_directories_inherit_as_natively(tmp_path: Path, default, umask: int) -> None:
    """Files (plain, checkpoint-named, in a group's directory, made by mknod), directories and a
    fifo created through the mount get the modes and ACLs the same creations get natively: the
    directory's default ACL, with the umask ignored; without one, the umask applied."""
    native = tmp_path / "native"
    native.mkdir()
    want = _tree(native, default, umask)
    if default is not None:  # the oracle says what this test is about: inherited, unmasked
        assert want["notes.txt"][1] != errno.ENODATA and want["notes.txt"][0] == "0o660"
        assert want["step_1"][2] != errno.ENODATA
    else:
        assert want["notes.txt"] == [oct(0o666 & ~umask), errno.ENODATA, errno.ENODATA]
    d = tmp_path / "ckpts"
    d.mkdir()
    m = Mount(d).start()
    try:
        assert _tree(m.path, default, umask) == want
    finally:
        m.stop()
    assert _read(d / "shared") == want  # unmounted: the plain files hold it


def _read(d: Path) -> dict:
    out = {}
    for name in ("notes.txt", "model.pt", "run.sh", "step_1", "step_1/model.pt", "plain.dat", "fifo"):
        p = d / name
        got: list = [oct(stat.S_IMODE(os.lstat(p).st_mode))]
        for x in (acl.ACCESS, acl.DEFAULT):
            try:
                got.append(os.getxattr(p, x, follow_symlinks=False).hex())
            except OSError as e:
                got.append(e.errno)
        out[name] = got
    return dict(sorted(out.items()))
