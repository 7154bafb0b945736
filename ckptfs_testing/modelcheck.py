"""Power-loss model checker (in the style of ALICE, OSDI'14).

A workload drives :class:`~ckptfs.fs.CkptFS` directly (the same logic the FUSE
daemon runs) over a :class:`RecordingStore`, which logs every mutating
backing-store call with its full arguments, plus markers the workload inserts:
``begin n`` (application operation n starts) and ``ack n`` (operations 1..n
were acknowledged: ``close()`` returned in sync mode, ``fsync()``/``fsyncdir()``
returned in async mode).

The log is replayed into :class:`Sim`, an in-memory model of a file system that
tracks, per inode, the durable ("synced") contents and the data operations
since the last ``fsync``, and per directory the entry mutations since the last
``fsync`` of that directory.  For every crash point k (after the k-th logged
operation) :func:`crash_states` enumerates the states a power loss may leave
under one of two persistence models:

``weak`` (POSIX-minimal)
    * File data persists only through ``fsync``/``fdatasync`` of that file.
      Unsynced data may be dropped entirely, persisted entirely, or partially:
      a prefix of the writes with the last one torn (its second half zeros or
      garbage, the file size already extended), or all writes but one whose
      range reads as zeros (size persisted before data).
    * A directory entry change (create, unlink, rename, mkdir, rmdir, symlink)
      persists only through ``fsync`` of that directory.  Until then every
      *name* independently holds its durable value or the value after any of
      its later changes; there is no order between names.
    * ``rename(src, dst)`` is two entry changes: dst may hold its old or its
      new target (the replacement of one entry is atomic), and src may or may
      not still exist, except that src is never gone while dst still lacks the
      new entry (a moved file may end up with two names, never with none; the
      order ext2 and BSD soft updates keep).  A directory reachable under two
      names is not a state any file system leaves behind and is skipped.
    * ``fsync`` of a file does not persist its directory entry.

``ext4`` (ext4 ``data=ordered``-like)
    * Metadata (all entry changes; a rename as one unit) persists in program
      order: the durable namespace is the state after a prefix of the entry
      changes that contains every change made before the last ``fsync``,
      ``fdatasync`` or directory ``fsync`` of *any* file (one running journal
      transaction, committed by every fsync).
    * File data persists through ``fsync``/``fdatasync`` of that file; unsynced
      data persists as a prefix of the writes, the last one possibly cut short
      (ordered mode: never zeros or garbage in an extended tail).

``weak-unordered`` (reported by ``scripts/modelcheck --extra``, not required)
    ``weak`` without the order between the two halves of a rename: a moved
    file may lose both names.  No rename-based protocol can keep an in-flight
    rename's file there; ckptfs's violations under it are documented.

Extended attributes of files are modelled (the install protocol carries each record in one,
``user.ckptfs.rec``): set by ``fsetxattr``, durable only by an ``fsync`` of that file (not
``fdatasync``); an unsynced one persists or not, in both models.  Not modelled: modes, times
(ckptfs keeps no state there); a rename over an existing file that leaves the destination *absent*.

For every state, :func:`check_workload` builds it in a scratch directory,
runs :func:`ckptfs.recovery.recover` on it, and asserts:

* recovery succeeds and leaves ``staging/`` empty;
* the visible tree (everything but ``.ckptfs``) equals the application-level
  state after a prefix of the operations: at least the acknowledged ones and
  at most the begun ones.  This covers "every path is at a committed version"
  (no torn or unknown content), ordering, and "nothing acknowledged is lost";
* the recovered records describe the visible files exactly (size, blake3)
  and every visible file has one;
* the workload's own invariants (e.g. a checkpoint group is whole or hidden);
* recovery is idempotent: running it again changes nothing; and for a sample
  of states, a power loss *during* recovery (same model, recovery's own
  operations recorded and replayed) followed by another recovery again
  satisfies all of the above.

Enumeration is exhaustive per crash point while the number of candidate
states is at most ``bound``; beyond, ``bound`` states are sampled (always
including "nothing unsynced persisted" and "everything persisted").  Identical
states are checked once per crash point and recovered once per workload.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import random
import shutil
import signal
import stat
import threading
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import blake3

from ckptfs import META_DIR
from ckptfs.backing import BackingStore, OsBackingStore
from ckptfs.engine.staged import Caller
from ckptfs.log.journal import STAGING, Journal

MODELS = ("weak", "ext4")
#: stricter-than-realistic models the full run also reports (violations expected, see docs)
EXTRA_MODELS = ("weak-unordered",)
INO_OFFSET = 1 << 40  # inode numbers not from the recording are shifted out of its range

#: backing calls that change state (logged with full arguments)
LOGGED = ("open", "close", "pwrite", "ftruncate", "fsync", "fdatasync", "copy_range", "mkdir", "rmdir",
          "unlink", "rename", "symlink", "link", "fsync_dir", "fsetxattr")


class SimError(Exception):
    """The simulator disagrees with the real file system (a checker bug)."""


# --------------------------------------------------------------------------- recording
class RecordingStore:
    """Forwards to ``inner``; logs every state-changing call in execution order.

    Log entries are tuples ``(op, *args)``; ``open``/``mkdir``/``symlink``
    carry the inode number of the result so recovery's inode checks can be
    replayed.  Markers are ``("mark", kind, n)``.  Calls are serialized by a
    lock, so the log order is the order the calls took effect.
    """

    bypassable = False  # every byte through this store (backing.BackingStore: no passthrough)

    def __init__(self, inner: BackingStore) -> None:
        self.inner = inner
        self.log: list[tuple] = []
        self.lock = threading.RLock()

    def mark(self, kind: str, n: int) -> None:
        with self.lock:
            self.log.append(("mark", kind, n))

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name not in LOGGED:
            return attr

        def call(*args: Any) -> Any:
            with self.lock:
                res = attr(*args)
                if name == "open":
                    self.log.append(("open", args[0], args[1], res, self.inner.fstat(res).st_ino))
                elif name == "pwrite":
                    self.log.append(("pwrite", args[0], bytes(args[1]), args[2]))
                elif name == "fsetxattr":
                    self.log.append(("fsetxattr", args[0], args[1], bytes(args[2])))
                elif name in ("mkdir", "symlink"):
                    self.log.append((name, *args[:2], self.inner.lstat(args[1 if name == "symlink" else 0]).st_ino))
                else:
                    self.log.append((name, *args))
                return res

        return call


class InoMapStore:
    """A store whose ``lstat``/``fstat`` report recorded inode numbers.

    Recovery compares a path's inode with the one in its install intent; a
    state rebuilt in a scratch directory has fresh inodes, so they are mapped
    back (``real -> recorded``); unknown inodes are shifted by ``INO_OFFSET``.
    """

    bypassable = False  # every byte through this store (backing.BackingStore: no passthrough)

    def __init__(self, inner: BackingStore, real_to_rec: dict[int, int]) -> None:
        self.inner = inner
        self.map = real_to_rec

    _FIELDS = tuple(k for k in dir(os.stat_result) if k.startswith("st_"))

    def _tr(self, st: os.stat_result) -> Any:
        ns = types.SimpleNamespace(**{k: getattr(st, k) for k in self._FIELDS if hasattr(st, k)})
        ns.st_ino = self.map.get(st.st_ino, st.st_ino + INO_OFFSET)
        return ns

    def lstat(self, path: str) -> Any:
        return self._tr(self.inner.lstat(path))

    def fstat(self, fd: int) -> Any:
        return self._tr(self.inner.fstat(fd))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


# --------------------------------------------------------------------------- simulator
@dataclass(eq=False)
class Inode:
    id: int
    kind: str  # "file" | "dir" | "symlink"
    ino: int = 0
    data: bytearray = field(default_factory=bytearray)  # current (volatile) content
    synced: bytes = b""  # durable content
    pending: list[tuple] = field(default_factory=list)  # ("w", off, bytes) | ("t", length) since last sync
    target: str = ""
    entries: dict[str, int] = field(default_factory=dict)  # current entries (dirs)
    muts: list[tuple[int, str, int | None]] = field(default_factory=list)  # (seq, name, inode id | None)
    synced_seq: int = 0  # dirs: changes with seq <= synced_seq are durable (weak model)
    xattrs: dict[str, bytes] = field(default_factory=dict)  # files: current extended attributes
    synced_xattrs: dict[str, bytes] = field(default_factory=dict)  # ... durable (by an fsync of the file)


def apply_data(base: bytes, ops: list[tuple]) -> bytes:
    buf = bytearray(base)
    for op in ops:
        if op[0] == "t":
            del buf[op[1]:]
            buf.extend(bytes(op[1] - len(buf)))
        else:
            _, off, data = op
            if off > len(buf):
                buf.extend(bytes(off - len(buf)))
            buf[off:off + len(data)] = data
    return bytes(buf)


class Sim:
    """In-memory file system replaying a :class:`RecordingStore` log.

    Invariant: after ``replay(log[:k])`` the volatile state equals the real
    backing directory after the first k calls (checked by :meth:`compare`).
    """

    def __init__(self, model: str) -> None:
        if model not in MODELS + EXTRA_MODELS:
            raise ValueError(model)
        self.model = model
        self.inodes: dict[int, Inode] = {}
        self.root = self._new("dir").id
        self.fds: dict[int, int] = {}
        self.seq = 0
        self.barrier = 0  # ext4: entry changes with seq <= barrier are durable
        self.weak = model.startswith("weak")
        # renames as (src dir, src name, dst dir, dst name, seq): the src removal
        # persists only with the dst entry (model "weak")
        self.renames: list[tuple[int, str, int, str, int]] = []

    def _new(self, kind: str, ino: int = 0) -> Inode:
        node = Inode(id=len(self.inodes), kind=kind, ino=ino)
        self.inodes[node.id] = node
        return node

    @classmethod
    def from_dir(cls, model: str, root: str, real_to_rec: dict[int, int]) -> Sim:
        """A simulator whose durable and volatile state is the tree at ``root``."""
        sim = cls(model)
        by_real: dict[int, int] = {}

        def walk(real: str, node: Inode) -> None:
            for name in sorted(os.listdir(real)):
                p = os.path.join(real, name)
                st = os.lstat(p)
                if st.st_ino in by_real:
                    child = sim.inodes[by_real[st.st_ino]]
                else:
                    kind = "dir" if stat.S_ISDIR(st.st_mode) else "symlink" if stat.S_ISLNK(st.st_mode) else "file"
                    child = sim._new(kind, real_to_rec.get(st.st_ino, st.st_ino + INO_OFFSET))
                    by_real[st.st_ino] = child.id
                    if kind == "file":
                        with open(p, "rb") as f:
                            child.synced = f.read()
                        child.data = bytearray(child.synced)
                        child.xattrs = {n: os.getxattr(p, n) for n in os.listxattr(p)}
                        child.synced_xattrs = dict(child.xattrs)
                    elif kind == "symlink":
                        child.target = os.readlink(p)
                    else:
                        walk(p, child)
                node.entries[name] = child.id
                node.muts.append((0, name, child.id))

        walk(root, sim.inodes[sim.root])
        return sim

    # -- path resolution (volatile namespace) --
    def _lookup(self, path: str) -> int:
        node = self.root
        for part in [p for p in path.split("/") if p not in ("", ".")]:
            d = self.inodes[node]
            if d.kind != "dir" or part not in d.entries:
                raise SimError(f"no such path {path!r}")
            node = d.entries[part]
        return node

    def _parent(self, path: str) -> tuple[Inode, str]:
        head, _, name = path.rpartition("/")
        d = self.inodes[self._lookup(head)]
        if d.kind != "dir":
            raise SimError(f"not a directory: {head!r}")
        return d, name

    def _set(self, d: Inode, name: str, target: int | None) -> None:
        if target is None:
            d.entries.pop(name, None)
        else:
            d.entries[name] = target
        d.muts.append((self.seq, name, target))

    # -- replay --
    def apply(self, e: tuple) -> None:
        op = e[0]
        if op == "mark":
            return
        if op == "open":
            _, path, flags, fd, ino = e
            d, name = self._parent(path)
            if name in d.entries:
                node = self.inodes[d.entries[name]]
                if flags & os.O_TRUNC and node.data:
                    node.data = bytearray()
                    node.pending.append(("t", 0))
            elif flags & os.O_CREAT:
                self.seq += 1
                node = self._new("file", ino)
                self._set(d, name, node.id)
            else:
                raise SimError(f"open of missing {path!r}")
            self.fds[fd] = node.id
        elif op == "close":
            self.fds.pop(e[1], None)
        elif op in ("pwrite", "ftruncate", "copy_range"):
            if op == "pwrite":
                node, w = self.inodes[self.fds[e[1]]], ("w", e[3], e[2])
            elif op == "ftruncate":
                node, w = self.inodes[self.fds[e[1]]], ("t", e[2])
            else:
                src = self.inodes[self.fds[e[1]]]
                node, w = self.inodes[self.fds[e[2]]], ("w", 0, bytes(src.data[: e[3]]))
            node.data = bytearray(apply_data(bytes(node.data), [w]))
            node.pending.append(w)
        elif op in ("fsync", "fdatasync"):
            node = self.inodes[self.fds[e[1]]]
            node.synced = bytes(node.data)
            node.pending = []
            if op == "fsync":  # (fdatasync need not persist an xattr: metadata not needed to read the data)
                node.synced_xattrs = dict(node.xattrs)
            self.barrier = self.seq
        elif op == "fsetxattr":
            self.inodes[self.fds[e[1]]].xattrs[e[2]] = e[3]
        elif op == "fsync_dir":
            self.inodes[self._lookup(e[1])].synced_seq = self.seq
            self.barrier = self.seq
        elif op in ("mkdir", "symlink"):
            path = e[1] if op == "mkdir" else e[2]
            d, name = self._parent(path)
            self.seq += 1
            node = self._new("dir" if op == "mkdir" else "symlink", e[-1])
            if op == "symlink":
                node.target = e[1]
            self._set(d, name, node.id)
        elif op in ("unlink", "rmdir"):
            d, name = self._parent(e[1])
            if name not in d.entries:
                raise SimError(f"{op} of missing {e[1]!r}")
            self.seq += 1
            self._set(d, name, None)
        elif op == "link":  # a second name for an inode (kept generations, generations.py)
            sd, sname = self._parent(e[1])
            dd, dname = self._parent(e[2])
            x = sd.entries.get(sname)
            if x is None:
                raise SimError(f"link of missing {e[1]!r}")
            if dname in dd.entries:
                raise SimError(f"link onto existing {e[2]!r}")
            self.seq += 1
            self._set(dd, dname, x)
        elif op == "rename":
            sd, sname = self._parent(e[1])
            dd, dname = self._parent(e[2])
            x = sd.entries.get(sname)
            if x is None:
                raise SimError(f"rename of missing {e[1]!r}")
            if dd.entries.get(dname) == x:
                return  # POSIX: both names already link the same inode, nothing happens
            self.seq += 1  # one seq: the ext4 model persists a rename as one unit
            self._set(dd, dname, x)
            self._set(sd, sname, None)
            self.renames.append((sd.id, sname, dd.id, dname, self.seq))
        else:
            raise SimError(f"unknown op {op}")

    # -- volatile view, for self-checks --
    def volatile_tree(self) -> dict[str, tuple]:
        out: dict[str, tuple] = {}

        def walk(node: Inode, pre: str) -> None:
            for name, cid in sorted(node.entries.items()):
                c = self.inodes[cid]
                p = pre + name
                if c.kind == "dir":
                    out[p] = ("d",)
                    walk(c, p + "/")
                elif c.kind == "symlink":
                    out[p] = ("l", c.target)
                else:
                    out[p] = ("f", bytes(c.data))

        walk(self.inodes[self.root], "")
        return out

    def compare(self, root: str) -> None:
        """Raise SimError unless the volatile state equals the real tree."""
        real = read_tree(root, skip_meta=False)
        mine = self.volatile_tree()
        if real != mine:
            diff = sorted(set(real.items()) ^ set(mine.items()))[:4]
            raise SimError(f"simulator diverged from the real directory: {[(p, v[0]) for p, v in diff]}")

    # -- crash states --
    def _entries_at(self, d: Inode, upto: int) -> dict[str, int]:
        ents: dict[str, int] = {}
        for seq, name, tgt in d.muts:
            if seq > upto:
                break
            if tgt is None:
                ents.pop(name, None)
            else:
                ents[name] = tgt
        return ents

    def ns_dims(self) -> tuple[dict[int, dict[str, int]], list[tuple[int, str, list[int | None]]],
                               list[tuple[int, int, int, int]]]:
        """Weak models: (durable base entries per dir, choices per pending name, constraints).

        Choice c of a name means "its first c pending changes persisted"
        (value ``vals[c]``).  A constraint (i, a, j, b) reads: if choice[i] >= a
        then choice[j] >= b (a rename's src removal needs its dst entry).
        """
        base: dict[int, dict[str, int]] = {}
        dims: list[tuple[int, str, list[int | None]]] = []
        where: dict[tuple[int, str, int], tuple[int, int]] = {}  # (dir, name, seq) -> (dim, choice)
        for d in self.inodes.values():
            if d.kind != "dir":
                continue
            upto = d.synced_seq if self.weak else self.barrier
            base[d.id] = self._entries_at(d, upto)
            if not self.weak:
                continue
            later: dict[str, list[tuple[int, int | None]]] = {}
            for seq, name, tgt in d.muts:
                if seq > upto:
                    later.setdefault(name, []).append((seq, tgt))
            for name, muts in later.items():
                for c, (seq, _) in enumerate(muts, 1):
                    where[(d.id, name, seq)] = (len(dims), c)
                dims.append((d.id, name, [base[d.id].get(name), *[t for _, t in muts]]))
        cons: list[tuple[int, int, int, int]] = []
        if self.model == "weak":
            for sdir, sname, ddir, dname, seq in self.renames:
                dst = where.get((ddir, dname, seq))
                if dst is None:
                    continue  # dst entry durable: nothing to order
                src = where.get((sdir, sname, seq))
                cons.append((*(src if src is not None else (dst[0], 0)), *dst))
        return base, dims, cons

    def ext4_cuts(self) -> list[int]:
        seqs = sorted({s for d in self.inodes.values() if d.kind == "dir" for s, _, _ in d.muts if s > self.barrier})
        return [self.barrier, *seqs]

    def data_variants(self, node: Inode, rng: random.Random) -> list[bytes]:
        """Contents a power loss may leave in ``node`` (first: nothing unsynced persisted)."""
        ops = node.pending
        if not ops:
            return [node.synced]
        n = len(ops)
        idx = sorted({0, n // 2, n - 1})
        out = [node.synced, apply_data(node.synced, ops)]
        for i in sorted({1, n // 2, n - 1}):
            if 0 < i < n:
                out.append(apply_data(node.synced, ops[:i]))
        for i in idx:
            op = ops[i]
            if op[0] != "w" or len(op[2]) < 2:
                continue
            _, off, data = op
            half = len(data) // 2
            pre = apply_data(node.synced, ops[:i])
            out.append(apply_data(pre, [("w", off, data[:half])]))  # cut short (ext4 too)
            if self.model == "weak":
                out.append(apply_data(pre, [("w", off, data[:half] + bytes(len(data) - half))]))
                garbage = random.Random(rng.random()).randbytes(len(data) - half)
                out.append(apply_data(pre, [("w", off, data[:half] + garbage)]))
                zeroed = ops[:i] + [("w", off, bytes(len(data)))] + ops[i + 1:]
                out.append(apply_data(node.synced, zeroed))
        return list(dict.fromkeys(out))


@dataclass
class CrashState:
    """A durable state: entries per reachable dir, content (and extended attributes) per reachable file."""

    entries: dict[int, dict[str, int]]
    contents: dict[int, bytes]
    xattrs: dict[int, dict[str, bytes]] = field(default_factory=dict)


def reachable(sim: Sim, entries: dict[int, dict[str, int]]) -> list[tuple[str, Inode]] | None:
    """(path, inode) in tree order; None if a directory is reachable twice."""
    out: list[tuple[str, Inode]] = []
    seen_dirs = {sim.root}

    def walk(did: int, pre: str) -> bool:
        for name, cid in sorted(entries.get(did, {}).items()):
            c = sim.inodes[cid]
            out.append((pre + name, c))
            if c.kind == "dir":
                if cid in seen_dirs:
                    return False
                seen_dirs.add(cid)
                if not walk(cid, pre + name + "/"):
                    return False
        return True

    return out if walk(sim.root, "") else None


def crash_states(sim: Sim, bound: int, rng: random.Random) -> tuple[list[CrashState], bool, int]:
    """States a power loss may leave now: (states, exhaustive?, skipped infeasible)."""
    base, dims, cons = sim.ns_dims()
    if sim.weak:
        ns_space = [len(v) for _, _, v in dims]
    else:
        cuts = sim.ext4_cuts()
        ns_space = [len(cuts)]
    variants_cache: dict[int, list[tuple[bytes, dict[str, bytes]]]] = {}

    def variants(node: Inode) -> list[tuple[bytes, dict[str, bytes]]]:
        """(content, xattrs) a power loss may leave: unsynced xattrs persisted or not (both models:
        only an fsync of the file is relied on), crossed with the data variants."""
        if node.id not in variants_cache:
            xs = [node.synced_xattrs] + ([node.xattrs] if node.xattrs != node.synced_xattrs else [])
            variants_cache[node.id] = [(d, x) for x in xs for d in sim.data_variants(node, rng)]
        return variants_cache[node.id]

    def state(ents: dict[int, dict[str, int]], picks: dict[int, tuple[bytes, dict[str, bytes]]]) -> CrashState:
        return CrashState(ents, {i: c for i, (c, _) in picks.items()}, {i: x for i, (_, x) in picks.items()})

    def namespace(choice: tuple[int, ...]) -> dict[int, dict[str, int]] | None:
        if sim.weak:
            if any(choice[i] >= a and choice[j] < b for i, a, j, b in cons):
                return None
            ents = {k: dict(v) for k, v in base.items()}
            for (did, name, vals), c in zip(dims, choice, strict=True):
                if vals[c] is None:
                    ents[did].pop(name, None)
                else:
                    ents[did][name] = vals[c]  # type: ignore[assignment]
            return ents
        upto = cuts[choice[0]]
        return {d.id: sim._entries_at(d, upto) for d in sim.inodes.values() if d.kind == "dir"}

    def files_of(ents: dict[int, dict[str, int]] | None) -> list[Inode] | None:
        if ents is None:
            return None
        tree = reachable(sim, ents)
        if tree is None:
            return None
        return list({n.id: n for _, n in tree if n.kind == "file"}.values())


    infeasible = 0
    ns_total = 1
    for s in ns_space:
        ns_total *= s
    if ns_total <= bound:
        combos: list[tuple[dict, list[Inode]]] = []
        total = 0
        for choice in itertools.product(*[range(s) for s in ns_space]):
            ents = namespace(choice)
            files = files_of(ents)
            if files is None:
                infeasible += 1
                continue
            n = 1
            for f in files:
                n *= len(variants(f))
            total += n
            combos.append((ents, files))
            if total > bound:
                break
        if total <= bound:
            out = []
            for ents, files in combos:
                for pick in itertools.product(*[variants(f) for f in files]):
                    out.append(state(ents, dict(zip([f.id for f in files], pick, strict=True))))
            return out, True, infeasible
    # sampled: the two extremes, then random choices
    out = []
    lo = tuple(0 for _ in ns_space)
    hi = tuple(s - 1 for s in ns_space)
    for choice, newest in ((lo, False), (hi, True)):
        ents = namespace(choice)
        files = files_of(ents)
        if files is not None:
            out.append(state(ents, {f.id: (bytes(f.data), f.xattrs) if newest else (f.synced, f.synced_xattrs)
                                    for f in files}))
    tries = 0
    while len(out) < bound and tries < 4 * bound:
        tries += 1
        ents = namespace(tuple(rng.randrange(s) for s in ns_space))
        files = files_of(ents)
        if files is None:
            infeasible += 1
            continue
        out.append(state(ents, {f.id: rng.choice(variants(f)) for f in files}))
    return out, False, infeasible


def state_key(sim: Sim, st: CrashState) -> bytes:
    h = hashlib.blake2b(digest_size=20)
    tree = reachable(sim, st.entries)
    assert tree is not None
    first: dict[int, str] = {}
    for path, node in tree:
        h.update(path.encode() + b"\0" + node.kind.encode())
        if node.kind == "file":
            h.update(b"=" + first.setdefault(node.id, path).encode() + b"\0")
            h.update(hashlib.blake2b(st.contents[node.id], digest_size=16).digest())
            for n, v in sorted(st.xattrs.get(node.id, {}).items()):
                h.update(b"x" + n.encode() + b"\0" + hashlib.blake2b(v, digest_size=16).digest())
        elif node.kind == "symlink":
            h.update(node.target.encode())
        h.update(b"\n")
    return h.digest()


def materialize(sim: Sim, st: CrashState, root: str) -> dict[int, int]:
    """Build ``st`` under ``root`` (emptied first); return real inode -> recorded inode."""
    if os.path.exists(root):
        shutil.rmtree(root)
    os.mkdir(root)
    tree = reachable(sim, st.entries)
    assert tree is not None
    first: dict[int, str] = {}
    inomap: dict[int, int] = {}
    for path, node in tree:
        p = os.path.join(root, path)
        if node.kind == "dir":
            os.mkdir(p)
        elif node.kind == "symlink":
            os.symlink(node.target, p)
        elif node.id in first:
            os.link(first[node.id], p)
        else:
            with open(p, "wb") as f:
                f.write(st.contents[node.id])
            for n, v in st.xattrs.get(node.id, {}).items():
                os.setxattr(p, n, v)  # (the scratch filesystem must keep user xattrs: tmpfs on Linux 6.6+)
            first[node.id] = p
        if node.kind != "symlink":
            inomap[os.lstat(p).st_ino] = node.ino
    return inomap


def read_tree(root: str, skip_meta: bool = True) -> dict[str, tuple]:
    """path -> ("d",) | ("l", target) | ("f", bytes) for everything under root."""
    out: dict[str, tuple] = {}

    def walk(real: str, pre: str) -> None:
        for name in sorted(os.listdir(real)):
            if skip_meta and not pre and name == META_DIR:
                continue
            p = os.path.join(real, name)
            st = os.lstat(p)
            if stat.S_ISDIR(st.st_mode):
                out[pre + name] = ("d",)
                walk(p, pre + name + "/")
            elif stat.S_ISLNK(st.st_mode):
                out[pre + name] = ("l", os.readlink(p))
            else:
                with open(p, "rb") as f:
                    out[pre + name] = ("f", f.read())

    walk(root, "")
    return out


def digest_tree(tree: dict[str, tuple]) -> dict[str, tuple]:
    """Replace file contents by their blake3 hex (the form records use)."""
    return {p: ("f", blake3.blake3(v[1]).hexdigest()) if v[0] == "f" else v for p, v in tree.items()}


# --------------------------------------------------------------------------- application model
@dataclass
class AppOps:
    """The application's operations in completion order and the states they lead to."""

    ops: list[tuple] = field(default_factory=list)

    def states(self) -> list[dict[str, tuple]]:
        """S_0 .. S_n: S_j is the visible tree after operations 1..j."""
        cur: dict[str, tuple] = {}
        out = [dict(cur)]
        for op in self.ops:
            kind = op[0]
            if kind == "write":  # data, or its blake3 hex
                cur[op[1]] = ("f", op[2] if isinstance(op[2], str) else blake3.blake3(op[2]).hexdigest())
            elif kind == "mkdir":
                cur[op[1]] = ("d",)
            elif kind in ("unlink", "rmdir"):
                cur.pop(op[1], None)
            elif kind == "symlink":
                cur[op[2]] = ("l", op[1])
            elif kind == "rename":
                src, dst = op[1], op[2]
                for k in [k for k in cur if k == dst or k.startswith(dst + "/")]:
                    del cur[k]
                for k in [k for k in cur if k == src or k.startswith(src + "/")]:
                    cur[dst + k[len(src):]] = cur.pop(k)
            out.append(dict(cur))
        return out


Invariant = Callable[[dict[str, tuple], dict[str, bytes]], list[str]]


@dataclass
class Workload:
    """A named application run plus its own invariants.

    ``run(driver)`` performs the operations through ``driver`` (which records
    them); ``invariants`` are called with the visible digest tree and the raw
    file contents of every recovered state and return violation messages.
    """

    name: str
    mode: str  # "sync" | "async"
    run: Callable[[Driver], None]
    invariants: list[Invariant] = field(default_factory=list)
    fs_factory: Callable[..., Any] | None = None  # a CkptFS (sub)class; None: the real one
    fs_kwargs: dict[str, Any] = field(default_factory=dict)  # extra CkptFS keywords (e.g. compact_every)


KILLED = Caller(0, 0, 1 << 30)  # a writer the driver reports as dying of SIGKILL when it closes


class Driver:
    """Drives CkptFS like an application and records begin/ack markers."""

    def __init__(self, fs: Any, rec: RecordingStore) -> None:
        self.fs = fs
        self.rec = rec
        self.app = AppOps()
        self.sync = fs.commit_mode == "sync"
        real = fs.exit_state
        fs.exit_state = lambda pid: (signal.SIGKILL, None) if pid == KILLED.pid else real(pid)

    def _begin(self, op: tuple) -> None:
        self.app.ops.append(op)
        self.rec.mark("begin", len(self.app.ops))

    def ack(self) -> None:
        """Every operation so far is acknowledged as durable."""
        self.rec.mark("ack", len(self.app.ops))

    def save(self, path: str, data: bytes, chunk: int = 16384, fsync: bool = False) -> None:
        """create/open(O_TRUNC), write in chunks, [fsync,] close."""
        self._begin(("write", path, data))
        fs = self.fs
        fh = fs.open(path, os.O_WRONLY | os.O_TRUNC) if fs._lexists(path) else fs.create(path, 0o644)
        try:
            for off in range(0, len(data), chunk):
                fs.write(fh, data[off:off + chunk], off)
            if fsync:
                fs.fsync(fh)
                self.ack()
            fs.flush(fh)
            if self.sync:
                self.ack()
        finally:
            fs.release(fh)

    def killed_writer(self, path: str, old: bytes, data: bytes, append: bool) -> None:
        """A writer killed by a signal after writing ``data`` to ``path`` (whose committed content
        is ``old``): appended (``O_APPEND``) or from empty (``O_TRUNC``); its files are closed by
        the dying process (a FUSE FLUSH with the signal pending).  By V2 (engine/visibility.py) an
        append to a file that is not a checkpoint file is committed, as natively; anything else
        leaves ``old``: then no application operation happened at all."""
        fs = self.fs
        kept = append and not fs.vis.checkpoint_file(path)
        if kept:
            self._begin(("write", path, old + data))
        fh = fs.open(path, os.O_WRONLY | (os.O_APPEND if append else os.O_TRUNC), KILLED)
        try:
            base = len(old) if append else 0
            for off in range(0, len(data), 4096):
                fs.write(fh, data[off:off + 4096], base + off, KILLED)
            try:
                fs.flush(fh, KILLED)
            except OSError:
                if kept:
                    raise
                # (a dying process never sees its close's error; the format checks refused it)
            if kept and self.sync:
                self.ack()
        finally:
            fs.release(fh, KILLED)

    def _ns(self, op: tuple, call: Callable[[], None]) -> None:
        self._begin(op)
        call()
        if self.sync:
            self.ack()

    def mkdir(self, path: str) -> None:
        self._ns(("mkdir", path), lambda: self.fs.mkdir(path, 0o755))

    def unlink(self, path: str) -> None:
        self._ns(("unlink", path), lambda: self.fs.unlink(path))

    def rmdir(self, path: str) -> None:
        self._ns(("rmdir", path), lambda: self.fs.rmdir(path))

    def rename(self, src: str, dst: str) -> None:
        self._ns(("rename", src, dst), lambda: self.fs.rename(src, dst))

    def fsyncdir(self, path: str = "") -> None:
        self.fs.fsyncdir(path)
        self.ack()


# --------------------------------------------------------------------------- checking
@dataclass
class Recovered:
    """Outcome of recovering one state (independent of the crash point)."""

    visible: dict[str, tuple]  # digest tree
    contents: dict[str, bytes]
    problems: list[str]  # crash-point-independent violations


@dataclass
class ModelResult:
    workload: str
    model: str
    mode: str
    crash_points: int = 0
    states_checked: int = 0  # distinct (crash point, state) pairs
    distinct_states: int = 0  # distinct states recovered
    exhaustive_points: int = 0
    sampled_points: int = 0
    infeasible_skipped: int = 0
    recovery_crash_states: int = 0  # states checked after a crash during recovery
    violations: int = 0
    examples: list[str] = field(default_factory=list)

    def as_json(self) -> dict:
        return {k: v for k, v in self.__dict__.items()}


def recover_dir(root: str, inomap: dict[int, int], recorder: RecordingStore | None = None) -> list[str]:
    """Run ckptfs recovery on ``root``; return problems (empty if it succeeded)."""
    from ckptfs.recovery import recover

    os_store = OsBackingStore(root)
    store: Any = InoMapStore(os_store, inomap)
    if recorder is not None:
        recorder.inner = store
        store = recorder
    try:
        recover(store)
    except Exception as e:  # noqa: BLE001 - any failure of recovery is a finding
        return [f"recovery failed: {type(e).__name__}: {e}"]
    finally:
        os_store.shutdown()
    return []


def inspect(root: str, inomap: dict[int, int]) -> tuple[dict[str, tuple], dict[str, bytes], list[str], dict]:
    """(visible digest tree, contents, record problems, records) of a recovered directory."""
    problems: list[str] = []
    raw = read_tree(root)
    vis = digest_tree(raw)
    contents = {p: v[1] for p, v in raw.items() if v[0] == "f"}
    staging = os.path.join(root, STAGING)
    if os.path.isdir(staging) and os.listdir(staging):
        problems.append(f"staging not empty after recovery: {os.listdir(staging)}")
    os_store = OsBackingStore(root)
    try:
        js = Journal(InoMapStore(os_store, inomap)).load()
    except Exception as e:  # noqa: BLE001
        return vis, contents, [f"metadata unreadable after recovery: {e}"], {}
    finally:
        os_store.shutdown()
    if js.entries:
        problems.append(f"journal not empty after recovery ({len(js.entries)} entries)")
    problems += seal_problems(root, js.groups)
    for path, rec in js.files.items():
        v = vis.get(path)
        if v is None or v[0] != "f":
            problems.append(f"record for {path} but no file there")
        elif v[1] != rec.blake3 or len(contents[path]) != rec.size:
            problems.append(f"record of {path} does not describe its content")
    for path, v in vis.items():
        if v[0] == "f" and path not in js.files:
            problems.append(f"{path} has no record")
    return vis, contents, problems, {p: (r.size, r.blake3, r.chunks, r.generation, r.ino) for p, r in js.files.items()}


def seal_problems(root: str, groups: dict[str, dict]) -> list[str]:
    """Every sealed group's seal verifies with the digest its state holds (G1), and was not rebuilt
    from its files' own records (issue 25's path for seal records damaged by someone): a power loss
    alone must never take a seal (engine/groups.py G12)."""
    from ckptfs.engine.seals import SealError, read_seal

    out: list[str] = []
    os_store = OsBackingStore(root)
    try:
        for path, g in groups.items():
            if g.get("state") != "sealed" or not g.get("id"):
                continue
            try:
                manifest, digest = read_seal(os_store, g["id"])
            except SealError as e:
                out.append(f"sealed group {path}: {e}")
                continue
            if digest != g.get("manifest_blake3"):
                out.append(f"sealed group {path}: manifest {digest} is not the recorded {g.get('manifest_blake3')}")
            if str(manifest.get("lineage", {}).get("event", "")).startswith("recovery: seal records damaged"):
                out.append(f"sealed group {path}: its seal was lost and rebuilt from its files' records")
    finally:
        os_store.shutdown()
    return out


def record_workload(w: Workload, scratch: str) -> tuple[list[tuple], AppOps]:
    """Run ``w`` on an empty directory over a RecordingStore; check the simulator."""
    from ckptfs import fs as fsmod

    root = os.path.join(scratch, "rec")
    if os.path.exists(root):
        shutil.rmtree(root)
    os.mkdir(root)
    os_store = OsBackingStore(root)
    rec = RecordingStore(os_store)
    factory = w.fs_factory or fsmod.CkptFS
    try:
        fs = factory(rec, commit_mode=w.mode, **w.fs_kwargs)
        rec.mark("start", 0)
        drv = Driver(fs, rec)
        try:
            w.run(drv)
        finally:
            fs.shutdown()
    finally:
        os_store.shutdown()
    sim = Sim("weak")
    for e in rec.log:
        sim.apply(e)
    sim.compare(root)
    shutil.rmtree(root)
    return rec.log, drv.app


def changes_state(e: tuple) -> bool:
    """False for log entries after which the durable state cannot differ from before."""
    if e[0] in ("mark", "close"):
        return False
    return not (e[0] == "open" and not e[2] & (os.O_CREAT | os.O_TRUNC))


def crash_points(log: list[tuple]) -> Iterator[tuple[int, int, int]]:
    """(i, acked, begun) for a crash right after state-changing entry i (after the start mark).

    ``acked`` counts the acknowledgements that follow entry i before the next
    operation (the application may have seen them; the durable state is the
    same), ``begun`` only the operations begun before entry i.
    """
    acked = begun = 0
    started = False
    for i, e in enumerate(log):
        if e[0] == "mark":
            if e[1] == "begin":
                begun = max(begun, e[2])
            elif e[1] == "ack":
                acked = max(acked, e[2])
            elif e[1] == "start":
                started = True
            continue
        if not started or not changes_state(e):
            continue
        later = acked
        for f in log[i + 1:]:
            if f[0] != "mark":
                break
            if f[1] == "ack":
                later = max(later, f[2])
        yield i, later, begun


def check_workload(w: Workload, model: str, scratch: str, bound: int = 64, seed: int = 0,
                   recovery_crash_every: int = 8, max_examples: int = 5) -> ModelResult:
    """Record ``w``, enumerate its power-loss states under ``model`` and check each (see module doc)."""
    log, app = record_workload(w, scratch)
    return check_log(w, log, app, model, scratch, bound, seed, recovery_crash_every, max_examples)


def check_log(w: Workload, log: list[tuple], app: AppOps, model: str, scratch: str, bound: int = 64,
              seed: int = 0, recovery_crash_every: int = 8, max_examples: int = 5) -> ModelResult:
    """Check every crash point of a recorded ``log`` (``w`` supplies name, mode, invariants)."""
    rng = random.Random(seed)
    states = app.states()
    res = ModelResult(w.name, model, w.mode)
    cache: dict[bytes, Recovered] = {}
    work = os.path.join(scratch, "state")
    sim = Sim(model)
    applied = 0
    for i, acked, begun in crash_points(log):
        while applied <= i:
            sim.apply(log[applied])
            applied += 1
        res.crash_points += 1
        cstates, exhaustive, infeasible = crash_states(sim, bound, rng)
        res.infeasible_skipped += infeasible
        if exhaustive:
            res.exhaustive_points += 1
        else:
            res.sampled_points += 1
        seen: set[bytes] = set()
        for cs in cstates:
            key = state_key(sim, cs)
            if key in seen:
                continue
            seen.add(key)
            res.states_checked += 1
            r = cache.get(key)
            if r is None:
                res.distinct_states += 1
                r = _recover_state(sim, cs, work, w)
                cache[key] = r
                if recovery_crash_every > 0 and res.distinct_states % recovery_crash_every == 0:
                    r.problems.extend(_crash_recovery(sim, cs, work, model, rng, res, w, states, acked, begun))
            msgs = r.problems + judge(r.visible, states, acked, begun, model)
            if msgs:
                res.violations += 1
                if len(res.examples) < max_examples:
                    e = log[i]
                    res.examples.append(f"crash after log entry {i} ({e[0]} {e[1]!r}), acked {acked}, "
                                        f"begun {begun}: {'; '.join(msgs[:3])}")
    shutil.rmtree(work, ignore_errors=True)
    return res


def _recover_state(sim: Sim, cs: CrashState, work: str, w: Workload) -> Recovered:
    inomap = materialize(sim, cs, work)
    problems = recover_dir(work, inomap)
    if problems:
        return Recovered({}, {}, problems)
    vis, contents, problems, records = inspect(work, inomap)
    for inv in w.invariants:
        problems.extend(inv(vis, contents))
    # idempotence: recovering the recovered state again changes nothing
    again = recover_dir(work, inomap)
    vis2, _, _, records2 = inspect(work, inomap)
    if again or vis2 != vis or records2 != records:
        problems.append(f"recovery not idempotent: {again or sorted(set(vis2.items()) ^ set(vis.items()))[:2]}")
    return Recovered(vis, contents, problems)


def _crash_recovery(sim: Sim, cs: CrashState, work: str, model: str, rng: random.Random, res: ModelResult,
                    w: Workload, states: list[dict[str, tuple]], acked: int, begun: int) -> list[str]:
    """Power loss at every point of recovery of ``cs`` (one sampled state each), then recover again."""
    inomap = materialize(sim, cs, work)
    inner = Sim.from_dir(model, work, inomap)
    rec = RecordingStore(OsBackingStore(work))  # inner replaced by recover_dir
    if recover_dir(work, inomap, rec):
        return []  # recovery itself fails: already reported by the caller
    problems: list[str] = []
    sub = work + ".r"
    for e in rec.log:
        inner.apply(e)
        if not changes_state(e):
            continue
        cands, _, _ = crash_states(inner, 2, rng)
        for st in cands[:2]:
            res.recovery_crash_states += 1
            m2 = materialize(inner, st, sub)
            p = recover_dir(sub, m2)
            if not p:
                vis, contents, p, _ = inspect(sub, m2)
                for inv in w.invariants:
                    p.extend(inv(vis, contents))
                p.extend(judge(vis, states, acked, begun, model))
            if p:
                problems.append(f"after a crash during recovery at {e[0]} {e[1]!r}: {'; '.join(p[:2])}")
                break
        if problems:
            break
    shutil.rmtree(sub, ignore_errors=True)
    return problems


def _group_markers(tree: dict[str, tuple]) -> dict[str, set[str]]:
    """Checkpoint groups (rules.py) in ``tree``: directory -> its completion marker names."""
    from ckptfs.rules import RuleSet

    rules = RuleSet()
    out: dict[str, set[str]] = {}
    for d, v in tree.items():
        if v[0] != "d":
            continue
        pre = d + "/"
        children = [p[len(pre):] for p in tree if p.startswith(pre) and "/" not in p[len(pre):]]
        rule = rules.dir_rule(d.rsplit("/", 1)[-1])
        content = next((r for r in (rules.content_rule(c) for c in children) if r is not None), None)
        if rule is None and content is None:
            continue
        out[d] = set((content or rule).markers) | (set(rule.markers) if rule else set())
    return out


def _has_evidence(tree: dict[str, tuple], d: str) -> bool:
    """Whether d's files in ``tree`` are evidence of a checkpoint (rules.py: a group opens only on
    evidence; a directory without any is an ordinary directory, issue 10)."""
    from ckptfs.rules import RuleSet

    rules = RuleSet()
    pre = d + "/"
    base = d.rsplit("/", 1)[-1]
    return any(rules.content_rule(p.rsplit("/", 1)[-1]) is not None
               or rules.evidence_rule(base, p.rsplit("/", 1)[-1]) is not None
               for p in tree if p.startswith(pre))


def _split(tree: dict[str, tuple], d: str) -> tuple[dict[str, tuple], dict[str, tuple]]:
    """(tree without d's subtree, d's subtree)."""
    inside = {p: v for p, v in tree.items() if p == d or p.startswith(d + "/")}
    return {p: v for p, v in tree.items() if p not in inside}, inside


def views(states: list[dict[str, tuple]], model: str = "weak") -> list[list[dict[str, tuple]]]:
    """For each prefix state S_j, the trees ckptfs may show after a crash there.

    A group is *sealed at* the last prefix whose operation wrote its completion marker.  Never
    sealed: hidden whole (G7).  Files only added since: shown as is (G10 reseals with them).  A file
    of the sealed state rewritten or gone since (a re-save in progress): rolled back to the sealed
    state (G11); under *weak* persistence also hidden whole, as the kept generations' links are not
    synced when made and may be lost (G7); under *ext4* (ordered metadata) they survive, so the
    rollback is required.  A group directory holding no checkpoint file yet may show (an ordinary
    directory: no evidence, issue 10) or be hidden (its group was already opened)."""
    out: list[list[dict[str, tuple]]] = []
    sealed_at: dict[str, int] = {}
    for j, s in enumerate(states):
        groups = _group_markers(s)
        prev = states[j - 1] if j else {}
        for d in [d for d in sealed_at if d not in groups]:
            del sealed_at[d]
        for d, markers in groups.items():
            if any(f"{d}/{m}" in s and s[f"{d}/{m}"] != prev.get(f"{d}/{m}") for m in markers):
                sealed_at[d] = j
        cands = [s]
        for d, markers in groups.items():
            k = sealed_at.get(d)
            if k is None or not any(f"{d}/{m}" in s for m in markers):
                hidden = [_split(c, d)[0] for c in cands]
                # no checkpoint file in it yet: an ordinary directory, or (its group_open already
                # durable, the save cut by the crash) a torn group: either may show
                cands = cands + hidden if not _has_evidence(s, d) else hidden
                continue
            _, old = _split(states[k], d)
            _, cur = _split(s, d)
            if any(cur.get(p) != v for p, v in old.items()):
                back = [{**_split(c, d)[0], **old} for c in cands]
                cands = back if model == "ext4" else back + [_split(c, d)[0] for c in cands]
        out.append(cands)
    return out


def judge(vis: dict[str, tuple], states: list[dict[str, tuple]], acked: int, begun: int,
          model: str = "weak") -> list[str]:
    """Violations of "visible is a view of S_j for some acked <= j <= begun" (:func:`views`: only
    sealed groups are shown, an acknowledged file inside a group that never sealed is hidden with
    it, and a torn re-save shows the group as sealed before it)."""
    cands = views(states, model)
    if any(vis == c for j in range(acked, begun + 1) for c in cands[j]):
        return []
    known: dict[str, set] = {}
    for cs in cands:
        for c in cs:
            for p, v in c.items():
                known.setdefault(p, set()).add(v)
    torn = [p for p, v in vis.items() if v not in known.get(p, set())]
    if torn:
        return [f"{p} holds content never committed there" for p in torn[:3]]
    earlier = [j for j in range(acked) if any(vis == c for c in cands[j])]
    if earlier:
        return [f"acknowledged operations {earlier[-1] + 1}..{acked} lost"]
    last = cands[begun][0]
    return [f"not the state after any prefix {acked}..{begun} of the operations "
            f"(differs from S_{begun} at {sorted(set(vis.items()) ^ set(last.items()))[:2]})"]


def iter_results(workloads: list[Workload], models: tuple[str, ...], scratch: str, **kw: Any) -> Iterator[ModelResult]:
    for w in workloads:
        for m in models:
            yield check_workload(w, m, scratch, **kw)
