"""Online kNN with the Many / Medium / Few report of long-tail papers."""

from __future__ import annotations

from solo_ext.config import HOST_OPTIONS
from solo_ext.facts import FEW_THRESHOLD, MANY_THRESHOLD
from solo_ext.modules.knn import DISTANCES, WeightedKNNClassifier, knn_predict

__all__ = ["DISTANCES", "LongTailKNN", "WeightedKNNClassifier", "knn_predict"]


class LongTailKNN(WeightedKNNClassifier):
    """Online kNN that reports overall and Many / Medium / Few accuracy (percent).

    ``compute`` returns ``{prefix}acc1``, ``{prefix}acc5`` and ``{prefix}acc1_many`` / ``_medium``
    / ``_few`` (empty before both kinds of features have been seen), over the features of every
    process (torchmetrics syncs the states before ``compute``).

    Args:
        train_class_counts: training images per class, which decide the shot groups.
        many_threshold, few_threshold: the group boundaries (see ``solo_ext.data.longtail``).
        prefix: of the report's keys.
    """

    def __init__(
        self,
        train_class_counts: list[int],
        many_threshold: int = MANY_THRESHOLD,
        few_threshold: int = FEW_THRESHOLD,
        k: int = HOST_OPTIONS["knn_eval.k"].default,
        T: float = 0.07,  # (solo-learn's kNN temperature, which no config key sets)
        distance_fx: str = HOST_OPTIONS["knn_eval.distance_func"].default,
        prefix: str = "val_knn_",
    ):
        super().__init__(k=k, T=T, distance_fx=distance_fx)
        self.train_class_counts = list(train_class_counts)
        self.many_threshold, self.few_threshold = many_threshold, few_threshold
        self.prefix = prefix

    def compute(self) -> dict[str, float]:
        from solo_ext.eval.longtail import longtail_report

        scored = self.scores(len(self.train_class_counts))
        if scored is None:
            return {}
        report = longtail_report(
            *scored,
            self.train_class_counts,
            self.many_threshold,
            self.few_threshold,
            prefix=self.prefix,
        )
        return {k: v for k, v in report.items() if not k.startswith(f"{self.prefix}num_")}
