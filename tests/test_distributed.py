"""Two processes on CPU (gloo), started with ``torch.distributed.run`` (see ``ddp_worker.py``):
losses on a 2 x B split equal those of one 1 x 2B process, and after a few Lightning DDP steps
every rank holds the same queue / support set and momentum weights, with disjoint data shards."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import free_port

from solo_ext.methods.registry import SOLO_EXT_METHODS

WORKER = Path(__file__).with_name("ddp_worker.py")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("ddp")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        f"--master_port={free_port()}",
        str(WORKER),
        str(out),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.mark.parametrize("loss", ["dscl", "densecl", "all4one", "all4one_feature_gather"])
def test_two_halves_equal_one_whole_batch(ranks, loss):
    per_rank = [r["losses"][loss] for r in ranks]
    mean = sum(r["loss"] for r in per_rank) / 2
    assert mean == pytest.approx(per_rank[0]["whole_loss"], rel=1e-5)
    for r in per_rank:
        for key, grad in r["grads"].items():
            torch.testing.assert_close(grad, r["whole_grads"][key], rtol=1e-4, atol=1e-6)


def test_all4one_feature_term_is_each_ranks_own(ranks):
    """As the published code computes it: on the rank's own batch, not the gathered one."""
    for rank in ranks:
        terms = rank["losses"]["all4one_terms"]
        assert terms["feature"] == pytest.approx(terms["own_half_feature"], rel=1e-6)
        assert terms["feature"] != pytest.approx(terms["whole_feature"], rel=1e-3)


@pytest.mark.parametrize(
    "method", [*sorted(SOLO_EXT_METHODS), "dscl_symmetric", "dscl_batch_gather"]
)
def test_ranks_agree_after_ddp_steps(ranks, method):
    zero, one = (r["runs"][method] for r in ranks)
    assert zero["buffers"].keys() == one["buffers"].keys()
    assert bool(zero["buffers"]) == (method != "bcl")  # bcl has no queue
    for key, value in zero["buffers"].items():
        assert torch.equal(value, one["buffers"][key]), key
    torch.testing.assert_close(zero["momentum"], one["momentum"])
    # one view's keys of the gathered batch (2 ranks x 4) per step, in each queue
    pointers = [k for k in zero["buffers"] if k.endswith("ptr")]
    assert len(pointers) == {"densecl": 2, "dscl_symmetric": 2, "bcl": 0}.get(method, 1)
    for key in pointers:
        assert zero["buffers"][key].item() == (3 * 2 * 4) % 20, key
    assert zero["drawn"] and not set(zero["drawn"]) & set(one["drawn"])
    # each process its own augmentations; the first one those of a single-process run
    from solo_ext.runs.resume import epoch_seed

    assert (zero["seed"], one["seed"]) == (epoch_seed(0, 0, 0), epoch_seed(0, 0, 1))
    assert zero["seed"] != one["seed"]


@pytest.mark.parametrize("name", ["knn", "lt_knn", "shots"])
def test_online_metrics_of_two_processes_equal_those_of_one(ranks, name):
    """The online kNN (and the linear model's shot-group accuracy) of features split unequally
    over two processes, synced at ``compute``, equals that of one process given them all; and
    a rank's share alone gives another value, so the equality is the sync's doing."""
    from ddp_worker import online_metrics, rank_rows

    whole = online_metrics([slice(None)], [slice(None)])[name]  # one process, one update
    assert whole not in ({}, (-1.0, -1.0))
    for result in ranks:
        assert result["metrics"][name] == pytest.approx(whole, rel=1e-6, nan_ok=True)
    alone = [online_metrics([rank_rows("train", r)], [rank_rows("test", r)])[name] for r in (0, 1)]
    assert any(a != pytest.approx(whole, nan_ok=True) for a in alone)


def test_online_knn_is_empty_after_reset_on_every_rank(ranks):
    for result in ranks:
        assert result["metrics"]["knn_after_reset"] == (-1.0, -1.0)
        assert result["metrics"]["lt_knn_after_reset"] == {}


def test_a_nan_on_one_process_stops_every_process_at_that_step(ranks):
    zero, one = (r["nan_stop"] for r in ranks)
    assert zero.startswith("non-finite loss at step 0: on another process"), zero
    assert one.startswith("non-finite loss at step 0: train_dscl_loss=nan"), one


@pytest.mark.parametrize(
    "method,per_loss",
    [("scl", 4), ("dscl", 4), ("pbsd", 4), ("kcl", 4), ("tsc", 4), ("dscl_batch_gather", 8)],
)
def test_the_in_batch_set_is_each_process_own_batch(ranks, method, per_loss):
    """As the published code (``cat(q, k, queue)`` before any gather): each process contrasts
    its own 4 queries and keys, and the keys of both enter the queue (the pointer test above);
    ``batch_gather: true`` contrasts the gathered 8."""
    for rank in ranks:
        assert rank["runs"][method]["anchors"] == [per_loss] * 3  # 3 steps, one direction
