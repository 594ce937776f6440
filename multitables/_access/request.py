"""A request: a numpy-style key on a dataset, planned at once (NOTE [request plan] in ``_plan.requests``).
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import NoSuchFieldError
from .compat2x import next_op
from .._io.fields import field_of, field_path
from .._plan.requests import RowPlan, compose_keys, normalize_key, plan_rows, zero_d
from .._shm.stagemap import describe_query
from .readercore import not_pickled

if TYPE_CHECKING:
    from ..reader import Dataset  # bound at run time: NOTE [annotations from above] in ``multitables/__init__.py``

def field_list(key: Any) -> bool:
    """Whether ``key`` selects several fields of records, as numpy's ``records[['a', 'b']]``."""
    return isinstance(key, list) and bool(key) and all(isinstance(k, str) for k in key)


def fields_dtype(dtype: np.dtype, names: "list[str]") -> np.dtype:
    """The dtype of ``records[names]`` (numpy's: the named fields where they lie), with numpy's errors."""
    if dtype.names is None:
        raise IndexError(f"field names {names} select columns of a table; these rows have no fields")
    for name in names:
        if name not in dtype.names:  # numpy's KeyError, saying what there is
            parts = field_path(dtype, name)
            if len(parts) > 1 and parts[0] in dtype.names:
                raise NoSuchFieldError(f"a list of fields takes top-level columns only, as numpy's does: {name!r} is a path into "
                               f"{parts[0]!r}; read it on its own (dataset[{name!r}]) or take {parts[0]!r} in the list")
            raise NoSuchFieldError(f"no field {name!r} in the list {names}; the fields are {list(dtype.names)}")
    return np.empty(0, dtype)[names].dtype


def indexed(shape: "tuple[int, ...]", dtype: np.dtype, key: Any) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype of ``data[key]`` for data of ``shape`` and ``dtype`` (numpy's rules and errors)."""
    if isinstance(key, str):
        if dtype.names is None or field_path(dtype, key)[0] not in dtype.names:
            raise NoSuchFieldError(f"no field {key!r} in the result (its fields: {dtype.names})")
        sub = field_of(dtype, key, "the result")[0]  # a path into nested fields too, as a column is named
        if sub.subdtype is not None:
            return shape + sub.subdtype[1], sub.subdtype[0]
        return shape, sub
    # Index a zero-stride stand-in: numpy checks the key and gives the shape; only a gather allocates (1 byte a value).
    stand_in = np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), shape=shape, strides=(0,) * len(shape))
    return np.shape(stand_in[key]), dtype


def basic_key(key: Any) -> bool:
    """Whether numpy indexes with ``key`` by view (a field name, ints, slices, ``...`` and None only)."""
    entries = key if isinstance(key, tuple) else (key,)
    for e in entries:
        if isinstance(e, (str, slice)) or e is None or e is Ellipsis:
            continue
        if isinstance(e, (bool, np.bool_, list, np.ndarray)):
            return False
        try:
            operator.index(e)
        except TypeError:
            return False
    return True


class Request:
    """Which data to read: made by indexing a :class:`Dataset`; checked and planned at once, read by :meth:`Reader.request`.

    Index errors (out of range, too many indices, a missing column) are
    raised when the request is made. A request can be submitted any number
    of times, and indexed again: each step applies to the result of the one
    before (NOTE [chained keys] in ``_plan.requests``).

    Attributes
    ----------
    dataset : Dataset
    field : str or None
        The table column it reads, if any.
    shape : tuple of int, or None
        The shape of the result (None for :meth:`Dataset.where`, known only once read).
    dtype : numpy.dtype
        The dtype of the result.
    """

    def __init__(self, dataset: Dataset, field: "str | None", key: Any, *, op: str, field_last: bool = False) -> None:
        node, desc = dataset._field(field)
        self.dataset = dataset
        self.field = field
        self._node = node
        self._desc = desc
        self._op = op
        self._query: "tuple[str, dict[str, Any]] | None" = None
        self._post: tuple[Any, ...] = ()  # keys applied, in the consumer, to what was read
        self._post_view = True  # whether those keys give views
        self._fields: "list[str] | None" = None  # records[['a', 'b']]: applied last (it commutes with any key)
        shape = (node.n_rows,) + node.row_shape
        if field_last:
            # records[key][field]: index the records, then the column's sub-array axes come last.
            sub = len(node.row_shape)
            self._nkey = normalize_key(key, shape[:1]) + (slice(None),) * sub
        else:
            self._nkey = normalize_key(key, shape)
        self._plan: "RowPlan | None" = plan_rows(self._nkey, shape, keep_0d=zero_d(key, self._nkey))
        self._n_read: "int | None" = self._plan.n_read
        self.shape: "tuple[int, ...] | None" = self._plan.shape
        self.dtype: np.dtype = node.dtype

    #: The records' dtype before :meth:`_with_fields` narrowed them (set with ``_fields``).
    _whole_dtype: np.dtype

    @classmethod
    def _of_query(
        cls, dataset: Dataset, field: "str | None", method: str, kwargs: dict[str, Any], n_rows: "int | None", *, op: str
    ) -> "Request":
        """A request the readers answer by a PyTables call (NOTE [request protocol])."""
        self = cls.__new__(cls)
        node, _desc = dataset._field(field)
        self.dataset, self.field, self._node, self._op = dataset, field, node, op
        self._query = (method, kwargs)
        self._desc = describe_query(node, method, kwargs)
        self._post, self._post_view, self._nkey, self._plan, self._fields = (), True, (), None, None
        self._n_read = n_rows
        self.shape = None if n_rows is None else (n_rows,) + node.row_shape
        self.dtype = node.dtype
        return self

    def _then(self, key: Any, op: str) -> "Request":
        """This request, with ``key`` applied to its result in the consumer."""
        other = object.__new__(Request)
        other.__dict__.update(self.__dict__)
        other._op = op
        other._post = self._post + (key,)
        other._post_view = self._post_view and basic_key(key)
        if self.shape is not None:
            other.shape, other.dtype = indexed(self.shape, self.dtype, key)
        elif isinstance(key, str):
            other.dtype = indexed((0,), self.dtype, key)[1]
        return other

    @property
    def n_rows_read(self) -> "int | None":
        """Rows the readers write into the stage (None for a query only the read can tell)."""
        return self._n_read

    @property
    def zero_copy(self) -> bool:
        """Whether the result is a view of the stage (else it is gathered into private memory)."""
        return (self._plan is None or self._plan.view) and self._post_view

    @property
    def _col(self) -> "str | None":
        # The established requests' name for the column read.
        return self.field

    def _with_fields(self, names: "list[str] | None") -> "Request":
        """This request, its records narrowed to the fields ``names`` (a view, as numpy's; None: all)."""
        whole = self.dtype if self._fields is None else self._whole_dtype
        other = object.__new__(Request)
        other.__dict__.update(self.__dict__)
        other._fields = None if names is None else list(names)
        other._whole_dtype = whole
        other.dtype = whole if names is None else fields_dtype(whole, list(names))
        return other

    def __getitem__(self, key: Any) -> "Request":
        if field_list(key):
            return self._with_fields(key)
        if self._fields is not None:
            if isinstance(key, str) and key not in self._fields:
                raise ValueError(f"no field of name {key!r}: the request selects fields {self._fields}")
            plain = self._with_fields(None)[key]
            return plain if isinstance(key, str) else plain._with_fields(self._fields)
        op = next_op(self._op, key, self.field is None)
        if self._query is None and not self._post:
            if isinstance(key, str):
                if self.field is None and len(self._nkey) == 1 and self._nkey[0] is not None:
                    # records[k]['col'] reads only that column
                    first: object = self._nkey[0]  # a key of the records
                    if self._plan is not None and self._plan.local_key[-1] is Ellipsis:
                        first = (first, Ellipsis)  # records[i, ...]['col'] is 0-d, as numpy's
                    return Request(self.dataset, key, first, op=op, field_last=True)
                if self.dtype.names is None:
                    raise NoSuchFieldError(f"this request reads column {self.field!r}, which has no field {key!r}")
            else:
                shape = (self._node.n_rows,) + self._node.row_shape
                composed = compose_keys(self._nkey, shape, key)
                if composed is not None:
                    return Request(self.dataset, self.field, composed, op=op)
        return self._then(key, op)

    __reduce__ = not_pickled  # its readers and shared memory are this process's

    def __repr__(self) -> str:
        col = f" field={self.field!r}" if self.field is not None else ""
        col += f" fields={self._fields}" if self._fields is not None else ""
        what = f" {self._query[0]}()" if self._query is not None else ""
        return f"<multitables.Request {self.dataset.path!r}{col}{what} shape={self.shape} dtype={self.dtype}>"
