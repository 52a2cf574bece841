"""Loss kernels, forward + backward: each solo-ext loss against (a) the straightforward
implementation of the published formulation, as the official code writes it
(``tests/straightforward.py``, the tests' oracles), and (b) the floor: the kernel's big matmul +
logsumexp + their backward.

Sizes (``official``): DSCL B = 256, K = 65536, D = 128; DenseCL's dense term B = 256, S^2 = 49,
D = 128, K = 65536; All4One B = 256, k = 5, D = 256, support set 98304; PaCo (ImageNet-LT R50, per
GPU) B = 32 anchors, K = 8192, D = 128, C = 1000; BCL B = 256, D = 1024, C = 1000; KCL and TSC
(per GPU) B = 64, K = 65536, D = 128, 1000 classes (TSC: 1000 targets).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from straightforward import (  # tests/, put on the path by benchmarks/__init__.py
    all4one_straightforward,
    bcl_straightforward,
    densecl_dense_straightforward,
    dscl_straightforward,
    kcl_straightforward,
    paco_straightforward,
    published_positions,
    tsc_straightforward,
)

from solo_ext.losses.all4one import all4one_objective
from solo_ext.losses.bcl import bcl_contrastive_loss
from solo_ext.losses.densecl import queue_info_nce
from solo_ext.losses.dscl import dscl_loss
from solo_ext.losses.kcl import kcl_loss, tsc_loss
from solo_ext.losses.paco import paco_log_prior, paco_loss
from solo_ext.modules.centroid_transformer import CentroidTransformer

SIZES = {
    "official": {
        "dscl": {"b": 256, "k": 65536, "d": 128, "classes": 1000},
        "densecl": {"b": 256, "s": 49, "d": 128, "k": 65536},
        "all4one": {"b": 256, "knn": 5, "d": 256, "k": 98304},
        "paco": {"b": 32, "k": 8192, "d": 128, "classes": 1000},
        "bcl": {"b": 256, "d": 1024, "classes": 1000},
        "kcl": {"b": 64, "k": 65536, "d": 128, "classes": 1000},
        "tsc": {"b": 64, "k": 65536, "d": 128, "classes": 1000},
    },
    "tiny": {
        "dscl": {"b": 16, "k": 256, "d": 16, "classes": 10},
        "densecl": {"b": 4, "s": 9, "d": 16, "k": 256},
        "all4one": {"b": 16, "knn": 5, "d": 16, "k": 256},
        "paco": {"b": 8, "k": 64, "d": 16, "classes": 10},
        "bcl": {"b": 16, "d": 16, "classes": 10},
        "kcl": {"b": 8, "k": 256, "d": 16, "classes": 10},
        "tsc": {"b": 8, "k": 256, "d": 16, "classes": 10},
    },
}


@dataclass
class Kernel:
    """One benchmark: loss functions by role (``solo-ext``, ``straightforward``, ``floor``) and
    the inputs their gradients are taken for. ``solo-ext`` and ``straightforward`` compute the
    same loss (the tests check values and gradients)."""

    name: str
    shape: str
    losses: dict[str, Callable[[], torch.Tensor]]
    inputs: list[torch.Tensor]

    @property
    def candidates(self) -> dict[str, Callable[[], None]]:
        """Forward + backward of each loss (forward alone where nothing needs a gradient)."""

        def run(loss_fn: Callable[[], torch.Tensor]) -> Callable[[], None]:
            def call() -> None:
                loss = loss_fn()
                if loss.requires_grad:
                    torch.autograd.grad(loss, self.inputs, allow_unused=True)

            return call

        return {role: run(fn) for role, fn in self.losses.items()}


def _unit(*shape: int, device: torch.device, grad: bool = False) -> torch.Tensor:
    return F.normalize(torch.randn(*shape, device=device), dim=-1).requires_grad_(grad)


# ---- DSCL ---------------------------------------------------------------------------------


def floor_loss(q: torch.Tensor, contrast: torch.Tensor, t: float) -> torch.Tensor:
    """One matmul of the kernel's shape + logsumexp."""
    return torch.logsumexp(q @ contrast.T / t, dim=1).mean()


def dscl_kernel(size: dict, device: torch.device) -> Kernel:
    b, k, d, classes = size["b"], size["k"], size["d"], size["classes"]
    q, key = _unit(b, d, device=device, grad=True), _unit(b, d, device=device, grad=True)
    queue = _unit(k, d, device=device)
    labels = torch.randint(0, classes, (b,), device=device)
    queue_labels = torch.randint(0, classes, (k,), device=device)
    contrast = torch.cat([q, key, queue]).detach()
    beta, t = 8.0, 0.07  # the official code's beta; alpha = 1 / (1 + beta)

    def ours():
        return dscl_loss(
            q,
            key,
            queue,
            labels,
            queue_labels,
            alpha=1 / (1 + beta),
            temperature=t,
            num_classes=classes,
        )

    def straightforward():
        return dscl_straightforward(q, key, queue, labels, queue_labels, beta, t)

    def floor():
        return floor_loss(q, contrast, t)

    return Kernel(
        "dscl loss",
        f"B={b} K={k} D={d} C={classes}",
        {"solo-ext": ours, "straightforward": straightforward, "floor": floor},
        [q, key],
    )


# ---- DenseCL (dense term) -----------------------------------------------------------------


def densecl_kernel(size: dict, device: torch.device) -> Kernel:
    b, s, d, k = size["b"], size["s"], size["d"], size["k"]
    q_dense = _unit(b, s, d, device=device).transpose(1, 2).requires_grad_()  # [B, D, S]
    k_dense = _unit(b, s, d, device=device).transpose(1, 2)
    queue = _unit(k, d, device=device)
    match = torch.randint(0, s, (b, s), device=device)
    valid = torch.ones(k, dtype=torch.bool, device=device)
    t = 0.2

    def ours():
        positives = torch.gather(k_dense, 2, match[:, None, :].expand(b, d, s))
        flat = q_dense.transpose(1, 2).reshape(b * s, d)
        return queue_info_nce(flat, positives.transpose(1, 2).reshape(b * s, d), queue, valid, t)

    def straightforward():
        return densecl_dense_straightforward(q_dense, k_dense, queue, match, t)

    def floor():
        return floor_loss(q_dense.transpose(1, 2).reshape(b * s, d), queue, t)

    return Kernel(
        "densecl dense term",
        f"B={b} S^2={s} D={d} K={k}",
        {"solo-ext": ours, "straightforward": straightforward, "floor": floor},
        [q_dense],
    )


# ---- All4One ------------------------------------------------------------------------------


def all4one_kernel(size: dict, device: torch.device) -> Kernel:
    b, knn, d, k = size["b"], size["knn"], size["d"], size["k"]
    heads = 8 if d % 8 == 0 else 1
    transformer = CentroidTransformer(
        d, num_heads=heads, dropout=size.get("dropout", 0.1), pos_len=knn, pos_encoding="upstream"
    )
    transformer = transformer.to(device)
    pos = published_positions(knn, d).to(device)
    queue = _unit(k, d, device=device)
    mz = tuple(_unit(b, d, device=device) for _ in range(2))
    p, c, proj = (
        tuple(torch.randn(b, d, device=device, requires_grad=True) for _ in range(2))
        for _ in range(3)
    )
    params = [*p, *c, *proj, *transformer.parameters()]

    def ours():
        nn_keys = tuple(queue[(z @ queue.T).topk(knn, dim=1).indices] for z in mz)
        return all4one_objective(p, c, proj, mz, nn_keys, transformer, knn, 0.2, 0.1).total

    def straightforward():
        return all4one_straightforward(
            p, c, proj, mz, queue, transformer.encoder, pos, knn, 0.2, 0.1
        )

    def floor():  # the support-set search alone: no implementation can do less
        return sum((z @ queue.T).topk(knn, dim=1).values.sum() for z in mz)

    return Kernel(
        "all4one loss",
        f"B={b} k={knn} D={d} support={k}",
        {"solo-ext": ours, "straightforward": straightforward, "floor": floor},
        params,
    )


# ---- PaCo ---------------------------------------------------------------------------------


def paco_kernel(size: dict, device: torch.device) -> Kernel:
    b, k, d, classes = size["b"], size["k"], size["d"], size["classes"]
    q = _unit(b, d, device=device, grad=True)
    key, queue = _unit(b, d, device=device), _unit(k, d, device=device)
    sup_logits = torch.randn(b, classes, device=device, requires_grad=True)
    y = torch.randint(0, classes, (b,), device=device)
    labels = torch.cat([y, y, torch.randint(0, classes, (k,), device=device)])
    counts = torch.arange(classes, 0, -1).float() ** 2  # long-tailed training counts
    log_prior = paco_log_prior(counts).to(device)
    alpha, beta, gamma, t = 0.05, 1.0, 1.0, 0.2  # ImageNet-LT R50

    def ours():
        features = torch.cat([q, key, queue])
        return paco_loss(
            features,
            labels,
            sup_logits,
            batch_size=b,
            alpha=alpha,
            beta=beta,
            gamma=gamma,
            temperature=t,
            log_prior=log_prior,
        )

    def straightforward():
        features = torch.cat([q, key, queue])
        return paco_straightforward(
            features, labels, sup_logits, log_prior, b, alpha, beta, gamma, t
        )

    def floor():
        return floor_loss(q, torch.cat([q, key, queue]).detach(), t)

    return Kernel(
        "paco loss",
        f"B={b} K={k} D={d} C={classes}",
        {"solo-ext": ours, "straightforward": straightforward, "floor": floor},
        [q, sup_logits],
    )


# ---- BCL (BalSCL) -------------------------------------------------------------------------


def bcl_kernel(size: dict, device: torch.device) -> Kernel:
    b, d, classes = size["b"], size["d"], size["classes"]
    features = _unit(b, 2, d, device=device, grad=True)
    prototypes = _unit(classes, d, device=device, grad=True)
    labels = torch.randint(0, classes, (b,), device=device)
    t = 0.07

    def ours():
        return bcl_contrastive_loss(features, prototypes, labels, temperature=t)

    def straightforward():
        return bcl_straightforward(features, prototypes, labels, t)

    def floor():
        anchors = features.transpose(0, 1).reshape(2 * b, d)
        return floor_loss(anchors, torch.cat([anchors, prototypes]), t)

    return Kernel(
        "bcl contrastive loss",
        f"B={b} D={d} C={classes}",
        {"solo-ext": ours, "straightforward": straightforward, "floor": floor},
        [features, prototypes],
    )


# ---- KCL and TSC --------------------------------------------------------------------------


def _moco_inputs(size: dict, device: torch.device):
    b, k, d, classes = size["b"], size["k"], size["d"], size["classes"]
    q = _unit(b, d, device=device, grad=True)
    key, queue = _unit(b, d, device=device), _unit(k, d, device=device)
    labels = torch.randint(0, classes, (b,), device=device)
    queue_labels = torch.randint(0, classes, (k,), device=device)
    return q, key, queue, labels, queue_labels


def kcl_kernel(size: dict, device: torch.device) -> Kernel:
    q, key, queue, labels, queue_labels = _moco_inputs(size, device)
    k_pos, t = 6, 0.07

    def ours():
        return kcl_loss(q, key, queue, labels, queue_labels, k_pos=k_pos, temperature=t)

    def straightforward():
        return kcl_straightforward(q, key, queue, labels, queue_labels, k_pos, t)

    def floor():
        return floor_loss(q, queue, t)

    return Kernel(
        "kcl loss",
        f"B={size['b']} K={size['k']} D={size['d']} C={size['classes']} k={k_pos}",
        {"solo-ext": ours, "straightforward": straightforward, "floor": floor},
        [q],
    )


def tsc_kernel(size: dict, device: torch.device) -> Kernel:
    q, key, queue, labels, queue_labels = _moco_inputs(size, device)
    classes = size["classes"]
    targets = _unit(classes, size["d"], device=device)
    assignment = torch.randperm(classes, device=device)
    num_positive, t, tw = 6, 0.07, 0.2

    def gen():  # both draw the same positives
        return torch.Generator(device=device).manual_seed(0)

    def ours():
        return tsc_loss(
            q,
            key,
            queue,
            labels,
            queue_labels,
            targets,
            assignment,
            num_positive=num_positive,
            temperature=t,
            target_weight=tw,
            separate_target=True,
            generator=gen(),
        ).loss

    def straightforward():
        return tsc_straightforward(
            q, key, queue, labels, queue_labels, targets, assignment, num_positive, t, tw, gen()
        )

    def floor():
        return floor_loss(q, torch.cat([queue, targets]), t)

    return Kernel(
        "tsc loss",
        f"B={size['b']} K={size['k']} D={size['d']} targets={classes} k={num_positive}",
        {"solo-ext": ours, "straightforward": straightforward, "floor": floor},
        [q],
    )


KERNELS = {
    "dscl": dscl_kernel,
    "densecl": densecl_kernel,
    "all4one": all4one_kernel,
    "paco": paco_kernel,
    "bcl": bcl_kernel,
    "kcl": kcl_kernel,
    "tsc": tsc_kernel,
}
