"""The Spark connector: a PySpark Python Data Source named ``shoal``.

    df.write.format("shoal").option("seeds", "h1:6789,h2:6789").option("queue", "q").mode("append").save()
    spark.read.format("shoal").option("seeds", ...).option("queue", "q").load()
    spark.readStream.format("shoal").option("seeds", ...).option("queue", "events").load()

After ``pip install 'shoal[spark]'`` Spark finds it by itself (the installed module
``pyspark_shoal`` exports it as ``DefaultSource``); ``spark.dataSource.register(ShoalDataSource)``
also works. Options and guarantees: ``docs/spark.md``.
"""

from __future__ import annotations

import uuid

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, DataSourceWriter
from pyspark.sql.types import StructType

from ._cluster import connected, discover_shards, queue_type_of
from ._convert import job_schema, log_schema
from ._options import (OptionError, bool_option, parse_connect, parse_read, parse_stream, parse_write,
                       queue_type_option)
from ._read import ShoalBatchReader, ShoalPushdownReader
from ._stream import ShoalJobStreamReader, ShoalLogStreamReader
from ._write import ShoalCommitMessage, ShoalWriter

__all__ = ["ShoalDataSource", "ShoalWriter", "ShoalCommitMessage", "OptionError"]


class ShoalDataSource(DataSource):
    """``format("shoal")``: batch write, batch read and streaming read of a Shoal queue."""

    @classmethod
    def name(cls) -> str:
        return "shoal"

    def _shards_and_type(self) -> tuple[int | None, str]:
        """The queue's shard count (option ``shards`` or discovered) and type (``jobs``/``log``)."""
        connect = parse_connect(self.options)
        given = queue_type_option(self.options)
        shards = connect.shards
        if shards is not None and given is not None:
            return shards, given
        with connected(connect) as client:
            if shards is None:
                shards = discover_shards(client, connect.queue)
            kind = given or queue_type_of(client, connect.queue_names(shards)[0]) or "jobs"
        return shards, kind

    def _data_format(self) -> str:
        return str(self.options.get("dataFormat") or "msgpack")

    def schema(self) -> StructType:
        """Jobs: id, queue, state, priority, data, attempts, …; logs: queue, shard, seq, data, tag, created_at."""
        kind = queue_type_option(self.options)
        if kind is None:
            kind = self._shards_and_type()[1]
        return log_schema(self._data_format()) if kind == "log" else job_schema(self._data_format())

    def reader(self, schema: StructType) -> DataSourceReader:
        shards, kind = self._shards_and_type()
        options = parse_read(self.options, kind)
        cls = ShoalPushdownReader if bool_option(self.options, "filterPushdown", False) else ShoalBatchReader
        return cls(options, shards, schema)

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
        shards, kind = self._shards_and_type()
        options = parse_stream(self.options, kind)
        if kind == "log":
            return ShoalLogStreamReader(options, shards, schema)
        return ShoalJobStreamReader(options, shards, schema)
