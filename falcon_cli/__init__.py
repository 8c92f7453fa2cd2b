"""falcon: false-negative-aware vision-language pretraining (FALCON and its baselines)."""

__version__ = "0.3.0"
