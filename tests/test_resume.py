"""A run stopped after an epoch and resumed (``resume_from_checkpoint`` or solo-learn's
``auto_resume``) continues exactly as the uninterrupted run: same losses step for step, same
queue / support set, same momentum weights (CPU, same seed)."""

from __future__ import annotations

import csv
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from conftest import METHOD_NAMES

import solo_ext.commands.pretrain as pretrain
from solo_ext.commands.pretrain import run

COMMON = {
    "max_epochs": 2,
    "limit_train_batches": 2,
    "limit_val_batches": 0,
    "log_every_n_steps": 1,
    "method_kwargs.queue_size": 20,
    "checkpoint.keep_prev": True,
}


class _StopAfterFirstEpoch(pl.Callback):
    """A pre-emption: the run ends after epoch 0 (its checkpoint is still written)."""

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        trainer.should_stop = True


@pytest.fixture
def preempted():
    original = pretrain.checkpoint_callbacks

    def with_stop(*args, **kwargs):
        return original(*args, **kwargs) + [_StopAfterFirstEpoch()]

    def start(cfg):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(pretrain, "checkpoint_callbacks", with_stop)
            return run(cfg)

    return start


def _step_losses(run_dir: str) -> dict[int, dict[str, float]]:
    rows = [
        r for f in sorted(Path(run_dir).glob("logs*/metrics.csv")) for r in csv.DictReader(open(f))
    ]
    out: dict[int, dict[str, float]] = {}
    for row in rows:
        losses = {k: float(v) for k, v in row.items() if v and "loss_step" in k}
        if losses:
            out.setdefault(int(row["step"]), {}).update(losses)
    return out


def _state(model) -> dict[str, torch.Tensor]:
    keep = ("queue", "dense_queue", "momentum_backbone", "momentum_projector", "backbone")
    return {k: v for k, v in model.state_dict().items() if k.startswith(keep)}


def _assert_same_run(resumed, full, logged=(2, 3)) -> None:
    """Steps 2-3 of ``resumed`` (whose logs hold the steps ``logged``) are those of ``full``."""
    got, want = _step_losses(resumed["run_dir"]), _step_losses(full["run_dir"])
    assert sorted(got) == list(logged) and sorted(want) == [0, 1, 2, 3]
    for step in (2, 3):
        assert got[step].keys() == want[step].keys()
        for key, value in want[step].items():
            assert got[step][key] == pytest.approx(value, rel=1e-5, abs=1e-6), (step, key)
    mine, theirs = _state(resumed["model"]), _state(full["model"])
    for key, value in theirs.items():
        torch.testing.assert_close(mine[key], value, rtol=1e-5, atol=1e-6, msg=key)


@pytest.mark.parametrize("method", METHOD_NAMES)
def test_resume_from_checkpoint_continues_exactly(method, make_cfg, preempted):
    full = run(make_cfg(method, **COMMON))
    first = preempted(make_cfg(method, **COMMON))
    ckpts = sorted(Path(first["run_dir"]).glob("*.ckpt"))
    assert [c.name.rsplit("-", 1)[1] for c in ckpts] == ["ep=0.ckpt"]
    resumed = run(make_cfg(method, **COMMON, resume_from_checkpoint=str(ckpts[0])))
    _assert_same_run(resumed, full)


def test_auto_resume_continues_in_the_same_run_directory(make_cfg, preempted, capsys):
    """... from the newest readable checkpoint: a newer one that cannot be read (truncated
    under its name) is passed over in one line, and the temporary file of a killed write in the
    run's directory is removed."""
    full = run(make_cfg("dscl", **COMMON))
    first = preempted(make_cfg("dscl", **COMMON))
    run_dir = Path(first["run_dir"])
    (ep0,) = run_dir.glob("*.ckpt")
    truncated = run_dir / ep0.name.replace("-ep=0.ckpt", "-ep=1.ckpt")
    truncated.write_bytes(ep0.read_bytes()[:1000])
    killed_write = run_dir / f".{truncated.name}.a1b2c3.tmp"
    killed_write.write_bytes(b"\0" * 10)
    capsys.readouterr()
    resumed = run(make_cfg("dscl", **COMMON, **{"auto_resume.enabled": True}))
    out = capsys.readouterr().out
    said = [line for line in out.splitlines() if "passing over" in line]
    assert len(said) == 1 and truncated.name in said[0], out
    assert f"Resuming from {ep0}" in out
    assert resumed["run_dir"] == first["run_dir"]
    assert not killed_write.exists()
    # the unreadable file is left as it was; Lightning's checkpointer writes epoch 1 beside it
    again = truncated.with_name(truncated.name.replace(".ckpt", "-v1.ckpt"))
    assert sorted(run_dir.glob("*.ckpt")) == sorted([ep0, truncated, again])
    assert truncated.stat().st_size == 1000
    _assert_same_run(resumed, full, logged=(0, 1, 2, 3))  # steps 0-1, then 2-3 resumed


def test_auto_resume_ignores_runs_with_other_settings(make_cfg, preempted):
    first = preempted(make_cfg("dscl", **COMMON))
    other = run(make_cfg("dscl", **COMMON, **{"auto_resume.enabled": True, "optimizer.lr": 0.2}))
    assert other["run_dir"] != first["run_dir"]
