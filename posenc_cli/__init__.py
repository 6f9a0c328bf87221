"""posenc: position encodings for Transformers, one library, one attention module."""

__version__ = "0.1.0"
