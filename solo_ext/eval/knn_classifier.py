"""Online kNN with the Many / Medium / Few report of long-tail papers."""

from __future__ import annotations

import torch

from solo_ext.data.facts import FEW_THRESHOLD, MANY_THRESHOLD
from solo_ext.modules.knn import DISTANCES, WeightedKNNClassifier, knn_predict

__all__ = ["DISTANCES", "LongTailKNN", "WeightedKNNClassifier", "knn_predict"]


class LongTailKNN(WeightedKNNClassifier):
    """Online kNN that reports overall and Many / Medium / Few accuracy (percent).

    Args:
        train_class_counts: training images per class, which decide the shot groups.
        many_threshold, few_threshold: the group boundaries (see ``solo_ext.data.longtail``).
    """

    def __init__(
        self,
        train_class_counts: list[int],
        many_threshold: int = MANY_THRESHOLD,
        few_threshold: int = FEW_THRESHOLD,
        k: int = 20,
        T: float = 0.07,
        distance_fx: str = "cosine",
    ):
        super().__init__(k=k, T=T, distance_fx=distance_fx)
        self.train_class_counts = list(train_class_counts)
        self.many_threshold, self.few_threshold = many_threshold, few_threshold

    def compute_report(self, prefix: str = "val_knn_") -> dict[str, float]:
        from solo_ext.eval.longtail import longtail_report

        if not self.train_features or not self.test_features:
            return {}
        cat = lambda xs: torch.cat(xs) if isinstance(xs, list) else xs  # noqa: E731
        test_y = cat(self.test_targets)
        scores = knn_predict(
            cat(self.train_features),
            cat(self.train_targets),
            cat(self.test_features),
            len(self.train_class_counts),
            self.k,
            self.T,
            self.distance_fx,
        )
        self.reset()
        report = longtail_report(
            scores,
            test_y,
            self.train_class_counts,
            self.many_threshold,
            self.few_threshold,
            prefix=prefix,
        )
        return {k: v for k, v in report.items() if not k.startswith(f"{prefix}num_")}
