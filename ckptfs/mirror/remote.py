"""The object store, as the mirror uses it: an S3-compatible bucket under a prefix (boto3).

Every call the mirror and ``ckptfs restore``/``verify`` make to the store goes through
:class:`Remote`, so the S3 dialect lives in one place:

* credentials and endpoint come from boto3's standard chain: ``AWS_ENDPOINT_URL``,
  ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``, ``~/.aws`` (as every S3 tool);
* boto3 computes no checksums of its own (``request_checksum_calculation="when_required"``: its
  defaults break some stores); the mirror sends explicit CRC64-NVME checksums, per part and for
  the whole object (``FULL_OBJECT``), so the store rejects a corrupted upload (``BadDigest``);
* conditional writes: ``If-None-Match: *`` on PutObject and CompleteMultipartUpload, a 412 is
  :class:`PreconditionFailed`;
* :meth:`Remote.probe`: a store that ignores ``If-None-Match`` (SeaweedFS <= 3.96) or lets
  concurrent writers all win cannot host a COMMIT that is published exactly once: refused.

Invariant: an object is only ever written with the checksum of the bytes the caller verified.
"""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass
from typing import Any

from awscrt import checksums

CHECKSUM = "CRC64NVME"  # full-object checksum algorithm (needs awscrt, which boto3[crt] uses too)


class RemoteError(Exception):
    """A store request failed (network, permissions, a missing bucket): one line saying which."""


class PreconditionFailed(RemoteError):
    """A conditional write lost: the object already exists (412)."""


class MirrorRefused(RemoteError):
    """The store cannot be mirrored to safely (it ignores conditional writes)."""


@dataclass(frozen=True)
class Location:
    """``s3://BUCKET/PREFIX``: where a mirror lives."""

    bucket: str
    prefix: str  # no leading or trailing "/"; may be ""

    def key(self, rel: str) -> str:
        rel = rel.strip("/")
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def rel(self, key: str) -> str:
        """The mount-relative path of object ``key`` (the inverse of :meth:`key`)."""
        return key[len(self.prefix) + 1:] if self.prefix else key

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"


def parse_url(url: str) -> Location:
    """``s3://BUCKET[/PREFIX]`` -> :class:`Location`; ValueError with a one-line reason otherwise."""
    if not url.startswith("s3://"):
        raise ValueError(f"{url!r}: a mirror is an s3://BUCKET/PREFIX URL")
    bucket, _, prefix = url[5:].partition("/")
    if not 3 <= len(bucket) <= 63 or not all(c.isalnum() or c in "-." for c in bucket) or not bucket[0].isalnum():
        raise ValueError(f"{url!r}: bucket name {bucket!r} is not valid (3-63 lowercase letters, digits, '-', '.')")
    prefix = prefix.strip("/")
    if any(p in ("", ".", "..") for p in prefix.split("/")) and prefix:
        raise ValueError(f"{url!r}: prefix {prefix!r} has an empty, '.' or '..' component")
    return Location(bucket, prefix)


def crc(data: bytes | memoryview, previous: int = 0) -> int:
    """CRC64-NVME of ``data`` continuing ``previous`` (0 to start)."""
    return checksums.crc64nvme(data, previous)


def crc_b64(value: int) -> str:
    """A CRC64-NVME as S3 headers carry it (base64 of 8 big-endian bytes)."""
    return base64.b64encode(value.to_bytes(8, "big")).decode()


def _code(e: Exception) -> str:
    resp = getattr(e, "response", None) or {}
    return str(resp.get("Error", {}).get("Code", "")) or str(resp.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))


def make_client(endpoint: str | None = None, connect_timeout: float = 5, read_timeout: float = 60,
                attempts: int = 3) -> Any:
    """A boto3 S3 client from the standard environment (and ``~/.aws``)."""
    import boto3
    from botocore.config import Config

    cfg = Config(request_checksum_calculation="when_required", response_checksum_validation="when_required",
                 retries={"max_attempts": attempts, "mode": "standard"}, connect_timeout=connect_timeout,
                 read_timeout=read_timeout, max_pool_connections=32, s3={"addressing_style": "path"})
    return boto3.session.Session().client("s3", endpoint_url=endpoint, config=cfg)


class Remote:
    """One bucket+prefix.  Keys given to methods are mount-relative paths (``step-10/model.pt``)."""

    def __init__(self, loc: Location, client: Any = None) -> None:
        self.loc = loc
        self.client = client if client is not None else make_client()

    def _call(self, what: str, fn: Any, **kw: Any) -> Any:
        try:
            return fn(Bucket=self.loc.bucket, **kw)
        except Exception as e:
            code = _code(e)
            if code in ("PreconditionFailed", "412"):
                raise PreconditionFailed(f"{what}: exists") from None
            if code in ("NoSuchKey", "404", "NotFound", "NoSuchUpload"):
                raise FileNotFoundError(f"{what}: {code}") from None
            raise RemoteError(f"{what}: {e}") from None

    # ---------------------------------------------------------------- objects
    def put(self, rel: str, data: bytes | memoryview, if_absent: bool = False, checksum: int | None = None) -> str:
        """PutObject with its CRC64-NVME (computed here unless given); returns the ETag."""
        kw: dict[str, Any] = {"Key": self.loc.key(rel), "Body": bytes(data),
                              "ChecksumCRC64NVME": crc_b64(crc(data) if checksum is None else checksum)}
        if if_absent:
            kw["IfNoneMatch"] = "*"
        return str(self._call(f"put {rel}", self.client.put_object, **kw)["ETag"])

    def head(self, rel: str) -> dict[str, Any] | None:
        """Size, ETag and checksum of an object; None if it does not exist."""
        try:
            r = self._call(f"head {rel}", self.client.head_object, Key=self.loc.key(rel), ChecksumMode="ENABLED")
        except FileNotFoundError:
            return None
        return {"size": int(r["ContentLength"]), "etag": str(r.get("ETag", "")),
                "checksum": r.get("ChecksumCRC64NVME") or ""}

    def get(self, rel: str, start: int | None = None, end: int | None = None) -> bytes:
        """An object's bytes (``[start, end)`` if given); FileNotFoundError if it does not exist."""
        kw: dict[str, Any] = {"Key": self.loc.key(rel)}
        if start is not None and end is not None:
            if end <= start:
                return b""
            kw["Range"] = f"bytes={start}-{end - 1}"
        r = self._call(f"get {rel}", self.client.get_object, **kw)
        try:
            return r["Body"].read()
        except Exception as e:
            raise RemoteError(f"get {rel}: {e}") from None

    def delete(self, rel: str) -> None:
        self._call(f"delete {rel}", self.client.delete_object, Key=self.loc.key(rel))

    def list(self, rel_prefix: str = "", delimiter: str = "") -> tuple[list[dict[str, Any]], list[str]]:
        """Objects (rel, size) under ``rel_prefix``, and with a delimiter the sub-prefixes (rel)."""
        objs: list[dict[str, Any]] = []
        subs: list[str] = []
        pfx = self.loc.key(rel_prefix) if rel_prefix else (self.loc.prefix + "/" if self.loc.prefix else "")
        if rel_prefix.endswith("/") and not pfx.endswith("/"):
            pfx += "/"
        kw: dict[str, Any] = {"Prefix": pfx}
        if delimiter:
            kw["Delimiter"] = delimiter
        while True:
            r = self._call(f"list {rel_prefix or '/'}", self.client.list_objects_v2, **kw)
            objs += [{"rel": self.loc.rel(o["Key"]), "size": int(o["Size"])} for o in r.get("Contents", [])]
            subs += [self.loc.rel(p["Prefix"].rstrip("/")) for p in r.get("CommonPrefixes", [])]
            if not r.get("IsTruncated"):
                return objs, subs
            kw["ContinuationToken"] = r["NextContinuationToken"]

    # ---------------------------------------------------------------- multipart
    def create_upload(self, rel: str) -> str:
        r = self._call(f"create upload {rel}", self.client.create_multipart_upload, Key=self.loc.key(rel),
                       ChecksumAlgorithm=CHECKSUM, ChecksumType="FULL_OBJECT")
        return str(r["UploadId"])

    def upload_part(self, rel: str, upload_id: str, number: int, data: bytes | memoryview, checksum: int) -> str:
        r = self._call(f"upload part {number} of {rel}", self.client.upload_part, Key=self.loc.key(rel),
                       UploadId=upload_id, PartNumber=number, Body=bytes(data), ChecksumCRC64NVME=crc_b64(checksum))
        return str(r["ETag"])

    def list_parts(self, rel: str, upload_id: str) -> dict[int, dict[str, Any]]:
        """The parts the store holds for an upload: number -> (etag, size); FileNotFoundError if it is gone."""
        out: dict[int, dict[str, Any]] = {}
        kw: dict[str, Any] = {"Key": self.loc.key(rel), "UploadId": upload_id}
        while True:
            r = self._call(f"list parts of {rel}", self.client.list_parts, **kw)
            for p in r.get("Parts", []):
                out[int(p["PartNumber"])] = {"etag": str(p["ETag"]), "size": int(p["Size"])}
            if not r.get("IsTruncated"):
                return out
            kw["PartNumberMarker"] = r["NextPartNumberMarker"]

    def complete_upload(self, rel: str, upload_id: str, parts: dict[int, str], whole: int,
                        part_checksums: dict[int, int], if_absent: bool = True) -> str:
        mp = {"Parts": [{"PartNumber": n, "ETag": parts[n], "ChecksumCRC64NVME": crc_b64(part_checksums[n])}
                        for n in sorted(parts)]}
        kw: dict[str, Any] = {"Key": self.loc.key(rel), "UploadId": upload_id, "MultipartUpload": mp,
                              "ChecksumType": "FULL_OBJECT", "ChecksumCRC64NVME": crc_b64(whole)}
        if if_absent:
            kw["IfNoneMatch"] = "*"
        return str(self._call(f"complete upload of {rel}", self.client.complete_multipart_upload, **kw)["ETag"])

    def abort_upload(self, rel: str, upload_id: str) -> None:
        try:
            self._call(f"abort upload of {rel}", self.client.abort_multipart_upload, Key=self.loc.key(rel),
                       UploadId=upload_id)
        except FileNotFoundError:
            pass

    def uploads(self, rel_prefix: str = "") -> list[tuple[str, str]]:
        """Unfinished multipart uploads under ``rel_prefix``: (rel, upload id)."""
        out: list[tuple[str, str]] = []
        pfx = self.loc.key(rel_prefix) if rel_prefix else (self.loc.prefix + "/" if self.loc.prefix else "")
        kw: dict[str, Any] = {"Prefix": pfx}
        while True:
            r = self._call("list uploads", self.client.list_multipart_uploads, **kw)
            out += [(self.loc.rel(u["Key"]), str(u["UploadId"])) for u in r.get("Uploads", [])]
            if not r.get("IsTruncated"):
                return out
            kw["KeyMarker"], kw["UploadIdMarker"] = r.get("NextKeyMarker"), r.get("NextUploadIdMarker")

    # ---------------------------------------------------------------- startup
    def probe(self) -> None:
        """Put one probe key twice with ``If-None-Match: *``: the second must fail (412).  Raises
        :class:`MirrorRefused` if it succeeds, :class:`RemoteError` if the store is unreachable."""
        rel = f".ckptfs-probe/{uuid.uuid4().hex}"
        self.put(rel, b"1", if_absent=True)
        try:
            self.put(rel, b"2", if_absent=True)
        except PreconditionFailed:
            return
        finally:
            try:
                self.delete(rel)
            except RemoteError:
                pass
        raise MirrorRefused(f"{self.loc.url}: the store accepted a second conditional put of one key "
                            "(it ignores If-None-Match): a COMMIT could be published twice; refusing to mirror "
                            "(SeaweedFS <= 3.96 does this; use >= 4.48 or another store)")
