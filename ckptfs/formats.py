"""Completeness checks for known checkpoint formats, run before a commit.

A close from a live process does not prove the file is complete: Ctrl-C inside
``torch.save`` leaves a *valid zip* lacking storage records.  :func:`check`
returns ``None`` when the staged bytes look complete, or a reason string.

Rules (by content signature first, then by file name):

* torch zip archive (``PK\\x03\\x04`` with a ``*/data.pkl`` member, or with
  torch's bookkeeping members but no ``data.pkl``, which is incomplete): the central
  directory parses, every storage named by a persistent id in ``data.pkl`` has
  its ``data/<key>`` record, each at least ``numel * element_size`` bytes, and
  every member lies inside the file.  The pickle is scanned with an unpickler
  whose ``find_class`` returns inert stubs: no code from the file ever runs.
* other zip (``.npz``, ...): the central directory parses and members lie inside.
* ``.npy`` (``\\x93NUMPY``): header parses and ``header + prod(shape)*itemsize ==
  size`` (object arrays: header only).
* ``.safetensors``: header length and JSON parse, ``8 + N + max(data_offsets)``
  equals the file size.
* ``.json``: parses (files up to 256 MiB).
* an empty file named ``*.pt|.pth|.ckpt|.bin|.safetensors|.npy|.npz|.json`` is
  incomplete (no serializer writes zero bytes).
* anything else is complete.
"""

from __future__ import annotations

import io
import json
import math
import pickle
import struct
import zipfile
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ckptfs.backing import BackingStore

CKPT_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin", ".safetensors", ".npy", ".npz", ".json")
JSON_LIMIT = 256 << 20
TORCH_MARKERS = {".format_version", ".storage_alignment", "byteorder", "version", ".data/serialization_id"}

STORAGE_ELEMENT_SIZE = {
    "DoubleStorage": 8, "FloatStorage": 4, "HalfStorage": 2, "BFloat16Storage": 2,
    "LongStorage": 8, "IntStorage": 4, "ShortStorage": 2, "CharStorage": 1,
    "ByteStorage": 1, "BoolStorage": 1, "ComplexDoubleStorage": 16,
    "ComplexFloatStorage": 8, "QUInt8Storage": 1, "QInt8Storage": 1,
    "QInt32Storage": 4, "QUInt4x2Storage": 1, "QUInt2x4Storage": 1,
    "UntypedStorage": 1, "UInt16Storage": 2, "UInt32Storage": 4, "UInt64Storage": 8,
    "Float8_e4m3fnStorage": 1, "Float8_e5m2Storage": 1,
}


class FdReader(io.RawIOBase):
    """Seekable read-only file object over a BackingStore fd."""

    def __init__(self, store: BackingStore, fd: int, size: int) -> None:
        self.store, self.fd, self.size, self.pos = store, fd, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, off: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: self.size}[whence]
        self.pos = max(0, base + off)
        return self.pos

    def readinto(self, b) -> int:  # type: ignore[override]
        n = min(len(b), max(0, self.size - self.pos))
        if n <= 0:
            return 0
        data = self.store.pread(self.fd, n, self.pos)
        b[: len(data)] = data
        self.pos += len(data)
        return len(data)


class _Stub:
    """Inert stand-in for every global a pickle names."""

    _name = "?"

    def __new__(cls, *a, **k):
        return object.__new__(cls)

    def __init__(self, *a, **k) -> None:
        pass

    def __setstate__(self, state) -> None:
        pass

    def __setitem__(self, k, v) -> None:
        pass

    def append(self, x) -> None:
        pass

    def extend(self, xs) -> None:
        pass

    def __call__(self, *a, **k):
        return _Stub()


class _PidScanner(pickle.Unpickler):
    def __init__(self, f) -> None:
        super().__init__(f)
        self.pids: list[tuple] = []

    def find_class(self, module: str, name: str):
        return type(name, (_Stub,), {"_name": name, "_module": module})

    def persistent_load(self, pid):
        if isinstance(pid, tuple):
            self.pids.append(pid)
        return _Stub()


def _check_torch_zip(zf: zipfile.ZipFile, pkl: str, size: int) -> str | None:
    prefix = pkl[: -len("data.pkl")]
    try:
        scanner = _PidScanner(io.BytesIO(zf.read(pkl)))
        scanner.load()
    except Exception as e:  # noqa: BLE001 - any failure means "not a complete pickle"
        return f"torch archive: data.pkl does not unpickle ({type(e).__name__}: {e})"
    infos = {i.filename: i for i in zf.infolist()}
    for pid in scanner.pids:
        if len(pid) < 5 or pid[0] != "storage":
            continue
        stype, key, numel = pid[1], str(pid[2]), pid[4]
        info = infos.get(f"{prefix}data/{key}")
        if info is None:
            return f"torch archive: storage record data/{key} is missing"
        elsize = STORAGE_ELEMENT_SIZE.get(getattr(stype, "_name", ""), 0)
        if isinstance(numel, int) and elsize and info.file_size < numel * elsize:
            return f"torch archive: data/{key} holds {info.file_size} of {numel * elsize} bytes"
    return None


def _check_zip(reader: FdReader, size: int, name: str) -> str | None:
    try:
        zf = zipfile.ZipFile(reader)
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        return f"zip archive incomplete: {e}"
    with zf:
        for info in zf.infolist():
            if info.header_offset + 30 + len(info.filename) + info.compress_size > size:
                return f"zip member {info.filename} extends past end of file"
        names = zf.namelist()
        pkls = [n for n in names if n.endswith("data.pkl") and n.count("/") <= 1]
        if pkls:
            return _check_torch_zip(zf, pkls[0], size)
        if any(n.split("/", 1)[-1] in TORCH_MARKERS for n in names):
            # torch writes its end-of-archive records even when interrupted
            # while pickling, so a torch archive may be a valid zip without data.pkl
            return "torch archive without data.pkl (save interrupted while pickling)"
        if not names and name.lower().endswith(CKPT_SUFFIXES):
            return "empty zip archive"
    return None


def _check_npy(reader: FdReader, size: int) -> str | None:
    try:
        import numpy as np
    except ImportError:
        return None
    try:
        version = np.lib.format.read_magic(reader)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(reader)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(reader)
    except Exception as e:  # noqa: BLE001
        return f"npy header unreadable: {e}"
    if dtype.hasobject:
        return None
    expected = reader.tell() + math.prod(shape) * dtype.itemsize
    if size != expected:
        return f"npy holds {size} bytes, header says {expected}"
    return None


def _check_safetensors(reader: FdReader, size: int) -> str | None:
    if size < 8:
        return "safetensors shorter than its header length field"
    (n,) = struct.unpack("<Q", reader.read(8))
    if 8 + n > size or n > 100 << 20:
        return f"safetensors header length {n} exceeds file size {size}"
    try:
        header = json.loads(reader.read(n))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    except (ValueError, KeyError, TypeError, IndexError) as e:
        return f"safetensors header unreadable: {e}"
    if 8 + n + end != size:
        return f"safetensors holds {size} bytes, header says {8 + n + end}"
    return None


def check(store: BackingStore, fd: int, size: int, name: str) -> str | None:
    """None if the staged file looks complete, else why not."""
    lname = name.lower()
    if size == 0:
        return "empty checkpoint file" if lname.endswith(CKPT_SUFFIXES) else None
    reader = FdReader(store, fd, size)
    magic = store.pread(fd, 8, 0)
    if magic.startswith(b"PK\x03\x04") or (magic.startswith(b"PK\x05\x06")):
        return _check_zip(reader, size, name)
    if magic.startswith(b"\x93NUMPY"):
        return _check_npy(reader, size)
    if lname.endswith(".safetensors"):
        return _check_safetensors(reader, size)
    if lname.endswith(".json") and size <= JSON_LIMIT:
        try:
            json.loads(reader.read(size))
        except ValueError as e:
            return f"JSON does not parse: {e}"
    return None
