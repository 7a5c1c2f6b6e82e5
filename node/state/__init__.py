"""The deterministic queue engine (no I/O, no clock, no randomness): see ``_core``'s docstring."""

from ._core import DEFAULTS, QUEUE_PRESETS, Job, PartitionEngine
from ._transitions import STATES, TARANTOOL_CODES, TRANSITIONS

__all__ = ["PartitionEngine", "Job", "DEFAULTS", "QUEUE_PRESETS", "STATES", "TRANSITIONS", "TARANTOOL_CODES"]
