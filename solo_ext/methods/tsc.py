"""``tsc``: targeted supervised contrastive learning (Li et al., CVPR 2022), MoCo-style.

KCL's step (``methods/kcl.py``): after ``kcl_epochs`` of KCL, KCL with ``num_positive``
same-class entries drawn at random plus C fixed targets spread on the sphere (made once, when the
run starts, as the official ``target_generation.py`` makes them, and kept in the checkpoint),
assigned to the classes by Hungarian matching of the class centroids at every step. It reports a
class-balanced linear classifier trained after pretraining: ``scripts/linear/<dataset>/dscl.yaml``.

Its ``method_kwargs``: the class's docstring lists them, from their declarations.
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig

from solo_ext.config import CORE_RUN_OPTIONS, Option, declared
from solo_ext.host import gather
from solo_ext.losses.kcl import tsc_assign, tsc_loss, tsc_targets, tsc_update_centroids
from solo_ext.methods.kcl import UNLABELLED_QUEUE_START, count
from solo_ext.methods.scl import SCL, Criterion


class TargetedLoss(Criterion):
    """TSC's loss: KCL with random same-class draws plus the class targets, after the KCL
    epochs. Its state (centroids, targets) lives on the method, in its checkpoints."""

    OPTIONS: dict[str, Option] = {
        "queue_start": UNLABELLED_QUEUE_START,
        "num_positive": Option(
            6,
            "int",
            0,
            choices=("all",),
            help="same-class entries drawn per anchor; `all`: every one (the official `--K 0`)",
        ),
        "target_weight": Option(
            0.2, "float", 0, help="weight of the target term (the official README's run)"
        ),
        "target_repeat": Option(
            1, "int", 1, help="copies of each class target in the contrast set"
        ),
        "separate_target": Option(
            True,
            "bool",
            help=(
                "the class target is always a positive and the draws take from the queue only"
                " (the official README's run; the script's default is false)"
            ),
        ),
        "target_steps": Option(
            10000,
            "int",
            1,
            help="optimiser steps that spread the C targets on the sphere (as official)",
        ),
        "kcl_epochs": Option(
            None,
            "int",
            0,
            nullable=True,
            help=(
                "the first epochs train KCL without targets, as the official run trains half "
                "of its epochs; null: half of `max_epochs`"
            ),
        ),
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
            num_positive=count(kw.num_positive),
            temperature=m.temperature,
            target_weight=kw.target_weight,
            target_repeat=kw.target_repeat,
            separate_target=kw.separate_target,
            mask_empty=m.mask_empty,
        )
        return out.loss


class TSC(SCL):
    LOSS_NAME = "tsc"
    CRITERION = TargetedLoss

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
