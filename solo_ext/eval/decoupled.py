"""The decoupled classifier stages on a frozen backbone's features: cRT, tau-normalisation and
LWS (Kang et al., "Decoupling representation and classifier for long-tailed recognition", ICLR
2020) and post-hoc logit adjustment (Menon et al., "Long-tail learning via logit adjustment",
ICLR 2021). What each stage computes, as the papers' code computes it:

- the **instance-sampled classifier**: a linear layer (with bias) trained on the features with
  every image drawn equally often (the joint classifier the other stages start from);
- ``crt`` (classifier re-training): a linear layer trained from scratch on the same features
  with class-balanced sampling;
- ``tau_norm``: the instance-sampled classifier's weight rows divided by their norm to the power
  tau, the bias left out: ``s_j = x . w_j / ||w_j||^tau``; tau is chosen on a held-out split
  (never the test split) from a grid, by the mean of the per-class accuracies;
- ``lws`` (learnable weight scaling): the instance-sampled classifier frozen, its logits
  multiplied by a learnable scale per class (started at 1), trained with class-balanced sampling;
- ``logit_adjust``: the instance-sampled classifier's logits less tau x log of the training
  prior, ``s_j = f_j(x) - tau log(n_j / N)``.

Both entry points run them here (``solo-ext-linear``, and ``main_linear.py`` after its own linear
stage): :func:`run_stages` trains on the cached features with a plain SGD loop (a linear layer on
fixed features needs no strategy: every process of a distributed run computes the same numbers
from the same seed, and the first one reports), with nothing of Lightning.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from solo_ext.data.samplers import build_sampler
from solo_ext.eval.options import DECOUPLED_STAGES

# the class-balanced draw of cRT's and LWS's training (the long-tail sampler of that name)
BALANCED = "class_balanced"

__all__ = ["DECOUPLED_STAGES"]  # (the stages this module computes, declared with their keys)


def tau_normalised_weight(weight: torch.Tensor, tau: float) -> torch.Tensor:
    """[C, D] weight rows divided by their L2 norm to the power ``tau`` (0: unchanged, 1: unit
    rows)."""
    return weight / weight.norm(dim=1, keepdim=True).pow(tau)


def tau_norm_scores(features: torch.Tensor, weight: torch.Tensor, tau: float) -> torch.Tensor:
    """[N, C] scores of the tau-normalised classifier: no bias, as the stage defines it."""
    return features @ tau_normalised_weight(weight, tau).T


def log_prior(class_counts: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """[C] log(n_j / N) of the training split's class counts (every count > 0)."""
    counts = torch.as_tensor(class_counts, dtype=torch.float64)
    if counts.dim() != 1 or bool((counts <= 0).any()):
        raise ValueError(f"class counts {counts.tolist()}: must be a list of counts > 0")
    return (counts / counts.sum()).log()


def logit_adjusted_scores(
    logits: torch.Tensor, class_counts: Sequence[int] | torch.Tensor, tau: float = 1.0
) -> torch.Tensor:
    """[N, C] logits less ``tau`` x the log training prior (post-hoc logit adjustment)."""
    return logits - tau * log_prior(class_counts).to(logits.dtype)


def class_mean_accuracy(scores: torch.Tensor, labels: torch.Tensor, num_classes: int) -> float:
    """The mean over the classes present in ``labels`` of each class's top-1 accuracy."""
    hit = (scores.argmax(dim=1) == labels).double()
    present = torch.bincount(labels, minlength=num_classes) > 0
    per_class = torch.zeros(num_classes, dtype=torch.float64).index_add_(0, labels, hit)
    per_class = per_class[present] / torch.bincount(labels, minlength=num_classes)[present]
    return float(per_class.mean())


def tau_grid(tau_max: float, steps: int) -> list[float]:
    """``steps`` evenly spaced values from 0 to ``tau_max`` (the papers' grid: 0 to 2, 21)."""
    if steps == 1:
        return [0.0]
    return [tau_max * i / (steps - 1) for i in range(steps)]


def choose_tau(
    features: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor, taus: Sequence[float]
) -> tuple[float, list[float]]:
    """The tau of ``taus`` whose tau-normalised classifier has the best mean per-class accuracy
    on the given (held-out) features, the smallest on a tie; and the accuracy of each tau."""
    num_classes = weight.size(0)
    accs = [
        class_mean_accuracy(tau_norm_scores(features, weight, t), labels, num_classes) for t in taus
    ]
    best = max(range(len(taus)), key=lambda i: (accs[i], -i))
    return float(taus[best]), accs


def held_out_split(
    labels: torch.Tensor, fraction: float, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices (fit, held out) of a seeded split of each class's images: ``floor(fraction x
    n_j)`` of class j held out, at least one where the class has two or more, none where it has
    one (every class keeps an image to fit on)."""
    if not 0 < fraction < 1:
        raise ValueError(f"held_out_fraction={fraction!r}: must lie in (0, 1)")
    gen = torch.Generator().manual_seed(seed)
    fit, held = [], []
    for c in torch.unique(labels).tolist():
        members = torch.nonzero(labels == c).flatten()
        members = members[torch.randperm(members.numel(), generator=gen)]
        n = members.numel()
        k = 0 if n < 2 else min(n - 1, max(1, math.floor(fraction * n)))
        held.append(members[:k])
        fit.append(members[k:])
    return torch.cat(fit).sort().values, torch.cat(held).sort().values


class ScaledLinear(nn.Module):
    """LWS's classifier: a frozen linear layer whose logits are multiplied by a learnable scale
    per class, started at 1: ``s_j = f_j * (W x + b)_j``."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.linear = linear
        for p in self.linear.parameters():
            p.requires_grad_(False)
        self.scales = nn.Parameter(torch.ones(linear.out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * self.scales


def fit_on_features(
    head: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    momentum: float,
    weight_decay: float,
    sampler: str | None,
    seed: int,
    device: torch.device | str = "cpu",
) -> nn.Module:
    """Trains ``head``'s trainable parameters on the features ``x`` [N, D] with cross-entropy:
    SGD with momentum and weight decay, the lr decayed by a cosine over ``epochs`` and stepped
    once per epoch (Kang et al.'s stage-2 schedule), batches of ``batch_size`` shuffled (a seeded
    permutation per epoch) or drawn by the long-tail ``sampler`` (seeded, its epoch set), the
    last short batch dropped when there is a full one. Returns ``head`` in eval mode."""
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, epochs)
    n = int(y.numel())
    gen = torch.Generator().manual_seed(seed)
    draw = None
    if sampler is not None:
        draw = build_sampler(sampler, y, seed=seed, num_replicas=1, rank=0)
    head.to(device).train()
    for epoch in range(epochs):
        if draw is None:
            order = torch.randperm(n, generator=gen)
        else:
            draw.set_epoch(epoch)
            order = torch.as_tensor(list(draw), dtype=torch.long)
        stop = len(order) - len(order) % batch_size if len(order) > batch_size else len(order)
        for start in range(0, stop, batch_size):
            idx = order[start : start + batch_size]
            loss = F.cross_entropy(head(x[idx].to(device)), y[idx].to(device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        schedule.step()
    return head.eval()


def run_stages(
    stages: Sequence[str],
    options: Mapping[str, Any],
    feats: Mapping[str, torch.Tensor],
    class_counts: Sequence[int],
    seed: int,
    device: torch.device | str = "cpu",
) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, Any]]]:
    """The decoupled ``stages`` on cached features (``feats``: ``train_x``, ``train_y``,
    ``val_x``): each stage's [N_val, C] scores, and how each was trained (its record keys,
    ``linear_<stage>_*``; tau-norm's chosen tau and held-out size). ``options`` are the checked
    ``decoupled`` keys; ``decoupled.batch_size`` is the whole batch and ``decoupled.lr`` the lr
    per 256 images, scaled by it. Seeded by ``seed``: the same numbers on every process."""
    d = options
    train_x, train_y = feats["train_x"].float(), feats["train_y"].long()
    x_val = feats["val_x"].float()
    num_classes = len(class_counts)
    lr = d["lr"] * d["batch_size"] / 256
    how = {
        "crt": (d["epochs"], BALANCED),
        "tau_norm": (d["epochs"], None),
        "lws": (d["lws_epochs"], BALANCED),
        "logit_adjust": (d["epochs"], None),
    }

    def fit(head: nn.Module, x: torch.Tensor, y: torch.Tensor, stage: str) -> nn.Module:
        epochs, sampler = how[stage]
        return fit_on_features(
            head, x, y, epochs=epochs, batch_size=d["batch_size"], lr=lr,
            momentum=d["momentum"], weight_decay=d["weight_decay"], sampler=sampler,
            seed=seed, device=device,
        ).cpu()  # fmt: skip

    def linear(x: torch.Tensor, y: torch.Tensor, stage: str) -> nn.Linear:
        with torch.random.fork_rng(devices=[]):  # PyTorch's init, seeded: the same on every run
            torch.manual_seed(seed)
            layer = nn.Linear(x.size(1), num_classes)
        return fit(layer, x, y, stage)

    extra = {
        stage: {
            f"linear_{stage}_epochs": how[stage][0],
            f"linear_{stage}_sampler": how[stage][1] or "shuffle",
            f"linear_{stage}_batch": d["batch_size"],
            f"linear_{stage}_lr": lr,
        }
        for stage in stages
    }
    scores: dict[str, torch.Tensor] = {}
    if "lws" in stages or "logit_adjust" in stages:
        instance = linear(train_x, train_y, "logit_adjust")  # every image equally often
    if "crt" in stages:
        scores["crt"] = _scores(linear(train_x, train_y, "crt"), x_val)
    if "tau_norm" in stages:
        fit_idx, held = held_out_split(train_y, d["held_out_fraction"], seed)
        weight = linear(train_x[fit_idx], train_y[fit_idx], "tau_norm").weight.detach()
        taus = tau_grid(d["tau_max"], d["tau_steps"])
        tau, _ = choose_tau(train_x[held], train_y[held], weight, taus)
        scores["tau_norm"] = tau_norm_scores(x_val, weight, tau)
        extra["tau_norm"].update(
            {"linear_tau_norm_tau": tau, "linear_tau_norm_held_out": int(held.numel())}
        )
    if "lws" in stages:
        lws = fit(ScaledLinear(copy.deepcopy(instance).train()), train_x, train_y, "lws")
        scores["lws"] = _scores(lws, x_val)
    if "logit_adjust" in stages:
        tau = d["logit_adjust_tau"]
        logits = _scores(instance, x_val)
        scores["logit_adjust"] = logit_adjusted_scores(logits, class_counts, tau)
        extra["logit_adjust"]["linear_logit_adjust_tau"] = tau
    return {stage: scores[stage].float() for stage in stages}, extra


def _scores(head: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return head.eval()(x)


def report_stages(
    stages: Sequence[str],
    options: Mapping[str, Any],
    feats: Mapping[str, Any],
    data: Any,
    seed: int,
    device: torch.device | str,
    out_dir: Any,
    first: bool = True,
) -> dict[str, Any]:
    """:func:`run_stages` on ``feats`` (:func:`solo_ext.eval.common.split_features`'s), each
    stage reported under ``linear_<stage>_`` (printed, and with ``out_dir`` written: per-class
    files and ``metrics.json``) by the ``first`` process; the others return no keys."""
    from solo_ext.data.datasets import train_class_counts
    from solo_ext.eval.common import report

    counts = train_class_counts(feats["train"])
    scores, extra = run_stages(stages, options, feats, counts, seed, device)
    if not first:
        return {}
    metrics: dict[str, Any] = {}
    for stage in stages:
        metrics.update(
            report(
                scores[stage],
                feats["val_y"],
                feats["train"],
                data,
                f"linear_{stage}_",
                out_dir,
                extra[stage],
                f"classifier stage {stage}",
            )  # fmt: skip
        )
    return metrics
