"""Puts solo-ext's configs on Hydra's search path for solo-learn's ``main_pretrain.py`` and
``main_linear.py`` (and solo-ext's own ``solo-ext-pretrain``, ``-linear`` and ``-knn``), so that

    python main_pretrain.py --config-name dscl.yaml
    python main_pretrain.py --config-name cifar100-lt/pbsd
    python main_linear.py --config-name cifar100-lt/dscl pretrained_feature_extractor=...

find them with no ``--config-path``. Hydra loads every module of the ``hydra_plugins`` namespace
package; the configs are appended after the application's own search path, so a config of the
same name that the application has wins. ``SOLO_EXT_AUTOLOAD=0`` switches it off.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

# the script (sys.argv[0]'s file name) -> the configs it reads
SCRIPTS = {
    "main_pretrain.py": "pretrain",
    "solo-ext-pretrain": "pretrain",
    "main_linear.py": "linear",
    "solo-ext-linear": "linear",
    "solo-ext-knn": "knn",
}


def scripts_dir() -> Path | None:
    """solo-ext's ``scripts/``: inside the installed package, or beside it in a source checkout."""
    import solo_ext  # cheap: no torch

    package = Path(solo_ext.__file__).resolve().parent
    for candidate in (package / "scripts", package.parent / "scripts"):
        if (candidate / "pretrain").is_dir():
            return candidate
    return None


# ``python -m solo_ext.<module>``: sys.argv[0] is the module's file
MODULES = {"pretrain.py": "pretrain", "linear.py": "linear", "knn.py": "knn"}


def configs_for(argv0: str) -> Path | None:
    """The config directory for the script ``argv0``, None for any other application."""
    kind = SCRIPTS.get(os.path.basename(argv0))
    if kind is None and os.path.basename(argv0) in MODULES:
        import solo_ext

        if Path(argv0).resolve().parent == Path(solo_ext.__file__).resolve().parent:
            kind = MODULES[os.path.basename(argv0)]
    if kind is None or os.environ.get("SOLO_EXT_AUTOLOAD", "1") == "0":
        return None
    root = scripts_dir()
    return None if root is None else root / kind


class SoloExtSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        configs = configs_for(sys.argv[0] if sys.argv else "")
        if configs is not None:
            search_path.append(provider="solo-ext", path=f"file://{configs}")
