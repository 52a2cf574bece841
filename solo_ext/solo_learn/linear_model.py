"""``solo.methods.linear``: ``main_linear.py``'s model takes the classifier stage's keys, runs
``classifier_stage``'s decoupled stages (cRT, tau-norm, LWS, logit adjustment) before its own
training, and on a long-tailed dataset also logs the validation top-1 of the Many / Medium / Few
classes (``val_acc1_many``, ...).
"""

from __future__ import annotations

from types import ModuleType

from solo_ext.facts import FEW_THRESHOLD, MANY_THRESHOLD
from solo_ext.solo_learn import parsed
from solo_ext.solo_learn.check import method_of

# the names of the solo-learn module this patch needs (checked before it applies)
NEEDS = (method_of("LinearModel", "validation_step", "on_validation_epoch_end"),)


def _decoupled_stages() -> list[str]:
    """The decoupled stages main_linear.py's ``classifier_stage`` names (none outside a run
    parsed by the patches)."""
    from omegaconf import OmegaConf

    from solo_ext.eval.options import DECOUPLED_STAGES, stages_of

    cfg = None if parsed.RUN is None else parsed.RUN.cfg
    value = None if cfg is None else OmegaConf.select(cfg, "classifier_stage", default=None)
    if value is None:
        return []
    return [s for s in stages_of(value) if s in DECOUPLED_STAGES]


def apply(module: ModuleType) -> None:
    base = module.LinearModel

    class LinearModel(base):
        """solo-learn's linear model; on a long-tailed dataset (the run knows its training
        counts) it also logs the validation top-1 of the Many / Medium / Few classes."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            from solo_ext.eval.classifier_stage import init_classifier

            init_classifier(self.classifier, parsed.stage("classifier_init"))
            self.backbone_bn = parsed.stage("backbone_bn")
            counts = None if parsed.RUN is None else parsed.RUN.data.get("train_class_counts")
            self.shot_accuracy = None
            if counts:
                from solo_ext.eval.shot_accuracy import ShotGroupAccuracy

                data = parsed.RUN.data
                self.shot_accuracy = ShotGroupAccuracy(
                    counts,
                    data.get("many_threshold", MANY_THRESHOLD),
                    data.get("few_threshold", FEW_THRESHOLD),
                )
                self._last_logits = None
                self.classifier.register_forward_hook(self._keep_logits)

        def setup(self, stage: str) -> None:
            """``classifier_stage``'s decoupled stages, before the training (and before a
            resumed run's checkpoint is restored): on the pretrained backbone's features of the
            training and validation splits (extracted once, eval mode, main_linear.py's 224 px
            validation crop), as ``solo-ext-linear`` runs them; every process computes the
            same numbers, the first reports them (printed, logged, in ``metrics.json`` beside
            the checkpoint)."""
            super().setup(stage)
            stages = _decoupled_stages()
            if stage != "fit" or not stages:
                return
            self._decoupled(stages)

        def _decoupled(self, stages: list[str]) -> None:
            from pathlib import Path

            from omegaconf import OmegaConf

            from solo_ext.eval.common import split_features
            from solo_ext.eval.decoupled import report_stages

            cfg = parsed.RUN.cfg
            device = self.trainer.strategy.root_device
            feats = split_features(self.backbone, OmegaConf.create({"data": cfg.data}),
                                   device=device, crop=224)  # fmt: skip
            first = self.trainer.is_global_zero
            out_dir = Path(str(cfg.pretrained_feature_extractor)).parent
            options = OmegaConf.to_container(cfg.decoupled)
            metrics = report_stages(
                stages, options, feats, cfg.data, cfg.seed, device, out_dir, first
            )
            numbers = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
            if first and self.trainer.logger is not None:
                self.trainer.logger.log_metrics(numbers, step=0)

        def _keep_logits(self, _module, _inputs, logits) -> None:
            self._last_logits = logits

        def training_step(self, batch, batch_idx):
            """``backbone_bn: train`` (the published stage): the frozen backbone runs in train
            mode, so its BatchNorm statistics follow the stage's images (solo-learn's step puts
            it in eval mode first, which is skipped for this step; validation is in eval)."""
            if self.backbone_bn != "train" or getattr(self, "finetune", False):
                return super().training_step(batch, batch_idx)
            backbone = self.backbone
            backbone.train()
            backbone.eval = lambda: backbone  # (an instance attribute, for this step only)
            try:
                return super().training_step(batch, batch_idx)
            finally:
                del backbone.eval

        def validation_step(self, batch, batch_idx):
            out = super().validation_step(batch, batch_idx)
            if self.shot_accuracy is not None and not self.trainer.sanity_checking:
                self.shot_accuracy.update(self._last_logits.detach().float(), batch[1])
            return out

        def on_validation_epoch_end(self):
            super().on_validation_epoch_end()
            if self.shot_accuracy is not None:
                if not self.trainer.sanity_checking:
                    self.log_dict(self.shot_accuracy.compute())  # synced by the metric
                self.shot_accuracy.reset()

    module.LinearModel = LinearModel
