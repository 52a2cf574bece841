"""Long-tail samplers: instance, class-balanced, square-root and progressive re-sampling.

Every sampler yields dataset indices. A draw from a class-based sampler first picks a class ``c``
with probability ``p_c`` (see :meth:`LongTailSampler.class_probabilities`), then an image of
that class uniformly, so image ``i`` of class ``c`` has probability ``p_c / n_c``. The schemes
follow Kang et al., "Decoupling Representation and Classifier for Long-Tailed Recognition",
ICLR 2020, Sec. 3: ``p_c = n_c ** q / sum_k n_k ** q`` with ``q = 1`` (instance), ``q = 0``
(class-balanced), ``q = 1/2`` (square-root), and the progressive interpolation between the
instance and class-balanced distributions over training.

Determinism: an epoch's global order is a function of ``(seed, epoch)`` only, drawn from a
``torch.Generator`` seeded with ``seed * 1_000_003 + epoch`` (mod 2**64); the prime multiplier
keeps ``(seed, epoch)`` and ``(seed + 1, epoch')`` apart for any realistic epoch count. Ranks
then take strided positions of that global order, so the world size never changes what is drawn.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from numbers import Integral, Real
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data.distributed import DistributedSampler

from solo_ext.common import SEED_STRIDE, check_int, did_you_mean
from solo_ext.config import ConfigError, Option, check_choice

SAMPLER_COMMON_KWARGS: dict[str, Any] = {
    "seed": 0,
    "num_replicas": None,
    "rank": None,
    "num_samples": None,
}


def _check_int(key: str, value: object, minimum: int) -> int:
    return check_int(f"data.sampler.{key}", value, minimum)


def _as_labels(labels: Sequence[int] | torch.Tensor) -> torch.Tensor:
    try:
        t = torch.as_tensor(labels).detach().cpu()
    except (TypeError, ValueError, RuntimeError) as err:
        raise ValueError(f"data.sampler.labels: not convertible to a tensor ({err})") from None
    if t.dim() != 1 or t.numel() == 0:
        raise ValueError(f"data.sampler.labels: shape {tuple(t.shape)}, need a non-empty 1-D list")
    if t.dtype == torch.bool or t.dtype.is_floating_point or t.dtype.is_complex:
        raise ValueError(f"data.sampler.labels: dtype {t.dtype} is not an integer type")
    if int(t.min()) < 0:
        raise ValueError(f"data.sampler.labels: contains label {int(t.min())}, must all be >= 0")
    return t.long()


class LongTailSampler(DistributedSampler):
    """Base class: seeding, epochs, distributed sharding and per-class index bookkeeping.

    It shards by rank itself, so it is a ``DistributedSampler`` (whose ``__init__`` it does not
    need): Lightning then uses it as it is under DDP, in solo-learn's scripts too, instead of
    wrapping it in a second sharding.

    Args:
        labels: Class label of every dataset item, in dataset order, shape [N], integers >= 0.
            The class count is ``C = max(labels) + 1``; classes without images get p_c = 0.
        seed: Base seed; the epoch order depends only on ``(seed, epoch)``.
        num_replicas: World size W; ``None`` reads ``torch.distributed`` at iteration time
            (1 when it is not initialized).
        rank: This process's rank in [0, W); ``None`` reads ``torch.distributed`` (else 0).
        num_samples: Draws per epoch over all ranks; defaults to N. The global list is padded
            by repeating its start to a multiple of W, so every rank yields
            ``ceil(num_samples / W)`` indices.
    """

    def __init__(
        self,
        labels: Sequence[int] | torch.Tensor,
        *,
        seed: int = 0,
        num_replicas: int | None = None,
        rank: int | None = None,
        num_samples: int | None = None,
    ) -> None:
        self.labels = _as_labels(labels)
        self.shuffle, self.drop_last = True, False  # what DistributedSampler's readers look at
        if not isinstance(seed, Integral) or isinstance(seed, bool):
            raise ValueError(f"data.sampler.seed={seed!r}: must be an integer")
        self.seed = int(seed)
        self.num_replicas = (
            None if num_replicas is None else _check_int("num_replicas", num_replicas, 1)
        )
        self.rank = None if rank is None else _check_int("rank", rank, 0)
        if self.rank is not None and self.num_replicas is not None:
            self._check_rank(self.rank, self.num_replicas)
        n = self.labels.numel()
        self.num_samples = n if num_samples is None else _check_int("num_samples", num_samples, 1)
        self.epoch = 0
        self.counts = torch.bincount(self.labels)  # [C], zeros for label gaps
        # Items of class c sit at sorted_idx[starts[c] : starts[c] + counts[c]]; a stable sort
        # keeps the within-class order equal to dataset order, independent of the torch build.
        self.sorted_idx = torch.sort(self.labels, stable=True).indices
        self.starts = torch.cumsum(self.counts, 0) - self.counts

    @staticmethod
    def _check_rank(rank: int, world: int) -> None:
        if rank >= world:
            raise ValueError(f"data.sampler.rank={rank}: must be < num_replicas={world}")

    def _world(self) -> tuple[int, int]:
        initialized = dist.is_available() and dist.is_initialized()
        world = self.num_replicas or (dist.get_world_size() if initialized else 1)
        rank = self.rank if self.rank is not None else (dist.get_rank() if initialized else 0)
        self._check_rank(rank, world)
        return rank, world

    def _generator(self) -> torch.Generator:
        return torch.Generator().manual_seed((self.seed * SEED_STRIDE + self.epoch) % 2**64)

    def class_probabilities(self) -> torch.Tensor:
        """Target class distribution of the current epoch, shape [C], float64, sums to 1."""
        raise NotImplementedError

    def global_order(self) -> torch.Tensor:
        """This epoch's indices over all ranks, shape [num_samples], int64, before padding."""
        g = self._generator()
        p = self.class_probabilities()
        classes = torch.multinomial(p, self.num_samples, replacement=True, generator=g)
        n_c = self.counts[classes]
        # float64 so floor(u * n_c) < n_c for any realistic class size; clamp is belt and braces.
        u = torch.rand(self.num_samples, generator=g, dtype=torch.float64)
        offset = torch.minimum((u * n_c).long(), n_c - 1)
        return self.sorted_idx[self.starts[classes] + offset]

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order the next ``__iter__`` yields."""
        self.epoch = _check_int("epoch", epoch, 0)

    def __iter__(self) -> Iterator[int]:
        rank, world = self._world()
        order = self.global_order()
        total = math.ceil(self.num_samples / world) * world
        # repeat() rather than order[:pad]: with W > num_samples the pad is longer than the list.
        padded = order.repeat(math.ceil(total / order.numel()))[:total]
        return iter(padded[rank::world].tolist())

    def __len__(self) -> int:
        return math.ceil(self.num_samples / self._world()[1])

    def state_dict(self) -> dict[str, Any]:
        """Everything that decides the order: ``{"epoch", "seed", "num_samples"}``."""
        return {"epoch": self.epoch, "seed": self.seed, "num_samples": self.num_samples}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` so a resumed run replays the same order."""
        missing = sorted({"epoch", "seed"} - set(state))
        if missing:
            raise ValueError(f"sampler state_dict: missing keys {missing}")
        self.set_epoch(state["epoch"])
        if not isinstance(state["seed"], Integral) or isinstance(state["seed"], bool):
            raise ValueError(f"data.sampler.seed={state['seed']!r}: must be an integer")
        self.seed = int(state["seed"])
        if "num_samples" in state:
            self.num_samples = _check_int("num_samples", state["num_samples"], 1)


class InstanceSampler(LongTailSampler):
    """Uniform over images: a seeded permutation of range(N) per epoch (no replacement).

    When ``num_samples > N``, independent permutations are concatenated; when smaller, the
    permutation is truncated. Expected class frequencies are ``n_c / N``.
    """

    def class_probabilities(self) -> torch.Tensor:
        return self.counts.double() / self.counts.sum()

    def global_order(self) -> torch.Tensor:
        g = self._generator()
        n = self.labels.numel()
        perms = [torch.randperm(n, generator=g) for _ in range(math.ceil(self.num_samples / n))]
        return torch.cat(perms)[: self.num_samples]


class ClassBalancedSampler(LongTailSampler):
    """Class uniform over non-empty classes, then image uniform (with replacement)."""

    def class_probabilities(self) -> torch.Tensor:
        present = (self.counts > 0).double()
        return present / present.sum()


class SqrtSampler(LongTailSampler):
    """Class probability ``n_c ** power / sum_k n_k ** power`` (Mahajan et al. 2018; Kang 2020).

    Args:
        power: Exponent q >= 0; 0.5 is square-root sampling, 1 instance-, 0 class-balanced.
        **kwargs: See :class:`LongTailSampler`.
    """

    def __init__(
        self, labels: Sequence[int] | torch.Tensor, *, power: float = 0.5, **kwargs: Any
    ) -> None:
        if (
            not isinstance(power, Real)
            or isinstance(power, bool)
            or not power >= 0  # also rejects NaN
            or math.isinf(power)
        ):
            raise ValueError(f"data.sampler.power={power!r}: must be a finite number >= 0")
        self.power = float(power)
        super().__init__(labels, **kwargs)

    def class_probabilities(self) -> torch.Tensor:
        n = self.counts.double()
        # torch gives 0 ** 0 = 1; empty classes must stay undrawable for power = 0.
        w = torch.where(n > 0, n.pow(self.power), torch.zeros_like(n))
        return w / w.sum()


class ProgressiveSampler(LongTailSampler):
    """Progressively-balanced sampling (Kang et al., ICLR 2020, Sec. 3, Eq. 2).

    ``p_c(t) = (1 - t/T) * n_c / N + (t/T) / C``, with t the epoch from :meth:`set_epoch`,
    ``t/T`` clipped to [0, 1] and C the number of non-empty classes.

    Args:
        total_epochs: T >= 1, the epoch at which sampling becomes class-balanced.
        **kwargs: See :class:`LongTailSampler`.
    """

    def __init__(
        self,
        labels: Sequence[int] | torch.Tensor,
        *,
        total_epochs: int | None = None,
        **kwargs: Any,
    ) -> None:
        self.total_epochs = _check_int("total_epochs", total_epochs, 1)
        super().__init__(labels, **kwargs)

    def class_probabilities(self) -> torch.Tensor:
        alpha = min(max(self.epoch / self.total_epochs, 0.0), 1.0)
        n = self.counts.double()
        present = (n > 0).double()
        return (1.0 - alpha) * n / n.sum() + alpha * present / present.sum()


SAMPLERS: dict[str, type[LongTailSampler]] = {
    "instance": InstanceSampler,
    "class_balanced": ClassBalancedSampler,
    "sqrt": SqrtSampler,
    "progressive": ProgressiveSampler,
}
# the keys of ``data.sampler`` a config may set, declared once per sampler (the rank and world
# size come from the trainer)
_COMMON_OPTIONS: dict[str, Option] = {
    "seed": Option(None, "int", nullable=True),  # null: the run's seed
    "num_samples": Option(None, "int", 1, nullable=True),  # null: the dataset's size
}
SAMPLER_OPTIONS: dict[str, dict[str, Option]] = {
    "instance": _COMMON_OPTIONS,
    "class_balanced": _COMMON_OPTIONS,
    "sqrt": {**_COMMON_OPTIONS, "power": Option(0.5, "float", 0)},
    # null: the run's max_epochs
    "progressive": {**_COMMON_OPTIONS, "total_epochs": Option(None, "int", 1, nullable=True)},
}
# each sampler's own constructor keywords with their defaults
SAMPLER_KWARGS: dict[str, dict[str, Any]] = {
    name: {k: o.default for k, o in options.items() if k not in _COMMON_OPTIONS}
    for name, options in SAMPLER_OPTIONS.items()
}


def _check_keys(name: str, kwargs: dict[str, Any], valid_keys: Any) -> None:
    """Every key of ``kwargs`` is one of sampler ``name``'s (the closest one named if not)."""
    valid = sorted(valid_keys)
    for key, value in kwargs.items():
        if key not in valid:
            raise ConfigError(
                f"data.sampler.{key}={value!r}: not a key of sampler {name!r}; "
                f"valid keys: {valid}{did_you_mean(key, valid)}"
            )


def build_sampler(
    name: str, labels: Sequence[int] | torch.Tensor, **kwargs: Any
) -> LongTailSampler:
    """Instantiate the sampler registered as ``name`` (a key of :data:`SAMPLERS`).

    Args:
        name: One of ``SAMPLERS``.
        labels: Class label per dataset item, shape [N].
        **kwargs: The common keys of :data:`SAMPLER_COMMON_KWARGS` plus that sampler's own
            keys from :data:`SAMPLER_KWARGS`.

    Raises:
        ValueError: Unknown name or key (with the closest match), or an out-of-range value.
    """
    names = sorted(SAMPLERS)
    if name not in SAMPLERS:
        hint = did_you_mean(str(name), names)
        raise ValueError(f"data.sampler.name={name!r}: not one of {names}{hint}")
    _check_keys(name, kwargs, {*SAMPLER_COMMON_KWARGS, *SAMPLER_KWARGS[name]})
    return SAMPLERS[name](labels, **kwargs)


def fill_sampler_cfg(cfg: Any, total_epochs: int) -> dict[str, Any] | None:
    """Fills and checks ``data.sampler`` (``{name, <keys>}`` or just a name, written back as a
    section) before any work and returns the ``build_sampler`` arguments (None when no sampler
    is configured: plain shuffling).

    ``progressive`` takes its ``total_epochs`` from the run's epochs unless given (written into
    the section); the rank and world size come from the trainer, not the config.

    Raises:
        ConfigError: one line naming the key and the value (the closest name of a misspelt one).
    """
    from omegaconf import OmegaConf

    section = OmegaConf.select(cfg, "data.sampler", default=None)
    if section is None:
        return None
    if isinstance(section, str):
        cfg.data.sampler = {"name": section}
        section = cfg.data.sampler
    kwargs = {k: v for k, v in section.items() if k != "name"}
    for key in ("num_replicas", "rank"):
        if key in kwargs:
            raise ConfigError(
                f"data.sampler.{key}={kwargs[key]!r}: set by the trainer, not the config"
            )
    name = section.get("name")
    check_choice("data.sampler.name", name, SAMPLERS)
    options = SAMPLER_OPTIONS[name]
    _check_keys(name, kwargs, options)
    for key, value in kwargs.items():
        options[key].check(f"data.sampler.{key}", value)
    # (both entry points read this)
    if OmegaConf.select(cfg, "data.no_labels", default=None) is True:
        raise ConfigError(
            f"data.sampler.name={name!r} with data.no_labels=true: "
            "the samplers draw by class and need the labels"
        )
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    if name == "progressive" and kwargs.get("total_epochs") is None:
        section.total_epochs = kwargs["total_epochs"] = total_epochs
    return {"name": name, **kwargs}


def targets_of(dataset: Any) -> list[int] | None:
    """The label of every item of a dataset built here or by solo-learn (None: unlabelled)."""
    inner = getattr(dataset, "dataset", None)  # IndexedNCrop
    for obj in (dataset, inner):
        samples = getattr(obj, "samples", None)  # ImageFolder (solo-learn's data.fraction
        if samples is not None:  # shortens the samples, not the targets)
            return [int(label) for _, label in samples]
        for attr in ("targets", "labels"):  # torchvision's CIFAR; STL10
            value = getattr(obj, attr, None)
            if value is not None:
                return [int(t) for t in value]
    return None
