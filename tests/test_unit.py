"""Logic tests without a mount: formats, /proc parsing, journal framing, recovery."""

from __future__ import annotations

import errno
import io
import json
import os
import struct
import time
import zipfile

import numpy as np
import pytest
import torch

from ckptfs import formats, procinfo
from ckptfs.backing import OsBackingStore
from ckptfs.engine.seals import OPEN, SEALED
from ckptfs.fs import CkptFS
from ckptfs.log.journal import Journal, decode_frames, encode_frame
from ckptfs.recovery import recover


def check_bytes(tmp_path, name: str, data: bytes) -> str | None:
    p = tmp_path / name
    p.write_bytes(data)
    store = OsBackingStore(str(tmp_path))
    fd = store.open(name, os.O_RDONLY)
    try:
        return formats.check(store, fd, len(data), name)
    finally:
        store.close(fd)


def torch_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def test_torch_archive_every_truncation_refused(tmp_path) -> None:
    data = torch_bytes({"a": torch.randn(3000), "b": torch.arange(100), "c": "meta"})
    assert check_bytes(tmp_path, "m.pt", data) is None
    for cut in range(0, len(data), 997):
        assert check_bytes(tmp_path, "m.pt", data[:cut]) is not None, cut


def test_torch_valid_zip_missing_or_short_records_refused(tmp_path) -> None:
    data = torch_bytes({"a": torch.randn(300), "b": torch.arange(100)})
    zin = zipfile.ZipFile(io.BytesIO(data))
    storages = [i for i in zin.infolist() if "/data/" in i.filename]
    assert len(storages) == 2

    def rebuild(skip=None, shorten=None, drop_pkl=False) -> bytes:
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as z:
            for i in zin.infolist():
                if i.filename == skip or (drop_pkl and i.filename.endswith("data.pkl")):
                    continue
                body = zin.read(i)
                z.writestr(i.filename, body[:-4] if i.filename == shorten else body)
        return out.getvalue()

    assert "missing" in check_bytes(tmp_path, "x.pt", rebuild(skip=storages[1].filename))
    assert "holds" in check_bytes(tmp_path, "x.pt", rebuild(shorten=storages[0].filename))
    assert "data.pkl" in check_bytes(tmp_path, "x.pt", rebuild(drop_pkl=True))
    assert check_bytes(tmp_path, "x.pt", rebuild()) is None


def test_pickle_scan_runs_no_code(tmp_path) -> None:
    class Evil:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    data = torch_bytes({"t": torch.ones(3), "evil": Evil()})
    check_bytes(tmp_path, "e.pt", data)
    assert not (tmp_path / "pwned").exists()


def test_npy_safetensors_json(tmp_path) -> None:
    buf = io.BytesIO()
    np.save(buf, np.arange(1000, dtype=np.float32))
    npy = buf.getvalue()
    assert check_bytes(tmp_path, "a.npy", npy) is None
    assert check_bytes(tmp_path, "a.npy", npy[:-1]) is not None
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    st = struct.pack("<Q", len(header)) + header + b"\0" * 16
    assert check_bytes(tmp_path, "m.safetensors", st) is None
    assert check_bytes(tmp_path, "m.safetensors", st[:-3]) is not None
    assert check_bytes(tmp_path, "s.json", b'{"a": [1, 2]}') is None
    assert check_bytes(tmp_path, "s.json", b'{"a": [1, ') is not None
    assert check_bytes(tmp_path, "model.pt", b"") is not None
    assert check_bytes(tmp_path, "notes.txt", b"") is None
    assert check_bytes(tmp_path, "blob.dat", b"anything at all") is None


def test_proc_stat_parsing() -> None:
    fields = ["S"] + ["0"] * 60
    fields[6] = str(procinfo.PF_EXITING | 0x40)
    fields[49] = "9"
    text = "1234 (py thon) ) " + " ".join(fields)
    assert procinfo.parse_stat(text) == (procinfo.PF_EXITING | 0x40, 9)
    assert procinfo.killing_signal(os.getpid()) is None  # we are alive


def test_journal_torn_tail_ignored() -> None:
    frames = encode_frame({"op": "a"}) + encode_frame({"op": "b"})
    whole, n = decode_frames(frames)
    assert [e["op"] for e in whole] == ["a", "b"] and n == len(frames)
    for cut in range(len(frames)):
        got, n = decode_frames(frames[:cut])
        assert [e["op"] for e in got] == ["a", "b"][: len(got)]
    flipped = bytearray(frames)
    flipped[-3] ^= 0x40
    assert [e["op"] for e in decode_frames(bytes(flipped))[0]] == ["a"]


def save(fs: CkptFS, path: str, data: bytes) -> None:
    fh = fs.create(path, 0o644)
    fs.write(fh, data, 0)
    fs.flush(fh)
    fs.release(fh)


def counting_store(tmp_path) -> tuple[OsBackingStore, list[str]]:
    """A backing store over ``tmp_path`` that lists every sync it makes (fsync, fdatasync,
    fsync_dir), in order."""
    store = OsBackingStore(str(tmp_path))
    calls: list[str] = []
    for name in ("fsync", "fdatasync", "fsync_dir"):
        real = getattr(store, name)
        setattr(store, name, lambda x, real=real, name=name: (calls.append(name), real(x))[1])
    return store, calls


def test_recovery_rolls_forward_last_intent_and_drops_unverifiable(tmp_path) -> None:
    store = OsBackingStore(str(tmp_path))
    fs = CkptFS(store)
    save(fs, "a.bin", b"one")
    fs.shutdown()
    # simulate a crash after the intent of a new version was logged, before rename
    j = Journal(store)
    j.load()
    staged = ".ckptfs/staging/deadbeef"
    (tmp_path / staged).write_bytes(b"two!")
    from ckptfs.hashing import IncrementalDigest
    from ckptfs.records import FileRecord

    d = IncrementalDigest()
    d.update(b"two!", 0)
    whole, chunks = d.finish(4)
    ino = os.stat(tmp_path / staged).st_ino
    rec = FileRecord(size=4, blake3=whole, chunks=chunks, generation=2, committed_at=0.0, ino=ino)
    j.append({"op": "install", "path": "a.bin", "staging": staged, "rec": rec.to_json()})
    j.close()
    rep = recover(store)
    assert rep.inflight_completed and (tmp_path / "a.bin").read_bytes() == b"two!"
    assert rep.files["a.bin"].generation == 2
    # idempotent
    assert recover(store).files["a.bin"].blake3 == whole
    # a staged file whose bytes do not match its intent is never installed
    (tmp_path / staged).write_bytes(b"bad!")
    j = Journal(store)
    j.load()
    j.append({"op": "install", "path": "a.bin", "staging": staged, "rec": {**rec.to_json(), "generation": 3}})
    j.close()
    rep = recover(store)
    assert not rep.inflight_completed and (tmp_path / "a.bin").read_bytes() == b"two!"
    assert os.listdir(tmp_path / ".ckptfs" / "staging") == []


def test_unlink_and_rename_of_open_file(tmp_path) -> None:
    fs = CkptFS(OsBackingStore(str(tmp_path)))
    fh = fs.create("x.tmp", 0o644)
    fs.write(fh, b"hello", 0)
    fs.rename("x.tmp", "x")  # still open: the pending version moves with it
    fs.flush(fh)
    fs.release(fh)
    assert (tmp_path / "x").read_bytes() == b"hello" and not (tmp_path / "x.tmp").exists()
    fh = fs.create("gone", 0o644)
    fs.write(fh, b"bye", 0)
    fs.unlink("gone")
    fs.flush(fh)
    fs.release(fh)
    assert not (tmp_path / "gone").exists()
    with pytest.raises(FileNotFoundError):
        fs.getattr("gone")
    fs.shutdown()


def test_compact_every_is_a_constructor_parameter(tmp_path) -> None:
    """The compaction threshold is passed to CkptFS (and on to its Journal), not patched as a global."""
    def commits(fs: CkptFS, n: int) -> None:
        for i in range(n):
            fh = fs.create(f"f{i}", 0o644)
            fs.write(fh, b"x", 0)
            fs.flush(fh)
            fs.release(fh)

    (tmp_path / "a").mkdir()
    fs = CkptFS(OsBackingStore(str(tmp_path / "a")), compact_every=2)
    assert fs.journal.compact_every == 2
    epoch = fs.journal.epoch
    commits(fs, 3)
    assert fs.journal.epoch > epoch and fs.journal.entries_since_snapshot < 2
    fs.shutdown()
    (tmp_path / "b").mkdir()
    fs = CkptFS(OsBackingStore(str(tmp_path / "b")))  # the default: no compaction after a few commits
    assert fs.journal.compact_every == int(os.environ.get("CKPTFS_COMPACT_EVERY", "4096"))
    epoch = fs.journal.epoch
    commits(fs, 3)
    assert fs.journal.epoch == epoch and fs.journal.entries_since_snapshot >= 3
    fs.shutdown()


def test_recovery_drops_inflight_install_whose_directory_is_gone(tmp_path) -> None:
    """Model-checker finding (weak model, crash during recovery): a torn group was moved to
    quarantine, but the power loss undid recovery's rename of its in-flight file, so the staged
    copy is back while its directory is gone.  Recovery must drop that install, not fail."""
    import os

    from ckptfs.backing import OsBackingStore
    from ckptfs.hashing import digest_fd
    from ckptfs.log.journal import STAGING, Journal
    from ckptfs.records import FileRecord
    from ckptfs.recovery import recover

    store = OsBackingStore(str(tmp_path))
    j = Journal(store)
    j.ensure_layout()
    j.load()
    staged = f"{STAGING}/abc"
    fd = store.open(staged, os.O_RDWR | os.O_CREAT, 0o644)
    store.pwrite(fd, b"x" * 100, 0)
    whole, chunks = digest_fd(store, fd, 100)
    ino = store.fstat(fd).st_ino
    store.close(fd)
    rec = FileRecord(size=100, blake3=whole, chunks=chunks, generation=1, committed_at=0.0, ino=ino)
    j.append({"op": "install", "path": "gone_dir/x.pt", "staging": staged, "rec": rec.to_json()})
    j.close()
    rep = recover(store)
    assert not rep.inflight_completed and "gone_dir/x.pt" not in rep.files
    assert store.listdir(STAGING) == []
    store.shutdown()


def _crash_without_done_records(tmp_path, fs: CkptFS) -> list[dict]:
    """Stop ``fs`` as a power loss would leave it before the unsynced tail of the journal reached
    the disk: no final compaction, and every install's ``done`` record (engine/commit.py step 6)
    dropped from the journal.  Returns the dropped records."""
    fs.commit.compact = lambda clean=False: None  # type: ignore[method-assign]
    fs.shutdown()
    jpath = tmp_path / ".ckptfs" / f"journal.{fs.journal.epoch}"
    entries, _ = decode_frames(jpath.read_bytes())
    jpath.write_bytes(b"".join(encode_frame(e) for e in entries if not e.get("done")))
    return [e for e in entries if e.get("done")]


def test_records_travel_with_their_files_when_the_journal_tail_is_lost(tmp_path) -> None:
    """R1: installs of new files journal no intent; when a power loss drops their unsynced done
    records, recovery reads each record back from its file and verification still works.  A copy
    made outside ckptfs (its xattr copied, another inode) stays untracked."""
    fs = CkptFS(OsBackingStore(str(tmp_path)))
    payload = {f"f{i}.bin": os.urandom(3000 + i) for i in range(5)}
    for p, data in payload.items():
        save(fs, p, data)
    before = {p: fs.records[p] for p in payload}
    assert all(os.getxattr(tmp_path / p, "user.ckptfs.rec") for p in payload)
    dropped = _crash_without_done_records(tmp_path, fs)
    assert {e["path"] for e in dropped} == set(payload)
    (tmp_path / "copy.bin").write_bytes(payload["f0.bin"])
    os.setxattr(tmp_path / "copy.bin", "user.ckptfs.rec", os.getxattr(tmp_path / "f0.bin", "user.ckptfs.rec"))
    rep = recover(OsBackingStore(str(tmp_path)))
    assert sorted(rep.records_adopted) == sorted(payload)
    assert {p: rep.files[p] for p in payload} == before
    assert "copy.bin" not in rep.files
    from ckptfs.integrity.verify import load_offline, verify_file

    st = load_offline(OsBackingStore(str(tmp_path)))
    assert all(verify_file(OsBackingStore(str(tmp_path)), p, st.files[p]).ok for p in payload)


@pytest.mark.parametrize("tmp", ["latest.new", "latest.tmp"])
def test_a_finished_rename_is_not_redone_over_a_later_install_at_its_source(tmp_path, tmp) -> None:
    """An install whose record travels journals no intent, so a rename's intent can be the last
    one in the journal although the rename finished and a new file was installed at its source
    since: recovery must see the new inode there (the intent names the old one) and leave both
    files (without the check it moved the new file over the renamed one).  ``latest.tmp`` ->
    ``latest`` journals no intent at all (fs.py I8): with its done entry lost the same state must
    come out of the disk (R1, R2)."""
    fs = CkptFS(OsBackingStore(str(tmp_path)))
    save(fs, tmp, b"step 1")
    fs.rename(tmp, "latest")
    save(fs, tmp, b"step 2")
    _crash_without_done_records(tmp_path, fs)
    rep = recover(OsBackingStore(str(tmp_path)))
    assert (tmp_path / "latest").read_bytes() == b"step 1"
    assert (tmp_path / tmp).read_bytes() == b"step 2"
    if tmp == "latest.new":
        assert rep.inflight and rep.inflight.startswith("rename") and rep.inflight_completed
    else:
        assert rep.inflight is None and not rep.renames_finished
    assert rep.files["latest"].size == 6 and rep.files[tmp].size == 6
    assert rep.files["latest"].blake3 != rep.files[tmp].blake3


def _stale_record_on_reused_number(tmp_path, first: dict[str, bytes], new_a: bytes, stale: str) -> int:
    """Save ``first`` and compact (their records durable in the snapshot), then save ``new_a`` at
    a.bin (a new inode) and stop as a power loss would, its done entry lost; the snapshot's record of
    ``stale`` is made to name a.bin's new inode number (inode numbers are reused).  Returns it."""
    fs = CkptFS(OsBackingStore(str(tmp_path)), keep_generations=0)
    for path, data in first.items():
        save(fs, path, data)
    fs.shutdown()
    fs = CkptFS(OsBackingStore(str(tmp_path)), keep_generations=0)
    save(fs, "a.bin", new_a)
    _crash_without_done_records(tmp_path, fs)
    new_ino = os.stat(tmp_path / "a.bin").st_ino
    snap = tmp_path / ".ckptfs" / "snapshot"
    state = decode_frames(snap.read_bytes())[0][0]
    state["files"][stale]["ino"] = new_ino
    snap.write_bytes(encode_frame(state))
    return new_ino


def test_a_stale_record_whose_inode_number_and_size_match_the_file_is_replaced_by_the_files_own(tmp_path) -> None:
    """R3 (issue 27): with a rename's or unlink's ``done`` entry lost (fs.py I8) and a later
    install's too, the journal can name a path with a record of an earlier file whose inode number
    the backing filesystem gave the new one, of the same size: the number and size match, so
    ``classify`` finds it ok.  After an unclean stop the record the inode carries, committed later,
    wins; every file verifies.  (Found by the model checker's FUSE-recorded pointer workload.)"""
    # the old record of a.bin names the number the new file got
    new_ino = _stale_record_on_reused_number(tmp_path, {"a.bin": b"a" * 4000}, b"b" * 4000, "a.bin")
    rep = recover(OsBackingStore(str(tmp_path)))
    assert "a.bin" in rep.records_dropped and "a.bin" in rep.records_adopted and not rep.suspect
    assert rep.files["a.bin"].size == 4000 and rep.files["a.bin"].ino == new_ino
    from ckptfs.integrity.verify import verify_file

    assert verify_file(OsBackingStore(str(tmp_path)), "a.bin", rep.files["a.bin"]).ok


def test_a_stale_journal_record_is_replaced_by_the_files_own_even_when_its_inode_number_was_reused(tmp_path) -> None:
    """R1: a rewrite that journals no intent (no kept generation) loses its done entry; the journal
    still names the previous inode, whose number another stale record holds too (inode numbers are
    reused).  The file's own record is authoritative for its inode: adopted, not reported as a
    swap (suspect), and every file verifies."""
    # b's record names the number a.bin's new inode reuses
    new_ino = _stale_record_on_reused_number(tmp_path, {"a.bin": b"a" * 4000, "b.bin": b"b" * 4000}, b"A" * 5000,
                                             "b.bin")
    rep = recover(OsBackingStore(str(tmp_path)))
    assert "a.bin" not in rep.suspect and "a.bin" in rep.records_adopted
    assert rep.files["a.bin"].size == 5000 and rep.files["a.bin"].ino == new_ino
    from ckptfs.integrity.verify import verify_file

    assert verify_file(OsBackingStore(str(tmp_path)), "a.bin", rep.files["a.bin"]).ok
    assert verify_file(OsBackingStore(str(tmp_path)), "b.bin", rep.files["b.bin"]).ok


def test_recovery_walks_for_carried_records_only_after_an_unclean_stop(tmp_path) -> None:
    """R1's tree walk costs a getdents per directory and a getxattr per untracked file on every
    mount; after a clean shutdown (its snapshot says so, nothing followed it) no journal entry can
    be lost, so recovery skips it; after a crash it walks."""
    fs = CkptFS(OsBackingStore(str(tmp_path)))
    save(fs, "a.bin", b"a" * 100)
    fs.shutdown()
    assert not recover(OsBackingStore(str(tmp_path))).walked  # (this recovery's own snapshot is not clean)
    assert recover(OsBackingStore(str(tmp_path))).walked
    fs = CkptFS(OsBackingStore(str(tmp_path)))
    fs.shutdown()
    fs = CkptFS(OsBackingStore(str(tmp_path)))
    save(fs, "b.bin", b"b" * 100)
    _crash_without_done_records(tmp_path, fs)
    rep = recover(OsBackingStore(str(tmp_path)))
    assert rep.walked and rep.records_adopted == ["b.bin"]


def test_an_unlink_outside_groups_costs_one_sync_and_its_entry_follows_it(tmp_path) -> None:
    """I8 (issue 27): ``rm`` of a file outside groups and kept generations fsyncs its directory
    once, then journals the unlink as done and unsynced (it was an intent + fdatasync, then the
    directory fsync); so do a ``mkdir`` and an ``rmdir`` of a directory that is no group.  If a
    power loss drops those entries, recovery finds the file gone and drops its record (shown here
    by recovering from a journal cut before them)."""
    store, calls = counting_store(tmp_path)
    fs = CkptFS(store, keep_generations=0)
    try:
        os.makedirs(tmp_path / "logs")
        for i in range(3):
            fh = fs.create(f"logs/{i}.txt", 0o644)
            fs.write(fh, b"x" * 10, 0)
            fs.flush(fh)
            fs.release(fh)
        size = fs.journal.size
        calls.clear()
        fs.unlink("logs/0.txt")
        assert calls == ["fsync_dir"], calls
        assert not (tmp_path / "logs/0.txt").exists() and "logs/0.txt" not in fs.records
        frames, _ = decode_frames((tmp_path / ".ckptfs" / f"journal.{fs.journal.epoch}").read_bytes())
        assert frames[-1]["op"] == "unlink" and frames[-1]["done"] is True
        jpath = tmp_path / ".ckptfs" / f"journal.{fs.journal.epoch}"
        for op in (lambda: fs.mkdir("logs/sub", 0o755), lambda: fs.rmdir("logs/sub")):  # one sync each too
            calls.clear()
            op()
            assert calls == ["fsync_dir"], calls  # (their done entries are lost below as well)
    finally:
        fs.journal.close()
        store.shutdown()
    os.truncate(jpath, size)  # the power loss took the unsynced done entry
    st = OsBackingStore(str(tmp_path))
    try:
        rep = recover(st)
        assert "logs/0.txt" not in rep.files and "logs/0.txt" in rep.records_dropped
        assert {"logs/1.txt", "logs/2.txt"} <= set(rep.files)
    finally:
        st.shutdown()


@pytest.mark.parametrize("recorded", [True, False])
def test_a_rename_of_a_temporary_name_cut_by_a_power_loss_is_finished_from_the_disk(tmp_path, recorded) -> None:
    """I8 + R2 (issue 27): ``latest.tmp`` renamed over ``latest`` costs one sync (the directory's), its
    entry appended done and unsynced.  A power loss can leave the file under both names (the new
    name persisted, the removal of the old not yet; weak persistence) and the entry lost: recovery
    recognizes the pair on the disk (a temporary name and the name it stands for, one inode) and
    finishes the rename; the record follows the file.  ``recorded``: the temporary file's install
    entry survived (else that is lost too, and the record comes from the file, R1).  A hard link made through the
    mount between such names is journaled and left alone."""
    store, calls = counting_store(tmp_path)
    fs = CkptFS(store, keep_generations=0)
    jpath = tmp_path / ".ckptfs" / "journal.1"
    before_install, before_rename = [], []  # the journal's size at each step
    try:
        for data in (b"1", b"22"):
            before_install.append(fs.journal.size)
            fh = fs.create("latest.tmp", 0o644)
            fs.write(fh, data, 0)
            fs.flush(fh)
            fs.release(fh)
            before_rename.append(fs.journal.size)
            calls.clear()
            fs.rename("latest.tmp", "latest")
            assert calls == ["fsync_dir"], calls
        # the cut: before the last rename's entry; unless ``recorded``, before the last install's too
        size = before_rename[1] if recorded else before_install[1]
        fh = fs.create("keep.tmp", 0o644)
        fs.write(fh, b"k", 0)
        fs.flush(fh)
        fs.release(fh)
        fs.link("keep.tmp", "keep")  # a journaled link: both names recorded, never "finished"
        jsize = fs.journal.size
    finally:
        fs.journal.close()
        store.shutdown()
    # the power loss: the last rename's new name persisted, the old one not removed, its entry lost
    os.link(tmp_path / "latest", tmp_path / "latest.tmp")
    data = jpath.read_bytes()
    frames, _ = decode_frames(data)
    kept = [f for f in frames if not (f["op"] == "rename" and f.get("src") == "latest.tmp")][-3:]  # keep.* entries
    jpath.write_bytes(data[:size] + b"".join(encode_frame(f) for f in kept))
    assert jsize  # (the keep.* entries follow the cut)
    st = OsBackingStore(str(tmp_path))
    try:
        rep = recover(st)
    finally:
        st.shutdown()
    assert not (tmp_path / "latest.tmp").exists() and (tmp_path / "latest").read_bytes() == b"22"
    assert rep.renames_finished == ["latest.tmp"]
    assert rep.files["latest"].size == 2 and "latest.tmp" not in rep.files and not rep.suspect
    assert (tmp_path / "keep.tmp").exists() and {"keep", "keep.tmp"} <= set(rep.files)


def test_an_atomic_writers_renames_in_a_group_never_sealed_cost_one_sync_each(tmp_path) -> None:
    """I8 in an unsealed group (issue 27, W7): an already-atomic writer saves ``step_N`` (each file
    ``name.tmp``, fsync, rename over ``name``), ``COMMIT`` last.  Each rename of a temporary name over
    its name costs its directory's fsync alone (no synced intent), the marker's too, and seals the
    group; the first one also settles the group's promotion (``step_N`` is tentative until a
    checkpoint name lands in it), which it journaled unsynced.  A re-save into the sealed group
    renames with a synced intent, as every other rename (G11 rolls a torn re-save back)."""
    store, calls = counting_store(tmp_path)
    fs = CkptFS(store)
    try:
        for step in (1, 2):
            d = f"step_{step}"
            fs.mkdir(d, 0o755)
            for name, data in (("model.bin", os.urandom(5000)), ("optim.bin", os.urandom(3000)), ("COMMIT", b"ok")):
                fh = fs.create(f"{d}/{name}.tmp", 0o644)
                fs.write(fh, data, 0)
                fs.fsync(fh)
                fs.flush(fh)
                fs.release(fh)
                calls.clear()
                fs.rename(f"{d}/{name}.tmp", f"{d}/{name}")
                if name == "model.bin":
                    assert calls == ["fdatasync", "fsync_dir"], (d, calls)  # the promotion settled
                elif name == "optim.bin":
                    assert calls == ["fsync_dir"], (d, calls)
                    assert fs.groups[d].state == OPEN
                elif step == 2:  # the rename's one sync, then the seal's (its journal entry: G12)
                    assert calls == ["fsync_dir", "fdatasync"], calls
            assert fs.groups[d].state == SEALED and not (tmp_path / d / "COMMIT.tmp").exists()
        fh = fs.create("step_2/model.bin.tmp", 0o644)
        fs.write(fh, os.urandom(5000), 0)
        fs.fsync(fh)
        fs.flush(fh)
        fs.release(fh)
        calls.clear()
        fs.rename("step_2/model.bin.tmp", "step_2/model.bin")
        assert calls[:2] == ["fdatasync", "fsync_dir"], calls
    finally:
        fs.shutdown()


@pytest.mark.parametrize("journaled", [True, False])
def test_a_users_hard_link_between_a_temporary_name_and_its_target_survives_an_unclean_stop(
        tmp_path, journaled) -> None:
    """R2 takes only the remains of its own renames: ``off`` was written while unmounted (no record,
    none carried), then linked through the mount as ``off.tmp``, a temporary name of ``off``.  After
    an unclean stop both names stay, whether the journal still has the link entry (``journaled``) or
    lost it (a compaction drops entries into a snapshot, which has no records for these names)."""
    (tmp_path / "off").write_bytes(b"user data")
    store = OsBackingStore(str(tmp_path))
    fs = CkptFS(store, keep_generations=0)
    jpath = tmp_path / ".ckptfs" / "journal.1"
    try:
        fs.link("off", "off.tmp")
    finally:
        fs.journal.close()
        store.shutdown()
    if not journaled:
        data = jpath.read_bytes()
        frames, _ = decode_frames(data)
        assert [f["op"] for f in frames if f["op"] == "link"] == ["link"]
        jpath.write_bytes(b"".join(encode_frame(f) for f in frames if f["op"] != "link"))
    st = OsBackingStore(str(tmp_path))
    try:
        rep = recover(st)
    finally:
        st.shutdown()
    assert rep.walked and not rep.renames_finished
    assert (tmp_path / "off.tmp").read_bytes() == b"user data" == (tmp_path / "off").read_bytes()
    assert os.stat(tmp_path / "off").st_nlink == 2


@pytest.mark.parametrize("pool", ["1", "0"])
def test_the_staging_pool_switch(tmp_path, monkeypatch, pool) -> None:
    """``CKPTFS_STAGING_POOL=0`` (README, engine/pool.py) turns the pool off: new versions make their
    staging file on the request path and ``.ckptfs/staging`` holds nothing once they are installed;
    on (the default) the pool keeps empty files there and gives them, as they are: a small file's
    save renames once (its install), as a native tmp + rename does (issue 27: the pool's files were
    renamed into ``staging/``, two renames).  Either way the files commit."""
    monkeypatch.setenv("CKPTFS_STAGING_POOL", pool)
    store = OsBackingStore(str(tmp_path))
    fs = CkptFS(store)
    try:
        assert (fs.staging.pool is not None) == (pool == "1")
        save(fs, "f0.txt", b"x" * 10)  # (the first new version starts the pool's thread)
        deadline = time.monotonic() + 10
        while pool == "1" and len(fs.staging.pool.free) < 2 and time.monotonic() < deadline:  # type: ignore[union-attr]
            time.sleep(0.02)
        renames: list[tuple[str, str]] = []
        real = store.rename
        store.rename = lambda a, b: (renames.append((a, b)), real(a, b))[1]  # type: ignore[method-assign]
        for i in (1, 2):
            save(fs, f"f{i}.txt", b"x" * 10)
        assert all((tmp_path / f"f{i}.txt").read_bytes() == b"x" * 10 for i in range(3))
        taken = fs.staging.pool.taken if fs.staging.pool is not None else 0
        left = os.listdir(tmp_path / ".ckptfs" / "staging")
        assert [b for _a, b in renames] == ["f1.txt", "f2.txt"], renames  # the installs only
        if pool == "0":
            assert not left and not taken
        else:
            assert taken >= 2 and left  # the pool's files, empty and the daemon's own (P1)
            for n in left:
                st = os.stat(tmp_path / ".ckptfs" / "staging" / n)
                assert st.st_size == 0 and st.st_mode & 0o7777 == 0o600
    finally:
        fs.shutdown()
        store.shutdown()


@pytest.mark.parametrize("renamed", [0, 2, 4])
def test_recovery_finishes_a_group_commit_cut_after_its_intent(tmp_path, renamed: int) -> None:
    """C5 (engine/commit.py): a power loss after a group commit's intent is durable, with none, some
    or all of its renames done (their directories unsynced, the done-less journal as left): recovery
    installs every file of the batch, in close order, each with its record; nothing is left staged."""
    fs = CkptFS(OsBackingStore(str(tmp_path)), commit_mode="async")
    fs.commit.committer.held = True
    fs.mkdir("a", 0o755)
    fs.mkdir("b", 0o755)
    payload = {f"{'ab'[i % 2]}/f{i}.bin": os.urandom(2000 + 7 * i) for i in range(4)}
    for p, data in payload.items():
        save(fs, p, data)
    real_rename = fs.commit.put_in_place
    done: list[str] = []

    def cut(v) -> None:  # the power loss: the renames after the first ``renamed`` never happen
        if len(done) < renamed:
            real_rename(v)
            done.append(v.path)

    fs.commit.put_in_place = cut  # type: ignore[method-assign]
    fs.commit.sync_batch_names = lambda vs: None  # type: ignore[method-assign]
    fs.fsyncdir("")
    assert fs.stats["batches"] == 1 and fs.stats["batched_installs"] == 4
    _crash_without_done_records(tmp_path, fs)
    assert sorted(p for p in payload if (tmp_path / p).exists()) == sorted(list(payload)[:renamed])
    rep = recover(OsBackingStore(str(tmp_path)))
    assert rep.inflight == "install_batch of 4" and rep.inflight_completed
    for p, data in payload.items():
        assert (tmp_path / p).read_bytes() == data
        assert rep.files[p].size == len(data)
    assert os.listdir(tmp_path / ".ckptfs" / "staging") == []


@pytest.mark.parametrize("items", [None, "a/f.bin", [{"op": "unlink", "path": "a/f.bin"}],
                                   [{"op": "install", "path": "a/f.bin", "staging": ".ckptfs/staging/x",
                                     "rec": {"size": 1}, "keep": {"name": ".ckptfs/generations/x"}}]])
def test_a_malformed_group_commit_intent_is_untrusted_and_loses_nothing(tmp_path, items) -> None:
    """A journal's last entry ``install_batch`` whose items are not plain installs (written by
    someone else, or damaged) is reported, never raised or rolled forward: the committed file
    stays as it was."""
    fs = CkptFS(OsBackingStore(str(tmp_path)))
    save(fs, "keep.bin", b"committed bytes")
    fs.commit.compact = lambda clean=False: None  # type: ignore[method-assign]
    epoch = fs.journal.epoch
    fs.shutdown()
    Journal(OsBackingStore(str(tmp_path))).load()
    with open(tmp_path / ".ckptfs" / f"journal.{epoch}", "ab") as f:
        f.write(encode_frame({"op": "install_batch", "items": items}))
    rep = recover(OsBackingStore(str(tmp_path)))
    assert any("untrusted" in p for p in rep.problems), rep.problems
    assert (tmp_path / "keep.bin").read_bytes() == b"committed bytes"
    assert "keep.bin" in rep.files and "a/f.bin" not in rep.files


def test_a_group_commit_counts_its_syncs(tmp_path) -> None:
    """C5's sync count, exactly: n files closed back to back into k directories cost n data fsyncs,
    ``staging/`` twice, the journal once and each directory once (n + 3 + k), where one install at
    a time costs 2n; in this order: the data and the staging names, the intent, then the names."""
    store, calls = counting_store(tmp_path)
    fs = CkptFS(store, commit_mode="async")
    save(fs, "warm.bin", b"w")  # the journal file is made by the first install (its own syncs)
    fs.mkdir("a", 0o755)
    fs.fsyncdir("")
    fs.commit.committer.held = True
    calls.clear()
    for i in range(8):
        save(fs, f"a/f{i}.bin", os.urandom(500 + i))
    fs.fsyncdir("a")
    assert fs.stats["batches"] == 1 and fs.stats["batched_installs"] == 8
    assert calls == ["fsync"] * 8 + ["fsync_dir", "fdatasync", "fsync_dir", "fsync_dir"], calls
    assert len(calls) == 8 + 3 + 1 < 2 * 8
    fs.shutdown()


def test_each_file_of_a_failed_group_commit_reports_its_own_failure(tmp_path) -> None:
    """C5: a group commit that fails fails every file in it, and each failure is reported on its
    own: an fsync of one of them that reports EIO does not take the other's failure with it, so an
    fsync of the other's directory still says EIO (a shared error object did: the review of C5)."""
    fs = CkptFS(OsBackingStore(str(tmp_path)), commit_mode="async")
    fs.mkdir("a", 0o755)
    fs.mkdir("b", 0o755)
    fs.fsyncdir("")
    fs.commit.committer.held = True
    real = fs.commit.sync_data

    def bad(v) -> None:
        if v.path == "a/x.bin":
            raise OSError(errno.EIO, "injected")
        real(v)

    fs.commit.sync_data = bad  # type: ignore[method-assign]
    save(fs, "a/x.bin", b"x" * 100)
    fh = fs.create("b/y.bin", 0o644)
    fs.write(fh, b"y" * 100, 0)
    fs.flush(fh)
    with pytest.raises(OSError) as e1:
        fs.fsync(fh)  # runs the group commit of both: it fails
    fs.release(fh)
    assert e1.value.errno == errno.EIO
    with pytest.raises(OSError) as e2:
        fs.fsyncdir("a")
    assert e2.value.errno == errno.EIO
    assert fs.stats["batches"] == 0 and not (tmp_path / "a" / "x.bin").exists()
    fs.shutdown()


def test_recovery_finishes_a_group_commit_only_up_to_a_staged_file_it_cannot_install(tmp_path) -> None:
    """C5: recovery finishes a batch's renames in close order and stops at a staged file whose bytes
    no longer match its record (written after its seal): a later file of the batch is never
    installed without it."""
    fs = CkptFS(OsBackingStore(str(tmp_path)), commit_mode="async")
    fs.commit.committer.held = True
    payload = {f"f{i}.bin": os.urandom(1500 + i) for i in range(3)}
    for p, data in payload.items():
        save(fs, p, data)
    fs.commit.put_in_place = lambda v: None  # type: ignore[method-assign]  # cut before any rename
    fs.commit.sync_batch_names = lambda vs: None  # type: ignore[method-assign]
    fs.fsyncdir("")
    _crash_without_done_records(tmp_path, fs)
    staged = sorted(tmp_path.joinpath(".ckptfs", "staging").iterdir(), key=lambda q: q.stat().st_ino)
    entries, _ = decode_frames((tmp_path / ".ckptfs" / f"journal.{fs.journal.epoch}").read_bytes())
    items = next(e for e in entries if e["op"] == "install_batch")["items"]
    (tmp_path / items[1]["staging"]).write_bytes(b"changed after its seal")
    assert len(staged) >= 3
    rep = recover(OsBackingStore(str(tmp_path)))
    assert (tmp_path / "f0.bin").read_bytes() == payload["f0.bin"]
    assert not (tmp_path / "f1.bin").exists() and not (tmp_path / "f2.bin").exists()
    assert not rep.inflight_completed and "f2.bin" not in rep.files
    assert os.listdir(tmp_path / ".ckptfs" / "staging") == []


@pytest.mark.parametrize("size", [0, 3000, 1 << 20, (1 << 20) + 1, 5 << 20])
def test_a_small_files_record_travels_compact_and_every_form_is_read(tmp_path, size) -> None:
    """records.COMPACT for files of at most one chunk (57 bytes: it fits in an ext4 inode, so the
    file gets no extended-attribute block), JSON above; the JSON form a file written before carries
    is read as before, and a compact value that is not a record is refused."""
    from ckptfs.records import COMPACT, from_xattr

    fs = CkptFS(OsBackingStore(str(tmp_path)))
    save(fs, "f.bin" if size else "f.txt", os.urandom(size))
    name = "f.bin" if size else "f.txt"
    rec = fs.records[name]
    fs.shutdown()
    carried = os.getxattr(tmp_path / name, "user.ckptfs.rec")
    assert (len(carried) == COMPACT.size) == (size <= 1 << 20)
    assert from_xattr(carried) == rec
    assert from_xattr(json.dumps(rec.to_json()).encode()) == rec  # the form earlier versions wrote
    if len(carried) == COMPACT.size:
        bad = bytearray(carried)
        bad[33:37] = (5 << 20).to_bytes(4, "little")  # a size its one digest cannot cover
        with pytest.raises(ValueError):
            from_xattr(bytes(bad))
        bad = bytearray(carried)
        bad[41:49] = b"\x00\x00\x00\x00\x00\x00\xf8\x7f"  # committed_at NaN
        with pytest.raises(ValueError):
            from_xattr(bytes(bad))


@pytest.mark.parametrize("by_proc", [True, False])
def test_backing_xattr_calls_by_name_and_by_fd_agree(tmp_path, by_proc) -> None:
    """The backing store's xattr calls: by name through /proc (Linux) or through an fd (elsewhere,
    where special files are unsupported); both reach files and directories the same way and
    follow no last-component symlink."""
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_bytes(b"x")
    os.symlink("f", tmp_path / "d" / "link")
    os.mkfifo(tmp_path / "d" / "fifo")
    store = OsBackingStore(str(tmp_path))
    store._proc_xattrs = by_proc
    try:
        for p in ("d", "d/f"):
            store.setxattr(p, "user.k", b"v", 0)
            assert store.getxattr(p, "user.k") == b"v"
            assert "user.k" in store.listxattr(p)
            store.removexattr(p, "user.k")
            with pytest.raises(OSError) as e:
                store.getxattr(p, "user.k")
            assert e.value.errno == errno.ENODATA
        store.setxattr("d/f", "user.k", b"v", 0)
        with pytest.raises(OSError) as e:
            store.getxattr("d/link", "user.k")  # the link itself (none), never f's
        assert e.value.errno in ((errno.ENODATA,) if by_proc else (errno.ENOTSUP,))
        with pytest.raises(OSError) as e:
            store.getxattr("d/fifo", "user.k")  # never opened (a fifo's open would block)
        assert e.value.errno == (errno.ENODATA if by_proc else errno.ENOTSUP)
        with pytest.raises(OSError) as e:
            store.getxattr("d/gone", "user.k")
        assert e.value.errno == errno.ENOENT
    finally:
        store.shutdown()
