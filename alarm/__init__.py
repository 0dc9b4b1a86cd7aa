"""capalarm: a write-volume capacity alarm for confined workloads."""

__version__ = "0.1.0"
