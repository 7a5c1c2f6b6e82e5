"""A seeded simulation of whole replicas of one partition (see :mod:`.cluster`)."""
