"""Packaging is in pyproject.toml; this file only adds the build step that makes Spark find the connector.

Spark registers the Python data sources of the installed top-level modules named ``pyspark_*``,
which it lists with ``pkgutil.iter_modules()``: only real files in ``sys.path`` directories count.
A wheel installs ``pyspark_shoal.py`` into site-packages, but an editable install serves modules
through an import hook that ``iter_modules`` does not see. So in editable mode this step writes
the same small module into the editable wheel itself, and it lands in site-packages as a file.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

_ENTRY = "pyspark_shoal.py"


class BuildPyWithSparkEntry(build_py):
    """``build_py`` that, in an editable build, also installs ``pyspark_shoal.py`` as a real file."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            # editable_wheel points install_lib at the unpacked editable wheel's root (its purelib).
            wheel_root = Path(self.get_finalized_command("install").install_lib)
            source = Path(__file__).resolve().parent / _ENTRY
            (wheel_root / _ENTRY).write_bytes(source.read_bytes())


setup(cmdclass={"build_py": BuildPyWithSparkEntry})
