"""All4One's centroid transformer (Estepa et al., ICCV 2023), with every constant configurable.

A transformer encoder over a sequence of neighbour embeddings [B, L, D] plus fixed sinusoidal
positional encodings; the first output token is the centroid [B, D].

Two layouts of the encoding are offered (``pos_encoding``):

- ``"tokens"``: the usual one (Vaswani et al., 2017): position = token, frequencies along the
  embedding;
- ``"upstream"``: what the All4One code adds (``Summer(PositionalEncodingPermute1D(5))``): the
  sequence is read as [B, channels = tokens, length = embedding], so the "position" is the
  embedding coordinate and each token is one sin / cos channel. It still gives every token a
  distinct fixed vector, and is the default of ``all4one_ct`` because the published results were
  obtained with it.
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


def upstream_encoding(length: int, dim: int) -> torch.Tensor:
    """[length, dim]: token t, coordinate d gets channel t of a ``length``-channel 1-D sinusoidal
    encoding at position d (channels interleaved sin, cos, sin, ...; rounded up to even)."""
    channels = 2 * math.ceil(length / 2)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, channels, 2, dtype=torch.float32) / channels))
    angles = torch.arange(dim, dtype=torch.float32)[:, None] * inv_freq  # [dim, channels / 2]
    enc = torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)  # [dim, channels]
    return enc[:, :length].T.contiguous()


POSITIONAL_ENCODINGS = {"tokens": sinusoidal_encoding, "upstream": upstream_encoding}


class CentroidTransformer(nn.Module):
    """Args: dim (token size), num_layers, num_heads, ff_dim (feed-forward width), dropout,
    pos_len (positions encoded; sequences may be shorter), pos_encoding (``"tokens"`` or
    ``"upstream"``, see the module). Upstream: 3 layers, 8 heads, ff 2 x dim, dropout 0.1,
    5 positions, the upstream layout."""

    def __init__(
        self,
        dim: int,
        num_layers: int = 3,
        num_heads: int = 8,
        ff_dim: int | None = None,
        dropout: float = 0.1,
        pos_len: int = 5,
        pos_encoding: str = "tokens",
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
        if pos_encoding not in POSITIONAL_ENCODINGS:
            raise ValueError(
                f"method_kwargs.pos_encoding={pos_encoding!r}: must be one of "
                f"{sorted(POSITIONAL_ENCODINGS)}"
            )
        encoding = POSITIONAL_ENCODINGS[pos_encoding](pos_len, dim)
        self.register_buffer("pos", encoding, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, L, D] (L <= pos_len) -> the centroid, the first output token [B, D]."""
        if tokens.size(1) > self.pos.size(0):
            raise ValueError(
                f"sequence of {tokens.size(1)} tokens, but method_kwargs.pos_len={self.pos.size(0)}"
            )
        return self.encoder(tokens + self.pos[: tokens.size(1)])[:, 0]
