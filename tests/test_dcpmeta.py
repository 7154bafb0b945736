"""ckptfs.mirror.dcpmeta: the data files a real DCP ``.metadata`` references, read without torch and
without running anything the pickle names (real ``torch.distributed.checkpoint.save`` output, no mocks)."""

from __future__ import annotations

import io
import os
import pickle
import random
import shlex
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, _env

from ckptfs.mirror.dcpmeta import NotDcpMetadata, referenced_files

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")


def _save(state: dict[str, Any], path: Path, **writer: Any) -> Path:
    """dcp.save in this process, no process group (torch's no_dist single-process save)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "torch.distributed is disabled ... single process"
        if writer:
            dcp.save(state, storage_writer=dcp.FileSystemWriter(str(path), **writer))
        else:
            dcp.save(state, checkpoint_id=str(path))
    return path


def _distcp(*dirs: Path) -> list[str]:
    return sorted({p.name for d in dirs for p in d.glob("*.distcp")})


def _metadata(path: Path) -> bytes:
    return (path / ".metadata").read_bytes()


def _state() -> dict[str, Any]:
    return {
        "model": {"w": torch.randn(4, 3), "b": torch.zeros(3, dtype=torch.int64),
                  "emb": torch.ones(2, 5, dtype=torch.bfloat16)},
        "optim": {"state": {"0": {"exp_avg": torch.randn(4, 3), "step": 12}}, "param_groups": [{"lr": 0.1}]},
        "step": 100,
        "name": "run-7",
        "schedule": [1, 2, "three", 4.0],
        "blob": io.BytesIO(b"opaque bytes"),
    }


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _save(_state(), tmp_path_factory.mktemp("dcp") / "step100")


def _trusted_paths(path: Path) -> list[str]:
    """What torch itself reads from the file (trusted here: we wrote it)."""
    md = pickle.loads(_metadata(path))
    return sorted({info.relative_path for info in md.storage_data.values()})


# ---------------------------------------------------------------- real checkpoints


def test_single_process_checkpoint(ckpt: Path) -> None:
    files = referenced_files(_metadata(ckpt))
    assert files == _distcp(ckpt) == ["__0_0.distcp"]
    assert files == _trusted_paths(ckpt)


def test_several_files_per_rank(tmp_path: Path) -> None:
    state = {f"layer{i}": torch.randn(64, 8) for i in range(6)} | {"step": 3, "io": io.BytesIO(b"x" * 100)}
    path = _save(state, tmp_path / "threads", thread_count=3)
    files = referenced_files(_metadata(path))
    assert len(files) == 3
    assert files == _distcp(path) == _trusted_paths(path)


def test_empty_state_dict_references_nothing(tmp_path: Path) -> None:
    path = _save({}, tmp_path / "empty")
    assert referenced_files(_metadata(path)) == []


def test_every_pickle_protocol(ckpt: Path) -> None:
    """The same Metadata pickled with protocols 0..5: _reconstructor, __newobj__, NEWOBJ, frames, memo forms."""
    md = pickle.loads(_metadata(ckpt))
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        assert referenced_files(pickle.dumps(md, protocol=protocol)) == ["__0_0.distcp"], protocol


_RANK = """
import sys, torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
rank, store, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2)
state = {f"rank{rank}": torch.full((16,), float(rank)), "shared": torch.ones(3), "step": 7,
         f"io{rank}": __import__("io").BytesIO(b"rank %d" % rank), "nested": {f"x{rank}": [rank, "s"]}}
dcp.save(state, checkpoint_id=out)
dist.barrier()
dist.destroy_process_group()
"""


def test_two_ranks_each_in_its_own_directory(tmp_path: Path) -> None:
    dirs = [tmp_path / f"rank{r}" for r in range(2)]
    env = _env({"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"})
    procs = [subprocess.Popen([sys.executable, "-c", _RANK, str(r), str(tmp_path / "store"), str(d)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r, d in enumerate(dirs)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert not (dirs[1] / ".metadata").exists()  # the coordinator (rank 0) writes the only .metadata
    files = referenced_files(_metadata(dirs[0]))
    assert files == ["__0_0.distcp", "__1_0.distcp"]
    assert files == _distcp(*dirs) == _trusted_paths(dirs[0])


def test_needs_no_torch(ckpt: Path) -> None:
    """The daemon's process: the parser runs without torch ever being imported."""
    code = ("import sys; from ckptfs.mirror.dcpmeta import referenced_files as r; "
            f"print(r(open({str(ckpt / '.metadata')!r}, 'rb').read())); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy')))")
    out = subprocess.run([sys.executable, "-c", code], env=_env(), cwd=ROOT, capture_output=True, text=True,
                         timeout=60, check=True).stdout.splitlines()
    assert out == ["['__0_0.distcp']", "[]"]


# ---------------------------------------------------------------- refusals


def _with_path(ckpt: Path, relative_path: Any) -> bytes:
    """The real Metadata with one storage entry's relative_path replaced (pickled by torch's own classes)."""
    md = pickle.loads(_metadata(ckpt))
    info = next(iter(md.storage_data.values()))
    info.relative_path = relative_path
    return pickle.dumps(md)


@pytest.mark.parametrize("bad", ["../x", "/etc/passwd", "", "a/../../b", "a//b", "./x", "x/", "a\\..\\b",
                                 "x\0y", 7, None])
def test_bad_relative_path_refused(ckpt: Path, bad: Any) -> None:
    with pytest.raises(NotDcpMetadata, match="relative_path"):
        referenced_files(_with_path(ckpt, bad))


def test_subdirectory_path_accepted(ckpt: Path) -> None:
    assert referenced_files(_with_path(ckpt, "shards/__0_0.distcp")) == ["__0_0.distcp", "shards/__0_0.distcp"]


@pytest.mark.parametrize("data", [
    b"",
    b"not a pickle at all\n",
    random.Random(0).randbytes(4096),
    pickle.dumps({"storage_data": {"k": "__0_0.distcp"}}),
    pickle.dumps(["__0_0.distcp"]),
    pickle.dumps("Metadata"),
    pickle.dumps(None),
])
def test_not_metadata_refused(data: bytes) -> None:
    with pytest.raises(NotDcpMetadata) as e:
        referenced_files(data)
    assert "\n" not in str(e.value)


def test_truncated_and_trailing_refused(ckpt: Path) -> None:
    data = _metadata(ckpt)
    for cut in (1, len(data) // 2, len(data) - 1):
        with pytest.raises(NotDcpMetadata):
            referenced_files(data[:cut])
    with pytest.raises(NotDcpMetadata, match="after the end"):
        referenced_files(data + b"\x00")


def test_metadata_without_storage_data_refused(ckpt: Path) -> None:
    md = pickle.loads(_metadata(ckpt))
    md.storage_data = None
    with pytest.raises(NotDcpMetadata, match="storage_data"):
        referenced_files(pickle.dumps(md))
    del md.storage_data
    with pytest.raises(NotDcpMetadata, match="storage_data"):
        referenced_files(pickle.dumps(md))
    md.storage_data = {"k": "__0_0.distcp"}  # values must be storage infos
    with pytest.raises(NotDcpMetadata, match="storage info"):
        referenced_files(pickle.dumps(md))


def test_oversized_refused(ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ckptfs.mirror import dcpmeta

    monkeypatch.setattr(dcpmeta, "MAX_METADATA_BYTES", 64)
    with pytest.raises(NotDcpMetadata, match="more than"):
        referenced_files(_metadata(ckpt))


def test_persistent_ids_refused(ckpt: Path) -> None:
    md = pickle.loads(_metadata(ckpt))
    md.planner_data = ["external"]

    class P(pickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:
            return "pid-1" if obj == "external" else None

    buf = io.BytesIO()
    P(buf).dump(md)
    with pytest.raises(NotDcpMetadata, match="persistent"):
        referenced_files(buf.getvalue())


# ---------------------------------------------------------------- nothing runs, nothing is imported


class _System:
    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (self.command,))


def _touch(marker: Path) -> _System:
    return _System(f"touch {shlex.quote(str(marker))}")


def test_payload_is_live_under_plain_pickle(tmp_path: Path) -> None:
    """Control: the payload used below really runs a command under pickle.loads."""
    marker = tmp_path / "CONTROL"
    pickle.loads(pickle.dumps(_touch(marker)))
    assert marker.exists()


@pytest.mark.parametrize("protocol", [0, 2, pickle.HIGHEST_PROTOCOL])
def test_os_system_payload_not_executed(tmp_path: Path, protocol: int) -> None:
    marker = tmp_path / "MARKER"
    with pytest.raises(NotDcpMetadata):
        referenced_files(pickle.dumps(_touch(marker), protocol=protocol))
    assert not marker.exists()


def test_payload_inside_real_metadata_not_executed(ckpt: Path, tmp_path: Path) -> None:
    marker = tmp_path / "MARKER"
    md = pickle.loads(_metadata(ckpt))
    md.planner_data = {"evil": _touch(marker)}
    next(iter(md.storage_data.values())).transform_descriptors = [_touch(marker)]
    assert referenced_files(pickle.dumps(md)) == ["__0_0.distcp"]
    assert not marker.exists()


def test_payload_as_relative_path_not_executed(ckpt: Path, tmp_path: Path) -> None:
    marker = tmp_path / "MARKER"
    with pytest.raises(NotDcpMetadata, match="relative_path"):
        referenced_files(_with_path(ckpt, _touch(marker)))
    assert not marker.exists()


def test_named_module_never_imported(ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A global naming an importable module whose import would leave a marker: the module is not imported."""
    marker = tmp_path / "IMPORTED"
    name = "ckptfs_dcpmeta_trap"
    (tmp_path / f"{name}.py").write_text(f"open({str(marker)!r}, 'w').close()\nclass Trap:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    md = pickle.loads(_metadata(ckpt))
    md.planner_data = "SENTINEL"
    data = pickle.dumps(md, protocol=2)
    sentinel = b"X" + len(b"SENTINEL").to_bytes(4, "little") + b"SENTINEL"  # BINUNICODE
    assert data.count(sentinel) == 1
    data = data.replace(sentinel, b"c" + name.encode() + b"\nTrap\n)R")  # GLOBAL, EMPTY_TUPLE, REDUCE: Trap()
    assert referenced_files(data) == ["__0_0.distcp"]
    assert not marker.exists()
    assert name not in sys.modules
    pickle.loads(data)  # control: a plain unpickler does import it
    assert marker.exists()
    sys.modules.pop(name, None)
