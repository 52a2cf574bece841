"""The benchmark runner (``python -m benchmarks``, outside the package) in its tiny mode, so it
never rots, and solo-ext's losses against the straightforward ones written as the official code
computes them (``straightforward.py``): the same values and gradients."""

from __future__ import annotations

import json
import math
import sys

import pytest
import torch
from conftest import ROOT

if str(ROOT) not in sys.path:  # the benchmarks live at the repository's root, not in the wheel
    sys.path.insert(0, str(ROOT))

from benchmarks import kernels as K  # noqa: E402
from benchmarks.__main__ import main  # noqa: E402


@pytest.mark.parametrize("name", sorted(K.KERNELS))
def test_optimised_loss_equals_the_straightforward_one(name):
    torch.manual_seed(0)
    kernel = K.KERNELS[name]({**K.SIZES["tiny"][name], "dropout": 0.0}, torch.device("cpu"))
    ours, reference = kernel.losses["solo-ext"](), kernel.losses["straightforward"]()
    assert ours.item() == pytest.approx(reference.item(), rel=1e-5)
    got = torch.autograd.grad(ours, kernel.inputs, allow_unused=True)
    want = torch.autograd.grad(reference, kernel.inputs, allow_unused=True)
    for g, w in zip(got, want):
        if w is None:
            assert g is None or not g.any()
        else:
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)


def test_tiny_run_prints_and_writes_every_row(tmp_path, capsys):
    out = tmp_path / "bench.json"
    result = main(["--tiny", "--pairs", "dscl", "--json", str(out)])
    rows = result["rows"]
    kernels = {(r["name"], r["candidate"]) for r in rows if r["kind"] == "kernel"}
    assert len(kernels) == 3 * len(K.KERNELS)
    # (with solo-learn as the host, --pairs dscl also takes dscl's pairs with solo-learn's
    # MoCo v2+: test_peer_pairs_against_solo_learns_own_methods)
    steps = [r for r in rows if r["kind"] == "step" and r["name"] == "dscl vs scl"]
    assert {r["candidate"] for r in steps} == {"dscl", "scl"}
    loaders = {r["candidate"] for r in rows if r["kind"] == "loader"}
    assert loaders == ({"solo-learn", "sampled", "sampled_class_balanced"} if _dali() else set())
    by_label = {(r["name"], r["candidate"]): r for r in rows}
    assert len(by_label) == len(rows)
    for r in rows:
        assert 0 < r["q1_s"] <= r["median_s"] <= r["q3_s"], r
        # each ratio is the row's median over its reference's, measured in the same run
        if r["kind"] == "kernel":
            # the counted call: its matmuls' FLOPs and the operators it dispatched
            assert r["gflops"] > 0 and r["ops"] > 0, r
            for ref in ("floor", "straightforward"):
                want = r["median_s"] / by_label[(r["name"], ref)]["median_s"]
                assert r[f"ratio_vs_{ref}"] == pytest.approx(want, rel=1e-9), (r, ref)
        elif r["kind"] == "loader":  # with DALI: test_tiny_loaders checks them
            assert r["images_per_s"] > 0, r
        else:
            ref = by_label[(r["name"], r["reference"])]
            want = r["median_s"] / ref["median_s"]
            assert r["ratio_vs_reference"] == pytest.approx(want, rel=1e-9), r
            want = r["gflops"] / ref["gflops"]
            assert r["flops_ratio_vs_reference"] == pytest.approx(want, rel=1e-9), r
            # the operators one step dispatched: hundreds (a backbone's layers, forward and
            # backward), and their ratio over the reference's
            assert r["ops"] > 100, r
            assert r["ops_ratio_vs_reference"] == r["ops"] / ref["ops"], r
            # B training images per step, each in all its views (B=4 in --tiny)
            assert r["shape"].endswith(" B=4"), r
            assert r["images_per_s"] == pytest.approx(4 / r["median_s"], rel=1e-9), r
            # by kind: the counted FLOPs add up to the step's
            assert sum(r["kind_gflops"].values()) == pytest.approx(r["gflops"], rel=1e-9), r
            kinds = {"aten::convolution", "aten::convolution_backward"}
            assert kinds <= set(r["kind_gflops"]), r
            # the counted step's peak memory (on CPU: the tensors it allocates)
            assert r["peak_mib"] > 0, r
    scl = next(r for r in steps if r["candidate"] == "scl")
    dscl = next(r for r in steps if r["candidate"] == "dscl")
    assert dscl["reference"] == scl["reference"] == "scl"
    # CPU peak memory of each kernel: DSCL's loss never materialises the [B, K] masks
    peak = {r["candidate"]: r["peak_mib"] for r in rows if r["name"] == "dscl loss"}
    assert 0 < peak["solo-ext"] < peak["straightforward"]
    # one step's FLOPs: dscl and scl run the same matmuls (only the per-anchor weights differ)
    assert dscl["flops_ratio_vs_reference"] == pytest.approx(1.0, abs=1e-3)
    assert json.loads(out.read_text())["rows"] == json.loads(json.dumps(rows))
    printed = capsys.readouterr().out
    assert "| kernel | dscl loss |" in printed and "x scl |" in printed
    assert "(1.000x) |" in printed
    # on CPU the times are given as ratios only
    header = next(line for line in printed.splitlines() if line.startswith("| kind |"))
    assert "time ratio" in header and "median ms" not in header and "images/s" not in header


def test_a_run_stopped_half_way_keeps_the_pairs_it_finished(tmp_path, monkeypatch):
    """--json is rewritten after every finished pair: a run killed by a time limit keeps the
    pairs measured before, each with its ratios; the pair that was cut short is not there."""
    import benchmarks.steps as steps
    from benchmarks.timing import Measurement

    times = {"dscl": [2.0, 4.0, 3.0], "scl": [1.0, 2.0, 1.5]}
    flops = {"dscl": 10**9, "scl": 2 * 10**9}

    def fake_time_steps(cfg, n, warmup, device, count_flops=False):
        if cfg.method == "pbsd":
            raise KeyboardInterrupt  # the time limit, during the second pair
        return Measurement(
            list(times[cfg.method]), None, flops[cfg.method] if count_flops else None
        )

    monkeypatch.setattr(steps, "time_steps", fake_time_steps)
    out = tmp_path / "bench.json"
    with pytest.raises(KeyboardInterrupt):
        main(["--tiny", "--what", "steps", "--pairs", "dscl", "pbsd", "--json", str(out)])
    rows = {(r["name"], r["candidate"]): r for r in json.loads(out.read_text())["rows"]}
    # (solo-learn's peer pairs, on its host, come after every pair of solo-ext's own)
    assert set(rows) == {("dscl vs scl", "dscl"), ("dscl vs scl", "scl")}
    dscl, scl = rows[("dscl vs scl", "dscl")], rows[("dscl vs scl", "scl")]
    assert dscl["median_s"] == 3.0 and scl["median_s"] == 1.5
    assert dscl["ratio_vs_reference"] == 2.0 and dscl["flops_ratio_vs_reference"] == 0.5
    assert dscl["images_per_s"] == 4 / 3.0  # --tiny's batch of 4 over the median step


@pytest.mark.solo_learn
def test_peer_pairs_against_solo_learns_own_methods(tmp_path):
    """With the real solo-learn as the host, the bench lays dscl (both directions, and the
    published one) beside solo-learn's MoCo v2+ and scl beside its SupCon, same backbone, batch,
    projector and queue, measured in one run: both-direction DSCL runs MoCo v2+'s arithmetic,
    the published one direction less of it."""
    out = tmp_path / "bench.json"
    rows = main(["--tiny", "--what", "steps", "--pairs", "dscl", "scl", "--json", str(out)])
    rows = {(r["name"], r["candidate"]): r for r in rows["rows"]}
    moco = "solo-learn mocov2plus"
    both = rows[("dscl symmetric vs " + moco, "dscl symmetric")]
    one = rows[("dscl vs " + moco, "dscl")]
    supcon = rows[("scl vs solo-learn supcon", "scl")]
    assert both["reference"] == one["reference"] == moco
    assert supcon["reference"] == "solo-learn supcon"
    assert both["flops_ratio_vs_reference"] == pytest.approx(1.0, abs=1e-3)
    assert one["flops_ratio_vs_reference"] < 1.0  # one direction: half the anchors
    for row in (both, one, supcon):
        assert row["ratio_vs_reference"] > 0 and row["gflops"] > 0, row


def _dali() -> bool:
    from solo_ext.data.dali import dali_installed

    return dali_installed()


def test_tiny_loaders(tmp_path, capsys):
    """solo-ext's sampled DALI readers and solo-learn's file reader, same decode and crops, over
    whole epochs of a tiny image folder: every row with its images/s and its ratio."""
    if not _dali():
        pytest.skip("NVIDIA DALI is not installed (pip install -e '.[dali]')")
    out = tmp_path / "bench.json"
    rows = main(["--what", "loaders", "--tiny", "--device", "cpu", "--json", str(out)])["rows"]
    by_candidate = {r["candidate"]: r for r in rows}
    assert set(by_candidate) == {"solo-learn", "sampled", "sampled_class_balanced"}
    assert all(r["kind"] == "loader" and r["reference"] == "solo-learn" for r in rows)
    ref = by_candidate["solo-learn"]
    assert ref["ratio_vs_solo_learn"] == 1.0
    for r in rows:
        assert 0 < r["q1_s"] <= r["median_s"] <= r["q3_s"], r
        # 64 images, batch 4 in --tiny: every loader reads 16 whole batches an epoch
        assert r["images_per_epoch"] == 64, r
        assert r["images_per_s"] == pytest.approx(64 / r["median_s"], rel=1e-9), r
        assert math.isfinite(r["ratio_vs_solo_learn"]) and r["ratio_vs_solo_learn"] > 0, r
        want = r["images_per_s"] / ref["images_per_s"]
        assert r["ratio_vs_solo_learn"] == pytest.approx(want, rel=1e-9), r
        assert sum(r["class_counts"]) == 64 and r["class_counts"] == sorted(
            r["class_counts"], reverse=True
        )
    assert json.loads(out.read_text())["rows"] == json.loads(json.dumps(rows))
    printed = capsys.readouterr().out
    assert "| loader | dali training loader |" in printed and "x solo-learn images/s |" in printed


def test_loaders_without_dali_print_one_line_and_skip(monkeypatch, capsys):
    import solo_ext.data.dali as dali

    monkeypatch.setattr(dali, "dali_installed", lambda: False)
    rows = main(["--what", "loaders", "--tiny", "--device", "cpu"])["rows"]
    assert rows == []
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("loaders:")]
    assert "skipped" in line and "NVIDIA DALI is not installed" in line


@pytest.mark.parametrize("crop, kernel", [(32, (3, 3)), (96, (7, 7))])
def test_step_backbone_stem_follows_the_crop(crop, kernel):
    """CIFAR's small-image stem at 32 px; the ImageNet stem at the paper's sizes."""
    from benchmarks.steps import step_cfg
    from solo_ext.host import METHODS

    cfg = step_cfg("scl", {}, 4, "cpu", tiny=True, crop_size=crop)
    assert cfg.augmentations[0].crop_size == crop
    assert METHODS["scl"](cfg).backbone.conv1.kernel_size == kernel


def test_cpu_peak_counts_live_storages_once():
    """Two 1 MiB tensors alive together peak at 2 MiB, one after the other at 1 MiB; views and
    in-place results add nothing."""
    from benchmarks.timing import cpu_peak_mib

    def together():
        x, y = torch.ones(256, 1024), torch.ones(256, 1024)
        return x.sum() + y.sum()

    def one_after_the_other():
        x = torch.ones(256, 1024)
        total = x.sum()
        del x
        return total + torch.ones(256, 1024).sum()

    def views():
        x = torch.ones(256, 1024)
        x.mul_(2)
        return x.T[:10].sum() + x.view(-1)[:5].sum()

    assert cpu_peak_mib(together) == pytest.approx(2.0, abs=1e-4)
    assert cpu_peak_mib(one_after_the_other) == pytest.approx(1.0, abs=1e-4)
    assert cpu_peak_mib(views) == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--backbone", "resnet19"], "backbone.name='resnet19': not one of"),
        (["--crop-size", "0"], "argument --crop-size: 0: must be >= 1"),
        (["--pairs", "dcsl"], "--pairs dcsl: not one of"),
        (["--rounds", "0"], "argument --rounds: 0: must be >= 1"),
    ],
)
def test_bad_arguments_stop_in_one_line_before_measuring(argv, message, tmp_path, capsys):
    out = tmp_path / "bench.json"
    with pytest.raises(SystemExit):
        main(["--tiny", "--json", str(out), *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1]
    assert not out.exists()
