"""Issue 26: every parser of on-disk and remote documents, fed arbitrary bytes and arbitrary
well-formed-but-hostile values (hypothesis), gives a clean error or a safe skip: never an exception
escaping, never a path outside the directory, never unbounded memory.  Logic tests on a real
backing directory (no mount needed: these are what recovery, restore and the uploader read)."""

from __future__ import annotations

import json
import os
import tempfile
import zlib

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ckptfs import META_DIR
from ckptfs.backing import OsBackingStore
from ckptfs.engine.seals import SealError, read_seal
from ckptfs.layout import GEN_DIR, STAGING, safe_rel
from ckptfs.log.journal import Journal, decode_frames, encode_frame
from ckptfs.log.metadata import CorruptMetadata, entry_problem, load_trusted
from ckptfs.mirror import protocol as P
from ckptfs.mirror.journal import UploadState, loose_states
from ckptfs.records import FileRecord, from_xattr
from ckptfs.rules import ConfigError, parse_config

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

HOSTILE_PATHS = st.sampled_from(["../x", "/etc/passwd", "a/../../b", "", ".", "a//b", ".ckptfs/x", "a\0b",
                                 "ok/file.pt", ".ckptfs/staging/../../../x", "x" * 5000, "step_1"])
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                    st.text(max_size=20), HOSTILE_PATHS)
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.one_of(st.text(max_size=8), HOSTILE_PATHS), inner, max_size=5)),
    max_leaves=25)
OPS = st.sampled_from(["install", "unlink", "rename", "exchange", "mkdir", "rmdir", "symlink", "mknod", "link",
                       "group_open", "group_seal", "group_trash", "group_retire", "group_quarantine",
                       "group_rollback", "quarantine_forget", "abort", "bogus"])
entries = st.fixed_dictionaries({"op": OPS}, optional={
    k: st.one_of(HOSTILE_PATHS, json_values) for k in ("path", "src", "dst", "staging", "to", "id", "keep",
                                                        "restore", "remove", "rec", "ino")})


def _dir() -> tuple[str, OsBackingStore]:
    d = tempfile.mkdtemp(prefix="ckptfs-fuzz-")
    os.mkdir(os.path.join(d, META_DIR), 0o700)
    return d, OsBackingStore(d)


def _paths_confined(loaded) -> None:  # type: ignore[no-untyped-def]
    st_ = loaded.state
    assert all(safe_rel(p) for p in st_.files)
    assert all(safe_rel(p) or p == "" for p in st_.groups)
    assert all(entry_problem(e) == "" for e in st_.entries)
    for p, hist in loaded.generations.items():
        assert safe_rel(p) and all(safe_rel(x.get("name"), GEN_DIR) for x in hist)


@FUZZ
@given(st.binary(max_size=4096))
def test_frames_of_arbitrary_bytes(data: bytes) -> None:
    out, used = decode_frames(data)
    assert 0 <= used <= len(data) and all(isinstance(e, dict) for e in out)


@FUZZ
@given(st.lists(entries, max_size=8), st.one_of(st.none(), json_values))
def test_journal_and_snapshot_of_hostile_values_are_confined(ents: list, snap) -> None:  # type: ignore[no-untyped-def]
    d, store = _dir()
    try:
        if snap is not None:
            doc = {"format": 1, "epoch": 0, "files": snap, "groups": snap, "generations": snap,
                   "quarantine": snap, "aborts": snap}
            with open(os.path.join(d, META_DIR, "snapshot"), "wb") as f:
                f.write(encode_frame(doc))
        with open(os.path.join(d, META_DIR, "journal.0"), "wb") as f:
            for e in ents:
                f.write(encode_frame(e))
        try:
            loaded = load_trusted(Journal(store))
        except CorruptMetadata:
            return  # a clean refusal (e.g. an unknown snapshot format)
        _paths_confined(loaded)
    finally:
        store.shutdown()


@FUZZ
@given(st.binary(max_size=2048), st.binary(max_size=2048))
def test_snapshot_and_journal_of_arbitrary_bytes(snap: bytes, journal: bytes) -> None:
    d, store = _dir()
    try:
        with open(os.path.join(d, META_DIR, "snapshot"), "wb") as f:
            f.write(snap)
        with open(os.path.join(d, META_DIR, "journal.0"), "wb") as f:
            f.write(journal)
        try:
            loaded = load_trusted(Journal(store))
        except CorruptMetadata:
            return
        _paths_confined(loaded)
    finally:
        store.shutdown()


@FUZZ
@given(json_values)
def test_entry_problem_never_raises(e) -> None:  # type: ignore[no-untyped-def]
    assert isinstance(entry_problem(e), str)


@FUZZ
@given(st.one_of(json_values, st.binary(max_size=300)))
def test_file_records(v) -> None:  # type: ignore[no-untyped-def]
    try:
        if isinstance(v, bytes):
            from_xattr(v)
        else:
            FileRecord.from_json(v)
    except (ValueError, KeyError, TypeError, AttributeError):
        pass


@FUZZ
@given(st.binary(max_size=600), st.binary(max_size=600), st.sampled_from(["abc", "../x", "0" * 32]))
def test_group_seal_records(commit: bytes, manifest: bytes, gid: str) -> None:
    d, store = _dir()
    try:
        os.mkdir(os.path.join(d, META_DIR, "groups"), 0o700)
        for name, data in ((f"{gid}.commit", commit), (f"{gid}.manifest", manifest)):
            p = os.path.join(d, META_DIR, "groups", name)
            if os.path.dirname(os.path.realpath(p)) == os.path.realpath(os.path.join(d, META_DIR, "groups")):
                with open(p, "wb") as f:
                    f.write(data)
        try:
            read_seal(store, gid)
        except (SealError, OSError):
            pass
    finally:
        store.shutdown()


@FUZZ
@given(json_values, json_values, HOSTILE_PATHS)
def test_remote_manifest_and_commit(manifest_doc, files, group) -> None:  # type: ignore[no-untyped-def]
    """A remote MANIFEST/COMMIT pair whose digests agree (the store may be hostile): only
    ProtocolError, and whatever passes names only paths inside the target, bounded sizes."""
    doc = {"format": P.FORMAT, "kind": "ckptfs-remote-manifest",
           "files": files if isinstance(files, dict) else {"a": manifest_doc}}
    body = json.dumps(doc).encode()
    import blake3

    commit = {"manifest_blake3": blake3.blake3(body).hexdigest(), "objects": dict.fromkeys(doc["files"], {})}
    try:
        got = P.check_commit(commit, body, group)
    except P.ProtocolError:
        return
    assert safe_rel(group)
    for rel, f in got["files"].items():
        assert safe_rel(rel) and 0 <= f["size"] <= P.MAX_FILE_BYTES


@FUZZ
@given(st.binary(max_size=600))
def test_remote_documents_of_arbitrary_bytes(data: bytes) -> None:
    for kind in ("ckptfs-remote-commit", "ckptfs-remote-manifest", "ckptfs-remote-part"):
        try:
            P.parse(data, kind, "x")
        except P.ProtocolError:
            pass


@FUZZ
@given(st.one_of(st.binary(max_size=600), json_values.map(lambda v: json.dumps(v).encode())),
       st.sampled_from(["step_1", "model.pt"]))
def test_upload_journal(data: bytes, group: str) -> None:
    d, store = _dir()
    try:
        import blake3

        os.mkdir(os.path.join(d, META_DIR, "mirror"), 0o700)
        name = blake3.blake3(group.encode()).hexdigest()[:32]
        try:
            doc = json.loads(data)
        except ValueError:
            doc = None
        if isinstance(doc, dict):
            doc.setdefault("group", group)
            data = json.dumps(doc).encode()
        with open(os.path.join(d, META_DIR, "mirror", f"{name}.json"), "wb") as f:
            f.write(data)
        st_ = UploadState.load(store, group, "")
        assert all(safe_rel(rel) for rel in st_.files)
        assert all(safe_rel(p) for p in loose_states(store))
    finally:
        store.shutdown()


@FUZZ
@given(st.one_of(st.binary(max_size=400), st.text(max_size=400).map(str.encode)))
@example(b"group = 5")
@example(b"idle_seal_seconds = nan")
@example(b"keep_last = -1")
@example(b'[[group]]\npattern = "x"\nmarkers = 3')
@example(b"keep_every = 1e400")
def test_group_configuration(data: bytes) -> None:
    try:
        rs = parse_config(data)
    except ConfigError:
        return
    assert rs.keep_last >= 0 and rs.keep_every >= 0 and rs.idle_seconds >= 0


def test_a_frame_of_a_non_object_is_damage() -> None:
    payload = b"[1, 2]"
    frame = len(payload).to_bytes(4, "little") + zlib.crc32(payload).to_bytes(4, "little") + payload
    assert decode_frames(frame) == ([], 0)
    assert STAGING.startswith(META_DIR)


def test_a_deeply_nested_group_commit_entry_is_refused_without_recursion() -> None:
    """A planted ``install_batch`` whose items hold items of their own (3,000 deep) is an untrusted
    entry, not a RecursionError in the loader."""
    e: dict = {"op": "install", "path": "a", "staging": ".ckptfs/staging/x"}
    for _ in range(3000):
        e = {"op": "install_batch", "items": [e]}
    assert entry_problem(e) == "an item names items of its own"
