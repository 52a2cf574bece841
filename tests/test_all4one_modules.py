"""All4One's building blocks: the support set's neighbours and the centroid transformer."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from solo_ext.modules.centroid_transformer import CentroidTransformer, sinusoidal_encoding
from solo_ext.modules.support_set import SupportSet


def test_neighbours_equal_brute_force_search():
    gen = torch.Generator().manual_seed(0)
    support = SupportSet(size=23, dim=8)
    support.enqueue(
        F.normalize(torch.randn(23, 8, generator=gen), dim=1),
        torch.randint(0, 5, (23,), generator=gen),
        torch.arange(100, 123),
    )
    z = F.normalize(torch.randn(6, 8, generator=gen), dim=1)
    found = support.neighbours(z, k=5)
    for row in range(6):
        sims = [(float(z[row] @ support.keys[s]), s) for s in range(23)]
        best = [s for _, s in sorted(sims, reverse=True)[:5]]
        assert found.slots[row].tolist() == best  # nearest first
        assert torch.equal(found.keys[row], support.keys[best])
        assert found.labels[row].tolist() == support.labels[best].tolist()
        assert found.indexes[row].tolist() == [100 + s for s in best]


def test_indexes_follow_keys_through_wraparound():
    support = SupportSet(size=7, dim=2)
    written = 0
    for _ in range(4):  # batches of 3 into 7 slots
        keys = torch.zeros(3, 2)
        keys[:, 0] = torch.arange(written, written + 3, dtype=torch.float)
        support.enqueue(keys, torch.zeros(3, dtype=torch.long), torch.arange(written, written + 3))
        written += 3
    assert torch.equal(support.indexes.float(), support.keys[:, 0])
    support.enqueue(torch.zeros(10, 2), torch.zeros(10, dtype=torch.long), torch.arange(10))
    assert sorted(support.indexes.tolist()) == list(range(3, 10))  # the newest 7


def test_k_outside_the_support_set():
    with pytest.raises(ValueError, match=r"k=9: must be in \[1, 8\]"):
        SupportSet(8, 4).neighbours(torch.randn(2, 4), k=9)


def _transformer(**kwargs) -> CentroidTransformer:
    torch.manual_seed(0)
    return CentroidTransformer(dim=16, dropout=0.0, **kwargs).eval()


def test_centroid_shape_and_order_sensitivity_only_through_positions():
    tokens = torch.randn(3, 5, 16)
    shuffled = tokens[:, [0, 3, 1, 4, 2]]  # the first token stays first
    model = _transformer(num_heads=4)
    assert model(tokens).shape == (3, 16)
    assert not torch.allclose(model(tokens), model(shuffled), atol=1e-5)
    model.pos.zero_()  # without positions the encoder is permutation-equivariant
    torch.testing.assert_close(model(tokens), model(shuffled), rtol=1e-4, atol=1e-5)


def test_every_config_key_is_honoured():
    model = CentroidTransformer(
        dim=16, num_layers=2, num_heads=4, ff_dim=40, dropout=0.3, pos_len=7
    )
    layers = model.encoder.layers
    assert len(layers) == 2
    assert all(layer.self_attn.num_heads == 4 for layer in layers)
    assert all(layer.linear1.out_features == 40 for layer in layers)
    assert all(layer.dropout.p == 0.3 for layer in layers)
    assert model.pos.shape == (7, 16)
    torch.testing.assert_close(model.pos, _vaswani(7, 16))
    default = CentroidTransformer(dim=16)  # 2 x dim wide, 5 positions
    assert default.encoder.layers[0].linear1.out_features == 32 and default.pos.shape == (5, 16)
    with pytest.raises(ValueError, match="pos_len=7"):
        model(torch.randn(1, 8, 16))
    with pytest.raises(ValueError, match="num_heads=3"):
        CentroidTransformer(dim=16, num_heads=3)


def _vaswani(length: int, dim: int) -> torch.Tensor:
    """Position p, coordinates 2i and 2i + 1: sin and cos of p / 10000^(2i / dim)."""
    enc = torch.zeros(length, dim)
    for pos in range(length):
        for i in range(dim // 2):
            angle = pos / 10000 ** (2 * i / dim)
            enc[pos, 2 * i], enc[pos, 2 * i + 1] = math.sin(angle), math.cos(angle)
    return enc


def test_sinusoidal_encoding_values():
    torch.testing.assert_close(sinusoidal_encoding(4, 6), _vaswani(4, 6), rtol=0, atol=1e-6)
