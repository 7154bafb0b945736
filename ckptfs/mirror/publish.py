"""Publishing a group's COMMIT, and deleting remote groups: functions of what the store holds.

:func:`publish` can run on any node, any number of times, concurrently: it reads the parts under
``<group>/.ckptfs/parts/``, decides whether the group is complete (protocol.py M3), checks every
object's size and checksum, then writes the MANIFEST (identical bytes from every publisher, M2)
and the COMMIT with ``If-None-Match: *`` (it exists once).  :func:`delete_remote_group` deletes a
COMMIT before anything else of its group (M6).  ``ckptfs restore`` and ``verify`` read what these
write (restore.py).
"""

from __future__ import annotations

import logging
from typing import Any

import blake3

from ckptfs import crashpoints
from ckptfs.mirror import protocol as P
from ckptfs.mirror.remote import PreconditionFailed, Remote

log = logging.getLogger("ckptfs.mirror")


def remote_groups(remote: Remote, d: str) -> list[dict[str, Any]]:
    """The groups directly under remote directory ``d``: path and parsed COMMIT (None: not committed)."""
    _, subs = remote.list(d + "/" if d else "", delimiter="/")
    out = []
    for sub in subs:
        try:
            commit = P.parse(remote.get(P.commit_key(sub)), "ckptfs-remote-commit", P.commit_key(sub))
        except FileNotFoundError:
            objs, _ = remote.list(f"{sub}/{P.META}/", delimiter="")
            if not objs:
                continue  # not a group (an ordinary directory of files outside groups)
            commit = None
        except P.ProtocolError:
            commit = None
        out.append({"path": sub, "commit": commit})
    return out


def delete_remote_group(remote: Remote, path: str, committed: bool) -> None:
    """M6: COMMIT first, then MANIFEST, parts and data; then its unfinished uploads."""
    if committed:
        remote.delete(P.commit_key(path))
        crashpoints.hit("mirror_retention_commit_deleted")
    objs, _ = remote.list(path + "/")
    for i, o in enumerate(sorted(objs, key=lambda o: (o["rel"] != P.manifest_key(path), o["rel"]))):
        remote.delete(o["rel"])
        if i == 1:
            crashpoints.hit("mirror_retention_mid_delete")
    for rel, uid in remote.uploads(path + "/"):
        remote.abort_upload(rel, uid)
    log.info("mirror: remote retention deleted %s", path)


def publish(remote: Remote, path: str, node: str) -> str:
    """Publish group ``path``'s COMMIT if the group is complete remotely (M1-M3).  Once a COMMIT for
    the parts' MANIFEST exists: "won" (ours), "lost" (another publisher's, identical, was first) or
    "found" (there before we looked); "" while the group is incomplete."""
    from ckptfs.mirror.dcpmeta import NotDcpMetadata, referenced_files

    objs, _ = remote.list(P.parts_prefix(path))
    parts = []
    for o in objs:
        if o["rel"].endswith(".json"):
            try:
                parts.append(P.parse(remote.get(o["rel"]), "ckptfs-part", o["rel"]))
            except (FileNotFoundError, P.ProtocolError) as e:
                log.warning("mirror: ignoring part %s: %s", o["rel"], e)
    if not parts:
        return ""
    files, nodes = P.merge(parts)
    dcp_names = None
    if P.DCP_METADATA in files:
        data = remote.get(P.data_key(path, P.DCP_METADATA))
        if blake3.blake3(data).hexdigest() != files[P.DCP_METADATA]["blake3"]:
            return ""  # being replaced: the part that names the new one decides later
        try:
            dcp_names = referenced_files(data)
        except NotDcpMetadata as e:
            if not all(p.get("completes") for p in parts):
                log.warning("mirror: %s/.metadata unreadable (%s) and the group spans nodes: not publishing",
                            path, e)
                return False
            log.info("mirror: %s/.metadata is not DCP metadata (%s): the completing part decides", path, e)
    need = P.required_files(parts, dcp_names)
    if need is None or not need <= set(files):
        return ""
    steps = {p.get("step") for p in parts}
    step = steps.pop() if len(steps) == 1 else None
    objects: dict[str, dict[str, Any]] = {}
    for rel in sorted(files):  # M1: every object present, with the checksum its part recorded
        h = remote.head(P.data_key(path, rel))
        if h is None or h["size"] != files[rel]["size"] or h["checksum"] != files[rel]["checksum"]:
            log.warning("mirror: %s/%s missing or not as its part says: not publishing", path, rel)
            return ""
        objects[rel] = {"etag": h["etag"], "size": h["size"], "checksum": h["checksum"]}
    manifest = P.build_manifest(path, files, nodes, step)
    crashpoints.hit("mirror_before_manifest")
    try:
        remote.put(P.manifest_key(path), manifest, if_absent=True)
    except PreconditionFailed:
        if remote.get(P.manifest_key(path)) != manifest:  # another seal's (M2: ours would be identical)
            if remote.head(P.commit_key(path)) is not None:
                c = P.parse(remote.get(P.commit_key(path)), "ckptfs-remote-commit", path)
                if c.get("manifest_blake3") == blake3.blake3(manifest).hexdigest():
                    return "found"
                raise P.ProtocolError(f"{path}: the store holds a COMMIT of other content") from None
            remote.delete(P.manifest_key(path))
            remote.put(P.manifest_key(path), manifest, if_absent=True)
    crashpoints.hit("mirror_manifest_put")
    commit = P.build_commit(path, manifest, objects, node, step)
    how = "won"
    try:
        remote.put(P.commit_key(path), commit, if_absent=True)
        log.info("mirror: committed %s (%d files, %d nodes)", path, len(files), len(nodes))
    except PreconditionFailed:
        c = P.parse(remote.get(P.commit_key(path)), "ckptfs-remote-commit", path)
        if c.get("manifest_blake3") != blake3.blake3(manifest).hexdigest():
            raise P.ProtocolError(f"{path}: the store holds a COMMIT of other content") from None
        how = "lost"
    crashpoints.hit("mirror_commit_put")
    return how
