"""Shoal's Raft layer: the only code that talks to pysyncobj, and Shoal's own storage under it."""
