"""Every loss under bf16 and fp16 autocast: finite and within a stated tolerance of its float32
value on the same inputs, including t = 0.05 and near-duplicate embeddings; and a non-finite
loss stops training with a message naming the term, before any checkpoint is written."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from solo_ext.commands.pretrain import run
from solo_ext.losses.all4one import all4one_objective
from solo_ext.losses.densecl import densecl_loss
from solo_ext.losses.dscl import dscl_loss
from solo_ext.losses.pbsd import pbsd_loss
from solo_ext.losses.scl import scl_loss
from solo_ext.modules.centroid_transformer import CentroidTransformer

# Inputs are rounded to the low-precision type (the losses compute in float32 inside), so the
# error is that of rounding embeddings: at most this fraction of the float32 value.
TOLERANCE = {torch.bfloat16: 3e-2, torch.float16: 5e-3}
# the centroid transformer itself runs in the low-precision type under autocast
ALL4ONE_TOLERANCE = {torch.bfloat16: 6e-2, torch.float16: 1e-2}


def _inputs(near_duplicates: bool) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    b, k, d = 8, 32, 16
    base = torch.randn(b, d, generator=gen)
    if near_duplicates:  # queries, keys and part of the queue nearly the same vectors
        noise = 1e-3
        q = base + noise * torch.randn(b, d, generator=gen)
        key = base + noise * torch.randn(b, d, generator=gen)
        queue = torch.cat([base.repeat(2, 1), torch.randn(k - 2 * b, d, generator=gen)])
        queue = queue + noise * torch.randn(k, d, generator=gen)
    else:
        q, key, queue = (torch.randn(n, d, generator=gen) for n in (b, b, k))
    x = {"q": q, "k": key, "queue": queue}
    x = {name: F.normalize(v, dim=1) for name, v in x.items()}
    x["labels"] = torch.randint(0, 3, (b,), generator=gen)
    x["queue_labels"] = torch.randint(-1, 3, (k,), generator=gen)
    return x


def _losses(t: float):
    def scl(x):
        return scl_loss(x["q"], x["k"], x["queue"], x["labels"], x["queue_labels"], t)

    def dscl(x):
        return dscl_loss(
            x["q"], x["k"], x["queue"], x["labels"], x["queue_labels"], beta=8.0, temperature=t
        )

    def pbsd(x):
        student, teacher = x["q"].repeat(2, 1), x["k"].repeat(2, 1).flip(0)
        return pbsd_loss(student, teacher, x["k"], x["queue"], x["queue_labels"], t)

    def densecl(x):
        dense = x["q"].T[None].repeat(2, 1, 1)  # [2, D, 8]
        match = torch.arange(8).repeat(2, 1)
        return densecl_loss(x["q"], x["k"], x["queue"], dense, dense, x["queue"], match, 0.5, t)[0]

    return {"scl": scl, "dscl": dscl, "pbsd": pbsd, "densecl": densecl}


def _cast(x: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in x.items()}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("near_duplicates", [False, True], ids=["random", "near-duplicates"])
@pytest.mark.parametrize("t", [0.05, 0.2])
@pytest.mark.parametrize("name", ["scl", "dscl", "pbsd", "densecl"])
def test_loss_under_autocast(name, t, near_duplicates, dtype):
    x = _inputs(near_duplicates)
    fn = _losses(t)[name]
    full = fn(x)
    with torch.autocast("cpu", dtype=dtype):
        low = fn(_cast(x, dtype))
    assert low.dtype == torch.float32 and torch.isfinite(low)
    assert abs(low.item() - full.item()) <= TOLERANCE[dtype] * max(1.0, abs(full.item()))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("near_duplicates", [False, True], ids=["random", "near-duplicates"])
def test_all4one_under_autocast(near_duplicates, dtype):
    x = _inputs(near_duplicates)
    torch.manual_seed(0)
    transformer = CentroidTransformer(16, num_heads=4, dropout=0.0, pos_len=3).eval()
    nn = torch.stack([x["queue"][i : i + 3] for i in range(8)])  # [8, 3, 16]

    def fn(v):
        pair = (v["q"], v["k"])
        return all4one_objective(pair, pair, pair, pair, (nn, nn), transformer, 3, 0.05, 0.05)

    full = fn(x).total
    with torch.autocast("cpu", dtype=dtype):
        low = fn(_cast(x, dtype)).total
    assert torch.isfinite(low)
    assert abs(low.item() - full.item()) <= ALL4ONE_TOLERANCE[dtype] * max(1.0, abs(full.item()))


@pytest.mark.parametrize(
    "method,target,term",
    [
        ("scl", "solo_ext.methods.scl.scl_loss", "train_scl_loss"),
        ("densecl", "solo_ext.methods.densecl.densecl_loss", "train_global_loss"),
        ("all4one_ct", "solo_ext.methods.all4one.all4one_objective", "train_neighbour_loss"),
    ],
)
def test_non_finite_loss_stops_before_a_checkpoint(method, target, term, make_cfg, monkeypatch):
    import importlib

    module, name = target.rsplit(".", 1)
    original = getattr(importlib.import_module(module), name)

    def poisoned(*args, **kwargs):
        out = original(*args, **kwargs)
        if isinstance(out, torch.Tensor):
            return out * float("nan")
        poisoned = [v * float("nan") if i in (0, 1) else v for i, v in enumerate(out)]
        return type(out)(*poisoned) if hasattr(out, "_fields") else tuple(poisoned)

    monkeypatch.setattr(target, poisoned)
    cfg = make_cfg(method, **{"method_kwargs.warmup_steps": 0} if method == "densecl" else {})
    with pytest.raises(FloatingPointError) as info:
        run(cfg)
    message = str(info.value)
    assert term in message and "nan" in message and "\n" not in message
    assert not list(Path(cfg.checkpoint.dir).rglob("*.ckpt"))
