"""solo-ext: long-tail-aware and dense contrastive learning methods for solo-learn.

Importing this package is cheap (no torch); `register()` pulls in the methods.
"""

__version__ = "0.1.0"


def register() -> dict:
    """Adds every solo-ext method to the active host's ``METHODS`` (``methods.registry``)."""
    from solo_ext.methods.registry import register as _register

    return _register()


__all__ = ["__version__", "register"]
