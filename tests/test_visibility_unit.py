"""engine/visibility.py without a mount: the checkpoint-file definition, format signatures, the
killed-writer rule (V2) and how a version tracks that it only extends its committed bytes."""

from __future__ import annotations

import io
import os
import struct

import numpy as np
import pytest
import torch

from ckptfs.backing import OsBackingStore
from ckptfs.engine import staged
from ckptfs.engine.visibility import Visibility, format_of
from ckptfs.fs import CkptFS
from ckptfs.rules import RuleSet


@pytest.mark.parametrize(("name", "yes"), [
    ("model.pt", True), ("a/b/optimizer.bin", True), ("x.safetensors", True), ("__0_0.distcp", True),
    ("step_1/.metadata", True), ("trainer_state.json", True), ("latest", True),
    ("latest_checkpointed_iteration.txt", True), ("train.log", False), ("metrics.csv", False),
    ("events.out.tfevents.1.host", False), ("notes.txt", False), ("metrics.jsonl", False),
])
def test_checkpoint_file_by_name(name: str, yes: bool) -> None:
    assert Visibility(RuleSet(), lambda p: False).checkpoint_file(name) is yes


def test_any_file_in_a_group_is_a_checkpoint_file() -> None:
    vis = Visibility(RuleSet(), lambda p: p.startswith("checkpoint-5/"))
    assert vis.checkpoint_file("checkpoint-5/README.md")
    assert not vis.checkpoint_file("README.md")


def test_format_signatures() -> None:
    buf = io.BytesIO()
    torch.save({"w": torch.zeros(2)}, buf)
    assert format_of(buf.getvalue()[:16]) == "zip"
    npy = io.BytesIO()
    np.save(npy, np.zeros(3))
    assert format_of(npy.getvalue()[:16]) == "npy"
    hdr = b'{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
    assert format_of(struct.pack("<Q", len(hdr)) + hdr[:8]) == "safetensors"
    assert format_of(b"\x80\x04\x95...") == "pickle"
    assert format_of(b"\x89HDF\r\n\x1a\n") == "hdf5"
    for text in (b"step 1 loss 0.5\n", b'{"step": 1}\n', b"epoch,loss\n", b""):
        assert format_of(text) is None  # logs, JSON lines, CSV


@pytest.fixture
def fs(tmp_path):
    store = OsBackingStore(str(tmp_path))
    f = CkptFS(store, housekeeping_interval=0)
    yield f
    f.shutdown()
    store.shutdown()


def test_a_version_tracks_whether_it_only_extends(fs: CkptFS) -> None:
    me = staged.Caller(0, 0, os.getpid())
    fh = fs.create("log.txt", 0o644, os.O_WRONLY, me)
    fs.write(fh, b"a\n", 0, me)
    v = fs.handles[fh].version
    assert v.base == 0 and v.extends  # a new file written from empty
    fs.flush(fh, me)
    fs.release(fh, me)
    fh = fs.open("log.txt", os.O_WRONLY | os.O_APPEND, me)
    fs.write(fh, b"b\n", 2, me)
    v = fs.handles[fh].version
    assert v.base == 2 and v.extends and v.appending
    fs.write(fh, b"X", 0, me)  # a write below the committed size
    assert not v.extends
    fs.flush(fh, me)
    fs.release(fh, me)
    fh = fs.open("log.txt", os.O_WRONLY | os.O_TRUNC, me)  # a truncating rewrite of existing bytes
    assert not fs.handles[fh].version.extends
    fs.write(fh, b"0123456789", 0, me)
    fs.flush(fh, me)
    fs.release(fh, me)
    fh = fs.open("log.txt", os.O_RDWR, me)
    fs.truncate("log.txt", 12, fh, me)  # growing keeps the committed prefix
    v = fs.handles[fh].version
    assert v.base == 10 and v.extends
    fs.truncate("log.txt", 1, fh, me)
    assert not v.extends
    fs.release(fh, me)


def test_keeps_prefix_only_for_extended_non_checkpoint_files(fs: CkptFS) -> None:
    v = staged.Version(path="train.log", staging="x", fd=-1)
    assert fs.vis.keeps_prefix(v, b"step 1\n")
    assert not fs.vis.keeps_prefix(v, b"PK\x03\x04rest")  # a torch archive under a log's name
    v.extends = False
    assert not fs.vis.keeps_prefix(v, b"step 1\n")
    w = staged.Version(path="model.pt", staging="x", fd=-1)
    assert not fs.vis.keeps_prefix(w, b"step 1\n")
    u = staged.Version(path="train.log", staging="x", fd=-1, unlinked=True)
    assert not fs.vis.keeps_prefix(u, b"")
