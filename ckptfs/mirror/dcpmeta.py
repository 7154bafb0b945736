"""The data files a torch.distributed.checkpoint (DCP) ``.metadata`` file references, read without torch.

``torch.distributed.checkpoint.save`` with the default ``FileSystemWriter`` writes one ``.metadata``
per checkpoint (or ``__<rank>.metadata`` per rank without collectives): ``pickle.dump`` of a
``torch.distributed.checkpoint.metadata.Metadata`` dataclass whose ``storage_data`` dict maps each
``MetadataIndex`` to a ``_StorageInfo(relative_path, offset, length[, transform_descriptors])``
(``_StorageInfo.__getstate__`` drops the ``None`` fields).  :func:`referenced_files` returns the
distinct ``relative_path`` values, sorted (``["__0_0.distcp", "__1_0.distcp"]``), so the mirror
knows which data files belong to a checkpoint before it publishes it.

Invariant: this module never imports a module named by the data and never executes code from the
data.  The bytes come from an object store and are untrusted; the daemon does not depend on torch.
Every global a pickle names (``find_class``) becomes an inert stand-in: a fresh class, made here
per load, whose instances only record what the pickle hands them (constructor arguments,
``BUILD`` state, ``SETITEMS``/``APPENDS`` items) and which has no behaviour of its own.  The only
globals with a meaning are the reconstruction helpers plain pickles use (``copyreg._reconstructor``,
``copyreg.__newobj__``, ``copyreg.__newobj_ex__``, ``builtins.getattr``), and they too only build
stand-ins.  Persistent ids are refused.  The parser then reads exactly one path of the result:
``Metadata`` -> ``storage_data`` -> each value's ``relative_path``; no generic walk, no ``repr``.

Bounds: at most :data:`MAX_METADATA_BYTES` of input (a pickle builds at most a few dozen bytes of
objects per byte of input), at most :data:`MAX_GLOBALS` distinct globals, at most
:data:`MAX_PATH_CHARS` characters per path.
"""

from __future__ import annotations

import io
import pickle
from typing import Any, NoReturn

__all__ = ["MAX_METADATA_BYTES", "MAX_GLOBALS", "MAX_PATH_CHARS", "NotDcpMetadata", "referenced_files"]

MAX_METADATA_BYTES = 256 * 1024 * 1024
MAX_GLOBALS = 4096  # distinct (module, name) pairs; a real DCP .metadata names about 15
MAX_PATH_CHARS = 4096
METADATA_CLASS = "Metadata"  # torch.distributed.checkpoint.metadata.Metadata (the module is not checked)


class NotDcpMetadata(ValueError):
    """The bytes are not a DCP .metadata this parser understands."""


def _refuse(reason: str) -> NoReturn:
    raise NotDcpMetadata(reason)


class _Stub:
    """An inert stand-in for an instance of a class the pickle names.

    Records what unpickling hands it and does nothing else: no ``__getattr__``, no ``__reduce__``
    hooks, no ``__eq__``/``__hash__`` beyond identity, no ``__dict__`` (``__slots__``), so the pickle
    cannot set attributes that change how the unpickler treats it.
    """

    __slots__ = ("_args", "_kwargs", "_state", "_items", "_list")
    _stub_module: str = ""
    _stub_name: str = ""

    def __new__(cls, *args: Any, **kwargs: Any) -> _Stub:
        self = object.__new__(cls)
        self._args = args
        self._kwargs = kwargs
        self._state: Any = None
        self._items: dict[Any, Any] = {}
        self._list: list[Any] = []
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # REDUCE calls cls(*args): recorded by __new__
        pass

    def __setstate__(self, state: Any) -> None:  # BUILD
        self._state = state

    def __setitem__(self, key: Any, value: Any) -> None:  # SETITEM(S) on a reduced mapping
        self._items[key] = value

    def append(self, value: Any) -> None:  # APPEND(S) on a reduced sequence
        self._list.append(value)

    def extend(self, values: Any) -> None:
        self._list.extend(values)

    def add(self, value: Any) -> None:  # ADDITEMS on a reduced set
        self._list.append(value)

    def __call__(self, *args: Any, **kwargs: Any) -> _Stub:  # a stand-in called (a getattr'd method)
        return _Call(self, args, kwargs)

    def __repr__(self) -> str:  # never recurses into what the pickle supplied
        return f"<stand-in {self._stub_module}.{self._stub_name}>"

    def attr(self, name: str) -> Any:
        """The value the object would have for ``name``: its BUILD state, else a keyword argument."""
        state = self._state
        if isinstance(state, tuple) and len(state) == 2 and all(s is None or isinstance(s, dict) for s in state):
            for part in state:  # (dict state, slot state): dataclass(slots=True) and friends
                if part is not None and name in part:
                    return part[name]
        elif isinstance(state, dict) and name in state:
            return state[name]
        if name in self._kwargs:
            return self._kwargs[name]
        raise KeyError(name)


class _Call(_Stub):
    __slots__ = ()
    _stub_name = "<call>"


class _Attr(_Stub):
    __slots__ = ()
    _stub_name = "<getattr>"


class _Helper:
    """One of the pickle reconstruction helpers, reimplemented to build stand-ins only.

    An instance, not a function: ``BUILD`` on a function would write to its ``__dict__`` and its
    ``__defaults__``; here ``__setstate__`` refuses.
    """

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __setstate__(self, state: Any) -> None:
        _refuse(f"pickle sets state on {self._name}")

    def __call__(self, *args: Any) -> _Stub:
        if self._name == "getattr":  # builtins.getattr(obj, name): an enum member, a method
            if len(args) not in (2, 3):
                _refuse("getattr with a wrong argument count")
            return _Attr(*args)
        if self._name == "_reconstructor":  # copyreg._reconstructor(cls, base, state): protocols 0 and 1
            if len(args) != 3:
                _refuse("copyreg._reconstructor with a wrong argument count")
            return _new(args[0], (), {})
        if self._name == "__newobj__":  # copyreg.__newobj__(cls, *args)
            if not args:
                _refuse("copyreg.__newobj__ without a class")
            return _new(args[0], args[1:], {})
        if self._name == "__newobj_ex__":  # copyreg.__newobj_ex__(cls, args, kwargs)
            if len(args) != 3 or not isinstance(args[1], tuple) or not isinstance(args[2], dict):
                _refuse("copyreg.__newobj_ex__ with wrong arguments")
            return _new(args[0], args[1], args[2])
        _refuse(f"unknown helper {self._name}")


def _new(cls: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Stub:
    if not (isinstance(cls, type) and issubclass(cls, _Stub)):
        _refuse("a reconstruction helper applied to something other than a named class")
    return cls.__new__(cls, *args, **kwargs)


_HELPERS = {
    ("builtins", "getattr"): "getattr",
    ("__builtin__", "getattr"): "getattr",
    ("copyreg", "_reconstructor"): "_reconstructor",
    ("copy_reg", "_reconstructor"): "_reconstructor",
    ("copyreg", "__newobj__"): "__newobj__",
    ("copy_reg", "__newobj__"): "__newobj__",
    ("copyreg", "__newobj_ex__"): "__newobj_ex__",
}


class _InertUnpickler(pickle.Unpickler):
    """An unpickler whose globals are stand-ins: it imports nothing and calls nothing it did not define."""

    def __init__(self, data: bytes) -> None:
        self.stream = io.BytesIO(data)
        super().__init__(self.stream)
        self._classes: dict[tuple[str, str], Any] = {}

    def find_class(self, module: str, name: str) -> Any:
        key = (module, name)
        found = self._classes.get(key)
        if found is not None:
            return found
        if len(self._classes) >= MAX_GLOBALS:
            _refuse(f"pickle names more than {MAX_GLOBALS} globals")
        helper = _HELPERS.get(key)
        if helper is not None:
            found = _Helper(helper)
        else:  # a fresh class per load: BUILD or setattr on it cannot reach another load
            found = type("Stub", (_Stub,), {"__slots__": (), "_stub_module": module, "_stub_name": name})
        self._classes[key] = found
        return found

    def persistent_load(self, pid: Any) -> NoReturn:
        _refuse("pickle uses persistent ids")


def _check_path(path: Any) -> str:
    if not isinstance(path, str):
        _refuse(f"relative_path is a {type(path).__name__}, not a str")
    if not path:
        _refuse("relative_path is empty")
    if len(path) > MAX_PATH_CHARS:
        _refuse(f"relative_path is longer than {MAX_PATH_CHARS} characters")
    if "\0" in path or "\\" in path:
        _refuse(f"relative_path {path[:200]!r} contains a NUL or a backslash")
    if path.startswith("/"):
        _refuse(f"relative_path {path[:200]!r} is absolute")
    if any(part in ("", ".", "..") for part in path.split("/")):
        _refuse(f"relative_path {path[:200]!r} has an empty, '.' or '..' component")
    return path


def _mapping_items(obj: Any) -> list[tuple[Any, Any]]:
    if isinstance(obj, dict):
        return list(obj.items())
    if isinstance(obj, _Stub) and (obj._items or obj._stub_name == "OrderedDict"):
        return list(obj._items.items())  # an OrderedDict or a dict subclass, rebuilt by SETITEMS
    _refuse(f"storage_data is a {type(obj).__name__}, not a dict")


def referenced_files(data: bytes) -> list[str]:
    """Sorted distinct relative_path values of every storage_data entry.

    Raises NotDcpMetadata (with a one-line reason) for anything else: not a pickle, no storage_data,
    a relative path that is absolute or contains '..' or is empty, etc.  An empty checkpoint (an
    empty state dict) references no files: ``[]``.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        _refuse(f"expected bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) > MAX_METADATA_BYTES:
        _refuse(f"{len(data)} bytes is more than the {MAX_METADATA_BYTES} a .metadata may have")
    if not data:
        _refuse("empty")
    unpickler = _InertUnpickler(data)
    try:
        root = unpickler.load()
    except NotDcpMetadata:
        raise
    except Exception as e:  # UnpicklingError, EOFError, TypeError from a malformed stream, MemoryError ...
        reason = str(e).splitlines()[0][:200] if str(e) else ""
        _refuse(f"not a pickle this parser reads: {type(e).__name__}: {reason}")
    end = unpickler.stream.tell()  # after STOP: the unpickler gives back what it peeked beyond
    if end != len(data):
        _refuse(f"{len(data) - end} bytes after the end of the pickle")

    if not isinstance(root, _Stub) or root._stub_name != METADATA_CLASS:
        what = f"{root._stub_module}.{root._stub_name}" if isinstance(root, _Stub) else type(root).__name__
        _refuse(f"the pickle holds a {what}, not a {METADATA_CLASS}")
    try:
        storage_data = root.attr("storage_data")
    except KeyError:
        _refuse("Metadata has no storage_data")
    if storage_data is None:
        _refuse("Metadata.storage_data is None")

    paths: set[str] = set()
    for _index, info in _mapping_items(storage_data):
        if not isinstance(info, _Stub):
            _refuse(f"a storage_data value is a {type(info).__name__}, not a storage info")
        try:
            path = info.attr("relative_path")
        except KeyError:
            _refuse(f"a storage_data value ({info._stub_module}.{info._stub_name}) has no relative_path")
        paths.add(_check_path(path))
    return sorted(paths)
