"""POSIX surface through a real mount: what checkpoint code uses."""

from __future__ import annotations

import errno
import filecmp
import os
import shutil
import subprocess

import numpy as np
import pytest
import torch
from conftest import Mount

from ckptfs import META_DIR


def _sd(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(256, 256, generator=g), "b": torch.arange(17, dtype=torch.int64),
            "h": torch.randn(33, generator=g).to(torch.bfloat16), "meta": {"step": seed}}


def _equal(a: dict, b: dict) -> bool:
    return all(torch.equal(a[k], b[k]) for k in ("w", "b", "h")) and a["meta"] == b["meta"]


def xattr(p, name: str) -> str:
    return os.getxattr(str(p), name).decode()


@pytest.mark.portable
def test_torch_roundtrip_and_mmap(mnt: Mount) -> None:
    p = mnt.path / "model.pt"
    sd = _sd(1)
    torch.save(sd, p)
    assert _equal(torch.load(p), sd)
    assert _equal(torch.load(p, mmap=True, weights_only=True), sd)
    assert xattr(p, "user.ckptfs.status") == "committed"
    assert int(xattr(p, "user.ckptfs.size")) == p.stat().st_size
    assert xattr(p, "user.ckptfs.generation") == "1"


@pytest.mark.portable
def test_overwrite_keeps_generation_and_digest(mnt: Mount) -> None:
    import blake3

    p = mnt.path / "latest.pt"
    for gen in (1, 2, 3):
        torch.save(_sd(gen), p)
        assert xattr(p, "user.ckptfs.generation") == str(gen)
        assert xattr(p, "user.ckptfs.blake3") == blake3.blake3(p.read_bytes()).hexdigest()
    assert _equal(torch.load(p), _sd(3))
    assert xattr(p, "user.ckptfs.committed_at").endswith("Z")


def test_numpy_and_cp_large_file(mnt: Mount, tmp_path) -> None:
    arr = np.random.default_rng(0).standard_normal((512, 1024))
    np.save(mnt.path / "a.npy", arr)
    assert np.array_equal(np.load(mnt.path / "a.npy"), arr)
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(48 << 20) + b"tail")
    subprocess.run(["cp", str(big), str(mnt.path / "big.bin")], check=True)
    assert filecmp.cmp(big, mnt.path / "big.bin", shallow=False)
    shutil.copyfile(big, mnt.path / "big2.bin")
    assert filecmp.cmp(big, mnt.path / "big2.bin", shallow=False)


@pytest.mark.portable
def test_tmp_then_rename_over(mnt: Mount) -> None:
    final = mnt.path / "ckpt.pt"
    torch.save(_sd(1), final)
    tmp = mnt.path / "ckpt.pt.tmp"
    with open(tmp, "wb") as f:
        torch.save(_sd(2), f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    assert not tmp.exists()
    assert _equal(torch.load(final), _sd(2))
    assert xattr(final, "user.ckptfs.status") == "committed"


@pytest.mark.portable
def test_directory_rename_unlink_rmdir(mnt: Mount) -> None:
    d = mnt.path / "step_1.tmp"
    d.mkdir()
    torch.save(_sd(1), d / "model.pt")
    (d / "extra.json").write_text('{"a": 1}')
    os.rename(d, mnt.path / "step_1")
    assert sorted(os.listdir(mnt.path / "step_1")) == ["extra.json", "model.pt"]
    assert _equal(torch.load(mnt.path / "step_1" / "model.pt"), _sd(1))
    assert xattr(mnt.path / "step_1" / "model.pt", "user.ckptfs.status") == "committed"
    # rename a directory over an existing empty one
    (mnt.path / "empty").mkdir()
    os.rename(mnt.path / "step_1", mnt.path / "empty")
    assert (mnt.path / "empty" / "model.pt").exists()
    with pytest.raises(OSError) as e:
        os.rmdir(mnt.path / "empty")
    assert e.value.errno == errno.ENOTEMPTY
    os.unlink(mnt.path / "empty" / "model.pt")
    os.unlink(mnt.path / "empty" / "extra.json")
    os.rmdir(mnt.path / "empty")
    assert os.listdir(mnt.path) == []


@pytest.mark.portable
def test_truncate_append_symlink_chmod_utime_statfs(mnt: Mount) -> None:
    p = mnt.path / "log.txt"
    p.write_text("hello world\n")
    with open(p, "a") as f:
        f.write("more\n")
    assert p.read_text() == "hello world\nmore\n"
    os.truncate(p, 5)
    assert p.read_text() == "hello"
    with open(p, "r+b") as f:
        f.seek(1)
        f.write(b"E")
        f.truncate(3)
    assert p.read_bytes() == b"hEl"
    os.symlink("log.txt", mnt.path / "last")
    assert os.readlink(mnt.path / "last") == "log.txt"
    assert (mnt.path / "last").read_bytes() == b"hEl"
    os.chmod(p, 0o600)
    assert (p.stat().st_mode & 0o777) == 0o600
    os.utime(p, ns=(1_000_000_000, 2_000_000_000))
    assert p.stat().st_mtime_ns == 2_000_000_000
    st = os.statvfs(mnt.path)
    assert st.f_blocks > 0 and st.f_bsize > 0


@pytest.mark.portable
def test_read_your_writes_while_open(mnt: Mount) -> None:
    p = mnt.path / "open.bin"
    with open(p, "wb") as f:
        f.write(b"x" * 1000)
        f.flush()
        assert p.stat().st_size == 1000
        assert xattr(p, "user.ckptfs.status") == "staging"
        assert "open.bin" in os.listdir(mnt.path)
        with open(p, "rb") as r:
            assert r.read() == b"x" * 1000
    assert xattr(p, "user.ckptfs.status") == "committed"


@pytest.mark.portable
def test_user_xattrs_pass_through_and_status_is_read_only(mnt: Mount) -> None:
    p = mnt.path / "f.json"
    p.write_text("{}")
    os.setxattr(p, "user.note", b"hi")
    assert os.getxattr(p, "user.note") == b"hi"
    assert "user.note" in os.listxattr(p)
    # status attributes are virtual: readable by name, never listed (copy tools must not carry them)
    assert xattr(p, "user.ckptfs.status") == "committed"
    assert [n for n in os.listxattr(p) if n.startswith("user.ckptfs.")] == []
    with pytest.raises(OSError) as e:
        os.setxattr(p, "user.ckptfs.status", b"committed")
    assert e.value.errno == errno.EPERM
    with pytest.raises(OSError) as e:
        os.removexattr(p, "user.ckptfs.blake3")
    assert e.value.errno == errno.ENODATA  # nothing stored to remove
    assert xattr(p, "user.ckptfs.status") == "committed"
    os.removexattr(p, "user.note")
    assert "user.note" not in os.listxattr(p)


def test_meta_dir_invisible_and_unreachable(mnt: Mount) -> None:
    (mnt.path / "a.txt").write_text("a")
    assert META_DIR not in os.listdir(mnt.path)
    for fn in (lambda: os.stat(mnt.path / META_DIR), lambda: os.listdir(mnt.path / META_DIR),
               lambda: open(mnt.path / META_DIR / "snapshot", "rb"),
               lambda: os.stat(mnt.path / META_DIR / "staging")):
        with pytest.raises(FileNotFoundError):
            fn()
    for fn in (lambda: os.mkdir(mnt.path / META_DIR), lambda: open(mnt.path / META_DIR, "w"),
               lambda: os.rename(mnt.path / "a.txt", mnt.path / META_DIR)):
        with pytest.raises(OSError) as e:
            fn()
        assert e.value.errno in (errno.EACCES, errno.EPERM, errno.ENOENT)
    assert (mnt.path / "a.txt").read_text() == "a"


def test_preexisting_files_visible_and_plain_after_umount(tmp_path) -> None:
    d = tmp_path / "ckpts"
    d.mkdir()
    torch.save(_sd(7), d / "old.pt")
    with Mount(d) as m:
        assert _equal(torch.load(m.path / "old.pt"), _sd(7))
        assert xattr(m.path / "old.pt", "user.ckptfs.status") == "untracked"
        (m.path / "sub").mkdir()
        torch.save(_sd(8), m.path / "sub" / "new.pt")
    assert not os.path.ismount(d)
    assert _equal(torch.load(d / "sub" / "new.pt"), _sd(8))
    assert _equal(torch.load(d / "old.pt"), _sd(7))
    assert os.listdir(d / META_DIR / "staging") == []


def test_backing_option_serves_other_dir(tmp_path) -> None:
    src, mp = tmp_path / "src", tmp_path / "mp"
    src.mkdir()
    mp.mkdir()
    (src / "x.txt").write_text("from src")
    with Mount(mp, backing=src) as m:
        assert (m.path / "x.txt").read_text() == "from src"
        (m.path / "y.txt").write_text("new")
        assert (src / "y.txt").read_text() == "new"  # installed at close (sync mode)
    assert os.listdir(mp) == []
