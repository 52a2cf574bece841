"""Host selection, re-exports and the start-up hook that registers into solo-learn."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

import solo_ext.host as host

SOLO_INSTALLED = importlib.util.find_spec("solo") is not None and host.HOST == "solo"


def _python(code: str, env: dict | None = None, path: list[str] | None = None):
    full_env = {**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})}
    if path:
        full_env["PYTHONPATH"] = os.pathsep.join(path + [full_env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=120,
    )


def test_reexports_are_the_active_hosts():
    """What method code imports from solo_ext.host is the active host's own object."""
    if host.HOST == "solo":
        modules = ("solo.methods.base", "solo.methods", "solo.utils.misc")
    else:
        modules = ("solo_ext.host.standalone",) * 3
    base, methods, misc = (importlib.import_module(m) for m in modules)
    assert host.BaseMethod is base.BaseMethod
    assert host.BaseMomentumMethod is base.BaseMomentumMethod
    assert host.METHODS is methods.METHODS
    assert host.gather is misc.gather and host.omegaconf_select is misc.omegaconf_select
    assert issubclass(host.BaseMomentumMethod, host.BaseMethod)


def test_bad_host_value():
    proc = _python("import solo_ext.host", env={"SOLO_EXT_HOST": "sol"})
    assert proc.returncode != 0 and "SOLO_EXT_HOST='sol'" in proc.stderr


@pytest.mark.skipif(SOLO_INSTALLED, reason="solo-learn is importable here")
def test_forced_solo_without_solo_learn():
    proc = _python("import solo_ext.host", env={"SOLO_EXT_HOST": "solo"})
    assert proc.returncode != 0
    assert "SOLO_EXT_HOST=solo but solo-learn is not importable" in proc.stderr


@pytest.fixture
def fake_solo(tmp_path):
    """A package named ``solo`` with solo-learn's module layout and a method named ``scl``."""
    files = {
        "solo/__init__.py": "",
        "solo/methods/__init__.py": textwrap.dedent("""
            from solo.methods.base import BaseMethod
            class Theirs(BaseMethod):
                pass
            METHODS = {"base": BaseMethod, "scl": Theirs}
        """),
        # solo-learn's base classes, as far as class creation and registration need them
        "solo/methods/base.py": textwrap.dedent("""
            import lightning.pytorch as pl
            class BaseMethod(pl.LightningModule):
                _BACKBONES, _OPTIMIZERS, _SCHEDULERS = {}, {}, []
            class BaseMomentumMethod(BaseMethod):
                pass
        """),
        "solo/utils/__init__.py": "",
        "solo/utils/misc.py": "def gather(x, dim=0):\n    return x\n"
        "def omegaconf_select(cfg, key, default=None):\n    return default\n",
        "solo/utils/momentum.py": "def initialize_momentum_params(a, b):\n    pass\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return str(tmp_path)


CHECK_HOOK = """
    import sys
    assert "torch" not in sys.modules, "the start-up hook imported torch"
    from solo.methods import METHODS
    print(sorted(METHODS), METHODS["scl"].__module__)
"""


# (before solo-learn's registry is imported) the whole core, imported with the start-up hook
# installed: no host, no Lightning, no solo-learn (what the static walk of tests/test_layers.py
# cannot see, an import by name at run time, shows in sys.modules)
IMPORT_THE_CORE = """
    import importlib, json
    for name in {names!r}:
        importlib.import_module(name)
    top = ("lightning", "pytorch_lightning", "solo")
    print(json.dumps(sorted(m for m in sys.modules
                            if m.split(".")[0] in top or m.startswith("solo_ext.host"))))
"""


def test_autoload_registers_and_importing_the_core_loads_no_host_and_no_lightning(fake_solo):
    from test_layers import FILES, _module_name

    from solo_ext.layers import CORE, layer_of

    names = [n for n in map(_module_name, FILES) if layer_of(n) in CORE]  # the core's modules
    assert len(names) > 20  # the walk found the package
    head, registry = CHECK_HOOK.split("    from solo.methods import METHODS\n")
    code = head + IMPORT_THE_CORE.format(names=names) + "    from solo.methods import METHODS\n"
    proc = _python(code + registry, path=[fake_solo])
    assert proc.returncode == 0, proc.stderr
    loaded, found = proc.stdout.strip().splitlines()
    assert json.loads(loaded) == []
    names, scl_module = found.rsplit(" ", 1)
    from solo_ext.methods.registry import SOLO_EXT_METHODS

    for name in SOLO_EXT_METHODS:
        assert repr(name) in names
    # solo-learn's own name wins: "scl" of the fake solo is not shadowed
    assert scl_module.strip() == "solo.methods"


def test_autoload_switched_off_and_the_standalone_host_forced(fake_solo):
    """One fresh interpreter for two start-up settings: with the hook switched off, solo-learn's
    registry is its own; ``SOLO_EXT_HOST=standalone`` then picks the embedded host although a
    solo-learn is importable."""
    code = CHECK_HOOK + "    import solo_ext.host as h; print(h.HOST, h.BaseMethod.__module__)\n"
    env = {"SOLO_EXT_AUTOLOAD": "0", "SOLO_EXT_HOST": "standalone"}
    proc = _python(code, env=env, path=[fake_solo])
    assert proc.returncode == 0, proc.stderr
    registry, chosen = proc.stdout.splitlines()
    assert registry == "['base', 'scl'] solo.methods", proc.stdout  # nothing added
    assert chosen.split() == ["standalone", "solo_ext.host.standalone.base"], proc.stdout
