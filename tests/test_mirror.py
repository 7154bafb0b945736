"""The tiered mirror (issue 14) against a real S3 server (SeaweedFS on loopback) and real mounts.

Every test here mounts ckptfs with ``--mirror s3://BUCKET/PREFIX`` (its own bucket) over a real
directory, writes with real tools (torch.save, DCP over gloo, plain writes), and checks what the
store holds with boto3 directly.  Longer campaigns: scripts/mirror_kill_campaign (every named
crash point and random kills), scripts/multinode_campaign (DCP world size 4 with kills).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import blake3
import pytest

from ckptfs_testing.mount import Mount, child_env
from ckptfs_testing.s3server import SeaweedS3, free_ports

MiB = 1 << 20
_bucket_no = itertools.count()


@pytest.fixture(scope="module")
def s3():
    server = SeaweedS3().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def bucket(s3: SeaweedS3, request) -> str:
    name = f"t{next(_bucket_no)}-{request.node.name[:30].lower().replace('_', '-').strip('-')}".strip("-")
    name = s3.make_bucket(name[:63].rstrip("-"))
    yield name
    try:
        s3.drop_bucket(name)
    except Exception:  # the server of a test that kills it; nothing to free
        pass


def mirror_mount(d: Path, s3: SeaweedS3, url: str, *extra: str, env: dict | None = None) -> Mount:
    return Mount(d, env={**s3.env(), **(env or {})},
                 extra_args=["--mirror", url, "--mirror-part-size", "8M", *extra])


def mstate(p: Path) -> str:
    try:
        return os.getxattr(p, "user.ckptfs.mirror").decode()
    except OSError as e:
        return f"errno {e.errno}"


def wait_state(p: Path, want: str = "committed", timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    st = ""
    while time.monotonic() < deadline:
        st = mstate(p)
        if st == want:
            return st
        time.sleep(0.1)
    raise AssertionError(f"{p}: mirror state {st!r} after {timeout}s, wanted {want!r}")


def keys(s3: SeaweedS3, bucket: str) -> list[str]:
    c = s3.client()
    out: list[str] = []
    for page in c.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        out += [o["Key"] for o in page.get("Contents", [])]
    return sorted(out)


def cli(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckptfs", *args], capture_output=True, text=True,
                          env=child_env(env), timeout=timeout)


def save_group(g: Path, big_mib: int = 20, seed: int = 0) -> dict[str, bytes]:
    """A checkpoint written with real torch.save (a multipart-sized model, a small optimizer) and a
    COMMIT marker last; returns the bytes of each file as written."""
    code = f"""
import torch, os
g = {str(g)!r}
os.makedirs(g, exist_ok=True)
torch.manual_seed({seed})
torch.save({{"w": torch.randn({big_mib} * 262144)}}, os.path.join(g, "model.pt"))
torch.save({{"step": {seed}, "lr": 0.1}}, os.path.join(g, "optimizer.pt"))
open(os.path.join(g, "COMMIT"), "w").write("done")
"""
    subprocess.run([sys.executable, "-c", code], check=True, env=child_env(), timeout=120)
    return {p.name: p.read_bytes() for p in g.iterdir()}


def write_group(g: Path, files: dict[str, bytes]) -> dict[str, bytes]:
    """Plain writes of ``files``, then a COMMIT marker (which seals the group); returns all of them."""
    g.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (g / name).write_bytes(data)
    (g / "COMMIT").write_bytes(b"done")
    return {**files, "COMMIT": b"done"}


# ------------------------------------------------------------------ the protocol, end to end
def test_a_sealed_group_is_committed_remotely_last_and_restores_bit_identical(tmp_path: Path, s3: SeaweedS3,
                                                                             bucket: str) -> None:
    d = tmp_path / "ckpts"
    d.mkdir()
    url = f"s3://{bucket}/run1"
    with mirror_mount(d, s3, url):
        files = save_group(d / "step_100")
        (d / "notes.txt").write_text("outside any group\n")
        wait_state(d / "step_100")
        root = json.loads(os.getxattr(d, "user.ckptfs.mirror"))
        assert root["pinned_groups"] == 0 and root["groups_committed"] == 1 and root["parts_uploaded"] >= 3
        deadline = time.monotonic() + 20
        while "run1/notes.txt" not in keys(s3, bucket) and time.monotonic() < deadline:
            time.sleep(0.1)
    c = s3.client()
    ks = keys(s3, bucket)
    assert {"run1/step_100/model.pt", "run1/step_100/optimizer.pt", "run1/step_100/COMMIT",
            "run1/step_100/.ckptfs/MANIFEST", "run1/step_100/.ckptfs/COMMIT", "run1/notes.txt"} <= set(ks), ks
    # M1: the COMMIT names the MANIFEST by blake3 and every object by ETag and checksum
    commit = json.loads(c.get_object(Bucket=bucket, Key="run1/step_100/.ckptfs/COMMIT")["Body"].read())
    manifest = c.get_object(Bucket=bucket, Key="run1/step_100/.ckptfs/MANIFEST")["Body"].read()
    assert commit["manifest_blake3"] == blake3.blake3(manifest).hexdigest()
    assert set(commit["objects"]) == set(files)
    head = c.head_object(Bucket=bucket, Key="run1/step_100/model.pt", ChecksumMode="ENABLED")
    assert head["ChecksumType"] == "FULL_OBJECT" and head["ETag"].strip('"').endswith("-3")  # 20 MiB in 8 MiB parts
    assert head["ChecksumCRC64NVME"] == commit["objects"]["model.pt"]["checksum"]
    assert json.loads(manifest)["files"]["model.pt"]["chunks"][0] == \
        blake3.blake3(files["model.pt"][:MiB]).hexdigest()  # blake3 per 1 MiB chunk

    # restore into a fresh directory: bit-identical, sealed, loadable
    out = tmp_path / "fresh"
    out.mkdir()
    r = cli("restore", url, str(out), "--json", env=s3.env())
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["ok"] and rep["group"] == "step_100" and rep["files"] == 3
    for name, data in files.items():
        assert (out / "step_100" / name).read_bytes() == data, name
    r = cli("verify", str(out))
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr
    with Mount(out):
        assert os.getxattr(out / "step_100", "user.ckptfs.status") == b"sealed"
        load = f"import torch; print(torch.load({str(out / 'step_100' / 'model.pt')!r})['w'].numel())"
        r = subprocess.run([sys.executable, "-c", load], capture_output=True, text=True, env=child_env(), timeout=120)
        assert r.stdout.strip() == str(20 * 262144), r.stderr
    r = cli("verify", url, "--read-data", env=s3.env())
    assert r.returncode == 0 and "ok      step_100" in r.stdout, r.stdout + r.stderr


def test_restore_into_a_mounted_directory_goes_through_the_mount_and_seals(tmp_path: Path, s3: SeaweedS3,
                                                                         bucket: str) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    url = f"s3://{bucket}/m"
    with mirror_mount(src, s3, url):
        g = src / "runs" / "a" / "checkpoint-3"
        g.mkdir(parents=True)
        body = os.urandom(3 * MiB)
        header = json.dumps({"w": {"dtype": "U8", "shape": [len(body)], "data_offsets": [0, len(body)]}}).encode()
        files = {"model.safetensors": len(header).to_bytes(8, "little") + header + body, "trainer_state.json": b"{}"}
        for name, data in files.items():  # HF's order: trainer_state.json (the marker) last
            (g / name).write_bytes(data)
        wait_state(src / "runs" / "a" / "checkpoint-3")
    with Mount(dst) as m:
        r = cli("restore", url, str(dst), "--group", "checkpoint-3", "--json", env=s3.env())
        assert r.returncode == 0, r.stderr
        g = dst / "runs" / "a" / "checkpoint-3"
        assert os.getxattr(g, "user.ckptfs.status") == b"sealed"
        for name, data in files.items():
            assert (g / name).read_bytes() == data
        assert m.stats()["commits"] >= len(files)  # written through the mount's commit path
    r = cli("restore", url, str(dst), "--group", "checkpoint-3", env=s3.env())
    assert r.returncode == 1 and "exists" in r.stderr, r.stderr  # never over an existing copy unasked


def test_a_flipped_byte_in_the_store_fails_verify_and_restore_naming_the_object(tmp_path: Path, s3: SeaweedS3,
                                                                             bucket: str) -> None:
    d = tmp_path / "ckpts"
    d.mkdir()
    url = f"s3://{bucket}/p"
    with mirror_mount(d, s3, url):
        files = save_group(d / "step_7", big_mib=3)
        wait_state(d / "step_7")
    c = s3.client()
    body = bytearray(c.get_object(Bucket=bucket, Key="p/step_7/model.pt")["Body"].read())
    body[len(body) // 2] ^= 0x01
    c.put_object(Bucket=bucket, Key="p/step_7/model.pt", Body=bytes(body))  # same size: a HEAD cannot tell
    r = cli("verify", url, "--read-data", env=s3.env())
    assert r.returncode == 1 and "step_7/model.pt" in r.stdout and "FAILED" in r.stdout, r.stdout + r.stderr
    # restore over the local copy (--replace): the download fails before anything is written
    r = cli("restore", url, str(d), "--replace", env=s3.env())
    assert r.returncode == 1 and "step_7/model.pt" in r.stderr and "chunk" in r.stderr, r.stderr
    for name, data in files.items():
        assert (d / "step_7" / name).read_bytes() == data
    assert not [p for p in (d / ".ckptfs").iterdir() if p.name.startswith("restore-")]
    r = cli("verify", str(d))
    assert r.returncode == 0, r.stdout + r.stderr
    # into new directories (streamed: downloads and installs overlap): the corrupt file is never
    # committed and whatever was installed before it (model.pt, good again) is removed
    c.put_object(Bucket=bucket, Key="p/step_7/model.pt", Body=files["model.pt"])
    opt = bytearray(files["optimizer.pt"])
    opt[-1] ^= 0x01
    c.put_object(Bucket=bucket, Key="p/step_7/optimizer.pt", Body=bytes(opt))
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    r = cli("restore", url, str(fresh), env=s3.env())
    assert r.returncode == 1 and "step_7/optimizer.pt" in r.stderr, r.stderr
    assert not (fresh / "step_7").exists()
    r = cli("status", str(fresh))
    assert json.loads(r.stdout)["committed_files"] == 0, r.stdout
    mounted = tmp_path / "mounted"
    mounted.mkdir()
    with Mount(mounted):
        r = cli("restore", url, str(mounted), env=s3.env())
        assert r.returncode == 1 and "step_7/optimizer.pt" in r.stderr, r.stderr
        assert not (mounted / "step_7").exists()


def test_two_publishers_racing_on_one_group_write_exactly_one_commit(s3: SeaweedS3, bucket: str) -> None:
    """M2: eight publishers (two per node) race on one complete group: one COMMIT, one winner."""
    from ckptfs.mirror import protocol as P
    from ckptfs.mirror.publish import publish
    from ckptfs.mirror.remote import Location, Remote, crc, crc_b64

    remote = Remote(Location(bucket, "race"), s3.client())
    for node in ("a", "b"):
        data = node.encode() * 1000
        remote.put(P.data_key("step_1", f"{node}.pt"), data)
        chunks = blake3.blake3(data).hexdigest()
        rec = {"size": len(data), "blake3": chunks, "chunks": chunks}
        entry = {f"{node}.pt": P.file_entry(rec, crc_b64(crc(data)))}
        remote.put(P.part_key("step_1", node), P.build_part("step_1", node, entry, True, "x", "y", 1))
    results: list[str] = []
    barrier = threading.Barrier(8)

    def race(node: str) -> None:
        barrier.wait()
        results.append(publish(remote, "step_1", node))

    threads = [threading.Thread(target=race, args=(n,)) for n in "abababab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results).count("won") == 1, results
    assert all(r in ("won", "lost", "found") for r in results), results
    commits = [k for k in keys(s3, bucket) if k.endswith("/.ckptfs/COMMIT")]
    assert commits == ["race/step_1/.ckptfs/COMMIT"]


def test_the_startup_probe_passes_on_a_store_that_honours_if_none_match(s3: SeaweedS3, bucket: str) -> None:
    from ckptfs.mirror.remote import Location, PreconditionFailed, Remote

    remote = Remote(Location(bucket, "x"), s3.client())
    remote.probe()  # raises MirrorRefused on a store that accepts the second put
    remote.put("k", b"1", if_absent=True)
    with pytest.raises(PreconditionFailed):
        remote.put("k", b"2", if_absent=True)
    assert not [k for k in keys(s3, bucket) if ".ckptfs-probe" in k]  # the probe cleans up


def test_a_store_that_ignores_if_none_match_is_refused_at_mount(tmp_path: Path, s3: SeaweedS3, bucket: str) -> None:
    """The probe against a real store behind a proxy that drops If-None-Match (SeaweedFS <= 3.96
    did): the second conditional put succeeds, so the mount is refused with a clear message."""
    from ckptfs.mirror.remote import Location, MirrorRefused, Remote
    from ckptfs_testing.s3proxy import IgnoringProxy

    with IgnoringProxy(s3.endpoint) as proxy:
        env = {**s3.env(), "AWS_ENDPOINT_URL": proxy.endpoint}
        import boto3
        from botocore.config import Config

        pc = boto3.client("s3", endpoint_url=proxy.endpoint, aws_access_key_id=s3.access_key,
                          aws_secret_access_key=s3.secret_key, region_name=s3.region,
                          config=Config(request_checksum_calculation="when_required"))
        with pytest.raises(MirrorRefused, match="If-None-Match"):
            Remote(Location(bucket, "p"), pc).probe()
        d = tmp_path / "m"
        d.mkdir()
        r = cli("mount", str(d), "--mirror", f"s3://{bucket}/p", env=env, timeout=60)
        assert r.returncode == 1 and "ignores If-None-Match" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
        assert not os.path.ismount(d)


def test_the_store_rejects_a_part_or_object_whose_bytes_do_not_match_the_checksum_sent(s3: SeaweedS3,
                                                                                      bucket: str) -> None:
    """What the per-part and whole-object CRC64-NVME buy: a corrupted transfer is refused (BadDigest)."""
    from ckptfs.mirror.remote import Location, Remote, RemoteError, crc

    remote = Remote(Location(bucket, "crc"), s3.client())
    part = os.urandom(5 * MiB)
    with pytest.raises(RemoteError, match="BadDigest"):
        remote.put("whole", part[:-1] + b"x", checksum=crc(part))
    uid = remote.create_upload("mp")
    with pytest.raises(RemoteError, match="BadDigest"):
        remote.upload_part("mp", uid, 1, part[:-1] + b"x", crc(part))
    etag = remote.upload_part("mp", uid, 1, part, crc(part))
    with pytest.raises(RemoteError, match="BadDigest"):
        remote.complete_upload("mp", uid, {1: etag}, crc(part) ^ 1, {1: crc(part)})
    remote.complete_upload("mp", uid, {1: etag}, crc(part), {1: crc(part)})
    assert remote.head("mp")["size"] == 5 * MiB and remote.head("whole") is None


# ------------------------------------------------------------------ rotation safety
def test_store_down_with_keep_last_1_never_deletes_a_group_without_a_remote_commit(tmp_path: Path,
                                                                                  bucket: str) -> None:
    """M4: the store SIGKILLed mid-training; three groups sealed meanwhile stay (pinned, reported);
    when the store returns they are uploaded, then retention removes the older two locally."""
    server = SeaweedS3().start()  # its own server: this test kills it
    try:
        server.make_bucket("pinned")
        d = tmp_path / "ckpts"
        d.mkdir()
        port = free_ports(1)[0]
        with mirror_mount(d, server, "s3://pinned/run", "--keep-last", "1", "--mirror-pin-cap", "1M",
                          "--metrics", f"127.0.0.1:{port}"):
            save_group(d / "step_1", big_mib=2, seed=1)
            wait_state(d / "step_1")
            server.kill()
            for s in (2, 3, 4):
                save_group(d / f"step_{s}", big_mib=2, seed=s)
            time.sleep(3)
            assert sorted(p.name for p in d.iterdir() if p.name.startswith("step_")) == \
                ["step_2", "step_3", "step_4"]  # step_1 (committed remotely) went; none of the others
            root = json.loads(os.getxattr(d, "user.ckptfs.mirror"))
            assert root["pinned_groups"] == 3 and root["alert"], root
            import urllib.request

            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
            assert "ckptfs_mirror_pin_alert 1.0" in text and "ckptfs_mirror_pinned_groups 3.0" in text, text
            assert mstate(d / "step_2").startswith(("failed:", "pending", "uploading")), mstate(d / "step_2")
            server.start()
            wait_state(d / "step_4", timeout=120)
            # retention retires step_2 and step_3 one after the other (each a rename and its fsyncs):
            # watch the directory until both went, checking at every look that a group gone locally
            # has its remote COMMIT (M4 while the backlog drains, not only before)
            deadline = time.monotonic() + 30
            while True:
                left = sorted(p.name for p in d.iterdir() if p.name.startswith("step_"))
                ks = keys(server, "pinned")
                for s in (2, 3):
                    if f"step_{s}" not in left:
                        assert f"run/step_{s}/.ckptfs/COMMIT" in ks, (s, ks)
                if left == ["step_4"] or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert left == ["step_4"]
            root = json.loads(os.getxattr(d, "user.ckptfs.mirror"))
            assert root["pinned_groups"] == 0 and not root["alert"], root
        ks = keys(server, "pinned")
        for s in (1, 2, 3, 4):
            assert f"run/step_{s}/.ckptfs/COMMIT" in ks, ks
    finally:
        server.stop()


def test_a_latest_pointer_waits_for_the_group_before_it_and_corrupt_bytes_are_never_uploaded(
        tmp_path: Path, s3: SeaweedS3, bucket: str) -> None:
    """DeepSpeed's ``latest`` (a file outside groups, naming global_step10) is uploaded only after
    the groups queued before it are committed (composer #3376).  Here global_step10's bytes rot on
    the local disk before its upload: the uploader refuses to send bytes that do not match their
    commit record, the group's state says why, and ``latest`` stays local."""
    d, b = tmp_path / "ckpts", tmp_path / "backing"
    d.mkdir()
    b.mkdir()
    m = Mount(d, backing=b, env=s3.env(), extra_args=["--mirror", f"s3://{bucket}/ds", "--mirror-part-size", "8M"])
    with m:
        g = d / "global_step9"
        g.mkdir()
        (g / "mp_rank_00_model_states.pt").write_bytes(os.urandom(2 * MiB))
        (d / "latest").write_text("global_step9")
        wait_state(g)
        deadline = time.monotonic() + 20
        while "ds/latest" not in keys(s3, bucket) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "ds/latest" in keys(s3, bucket)  # a pointer after a committed group goes up
        g = d / "global_step10"
        g.mkdir()
        f = g / "mp_rank_00_model_states.pt"
        f.write_bytes(os.urandom(12 * MiB))
        # bit rot under the mount, before the upload: one bit flipped in the backing file, its mtime
        # kept (a disk does not touch it).  Only after the writer's handle was released: a write to
        # the backing file before that is taken as the writer's own (passthrough, fs.py _after_bypass)
        deadline = time.monotonic() + 10
        while json.loads(os.getxattr(d, "user.ckptfs.stats"))["open_handles"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert json.loads(os.getxattr(d, "user.ckptfs.stats"))["open_handles"] == 0
        raw_path = b / "global_step10" / f.name
        before = os.stat(raw_path)
        with open(raw_path, "r+b") as raw:
            raw.seek(5 * MiB)
            byte = raw.read(1)
            raw.seek(5 * MiB)
            raw.write(bytes([byte[0] ^ 1]))
        os.utime(raw_path, ns=(before.st_atime_ns, before.st_mtime_ns))
        (d / "latest").write_text("global_step10")
        deadline = time.monotonic() + 30
        while not mstate(g).startswith("failed:") and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1)  # (a second more for a wrong upload of latest to show, if there were one)
        st = mstate(g)
        assert st.startswith("failed:") and "does not match its commit record" in st, st
        ks = keys(s3, bucket)
        assert "ds/global_step10/.ckptfs/COMMIT" not in ks and "ds/global_step10/mp_rank_00_model_states.pt" not in ks
        body = s3.client().get_object(Bucket=bucket, Key="ds/latest")["Body"].read()
        assert body == b"global_step9"  # the new latest waits behind the group it names


def test_groups_sealed_while_the_store_is_down_upload_after_an_unmount_and_remount(tmp_path: Path) -> None:
    """rclone #7309's trap: unmounting before the write-back loses nothing here.  The store is down,
    a group is sealed, the mount goes away; at the next mount (store back) the group is uploaded
    from its journal and the backlog scan."""
    server = SeaweedS3().start()
    try:
        server.make_bucket("backlog")
        d = tmp_path / "ckpts"
        d.mkdir()
        server.kill()
        with mirror_mount(d, server, "s3://backlog/run"):  # mounts although the store is unreachable
            files = write_group(d / "step_9", {"model.pt": os.urandom(10 * MiB)})
            time.sleep(1)
            assert mstate(d / "step_9").startswith(("failed:", "pending", "uploading")), mstate(d / "step_9")
        server.start()
        with mirror_mount(d, server, "s3://backlog/run"):
            wait_state(d / "step_9", timeout=60)
        out = tmp_path / "out"
        out.mkdir()
        assert cli("restore", "s3://backlog/run", str(out), env=server.env()).returncode == 0
        for name, data in files.items():
            assert (out / "step_9" / name).read_bytes() == data
    finally:
        server.stop()


def test_remote_retention_keeps_the_newest_k_and_deletes_commit_first(tmp_path: Path, s3: SeaweedS3,
                                                                    bucket: str) -> None:
    d = tmp_path / "ckpts"
    d.mkdir()
    with mirror_mount(d, s3, f"s3://{bucket}/r", "--remote-keep-last", "2"):
        for s in (1, 2, 3):
            save_group(d / f"step_{s}", big_mib=1, seed=s)
            wait_state(d / f"step_{s}")
    ks = keys(s3, bucket)
    assert not [k for k in ks if k.startswith("r/step_1/")], ks
    assert "r/step_2/.ckptfs/COMMIT" in ks and "r/step_3/.ckptfs/COMMIT" in ks
    assert (d / "step_1").exists()  # local retention is --keep-last's business, not the remote's


# ------------------------------------------------------------------ crashes
KILL_POINTS = ["mirror_upload_created", "mirror_mid_part", "mirror_before_complete", "mirror_completed",
               "mirror_part_put", "mirror_manifest_put", "mirror_commit_put"]


@pytest.mark.parametrize("point", KILL_POINTS)
def test_a_daemon_killed_during_an_upload_resumes_and_commits_after_remount(tmp_path: Path, s3: SeaweedS3,
                                                                           bucket: str, point: str) -> None:
    """kill -9 at a named point of the upload; after remount the group reaches its remote COMMIT,
    no part the store had is sent again, no multipart upload is left, the COMMIT verifies.
    (Every point and 100 random kills: scripts/mirror_kill_campaign.)"""
    d = tmp_path / "ckpts"
    d.mkdir()
    url = f"s3://{bucket}/k"
    with mirror_mount(d, s3, url, env={"CKPTFS_CRASH_AT": point}).start() as m:  # (unmounted if it fails)
        files = write_group(d / "step_5", {"model.pt": os.urandom(30 * MiB), "optimizer.pt": os.urandom(1000)})
        assert m.wait_dead(60) is not None, f"daemon did not reach {point}"
        m.detach()
    with mirror_mount(d, s3, url):
        wait_state(d / "step_5", timeout=90)
        root = json.loads(os.getxattr(d, "user.ckptfs.mirror"))
    assert root["parts_resent"] == 0, root
    if point in ("mirror_completed", "mirror_part_put", "mirror_manifest_put", "mirror_commit_put"):
        assert root["parts_uploaded"] == 0 and root["bytes_uploaded"] < MiB, root  # every object was up already
    assert s3.client().list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    r = cli("verify", url, "--read-data", env=s3.env())
    assert r.returncode == 0, r.stdout + r.stderr
    out = tmp_path / "out"
    out.mkdir()
    assert cli("restore", url, str(out), env=s3.env()).returncode == 0
    for name, data in files.items():
        assert (out / "step_5" / name).read_bytes() == data


def wait_object(s3: SeaweedS3, bucket: str, key: str, data: bytes, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    got = b""
    while time.monotonic() < deadline:
        try:
            got = s3.client().get_object(Bucket=bucket, Key=key)["Body"].read()
        except Exception:  # noqa: BLE001 (not there yet)
            got = b""
        if got == data:
            return
        time.sleep(0.2)
    raise AssertionError(f"{key}: {len(got)} bytes in the store after {timeout}s, not the {len(data)} written")


def test_a_large_file_outside_groups_goes_up_in_journaled_parts_and_resumes_after_a_kill(tmp_path: Path,
                                                                                        s3: SeaweedS3,
                                                                                        bucket: str) -> None:
    """``torch.save(sd, "ckpts/model.pt")`` at the top: no group, but a file of several parts.  It
    goes up as a journaled multipart upload: the daemon killed after its first part, the next mount
    resumes it from the journal (no event announces the file again), the store ends with its bytes
    and no multipart upload left; a new version then replaces the remote object."""
    d = tmp_path / "ckpts"
    d.mkdir()
    url = f"s3://{bucket}/top"
    v1 = os.urandom(20 * MiB)  # 3 parts of 8 MiB
    with mirror_mount(d, s3, url, env={"CKPTFS_CRASH_AT": "mirror_part_journaled"}).start() as m:
        (d / "model.pt").write_bytes(v1)
        assert m.wait_dead(60) is not None, "daemon did not reach mirror_part_journaled"
        m.detach()
    assert len(s3.client().list_multipart_uploads(Bucket=bucket).get("Uploads", [])) == 1
    with mirror_mount(d, s3, url):
        wait_object(s3, bucket, "top/model.pt", v1)
        root = json.loads(os.getxattr(d, "user.ckptfs.mirror"))
        assert root["parts_skipped"] >= 1 and root["parts_resent"] == 0, root  # the store's part kept
        v2 = os.urandom(20 * MiB)
        (d / "model.pt").write_bytes(v2)
        wait_object(s3, bucket, "top/model.pt", v2)
        root = json.loads(os.getxattr(d, "user.ckptfs.mirror"))
        # v1's 3 parts skipped (the store had them) or sent, v2's 3 sent; bytes counted once (v1's
        # first part was journaled, so at most 12 MiB of v1 and v2's 20 MiB went up from this mount)
        assert root["files_uploaded"] == 2 and root["parts_skipped"] + root["parts_uploaded"] == 6, root
        assert 20 * MiB <= root["bytes_uploaded"] <= 32 * MiB, root
    assert s3.client().list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_a_save_in_a_temporary_directory_goes_up_once_as_its_group_under_the_final_name(tmp_path: Path,
                                                                                       s3: SeaweedS3,
                                                                                       bucket: str) -> None:
    """Orbax writes ``<step>.orbax-checkpoint-tmp-<ts>/`` and renames it to ``<step>`` when done.
    Its files, outside any group until the rename, are not uploaded as loose objects (uploaded
    twice, and never deleted remotely): the save goes up once, as group ``5``, when sealed."""
    d = tmp_path / "ckpts"
    d.mkdir()
    url = f"s3://{bucket}/o"
    with mirror_mount(d, s3, url):
        tmp = d / "5.orbax-checkpoint-tmp-1234"
        tmp.mkdir()
        (tmp / "_METADATA").write_bytes(b"{}")
        (tmp / "state.bin").write_bytes(os.urandom(MiB))
        deadline = time.monotonic() + 20  # the uploader has handled both files before the rename
        while json.loads(os.getxattr(d, "user.ckptfs.mirror"))["files_deferred"] < 2:
            assert time.monotonic() < deadline, os.getxattr(d, "user.ckptfs.mirror")
            time.sleep(0.05)
        os.rename(tmp, d / "5")
        wait_state(d / "5")
    ks = keys(s3, bucket)
    assert not [k for k in ks if "orbax-checkpoint-tmp" in k], ks
    assert {"o/5/_METADATA", "o/5/state.bin", "o/5/.ckptfs/COMMIT"} <= set(ks), ks


# ------------------------------------------------------------------ multi-node
def _dcp_job(tmp_path: Path, world: int, steps: list[int]) -> None:
    port = free_ports(1)[0]
    procs = [subprocess.Popen([sys.executable, "-m", "ckptfs_testing.dcp_ranks", "--rank", str(r), "--world",
                               str(world), "--port", str(port), "--dir", str(tmp_path / f"node{r}"), "--steps",
                               *map(str, steps)], env=child_env(), stdout=subprocess.DEVNULL)
             for r in range(world)]
    assert [p.wait(180) for p in procs] == [0] * world


def test_a_dcp_save_over_four_node_mounts_commits_once_and_restores_whole(tmp_path: Path, s3: SeaweedS3,
                                                                         bucket: str) -> None:
    """World size 4 (gloo), rank r writing through mount r (--node-part); each node uploads its
    shard and part; the COMMIT appears only when the .metadata's files are all up; a restore on a
    fresh directory loads bit-exact.  (100 trials with kills: scripts/multinode_campaign.)"""
    from ckptfs_testing.dcp_ranks import check_loadable

    url = f"s3://{bucket}/job"
    mounts = []
    try:
        for r in range(4):
            nd = tmp_path / f"node{r}"
            nd.mkdir()
            mounts.append(mirror_mount(nd, s3, url, "--mirror-node", f"n{r}", "--node-part", "--idle-seal", "1")
                          .start())
        _dcp_job(tmp_path, 4, [1, 2])
        for r in range(4):
            wait_state(tmp_path / f"node{r}" / "step_2", timeout=60)
        root = [json.loads(os.getxattr(tmp_path / f"node{r}", "user.ckptfs.mirror")) for r in range(4)]
        assert sum(x["commits_won"] for x in root) == 2, root  # one COMMIT per step, whoever wins
    finally:
        for m in mounts:
            m.stop()
    ks = keys(s3, bucket)
    assert sorted(k.rsplit("/", 1)[1] for k in ks if k.startswith("job/step_2/.ckptfs/parts/")) == \
        ["n0.json", "n1.json", "n2.json", "n3.json"]
    out = tmp_path / "fresh"
    out.mkdir()
    r = cli("restore", url, str(out), env=s3.env())
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (out / "step_2").iterdir()) == \
        [".metadata", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "__3_0.distcp"]
    assert check_loadable(str(out / "step_2"), 2, 4, 1.0) == ""


def test_a_lower_step_saved_after_higher_ones_is_committed_before_any_node_retires_it(
        tmp_path: Path, s3: SeaweedS3, bucket: str) -> None:
    """Issue 25 item 9: with --node-part --keep-last 1 on every node, a complete DCP save of a step
    lower than steps already committed (a rollback's re-run) was retired on every node the moment it
    sealed, before any upload: no COMMIT, no copy anywhere.  Two node mounts, world 2: steps 2 and 3,
    then step 1 again.  Step 1 reaches its remote COMMIT and restores whole; no node retires it
    before that (the group sealed last is kept); every node's status agrees with the store."""
    from ckptfs_testing.dcp_ranks import check_loadable

    url = f"s3://{bucket}/job"
    mounts = []
    try:
        for r in range(2):
            nd = tmp_path / f"node{r}"
            nd.mkdir()
            mounts.append(mirror_mount(nd, s3, url, "--mirror-node", f"n{r}", "--node-part", "--idle-seal", "1",
                                       "--keep-last", "1").start())
        _dcp_job(tmp_path, 2, [2, 3])
        for r in range(2):
            wait_state(tmp_path / f"node{r}" / "step_3", timeout=60)
        _dcp_job(tmp_path, 2, [1])
        for r in range(2):
            assert (tmp_path / f"node{r}" / "step_1").is_dir(), r  # sealed last: kept
            wait_state(tmp_path / f"node{r}" / "step_1", timeout=60)
        ks = keys(s3, bucket)
        assert "job/step_1/.ckptfs/COMMIT" in ks and "job/step_3/.ckptfs/COMMIT" in ks, ks
        for r in range(2):
            st = json.loads(os.getxattr(tmp_path / f"node{r}", "user.ckptfs.mirror"))
            assert st["last_error"] == "", st
            for name in os.listdir(tmp_path / f"node{r}"):
                if name.startswith("step_"):  # what a node still holds says what the store has
                    assert mstate(tmp_path / f"node{r}" / name) == "committed", (r, name)
                    assert f"job/{name}/.ckptfs/COMMIT" in ks, (r, name)
    finally:
        for m in mounts:
            m.stop()
    out = tmp_path / "fresh"
    out.mkdir()
    r = cli("restore", url, str(out), "--group", "step_1", env=s3.env())
    assert r.returncode == 0, r.stderr
    assert check_loadable(str(out / "step_1"), 1, 2, 1.0) == ""


@pytest.mark.parametrize("sealed_by", ["idle", "next-save"])
def test_a_node_part_alone_never_publishes_a_commit(tmp_path: Path, s3: SeaweedS3, bucket: str,
                                                    sealed_by: str) -> None:
    """M3: rank 1's node seals and uploads its shard; without rank 0's .metadata no COMMIT exists.
    Sealed on idle, or because its writer began the next save (``mkdir step_4``): that seal too is
    inferred, not a completion record; its part said ``completes`` and, with another node's part,
    published a COMMIT of 2 of step_1's 5 files (the four-node DCP test, about 1 run in 4)."""
    d = tmp_path / "node1"
    (d / "step_3").mkdir(parents=True)
    url = f"s3://{bucket}/job"
    idle = "1" if sealed_by == "idle" else "60"
    with mirror_mount(d, s3, url, "--mirror-node", "n1", "--node-part", "--idle-seal", idle):
        (d / "step_3" / "__1_0.distcp").write_bytes(os.urandom(MiB))
        if sealed_by == "next-save":
            (d / "step_4").mkdir()
            (d / "step_4" / "__1_0.distcp").write_bytes(os.urandom(MiB))
        wait_state(d / "step_3", "waiting for other nodes", timeout=30)
    ks = keys(s3, bucket)
    assert "job/step_3/__1_0.distcp" in ks and "job/step_3/.ckptfs/parts/n1.json" in ks
    assert not [k for k in ks if k.endswith("COMMIT") or k.endswith("MANIFEST")], ks
    part = json.loads(s3.client().get_object(Bucket=bucket, Key="job/step_3/.ckptfs/parts/n1.json")["Body"].read())
    assert part["completes"] is False, part


def test_a_node_part_left_open_by_a_daemon_crash_is_sealed_at_recovery_and_uploaded(tmp_path: Path, s3: SeaweedS3,
                                                                                     bucket: str) -> None:
    """--node-part: rank 1's shard is committed, its group not yet idle-sealed, and the daemon is
    killed.  Recovery seals the part (without --node-part it would be torn and quarantined, and the
    multi-node checkpoint could never complete remotely); it is then uploaded."""
    d = tmp_path / "node1"
    (d / "step_4").mkdir(parents=True)
    url = f"s3://{bucket}/job"
    args = ("--mirror-node", "n1", "--node-part", "--idle-seal", "60")
    data = os.urandom(MiB)
    with mirror_mount(d, s3, url, *args).start() as m:
        (d / "step_4" / "__1_0.distcp").write_bytes(data)
        assert os.getxattr(d / "step_4", "user.ckptfs.status") == b"open"
        m.kill()
    with mirror_mount(d, s3, url, *args):
        assert os.getxattr(d / "step_4", "user.ckptfs.status") == b"sealed"
        wait_state(d / "step_4", "waiting for other nodes", timeout=30)
        assert (d / "step_4" / "__1_0.distcp").read_bytes() == data
    assert "job/step_4/__1_0.distcp" in keys(s3, bucket)


def test_a_part_that_can_never_complete_is_abandoned_once_a_newer_group_is_committed(tmp_path: Path, s3: SeaweedS3,
                                                                                    bucket: str) -> None:
    """--node-part, --keep-last 1: step_1 holds only rank 1's shard (its job died), step_2 is a
    whole DCP save.  Once step_2 is committed remotely, step_1 is no longer pinned: retention
    removes it and the uploader stops waiting for it."""
    d = tmp_path / "node"
    (d / "step_1").mkdir(parents=True)
    url = f"s3://{bucket}/job"
    with mirror_mount(d, s3, url, "--mirror-node", "n0", "--node-part", "--idle-seal", "1", "--keep-last", "1"):
        (d / "step_1" / "__1_0.distcp").write_bytes(os.urandom(MiB))
        wait_state(d / "step_1", "waiting for other nodes", timeout=30)
        code = ("import torch, torch.distributed.checkpoint as dcp; "
                f"dcp.save({{'w': torch.arange(1000.0)}}, checkpoint_id={str(d / 'step_2')!r})")
        subprocess.run([sys.executable, "-c", code], check=True, env=child_env(), timeout=120, capture_output=True)
        wait_state(d / "step_2", timeout=30)
        deadline = time.monotonic() + 20
        while (d / "step_1").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not (d / "step_1").exists()
        assert json.loads(os.getxattr(d, "user.ckptfs.mirror"))["pinned_groups"] == 0
    ks = keys(s3, bucket)
    assert "job/step_2/.ckptfs/COMMIT" in ks and "job/step_1/.ckptfs/COMMIT" not in ks


# ------------------------------------------------------------------ errors
def test_bad_mirror_options_and_restores_get_one_line_errors(tmp_path: Path, s3: SeaweedS3, bucket: str) -> None:
    d = tmp_path / "m"
    d.mkdir()
    r = cli("mount", str(d), "--node-part")
    assert r.returncode == 2 and "need --mirror" in r.stderr, r.stderr
    r = cli("mount", str(d), "--mirror", "http://x/y")
    assert r.returncode == 2 and "s3://BUCKET/PREFIX" in r.stderr, r.stderr
    r = cli("mount", str(d), "--mirror", "s3://ab/x")
    assert r.returncode == 2 and "bucket name" in r.stderr, r.stderr
    r = cli("restore", f"s3://{bucket}/nothing", str(d), env=s3.env())
    assert r.returncode == 1 and "no committed group" in r.stderr, r.stderr
    r = cli("restore", f"s3://{bucket}/nothing", str(tmp_path / "missing"), env=s3.env())
    assert r.returncode == 2 and "no such directory" in r.stderr, r.stderr
    r = cli("verify", f"s3://{bucket}/nothing", env=s3.env())
    assert r.returncode == 1 and "no committed group" in r.stdout, r.stdout
    for rr in (r,):
        assert "Traceback" not in rr.stderr


def test_the_upload_journal_never_reuses_another_seals_state(tmp_path: Path) -> None:
    """U3 (no mount): state journaled for one manifest digest is not loaded for another."""
    from ckptfs.backing import OsBackingStore
    from ckptfs.mirror.journal import UploadState

    store = OsBackingStore(str(tmp_path))
    (tmp_path / ".ckptfs").mkdir()
    st = UploadState(store, "g/step_1", "digest-a")
    st.file("model.pt").update(upload_id="U1", parts={1: '"e1"'})
    st.save()
    again = UploadState.load(store, "g/step_1", "digest-a")
    assert again.files["model.pt"]["upload_id"] == "U1" and again.files["model.pt"]["parts"] == {1: '"e1"'}
    assert UploadState.load(store, "g/step_1", "digest-b").files == {}
    assert UploadState.load(store, "g/step_2", "digest-a").files == {}
    store.shutdown()


@pytest.mark.parametrize("attack", ["dotdot", "absolute", "dir-and-file", "huge", "linked-group"])
def test_a_tampered_store_cannot_make_restore_write_outside_its_target(tmp_path: Path, s3: SeaweedS3,
                                                                       bucket: str, attack: str) -> None:
    """Issue 26: a MANIFEST (with a COMMIT naming it, so the digests agree) whose names leave the
    target (``../``, absolute), name one path as a file and a directory, or claim 10^15 bytes; and a
    group directory that is a symbolic link (``--replace``).  Each restore (new directory, --replace,
    into a mount) and ``verify s3://`` ends in one line and a non-zero exit; nothing outside the target
    is created or changed, nothing in the target truncated."""
    d = tmp_path / "ckpts"
    d.mkdir()
    url = f"s3://{bucket}/p"
    with mirror_mount(d, s3, url):
        save_group(d / "step_3", big_mib=1)
        wait_state(d / "step_3")
    victim = tmp_path / "victim.txt"
    victim.write_text("not yours")
    c = s3.client()
    if attack != "linked-group":
        commit = json.loads(c.get_object(Bucket=bucket, Key="p/step_3/.ckptfs/COMMIT")["Body"].read())
        manifest = json.loads(c.get_object(Bucket=bucket, Key="p/step_3/.ckptfs/MANIFEST")["Body"].read())
        files, objects = manifest["files"], commit["objects"]
        if attack == "dotdot":
            files["../../victim.txt"], objects["../../victim.txt"] = files.pop("model.pt"), objects.pop("model.pt")
        elif attack == "absolute":
            files[str(victim)], objects[str(victim)] = files.pop("model.pt"), objects.pop("model.pt")
        elif attack == "dir-and-file":
            files["model.pt/x"], objects["model.pt/x"] = dict(files["optimizer.pt"]), dict(objects["optimizer.pt"])
        else:
            files["model.pt"]["size"] = 10**15
        body = json.dumps(manifest).encode()
        commit["manifest_blake3"] = blake3.blake3(body).hexdigest()
        c.put_object(Bucket=bucket, Key="p/step_3/.ckptfs/MANIFEST", Body=body)
        c.put_object(Bucket=bucket, Key="p/step_3/.ckptfs/COMMIT", Body=json.dumps(commit).encode())
    before = sorted(os.listdir(tmp_path))
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    replace = tmp_path / "replace"
    replace.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "model.pt").write_bytes(b"keep me")
    if attack == "linked-group":
        (replace / "step_3").symlink_to(elsewhere)
    else:
        (replace / "step_3").mkdir()
        (replace / "step_3" / "model.pt").write_bytes(b"keep me too")
    runs = [("restore", url, str(replace), "--replace")]
    if attack != "linked-group":
        runs += [("restore", url, str(fresh)), ("verify", url)]
    for args in runs:
        r = cli(*args, env=s3.env())
        assert r.returncode != 0, (args, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr, r.stderr
    assert victim.read_text() == "not yours"
    assert (elsewhere / "model.pt").read_bytes() == b"keep me" and os.listdir(elsewhere) == ["model.pt"]
    if attack != "linked-group":
        assert (replace / "step_3" / "model.pt").read_bytes() == b"keep me too"
        assert not (fresh / "step_3").exists()
    assert sorted(os.listdir(tmp_path)) == sorted([*before, "fresh", "replace", "elsewhere"])
    assert not Path(str(victim) + ".bak").exists() and not Path("/victim.txt").exists()
