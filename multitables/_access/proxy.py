"""The proxy ``Future.get_proxy`` lends: the data of a request, usable only inside its ``with``."""

from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np

from ..errors import ReleasedResourceError

__all__ = ["DataProxy"]


class Lease:
    """Whether data lent by :meth:`Future.get_proxy` may still be used."""

    __slots__ = ("alive", "root")

    def __init__(self, root: Any) -> None:
        self.alive = True
        self.root = root


#: Attributes through which numpy would read an array without calling ``__array__``.
_ARRAY_PROTOCOLS = frozenset({"__array_interface__", "__array_struct__"})


class DataProxy:
    """Stands for a request's data inside ``with future.get_proxy()``; raises once the ``with`` is left.

    Indexing, attributes, methods, arithmetic and numpy functions go to the
    array; results that are views of the stage are proxies too. Only
    ``numpy.asarray(proxy)`` gives the bare view, which is then yours to drop.
    As 2.x's proxy, it passes for its data in ``isinstance`` (``__class__``), and ``bytes(proxy)`` gives the data's.
    """

    __slots__ = ("_lease", "_data")

    @property  # type: ignore[misc]  # read-only on purpose: isinstance sees the data's class
    def __class__(self) -> type:
        if not object.__getattribute__(self, "_lease").alive:
            return DataProxy
        return type(object.__getattribute__(self, "_data"))

    def __bytes__(self) -> bytes:
        return np.asarray(self._get()).tobytes()

    def __init__(self, lease: Lease, data: Any) -> None:
        object.__setattr__(self, "_lease", lease)
        object.__setattr__(self, "_data", data)

    def _get(self) -> Any:
        lease = object.__getattribute__(self, "_lease")
        if not lease.alive:
            raise ReleasedResourceError(
                "this data was released when its `with future.get_proxy()` block ended (its stage may already "
                "hold another request); copy what you keep inside the block"
            )
        return object.__getattribute__(self, "_data")

    def _wrap(self, value: Any) -> Any:
        lease = object.__getattribute__(self, "_lease")
        if isinstance(value, np.ndarray) and isinstance(lease.root, np.ndarray) and np.may_share_memory(value, lease.root):
            return DataProxy(lease, value)
        return value

    def __getattr__(self, name: str) -> Any:
        if name in _ARRAY_PROTOCOLS:
            # numpy prefers these to __array__, and builds a structured array from them as plain void
            # (and they would hand the bare stage out past the lease).
            raise AttributeError(name)
        value = getattr(self._get(), name)
        if callable(value):
            def method(*args: Any, **kwargs: Any) -> Any:
                return self._wrap(getattr(self._get(), name)(*args, **kwargs))

            return method
        return self._wrap(value)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._get(), name, value)

    def __getitem__(self, key: Any) -> Any:
        return self._wrap(self._get()[key])

    def __len__(self) -> int:
        return len(self._get())

    def __iter__(self) -> Iterator[Any]:
        for item in self._get():
            yield self._wrap(item)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        data = np.asarray(self._get())
        if dtype is not None:
            return data.astype(dtype, copy=bool(copy)) if copy is not None else data.astype(dtype, copy=False)
        return data.copy() if copy else data

    def __repr__(self) -> str:
        if not object.__getattribute__(self, "_lease").alive:
            return "<multitables.DataProxy (released)>"
        return f"DataProxy({self._get()!r})"

    def __bool__(self) -> bool:
        return bool(self._get())


def _proxy_op(name: str) -> Callable[..., Any]:
    def op(self: DataProxy, *args: Any) -> Any:
        args = tuple(np.asarray(a) if isinstance(a, DataProxy) else a for a in args)
        return self._wrap(getattr(self._get(), name)(*args))

    op.__name__ = name
    return op


for _name in (
    "add sub mul truediv floordiv mod pow matmul and or xor lshift rshift "
    "radd rsub rmul rtruediv rfloordiv rmod rpow rmatmul rand ror rxor rlshift rrshift "
    "eq ne lt le gt ge neg pos abs invert float int index complex"
).split():
    setattr(DataProxy, f"__{_name}__", _proxy_op(f"__{_name}__"))
DataProxy.__hash__ = None  # type: ignore[assignment]  # unhashable, as the arrays it stands for
