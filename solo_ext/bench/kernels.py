"""Loss kernels, forward + backward: each solo-ext loss against (a) a straightforward
implementation of the published formulation, written here as the official code writes it
(mask matrices over the whole contrast set, similarities recomputed, one transformer call per
sequence), and (b) the floor: the kernel's big matmul + logsumexp + their backward.

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


def dscl_straightforward(q, k, queue, labels, queue_labels, beta: float, t: float):
    """DSCL as the official code computes it (SupContrast style, in its ``beta`` form): float
    masks [B, N] over the contrast set [queries, keys, queue], the max-subtracted logits,
    exp * mask; the augmented view weighs 1 and the other positives beta / |P_i| each, then
    the weighted mean of the log-probabilities. Written apart from solo-ext's loss, which takes
    alpha = 1 / (1 + beta)."""
    b = q.size(0)
    contrast = torch.cat([q, k, queue])
    col_labels = torch.cat([labels, labels, queue_labels])
    n = contrast.size(0)
    rows = torch.arange(b, device=q.device)
    logits_mask = torch.ones(b, n, device=q.device)
    logits_mask[rows, rows] = 0
    same = torch.eq(labels[:, None], col_labels[None, :]).float() * logits_mask
    aug = torch.zeros(b, n, device=q.device)
    aug[rows, b + rows] = 1
    other = same - aug
    mask = aug + beta * other / other.sum(dim=1, keepdim=True).clamp(min=1)
    logits = q @ contrast.T / t
    logits = logits - logits.max(dim=1, keepdim=True).values.detach()
    exp_logits = torch.exp(logits) * logits_mask
    log_prob = logits - torch.log(exp_logits.sum(dim=1, keepdim=True))
    return -((mask * log_prob).sum(dim=1) / mask.sum(dim=1)).mean()


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

    def straightforward():  # the official code: gather on [B, D, S], einsums, concatenated logits
        indexed = torch.gather(k_dense, 2, match.unsqueeze(1).expand(-1, d, -1))
        l_pos = (q_dense * indexed).sum(dim=1).reshape(-1, 1)
        q_grid = q_dense.permute(0, 2, 1).reshape(-1, d)
        l_neg = torch.einsum("nc,ck->nk", q_grid, queue.T)
        logits = torch.cat([l_pos, l_neg], dim=1) / t
        target = torch.zeros(logits.size(0), dtype=torch.long, device=device)
        return F.cross_entropy(logits, target)

    def floor():
        return floor_loss(q_dense.transpose(1, 2).reshape(b * s, d), queue, t)

    return Kernel(
        "densecl dense term",
        f"B={b} S^2={s} D={d} K={k}",
        {"solo-ext": ours, "straightforward": straightforward, "floor": floor},
        [q_dense],
    )


# ---- All4One ------------------------------------------------------------------------------


def _off_diagonal(x: torch.Tensor) -> torch.Tensor:
    n = x.size(0)
    return x.flatten()[:-1].view(n - 1, n + 1)[:, 1:].flatten()


def published_positions(length: int, dim: int) -> torch.Tensor:
    """The published code's positions, [length, dim]: a 1-D sinusoidal encoding over ``dim``
    positions with ``length`` channels (sin and cos interleaved), read channel-first."""
    channels = 2 * ((length + 1) // 2)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, channels, 2).float() / channels))
    sin_inp = torch.einsum("i,j->ij", torch.arange(dim).float(), inv_freq)
    emb = torch.cat([sin_inp.sin()[..., None], sin_inp.cos()[..., None]], dim=-1)
    return emb.reshape(dim, channels)[:, :length].permute(1, 0)


def all4one_straightforward(p, c, proj, mz, queue, encoder, pos, knn: int, t: float, tc: float):
    """Upstream's step: top-1 and top-k from two similarity matmuls per view, one transformer
    call per sequence, the off-diagonal through a flattened view."""

    def find_nn(z):
        _ = (z @ queue.T).max(dim=1)[1]
        idx = (z @ queue.T).topk(knn, dim=1).indices
        return queue[idx]

    def nce(a, b, temp):
        a, b = F.normalize(a, dim=-1), F.normalize(b, dim=-1)
        return F.cross_entropy(a @ b.T / temp, torch.arange(a.size(0), device=a.device))

    nn1, nn2 = find_nn(mz[0]), find_nn(mz[1])
    rich1, rich2 = encoder(nn1 + pos)[:, 0], encoder(nn2 + pos)[:, 0]
    s1 = encoder(torch.cat([c[0][:, None], nn1], 1)[:, :knn] + pos)[:, 0]
    s2 = encoder(torch.cat([c[1][:, None], nn2], 1)[:, :knn] + pos)[:, 0]
    centroid = nce(rich1, s2, tc) / 2 + nce(rich2, s1, tc) / 2
    neighbour = nce(nn1[:, 0], p[1], t) / 2 + nce(nn2[:, 0], p[0], t) / 2
    m1, m2 = F.normalize(mz[0], dim=0), F.normalize(mz[1], dim=0)
    z1, z2 = F.normalize(proj[0], dim=0), F.normalize(proj[1], dim=0)
    corr1, corr2 = m1.T @ z2, m2.T @ z1
    on = (corr1.diagonal().add(-1).pow(2).mean() + corr2.diagonal().add(-1).pow(2).mean()) / 2
    off = (_off_diagonal(corr1).pow(2).mean() + _off_diagonal(corr2).pow(2).mean()) / 2
    feature = (0.5 * on.sqrt() + 0.5 * off.sqrt()) * 10
    return 0.5 * centroid + 0.5 * neighbour + 0.5 * feature


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


def paco_straightforward(features, labels, sup_logits, log_prior, b, alpha, beta, gamma, t):
    """PaCo as the official ``PaCoLoss`` computes it (supt = 1, base temperature = t): float
    masks [B, C + N] over the centres and the contrast set, the concatenated logits shifted by
    their row max, exp * weights, log(sum + 1e-12), the weighted mean of the log-probabilities."""
    c = sup_logits.size(1)
    col = labels.view(-1, 1)
    same = torch.eq(col[:b], col.T).float()
    sims = features[:b] @ features.T / t
    all_logits = torch.cat([sup_logits + log_prior, sims], dim=1)
    shifted = all_logits - all_logits.max(dim=1, keepdim=True).values.detach()
    rows = torch.arange(b, device=features.device).view(-1, 1)
    not_self = torch.scatter(torch.ones_like(same), 1, rows, 0)
    same = same * not_self
    target = F.one_hot(col[:b].view(-1), num_classes=c).float()
    pos_weight = torch.cat([target * beta, same * alpha], dim=1)
    denom_weight = torch.cat([torch.ones(b, c, device=features.device), gamma * not_self], dim=1)
    denom = (torch.exp(shifted) * denom_weight).sum(dim=1, keepdim=True)
    log_prob = shifted - torch.log(denom + 1e-12)
    return -((pos_weight * log_prob).sum(dim=1) / pos_weight.sum(dim=1)).mean()


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


def bcl_straightforward(features, prototypes, labels, t: float):
    """BalSCL as the official ``loss/contrastive.py`` computes it: float masks [2B, 2B + C], the
    batch class counts from one-hot rows, the max-subtracted logits, exp * mask divided by the
    per-column class count, the mean log-probability of the positives. (The official code reads
    the per-column count with a Python loop of ``.item()``; here one index does it.)"""
    b, c = features.size(0), prototypes.size(0)
    targets = labels.view(-1, 1)
    targets = torch.cat([targets.repeat(2, 1), torch.arange(c, device=labels.device).view(-1, 1)])
    batch_cls_count = torch.eye(c, device=labels.device)[targets].sum(dim=0).squeeze()
    mask = torch.eq(targets[: 2 * b], targets.T).float()
    rows = torch.arange(2 * b, device=labels.device).view(-1, 1)
    logits_mask = torch.scatter(torch.ones_like(mask), 1, rows, 0)
    mask = mask * logits_mask
    columns = torch.cat([torch.cat(torch.unbind(features, dim=1), dim=0), prototypes])
    logits = columns[: 2 * b].mm(columns.T) / t
    logits = logits - logits.max(dim=1, keepdim=True).values.detach()
    exp_logits = torch.exp(logits) * logits_mask
    per_ins_weight = batch_cls_count[targets.view(-1)].view(1, -1) - mask
    exp_logits_sum = exp_logits.div(per_ins_weight).sum(dim=1, keepdim=True)
    log_prob = logits - torch.log(exp_logits_sum)
    return -((mask * log_prob).sum(dim=1) / mask.sum(dim=1)).mean()


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


def kcl_straightforward(q, k, queue, labels, queue_labels, posk: int, t: float):
    """KCL as BalFeat's ``KCL.forward`` + ``SoftCrossEntropyLoss`` compute it: the float
    same-class mask [B, K], ``topk`` on it, the soft target over the concatenated logits,
    ``log_softmax``."""
    bs, big_k = q.size(0), queue.size(0)
    l_pos = torch.einsum("nc,nc->n", q, k).unsqueeze(-1)
    l_neg = torch.einsum("nc,ck->nk", q, queue.T)
    gt_mask = (queue_labels.expand(bs, big_k) == labels.expand(big_k, bs).T).float()
    _, pred = gt_mask.topk(posk, 1, True, True)
    posk_mask = gt_mask * torch.zeros(bs, big_k, device=q.device).scatter_(1, pred, 1.0)
    soft = torch.cat([torch.ones(bs, 1, device=q.device), posk_mask], dim=1)
    soft = soft / soft.sum(dim=1, keepdim=True)
    logits = torch.cat([l_pos, l_neg], dim=1) / t
    return torch.sum(-F.log_softmax(logits, dim=1) * soft) / bs


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


def tsc_straightforward(q, k, queue, labels, queue_labels, targets, assignment, num_positive,
                        t, tw, gen):  # fmt: skip
    """TSC as targeted-supcon's ``KCL.forward`` computes it (``targeted``, ``sep_t``, tr = 1):
    the float mask [B, K + T] over queue and targets, ``num_positive`` rounds of flat
    ``nonzero`` draws, the concatenated logits, ``F.normalize(logits.exp(), p=1).log()``.
    (The official code marks each class's target in a Python loop over the classes; here one
    scatter does it.)"""
    b, n_queue = q.size(0), queue.size(0)
    l_pos = torch.einsum("nc,nc->n", q, k).unsqueeze(-1)
    l_neg = torch.einsum("nc,ck->nk", q, torch.cat([queue.T, targets.T], dim=1))
    logits = torch.cat([l_pos, l_neg], dim=1)
    all_labels = torch.cat([queue_labels, torch.full_like(assignment, -1)]).view(1, -1)
    mask = torch.eq(labels.view(-1, 1), all_labels).float()
    mask_target = torch.zeros_like(mask)
    mask_target[torch.arange(b, device=q.device), n_queue + assignment[labels]] = 1
    mask_pos_view = torch.zeros_like(mask)
    for _ in range(num_positive):
        all_pos_idxs = mask.view(-1).nonzero().view(-1)
        num_pos_per_anchor = mask.sum(1)
        num_pos_cum = num_pos_per_anchor.cumsum(0).roll(1)
        num_pos_cum[0] = 0
        rand = torch.rand(b, generator=gen, device=q.device)
        idxs = ((rand * num_pos_per_anchor).floor() + num_pos_cum).long()
        idxs = idxs[num_pos_per_anchor.nonzero().view(-1)]
        sampled = all_pos_idxs[idxs.view(-1)]
        mask_pos_view.view(-1)[sampled] = 1
        mask.view(-1)[sampled] = 0
    mask_pos_view_class = mask_pos_view.clone()
    mask_pos_view = mask_pos_view + mask_target
    ones, zeros = torch.ones(b, 1, device=q.device), torch.zeros(b, 1, device=q.device)
    mask_pos_view = torch.cat([ones, mask_pos_view], dim=1)
    mask_pos_view_class = torch.cat([ones, mask_pos_view_class], dim=1)
    mask_pos_view_target = torch.cat([zeros, mask_target], dim=1)
    log_prob = F.normalize((logits / t).exp(), dim=1, p=1).log()
    loss_class = -torch.sum((mask_pos_view_class * log_prob).sum(1) / mask_pos_view.sum(1)) / b
    loss_target = -torch.sum((mask_pos_view_target * log_prob).sum(1) / mask_pos_view.sum(1)) / b
    return loss_class + loss_target * tw


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
