"""Shoal package."""
