"""K-positive contrastive learning (KCL) and targeted supervised contrastive learning (TSC).

Both are MoCo losses with a labelled queue. For anchor i (a query q_i, normalised) the contrast
set is k_i (the key of the same image) followed by the K queue slots, and, for TSC only, the
class targets; the logits are laid out as MoCo's ``cat([l_pos, l_neg]) / T``:

    log p(c | q_i) = q_i . c / T - log sum_{a in A_i} exp(q_i . a / T)

KCL (Kang et al., ICLR 2021; official code ``bingykang/BalFeat``, ``moco/kcl_builder.py``,
class ``KCL``, loss ``util.SoftCrossEntropyLoss``): a soft target puts 1 / (1 + |S_i|) on k_i
and on each of the chosen same-class slots S_i (at most ``posk`` of them):

    L = 1/B sum_i -1 / (1 + |S_i|) * (log p(k_i | q_i) + sum_{s in S_i} log p(s | q_i))

S_i is ``gt_mask.topk(posk, 1, True, True)`` on the 0/1 float same-class mask, with the
picked slots that are not of the class dropped again (``posk_mask = gt_mask * posk_mask``): so
S_i is *all* the same-class slots when there are at most ``posk`` of them, and otherwise
``posk`` of them chosen by ``torch.topk``'s tie-breaking: not random, but not documented
either (on CPU, torch 2.x, it took the lowest slot indices of a 65536-slot queue in our tries,
other slots for queues under ~100; the official runs were on CUDA). ``selection="first"``
gives the lowest slot indices by construction. ``posk=None`` (the argparse default) uses every
same-class slot; the README runs ``--posk 6``. Same-class slots left out of S_i stay in the
denominator (``losstype='v1'``, the default); ``'v2'`` multiplies their logits by 0, so each
still adds exp(0) = 1 to the denominator. The empty slots (label -1, random unit keys, the
queue's start) are negatives. Defaults (``main_kcl.py``): T = ``--moco-t`` 0.07, queue
``--moco-k`` 65536, ``--moco-dim`` 128, m = 0.999.

The TSC repository (``LTH14/targeted-supcon``, ``moco/builder.py``, class ``KCL``) has its own
KCL: the same loss with S_i drawn at random (``num_positive`` rounds; in each, every anchor
that has same-class slots left draws one uniformly, ``floor(rand * n)`` in slot order, without
replacement). Its ``--K 0`` means *all* same-class slots (here ``num_positive=None``).

TSC (Li et al., CVPR 2022; ``moco/builder.py``, ``targeted=True``): C fixed unit targets
(``optimal_1000_128_analytical.npy``, shipped; ``target_generation.py`` makes such a set by
minimising mean_i log sum_j exp(t_i . t_j / 0.07) with Adam, see :func:`tsc_targets`), each
repeated ``tr`` times, join the contrast set after the queue. Every step the class centroids
(a buffer started as random unit vectors) move towards the batch's normalised mean query of
each class present, c <- normalise(0.9 c + 0.1 normalise(mean q)) (:func:`tsc_update_centroids`),
and ``scipy.optimize.linear_sum_assignment(-centroids @ targets.T)`` assigns a target to each
class (:func:`tsc_assign`). The ``tr`` copies of the anchor's class target are then positives:

- ``sep_t=False`` (argparse default): they join the same-class queue slots in the pool that the
  ``num_positive`` random draws take from, so a drawn target counts like a drawn slot;
- ``sep_t=True`` (the README's TSC run): the draws take from the queue only and the target
  copies are always positives.

The other classes' targets (all C * tr rows) are negatives. The centroid update and the
matching run on detached queries gathered from all ranks, before the loss of the same step;
the official code fixes C = 1000 (``n_cls``) and reads the 1000 x 128 file. (The repository's
``cifar_dirty`` code is another scheme: targets appended to a SupCon batch, a fixed class
order, no matching.)

With n_i = 1 + |S_i| + |T_i| (T_i: the anchor's target positives) and tw = ``--tw``:

    loss_class  = 1/B sum_i -(log p(k_i | q_i) + sum_{s in S_i} log p(s | q_i)) / n_i
    loss_target = tw/B sum_i -(sum_{t in T_i} log p(t | q_i)) / n_i
    loss        = loss_class + loss_target

Defaults (``main_moco_supcon_imba.py``, ImageNet-LT): ``--K`` 6, ``--moco-t`` 0.07, ``--tr`` 1,
``--tw`` 1, ``sep_t`` off, queue 65536, dim 128; the README's TSC run adds ``--targeted --tr 1
--sep_t --tw 0.2`` (400 epochs; KCL 200), lr 0.1, batch 256, ``--mlp``, ``--cos``.

Implementation notes: similarities and the softmax are computed in float32 (float64 inputs stay
float64), with ``log_softmax`` where the official TSC code writes
``F.normalize(logits.exp(), p=1).log()`` (the same numbers while no logit exceeds ~88). The
assignment is scipy's ``linear_sum_assignment``, as the official code's.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F

from solo_ext.common import EMPTY

Selection = Literal["topk", "first", "random"]


def _check_inputs(q, k, queue, labels, queue_labels, temperature) -> None:
    if q.dim() != 2:
        raise ValueError(f"q.shape={tuple(q.shape)}: must be [B, D]")
    if k.shape != q.shape:
        raise ValueError(f"k.shape={tuple(k.shape)}: must equal q.shape={tuple(q.shape)}")
    if queue.dim() != 2 or queue.size(1) != q.size(1):
        raise ValueError(f"queue.shape={tuple(queue.shape)}: must be [K, {q.size(1)}]")
    if labels.shape != (q.size(0),):
        raise ValueError(f"labels.shape={tuple(labels.shape)}: must be [{q.size(0)}]")
    if queue_labels.shape != (queue.size(0),):
        raise ValueError(
            f"queue_labels.shape={tuple(queue_labels.shape)}: must be [{queue.size(0)}]"
        )
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise ValueError(f"temperature={temperature!r}: must be a number > 0")
    if not temperature > 0:
        raise ValueError(f"temperature={temperature!r}: must be > 0")


def _check_count(name: str, value: int | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name}={value!r}: must be None or an integer >= 0")


def _same_class(labels: torch.Tensor, queue_labels: torch.Tensor) -> torch.Tensor:
    """[B, K] bool: slot j holds anchor i's label (empty slots never do)."""
    return (labels[:, None] == queue_labels[None, :]) & (queue_labels != EMPTY)[None, :]


def sample_positives(
    pool: torch.Tensor, num: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """The TSC repository's draw of ``num`` positives per anchor, without replacement.

    Each of ``num`` rounds draws ``u = torch.rand(B)`` (one per anchor, also for anchors with
    nothing left) and every anchor with n > 0 candidates left takes its ``floor(u * n)``-th
    remaining candidate in column order (u * n in float32, as the official code computes it).

    Args:
        pool: [B, N] bool, the candidates of each anchor.
        num: rounds (positives per anchor, fewer where the pool runs out).
        generator: the random source (on ``pool``'s device); None: the global one.

    Returns:
        [B, N] bool, the drawn candidates.
    """
    if num is None:
        raise ValueError("num=None: must be an integer >= 0")
    _check_count("num", num)
    # the candidates in row-major order (column order within a row), drawn from a flat list:
    # each round costs the number of candidates, not B x N
    rows, cols = pool.nonzero(as_tuple=True)
    alive = torch.ones_like(rows, dtype=torch.bool)
    drawn = torch.zeros_like(pool)
    b = pool.size(0)
    for _ in range(num):
        n = torch.zeros(b, dtype=torch.long, device=pool.device).index_add_(0, rows, alive.long())
        u = torch.rand(b, generator=generator, device=pool.device)
        # u <= 1 - 2^-24 keeps u * n below n in float32; the clamp only guards other sources
        pick = (u * n.float()).floor().long().clamp(max=(n - 1).clamp(min=0))
        # the pick-th remaining candidate of each row: the one whose running count in its row
        # (alive candidates of earlier rows taken off) is pick + 1
        within = alive.long().cumsum(0) - (n.cumsum(0) - n)[rows]
        chosen = alive & (within == pick[rows] + 1)
        drawn[rows[chosen], cols[chosen]] = True
        alive &= ~chosen
    return drawn


def kcl_positives(
    labels: torch.Tensor,
    queue_labels: torch.Tensor,
    k_pos: int | None = 6,
    selection: Selection = "topk",
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """The chosen same-class queue slots S_i (module docstring).

    Args:
        labels: [B] batch labels; queue_labels: [K], ``-1`` marks an empty slot.
        k_pos: at most this many per anchor (``posk``); None: all same-class slots.
        selection: ``"topk"``: ``torch.topk`` on the 0/1 mask, BalFeat's operation (its
            tie-breaking, undocumented, picks among the slots); ``"first"``: the lowest slot
            indices; ``"random"``: the TSC repository's draw (:func:`sample_positives`).
        generator: the random source of ``"random"``.

    Returns:
        [B, K] bool.
    """
    _check_count("k_pos", k_pos)
    if selection not in ("topk", "first", "random"):
        raise ValueError(f"selection={selection!r}: must be 'topk', 'first' or 'random'")
    same = _same_class(labels, queue_labels)
    if k_pos is None:
        return same
    if selection == "first":
        return same & (same.long().cumsum(dim=1) <= k_pos)
    if selection == "random":
        return sample_positives(same, k_pos, generator)
    kk = min(k_pos, same.size(1))
    _, top = same.float().topk(kk, dim=1, largest=True, sorted=True)
    picked = torch.zeros_like(same).scatter_(1, top, True)
    return picked & same


def _log_probs(
    q: torch.Tensor,
    k: torch.Tensor,
    bank: torch.Tensor,
    temperature: float,
    zero_logits: torch.Tensor | None = None,
    drop: torch.Tensor | None = None,
) -> torch.Tensor:
    """[B, 1 + N] log p over cat([k_i], bank) in float32 or wider.

    ``zero_logits`` [B, N]: bank logits multiplied by 0 (KCL v2); ``drop`` [N]: columns left out
    of the contrast set (log p = -inf).
    """
    dtype = torch.promote_types(q.dtype, torch.float32)
    with torch.autocast(device_type=q.device.type, enabled=False):
        q, k, bank = q.to(dtype), k.to(dtype), bank.to(dtype)
        l_pos = (q * k).sum(dim=1, keepdim=True)
        l_neg = q @ bank.T
        if zero_logits is not None:
            l_neg = l_neg.masked_fill(zero_logits, 0.0)
        logits = torch.cat([l_pos, l_neg], dim=1) / temperature
        if drop is not None:
            dropped = torch.cat([drop.new_zeros(1), drop])
            logits = logits.masked_fill(dropped[None, :], float("-inf"))
        return F.log_softmax(logits, dim=1)


def kcl_loss(
    q: torch.Tensor,
    k: torch.Tensor,
    queue: torch.Tensor,
    labels: torch.Tensor,
    queue_labels: torch.Tensor,
    *,
    k_pos: int | None = 6,
    temperature: float = 0.07,
    loss_type: Literal["v1", "v2"] = "v1",
    selection: Selection = "topk",
    generator: torch.Generator | None = None,
    positives: torch.Tensor | None = None,
    mask_empty: bool = False,
) -> torch.Tensor:
    """Mean over anchors of the KCL loss (BalFeat's soft cross-entropy; module docstring).

    Args:
        q: [B, D] normalised queries (anchors); k: [B, D] normalised keys, k_i of q_i.
        queue: [K, D] normalised queued keys; queue_labels: [K], ``-1`` marks an empty slot.
        labels: [B] batch labels (>= 0).
        k_pos: positives per anchor (``posk``; the README runs 6); None: every same-class slot;
            0: none, MoCo's InfoNCE.
        temperature: T > 0 (``--moco-t``, 0.07).
        loss_type: ``"v1"``: same-class slots not chosen stay negatives; ``"v2"``: their logits
            are multiplied by 0.
        selection, generator: how the k_pos are chosen (:func:`kcl_positives`); ``"topk"`` is
            BalFeat's operation, ``"random"`` the TSC repository's.
        positives: [B, K] bool, the chosen slots given explicitly (a subset of the same-class
            slots, not checked); then k_pos, selection and generator are unused.
        mask_empty: leave the empty slots out of the contrast set (the official queue keeps
            their random keys as negatives).

    Returns:
        The scalar loss, in float32 (float64 for float64 inputs).
    """
    _check_inputs(q, k, queue, labels, queue_labels, temperature)
    if loss_type not in ("v1", "v2"):
        raise ValueError(f"loss_type={loss_type!r}: must be 'v1' or 'v2'")
    if positives is None:
        positives = kcl_positives(labels, queue_labels, k_pos, selection, generator)
    elif positives.shape != (q.size(0), queue.size(0)) or positives.dtype != torch.bool:
        raise ValueError(
            f"positives: {positives.dtype} {tuple(positives.shape)}, must be bool "
            f"[{q.size(0)}, {queue.size(0)}]"
        )
    unused = _same_class(labels, queue_labels) & ~positives if loss_type == "v2" else None
    drop = queue_labels == EMPTY if mask_empty else None
    log_p = _log_probs(q, k, queue, temperature, unused, drop)
    soft = kcl_soft_target(positives, log_p.dtype)
    # zero-weight columns may hold -inf (mask_empty): leave them out of the sum
    return -(soft * log_p.masked_fill(soft == 0, 0.0)).sum(dim=1).mean()


def kcl_soft_target(positives: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """BalFeat's soft target over cat([k_i], queue): 1 / (1 + |S_i|) on k_i and on S_i.

    Args:
        positives: [B, K] bool, the chosen slots S_i.

    Returns:
        [B, 1 + K] in ``dtype``, rows summing to 1.
    """
    chosen = torch.cat([torch.ones_like(positives[:, :1]), positives], dim=1).to(dtype)
    return chosen / chosen.sum(dim=1, keepdim=True)


class TSCLoss(NamedTuple):
    """The TSC loss and its two terms (``loss = loss_class + loss_target``), scalars."""

    loss: torch.Tensor
    loss_class: torch.Tensor
    loss_target: torch.Tensor


def tsc_loss(
    q: torch.Tensor,
    k: torch.Tensor,
    queue: torch.Tensor,
    labels: torch.Tensor,
    queue_labels: torch.Tensor,
    targets: torch.Tensor | None,
    assignment: torch.Tensor | None,
    *,
    num_positive: int | None = 6,
    temperature: float = 0.07,
    target_weight: float = 1.0,
    target_repeat: int = 1,
    separate_target: bool = False,
    generator: torch.Generator | None = None,
    mask_empty: bool = False,
) -> TSCLoss:
    """The TSC loss of ``moco/builder.py`` (module docstring).

    Args:
        q: [B, D] normalised queries (anchors); k: [B, D] normalised keys, k_i of q_i.
        queue: [K, D] normalised queued keys; queue_labels: [K], ``-1`` marks an empty slot.
        labels: [B] batch labels in [0, C).
        targets: [T, D] unit targets (each repeated ``target_repeat`` times in the contrast
            set, after the queue), or None: the TSC repository's KCL (no targets).
        assignment: [C] long, class c's target index in [0, T) (:func:`tsc_assign`); None
            with targets None.
        num_positive: random draws per anchor (``--K``, 6) from the pool of candidates (module
            docstring); None: every candidate (the official ``--K 0``).
        temperature: T > 0 (``--moco-t``, 0.07).
        target_weight: tw, the weight of ``loss_target`` (``--tw``: 1; the README's run 0.2).
        target_repeat: copies of each target (``--tr``, 1).
        separate_target: ``--sep_t`` (off; on in the README's run): the target copies are
            always positives and the draws take from the queue only.
        generator: the random source of the draws; None: the global one.
        mask_empty: leave the empty slots out of the contrast set (the official code keeps
            them as negatives).

    Returns:
        :class:`TSCLoss` (loss, loss_class, loss_target).
    """
    _check_inputs(q, k, queue, labels, queue_labels, temperature)
    _check_count("num_positive", num_positive)
    if isinstance(target_repeat, bool) or not isinstance(target_repeat, int) or target_repeat < 1:
        raise ValueError(f"target_repeat={target_repeat!r}: must be an integer >= 1")
    if isinstance(target_weight, bool) or not isinstance(target_weight, (int, float)):
        raise ValueError(f"target_weight={target_weight!r}: must be a number")
    if (targets is None) != (assignment is None):
        raise ValueError(
            f"targets={'None' if targets is None else 'given'}, "
            f"assignment={'None' if assignment is None else 'given'}: give both or neither"
        )
    b, n_queue = q.size(0), queue.size(0)
    same = _same_class(labels, queue_labels)
    if targets is None:
        bank = queue
        target_pos = same.new_zeros(b, 0)
    else:
        if targets.dim() != 2 or targets.size(1) != q.size(1):
            raise ValueError(f"targets.shape={tuple(targets.shape)}: must be [T, {q.size(1)}]")
        if assignment.dim() != 1:
            raise ValueError(f"assignment.shape={tuple(assignment.shape)}: must be [C]")
        n_t = targets.size(0)
        bank = torch.cat([queue, targets.to(queue.dtype).repeat_interleave(target_repeat, 0)])
        # the anchor's class target, all its copies
        first = assignment.to(labels.device)[labels] * target_repeat
        cols = torch.arange(n_t * target_repeat, device=labels.device)
        target_pos = (cols[None, :] >= first[:, None]) & (
            cols[None, :] < first[:, None] + target_repeat
        )
    if separate_target or targets is None:
        drawn = same if num_positive is None else sample_positives(same, num_positive, generator)
        pos_queue, pos_target = drawn, target_pos
    else:
        pool = torch.cat([same, target_pos], dim=1)
        drawn = pool if num_positive is None else sample_positives(pool, num_positive, generator)
        pos_queue, pos_target = drawn[:, :n_queue], drawn[:, n_queue:]
    drop = None
    if mask_empty:
        drop = torch.cat([queue_labels == EMPTY, same.new_zeros(bank.size(0) - n_queue)])
    log_p = _log_probs(q, k, bank, temperature, None, drop)
    ones = torch.ones_like(same[:, :1])
    zeros_queue = torch.zeros_like(same)
    class_mask = torch.cat([ones, pos_queue, torch.zeros_like(pos_target)], dim=1)
    target_mask = torch.cat([~ones, zeros_queue, pos_target], dim=1)
    count = (class_mask | target_mask).sum(dim=1).to(log_p.dtype)
    loss_class = -(log_p.masked_fill(~class_mask, 0.0).sum(dim=1) / count).mean()
    loss_target = -(log_p.masked_fill(~target_mask, 0.0).sum(dim=1) / count).mean()
    loss_target = loss_target * target_weight
    return TSCLoss(loss_class + loss_target, loss_class, loss_target)


def tsc_update_centroids(
    centroids: torch.Tensor,
    features: torch.Tensor,
    labels: torch.Tensor,
    momentum: float = 0.9,
) -> torch.Tensor:
    """TSC's class centroids after one step (no gradient; the official code uses all ranks'
    gathered, detached queries).

    For each class c in ``labels``: c <- normalise(m c + (1 - m) normalise(mean of the class's
    features)); the other classes keep theirs.

    Args:
        centroids: [C, D] unit centroids; features: [N, D] normalised queries; labels: [N] in
            [0, C).
        momentum: m, 0.9 in the official code (fixed there).

    Returns:
        [C, D] new centroids.
    """
    if centroids.dim() != 2 or features.dim() != 2 or centroids.size(1) != features.size(1):
        raise ValueError(
            f"centroids.shape={tuple(centroids.shape)}, features.shape={tuple(features.shape)}: "
            "must be [C, D] and [N, D]"
        )
    if labels.shape != (features.size(0),):
        raise ValueError(f"labels.shape={tuple(labels.shape)}: must be [{features.size(0)}]")
    if isinstance(momentum, bool) or not isinstance(momentum, (int, float)):
        raise ValueError(f"momentum={momentum!r}: must be a number")
    with torch.no_grad():
        features = features.detach().to(centroids.dtype)
        n_cls = centroids.size(0)
        sums = centroids.new_zeros(centroids.shape).index_add_(0, labels, features)
        counts = torch.bincount(labels, minlength=n_cls)
        present = counts > 0
        batch = F.normalize(sums / counts.clamp(min=1)[:, None].to(sums.dtype), dim=1)
        moved = F.normalize(momentum * centroids + (1 - momentum) * batch, dim=1)
        return torch.where(present[:, None], moved, centroids)


def tsc_assign(centroids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The target of each class: the assignment that maximises the summed similarity
    centroid_c . target_{a(c)}, as ``linear_sum_assignment(-centroids @ targets.T)``.

    Args:
        centroids: [C, D] class centroids; targets: [T, D] unit targets, T >= C.

    Returns:
        [C] long on ``centroids``' device, distinct target indices.
    """
    if centroids.dim() != 2 or targets.dim() != 2 or centroids.size(1) != targets.size(1):
        raise ValueError(
            f"centroids.shape={tuple(centroids.shape)}, targets.shape={tuple(targets.shape)}: "
            "must be [C, D] and [T, D]"
        )
    if targets.size(0) < centroids.size(0):
        raise ValueError(
            f"targets.shape={tuple(targets.shape)}: needs at least C={centroids.size(0)} rows"
        )
    with torch.no_grad():
        sim = centroids.detach().double() @ targets.detach().to(centroids.device).double().T
    from scipy.optimize import linear_sum_assignment

    _, cols = linear_sum_assignment(-sim.cpu().numpy())
    return torch.as_tensor(cols, dtype=torch.long, device=centroids.device)


def tsc_targets(
    num_classes: int,
    dim: int,
    *,
    steps: int = 10000,
    lr: float = 1e-3,
    temperature: float = 0.07,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Unit targets spread on the sphere, as ``target_generation.py`` makes them.

    x ~ N(0, 1) [C, D]; ``steps`` Adam steps (lr 1e-3) on mean_i log sum_j exp(z_i . z_j / t)
    with z = normalise(x) (j = i included); returns the z of lowest loss among those evaluated
    (before each step). The official script runs C = 1000, D = 128, t = 0.07; the builder
    loads the shipped ``optimal_1000_128_analytical.npy`` instead.

    Args:
        num_classes, dim: C, D >= 1; steps >= 1.
        generator: the random source of x (CPU); None: the global one.

    Returns:
        [C, D] float32 unit rows.
    """
    for name, value in (("num_classes", num_classes), ("dim", dim), ("steps", steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r}: must be an integer >= 1")
    if not temperature > 0:
        raise ValueError(f"temperature={temperature!r}: must be > 0")
    with torch.enable_grad():
        x = torch.randn(num_classes, dim, generator=generator).requires_grad_()
        opt = torch.optim.Adam([x], lr=lr)
        best, best_loss = None, float("inf")
        for _ in range(steps):
            z = F.normalize(x, dim=1)
            loss = (z @ z.T).div(temperature).exp().sum(dim=-1).log().mean()
            if loss.item() < best_loss:
                best_loss, best = loss.item(), z.detach().clone()
            opt.zero_grad()
            loss.backward()
            opt.step()
    return best
