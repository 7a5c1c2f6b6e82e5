"""The ``shoal`` console command: a composition root over every package's commands."""

from .main import main

__all__ = ["main"]
