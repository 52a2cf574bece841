"""What the console commands share: quiet Hydra, absolute ``--config-path``, one-line errors,
and the training stack imported only once Hydra has composed the config and the early checks
have passed (``--help``, ``--cfg job`` and a refused value are answered without it)."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from pathlib import Path

import hydra
from omegaconf import DictConfig

from solo_ext.config import one_line_errors

# the packaged defaults of the commands (solo_ext/conf/<command>.yaml)
CONF = str(Path(__file__).resolve().parent.parent / "conf")

# Hydra writes nothing and keeps the working directory, as solo-learn's configs ask for.
_HYDRA_QUIET = {
    "hydra.output_subdir": "null",
    "hydra.run.dir": ".",
    "hydra/job_logging": "disabled",
    "hydra/hydra_logging": "disabled",
}


def hydra_argv(argv: list[str]) -> list[str]:
    """Makes ``--config-path`` absolute (Hydra resolves a relative one against the installed
    module, not the shell's directory) and adds the quiet Hydra settings unless given, next to
    the given overrides (so that ``--cfg job`` may stand anywhere)."""
    out = [argv[0]]
    args = iter(argv[1:])
    for arg in args:
        if arg in ("--config-path", "-cp"):
            out += [arg, os.path.abspath(next(args, ""))]
        elif arg.startswith("--config-path="):
            out.append("--config-path=" + os.path.abspath(arg.split("=", 1)[1]))
        else:
            out.append(arg)
    overrides = [i for i, a in enumerate(out) if i and "=" in a and not a.startswith("-")]
    given = {out[i].split("=", 1)[0].lstrip("+~") for i in overrides}
    quiet = [f"{k}={v}" for k, v in _HYDRA_QUIET.items() if k not in given]
    # beside the given overrides (Hydra takes them as one run of arguments: after an option
    # such as ``--cfg job`` that follows them they would be refused), else at the end
    at = overrides[-1] + 1 if overrides else len(out)
    return out[:at] + quiet + out[at:]


def hydra_entry(
    prog: str,
    run: str,
    config_name: str | None = None,
    early: Callable[[DictConfig], None] | None = None,
):
    """The ``main()`` of a Hydra entry point: quiet Hydra, one-line errors, and the packaged
    defaults ``solo_ext/conf/<config_name>.yaml`` (none for solo-learn-style pretraining).
    ``run`` is named as ``"module:function"``: it is imported after ``early(cfg)``, the checks
    that need nothing of the training stack, has passed."""

    @hydra.main(
        version_base="1.2", config_path=CONF if config_name else None, config_name=config_name
    )
    def task(cfg: DictConfig) -> None:
        with one_line_errors(prog):
            if early is not None:
                early(cfg)
            module, _, name = run.partition(":")
            getattr(importlib.import_module(module), name)(cfg)

    def main() -> None:
        sys.argv = hydra_argv(sys.argv)
        task()

    return main
