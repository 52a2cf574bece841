"""Where the evaluations run: ``accelerator`` (``auto``: the GPU when torch sees one; ``gpu``,
``cpu``) of solo-ext-knn and solo-ext-linear, the device the batches reach, the extraction's
loader keys, pretraining's final kNN on its trainer's device, and ``accelerator=gpu`` without
a GPU stopped in one line before anything is done."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import eval_cfg, tiny_cfg

from solo_ext.commands import knn, linear, mains
from solo_ext.commands.devices import eval_device
from solo_ext.eval import common


@pytest.mark.parametrize(
    "accelerator, available, devices, rank, want",
    [
        ("cpu", True, 1, 0, "cpu"),  # forced, though a GPU is there
        ("auto", False, 1, 0, "cpu"),
        ("auto", True, 1, 0, "cuda:0"),
        ("auto", True, "auto", 2, "cuda:2"),  # every GPU, this process's
        ("gpu", True, [2, 3], 1, "cuda:3"),  # Lightning's list of indices, by local rank
        ("gpu", True, "1,2", 0, "cuda:1"),  # solo-learn's string of them
    ],
)
def test_the_device_is_the_accelerators(accelerator, available, devices, rank, want, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4 if available else 0)
    assert eval_device(accelerator, devices, rank) == torch.device(want)


@pytest.mark.parametrize(
    "main, prog, argv",
    [
        (mains.knn, "solo-ext-knn", []),
        (mains.linear, "solo-ext-linear", []),
        # a recipe that asks for the GPU (solo-learn's main_linear.py reads it too)
        (mains.linear, "solo-ext-linear", ["--config-name", "cifar100-lt/dscl"]),
    ],
)
def test_gpu_without_a_gpu_is_one_line_before_anything(main, prog, argv, tmp_path, command,
                                                       monkeypatch):  # fmt: skip
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "args.json").write_text("{}")
    given = [] if argv else ["accelerator=gpu"]
    code, out, err = command(
        main, prog, *argv, f"pretrained_checkpoint_dir={run_dir}", *given, cwd=tmp_path
    )
    assert code == 2 and out == ""
    assert err == (
        f"{prog}: error: accelerator='gpu': torch sees no GPU on this machine "
        "(torch.cuda.is_available() is False); accelerator=auto or cpu runs on the CPU\n"
    )
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["args.json", "run"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    from solo_ext.commands.pretrain import run

    cfg = tiny_cfg("scl", tmp_path_factory.mktemp("device"), limit_val_batches=0)
    return Path(run(cfg)["run_dir"])


@pytest.fixture
def spies(monkeypatch):
    """The extraction's loaders (their keyword arguments) and the batches that reach the
    backbone (device and size), for the evaluation modules that load a run."""
    loaders: list[dict] = []
    batches: list[tuple[torch.device, int]] = []

    class Loader(torch.utils.data.DataLoader):
        def __init__(self, dataset, **kwargs):
            loaders.append(kwargs)
            super().__init__(dataset, **kwargs)

    monkeypatch.setattr(common, "DataLoader", Loader)

    def watched(load):
        def load_for_eval(cfg):
            backbone, pre_cfg, out_dir = load(cfg)
            backbone.register_forward_pre_hook(
                lambda _, args: batches.append((args[0].device, len(args[0])))
            )
            return backbone, pre_cfg, out_dir

        return load_for_eval

    for module in (knn, linear):
        monkeypatch.setattr(module, "load_for_eval", watched(module.load_for_eval))
    return loaders, batches


@pytest.mark.parametrize(
    "given, workers",
    [
        ({"num_workers": 1}, 1),
        ({"data.num_workers": 1}, 1),  # null: the run's (this command's data over it)
        ({}, 0),  # the tiny run's
    ],
)
def test_knn_extracts_where_the_key_says_with_its_loader(tiny_run, spies, monkeypatch, given,
                                                         workers):  # fmt: skip
    """accelerator=cpu keeps the extraction on the CPU though a GPU is (said to be) there; the
    batches are batch_size images, loaded by num_workers processes."""
    loaders, batches = spies
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    metrics = knn.run(eval_cfg("knn", tiny_run, accelerator="cpu", batch_size=5, **given))
    assert [(kw["batch_size"], kw["num_workers"], kw["pin_memory"]) for kw in loaders] == [
        (5, workers, False)
    ] * 2  # the training split, then the validation split
    assert {device for device, _ in batches} == {torch.device("cpu")}
    sizes = [n for _, n in batches]
    assert sum(sizes) == metrics["num_train"] + metrics["num_val"]
    assert max(sizes) == 5


def test_auto_is_the_cpu_here_with_the_same_numbers(tiny_run, spies):
    """On a machine without a GPU, ``auto`` (the default) extracts on the CPU and reports what
    ``accelerator=cpu`` reports."""
    loaders, batches = spies
    assert knn.OPTIONS["accelerator"].default == "auto"
    auto = knn.run(eval_cfg("knn", tiny_run))
    assert {device for device, _ in batches} == {torch.device("cpu")} and loaders
    forced = knn.run(eval_cfg("knn", tiny_run, accelerator="cpu"))
    numbers = [k for k, v in auto.items() if isinstance(v, float)]
    assert "knn_acc1" in numbers
    for key in numbers:
        assert auto[key] == pytest.approx(forced[key], nan_ok=True), key
    recorded = json.loads((tiny_run / "metrics.json").read_text())["knn_environment"]
    assert recorded["device"]["gpus"] is None


def test_linear_extracts_with_the_features_keys(tiny_run, spies, monkeypatch):
    """The linear command's extracted features (here the decoupled stages') on the device
    ``accelerator`` names, ``features.batch_size`` images a batch, ``features.num_workers``
    loading processes."""
    loaders, batches = spies
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cfg = eval_cfg(
        "linear",
        tiny_run,
        accelerator="cpu",
        classifier_stage="crt",
        enable_progress_bar=False,
        **{"features.batch_size": 6, "features.num_workers": 1, "decoupled.epochs": 1},
    )
    metrics = linear.run(cfg)
    assert [(kw["batch_size"], kw["num_workers"]) for kw in loaders] == [(6, 1)] * 2
    assert {device for device, _ in batches} == {torch.device("cpu")}
    assert max(n for _, n in batches) == 6 and "linear_crt_acc1" in metrics


def test_pretrainings_final_knn_runs_on_the_trainers_device(tmp_path, monkeypatch):
    seen = []

    def evaluate_model(backbone, cfg, **kwargs):
        seen.append(kwargs)
        return {}

    monkeypatch.setattr(knn, "evaluate_model", evaluate_model)
    from solo_ext.commands.pretrain import run

    cfg = tiny_cfg("scl", tmp_path, limit_val_batches=0, **{"knn_eval.enabled": True})
    result = run(cfg)
    assert [kw["device"] for kw in seen] == [result["model"].trainer.strategy.root_device]
    assert seen[0]["device"] == torch.device("cpu")  # (accelerator=cpu)


def test_a_one_stage_heads_evaluation_runs_on_the_trainers_device(tmp_path, monkeypatch):
    """PaCo's head at the end of pretraining: extracted and scored on the trainer's device,
    the model back where it was afterwards."""
    import solo_ext.eval.head as head

    seen = []
    extract = head.extract_features

    def spy(backbone, dataset, batch_size=256, num_workers=0, device=None):
        seen.append(torch.device(device))
        return extract(backbone, dataset, batch_size, num_workers, device)

    monkeypatch.setattr(head, "extract_features", spy)
    from solo_ext.commands.pretrain import run

    result = run(tiny_cfg("paco", tmp_path, limit_val_batches=0))
    model = result["model"]
    assert seen == [model.trainer.strategy.root_device]
    assert next(model.parameters()).device.type == "cpu" and model.training
    assert "head_acc1" in result["head"]
