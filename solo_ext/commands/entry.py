"""What the console commands share: quiet Hydra, absolute ``--config-path``, one-line errors,
their ``--help``, and the training stack imported only once Hydra has composed the config and
the early checks have passed (``--help``, ``--cfg job`` and a refused value are answered without
it)."""

from __future__ import annotations

import difflib
import importlib
import os
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import hydra
from omegaconf import DictConfig

from solo_ext.config import ConfigError, MissingKeyError, one_line_errors

# the packaged defaults of the commands (solo_ext/conf/<command>.yaml)
CONF = str(Path(__file__).resolve().parent.parent / "conf")

# Hydra writes nothing and keeps the working directory, as solo-learn's configs ask for.
_HYDRA_QUIET = {
    "hydra.output_subdir": "null",
    "hydra.run.dir": ".",
    "hydra/job_logging": "disabled",
    "hydra/hydra_logging": "disabled",
}
HELP_FLAGS = ("--help", "-h")


@dataclass(frozen=True)
class Help:
    """What a command's ``--help`` says: what it does, how it is called, and its recipes
    (``scripts/<recipes>/<dataset>/<method>.yaml``, named ``--config-name <dataset>/<method>``,
    e.g. ``example``)."""

    about: str
    usage: tuple[str, ...]
    recipes: str | None = None
    example: str | None = None


def recipe_lines(kind: str) -> list[str]:
    """The recipes of ``scripts/<kind>``, one line per dataset folder (``cifar100-lt: dscl,
    pbsd, ...``), and where they are; found as the search-path plugin finds them."""
    from hydra_plugins.solo_ext_configs import scripts_dir  # (no torch)

    root = scripts_dir()
    if root is None or not (root / kind).is_dir():
        return ["  (not installed with this copy of solo-ext: give --config-path <folder>)"]
    lines = [f"The recipes, files {root / kind}/<dataset>/<method>.yaml:"]
    for folder in sorted(p for p in (root / kind).iterdir() if p.is_dir()):
        names = sorted(p.stem for p in folder.glob("*.yaml"))
        if names and folder.name != "ext_defaults":  # (the defaults every recipe takes)
            lines.append(f"  {folder.name}: {', '.join(names)}")
    return lines


def help_template(prog: str, help_info: Help, with_config: bool) -> str:
    """Hydra's ``hydra.help.template`` for ``prog``: the command's own words, its recipes, and
    (``with_config``) the config that the other arguments compose, ``$CONFIG``."""
    lines = [*textwrap.wrap(f"{prog}: {help_info.about}", 92), "", "Usage:"]
    lines += [f"  {line}" for line in help_info.usage]
    if help_info.recipes is not None:
        lines += [
            "",
            f"Pick a recipe with --config-name <dataset>/<method>, e.g. {help_info.example}.",
            *recipe_lines(help_info.recipes),
        ]
    lines += [
        "",
        "Any key can be given on the command line (key=value; +key=value adds a key the config",
        "lacks); --cfg job prints the composed config without running.",
    ]
    if with_config:
        lines += ["", "== Config ==", "$CONFIG"]
    return "\n".join(lines).replace("$", "$$").replace("$$CONFIG", "$CONFIG") + "\n"


def _quoted(text: str) -> str:
    """``text`` as a quoted value of Hydra's override grammar."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def hydra_argv(argv: list[str], help_template: str | None = None) -> list[str]:
    """Makes ``--config-path`` absolute (Hydra resolves a relative one against the installed
    module, not the shell's directory) and adds the quiet Hydra settings unless given, next to
    the given overrides (so that ``--cfg job`` may stand anywhere); with ``--help``, the
    command's ``help_template`` too."""
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
    settings = dict(_HYDRA_QUIET)
    if help_template is not None and any(a in HELP_FLAGS for a in out[1:]):
        settings["hydra.help.template"] = _quoted(help_template)
    quiet = [f"{k}={v}" for k, v in settings.items() if k not in given]
    # beside the given overrides (Hydra takes them as one run of arguments: after an option
    # such as ``--cfg job`` that follows them they would be refused), else at the end
    at = overrides[-1] + 1 if overrides else len(out)
    return out[:at] + quiet + out[at:]


def names_a_config(argv: list[str]) -> bool:
    """Whether the command line names a config (``--config-name``)."""
    return any(a in ("--config-name", "-cn") or a.startswith("--config-name=") for a in argv)


def _config_name_at(argv: list[str]) -> tuple[int, str, str] | None:
    """Where the command line names its config: (index, the name, the argument's prefix)."""
    for i, arg in enumerate(argv):
        if arg in ("--config-name", "-cn") and i + 1 < len(argv):
            return i + 1, argv[i + 1], ""
        if arg.startswith("--config-name="):
            return i, arg.split("=", 1)[1], "--config-name="
    return None


def recipe_names(kind: str) -> list[str]:
    """The names ``--config-name`` takes for the recipes of ``scripts/<kind>``
    (``<dataset>/<method>``, and the short names of the folder itself), and the commands'
    packaged defaults."""
    from hydra_plugins.solo_ext_configs import scripts_dir  # (no torch)

    root = scripts_dir() / kind
    names = [p.stem for p in Path(CONF).glob("*.yaml")] + [p.stem for p in root.glob("*.yaml")]
    return names + [
        f"{p.parent.name}/{p.stem}"
        for p in root.glob("*/*.yaml")
        if p.parent.name != "ext_defaults"
    ]


def resolve_config_name(prog: str, argv: list[str], kind: str) -> list[str]:
    """``argv`` with its ``--config-name`` checked against the recipes of ``scripts/<kind>``
    (a name with ``--config-path`` is left to Hydra). An evaluation config named by the run's
    method (``<dataset>/<method>`` where the dataset has one ``kind`` config, e.g.
    ``cifar100-lt/pbsd`` for ``solo-ext-linear``) is that config; any other unknown name is a
    ConfigError naming the closest recipes and their folder."""
    from hydra_plugins.solo_ext_configs import scripts_dir  # (no torch)

    at = _config_name_at(argv)
    if (
        at is None
        or scripts_dir() is None
        or any(a.startswith(("--config-path", "-cp")) for a in argv)
    ):
        return argv
    i, given, prefix = at
    name = given.removesuffix(".yaml")
    names = recipe_names(kind)
    if name in names:
        return argv
    folder = scripts_dir() / kind / name.split("/")[0]
    own = sorted(folder.glob("*.yaml")) if "/" in name and kind != "pretrain" else []
    if len(own) == 1:  # the data set's one evaluation config: every method's run takes it
        resolved = f"{folder.name}/{own[0].stem}"
        print(f"{prog}: {name} is {resolved}, {folder.name}'s {kind} config", file=sys.stderr)
        return [*argv[:i], prefix + resolved, *argv[i + 1 :]]
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
    hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
    raise ConfigError(
        f"--config-name={given}: no such recipe{hint}; the recipes are the files under "
        f"{scripts_dir() / kind} ({prog} --help lists them)"
    )


def method_kwargs_anyway(argv: list[str]) -> list[str]:
    """``method_kwargs.<key>=<value>`` given without ``+`` is set whether or not the recipe
    lists the key (``++``): the method's own check then takes every declared key and names the
    closest one for a typo, in one line, instead of Hydra's struct error."""
    return ["++" + a if a.startswith("method_kwargs.") and "=" in a else a for a in argv]


def hydra_entry(
    prog: str,
    run: str,
    config_name: str | None = None,
    early: Callable[[DictConfig], None] | None = None,
    help_info: Help | None = None,
):
    """The ``main()`` of a Hydra entry point: quiet Hydra, one-line errors, its ``--help``, and
    the packaged defaults ``solo_ext/conf/<config_name>.yaml`` (none for solo-learn-style
    pretraining: started without ``--config-name`` and without a key a recipe gives, it says
    to pass one). ``run`` is named as ``"module:function"``: it is imported after
    ``early(cfg)``, the checks that need nothing of the training stack, has passed."""

    @hydra.main(
        version_base="1.2", config_path=CONF if config_name else None, config_name=config_name
    )
    def task(cfg: DictConfig) -> None:
        with one_line_errors(prog):
            if early is not None:
                try:
                    early(cfg)
                except MissingKeyError as err:
                    if config_name is not None or help_info is None or not help_info.recipes:
                        raise
                    from hydra.core.hydra_config import HydraConfig

                    if HydraConfig.get().job.config_name is not None:
                        raise
                    raise no_recipe(str(err)) from None
            module, _, name = run.partition(":")
            getattr(importlib.import_module(module), name)(cfg)

    def no_recipe(why: str) -> ConfigError:
        return ConfigError(
            f"no recipe given ({why}): pass --config-name <dataset>/<method>, e.g. "
            f"--config-name {help_info.example} ({prog} --help lists the recipes)"
        )

    def main() -> None:
        argv = sys.argv[1:]
        if config_name is None and help_info is not None and not names_a_config(argv):
            # a recipe's key set without a recipe: Hydra would refuse it in several lines
            plain = [a for a in argv if "=" in a and not a.startswith(("-", "+", "~", "hydra"))]
            if plain:
                with one_line_errors(prog):
                    raise no_recipe(f"{plain[0]} sets a recipe's key")
        if help_info is not None and help_info.recipes is not None:
            with one_line_errors(prog):
                argv = resolve_config_name(prog, argv, help_info.recipes)
        if config_name is None:  # (pretraining: the recipes' method_kwargs)
            argv = method_kwargs_anyway(argv)
        sys.argv = [sys.argv[0], *argv]
        template = None
        if help_info is not None and any(a in HELP_FLAGS for a in sys.argv[1:]):
            with_config = config_name is not None or names_a_config(sys.argv[1:])
            template = help_template(prog, help_info, with_config)
        sys.argv = hydra_argv(sys.argv, template)
        task()

    return main
