"""How the method classes are built: one class over a shared base, parts composed into the
supervised step, and ``forward`` extended through ``super()`` with the feature map recorded from
the host's own pass."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from test_pbsd import pbsd_batch

from solo_ext.commands.pretrain import parse_cfg
from solo_ext.host import METHODS, BaseMethod, BaseMomentumMethod
from solo_ext.methods.base import MomentumQueueMethod, SoloExtMethod
from solo_ext.methods.dscl import DecoupledLoss
from solo_ext.methods.pbsd import PatchDistillation
from solo_ext.methods.registry import SOLO_EXT_METHODS, load
from solo_ext.methods.scl import SCL, Criterion, StepTerm

ROOT = Path(__file__).resolve().parents[1]
# the shared bases a method class may stand on (one class over one of them)
BASES = (SCL, MomentumQueueMethod, SoloExtMethod)
HOST_BASES = (BaseMethod, BaseMomentumMethod)


def solo_ext_chain(cls: type) -> list[type]:
    """The classes from ``cls`` down its first bases to the host's base class."""
    chain = []
    while cls not in HOST_BASES and cls is not object:
        chain.append(cls)
        cls = next(b for b in cls.__bases__ if b is not SoloExtMethod) if cls.__bases__ else object
    return chain


@pytest.mark.parametrize("method", sorted(SOLO_EXT_METHODS))
def test_each_method_is_one_class_over_a_shared_base(method):
    cls = load(method)
    chain = solo_ext_chain(cls)
    assert chain[0] is cls
    # the method's own class, then at most the supervised step and the momentum queue base
    assert all(base in BASES for base in chain[1:]), chain
    assert len(chain) <= 3, chain
    others = [load(m) for m in SOLO_EXT_METHODS if m not in (method, "scl")]
    assert not any(issubclass(cls, other) for other in others), method
    assert issubclass(cls, SoloExtMethod)


def test_pbsd_is_dscls_step_with_the_distillation_term():
    dscl, pbsd = load("dscl"), load("pbsd")
    assert dscl.CRITERION is pbsd.CRITERION is DecoupledLoss
    assert dscl.TERMS == () and pbsd.TERMS == (PatchDistillation,)
    assert issubclass(PatchDistillation, StepTerm) and issubclass(DecoupledLoss, Criterion)
    # the options are the parts' own, nothing else added
    assert set(pbsd.METHOD_KWARGS) == set(dscl.METHOD_KWARGS) | set(PatchDistillation.OPTIONS)
    assert not hasattr(SCL, "auxiliary_loss")


def test_pbsd_with_no_distillation_weight_steps_as_dscl(make_cfg):
    """The same weights, batch and queue: PBSD's step at ``pbsd_weight: 0`` is DSCL's, and
    its distillation term enters the total with its weight."""
    device = {"method_kwargs.patch_source": "device"}
    cfgs = {"dscl": parse_cfg(make_cfg("dscl")), "pbsd": parse_cfg(make_cfg("pbsd", **device))}
    torch.manual_seed(0)
    models = {m: METHODS[m](cfg) for m, cfg in cfgs.items()}
    models["pbsd"].load_state_dict(models["dscl"].state_dict())
    batch = pbsd_batch()
    totals = {}
    for weight in (0.0, 2.0):
        models["pbsd"].cfg.method_kwargs.pbsd_weight = weight
        for name, model in models.items():
            model.train()
            torch.manual_seed(3)
            totals[name, weight] = model.training_step(batch, 0).detach()
    assert torch.equal(totals["pbsd", 0.0], totals["dscl", 0.0])
    assert not torch.equal(totals["pbsd", 2.0], totals["dscl", 2.0])


def test_every_forward_extends_the_hosts_through_super():
    """No method re-implements the host's pass: each ``forward`` / ``momentum_forward`` in
    ``methods/`` calls its ``super()``'s."""
    checked = 0
    for path in sorted((ROOT / "solo_ext" / "methods").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name in ("forward", "momentum_forward"):
                if "nn.Module" in ast.unparse(node) or _in_module_class(path, node):
                    continue
                assert f"super().{node.name}(" in ast.unparse(node), f"{path.name}: {node.name}"
                checked += 1
    assert checked >= 5


def _in_module_class(path: Path, func: ast.FunctionDef) -> bool:
    """Whether ``func`` belongs to a torch module of the file (a head, a term), not a method."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef) and any(
            isinstance(f, ast.FunctionDef) and f.lineno == func.lineno for f in node.body
        ):
            bases = [ast.unparse(b) for b in node.bases]
            return any(b.endswith(("Module", "StepTerm")) for b in bases)
    return False


@pytest.mark.parametrize("method", ["pbsd", "densecl"])
def test_the_feature_map_comes_from_the_hosts_own_pass(method, make_cfg):
    """While training, ``forward`` adds the backbone's last map of the same pass (one backbone
    call; its pooling is the features); in evaluation there is no map."""
    extra = {"method_kwargs.patch_source": "device"} if method == "pbsd" else {}
    model = METHODS[method](parse_cfg(make_cfg(method, **extra)))
    calls = []
    model.backbone.register_forward_hook(lambda *_: calls.append(1))
    x = torch.randn(4, 3, 32, 32)
    model.train()
    out = model(x)
    assert len(calls) == 1
    fmap = out["fmap"]
    if method == "pbsd":  # the map itself: its average is the pooled features
        torch.testing.assert_close(fmap.mean(dim=(2, 3)), out["feats"])
    else:  # densecl: flattened [B, C, S], and its dense projections
        assert fmap.dim() == 3 and out["dense"].shape[-1] == fmap.shape[-1]
        torch.testing.assert_close(fmap.mean(dim=2), out["feats"])
    model.eval()
    assert "fmap" not in model(x)
    assert len(model.backbone._forward_hooks) == 1  # the tap's hooks are gone, ours stays
