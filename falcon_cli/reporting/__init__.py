"""Reporting: figures drawn from a run's artifacts (e.g. the batch log)."""
