"""``all4one_ct``: All4One (Estepa et al., ICCV 2023) with a configurable centroid transformer.

Momentum encoder and projector (3 layers, BN), a predictor for the neighbour contrast and one
for the centroid contrast, a support set of momentum projections (with labels and image
indexes) and the centroid transformer. It does not replace solo-learn's own ``all4one``; it
differs from it in what ``method_kwargs`` can set (every constant below), in finding the
nearest neighbour and the top-k with one matmul, in running the four centroid sequences of a
step through the transformer in one call, and in a support set of any size (wrap-around).

Its ``method_kwargs``: the class's docstring lists them, from their declarations.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from omegaconf import DictConfig

from solo_ext.config import ConfigError, Option
from solo_ext.host import gather
from solo_ext.losses.all4one import All4OneTerms, all4one_objective
from solo_ext.methods.base import MomentumQueueMethod
from solo_ext.modules import build_mlp
from solo_ext.modules.centroid_transformer import POSITIONAL_ENCODINGS, CentroidTransformer
from solo_ext.modules.support_set import Neighbours, SupportSet


class All4OneCT(MomentumQueueMethod):
    METHOD_KWARGS: dict[str, Option] = {
        "proj_hidden_dim": Option(
            2048, "int", 1, help="the projector's hidden width (3 layers, BN)"
        ),
        "proj_output_dim": Option(256, "int", 1, help="the embedding's width"),
        "pred_hidden_dim": Option(4096, "int", 1, help="the predictors' hidden width"),
        "temperature": Option(0.2, "float", 0, low_open=True, help="of the neighbour InfoNCE"),
        "centroid_temperature": Option(
            0.1, "float", 0, low_open=True, help="of the centroid InfoNCE (upstream's fixed value)"
        ),
        "queue_size": Option(98304, "int", 1, help="the support set's size (any size)"),
        "k": Option(5, "int", 1, help="neighbours per centroid, at most `queue_size`"),
        "num_layers": Option(3, "int", 1, help="the centroid transformer's layers"),
        "num_heads": Option(8, "int", 1, help="its attention heads"),
        "ff_dim": Option(
            None,
            "int",
            1,
            nullable=True,
            help="its feed-forward width; null: 2 x `proj_output_dim`",
        ),
        "dropout": Option(0.1, "float", 0, 1, high_open=True, help="its dropout"),
        "pos_len": Option(None, "int", 1, nullable=True, help="positions it encodes; null: `k`"),
        "pos_encoding": Option(
            "upstream",
            "str",
            choices=tuple(POSITIONAL_ENCODINGS),
            help=(
                "`upstream`: the published code's layout of the positional encoding; "
                "`tokens`: the usual one, over the tokens"
            ),
        ),
        "sigma": Option(0.5, "float", 0, help="weight of the neighbour term"),
        "kappa": Option(0.5, "float", 0, help="weight of the centroid term"),
        "eta": Option(5.0, "float", 0, help="weight of the feature term (redundancy reduction)"),
        "transformer_lr": Option(
            0.1,
            "float",
            0,
            low_open=True,
            help="the transformer's learning rate (not batch-scaled)",
        ),
        "feature_gather": Option(
            False,
            "bool",
            help=(
                "the feature term on the batch gathered over all processes; false: each "
                "process's own batch, as published (the same on one GPU)"
            ),
        ),
    }

    @classmethod
    def anchors_both_views(cls, cfg: DictConfig) -> bool:
        """Each of All4One's three losses is taken in both directions."""
        return True

    def __init__(self, cfg: DictConfig):
        super().__init__(cfg)
        kw = cfg.method_kwargs
        self.k: int = kw.k
        self.predictor, self.centroid_predictor = (
            build_mlp(kw.proj_output_dim, kw.pred_hidden_dim, kw.proj_output_dim) for _ in range(2)
        )
        self.centroid_transformer = CentroidTransformer(
            kw.proj_output_dim,
            num_layers=kw.num_layers,
            num_heads=kw.num_heads,
            ff_dim=kw.ff_dim,
            dropout=kw.dropout,
            pos_len=kw.pos_len or kw.k,
            pos_encoding=kw.pos_encoding,
        )

    def build_projector(self, kw: DictConfig) -> torch.nn.Module:
        """Upstream's projector: 3 linear layers, BN after each (the last one affine)."""
        return build_mlp(
            self.features_dim,
            kw.proj_hidden_dim,
            kw.proj_output_dim,
            num_layers=3,
            last_batch_norm=True,
            last_affine=True,
        )

    def build_queue(self, kw: DictConfig) -> SupportSet:
        return SupportSet(kw.queue_size, kw.proj_output_dim)

    @classmethod
    def check_method_kwargs(cls, cfg: DictConfig) -> None:
        super().check_method_kwargs(cfg)
        kw = cfg.method_kwargs
        if kw.k > kw.queue_size:
            raise ConfigError(
                f"method_kwargs.k={kw.k}: must be <= method_kwargs.queue_size={kw.queue_size}"
            )
        if kw.pos_len is not None and kw.pos_len < kw.k:
            raise ConfigError(
                f"method_kwargs.pos_len={kw.pos_len}: must be >= method_kwargs.k={kw.k}"
            )
        if kw.proj_output_dim % kw.num_heads:
            raise ConfigError(
                f"method_kwargs.num_heads={kw.num_heads}: must divide "
                f"method_kwargs.proj_output_dim={kw.proj_output_dim}"
            )

    @property
    def learnable_params(self) -> list[dict[str, Any]]:
        lr = self.cfg.method_kwargs.transformer_lr
        return super().learnable_params + [
            {"name": "predictor", "params": self.predictor.parameters()},
            {"name": "centroid_predictor", "params": self.centroid_predictor.parameters()},
            {
                "name": "centroid_transformer",
                "params": self.centroid_transformer.parameters(),
                "lr": lr,
            },
        ]

    def forward(self, X: torch.Tensor) -> dict[str, Any]:
        """Adds both predictions of the projection."""
        out = super().forward(X)
        out.update(p=self.predictor(out["proj"]), p_centroid=self.centroid_predictor(out["proj"]))
        return out

    def all4one_terms(
        self, out: dict[str, Any], neighbours: tuple[Neighbours, Neighbours]
    ) -> All4OneTerms:
        """The loss of one step from the outputs of the two large crops (lists in ``out``) and
        each view's neighbours in the support set."""
        kw = self.cfg.method_kwargs
        return all4one_objective(
            *(tuple(out[key][:2]) for key in ("p", "p_centroid", "proj", "momentum_z")),
            (neighbours[0].keys, neighbours[1].keys),
            self.centroid_transformer,
            self.k,
            kw.temperature,
            kw.centroid_temperature,
            kw.sigma,
            kw.kappa,
            kw.eta,
            gather=gather,
            offset=self.global_rank * out["p"][0].size(0),
            gather_feature=bool(kw.feature_gather),
        )

    def training_step(self, batch: Sequence[Any], batch_idx: int) -> torch.Tensor:
        indexes, _, targets = batch
        out = super().training_step(batch, batch_idx)
        self.record_train_features(out, batch)
        neighbours = tuple(self.queue.neighbours(z, self.k) for z in out["momentum_z"][:2])
        terms = self.all4one_terms(out, neighbours)
        # the nearest neighbour's label against the image's (unlabelled images left out)
        hits = (neighbours[0].labels[:, 0] == targets)[targets != -1]
        nn_acc = hits.float().mean() if hits.numel() else torch.zeros((), device=hits.device)
        z_std = torch.stack([z.std(dim=0).mean() for z in out["z"][:2]]).mean()
        losses = {
            "train_all4one_loss": terms.total,
            "train_neighbour_loss": terms.neighbour,
            "train_centroid_loss": terms.centroid,
            "train_feature_loss": terms.feature,
        }
        self.check_finite(losses)
        self.log_dict(
            {**losses, "train_nn_acc": nn_acc, "train_z_std": z_std.detach()},
            on_epoch=True,
            sync_dist=True,
        )
        # like upstream and NNCLR: the first view's momentum projections enter the support set
        self.enqueue_after_step(
            self.queue, gather(out["momentum_z"][0]), gather(targets), gather(indexes)
        )
        return terms.total + out["loss"]
