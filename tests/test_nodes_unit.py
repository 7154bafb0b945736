"""The native transport's node table (ckptfs/fuse/nodes.py) against a model that scans every
mapped path (the table before its child index): T2-T4 under random lookups, forgets, unlinks,
rmdirs, renames, exchanges, detaches and daemon-side subtree removals.  No mount needed."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ckptfs.fuse.nodes import Nodes, split

NAMES = ["a", "b", "c", "ab", "a.b"]  # "ab" and "a.b" share a prefix with "a" (not a child of it)
PATHS = st.lists(st.sampled_from(NAMES), min_size=1, max_size=4).map("/".join)


class Model:
    """path -> nid, every subtree operation a scan of all mapped paths."""

    def __init__(self, nodes: Nodes) -> None:
        self.m: dict[str, int] = {p: n.nid for p, n in nodes.by_path.items()}
        self.fol: dict[int, str] = {}  # T9: follower nid -> the path it follows

    def _within(self, p: str, path: str) -> bool:
        return p == path or p.startswith(path + "/" if path else "")

    def unfollow(self, path: str, subtree: bool) -> None:
        for nid, p in list(self.fol.items()):
            if p == path or subtree and self._within(p, path):
                del self.fol[nid]

    def below(self, path: str) -> list[str]:
        pre = path + "/" if path else ""
        return [p for p in self.m if p.startswith(pre) and p != path]

    def unmap(self, path: str, subtree: bool) -> None:
        for p in [path, *(self.below(path) if subtree else [])]:
            self.m.pop(p, None)

    def move(self, old: str, new: str) -> None:
        moving_f = {nid: p for nid, p in self.fol.items() if self._within(p, old)}
        self.unfollow(new, True)
        for nid, p in moving_f.items():
            self.fol[nid] = new + p[len(old):]
        for p in [new, *self.below(new)]:
            self.m.pop(p, None)
        moving = {p: self.m.pop(p) for p in [old, *self.below(old)] if p in self.m}
        for p, nid in moving.items():
            self.m[new + p[len(old):]] = nid

    def exchange(self, a: str, b: str) -> None:
        for nid, p in list(self.fol.items()):
            if self._within(p, a):
                self.fol[nid] = b + p[len(a):]
            elif self._within(p, b):
                self.fol[nid] = a + p[len(b):]
        sides = [{p: self.m.pop(p) for p in [s, *self.below(s)] if p in self.m} for s in (a, b)]
        for (src, dst), side in zip(((a, b), (b, a)), sides, strict=True):
            for p, nid in side.items():
                self.m[dst + p[len(src):]] = nid

    def under(self, path: str) -> set[int]:
        return ({nid for p, nid in self.m.items() if self._within(p, path)}
                | {nid for nid, p in self.fol.items() if self._within(p, path)})


def index_is_exact(nodes: Nodes) -> None:
    """T4: a path is listed under its parent iff it is mapped or has listed children."""
    listed = set()
    for p in nodes.by_path:
        while p:
            listed.add(p)
            p = split(p)[0]
    want: dict[str, set[str]] = {}
    for p in listed:
        parent, name = split(p)
        want.setdefault(parent, set()).add(name)
    assert nodes.kids == want
    for p, n in nodes.by_path.items():
        assert n.path == p  # T2


OPS = st.one_of(
    st.tuples(st.just("lookup"), PATHS),
    st.tuples(st.just("forget"), PATHS),
    st.tuples(st.just("unmap"), PATHS, st.booleans()),
    st.tuples(st.just("detach"), PATHS),
    st.tuples(st.just("follow"), PATHS),
    st.tuples(st.just("move"), PATHS, PATHS),
    st.tuples(st.just("exchange"), PATHS, PATHS),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(OPS, max_size=40))
def test_subtree_operations_match_a_full_scan(ops: list[tuple]) -> None:
    """T2-T4 against the model, and T9: a detached passthrough writer's node (``follow``) keeps
    the path of the file it names through renames and exchanges (the kernel's dentry moves with
    the file), stops following where that name is renamed over or removed, and is among the nodes
    a subtree's invalidation reaches."""
    nodes = Nodes()
    model = Model(nodes)
    for op in ops:
        kind, a = op[0], op[1]
        if kind == "lookup":
            model.m[a] = nodes.looked_up(a).nid
        elif kind == "forget":
            n = nodes.at(a)
            if n is not None:
                nodes.forget(n.nid, n.nlookup)
                model.m.pop(a, None)
        elif kind == "unmap":
            nodes.unmap(a, subtree=op[2])
            model.unmap(a, op[2])
            model.unfollow(a, op[2])
        elif kind in ("detach", "follow"):
            n = nodes.at(a)
            if n is not None:
                nodes.detach(n, follow=kind == "follow")
                model.m.pop(a, None)
                if kind == "follow":
                    model.fol[n.nid] = a
        else:
            b = op[2]
            if a == b or b.startswith(a + "/") or a.startswith(b + "/"):
                continue  # the kernel refuses these (EINVAL / ENOTEMPTY) before asking us
            (nodes.move if kind == "move" else nodes.exchange)(a, b)
            (model.move if kind == "move" else model.exchange)(a, b)
        assert {p: n.nid for p, n in nodes.by_path.items()} == model.m
        index_is_exact(nodes)
        assert {f.nid: p for p, fs in nodes.followers.items() for f in fs} == model.fol  # T9
        for nid, p in model.fol.items():
            assert nodes.by_id[nid].path == p and nodes.by_id[nid].follows
        for p in ["", "a", "a/b", "ab", op[1]]:
            assert {n.nid for n in nodes.under(p)} == model.under(p)


def test_subtree_walks_in_a_large_table_find_exactly_the_subtree() -> None:
    """100,000 mapped names elsewhere: a commit event walks its group only (bench: nodes microbench)."""
    nodes = Nodes()
    for i in range(100_000):
        nodes.looked_up(f"data/d{i // 1000}/f{i}")
    for p in ("run", "run/ckpt-1", "run/ckpt-1/model.pt"):
        nodes.looked_up(p)
    assert [n.path for n in nodes.under("run/ckpt-1")] == ["run/ckpt-1", "run/ckpt-1/model.pt"]
    assert sorted(nodes._below("run")) == ["run/ckpt-1", "run/ckpt-1/model.pt"]
    nodes.move("data/d7", "data/e7")
    assert nodes.at("data/e7/f7000") is not None and nodes.at("data/d7/f7000") is None
    assert len(nodes._below("data/e7")) == 1000


def test_bench_nodes_runs() -> None:
    """bench/nodes.py (the walk timings in docs/results/performance-analysis.md) keeps working."""
    from bench.nodes import run

    r = run(200, reps=3)
    assert set(r) == {"under_us", "move_us", "unmap_subtree_us"} and all(v > 0 for v in r.values())


def test_a_passthrough_writers_detached_node_follows_the_renames_of_its_name() -> None:
    """T9, step by step: ``model.pt.tmp``'s writer node is detached (its name's next lookup gets
    another node) yet still names the file: a rename of the name, of a directory above it and an
    exchange move it; a rename over it, an unlink or a forget end its following."""
    nodes = Nodes()
    w = nodes.looked_up("run/model.pt.tmp")
    nodes.detach(w, follow=True)
    assert nodes.at("run/model.pt.tmp") is None and w.follows
    other = nodes.looked_up("run/model.pt.tmp")  # a lookup after the detach: another node
    assert other is not w
    nodes.move("run/model.pt.tmp", "run/model.pt")
    assert w.path == other.path == "run/model.pt" and nodes.at("run/model.pt") is other
    assert w in nodes.under("run")
    nodes.move("run", "done")
    assert w.path == "done/model.pt" and nodes.followers == {"done/model.pt": [w]}
    x = nodes.looked_up("done/x")
    nodes.exchange("done/model.pt", "done/x")
    assert w.path == "done/x" and x.path == "done/model.pt"
    nodes.move("done/model.pt", "done/x")  # renamed over: w's file is no longer at that name
    assert not w.follows and nodes.followers == {} and w.path == "done/x"
    v = nodes.looked_up("v.tmp")
    nodes.detach(v, follow=True)
    nodes.unmap("v.tmp")
    assert not v.follows and nodes.followers == {}
    f = nodes.looked_up("f.tmp")
    nodes.detach(f, follow=True)
    nodes.forget(f.nid, 1)
    assert f.nid not in nodes.by_id and nodes.followers == {}
