"""``densecl``: dense contrastive learning (Wang et al., CVPR 2021), MoCo v2 + a dense term.

The projector is DenseCL's global branch (avg-pool -> MLP); the dense branch is the same MLP
applied at every location of the backbone's last map (1x1 conv - ReLU - 1x1 conv), optionally
pooled to a ``grid_size`` x ``grid_size`` grid. One direction per step, as the published code
trains: the first large crop's queries against the second crop's keys, whose B global keys and
B averaged dense keys are enqueued.

Its ``method_kwargs``: the class's docstring lists them, from their declarations.

With ``lambda: 0`` this is the MoCo v2 baseline of the paper, at MoCo v2's cost: the dense
branch is then not computed at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from omegaconf import DictConfig

from solo_ext.config import Option
from solo_ext.host import gather, initialize_momentum_params
from solo_ext.losses.densecl import dense_correspondence, densecl_loss, queue_info_nce
from solo_ext.methods.base import QUEUE_STARTS, MomentumQueueMethod, require_spatial_map
from solo_ext.modules.queue import KeyQueue


class DenseCL(MomentumQueueMethod):
    METHOD_KWARGS: dict[str, Option] = {
        **MomentumQueueMethod.METHOD_KWARGS,
        "temperature": Option(
            0.2, "float", 0, low_open=True, help="of both InfoNCE terms (MoCo v2 / DenseCL)"
        ),
        "lambda": Option(
            0.5,
            "float",
            0,
            1,
            help=(
                "weight of the dense term, in [0, 1], from the first step as in the published"
                " configs; 0: the MoCo v2 baseline (the dense branch is then not computed)"
            ),
        ),
        "warmup_steps": Option(
            0,
            "int",
            0,
            help=(
                "optimiser steps with lambda = 0 first (the published code's warm-up hook, "
                "which its configs leave off)"
            ),
        ),
        "grid_size": Option(
            None,
            "int",
            1,
            nullable=True,
            help="pool the last map to this grid; null: the backbone's",
        ),
        "symmetric": Option(
            False,
            "bool",
            help=(
                "both directions per step, with a global and a dense queue per view (as solo-"
                "learn's MoCo v2+)"
            ),
        ),
        "queue_start": Option(
            "random",
            "str",
            choices=QUEUE_STARTS,
            help=(
                "`random`: both queues start as random unit keys, all in the loss from the "
                "first step, as published; `empty`: slots left out until written"
            ),
        ),
        "projector_init": Option(
            "kaiming",
            "str",
            choices=("kaiming", "default"),
            help=(
                "`kaiming`: the global projector's linear layers Kaiming-normal (fan in, ReLU"
                " gain) with zero biases, the dense branch at PyTorch's default, as the "
                "published neck; `default`: PyTorch's default for both"
            ),
        ),
    }

    def __init__(self, cfg: DictConfig):
        super().__init__(cfg)
        kw = cfg.method_kwargs
        if kw.projector_init == "kaiming":  # the published neck's start; the key copy follows
            for layer in self.projector.modules():
                if isinstance(layer, torch.nn.Linear):
                    torch.nn.init.kaiming_normal_(layer.weight, mode="fan_in", nonlinearity="relu")
                    torch.nn.init.zeros_(layer.bias)
            initialize_momentum_params(self.projector, self.momentum_projector)
        # the same MLP as the global projector, applied at every location
        self.dense_projector, self.momentum_dense_projector = (
            self.build_projector(kw) for _ in range(2)
        )
        initialize_momentum_params(self.dense_projector, self.momentum_dense_projector)
        # the second view's keys; with symmetric, also queues of the first view's
        self.dense_queue = self.build_queue(kw)
        self.queue_view1 = self.dense_queue_view1 = None
        if kw.symmetric:
            self.queue_view1 = self.build_queue(kw)
            self.dense_queue_view1 = self.build_queue(kw)

    def build_queue(self, kw: DictConfig) -> KeyQueue:
        """MoCo's queue: keys without labels, started as ``queue_start`` says."""
        return KeyQueue(kw.queue_size, kw.proj_output_dim, filled=kw.queue_start == "random")

    @classmethod
    def check_method_kwargs(cls, cfg: DictConfig) -> None:
        super().check_method_kwargs(cfg)
        require_spatial_map(cfg)

    @property
    def learnable_params(self) -> list[dict[str, Any]]:
        return super().learnable_params + [
            {"name": "dense_projector", "params": self.dense_projector.parameters()}
        ]

    @property
    def momentum_pairs(self) -> list[tuple[Any, Any]]:
        return super().momentum_pairs + [(self.dense_projector, self.momentum_dense_projector)]

    @property
    def dense_enabled(self) -> bool:
        return self.cfg.method_kwargs["lambda"] > 0

    def wants_feature_map(self, momentum: bool) -> bool:
        return self.dense_enabled  # both backbones' maps (queries and keys)

    def _dense(self, out: dict[str, Any], dense_projector: torch.nn.Module) -> dict[str, Any]:
        """The map ``fmap`` of the host's pass, pooled to ``grid_size`` and flattened
        [B, C, S], and its dense projections ``dense`` [B, D, S] (not normalised)."""
        fmap = out["fmap"]
        grid = self.cfg.method_kwargs.grid_size
        if grid is not None:
            fmap = F.adaptive_avg_pool2d(fmap, grid)
        fmap = fmap.flatten(2)
        dense = dense_projector(fmap.transpose(1, 2)).transpose(1, 2)
        out.update(fmap=fmap, dense=dense)
        return out

    def forward(self, X: torch.Tensor) -> dict[str, Any]:
        """The host's pass (with its map while training), then the dense branch."""
        out = super().forward(X)
        if "fmap" in out:
            out = self._dense(out, self.dense_projector)
            out["dense"] = F.normalize(out["dense"], dim=1)
        return out

    @torch.no_grad()
    def momentum_forward(self, X: torch.Tensor) -> dict[str, Any]:
        out = super().momentum_forward(X)
        if "fmap" not in out:
            return out
        out = self._dense(out, self.momentum_dense_projector)
        # the dense negatives: the global average of each key's dense output
        out["dense_key"] = F.normalize(out["dense"].mean(dim=2), dim=1)
        out["dense"] = F.normalize(out["dense"], dim=1)
        return out

    def current_lambda(self) -> float:
        """0 during the first ``warmup_steps`` optimiser steps, then ``lambda``."""
        kw = self.cfg.method_kwargs
        return 0.0 if self.trainer.global_step < kw.warmup_steps else float(kw["lambda"])

    def directions(self) -> list[tuple[int, int, KeyQueue, KeyQueue]]:
        """(query crop, key crop, global queue, dense queue) of every direction of a step."""
        first = [(0, 1, self.queue, self.dense_queue)]
        if not self.cfg.method_kwargs.symmetric:
            return first
        return first + [(1, 0, self.queue_view1, self.dense_queue_view1)]

    def training_step(self, batch: Sequence[Any], batch_idx: int) -> torch.Tensor:
        out = super().training_step(batch, batch_idx)
        self.record_train_features(out, batch)
        lam = self.current_lambda()
        directions = self.directions()
        if not self.dense_enabled:  # MoCo v2
            q, k, t = out["z"], out["momentum_z"], self.temperature
            loss = sum(
                queue_info_nce(q[qi], k[ki], queue.keys, queue.valid, t)
                for qi, ki, queue, _ in directions
            ) / len(directions)
            self.check_finite({"train_global_loss": loss})
            self.log_dict(
                {"train_densecl_loss": loss, "train_global_loss": loss, "densecl_lambda": 0.0},
                on_epoch=True,
                sync_dist=True,
            )
            for _, ki, queue, _ in directions:
                self.enqueue_after_step(queue, gather(k[ki]))
            return loss + out["loss"]
        totals, global_terms, dense_terms = [], [], []
        for qi, ki, queue, dense_queue in directions:
            match = dense_correspondence(out["fmap"][qi], out["momentum_fmap"][ki])
            total, global_term, dense_term = densecl_loss(
                out["z"][qi],
                out["momentum_z"][ki],
                queue.keys,
                out["dense"][qi],
                out["momentum_dense"][ki],
                dense_queue.keys,
                match,
                lam,
                self.temperature,
                queue.valid,
                dense_queue.valid,
            )
            totals.append(total)
            global_terms.append(global_term)
            dense_terms.append(dense_term)
        n = len(directions)
        loss = sum(totals) / n
        terms = {
            "train_densecl_loss": loss,
            "train_global_loss": sum(global_terms) / n,
            "train_dense_loss": sum(dense_terms) / n,
        }
        self.check_finite(terms)
        self.log_dict({**terms, "densecl_lambda": lam}, on_epoch=True, sync_dist=True)
        for _, ki, queue, dense_queue in directions:
            self.enqueue_after_step(queue, gather(out["momentum_z"][ki]))
            self.enqueue_after_step(dense_queue, gather(out["momentum_dense_key"][ki]))
        return loss + out["loss"]
