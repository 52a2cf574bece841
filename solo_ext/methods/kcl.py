"""``kcl`` and ``tsc``: k-positive and targeted supervised contrastive learning, MoCo-style.

Both are the ``scl`` method's step (momentum encoder, labelled queue, one direction per step:
the first crop's queries against the second crop's keys, the keys enqueued after the step) with
their own loss (``solo_ext.losses.kcl``). Both report a class-balanced linear classifier trained
after pretraining (two stages, like DSCL): ``scripts/linear/<dataset>/dscl.yaml``.

- ``kcl`` (Kang et al., ICLR 2021): a soft target spread evenly over the key and at most
  ``k_pos`` same-class queue entries, picked as the official code picks them (``torch.topk`` on
  the same-class mask).
- ``tsc`` (Li et al., CVPR 2022): after ``kcl_epochs`` of KCL, KCL with ``num_positive``
  same-class entries drawn at random plus C fixed targets spread on the sphere (made once, when
  the run starts, as the official ``target_generation.py`` makes them, and kept in the
  checkpoint), assigned to the classes by Hungarian matching of the class centroids at every
  step.

Extra config (``method_kwargs``, besides those of ``scl``):
    k_pos (int | "all"): ``kcl``: same-class queue entries per anchor (the official README's 6);
        ``all``: every one (the official script's default); 0: MoCo's InfoNCE.
    num_positive (int | "all"): ``tsc``: same-class entries drawn per anchor (6); ``all``: every
        one (the official ``--K 0``).
    target_weight (float): ``tsc``: weight of the target term (0.2, the official README's run).
    target_repeat (int): ``tsc``: copies of each target in the contrast set (1).
    separate_target (bool): ``tsc``: the class target is always a positive, the draws take from
        the queue only (true, the official README's run; the script's default is false).
    target_steps (int): ``tsc``: Adam steps that spread the targets (10000, as official).
    kcl_epochs (int): ``tsc``: the first epochs train the TSC code's KCL (random draws, no
        targets, no centroid updates), as the official run trains half its epochs; null: half of
        ``max_epochs``. (The official run also restarts its optimiser and learning-rate
        schedule when the targets join; here one schedule runs through.)
    queue_start: ``random``: the queue starts as random unit keys without labels, every one a
        negative until overwritten (the official code); ``empty``: those slots are left out.
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig

from solo_ext.config import CORE_RUN_OPTIONS, Option, declared
from solo_ext.host import gather
from solo_ext.losses.kcl import kcl_loss, tsc_assign, tsc_loss, tsc_targets, tsc_update_centroids
from solo_ext.methods.scl import SCL, Criterion


def _count(value: int | str) -> int | None:
    """A positives count of the config: an integer, or ``all`` (every same-class entry)."""
    return None if value == "all" else int(value)


class KPositiveLoss(Criterion):
    """KCL's loss: a soft target over the key and at most ``k_pos`` same-class queue entries.
    The queue starts as random unit keys with no label: negatives from the first step (the
    official start), or, with ``queue_start: empty``, left out of the loss until written.

    ``positives`` says which same-class entries, as the two official KCL runs choose them:
    ``random`` (the default), ``k_pos`` random draws, the KCL run of the targeted-supcon
    repository that the shipped ImageNet-LT recipe follows (its code's loss without targets);
    ``topk``, ``torch.topk`` on the 0/1 same-class mask, BalFeat's operation (whose run also
    differs in its recipe: weight decay 5e-4, no MLP head, crop and flip only, a queue filled
    with real keys before the first epoch).
    """

    OPTIONS: dict[str, Option] = {
        "k_pos": Option(6, "int", 0, choices=("all",)),
        "positives": Option("random", "str", choices=("random", "topk")),
    }
    LABELLED_QUEUE_START = False

    def __call__(self, q, k, labels, queue):
        m = self.method
        if m.cfg.method_kwargs.positives == "random":
            return tsc_loss(
                q,
                k,
                queue.keys,
                labels,
                queue.labels,
                None,
                None,
                num_positive=_count(m.cfg.method_kwargs.k_pos),
                temperature=m.temperature,
                mask_empty=m.mask_empty,
            ).loss
        return kcl_loss(
            q,
            k,
            queue.keys,
            labels,
            queue.labels,
            k_pos=_count(m.cfg.method_kwargs.k_pos),
            temperature=m.temperature,
            mask_empty=m.mask_empty,
        )


class TargetedLoss(Criterion):
    """TSC's loss: KCL with random same-class draws plus the class targets, after the KCL
    epochs. Its state (centroids, targets) lives on the method, in its checkpoints."""

    OPTIONS: dict[str, Option] = {
        "num_positive": Option(6, "int", 0, choices=("all",)),
        "target_weight": Option(0.2, "float", 0),
        "target_repeat": Option(1, "int", 1),
        "separate_target": Option(True, "bool"),
        "target_steps": Option(10000, "int", 1),
        "kcl_epochs": Option(None, "int", 0, nullable=True),
    }
    LABELLED_QUEUE_START = False

    @classmethod
    def fill(cls, cfg: DictConfig) -> None:
        if cfg.method_kwargs.kcl_epochs is None:  # the official split: the first half is KCL
            cfg.method_kwargs.kcl_epochs = int(cfg.max_epochs) // 2

    def __call__(self, q, k, labels, queue):
        """The class centroids move towards the step's queries (of every process, detached),
        the targets are assigned to the classes, then the TSC loss of this step."""
        m = self.method
        kw = m.cfg.method_kwargs
        targets = assignment = None  # the KCL epochs: the TSC code's KCL, no targets
        if m.current_epoch >= kw.kcl_epochs:
            if not bool(m.targets_made):  # a step outside a fit (tests)
                m.make_targets()
            m.centroids.copy_(tsc_update_centroids(m.centroids, gather(q.detach()), gather(labels)))
            targets = m.targets
            assignment = tsc_assign(m.centroids, targets).to(q.device)
        out = tsc_loss(
            q,
            k,
            queue.keys,
            labels,
            queue.labels,
            targets,
            assignment,
            num_positive=_count(kw.num_positive),
            temperature=m.temperature,
            target_weight=kw.target_weight,
            target_repeat=kw.target_repeat,
            separate_target=kw.separate_target,
            mask_empty=m.mask_empty,
        )
        return out.loss


class KCL(SCL):
    LOSS_NAME = "kcl"
    CRITERION = KPositiveLoss
    METHOD_KWARGS: dict[str, Option] = {**SCL.METHOD_KWARGS, **KPositiveLoss.OPTIONS}


class TSC(SCL):
    LOSS_NAME = "tsc"
    CRITERION = TargetedLoss
    METHOD_KWARGS: dict[str, Option] = {**SCL.METHOD_KWARGS, **TargetedLoss.OPTIONS}

    def __init__(self, cfg: DictConfig):
        super().__init__(cfg)
        dim = cfg.method_kwargs.proj_output_dim
        centroids = torch.nn.functional.normalize(torch.randn(self.num_classes, dim), dim=1)
        self.register_buffer("centroids", centroids)
        # the targets are made when the run starts (on its device), then travel in checkpoints
        self.register_buffer("targets", torch.zeros(self.num_classes, dim))
        self.register_buffer("targets_made", torch.zeros((), dtype=torch.bool))

    def on_fit_start(self) -> None:
        super().on_fit_start()
        if not bool(self.targets_made):
            self.make_targets()

    @torch.no_grad()
    def make_targets(self) -> None:
        """The official generation: Adam on the targets' log-sum-exp of similarities, from a
        seeded start; the first process's, so that every process contrasts the same ones."""
        gen = torch.Generator().manual_seed(int(declared(self.cfg, "seed", CORE_RUN_OPTIONS)))
        targets = tsc_targets(
            self.num_classes,
            self.targets.size(1),
            steps=self.cfg.method_kwargs.target_steps,
            generator=gen,
        )
        trainer = self._trainer
        if trainer is not None:
            targets = trainer.strategy.broadcast(targets, src=0)
        self.targets.copy_(targets.to(self.targets.device))
        self.targets_made.fill_(True)
