"""Arrow columns → the MessagePack bytes of PUSHB job items, built column-wise.

A task's rows never become Python objects: every column is encoded for all rows
at once with NumPy and Arrow compute kernels (headers from the value lengths,
fixed-width numbers from the values' big-endian bytes), and the items
``{data: …, idempotencyKey: "<writeId>:<partition>:<row>"}`` are joined element-wise
into one binary array whose data buffer *is* the concatenation of the items. A
PUSHB's ``jobs`` is then an array header plus a slice of that buffer, spliced
into the frame verbatim (a codec ``Raw``). The node keeps each item's ``data``
bytes as they arrive, so what a reader gets back is exactly these bytes.

Covered: the whole row as a map of primitive columns (integers, floats, booleans,
strings, binaries, nulls), or one data column that is a string, binary, or
MessagePack bytes (``dataFormat=msgpack``). Anything else — nested or temporal
columns, ``json`` data, per-row job fields (priority, group, …) — goes through
:class:`~shoal.client.spark._convert.RowsToJobs` row by row. Integers are written
as 8-byte MessagePack integers and floats at their own width: valid MessagePack
that every reader decodes to the same values, just not always the shortest form.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ._options import WriteOptions

__all__ = ["ColumnPacker", "packable", "pack_items", "array_header", "encode_column"]

_BIN = pa.large_binary()
_NIL = pa.scalar(b"\xc0", _BIN)
_EMPTY = pa.scalar(b"", _BIN)
_ITEM_HEAD = pa.scalar(b"\x82\xa4data", _BIN)             # fixmap(2), "data"
_KEY_HEAD = pa.scalar(b"\xaeidempotencyKey", _BIN)        # "idempotencyKey"


def _from_parts(offsets: np.ndarray, data: np.ndarray) -> pa.Array:
    """A large_binary array from int64 offsets (n + 1) and a uint8 data buffer."""
    return pa.Array.from_buffers(_BIN, len(offsets) - 1,
                                 [None, pa.py_buffer(offsets.astype(np.int64, copy=False)), pa.py_buffer(data)])


def _fixed(head: int, body: np.ndarray) -> pa.Array:
    """Each row: one type byte then ``body``'s row (an (n, w) uint8 matrix)."""
    n, width = body.shape
    out = np.empty((n, width + 1), dtype=np.uint8)
    out[:, 0] = head
    out[:, 1:] = body
    return _from_parts(np.arange(0, (width + 1) * (n + 1), width + 1, dtype=np.int64), out.reshape(-1))


def _length_headers(lengths: np.ndarray, binary: bool) -> pa.Array:
    """MessagePack str (or bin) headers for values of ``lengths`` bytes, one binary value per row."""
    n = len(lengths)
    lengths = lengths.astype(np.int64, copy=False)
    if binary:
        sizes = np.where(lengths < 256, 2, np.where(lengths < 65536, 3, 5))
    else:
        sizes = np.where(lengths < 32, 1, np.where(lengths < 256, 2, np.where(lengths < 65536, 3, 5)))
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    buf = np.zeros(int(offsets[-1]), dtype=np.uint8)
    pos = offsets[:-1]
    tiny = sizes == 1
    buf[pos[tiny]] = 0xA0 | lengths[tiny]
    one = sizes == 2
    buf[pos[one]] = 0xC4 if binary else 0xD9
    buf[pos[one] + 1] = lengths[one]
    two = sizes == 3
    buf[pos[two]] = 0xC5 if binary else 0xDA
    buf[pos[two] + 1] = lengths[two] >> 8
    buf[pos[two] + 2] = lengths[two] & 0xFF
    four = sizes == 5
    buf[pos[four]] = 0xC6 if binary else 0xDB
    for i in range(4):
        buf[pos[four] + 1 + i] = (lengths[four] >> (8 * (3 - i))) & 0xFF
    return _from_parts(offsets, buf)


def _with_nulls(source: pa.Array, encoded: pa.Array) -> pa.Array:
    if source.null_count == 0:
        return encoded
    return pc.if_else(pc.is_null(source), _NIL, encoded)


def encode_column(column: pa.Array, *, raw: bool = False) -> pa.Array | None:
    """Each value of ``column`` as its MessagePack bytes (a large_binary array), or ``None`` when the
    type is not one this module encodes. ``raw``: the values already are MessagePack (spliced as is)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    t = column.type
    n = len(column)
    if raw:
        if not (pa.types.is_binary(t) or pa.types.is_large_binary(t)):
            return None
        return _with_nulls(column, column.cast(_BIN).fill_null(b""))
    if pa.types.is_null(t):
        return _from_parts(np.arange(n + 1, dtype=np.int64), np.full(n, 0xC0, dtype=np.uint8))
    if pa.types.is_boolean(t):
        flags = column.fill_null(False).to_numpy(zero_copy_only=False)
        encoded = _from_parts(np.arange(n + 1, dtype=np.int64), np.where(flags, 0xC3, 0xC2).astype(np.uint8))
        return _with_nulls(column, encoded)
    if pa.types.is_integer(t):
        values = column.fill_null(0).to_numpy(zero_copy_only=False)
        signed = pa.types.is_signed_integer(t)
        body = values.astype(">i8" if signed else ">u8").view(np.uint8).reshape(n, 8)
        return _with_nulls(column, _fixed(0xD3 if signed else 0xCF, body))
    if pa.types.is_floating(t) and t.bit_width in (32, 64):
        values = column.fill_null(0).to_numpy(zero_copy_only=False)
        if t.bit_width == 32:
            body = values.astype(">f4").view(np.uint8).reshape(n, 4)
            return _with_nulls(column, _fixed(0xCA, body))
        body = values.astype(">f8").view(np.uint8).reshape(n, 8)
        return _with_nulls(column, _fixed(0xCB, body))
    is_text = pa.types.is_string(t) or pa.types.is_large_string(t)
    is_bytes = pa.types.is_binary(t) or pa.types.is_large_binary(t)
    if is_text or is_bytes:
        lengths = pc.binary_length(column).fill_null(0).to_numpy(zero_copy_only=False)
        values = column.cast(pa.large_string() if is_text else _BIN).cast(_BIN).fill_null(b"")
        encoded = pc.binary_join_element_wise(_length_headers(lengths, binary=is_bytes), values, _EMPTY)
        return _with_nulls(column, encoded)
    return None


def _key_bytes(name: str) -> bytes:
    raw = name.encode("utf-8")
    if len(raw) < 32:
        return bytes([0xA0 | len(raw)]) + raw
    if len(raw) < 256:
        return bytes([0xD9, len(raw)]) + raw
    return bytes([0xDA]) + len(raw).to_bytes(2, "big") + raw


def _map_header(entries: int) -> bytes:
    return bytes([0x80 | entries]) if entries < 16 else bytes([0xDE]) + entries.to_bytes(2, "big")


def array_header(count: int) -> bytes:
    """The MessagePack header of an array of ``count`` items."""
    if count < 16:
        return bytes([0x90 | count])
    if count < 65536:
        return bytes([0xDC]) + count.to_bytes(2, "big")
    return bytes([0xDD]) + count.to_bytes(4, "big")


def packable(options: WriteOptions, schema: pa.Schema) -> bool:
    """Whether rows of ``schema`` written with ``options`` can be packed column-wise."""
    o = options
    if any(c is not None for c in (o.priority_column, o.delay_column, o.group_column, o.custom_id_column,
                                   o.tag_column)) or o.dedupe != "idempotencyKey":
        return False
    empty = pa.RecordBatch.from_pylist([], schema=schema)
    if o.data_column is None:
        return len(schema) > 0 and all(encode_column(empty.column(i)) is not None for i in range(len(schema)))
    if o.data_column not in schema.names:
        return False
    column = empty.column(schema.get_field_index(o.data_column))
    if o.data_format == "msgpack":
        return encode_column(column, raw=True) is not None
    if o.data_format == "value":
        return encode_column(column) is not None
    return False  # json: each value must be parsed


def _data_column(options: WriteOptions, batch: pa.RecordBatch) -> pa.Array:
    o = options
    if o.data_column is not None:
        column = batch.column(batch.schema.get_field_index(o.data_column))
        encoded = encode_column(column, raw=o.data_format == "msgpack")
        assert encoded is not None
        return encoded
    parts: list[pa.Array | pa.Scalar] = [pa.scalar(_map_header(batch.num_columns), _BIN)]
    for i, name in enumerate(batch.schema.names):
        encoded = encode_column(batch.column(i))
        assert encoded is not None
        parts += [pa.scalar(_key_bytes(name), _BIN), encoded]
    return pc.binary_join_element_wise(*parts, _EMPTY)


def pack_items(options: WriteOptions, batch: pa.RecordBatch, key_prefix: str, first_index: int) -> pa.Array:
    """The PUSHB items of ``batch``'s rows (numbered from ``first_index``), as a large_binary array."""
    data = _data_column(options, batch)
    index = pa.array(np.arange(first_index, first_index + batch.num_rows, dtype=np.int64)).cast(pa.string())
    keys = pc.binary_join_element_wise(pa.scalar(key_prefix), index, pa.scalar(""))
    key_column = encode_column(keys)
    assert key_column is not None
    return pc.binary_join_element_wise(_ITEM_HEAD, data, _KEY_HEAD, key_column, _EMPTY)


class ColumnPacker:
    """Collects packed items per target (sub-)queue and cuts them into PUSHB ``jobs`` arrays of
    ``batch_size`` items: ``(target, count, packed array bytes)``."""

    def __init__(self, names: Sequence[str], partition_id: int, batch_size: int) -> None:
        self.names = list(names)
        self.partition_id = partition_id
        self.batch_size = batch_size
        self._pending: dict[str, tuple[int, list[bytes]]] = {}

    def _routes(self, items: pa.Array, first_index: int) -> list[tuple[str, pa.Array]]:
        k = len(self.names)
        if k == 1:
            return [(self.names[0], items)]
        # Row i goes to shard (partition + index) % k, as in RowsToJobs: a retried task hits the same shard.
        routes = []
        first_shard = (self.partition_id + first_index) % k
        for step in range(k):
            rows = np.arange(step, len(items), k, dtype=np.int64)
            if len(rows):
                routes.append((self.names[(first_shard + step) % k], items.take(pa.array(rows))))
        return routes

    def add(self, items: pa.Array, first_index: int) -> list[tuple[str, int, bytes]]:
        """Queue ``items`` (rows from ``first_index``); returns the full batches now ready."""
        ready: list[tuple[str, int, bytes]] = []
        for target, part in self._routes(items, first_index):
            if part.offset != 0:
                part = part.take(pa.array(np.arange(len(part), dtype=np.int64)))
            offsets = np.frombuffer(part.buffers()[1], dtype=np.int64, count=len(part) + 1)
            data = part.buffers()[2]
            view = memoryview(data) if data is not None else memoryview(b"")
            count, pieces = self._pending.get(target, (0, []))
            i, n = 0, len(part)
            while i < n:
                take = min(self.batch_size - count, n - i)
                pieces.append(bytes(view[offsets[i]:offsets[i + take]]))
                count += take
                i += take
                if count == self.batch_size:
                    ready.append((target, count, array_header(count) + b"".join(pieces)))
                    count, pieces = 0, []
            self._pending[target] = (count, pieces)
        return ready

    def rest(self) -> list[tuple[str, int, bytes]]:
        """The partial batches left at the end of the task."""
        out = [(t, c, array_header(c) + b"".join(p)) for t, (c, p) in self._pending.items() if c]
        self._pending.clear()
        return out
