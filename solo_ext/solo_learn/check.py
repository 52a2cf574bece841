"""What the patches need of solo-learn, checked when each patch is applied, and the one line that
stops a config using solo-ext when a need is missing.

solo-learn has no plugin interface beyond its method registry: ``solo_ext.solo_learn``
and the method registration rely on names (some private) of a few solo-learn modules. Each is
declared here (:data:`NEEDS`) and looked for before its module is patched. When one is missing (a
solo-learn that renamed it), nothing of that module is patched, the name is recorded
(:data:`BROKEN`), and any config that uses a solo-ext method, dataset or key stops in one line
naming solo-learn's version (and commit, when known) and the missing name: never a run without
the sampler, dataset or metrics it asked for. Configs that use none of solo-ext still run.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from solo_ext.facts import SOLO_EXT_ONLY
from solo_ext.runs.environment import solo_learn_version

# the solo-learn release and commit the patches are tested with (README, "Inside a real solo-learn
# checkout")
TESTED_WITH = ("1.0.6", "9187ea3")


@dataclass(frozen=True)
class Need:
    """A name of a solo-learn module the patches rely on; ``present(module)`` looks for it
    (and, where the patches depend on it, for its parameters or the globals it calls)."""

    name: str
    present: Callable[[ModuleType], bool]


def attribute(name: str, kind: type | None = None) -> Need:
    return Need(
        name, lambda m: hasattr(m, name) and (kind is None or isinstance(getattr(m, name), kind))
    )


def function(name: str, *params: str) -> Need:
    """``name(*params)``: a callable whose signature has these parameters, in this order."""

    def present(module: ModuleType) -> bool:
        fn = getattr(module, name, None)
        if not callable(fn):
            return False
        names = list(inspect.signature(fn).parameters)
        return names[: len(params)] == list(params)

    return Need(f"{name}({', '.join(params)})", present)


def calls_globals(name: str, *called: str) -> Need:
    """``name`` looks ``called`` up among its module's globals, so patching those reaches it."""

    def present(module: ModuleType) -> bool:
        code = getattr(getattr(module, name, None), "__code__", None)
        return code is not None and set(called) <= set(code.co_names)

    return Need(f"{name} calling {', '.join(called)} through the module", present)


def method_of(cls_name: str, *methods: str) -> Need:
    """``cls_name`` defines ``methods`` itself (or through a solo-learn base class), not only
    through Lightning's defaults."""

    def present(module: ModuleType) -> bool:
        cls = getattr(module, cls_name, None)
        if not isinstance(cls, type):
            return False
        package = module.__name__.split(".")[0]
        own = [vars(k) for k in cls.__mro__ if k.__module__.split(".")[0] == package]
        return all(any(callable(d.get(m)) for d in own) for m in methods)

    return Need(f"{cls_name}.{', '.join(methods)}", present)


def sets(cls_name: str, method: str, *attributes: str) -> Need:
    """``cls_name.method`` sets these attributes (the patches set them instead on a resume)."""

    def present(module: ModuleType) -> bool:
        fn = getattr(getattr(module, cls_name, None), method, None)
        code = getattr(fn, "__code__", None)
        return code is not None and set(attributes) <= set(code.co_names)

    return Need(f"{cls_name}.{method} setting {', '.join(attributes)}", present)


# module -> what is missing there ("<module> has no <need>", or why the methods could not be
# registered), in the order found
BROKEN: dict[str, str] = {}


def record_broken(module: str, what: str) -> None:
    """Records that the patches cannot work: ``what`` is missing for ``module``."""
    BROKEN.setdefault(module, what)


def needs_of(target: str) -> tuple[Need, ...]:
    """What the patch of the solo-learn module ``target`` needs (its module's ``NEEDS``)."""
    from solo_ext.solo_learn import PATCHES

    return importlib.import_module(f"solo_ext.solo_learn.{PATCHES[target]}").NEEDS


def missing(module: ModuleType) -> str | None:
    """The first need of ``module`` that it lacks, None when it has them all."""
    for need in needs_of(module.__name__):
        try:
            ok = need.present(module)
        except (TypeError, ValueError):  # a signature inspect cannot read
            ok = False
        if not ok:
            return need.name
    return None


def solo_ext_use(cfg: Any) -> str | None:
    """The first solo-ext method, dataset or key a (Hydra) config uses, as ``key=value``; None
    for a config of solo-learn alone."""
    from omegaconf import OmegaConf

    from solo_ext.data.options import LT_OPTIONS, SYNTHETIC_OPTIONS
    from solo_ext.methods.registry import SOLO_EXT_METHODS

    if not OmegaConf.is_config(cfg):
        cfg = OmegaConf.create(cfg)

    def get(key: str) -> Any:
        return OmegaConf.select(cfg, key, default=None)

    checks = [
        ("method", lambda v: v in SOLO_EXT_METHODS),
        ("pretrain_method", lambda v: v in SOLO_EXT_METHODS),
        ("data.dataset", lambda v: v in SOLO_EXT_ONLY),
        ("backbone.name", lambda v: v == "cifar_resnet32"),
        ("data.sampler", lambda v: v is not None),
        ("backbone.kwargs.small_image_stem", lambda v: v is not None),
        ("backbone_bn", lambda v: v is not None),
        ("classifier_init", lambda v: v is not None),
        ("train_augmentation", lambda v: v is not None),
        *((f"data.{k}", lambda v: v is not None) for k in LT_OPTIONS),
        *((f"data.synthetic.{k}", lambda v: v is not None) for k in SYNTHETIC_OPTIONS),
    ]
    for key, uses in checks:
        value = get(key)
        if uses(value):
            shown = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
            return f"{key}={shown!r}"
    return None


def broken_line(use: str) -> str:
    """The one line for a config that uses solo-ext (``use``) while a need is missing."""
    what = next(iter(BROKEN.values()))
    return (
        f"{use} needs solo-ext's patches of solo-learn, which cannot work with "
        f"{solo_learn_version()}: {what} (tested with solo-learn {TESTED_WITH[0]}, "
        f"commit {TESTED_WITH[1]})"
    )


def stop_if_broken(cfg: Any) -> None:
    """Raises the one-line ``ConfigError`` when a need is missing and ``cfg`` uses solo-ext."""
    if not BROKEN:
        return
    use = solo_ext_use(cfg)
    if use is not None:
        from solo_ext.config import ConfigError

        raise ConfigError(broken_line(use))
