"""``python -m shoal.node`` = ``shoal node`` (the command is :mod:`shoal.cli.node`'s)."""

from shoal.cli.node import node_command

node_command()  # pylint: disable=no-value-for-parameter
