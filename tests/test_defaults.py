"""Each default has one home.

- Every ``Option`` table of the package (found by walking its modules, not listed by hand) belongs
  to a command, and a key declared twice for one command has one default.
- No module passes a literal default for a declared key (``select(cfg, "seed", 5)``): every
  reader takes the declaration's.
- The evaluation commands' defaults are their packaged conf files' (``IN_CONF``), and every key
  of those files is declared.
- The recipes' shared group of solo-learn's defaults says what the declarations say.
- The host's base class fills what ``HOST_OPTIONS`` declares (solo-learn's own, when it is the
  host); ``parse_cfg`` fills the run's declared defaults.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import solo_ext
from solo_ext import config
from solo_ext.commands import knn
from solo_ext.commands.pretrain import RUN_OPTIONS, parse_cfg
from solo_ext.config import CORE_RUN_OPTIONS, HOST_OPTIONS, IN_CONF, Option, run_default
from solo_ext.methods.registry import SOLO_EXT_METHODS, load

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "solo_ext"
# keys parse_cfg changes after filling them (solo-learn's linear scaling of the learning rates)
SCALED = ("optimizer.lr", "optimizer.classifier_lr")
# modules that need what a test machine may lack, or run on import
SKIP_MODULES = ("solo_ext.solo_learn.autoload", "solo_ext.layers")


def _modules():
    for info in pkgutil.walk_packages(solo_ext.__path__, "solo_ext."):
        skip = info.name in SKIP_MODULES or info.name.endswith(".__main__")
        if skip or info.name.startswith("solo_ext.host.solo"):
            continue
        yield importlib.import_module(info.name)


def option_tables() -> dict[str, dict[str, Option]]:
    """Every module-level table of options of the package, ``module.NAME`` -> table (a table of
    tables, such as the samplers', by ``module.NAME[entry]``), and each method's kwargs."""
    tables: dict[str, dict[str, Option]] = {}
    for module in _modules():
        source = Path(module.__file__).read_text()
        for name, value in vars(module).items():
            if not isinstance(value, dict) or not value:
                continue
            if not re.search(rf"^{name}\b[^=\n]*=", source, re.M):  # imported from elsewhere
                continue
            if all(isinstance(o, Option) for o in value.values()):
                tables[f"{module.__name__}.{name}"] = value
            elif all(isinstance(t, dict) for t in value.values()):
                for entry, table in value.items():
                    if table and all(isinstance(o, Option) for o in table.values()):
                        tables[f"{module.__name__}.{name}[{entry}]"] = table
    for method in SOLO_EXT_METHODS:
        kwargs = load(method).METHOD_KWARGS
        tables[f"method {method}"] = {f"method_kwargs.{k}": o for k, o in kwargs.items()}
    return tables


# which command reads each table (its keys dotted from that command's config root, except the
# augmentation entries' and the samplers', relative to their entry)
COMMANDS = {
    "pretrain": (
        "solo_ext.config.CORE_RUN_OPTIONS",
        "solo_ext.config.HOST_OPTIONS",
        "solo_ext.config.CROP_OPTIONS",
        "solo_ext.config.BACKBONE_OPTIONS",
        "solo_ext.commands.options.PRETRAIN_OPTIONS",
        "solo_ext.commands.pretrain.RUN_OPTIONS",
        "solo_ext.data.options.DATA_KEYS",
        "solo_ext.data.options.DALI_OPTIONS",
    ),
    "linear": (
        "solo_ext.commands.linear.OPTIONS",
        "solo_ext.commands.options.LINEAR_OPTIONS",
        "solo_ext.commands.options.SCHEDULE_OPTIONS",
        "solo_ext.eval.options.CLASSIFIER_STAGE_OPTIONS",
        "solo_ext.eval.options.DECOUPLED_OPTIONS",
    ),
    "knn": ("solo_ext.commands.options.KNN_OPTIONS",),
    "dense_probe": ("solo_ext.commands.options.DENSE_PROBE_OPTIONS",),
}
# tables that are parts of a command's table above (``data.<key>``, ``data.synthetic.<key>``),
# or relative to an entry (an augmentation, a sampler, a method's kwargs: one table per entry)
PARTS = {
    "solo_ext.data.options.DATA_OPTIONS": ("solo_ext.data.options.DATA_KEYS", "data."),
    "solo_ext.data.options.LT_OPTIONS": ("solo_ext.data.options.DATA_KEYS", "data."),
    "solo_ext.data.options.SYNTHETIC_OPTIONS": (
        "solo_ext.data.options.DATA_KEYS",
        "data.synthetic.",
    ),
}
ENTRY_TABLES = ("solo_ext.data.transforms.AUGMENTATION_OPTIONS", "solo_ext.data.samplers.")


@pytest.fixture(scope="module")
def tables():
    return option_tables()


def test_every_table_of_options_belongs_to_a_command(tables):
    placed = {name for names in COMMANDS.values() for name in names} | set(PARTS)
    loose = [
        name
        for name in tables
        if name not in placed
        and not name.startswith("method ")
        and not name.startswith(ENTRY_TABLES)
    ]
    assert not loose, f"tables no command is declared to read: {loose}"
    # the walk finds what it should: the method tables and the samplers' are there too
    assert {
        "solo_ext.config.HOST_OPTIONS",
        "method pbsd",
        "solo_ext.commands.linear.OPTIONS",
    } <= set(tables)
    assert any(name.startswith("solo_ext.data.samplers.SAMPLER_OPTIONS[") for name in tables)


def test_the_parts_are_in_their_whole(tables):
    for part, (whole, prefix) in PARTS.items():
        for key, option in tables[part].items():
            assert tables[whole][prefix + key] is option, (part, key)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_key_declared_twice_for_one_command_has_one_default(tables, command):
    seen: dict[str, tuple[str, Option]] = {}
    for name in COMMANDS[command]:
        for key, option in tables[name].items():
            if key in seen:
                first, earlier = seen[key]
                assert option.default == earlier.default, (
                    f"{key}: {option.default!r} in {name}, {earlier.default!r} in {first}"
                )
            seen[key] = (name, option)
    assert len(seen) >= 4, command


def test_no_default_is_left_to_the_packaged_conf_unread(tables):
    for name, table in tables.items():
        for key, option in table.items():
            assert option.default is not IN_CONF, f"{name}: {key}"


# --- no second copy in the code --------------------------------------------------------------

# calls that read a config key with a default: select(cfg, key, default), augmentation_value ...
READERS = ("select", "omegaconf_select", "_get", "augmentation_value", "get", "setdefault")
LITERALS = (ast.Constant, ast.List, ast.Dict, ast.Tuple, ast.UnaryOp)


def literal_defaults(source: str, keys: set[str]) -> list[tuple[int, str]]:
    """(line, call) of each call in ``source`` that reads a declared key (dotted, or the last
    part of one with ``.get`` on the section before it) with a literal default."""
    found = []
    ends = {}
    for key in keys:
        *head, last = key.split(".")
        ends.setdefault(last, set()).add(head[-1] if head else "")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            # cfg.get("seed") or 0: a reader without a default, then a literal
            first, *rest = node.values
            if isinstance(first, ast.Call) and rest and isinstance(rest[0], LITERALS):
                call = ast.Call(first.func, [*first.args, rest[0]], first.keywords)
                if literal_defaults(ast.unparse(ast.Expr(call)), keys):
                    found.append((node.lineno, ast.unparse(node)))
            continue
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name not in READERS:
            continue
        positions = [
            i
            for i, a in enumerate(node.args)
            if isinstance(a, ast.Constant) and isinstance(a.value, str)
        ]
        if not positions:
            continue
        at = positions[0]
        key = node.args[at].value
        default = node.args[at + 1] if len(node.args) > at + 1 else None
        default = default or next((k.value for k in node.keywords if k.arg == "default"), None)
        if default is None or not isinstance(default, LITERALS):
            continue
        if isinstance(default, ast.Constant) and default.value is None:
            continue
        if name in ("get", "setdefault"):
            receiver = ast.unparse(func.value) if isinstance(func, ast.Attribute) else ""
            sections = ends.get(key, set())
            hit = any(s and s in receiver for s in sections) or ("" in sections)
        else:
            hit = key in keys
        if hit:
            found.append((node.lineno, ast.unparse(node)))
    return found


def declared_keys(tables) -> set[str]:
    keys = set()
    for table in tables.values():
        keys |= set(table)
    # an augmentation entry's keys and the method kwargs are read relative to their section too
    keys |= {k.removeprefix("method_kwargs.") for k in keys if k.startswith("method_kwargs.")}
    return keys


def test_the_scan_finds_a_second_copy(tables):
    """The scan below can fail: it flags each way a copy of a default is written."""
    keys = declared_keys(tables)
    source = (
        'select(cfg, "seed", 5)\n'
        'OmegaConf.select(cfg, "data.format", default="image_folder")\n'
        'augmentation_value(aug, "rrc.enabled", True)\n'
        '(cfg.backbone.get("kwargs") or {}).get("patch_size", 16)\n'
        'int(cfg.get("seed") or 0)\n'
        'select(cfg, "seed", run_default("seed"))\n'
        'select(cfg, "not.declared", 3)\n'
        '(cfg.backbone.get("kwargs") or {}).get("depth")\n'
    )
    assert sorted({line for line, _ in literal_defaults(source, keys)}) == [1, 2, 3, 4, 5]


def test_no_module_writes_a_declared_default_again(tables):
    keys = declared_keys(tables)
    copies = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for line, call in literal_defaults(path.read_text(), keys):
            copies.append(f"{path.relative_to(ROOT)}:{line}: {call}")
    assert not copies, "defaults written again:\n" + "\n".join(copies)


# --- the packaged conf files and the shipped recipes -----------------------------------------

# keys of the conf files that are not options: the run to evaluate, and a section merged over
# the run's data
CONF_ONLY = ("pretrained_checkpoint_dir", "data")


def _leaves(node, prefix=""):
    for key, value in node.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            yield from _leaves(value, dotted + ".")
        else:
            yield dotted, value


@pytest.mark.parametrize("command", ["knn", "linear", "dense_probe"])
def test_every_key_of_a_conf_file_is_declared_with_its_value(command):
    options = importlib.import_module(f"solo_ext.commands.{command}").OPTIONS
    conf = OmegaConf.to_container(config.packaged_conf(command))
    leaves = dict(_leaves(conf))
    for key, value in leaves.items():
        if key.split(".")[0] in CONF_ONLY:
            continue
        assert key in options, f"conf/{command}.yaml: {key} is not declared"
        assert options[key].default == value, key
        options[key].check(key, value)
    assert len(leaves) >= 5, command


def test_a_default_in_both_the_conf_file_and_the_declaration_stops_the_import():
    with pytest.raises(RuntimeError, match="'k' is in the file"):
        config.conf_options("knn", {"k": Option(20, "int", 1)})
    with pytest.raises(RuntimeError, match="'num_plot' is not in the file"):
        config.conf_options("knn", {"num_plot": Option(IN_CONF, "int", 0)})
    assert config.conf_options("knn", {"k": Option(IN_CONF, "int", 1)})["k"].default == 20


def test_the_recipes_shared_defaults_say_what_the_declarations_say(tables):
    """The recipes take solo-learn's defaults (so that a command-line override needs no '+')
    from one shared group, ``scripts/<kind>/ext_defaults/solo_learn.yaml``: each key there is
    declared, with that default (but solo-learn's nulls that solo-ext never reads)."""
    pretrain = {}
    for name in COMMANDS["pretrain"]:
        pretrain.update(tables[name])
    checked = 0
    for kind in ("pretrain", "linear"):
        shared = OmegaConf.load(ROOT / "scripts" / kind / "ext_defaults" / "solo_learn.yaml")
        block = OmegaConf.to_container(shared)
        del block["defaults"], block["hydra"]
        for key, value in _leaves(block):
            if key not in pretrain:  # (solo-learn's own, which solo-ext does not read)
                assert value is None, f"{kind}/ext_defaults: {key}={value!r} is not declared"
                continue
            assert value == pretrain[key].default, f"{kind}/ext_defaults: {key}"
            checked += 1
    assert checked >= 25


# --- what fills them -------------------------------------------------------------------------


def minimal_cfg(tmp_path):
    """A run config with only what parse_cfg requires."""
    return OmegaConf.create(
        {
            "method": "scl",
            "backbone": {"name": "resnet18"},
            "data": {"dataset": "synthetic_lt", "num_classes": 4},
            "optimizer": {"name": "sgd", "batch_size": 256, "lr": 0.1},
            "scheduler": {"name": "warmup_cosine"},
            "max_epochs": 1,
            "augmentations": [{"crop_size": 32, "num_crops": 2}],
            "method_kwargs": {"queue_size": 256},
            "checkpoint": {"dir": str(tmp_path)},
        }
    )


def test_parse_cfg_fills_every_declared_default(tmp_path):
    cfg = parse_cfg(minimal_cfg(tmp_path))
    filled = []
    for key, option in RUN_OPTIONS.items():
        if option.default is None or key in SCALED or key == "checkpoint.dir":
            continue
        value = OmegaConf.select(cfg, key, default=None)
        if value is not None:  # (Lightning's own keys are filled by Lightning, not here)
            assert value == option.default, key
            filled.append(key)
    assert set(CORE_RUN_OPTIONS) - {"checkpoint.dir", "wandb.entity", *SCALED} <= set(filled)
    # batch 256: the scaled learning rates are the given ones
    assert cfg.optimizer.classifier_lr == run_default("optimizer.classifier_lr")


def test_solo_ext_pretrain_takes_in_the_core_declarations():
    for key, option in CORE_RUN_OPTIONS.items():
        assert RUN_OPTIONS[key] is option, key


def test_the_hosts_base_class_fills_the_declared_host_defaults(tmp_path):
    """solo-learn's ``BaseMomentumMethod`` when it is the host (its defaults are the ones
    ``HOST_OPTIONS`` copies), the embedded one otherwise (it reads them from there)."""
    from solo_ext.host import BaseMomentumMethod

    cfg = minimal_cfg(tmp_path)
    cfg.optimizer.update(classifier_lr=0.1, weight_decay=0.0)
    cfg.data.update(num_large_crops=2, num_small_crops=0)
    cfg.momentum = {}  # (solo-learn's base class expects the section)
    cfg = BaseMomentumMethod.add_and_assert_specific_cfg(cfg)
    for key, option in HOST_OPTIONS.items():
        assert OmegaConf.select(cfg, key) == option.default, key


def test_the_final_knn_of_pretraining_takes_solo_ext_knns_defaults():
    """``evaluate_model``'s defaults are read from ``conf/knn.yaml`` (through the command's
    ``OPTIONS``): editing the file changes pretraining's final kNN too."""
    conf = OmegaConf.load(ROOT / "solo_ext" / "conf" / "knn.yaml")
    params = inspect.signature(knn.evaluate_model).parameters
    for key in ("k", "temperature", "distance", "batch_size"):
        assert params[key].default == conf[key] == knn.OPTIONS[key].default, key
