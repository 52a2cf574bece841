"""Tests of the long-tail samplers: target distributions, empirical frequencies, determinism,
distributed sharding, resumption and input validation."""

import math

import pytest
import torch
import torch.distributed as dist

from solo_ext.data.samplers import (
    SAMPLER_KWARGS,
    SAMPLERS,
    ClassBalancedSampler,
    InstanceSampler,
    ProgressiveSampler,
    SqrtSampler,
    build_sampler,
)

COUNTS = [200, 80, 30, 10, 3]
N = sum(COUNTS)
C = len(COUNTS)
T = 10
# Interleave the classes so that "sorted by class" and "dataset order" differ.
LABELS = torch.cat([torch.full((n,), c) for c, n in enumerate(COUNTS)])[
    torch.randperm(N, generator=torch.Generator().manual_seed(123))
]
OWN_KWARGS = {"sqrt": {"power": 0.5}, "progressive": {"total_epochs": T}}


def make(name, **kwargs):
    return build_sampler(name, LABELS, **{**OWN_KWARGS.get(name, {}), **kwargs})


def expected_probs(name, epoch=0):
    """Hand-written target class distributions (Kang et al. 2020, Sec. 3)."""
    if name == "instance":
        return [n / N for n in COUNTS]
    if name == "class_balanced":
        return [1 / C] * C
    if name == "sqrt":
        return [n**0.5 / sum(m**0.5 for m in COUNTS) for n in COUNTS]
    a = min(epoch / T, 1.0)
    return [(1 - a) * n / N + a / C for n in COUNTS]


def assert_within_5_sigma(hits, probs, n):
    # A binomial count has sd sqrt(n p (1 - p)); 5 sd keeps false alarms below ~1e-6 per cell.
    for h, p in zip(hits, probs):
        sigma = math.sqrt(p * (1 - p) / n)
        assert abs(h / n - p) <= 5 * sigma + 1e-12, (h / n, p, sigma)


@pytest.mark.parametrize("name", sorted(SAMPLERS))
@pytest.mark.parametrize("epoch", [0, T // 2, T, 3 * T])  # progressive: t / T clipped to 1
def test_target_distribution_matches_hand_formula(name, epoch):
    s = make(name)
    s.set_epoch(epoch)
    p = s.class_probabilities()
    assert p.shape == (C,)
    torch.testing.assert_close(p, torch.tensor(expected_probs(name, epoch), dtype=torch.float64))


def test_sqrt_power_limits():
    one = SqrtSampler(LABELS, power=1.0).class_probabilities()
    zero = SqrtSampler(LABELS, power=0.0).class_probabilities()
    torch.testing.assert_close(one, InstanceSampler(LABELS).class_probabilities())
    torch.testing.assert_close(zero, ClassBalancedSampler(LABELS).class_probabilities())


@pytest.mark.parametrize(
    ("name", "epoch"),
    [("class_balanced", 0), ("sqrt", 0), ("progressive", 0), ("progressive", T // 2)],
)
def test_empirical_class_and_image_frequencies(name, epoch):
    n = 200_000
    s = make(name, num_samples=n, seed=7)
    s.set_epoch(epoch)
    drawn = torch.tensor(list(s))
    assert len(drawn) == len(s) == n
    probs = expected_probs(name, epoch)
    assert_within_5_sigma(torch.bincount(LABELS[drawn], minlength=C).tolist(), probs, n)
    # Within a class the image is uniform: image i of class c has probability p_c / n_c.
    image_p = [probs[c] / COUNTS[c] for c in LABELS.tolist()]
    assert_within_5_sigma(torch.bincount(drawn, minlength=N).tolist(), image_p, n)


def test_instance_epochs_are_permutations():
    s = make("instance")
    for epoch in range(4):
        s.set_epoch(epoch)
        assert sorted(s) == list(range(N))
    # Beyond N: whole permutations back to back, so class counts are exact multiples.
    s = make("instance", num_samples=3 * N + 5)
    order = list(s)
    for k in range(3):
        assert sorted(order[k * N : (k + 1) * N]) == list(range(N))
    assert len(set(order[3 * N :])) == 5


def test_empty_classes_are_never_drawn():
    labels = [0] * 5 + [2] * 3 + [4]
    for name in sorted(SAMPLERS):
        s = build_sampler(name, labels, num_samples=2000, **OWN_KWARGS.get(name, {}))
        p = s.class_probabilities()
        assert p.shape == (5,) and p[1] == 0 and p[3] == 0
        assert set(torch.tensor(labels)[list(s)].tolist()) == {0, 2, 4}
    torch.testing.assert_close(
        ClassBalancedSampler(labels).class_probabilities(),
        torch.tensor([1 / 3, 0, 1 / 3, 0, 1 / 3], dtype=torch.float64),
    )


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_order_depends_on_seed_and_epoch_only(name):
    a, b, other_seed = make(name, seed=3), make(name, seed=3), make(name, seed=4)
    assert list(a) == list(b)
    first = list(a)
    a.set_epoch(1)
    assert list(a) != first
    assert list(other_seed) != first
    b.set_epoch(1)
    assert list(a) == list(b)


@pytest.mark.parametrize("name", sorted(SAMPLERS))
@pytest.mark.parametrize(("world", "num_samples"), [(2, None), (3, None), (3, 322), (3, 1)])
def test_shards_interleave_to_global_order(name, world, num_samples):
    full = make(name, num_samples=num_samples, seed=5, num_replicas=1, rank=0)
    full.set_epoch(2)
    global_order = list(full)
    total = math.ceil(len(global_order) / world) * world
    padded = (global_order * total)[:total]  # pad by repeating the start of the list
    shards = []
    for r in range(world):
        s = make(name, num_samples=num_samples, seed=5, num_replicas=world, rank=r)
        s.set_epoch(2)
        shards.append(list(s))
        assert len(s) == len(shards[-1]) == total // world
    interleaved = [None] * total
    for r, shard in enumerate(shards):
        interleaved[r::world] = shard  # rank r owns positions r, r + W, ... (disjoint)
    assert interleaved == padded


def test_world_read_from_torch_distributed(monkeypatch):
    ref = make("sqrt", seed=1, num_replicas=4, rank=3)
    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda: 4)
    monkeypatch.setattr(dist, "get_rank", lambda: 3)
    s = make("sqrt", seed=1)
    assert len(s) == math.ceil(N / 4) and list(s) == list(ref)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    assert len(s) == N and list(s) == list(make("sqrt", seed=1, num_replicas=1, rank=0))


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_state_dict_round_trip(name):
    a = make(name, seed=11)
    a.set_epoch(4)
    state = a.state_dict()
    assert state["epoch"] == 4 and state["seed"] == 11
    b = make(name, seed=0)
    b.load_state_dict(state)
    assert list(b) == list(a)
    with pytest.raises(ValueError, match="missing keys"):
        b.load_state_dict({"epoch": 1})


def test_sampler_kwargs_match_constructors():
    assert SAMPLER_KWARGS == {
        "instance": {},
        "class_balanced": {},
        "sqrt": {"power": 0.5},
        "progressive": {"total_epochs": None},
    }
    assert set(SAMPLERS) == set(SAMPLER_KWARGS)
    assert SAMPLERS["progressive"] is ProgressiveSampler


@pytest.mark.parametrize(
    ("name", "labels", "kwargs", "needle"),
    [
        ("sqrt", LABELS, {"power": -0.5}, "data.sampler.power=-0.5"),
        ("sqrt", LABELS, {"power": float("nan")}, "data.sampler.power=nan"),
        ("progressive", LABELS, {"total_epochs": 0}, "data.sampler.total_epochs=0"),
        ("progressive", LABELS, {}, "data.sampler.total_epochs=None"),
        ("instance", [], {}, "data.sampler.labels"),
        ("instance", [0, 1, -2], {}, "data.sampler.labels: contains label -2"),
        ("instance", [0.5, 1.0], {}, "data.sampler.labels: dtype"),
        ("instance", LABELS, {"num_samples": 0}, "data.sampler.num_samples=0"),
        ("instance", LABELS, {"num_replicas": 2, "rank": 2}, "data.sampler.rank=2"),
        ("instance", LABELS, {"rank": -1}, "data.sampler.rank=-1"),
        ("instance", LABELS, {"seed": 1.5}, "data.sampler.seed=1.5"),
        ("instance", LABELS, {"power": 1}, "data.sampler.power=1"),
    ],
)
def test_bad_inputs_raise_one_line_naming_key_and_value(name, labels, kwargs, needle):
    with pytest.raises(ValueError) as info:
        build_sampler(name, labels, **kwargs)
    msg = str(info.value)
    assert needle in msg and "\n" not in msg


@pytest.mark.parametrize(
    ("name", "kwargs", "needles"),
    [
        ("sqrt", {"pwer": 1}, ["data.sampler.pwer=1", "'num_samples'", "did you mean 'power'?"]),
        ("sqr", {}, ["data.sampler.name='sqr'", *map(repr, SAMPLERS), "did you mean 'sqrt'?"]),
    ],
)
def test_an_unknown_key_or_name_lists_the_valid_ones_with_a_hint(name, kwargs, needles):
    with pytest.raises(ValueError) as info:
        build_sampler(name, LABELS, **kwargs)
    msg = str(info.value)
    assert all(needle in msg for needle in needles) and "\n" not in msg, msg


def test_rank_beyond_distributed_world_raises_at_iter():
    s = make("instance", rank=1)  # world falls back to 1 without torch.distributed
    with pytest.raises(ValueError, match="data.sampler.rank=1"):
        list(s)
