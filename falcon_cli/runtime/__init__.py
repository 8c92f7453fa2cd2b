"""The running process: devices and precision, ranks, the run directory and its lock, checkpoints, metrics,
progress display, profiling and the Hugging Face hub (docs/architecture.md: the layer above ``artifacts``)."""
