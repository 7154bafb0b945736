"""Issue 4 (integrity), file level, on real mounts: verify-on-read, EIO and
status xattrs for each fault class, offline changes, the verification cache,
kept generations and the rollback policy, scrub, metadata corruption, and the
bounded corruption campaign."""

from __future__ import annotations

import errno
import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch
from conftest import ROOT, Mount, _env

from ckptfs.backing import OsBackingStore
from ckptfs.fs import CkptFS
from ckptfs.log.journal import SNAPSHOT, decode_frames


def xattr(p: Path, name: str) -> str:
    return os.getxattr(p, f"user.ckptfs.{name}").decode()


def stats(d: Path) -> dict:
    return json.loads(xattr(d, "stats"))


def read_all(p: Path) -> bytes:
    with open(p, "rb") as f:
        return f.read()


def expect_eio(p: Path) -> None:
    with pytest.raises(OSError) as ei:
        read_all(p)
    assert ei.value.errno == errno.EIO, ei.value


def ckptfs_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckptfs", *args], capture_output=True, text=True, env=_env(),
                          cwd=ROOT, timeout=120)


def flip(p: Path, off: int) -> None:
    with open(p, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0x10]))


@pytest.mark.portable
def test_each_fault_class_offline_then_mount(tmp_path: Path) -> None:
    """Faults injected while unmounted: EIO, corrupt status with detail, event log,
    clean files untouched; `ckptfs verify` agrees offline and mounted."""
    d = tmp_path / "ck"
    d.mkdir()
    tensors = {}
    with Mount(d):
        for name in ("bitflip", "zero", "trunc", "ext", "clean1", "clean2"):
            tensors[name] = torch.randn(400_000)  # 1.6 MB: two chunks
            torch.save({"w": tensors[name]}, d / f"{name}.pt")
        (d / "shards").mkdir()  # not a group dir: file-level swap detection (group hiding: test_groups.py)
        for k in range(2):
            tensors[f"s{k}"] = torch.randn(50_000)
            torch.save({"w": tensors[f"s{k}"]}, d / "shards" / f"shard_{k}.pt")
        (d / "notes.txt").write_text("untracked?")  # committed too (any file written via the mount)
    size = (d / "bitflip.pt").stat().st_size
    flip(d / "bitflip.pt", size - 200)  # in the zip central directory, chunk 1
    with open(d / "zero.pt", "r+b") as f:
        f.seek(100_000)
        f.write(bytes(3000))
    os.truncate(d / "trunc.pt", (d / "trunc.pt").stat().st_size - 1)
    with open(d / "ext.pt", "ab") as f:
        f.write(b"\0")
    a, b, t = d / "shards/shard_0.pt", d / "shards/shard_1.pt", d / "shards/tmp"
    os.rename(a, t)
    os.rename(b, a)
    os.rename(t, b)

    off = ckptfs_cli("verify", str(d))
    assert off.returncode == 1, off
    for name in ("bitflip.pt", "zero.pt", "trunc.pt", "ext.pt", "shards/shard_0.pt", "shards/shard_1.pt"):
        assert f"{name}: CORRUPT" in off.stderr, (name, off.stderr)
    assert "clean1.pt: CORRUPT" not in off.stderr
    # one summary line, its verdict the exit status's (issue 13: it said "9 corrupt", then "OK")
    assert off.stdout.count("ckptfs: verified") == 1, off.stdout
    assert "verified 9 committed files (3 ok, 6 corrupt)" in off.stdout and off.stdout.rstrip().endswith("FAILED")

    with Mount(d):
        for name in ("bitflip", "zero"):
            with pytest.raises(OSError) as ei:
                torch.load(d / f"{name}.pt")
            assert ei.value.errno == errno.EIO
            assert xattr(d / f"{name}.pt", "status") == "corrupt"
            err = xattr(d / f"{name}.pt", "error")
            assert "expected blake3" in err and "actual" in err and "chunk" in err
        assert "chunk 1" in xattr(d / "bitflip.pt", "error") and "chunk 0" in xattr(d / "zero.pt", "error")
        for name, why in (("trunc", "truncated"), ("ext", "extended")):
            with pytest.raises(OSError) as ei:
                open(d / f"{name}.pt", "rb").close()  # refused at open
            assert ei.value.errno == errno.EIO
            assert xattr(d / f"{name}.pt", "status") == "corrupt" and why in xattr(d / f"{name}.pt", "error")
        for k in range(2):
            expect_eio(d / "shards" / f"shard_{k}.pt")
            assert f"committed for shards/shard_{1 - k}.pt" in xattr(d / "shards" / f"shard_{k}.pt", "error")
        for name in ("clean1", "clean2"):  # controls
            assert torch.equal(torch.load(d / f"{name}.pt")["w"], tensors[name])
            assert xattr(d / f"{name}.pt", "status") == "committed"
            assert xattr(d / f"{name}.pt", "verified") == "2/2 chunks"
        assert (d / "notes.txt").read_text() == "untracked?"
        events = json.loads(xattr(d, "corrupt"))
        assert {e["path"] for e in events} == {"bitflip.pt", "zero.pt", "trunc.pt", "ext.pt",
                                               "shards/shard_0.pt", "shards/shard_1.pt"}
        assert stats(d)["corrupt_detected"] == 6
        on = ckptfs_cli("verify", str(d))  # mounted mode: the daemon re-verifies
        assert on.returncode == 1 and on.stderr.count("CORRUPT") == 6, on
        assert ckptfs_cli("verify", str(d / "clean1.pt")).returncode == 0
    log = (d / ".ckptfs" / "daemon.log").read_text()
    assert "ERROR ckptfs.integrity: integrity: bitflip.pt corrupt (chunk" in log
    # restored bytes (same inode) verify clean again: the verdict belongs to the version
    flip(d / "bitflip.pt", size - 200)
    with Mount(d):
        read_all(d / "bitflip.pt")
        assert xattr(d / "bitflip.pt", "status") == "committed"


def test_offline_replacement_is_not_corruption_and_forget(tmp_path: Path) -> None:
    """A file replaced by a new file (new inode) while unmounted is an offline
    edit (untracked); an in-place change of a committed inode is corruption;
    `ckptfs forget` accepts it."""
    d = tmp_path / "ck"
    d.mkdir()
    with Mount(d):
        (d / "a.bin").write_bytes(b"A" * 5000)
        (d / "b.bin").write_bytes(b"B" * 5000)
    (d / "a.new").write_bytes(b"new content")
    os.replace(d / "a.new", d / "a.bin")
    with open(d / "b.bin", "r+b") as f:
        f.write(b"X")  # same inode, same size
    with Mount(d):
        assert xattr(d / "a.bin", "status") == "untracked" and read_all(d / "a.bin") == b"new content"
        expect_eio(d / "b.bin")
    r = ckptfs_cli("forget", str(d), "b.bin")
    assert r.returncode == 0, r.stderr
    with Mount(d):
        assert xattr(d / "b.bin", "status") == "untracked" and read_all(d / "b.bin")[:2] == b"XB"


def test_second_open_of_verified_1gib_file_hashes_nothing(tmp_path: Path) -> None:
    d = tmp_path / "ck"
    d.mkdir()
    gib = 1 << 30
    with Mount(d):
        with open(d / "big.bin", "wb") as f:  # sparse: fast to write, still 1 GiB to verify
            f.truncate(gib)
            f.seek(gib - 5)
            f.write(b"tail!")
        s0 = stats(d).get("verify_bytes_hashed", 0)
        with open(d / "big.bin", "rb") as f:
            n = 0
            while b := f.read(8 << 20):
                n += len(b)
        assert n == gib
        s1 = stats(d)["verify_bytes_hashed"]
        assert s1 - s0 >= gib
        assert xattr(d / "big.bin", "verified") == "1024/1024 chunks"
        with open(d / "big.bin", "rb") as f:
            n = 0
            while b := f.read(8 << 20):
                n += len(b)
            f.seek(gib - 5)
            assert f.read() == b"tail!"
        assert n == gib
        assert stats(d)["verify_bytes_hashed"] == s1  # the second open re-hashed nothing
        os.utime(d / "big.bin", (1, 1))  # a change (ctime moves): the next read re-verifies
        with open(d / "big.bin", "rb") as f:
            f.read(4096)
        assert stats(d)["verify_bytes_hashed"] > s1


def _gen_file(d: Path, ino: int) -> Path:
    for p in (d / ".ckptfs" / "generations").iterdir():
        if p.stat().st_ino == ino:
            return p
    raise AssertionError("generation file not found")


@pytest.mark.portable
def test_rollback_policy_and_kept_generations(tmp_path: Path) -> None:
    d = tmp_path / "ck"
    d.mkdir()
    ts = [torch.randn(1000 * (i + 1)) for i in range(4)]  # different sizes per generation
    with Mount(d, extra_args=["--keep-generations", "2"]):
        for t in ts:
            torch.save({"w": t}, d / "latest.pt")
        assert xattr(d / "latest.pt", "generation") == "4"
        assert xattr(d / "latest.pt", "kept_generations") == "3,2"
    gens = sorted((d / ".ckptfs" / "generations").iterdir())
    assert len(gens) == 2  # pruned to the configured count
    flip(d / "latest.pt", 2000)
    with Mount(d, extra_args=["--keep-generations", "2"]):  # default policy: EIO
        with pytest.raises(OSError) as ei:
            torch.load(d / "latest.pt")
        assert ei.value.errno == errno.EIO
    snap = decode_frames((d / SNAPSHOT).read_bytes())[0][0]
    g3 = snap["generations"]["latest.pt"][0]["rec"]
    with Mount(d, extra_args=["--on-corrupt", "rollback", "--keep-generations", "2"]):
        assert (d / "latest.pt").stat().st_size == g3["size"]
        assert torch.equal(torch.load(d / "latest.pt")["w"], ts[2])
        assert xattr(d / "latest.pt", "status") == "corrupt"
        assert "serving kept generation 3" in xattr(d / "latest.pt", "rollback")
        assert stats(d)["rollback_opens"] >= 1
    flip(_gen_file(d, g3["ino"]), 100)  # generation 3 rots as well: generation 2 is next
    with Mount(d, extra_args=["--on-corrupt", "rollback", "--keep-generations", "2"]):
        assert torch.equal(torch.load(d / "latest.pt")["w"], ts[1])
        assert "serving kept generation 2" in xattr(d / "latest.pt", "rollback")
        # a fresh save replaces the corrupt version; the corrupt one is not kept as a generation
        torch.save({"w": ts[3]}, d / "latest.pt")
        assert torch.equal(torch.load(d / "latest.pt")["w"], ts[3])
        assert xattr(d / "latest.pt", "status") == "committed"
        assert xattr(d / "latest.pt", "kept_generations") == "3,2"
        os.unlink(d / "latest.pt")
    assert list((d / ".ckptfs" / "generations").iterdir()) == []


def test_scrub_offline_mounted_background(tmp_path: Path) -> None:
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    mnt.mkdir()
    m = Mount(mnt, backing=src, extra_args=["--scrub-interval", "0"]).start()
    try:
        for i in range(3):
            torch.save({"w": torch.randn(10_000)}, mnt / f"m{i}.pt")
        r = ckptfs_cli("scrub", "--wait", str(mnt))
        assert r.returncode == 0, r
        flip(src / "m1.pt", 300)  # bit rot: nobody reads the file
        r = ckptfs_cli("scrub", "--wait", str(mnt))
        assert r.returncode == 1 and "m1.pt" in r.stdout, r
        assert xattr(mnt / "m1.pt", "status") == "corrupt" and xattr(mnt / "m0.pt", "status") == "committed"
        st = stats(mnt)
        assert st["scrub_runs"] == 2 and st["scrub_bytes_hashed"] > 0 and st.get("verify_bytes_hashed", 0) == 0
    finally:
        m.stop()
    r = ckptfs_cli("scrub", str(src))  # offline on the unmounted directory
    assert r.returncode == 1 and "m1.pt: CORRUPT (chunk)" in r.stderr
    flip(src / "m1.pt", 300)
    m = Mount(mnt, backing=src, extra_args=["--scrub-interval", "0.2", "--scrub-rate", "1"]).start()
    try:  # periodic, rate-limited background scrub finds a fault on its own
        flip(src / "m2.pt", 500)
        import time

        deadline = time.monotonic() + 60
        while xattr(mnt / "m2.pt", "status") != "corrupt" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert xattr(mnt / "m2.pt", "status") == "corrupt"
        assert json.loads(xattr(mnt, "scrub"))["rate_mb_s"] == 1.0
    finally:
        m.stop()


def _frame(obj: dict) -> bytes:
    payload = json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()
    return struct.pack("<II", len(payload), zlib.crc32(payload)) + payload


def test_metadata_corruption_never_trusted_never_crashes(tmp_path: Path) -> None:
    d = tmp_path / "ck"
    d.mkdir()
    with Mount(d):
        for i in range(3):
            (d / f"f{i}.bin").write_bytes(bytes([i]) * 3000)
    snap_path = d / SNAPSHOT
    good = snap_path.read_bytes()
    snap = decode_frames(good)[0][0]
    # 1. hand-edited digest with a recomputed CRC: the frame is "valid", the file is then corrupt, never served
    edited = json.loads(json.dumps(snap))
    edited["files"]["f0.bin"]["chunks"] = "0" * 64
    snap_path.write_bytes(_frame(edited))
    with Mount(d):
        expect_eio(d / "f0.bin")
        assert read_all(d / "f1.bin") == b"\x01" * 3000
    # 2. an inconsistent record (bad chunk list): that record is refused (reported), the rest kept,
    # and the file's own copy of its record (R1, records.XATTR) is read back: committed, verified
    snap = decode_frames(snap_path.read_bytes())[0][0]
    snap["files"]["f1.bin"]["chunks"] = "ab"
    snap_path.write_bytes(_frame(snap))
    with Mount(d):
        assert xattr(d / "f1.bin", "status") == "committed" and xattr(d / "f2.bin", "status") == "committed"
        assert read_all(d / "f1.bin") == b"\x01" * 3000
        md = json.loads(xattr(d, "metadata"))
        assert md["status"] == "corrupt" and "f1.bin" in md["problems"][0]
    os.removexattr(d / "f1.bin", "user.ckptfs.rec")  # without that copy: untracked, as before R1
    snap = decode_frames(snap_path.read_bytes())[0][0]
    snap["files"]["f1.bin"]["chunks"] = "ab"
    snap_path.write_bytes(_frame(snap))
    with Mount(d):
        assert xattr(d / "f1.bin", "status") == "untracked" and xattr(d / "f2.bin", "status") == "committed"
    # 3. bit flip and truncation of the snapshot: distrusted, set aside, daemon serves
    for damage in ("flip", "truncate"):
        data = bytearray(snap_path.read_bytes())
        if damage == "flip":
            data[len(data) // 2] ^= 0x04
        else:
            del data[len(data) - 7:]
        snap_path.write_bytes(bytes(data))
        with Mount(d):
            assert read_all(d / "f2.bin") == b"\x02" * 3000
            assert json.loads(xattr(d, "metadata"))["status"] == "corrupt"
        assert any(p.name.startswith("corrupt-snapshot.") for p in (d / ".ckptfs").iterdir())
    # 4. journal corrupted before its tail (daemon killed, so the journal is not compacted)
    m = Mount(d).start()
    for i in range(3):
        (d / f"g{i}.bin").write_bytes(bytes([9]) * 2000)
    m.kill()  # SIGKILL: the journal is left as is
    j = [p for p in (d / ".ckptfs").iterdir() if p.name.startswith("journal.")][0]
    data = bytearray(j.read_bytes())
    data[12] ^= 0x01  # inside the first frame's payload
    j.write_bytes(bytes(data))
    r = ckptfs_cli("verify", str(d))
    assert r.returncode == 1 and "metadata: journal" in r.stderr
    with Mount(d):
        md = json.loads(xattr(d, "metadata"))
        assert md["status"] == "corrupt" and any("journal" in p for p in md["problems"])
        for i in range(3):  # records after the damage are not trusted; each file's own (R1) is read back
            assert read_all(d / f"g{i}.bin") == bytes([9]) * 2000
            assert xattr(d / f"g{i}.bin", "status") == "committed"
    assert any(p.name.startswith("corrupt-journal.") for p in (d / ".ckptfs").iterdir())


def test_generations_follow_rename_and_survive_restart(tmp_path: Path) -> None:
    """Unit level (no mount): kept generations are journaled, follow renames, are pruned."""
    fs = CkptFS(OsBackingStore(str(tmp_path)), keep_generations=2)

    def save(p: str, data: bytes) -> None:
        fh = fs.create(p, 0o644)
        fs.write(fh, data, 0)
        fs.flush(fh)
        fs.release(fh)

    for i in range(4):
        save("a", bytes([i]) * 10)
    assert [g.rec.generation for g in fs.gens.of("a")] == [3, 2]
    fs.rename("a", "b")
    assert fs.gens.of("a") == [] and len(fs.gens.of("b")) == 2
    save("c", b"C" * 10)
    c_rec = fs.records["c"]
    save("c.tmp", b"D" * 10)
    fs.rename("c.tmp", "c")  # a committed file replaced by a rename (tmp + rename) is kept too
    assert [g.rec.blake3 for g in fs.gens.of("c")] == [c_rec.blake3]
    assert fs.gens.of("c.tmp") == []
    fs.shutdown()
    fs = CkptFS(OsBackingStore(str(tmp_path)), keep_generations=1)  # restart with a smaller count
    assert [g.rec.blake3 for g in fs.gens.of("c")] == [c_rec.blake3]
    kept = fs.gens.of("c")[0].name
    assert (tmp_path / kept).read_bytes() == b"C" * 10
    fs.unlink("c")
    assert [g.rec.generation for g in fs.gens.of("b")] == [3]
    assert len(os.listdir(tmp_path / ".ckptfs" / "generations")) == 1
    fs.unlink("b")
    assert os.listdir(tmp_path / ".ckptfs" / "generations") == []
    fs.shutdown()


def test_corruption_campaign_bounded(tmp_path: Path) -> None:
    out = tmp_path / "integrity.md"
    js = tmp_path / "res.json"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "corruption_campaign"), "--per-class", "40",
                        "--controls", "40", "--model-kib", "96", "--out", str(out), "--json", str(js)],
                       capture_output=True, text=True, env=_env(), timeout=240)
    res = json.loads(js.read_text())
    for cls, row in res["classes"].items():
        assert row["trials"] >= 40 and row["detected"] == row["trials"], (cls, row)
        assert row["offline_detected"] == row["trials"], (cls, row)
    assert res["classes"]["bitflip"]["swept_offsets"] >= 20
    assert res["controls"] == {"trials": 40, "false_positives": 0, "rehashed": 40}
    assert r.returncode == 0, r.stderr
    assert "| bitflip | " in out.read_text()
