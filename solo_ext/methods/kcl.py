"""``kcl``: k-positive supervised contrastive learning (Kang et al., ICLR 2021), MoCo-style.

The ``scl`` method's step (momentum encoder, labelled queue, one direction per step: the first
crop's queries against the second crop's keys, the keys enqueued after the step) with its own
loss (``solo_ext.losses.kcl``): a soft target spread evenly over the key and at most ``k_pos``
same-class queue entries, picked as ``positives`` says (random draws, as the KCL run of the
targeted-supcon code; or ``torch.topk`` on the same-class mask, BalFeat's). It reports a
class-balanced linear classifier trained after pretraining (two stages, like DSCL):
``scripts/linear/<dataset>/dscl.yaml``. ``tsc`` (``methods/tsc.py``) is KCL with class targets.

Its ``method_kwargs``: the class's docstring lists them, from their declarations.
"""

from __future__ import annotations

from solo_ext.config import Option
from solo_ext.losses.kcl import kcl_loss, tsc_loss
from solo_ext.methods.scl import QUEUE_STARTS, SCL, Criterion


def count(value: int | str) -> int | None:
    """A positives count of the config: an integer, or ``all`` (every same-class entry)."""
    return None if value == "all" else int(value)


# the queue's start of KCL and TSC: unit keys without labels (negatives until overwritten)
UNLABELLED_QUEUE_START = Option(
    "random",
    "str",
    choices=QUEUE_STARTS,
    help=(
        "`random`: the queue starts as random unit keys without labels, each a negative until "
        "overwritten, the official start; `empty`: those slots left out of the loss"
    ),
)


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
        "queue_start": UNLABELLED_QUEUE_START,
        "k_pos": Option(
            6,
            "int",
            0,
            choices=("all",),
            help=(
                "same-class queue entries per anchor (the official README's 6); `all`: every "
                "one; 0: MoCo's InfoNCE"
            ),
        ),
        "positives": Option(
            "random",
            "str",
            choices=("random", "topk"),
            help=(
                "`random`: `k_pos` random draws among the same-class entries, the KCL run of "
                "the targeted-supcon code that the ImageNet-LT recipe follows; `topk`: "
                "`torch.topk` on the same-class mask, BalFeat's operation"
            ),
        ),
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
                num_positive=count(m.cfg.method_kwargs.k_pos),
                temperature=m.temperature,
                mask_empty=m.mask_empty,
            ).loss
        return kcl_loss(
            q,
            k,
            queue.keys,
            labels,
            queue.labels,
            k_pos=count(m.cfg.method_kwargs.k_pos),
            temperature=m.temperature,
            mask_empty=m.mask_empty,
        )


class KCL(SCL):
    LOSS_NAME = "kcl"
    CRITERION = KPositiveLoss
