"""Port choice for local clusters: the layout stays clear of ports the kernel lends out."""

from __future__ import annotations

import pytest

from shoal.cluster.launcher import _ephemeral_low, _ports_of, free_base_port


@pytest.mark.parametrize(("nodes", "partitions"), [(1, 2), (3, 4), (3, 8), (5, 8)])
def test_free_base_port_keeps_the_layout_below_the_ephemeral_range(nodes: int, partitions: int) -> None:
    ephemeral = _ephemeral_low()
    span = max(_ports_of(20_000, nodes, partitions)) - 20_000
    # Where the ephemeral range starts too low to stay under it, any free layout in range will do.
    top = ephemeral if ephemeral - span > 21_000 else 55_000 + span
    for _ in range(20):
        base = free_base_port(nodes, partitions)
        assert 20_000 <= base and max(_ports_of(base, nodes, partitions)) < top
