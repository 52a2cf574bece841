"""Packaged default configs of the evaluation entry points (Hydra)."""
