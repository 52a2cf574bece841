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
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"{prog}: error: accelerator='gpu': torch sees no GPU"), err
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


# the linear command's extraction: that of its decoupled stages' features
CRT = {"classifier_stage": "crt", "decoupled.epochs": 1, "enable_progress_bar": False}


@pytest.mark.parametrize(
    "name, given, workers",
    [
        ("knn", {"batch_size": 6, "num_workers": 1}, 1),
        ("knn", {"batch_size": 6, "data.num_workers": 1}, 1),  # null: the run's (data over it)
        ("knn", {"batch_size": 6}, 0),  # the tiny run's
        ("linear", {**CRT, "features.batch_size": 6, "features.num_workers": 1}, 1),
    ],
)
def test_the_extraction_runs_where_the_keys_say_with_its_loader(name, given, workers, tiny_run,
                                                                spies, monkeypatch):  # fmt: skip
    """accelerator=cpu keeps the extraction on the CPU though a GPU is (said to be) there; the
    batches are of 6 images (knn's ``batch_size``, linear's ``features.batch_size``), loaded by
    ``num_workers`` processes (linear's ``features.num_workers``)."""
    loaders, batches = spies
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    command = {"knn": knn, "linear": linear}[name]
    metrics = command.run(eval_cfg(name, tiny_run, accelerator="cpu", **given))
    assert [(kw["batch_size"], kw["num_workers"], kw["pin_memory"]) for kw in loaders] == [
        (6, workers, False)
    ] * 2  # the training split, then the validation split
    assert {device for device, _ in batches} == {torch.device("cpu")}
    assert max(n for _, n in batches) == 6
    if name == "knn":  # every image of both splits
        assert sum(n for _, n in batches) == metrics["num_train"] + metrics["num_val"]
    else:
        assert "linear_crt_acc1" in metrics


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


def test_pretrainings_final_evaluations_run_on_the_trainers_device(tmp_path, monkeypatch):
    """The final kNN and PaCo's one-stage head at the end of pretraining: extracted and scored
    on the trainer's device, the model back where it was afterwards."""
    import solo_ext.eval.head as head
    from solo_ext.commands.pretrain import run

    seen = {"knn": [], "head": []}
    extract = head.extract_features

    def evaluate_model(backbone, cfg, **kwargs):
        seen["knn"].append(kwargs["device"])
        return {}

    def spy(backbone, dataset, batch_size=256, num_workers=0, device=None):
        seen["head"].append(torch.device(device))
        return extract(backbone, dataset, batch_size, num_workers, device)

    monkeypatch.setattr(knn, "evaluate_model", evaluate_model)
    monkeypatch.setattr(head, "extract_features", spy)
    result = run(tiny_cfg("paco", tmp_path, limit_val_batches=0, **{"knn_eval.enabled": True}))
    model = result["model"]
    device = model.trainer.strategy.root_device
    assert seen == {"knn": [device], "head": [device]} and device == torch.device("cpu")
    assert next(model.parameters()).device.type == "cpu" and model.training
    assert "head_acc1" in result["head"]
