"""Every run records the environment its numbers come from (args.json, and each evaluation in
metrics.json); evaluating in an environment that changes numbers says so in one line."""

from __future__ import annotations

import copy
import json
import platform
from pathlib import Path

import pytest
import torch
from conftest import eval_cfg

from solo_ext.commands.pretrain import run
from solo_ext.runs.environment import environment, numbers_differ, summary


@pytest.fixture(scope="module")
def paco_run(tmp_path_factory) -> Path:
    from conftest import tiny_cfg

    cfg = tiny_cfg("paco", tmp_path_factory.mktemp("env"), **{"knn_eval.enabled": True})
    return Path(run(cfg)["run_dir"])


def test_args_json_records_the_runs_environment(paco_run):
    env = json.loads((paco_run / "args.json").read_text())["environment"]
    assert env["solo_ext"]["version"] and env["python"] == platform.python_version()
    import torchvision

    # the builds as imported (a CUDA build's local part, +cu130, included)
    assert env["libraries"]["torch"] == torch.__version__
    assert env["libraries"]["torchvision"] == torchvision.__version__
    if torch.version.cuda is None:
        assert env["cuda"] is None
    else:
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        assert env["cuda"] == {"version": torch.version.cuda, "cudnn": cudnn}
    for name in ("torchvision", "lightning", "torchmetrics", "timm"):
        assert env["libraries"][name], name
    assert env["device"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert env["device"]["gpus"] is None  # a CPU run
    assert (env["precision"], env["world_size"]) == ("32-true", 1)
    assert env["deterministic"]["torch_deterministic_algorithms"] is False
    assert env["solo_learn"] is None or env["solo_learn"]["release"].startswith("solo-learn")


def test_each_evaluation_records_its_own_in_metrics_json(paco_run):
    metrics = json.loads((paco_run / "metrics.json").read_text())
    for key in ("knn_environment", "head_environment"):  # the final kNN, the one-stage head
        assert metrics[key]["libraries"]["torch"] == torch.__version__, key
    assert metrics["knn_environment"]["world_size"] == 1
    assert metrics["head_environment"]["precision"] == "32-true"


def _here():
    return environment(precision="32-true", world_size=1, accelerator="cpu")


@pytest.mark.parametrize(
    "change,said",
    [
        (("libraries", "torch", "1.13.1"), "torch 1.13 -> "),
        (("libraries", "timm", "0.9.2"), "timm 0.9 -> "),
        (("precision", None, "bf16-mixed"), "precision bf16-mixed -> 32-true"),
        (("solo_learn", None, {"release": "solo-learn 1.0.6"}), "host solo-learn -> embedded"),
    ],
)
def test_what_changes_numbers_is_named(change, said):
    here = _here()
    if here["solo_learn"] is not None and change[0] == "solo_learn":
        pytest.skip("this host is solo-learn")
    run_env = copy.deepcopy(here)
    section, key, value = change
    if key is None:
        run_env[section] = value
    else:
        run_env[section][key] = value
    (found,) = numbers_differ(run_env, here)
    assert found.startswith(said), found


def test_what_does_not_change_numbers_is_not_named():
    here = _here()
    run_env = copy.deepcopy(here)
    version = run_env["libraries"]["torch"].split(".")
    run_env["libraries"]["torch"] = ".".join(version[:2] + ["999"])  # a patch release
    run_env["device"]["threads"] = 64
    run_env["solo_ext"]["commit"] = "0123456789ab"
    assert numbers_differ(run_env, here) == []
    assert numbers_differ(None, here) == []  # a run made before runs recorded one


def test_an_evaluation_in_another_environment_warns_in_one_line_and_goes_on(paco_run, capsys):
    import solo_ext.commands.knn

    args_path = paco_run / "args.json"
    args = json.loads(args_path.read_text())
    args["environment"]["libraries"]["torch"] = "1.13.1"
    args_path.write_text(json.dumps(args))
    result = solo_ext.commands.knn.run(eval_cfg("knn", paco_run, k=3))
    assert result["knn_acc1"] >= 0  # the evaluation ran to the end
    lines = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    (line,) = lines
    assert "torch 1.13 -> " in line and "solo-ext" in line


def test_the_summary_line():
    env = _here()
    line = summary(env)
    assert f"torch {torch.__version__}" in line and "32-true" in line and "1 process" in line
    assert torch.backends.cpu.get_cpu_capability() in line
    assert summary(None) == ""
    built = {**env, "cuda": {"version": "13.0", "cudnn": 92400}}
    assert "CUDA 13.0, cuDNN 92400" in summary(built)
    assert "CUDA" not in summary({**env, "cuda": None})


def test_the_leaderboard_shows_each_runs_environment(paco_run, tmp_path):
    import csv

    from solo_ext.leaderboard import run as leaderboard

    leaderboard([str(paco_run.parent), "--out", str(tmp_path)])
    (table,) = tmp_path.glob("synthetic_lt*.csv")
    with open(table) as f:
        (row,) = list(csv.DictReader(f))
    recorded = json.loads((paco_run / "args.json").read_text())["environment"]
    assert row["environment"] == summary(recorded) and "torch" in row["environment"]
    assert summary(recorded) in table.with_suffix(".md").read_text()
