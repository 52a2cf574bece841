"""Checkpoints, args.json and metrics.json are written through a temporary file and a rename:
an interrupted write leaves the previous file whole and no temporary file behind."""

from __future__ import annotations

import pytest
import torch

import solo_ext.common as common
from solo_ext.common import atomic_write_text
from solo_ext.eval.metrics_file import update_metrics
from solo_ext.runs.resume import AtomicCheckpointIO


class _Interrupted(Exception):
    pass


def test_interrupted_text_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "metrics.json"
    atomic_write_text(path, '{"knn_acc1": 50.0}')

    def fail(f):
        f.write('{"knn_acc1": 6')  # half written, then the process dies
        raise _Interrupted

    with pytest.raises(_Interrupted):
        common.atomic_write(path, fail, "w")
    assert path.read_text() == '{"knn_acc1": 50.0}'
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.json"]


def test_metrics_update_is_atomic_and_merges(tmp_path, monkeypatch):
    update_metrics(tmp_path, {"knn_acc1": 50.0})
    monkeypatch.setattr(common.os, "replace", lambda *a: (_ for _ in ()).throw(_Interrupted()))
    with pytest.raises(_Interrupted):
        update_metrics(tmp_path, {"linear_acc1": 60.0})
    monkeypatch.undo()
    assert update_metrics(tmp_path, {"linear_acc1": 60.0}) == {
        "knn_acc1": 50.0,
        "linear_acc1": 60.0,
    }
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]


def test_interrupted_checkpoint_keeps_the_previous_one(tmp_path, monkeypatch):
    io, path = AtomicCheckpointIO(), tmp_path / "run-ep=0.ckpt"
    io.save_checkpoint({"state_dict": {"w": torch.ones(3)}}, path)

    def dying_save(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 partial")
        raise _Interrupted

    monkeypatch.setattr(torch, "save", dying_save)
    with pytest.raises(_Interrupted):
        io.save_checkpoint({"state_dict": {"w": torch.zeros(3)}}, path)
    monkeypatch.undo()
    assert torch.equal(io.load_checkpoint(path)["state_dict"]["w"], torch.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == ["run-ep=0.ckpt"]
