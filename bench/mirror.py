"""The mirror's speed against the raw store, in one run on one fresh SeaweedFS server (loopback).

    python -m bench.mirror [--gib 1] [--out F]

Measures, in this order (ratios within the run; the store slows as it fills):

* raw PUT: 8 threads of 16 MiB ``put_object`` (``raw_put_mib_s``; again right before each
  mirrored upload, whose ratio uses that one), and raw GET of those objects
  with 8 threads (``raw_get_mib_s``);
* W2 (one file of ``--gib`` GiB) and W3 (64 shards of 16 MiB) saved through a mount without and
  with ``--mirror`` (in alternating order): local save time (close of the last file, marker
  included) of each, alone and while the previous save uploads (two more saves back to back), and
  with the mirror the seal-to-remote-COMMIT time (``user.ckptfs.mirror`` turns ``committed``), the
  mirror's upload throughput (bytes / (commit time - seal time)), and its ratio to raw PUT;
* the local disk's durable sequential write rate (dd + fdatasync): a restore writes durably, so its
  bound is min(raw GET, disk);
* restore of each group into a fresh directory (``ckptfs restore``: streamed) and again over that
  copy (``--replace``: everything downloaded and verified first), against raw GET.

``--store-dir /dev/shm`` keeps the store's data off the checkpoint disk (a remote store does not
share it); ``--only W3`` runs one workload.

Targets (issue 14): upload >= 80 % of raw PUT; seal-to-COMMIT p50 <= 1.25 x bytes/raw + 1 s;
mirroring adds <= 5 % to local save time; restore >= 70 % of raw GET.  Results:
docs/results/mirror.md.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.workloads import raw_disk
from ckptfs_testing.mount import Mount, child_env
from ckptfs_testing.s3server import SeaweedS3

MiB = 1 << 20


def raw(s3: SeaweedS3, bucket: str, total: int) -> tuple[float, float]:
    c = s3.client()
    data = os.urandom(16 * MiB)
    n = total // (16 * MiB)
    t = time.perf_counter()
    with cf.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: c.put_object(Bucket=bucket, Key=f"raw/{i}", Body=data), range(n)))
    put = n * 16 * MiB / MiB / (time.perf_counter() - t)
    t = time.perf_counter()
    with cf.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: c.get_object(Bucket=bucket, Key=f"raw/{i}")["Body"].read(), range(n)))
    get = n * 16 * MiB / MiB / (time.perf_counter() - t)
    for i in range(n):
        c.delete_object(Bucket=bucket, Key=f"raw/{i}")
    return put, get


def save(g: Path, files: list[tuple[str, int]], buf: bytes) -> float:
    """Write the files (fsync each, as torch.save + a careful trainer), then the COMMIT marker."""
    g.mkdir(parents=True)
    t = time.perf_counter()
    for name, size in files:
        with open(g / name, "wb") as f:
            left = size
            while left:
                n = min(left, len(buf))
                f.write(buf[:n])
                left -= n
            f.flush()
            os.fsync(f.fileno())
    (g / "COMMIT").write_bytes(b"done")
    return time.perf_counter() - t


def wait_committed(g: Path, timeout: float = 900) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if os.getxattr(g, "user.ckptfs.mirror") == b"committed":
                return time.perf_counter()
        except OSError:
            pass
        time.sleep(0.02)
    raise TimeoutError(f"{g} not committed remotely in {timeout}s")


def run(gib: float, reps: int, store_nice: int = 19, store_dir: str = "", only: tuple[str, ...] = ()) -> dict:
    out: dict = {"gib": gib, "reps": reps, "store_nice": store_nice, "store_dir": store_dir or "(a temp dir)",
                 "uploader_nice": int(os.environ.get("CKPTFS_MIRROR_NICE", "10"))}
    buf = os.urandom(64 * MiB)
    workloads = {"W2": [("model.pt", int(gib * (1 << 30)))],
                 "W3": [(f"shard_{i:02d}.pt", 16 * MiB) for i in range(64)]}
    workloads = {w: f for w, f in workloads.items() if not only or w in only}
    store_tmp = tempfile.TemporaryDirectory(prefix="ckptfs-bench-s3-", dir=store_dir) if store_dir else None
    with (SeaweedS3(data_dir=Path(store_tmp.name) if store_tmp else None, nice=store_nice) as s3,
          tempfile.TemporaryDirectory(prefix="ckptfs-bench-mirror-", dir="/var/tmp") as tmp):
        bucket = s3.make_bucket("bench")
        put, get = raw(s3, bucket, int(gib * (1 << 30)))
        out["raw_put_mib_s"], out["raw_get_mib_s"] = round(put, 1), round(get, 1)
        # a restore writes durably to the local disk: its bound is the slower of GET and this
        disk = raw_disk(Path(tmp), int(gib * 1024)).get("dd_fdatasync_MBps", 0.0) * 1e6 / MiB
        out["disk_durable_write_mib_s"] = round(disk, 1)
        bound = min(get, disk) if disk else get
        for w, files in workloads.items():
            nbytes = sum(s for _, s in files)
            for rep in range(reps):
                res: dict = {}
                rp, _ = raw(s3, bucket, nbytes)  # the store slows as it fills: raw PUT again, right before
                res["raw_put_mib_s"] = rp
                for mode in (("local", "mirror") if rep % 2 == 0 else ("mirror", "local")):  # interleaved
                    d = Path(tmp) / f"{w}-{rep}-{mode}"
                    d.mkdir()
                    extra = ["--mirror", f"s3://bench/{w}-{rep}"] if mode == "mirror" else []
                    with Mount(d, env=s3.env(), extra_args=extra):
                        t0 = time.perf_counter()
                        res[f"{mode}_save_s"] = save(d / "step_1", files, buf)
                        if mode == "mirror":
                            t_commit = wait_committed(d / "step_1")
                            res["seal_to_commit_s"] = t_commit - (t0 + res["mirror_save_s"])
                        # the next two saves back to back: the second one runs while the first uploads
                        save(d / "step_2", files, buf)
                        res[f"{mode}_save_during_upload_s"] = save(d / "step_3", files, buf)
                        if mode == "mirror":
                            wait_committed(d / "step_3")
                            res["upload_mib_s"] = nbytes / MiB / res["seal_to_commit_s"]
                            res["upload_vs_raw_put"] = res["upload_mib_s"] / rp
                            res["target_commit_s"] = 1.25 * nbytes / MiB / rp + 1
                    dest = Path(tmp) / f"{w}-{rep}-restore"
                    dest_rm = str(dest)
                    if mode == "mirror":
                        dest.mkdir()
                        r = subprocess.run([sys.executable, "-m", "ckptfs", "restore", f"s3://bench/{w}-{rep}",
                                            str(dest), "--json"], capture_output=True, text=True,
                                           env=child_env(s3.env()), timeout=900)
                        rep_ = json.loads(r.stdout)
                        res["restore_mib_s"] = nbytes / MiB / rep_["seconds"]  # streamed (a new directory)
                        res["restore_vs_raw_get"] = res["restore_mib_s"] / get
                        res["restore_vs_bound"] = res["restore_mib_s"] / bound
                        r = subprocess.run([sys.executable, "-m", "ckptfs", "restore", f"s3://bench/{w}-{rep}",
                                            str(dest), "--replace", "--json"], capture_output=True, text=True,
                                           env=child_env(s3.env()), timeout=900)
                        rep_ = json.loads(r.stdout)  # over the copy: download and verify first, then install
                        res["restore_replace_mib_s"] = nbytes / MiB / rep_["seconds"]
                        res["restore_replace_vs_raw_get"] = res["restore_replace_mib_s"] / get
                        res["restore_replace_vs_bound"] = res["restore_replace_mib_s"] / bound
                    subprocess.run(["rm", "-rf", str(d), dest_rm], check=False)
                res["save_overhead"] = res["mirror_save_s"] / res["local_save_s"] - 1
                res["save_during_upload_overhead"] = (res["mirror_save_during_upload_s"]
                                                      / res["local_save_during_upload_s"] - 1)
                out.setdefault(w, []).append({k: round(v, 3) for k, v in res.items()})
                print(w, rep, json.dumps(out[w][-1]), flush=True)
    if store_tmp is not None:
        store_tmp.cleanup()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--store-nice", type=int, default=19,
                    help="run the S3 server at this nice value (default 19: it stands in for a remote store, "
                         "which costs the training machine no CPU; 0 to compete)")
    ap.add_argument("--store-dir", default="",
                    help="keep the store's data under this directory (e.g. /dev/shm: a store that does not share "
                         "the checkpoint disk, as a remote one does not)")
    ap.add_argument("--only", nargs="*", default=[], choices=["W2", "W3"], help="run only these workloads")
    ap.add_argument("--out")
    a = ap.parse_args()
    res = run(a.gib, a.reps, a.store_nice, a.store_dir, tuple(a.only))
    print(json.dumps(res, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
