"""The shipped recipes against the official runs they follow.

``runs.yaml`` holds, as data, the effective values of each official run (what its
scripts actually train with: the absolute lr for its total batch, the lr in given epochs, every
flag), each with the file and line it comes from, and the shipped recipes that follow it;
:func:`effective.effective_values` computes the same values from a recipe resolved by either
entry point's ``parse_cfg``. ``tests/test_official_runs.py`` holds each recipe to its run: a value
that differs must be named in the recipe's header, under ``Differs from the official run``.
"""
