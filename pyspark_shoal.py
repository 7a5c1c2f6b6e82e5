"""Lets Spark find the ``shoal`` data source by itself: Spark imports installed modules named
``pyspark_*`` and registers their ``DefaultSource`` under ``DefaultSource.name()``."""

from shoal.client.spark import ShoalDataSource as DefaultSource

__all__ = ["DefaultSource"]
