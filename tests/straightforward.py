"""The published losses written as the official code computes them (mask matrices over the
whole contrast set, concatenated logits, similarities computed twice, one transformer call per
sequence): the oracles that solo-ext's losses are checked against (``test_bench.py``; in float64,
the PaCo, BCL and KCL tests' official replicas) and the "straightforward" candidates of the loss
benchmarks (``python -m benchmarks --what kernels``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


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


def densecl_dense_straightforward(q_dense, k_dense, queue, match, t: float):
    """DenseCL's dense term as the official code computes it: the matched keys gathered on
    [B, D, S], einsums, the positive concatenated before the negatives, cross-entropy."""
    d = q_dense.size(1)
    indexed = torch.gather(k_dense, 2, match.unsqueeze(1).expand(-1, d, -1))
    l_pos = (q_dense * indexed).sum(dim=1).reshape(-1, 1)
    q_grid = q_dense.permute(0, 2, 1).reshape(-1, d)
    l_neg = torch.einsum("nc,ck->nk", q_grid, queue.T)
    logits = torch.cat([l_pos, l_neg], dim=1) / t
    target = torch.zeros(logits.size(0), dtype=torch.long, device=q_dense.device)
    return F.cross_entropy(logits, target)


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


def paco_straightforward(
    features, labels, sup_logits, log_prior, b, alpha, beta, gamma, t, supt=1.0, base_t=None,
    smooth=0.0,
):  # fmt: skip
    """PaCo as the official ``PaCoLoss`` computes it (``PaCo/LT/losses.py``; GPaCo's
    ``GPaCo/LT/losses.py`` with b = N - K anchors and label smoothing ``smooth``): float masks
    [B, C + N] over the centres and the contrast set, the concatenated logits shifted by their row
    max, exp * weights, log(sum + 1e-12), the weighted mean of the log-probabilities, times
    t / base_t (base_t None: t). log_prior None: no prior (GPaCo without its class weights)."""
    c = sup_logits.size(1)
    col = labels.view(-1, 1)
    same = torch.eq(col[:b], col.T).to(features.dtype)
    sims = features[:b] @ features.T / t
    centres = (sup_logits if log_prior is None else sup_logits + log_prior) / supt
    all_logits = torch.cat([centres, sims], dim=1)
    shifted = all_logits - all_logits.max(dim=1, keepdim=True).values.detach()
    rows = torch.arange(b, device=features.device).view(-1, 1)
    not_self = torch.scatter(torch.ones_like(same), 1, rows, 0)
    same = same * not_self
    target = F.one_hot(col[:b].view(-1), num_classes=c).to(features.dtype)
    if smooth:
        target = smooth / (c - 1) * (1 - target) + (1 - smooth) * target
    pos_weight = torch.cat([target * beta, same * alpha], dim=1)
    denom_weight = torch.cat([torch.ones_like(target), gamma * not_self], dim=1)
    denom = (torch.exp(shifted) * denom_weight).sum(dim=1, keepdim=True)
    log_prob = shifted - torch.log(denom + 1e-12)
    scale = 1.0 if base_t is None else t / base_t
    return (-scale * (pos_weight * log_prob).sum(dim=1) / pos_weight.sum(dim=1)).mean()


def bcl_straightforward(features, prototypes, labels, t: float, reduction: str = "mean"):
    """BalSCL as the official ``loss/contrastive.py`` computes it: float masks [2B, 2B + C], the
    batch class counts from one-hot rows, the max-subtracted logits, exp * mask divided by the
    per-column class count, the mean log-probability of the positives; ``reduction="none"``: the
    per-anchor losses as [2, B]. (The official code reads the per-column count with a Python loop
    of ``.item()``; here one index does it.)"""
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
    per_anchor = -(mask * log_prob).sum(dim=1) / mask.sum(dim=1)
    return per_anchor.mean() if reduction == "mean" else per_anchor.view(2, b)


def kcl_straightforward(
    q, k, queue, labels, queue_labels, posk: int | None, t: float, losstype="v1"
):
    """KCL as BalFeat's ``moco/kcl_builder.py`` computes it (``KCL.forward`` +
    ``SoftCrossEntropyLoss``): the float same-class mask [B, K], ``topk`` on it (posk None: every
    same-class slot; ``v2``: the same-class slots not chosen are cut out of the negatives), the
    soft target over the concatenated logits, ``log_softmax``."""
    bs, big_k = q.size(0), queue.size(0)
    l_pos = torch.einsum("nc,nc->n", q, k).unsqueeze(-1)
    l_neg = torch.einsum("nc,ck->nk", q, queue.T)
    gt_mask = (queue_labels.expand(bs, big_k) == labels.expand(big_k, bs).T).float()
    if posk is not None:
        _, pred = gt_mask.topk(posk, 1, True, True)
        posk_mask = gt_mask * torch.zeros(bs, big_k, device=q.device).scatter_(1, pred, 1.0)
        if losstype == "v2":
            l_neg = l_neg * (1 - (gt_mask * (1 - posk_mask)).to(q.dtype))
        gt_mask = posk_mask
    soft = torch.cat([torch.ones(bs, 1, device=q.device), gt_mask], dim=1).to(q.dtype)
    soft = soft / soft.sum(dim=1, keepdim=True)
    logits = torch.cat([l_pos, l_neg], dim=1) / t
    return torch.sum(-F.log_softmax(logits, dim=1) * soft) / bs


def official_sampling(mask, num_positive, gen):
    """The ``num_positive`` loop of targeted-supcon's ``KCL.forward`` (float mask, flat
    ``nonzero``): the sampled positives' mask."""
    mask = mask.clone()
    mask_pos_view = torch.zeros_like(mask)
    for _ in range(num_positive):
        all_pos_idxs = mask.view(-1).nonzero().view(-1)
        num_pos_per_anchor = mask.sum(1)
        num_pos_cum = num_pos_per_anchor.cumsum(0).roll(1)
        num_pos_cum[0] = 0
        rand = torch.rand(mask.size(0), generator=gen, device=mask.device)
        idxs = ((rand * num_pos_per_anchor).floor() + num_pos_cum).long()
        idxs = idxs[num_pos_per_anchor.nonzero().view(-1)]
        sampled = all_pos_idxs[idxs.view(-1)]
        mask_pos_view.view(-1)[sampled] = 1
        mask.view(-1)[sampled] = 0
    return mask_pos_view


def tsc_straightforward(q, k, queue, labels, queue_labels, targets, assignment, num_positive,
                        t, tw, gen):  # fmt: skip
    """TSC as targeted-supcon's ``KCL.forward`` computes it (``targeted``, ``sep_t``, tr = 1):
    the float mask [B, K + T] over queue and targets, ``num_positive`` rounds of flat
    ``nonzero`` draws (:func:`official_sampling`), the concatenated logits,
    ``F.normalize(logits.exp(), p=1).log()``.
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
    mask_pos_view = official_sampling(mask, num_positive, gen)
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
