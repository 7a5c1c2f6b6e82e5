"""``python -m shoal.node`` = ``shoal node``."""

from .cli import node_command

node_command()  # pylint: disable=no-value-for-parameter
