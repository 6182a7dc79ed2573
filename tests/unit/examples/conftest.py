"""Fixtures: the process-group worlds of tests/parallel_worlds.py."""

from parallel_worlds import fake_world, gloo_world

__all__ = ["fake_world", "gloo_world"]
