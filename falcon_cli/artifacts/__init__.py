"""Artifacts: files whatever the process: atomic writers, versioned schemas and validating readers, the
checkpoint layout and state-dict files (the run directory, written by rank 0, is in ``runtime``)."""
