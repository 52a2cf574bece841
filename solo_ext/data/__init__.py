"""Datasets and long-tail helpers for solo-ext."""
