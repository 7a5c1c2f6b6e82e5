"""The Spark connector: a PySpark Python Data Source named ``shoal``.

    df.write.format("shoal").option("seeds", "h1:6789,h2:6789").option("queue", "q").mode("append").save()
    spark.read.format("shoal").option("seeds", ...).option("queue", "q").load()
    spark.readStream.format("shoal").option("seeds", ...).option("queues", "clicks,views").load()

After ``pip install 'shoal[spark]'`` (or an editable install) Spark finds it by itself from any
directory: the installed file ``pyspark_shoal.py`` exports it as ``DefaultSource``;
``spark.dataSource.register(ShoalDataSource)`` also works. Options follow the Kafka source's
names (``startingOffsets``, ``maxOffsetsPerTrigger``, …); options and guarantees: ``docs/spark.md``.
"""

from __future__ import annotations

import uuid

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, DataSourceWriter
from pyspark.sql.types import StructType

from ._cluster import Layout, connected, discover_shards, queue_type_of, resolve_layout, wire_names
from ._convert import job_schema, log_schema
from ._options import (OptionError, bool_option, parse_connect, parse_read, parse_stream, parse_write,
                       queue_type_option)
from ._read import ShoalBatchReader, ShoalPushdownReader
from ._stream import ShoalJobStreamReader, ShoalLogStreamReader
from ._write import ShoalCommitMessage, ShoalWriter

__all__ = ["ShoalDataSource", "ShoalWriter", "ShoalCommitMessage", "OptionError"]


class ShoalDataSource(DataSource):
    """``format("shoal")``: batch write to a Shoal queue, batch and streaming reads of one or more."""

    @classmethod
    def name(cls) -> str:
        return "shoal"

    def _layout_and_type(self) -> tuple[Layout, str]:
        """The queues read (each with its shard count) and their type (``jobs``/``log``, all the same)."""
        connect = parse_connect(self.options, many=True)
        given = queue_type_option(self.options)
        with connected(connect) as client:
            layout = resolve_layout(client, connect)
            kinds = {q: given or queue_type_of(client, wire_names(q, k)[0]) or "jobs" for q, k in layout}
        if len(set(kinds.values())) > 1:
            raise OptionError("options queues/queuePattern: the queues must all be log queues or all job queues "
                              f"({', '.join(f'{q}: {t}' for q, t in kinds.items())})")
        return layout, next(iter(kinds.values()))

    def _data_format(self) -> str:
        return str(self.options.get("dataFormat") or "msgpack")

    def schema(self) -> StructType:
        """Jobs: id, queue, state, priority, data, attempts, …; logs: queue, shard, seq, data, tag, created_at."""
        kind = queue_type_option(self.options)
        if kind is None:
            kind = self._layout_and_type()[1]
        return log_schema(self._data_format()) if kind == "log" else job_schema(self._data_format())

    def reader(self, schema: StructType) -> DataSourceReader:
        layout, kind = self._layout_and_type()
        options = parse_read(self.options, kind)
        cls = ShoalPushdownReader if bool_option(self.options, "filterPushdown", False) else ShoalBatchReader
        return cls(options, layout, schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """Append only: a queue cannot be overwritten (jobs may already be running)."""
        if overwrite:
            raise OptionError("mode overwrite: a Shoal queue only takes appends (use mode('append'))")
        options = parse_write(self.options, uuid.uuid4().hex)
        shards = options.connect.shards
        if shards is None:
            with connected(options.connect) as client:
                shards = discover_shards(client, options.connect.queue)
        return ShoalWriter(options, shards)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802 (Spark's name)
        layout, kind = self._layout_and_type()
        options = parse_stream(self.options, kind)
        if kind == "log":
            return ShoalLogStreamReader(options, layout, schema)
        return ShoalJobStreamReader(options, layout, schema)
