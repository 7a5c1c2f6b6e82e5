"""Lets Spark find the ``shoal`` data source by itself: Spark imports the installed top-level modules
named ``pyspark_*`` and registers their ``DefaultSource`` under ``DefaultSource.name()``.

A wheel installs this file into site-packages; an editable install writes a copy there too
(``setup.py``), because Spark lists modules with ``pkgutil.iter_modules``, which does not see
the editable import hook.
"""

try:
    from shoal.client.spark import ShoalDataSource as DefaultSource
except ImportError as exc:  # the stub is installed but the package (or pyspark/pyarrow) is not importable
    raise ImportError(
        f"pyspark_shoal: cannot import shoal.client.spark ({exc}); install 'shoal[spark]' in the interpreter "
        "Spark's Python workers run (PYSPARK_PYTHON), or register the source explicitly with "
        "spark.dataSource.register(shoal.client.spark.ShoalDataSource)") from exc

__all__ = ["DefaultSource"]
