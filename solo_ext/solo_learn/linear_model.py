"""``solo.methods.linear``: ``main_linear.py``'s model takes the classifier stage's keys, and on a
long-tailed dataset also logs the validation top-1 of the Many / Medium / Few classes
(``val_acc1_many``, ...).
"""

from __future__ import annotations

from types import ModuleType

from solo_ext.facts import FEW_THRESHOLD, MANY_THRESHOLD
from solo_ext.solo_learn import parsed
from solo_ext.solo_learn.check import method_of

# the names of the solo-learn module this patch needs (checked before it applies)
NEEDS = (method_of("LinearModel", "validation_step", "on_validation_epoch_end"),)


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
