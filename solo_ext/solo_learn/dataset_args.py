"""``solo.args.dataset``: ``main_knn.py --dataset`` takes solo-ext's datasets too."""

from __future__ import annotations

import argparse
import functools
from types import ModuleType

from solo_ext.facts import SOLO_EXT_ONLY
from solo_ext.solo_learn.check import Need, function


# the names of the solo-learn module this patch needs (checked before it applies)
def _dataset_choices(module: ModuleType) -> bool:
    """``dataset_args(parser)`` adds ``--dataset`` with a list of choices (argparse's private
    ``_option_string_actions`` is how the patches reach it)."""
    parser = argparse.ArgumentParser(add_help=False)
    try:
        module.dataset_args(parser)
        action = parser._option_string_actions["--dataset"]
    except Exception:  # noqa: BLE001  (any failure: the contract is not there)
        return False
    return isinstance(action.choices, list | tuple)


NEEDS = (
    function("dataset_args", "parser"),
    Need("dataset_args(parser) adding --dataset with choices", _dataset_choices),
)


def apply(module: ModuleType) -> None:
    original = module.dataset_args

    @functools.wraps(original)
    def dataset_args(parser):
        original(parser)
        action = parser._option_string_actions["--dataset"]
        action.choices = [*action.choices, *(n for n in SOLO_EXT_ONLY if n not in action.choices)]

    module.dataset_args = dataset_args
