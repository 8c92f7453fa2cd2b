"""Runtime helpers: progress display, logging, distributed rank information."""
