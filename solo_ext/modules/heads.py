"""The one head builder: projectors, predictors and their momentum copies all come from here."""

from __future__ import annotations

from torch import nn


def build_mlp(
    in_dim: int,
    hidden_dim: int,
    out_dim: int,
    num_layers: int = 2,
    batch_norm: bool = True,
    last_batch_norm: bool = False,
    last_affine: bool = False,
) -> nn.Sequential:
    """Linear-(BN)-ReLU blocks followed by a last linear layer (optionally BN, without affine
    parameters unless ``last_affine``).

    ``num_layers = 2`` with ``batch_norm = False`` is MoCo v2's projector; ``batch_norm = True``
    is solo-learn's usual projector.
    """
    if num_layers < 1:
        raise ValueError(f"num_layers={num_layers}: must be >= 1")
    layers: list[nn.Module] = []
    dim = in_dim
    for _ in range(num_layers - 1):
        layers.append(nn.Linear(dim, hidden_dim, bias=not batch_norm))
        if batch_norm:
            layers.append(nn.BatchNorm1d(hidden_dim))
        layers.append(nn.ReLU(inplace=True))
        dim = hidden_dim
    layers.append(nn.Linear(dim, out_dim))
    if last_batch_norm:
        layers.append(nn.BatchNorm1d(out_dim, affine=last_affine))
    return nn.Sequential(*layers)
