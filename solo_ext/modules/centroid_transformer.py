"""All4One's centroid transformer (Estepa et al., ICCV 2023), with every constant configurable.

A transformer encoder over a sequence of neighbour embeddings [B, L, D] plus fixed sinusoidal
positional encodings; the first output token is the centroid [B, D].
"""

from __future__ import annotations

import math

import torch
from torch import nn


def sinusoidal_encoding(length: int, dim: int) -> torch.Tensor:
    """[length, dim] sin / cos encodings of the positions (Vaswani et al., 2017)."""
    position = torch.arange(length, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    enc = torch.zeros(length, dim)
    enc[:, 0::2] = torch.sin(position * freq)
    enc[:, 1::2] = torch.cos(position * freq[: dim // 2])
    return enc


class CentroidTransformer(nn.Module):
    """Args: dim (token size), num_layers, num_heads, ff_dim (feed-forward width), dropout,
    pos_len (positions encoded; sequences may be shorter). Upstream: 3 layers, 8 heads,
    ff 2 x dim, dropout 0.1, 5 positions."""

    def __init__(
        self,
        dim: int,
        num_layers: int = 3,
        num_heads: int = 8,
        ff_dim: int | None = None,
        dropout: float = 0.1,
        pos_len: int = 5,
    ):
        super().__init__()
        if dim % num_heads:
            raise ValueError(
                f"method_kwargs.num_heads={num_heads}: must divide the embedding dimension {dim}"
            )
        layer = nn.TransformerEncoderLayer(
            d_model=dim,
            nhead=num_heads,
            dim_feedforward=ff_dim or 2 * dim,
            dropout=dropout,
            batch_first=True,
        )
        self.encoder = nn.TransformerEncoder(
            layer, num_layers=num_layers, enable_nested_tensor=False
        )
        self.register_buffer("pos", sinusoidal_encoding(pos_len, dim), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, L, D] (L <= pos_len) -> the centroid, the first output token [B, D]."""
        if tokens.size(1) > self.pos.size(0):
            raise ValueError(
                f"sequence of {tokens.size(1)} tokens, but method_kwargs.pos_len={self.pos.size(0)}"
            )
        return self.encoder(tokens + self.pos[: tokens.size(1)])[:, 0]
