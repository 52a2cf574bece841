"""All4One's losses against loop re-derivations, and ``all4one_ct`` against the published
formulation (upstream's training step, re-derived here with loops)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from solo_ext.commands.pretrain import parse_cfg, run
from solo_ext.host import METHODS
from solo_ext.losses.all4one import all4one_loss, batch_info_nce, redundancy_reduction, shift_in
from solo_ext.modules.centroid_transformer import CentroidTransformer, upstream_encoding


def _unit(v: list[float]) -> list[float]:
    n = math.sqrt(sum(x * x for x in v))
    return [x / n for x in v]


def loop_info_nce(anchors, candidates, t, offset=0) -> float:
    """-1/B sum_i log( exp(a_i.c_{o+i}/t) / sum_j exp(a_i.c_j/t) ), one anchor at a time."""
    a = [_unit(r) for r in anchors.tolist()]
    c = [_unit(r) for r in candidates.tolist()]
    total = 0.0
    for i, ai in enumerate(a):
        logits = [sum(x * y for x, y in zip(ai, cj)) / t for cj in c]
        total -= logits[offset + i] - math.log(sum(math.exp(v) for v in logits))
    return total / len(a)


def loop_feature(momentum, online) -> float:
    """Upstream's feature loss / 10: per direction, columns normalised over the batch."""

    def columns(x):
        rows = x.tolist()
        cols = [[r[d] for r in rows] for d in range(len(rows[0]))]
        return [_unit(col) for col in cols]

    on, off = [], []
    for m, o in ((momentum[0], online[1]), (momentum[1], online[0])):
        mc, oc = columns(m), columns(o)
        dim = len(mc)
        corr = [[sum(x * y for x, y in zip(mc[d], oc[e])) for e in range(dim)] for d in range(dim)]
        on.append(sum((corr[d][d] - 1) ** 2 for d in range(dim)) / dim)
        off.append(sum(corr[d][e] ** 2 for d in range(dim) for e in range(dim) if d != e))
        off[-1] /= dim * dim - dim
    return 0.5 * math.sqrt(sum(on) / 2) + 0.5 * math.sqrt(sum(off) / 2)


def loop_upstream_encoding(tokens: int, dim: int) -> list[list[float]]:
    """positional-encodings' PositionalEncodingPermute1D(tokens) on [B, tokens, dim]: a 1-D
    encoding of ``tokens`` channels (rounded up to even, sin/cos interleaved) along the dim axis."""
    channels = 2 * math.ceil(tokens / 2)
    enc = [[0.0] * dim for _ in range(tokens)]
    for d in range(dim):
        for t in range(tokens):
            freq = 1.0 / 10000 ** ((t // 2) * 2 / channels)
            enc[t][d] = math.sin(d * freq) if t % 2 == 0 else math.cos(d * freq)
    return enc


def test_info_nce_against_loop():
    gen = torch.Generator().manual_seed(0)
    a, c = torch.randn(5, 6, generator=gen), torch.randn(15, 6, generator=gen)
    for offset in (0, 5, 10):  # this process's rows in a gathered batch of 3 x 5
        assert batch_info_nce(a, c, 0.2, offset).item() == pytest.approx(
            loop_info_nce(a, c, 0.2, offset), rel=1e-5
        )


def test_feature_term_against_loop():
    gen = torch.Generator().manual_seed(1)
    momentum = tuple(F.normalize(torch.randn(9, 7, generator=gen), dim=1) for _ in range(2))
    online = tuple(torch.randn(9, 7, generator=gen) * 3 for _ in range(2))
    got = redundancy_reduction(momentum, online).item()
    assert got == pytest.approx(loop_feature(momentum, online), rel=1e-5)
    # identical, whitened views have no redundancy: the term vanishes
    q, _ = torch.linalg.qr(torch.randn(16, 16, generator=gen))
    assert redundancy_reduction((q, q), (q, q)).item() == pytest.approx(0.0, abs=1e-5)


def test_shift_operation():
    first = torch.full((2, 3), 9.0)
    neighbours = torch.arange(2 * 5 * 3, dtype=torch.float).view(2, 5, 3)
    shifted = shift_in(first, neighbours, k=5)
    assert shifted.shape == (2, 5, 3)
    assert torch.equal(shifted[:, 0], first)
    assert torch.equal(shifted[:, 1:], neighbours[:, :4])  # the last neighbour drops out
    assert torch.equal(shift_in(first, neighbours, k=1), first[:, None])


def test_weights_scale_the_terms_exactly():
    n, c, f = torch.tensor(1.3), torch.tensor(2.9), torch.tensor(0.37)
    assert all4one_loss(n, c, f, 1, 0, 0).total.item() == pytest.approx(1.3)
    assert all4one_loss(n, c, f, 0, 1, 0).total.item() == pytest.approx(2.9)
    assert all4one_loss(n, c, f, 0, 0, 1).total.item() == pytest.approx(0.37)
    terms = all4one_loss(n, c, f, 0.5, 0.5, 5.0)
    # eta 5 x 0.37 is upstream's 0.5 * 10 * (0.5 on + 0.5 off) with on = off = 0.37
    assert terms.total.item() == pytest.approx(0.5 * 1.3 + 0.5 * 2.9 + 5 * 0.37)


def test_upstream_positional_encoding_against_loop():
    for tokens, dim in ((5, 16), (4, 8), (10, 32)):
        expected = torch.tensor(loop_upstream_encoding(tokens, dim))
        torch.testing.assert_close(upstream_encoding(tokens, dim), expected)
    for length in (5, 4):  # the transformer's: the published layout, not the default Vaswani
        model = CentroidTransformer(dim=16, num_heads=4, pos_len=length, pos_encoding="upstream")
        torch.testing.assert_close(model.pos, torch.tensor(loop_upstream_encoding(length, 16)))
        assert not torch.allclose(model.pos, CentroidTransformer(dim=16, pos_len=length).pos)
    with pytest.raises(ValueError, match="pos_encoding='rope'"):
        CentroidTransformer(dim=16, pos_encoding="rope")


def test_published_defaults(make_cfg):
    kw = parse_cfg(make_cfg("all4one_ct")).method_kwargs
    assert (kw.k, kw.num_layers, kw.num_heads, kw.dropout) == (5, 3, 8, 0.1)
    assert (kw.sigma, kw.kappa, kw.eta, kw.transformer_lr) == (0.5, 0.5, 5.0, 0.1)
    assert kw.pos_encoding == "upstream" and kw.centroid_temperature == 0.1


def test_total_loss_equals_the_published_formulation(make_cfg):
    """Upstream's step, re-derived with loops (nearest neighbours by sorting, the positional
    encoding, both InfoNCE terms and the feature term), on a fixed batch, support set and
    weights. The transformer is put in eval mode: its dropout would draw different masks."""
    published = {  # the published settings on the tiny config (dims 16, so 8 heads fit)
        "method_kwargs.pred_hidden_dim": 32,
        "method_kwargs.temperature": 0.2,
        "method_kwargs.centroid_temperature": 0.1,
    }
    torch.manual_seed(0)
    model = METHODS["all4one_ct"](parse_cfg(make_cfg("all4one_ct", **published))).train()
    model.centroid_transformer.eval()
    gen = torch.Generator().manual_seed(3)
    x1, x2 = (torch.randn(8, 3, 32, 32, generator=gen) for _ in range(2))
    model.queue.enqueue(
        F.normalize(torch.randn(64, 16, generator=gen), dim=1),
        torch.randint(0, 4, (64,), generator=gen),
        torch.arange(64),
    )

    # solo-ext's step
    outs = [model(x) for x in (x1, x2)]
    moms = [model.momentum_forward(x) for x in (x1, x2)]
    out = {k: [o[k] for o in outs] for k in ("p", "p_centroid", "proj", "z")}
    out["momentum_z"] = [m["z"] for m in moms]
    neighbours = tuple(model.queue.neighbours(z, 5) for z in out["momentum_z"])
    terms = model.all4one_terms(out, neighbours)

    # upstream's step, with loops
    z = [model.projector(model.backbone(x)) for x in (x1, x2)]
    p = [model.predictor(v) for v in z]
    p2 = [model.centroid_predictor(v) for v in z]
    mz = [
        F.normalize(model.momentum_projector(model.momentum_backbone(x)), dim=-1) for x in (x1, x2)
    ]
    keys = model.queue.keys
    nn = []
    for m in mz:
        rows = []
        for row in m:
            sims = sorted(((float(row @ keys[s]), s) for s in range(64)), reverse=True)
            rows.append(keys[[s for _, s in sims[:5]]])
        nn.append(torch.stack(rows))
    pos = torch.tensor(loop_upstream_encoding(5, 16))
    encoder = model.centroid_transformer.encoder
    rich = [encoder(n + pos)[:, 0] for n in nn]
    strange = [encoder(torch.cat([q[:, None], n], 1)[:, :5] + pos)[:, 0] for q, n in zip(p2, nn)]
    centroid = (
        loop_info_nce(rich[0], strange[1], 0.1) / 2 + loop_info_nce(rich[1], strange[0], 0.1) / 2
    )
    neighbour = (
        loop_info_nce(nn[0][:, 0], p[1], 0.2) / 2 + loop_info_nce(nn[1][:, 0], p[0], 0.2) / 2
    )
    feature = loop_feature(mz, z) * 10
    total = 0.5 * centroid + 0.5 * neighbour + 0.5 * feature

    assert terms.neighbour.item() == pytest.approx(neighbour, rel=1e-4)
    assert terms.centroid.item() == pytest.approx(centroid, rel=1e-4)
    assert 10 * terms.feature.item() == pytest.approx(feature, rel=1e-4)
    assert terms.total.item() == pytest.approx(total, rel=1e-4)


def test_step_fills_the_support_set_and_logs_nn_accuracy(make_cfg):
    cfg = make_cfg(
        "all4one_ct",
        **{
            "checkpoint.enabled": False,
            "limit_train_batches": 3,
            "limit_val_batches": 0,
            "method_kwargs.queue_size": 20,  # batches of 8 wrap around
            "method_kwargs.pred_hidden_dim": 32,
            "method_kwargs.transformer_lr": 0.05,
        },
    )
    result = run(cfg)
    model, metrics = result["model"], result["metrics"]
    support = model.queue
    assert support.ptr.item() == (3 * 8) % 20  # one view per step, like upstream
    assert support.valid.all() and (support.indexes >= 0).all()
    # the stored labels are those of the stored images
    dataset = model.trainer.train_dataloader.dataset
    labels = torch.tensor([dataset[i][2] for i in support.indexes.tolist()])
    assert torch.equal(support.labels, labels)
    assert 0 <= metrics["train_nn_acc"] <= 1
    groups = {g["name"]: g for g in model.trainer.optimizers[0].param_groups if "name" in g}
    assert groups["centroid_transformer"]["initial_lr"] == pytest.approx(0.05)
    for key in ("train_neighbour_loss", "train_centroid_loss", "train_feature_loss"):
        assert math.isfinite(metrics[key])
