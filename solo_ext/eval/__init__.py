"""Evaluation: kNN and linear probes of frozen backbones."""
