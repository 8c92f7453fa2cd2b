"""Artifacts: the run directory, versioned schemas, atomic writers and validating readers."""
