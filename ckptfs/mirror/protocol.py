"""The remote layout and the documents of the mirror's commit protocol (no I/O here).

Remote layout under ``s3://BUCKET/PREFIX`` (docs/mirror.md)::

    PREFIX/<group>/<file>                    the group's files, byte for byte
    PREFIX/<group>/.ckptfs/parts/<node>.json  what one node uploaded of the group (a *part*)
    PREFIX/<group>/.ckptfs/MANIFEST           the group's manifest: every file, blake3 per 1 MiB chunk
    PREFIX/<group>/.ckptfs/COMMIT             written last, If-None-Match: *; the commit point
    PREFIX/<file>                             a committed file outside any group (newest version)

(The protocol objects sit under ``.ckptfs/`` inside the group so that a file of the checkpoint
named ``COMMIT`` or ``MANIFEST``, completion markers some writers use, never collides with them.)

Invariants:

M1  A remote group exists iff its COMMIT exists; a COMMIT is written only after the MANIFEST it
    names (by blake3) and every object it lists were written and checked (size, checksum).
M2  The MANIFEST is a function of the parts alone (sorted JSON, no times, no ETags), so racing
    publishers write identical bytes; the COMMIT is written with If-None-Match and exists once.
M3  A group is complete when every file its completion record names is in some part: the files a
    DCP ``.metadata`` references, plus ``.metadata``; without one, the files of the part whose
    node sealed the group by a completion event (``completes``).  A part of an idle-sealed
    node-local group (``--node-part``) never completes a group alone.
"""

from __future__ import annotations

import json
import time
from typing import Any

import blake3

from ckptfs.layout import safe_rel

FORMAT = 1
META = ".ckptfs"  # protocol objects inside a group's prefix
DCP_METADATA = ".metadata"


def part_key(group: str, node: str) -> str:
    return f"{group}/{META}/parts/{node}.json"


def parts_prefix(group: str) -> str:
    return f"{group}/{META}/parts/"


def manifest_key(group: str) -> str:
    return f"{group}/{META}/MANIFEST"


def commit_key(group: str) -> str:
    return f"{group}/{META}/COMMIT"


def data_key(group: str, rel: str) -> str:
    return f"{group}/{rel}" if group else rel


def _dumps(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def file_entry(record: dict[str, Any], checksum: str) -> dict[str, Any]:
    """One file as parts and the MANIFEST describe it (from a local commit record)."""
    chunks = str(record["chunks"])
    return {"size": int(record["size"]), "blake3": str(record["blake3"]), "chunk_size": int(record.get(
        "chunk_size", 1 << 20)), "chunks": [chunks[i:i + 64] for i in range(0, len(chunks), 64)], "checksum": checksum}


def build_part(group: str, node: str, files: dict[str, dict[str, Any]], completes: bool, local_id: str,
               local_manifest: str, step: int | None) -> bytes:
    """A node's part: the files it uploaded of ``group`` (deterministic bytes for given content)."""
    return _dumps({"format": FORMAT, "kind": "ckptfs-part", "group": group, "node": node, "completes": completes,
                   "local_id": local_id, "local_manifest_blake3": local_manifest, "step": step, "files": files})


class ProtocolError(ValueError):
    """A remote document is not what the protocol writes (one line: which and why)."""


def parse(data: bytes, kind: str, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except ValueError:
        raise ProtocolError(f"{what}: not JSON") from None
    if not isinstance(doc, dict) or doc.get("kind") != kind or doc.get("format") != FORMAT:
        raise ProtocolError(f"{what}: not a {kind} (format {FORMAT})")
    return doc


def required_files(parts: list[dict[str, Any]], dcp_names: list[str] | None) -> set[str] | None:
    """M3: the files a complete group must hold, or None if no completion record is known yet."""
    if dcp_names is not None:
        return {*dcp_names, DCP_METADATA}
    done = [p for p in parts if p.get("completes")]
    if not done:
        return None
    return {rel for p in done for rel in p["files"]}


def merge(parts: list[dict[str, Any]]) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Every file of the parts (a file two nodes both hold must be identical); ProtocolError if not."""
    files: dict[str, dict[str, Any]] = {}
    for p in sorted(parts, key=lambda p: p["node"]):
        for rel, f in p["files"].items():
            if rel in files and (files[rel]["blake3"] != f["blake3"] or files[rel]["size"] != f["size"]):
                raise ProtocolError(f"{rel}: two nodes uploaded different contents")
            files[rel] = f
    return files, sorted(p["node"] for p in parts)


def build_manifest(group: str, files: dict[str, dict[str, Any]], nodes: list[str], step: int | None) -> bytes:
    """M2: the MANIFEST for these files (deterministic)."""
    return _dumps({"format": FORMAT, "kind": "ckptfs-remote-manifest", "group": group, "step": step,
                   "nodes": nodes, "files": {rel: files[rel] for rel in sorted(files)}})


def build_commit(group: str, manifest: bytes, objects: dict[str, dict[str, Any]], publisher: str,
                 step: int | None) -> bytes:
    """The COMMIT: the MANIFEST's blake3 and each object's ETag, size and checksum."""
    return _dumps({"format": FORMAT, "kind": "ckptfs-remote-commit", "group": group, "step": step,
                   "manifest_blake3": blake3.blake3(manifest).hexdigest(), "objects": objects,
                   "publisher": publisher, "committed_at": time.time()})


def check_commit(commit: dict[str, Any], manifest: bytes, group: str) -> dict[str, Any]:
    """The MANIFEST (parsed) if it is the one ``commit`` names; ProtocolError otherwise."""
    got = blake3.blake3(manifest).hexdigest()
    if commit.get("manifest_blake3") != got:
        raise ProtocolError(f"{group}: MANIFEST digest {got[:16]}... is not the COMMIT's "
                            f"{str(commit.get('manifest_blake3'))[:16]}...")
    doc = parse(manifest, "ckptfs-remote-manifest", f"{group}/{META}/MANIFEST")
    if set(doc["files"]) != set(commit.get("objects", {})):
        raise ProtocolError(f"{group}: COMMIT and MANIFEST list different files")
    check_names(group, doc)
    return doc


MAX_FILE_BYTES = 1 << 50  # 1 PiB: no MANIFEST size above it is believed
MAX_FILES = 1 << 20


def check_names(group: str, doc: dict[str, Any]) -> None:
    """A MANIFEST from the store may be hostile (issue 26: names with ``..`` or an absolute path
    restored outside the target, a size of 10^15 grew the process to 2.9 GB, ``x.bin`` and
    ``./x.bin`` both "restored" into one file): the group path and every name must stay inside
    the target (``layout.safe_rel``, no ``.ckptfs``), be unique, and every size and chunk size a
    bounded integer.  ProtocolError otherwise, before anything is written."""
    if not safe_rel(group):
        raise ProtocolError(f"group path {group!r} is not a relative path inside the target")
    files = doc.get("files")
    if not isinstance(files, dict) or len(files) > MAX_FILES:
        raise ProtocolError(f"{group}: MANIFEST has no bounded file table")
    seen: set[str] = set()
    for rel, f in files.items():
        if not safe_rel(rel):
            raise ProtocolError(f"{group}: MANIFEST names {rel!r}, not a relative path inside the group")
        seen.add(rel)  # (JSON keys are unique; a second spelling such as ./x.bin fails safe_rel)
        if not isinstance(f, dict):
            raise ProtocolError(f"{group}: MANIFEST entry of {rel!r} is not a record")
        size, cs = f.get("size"), f.get("chunk_size", 1 << 20)
        if (not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_FILE_BYTES
                or not isinstance(cs, int) or isinstance(cs, bool) or not 1 <= cs <= 1 << 31):
            raise ProtocolError(f"{group}: MANIFEST entry of {rel!r} has an invalid size or chunk size")
    for rel in files:  # a file may not also be a directory of another name
        parts = rel.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in seen:
                raise ProtocolError(f"{group}: MANIFEST names {'/'.join(parts[:i])!r} as a file and a directory")


def order(commit: dict[str, Any]) -> tuple[int, float]:
    """Which of two committed groups is newer: step, then commit time (as local retention)."""
    step = commit.get("step")
    return (step if isinstance(step, int) else -1, float(commit.get("committed_at", 0)))
