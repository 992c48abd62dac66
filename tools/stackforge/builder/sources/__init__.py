"""Upstream trees on the host: fetched, exported, patched, reused, normalised, and held to their own pins."""
