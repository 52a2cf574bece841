"""Run by ``tests/test_distributed.py`` under ``python -m torch.distributed.run --nproc_per_node 2``
(gloo, CPU). Writes ``rank<r>.pt`` into the output directory:

- ``losses``: for each loss as its method computes it (with the all-gather), this rank's loss
  and gradients on its half of a fixed 2B batch, next to the single-process loss and gradients
  of the whole batch;
- ``runs``: for every registered method, a Lightning DDP fit of a few steps: the queue /
  support-set buffers, a digest of the momentum weights, and the dataset indexes this rank drew;
- ``nan_stop``: the message each rank stopped with when only the second rank's loss is NaN
  (both must stop at that step; one that went on would wait for the other forever);
- ``metrics``: the online kNN (plain and with the Many / Medium / Few report) and the shot-group
  accuracy of solo-learn's linear model, each fed this rank's unequal share of fixed features,
  then computed (synced over the ranks).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

B, D = 4, 8


def _inputs(world: int, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    n = B * world

    def unit(*shape):
        return F.normalize(torch.randn(*shape, generator=gen), dim=-1)

    return {
        "q": unit(n, D),
        "k": unit(n, D),
        "queue": unit(16, D),
        "labels": torch.randint(0, 3, (n,), generator=gen),
        "queue_labels": torch.randint(-1, 3, (16,), generator=gen),
        "q_dense": unit(n, 5, D).transpose(1, 2),
        "k_dense": unit(n, 5, D).transpose(1, 2),
        "match": torch.randint(0, 5, (n, 5), generator=gen),
        "p": torch.randn(2, n, D, generator=gen),
        "c": torch.randn(2, n, D, generator=gen),
        "proj": torch.randn(2, n, D, generator=gen),
        "mz": unit(2, n, D),
        "nn": unit(2, n, 3, D),
    }


def _loss_fns(gather, rank: int, world: int):
    """Each method's loss on (a slice of) the inputs, the way its training step computes it;
    returns name -> (function of the inputs, names of the inputs with gradients)."""
    from solo_ext.losses.all4one import all4one_objective
    from solo_ext.losses.densecl import densecl_loss
    from solo_ext.losses.dscl import dscl_loss
    from solo_ext.modules.centroid_transformer import CentroidTransformer

    torch.manual_seed(0)
    transformer = CentroidTransformer(D, num_heads=2, dropout=0.0, pos_len=3)

    def dscl(x):  # scl / dscl / pbsd's contrastive part: anchors and keys gathered
        q, k, labels = gather(x["q"]), gather(x["k"]), gather(x["labels"])
        return dscl_loss(q, k, x["queue"], labels, x["queue_labels"], beta=8.0, temperature=0.1)

    def densecl(x):  # MoCo-style: the local batch against the shared queues
        return densecl_loss(
            x["q"], x["k"], x["queue"], x["q_dense"], x["k_dense"], x["queue"], x["match"], 0.5
        )[0]

    def all4one_terms(x, gather_feature=False):
        b = x["p"].size(1)
        return all4one_objective(
            tuple(x["p"]),
            tuple(x["c"]),
            tuple(x["proj"]),
            tuple(x["mz"]),
            tuple(x["nn"]),
            transformer,
            3,
            0.2,
            0.1,
            gather=gather,
            offset=rank * b,
            gather_feature=gather_feature,
        )

    return {
        "dscl": (dscl, ["q", "k"]),
        "densecl": (densecl, ["q", "q_dense"]),
        # feature_gather: true, the whole objective on the gathered batch
        "all4one_feature_gather": (lambda x: all4one_terms(x, True).total, ["p", "c", "proj"]),
        # the default: everything but the feature term; that one is each rank's own (below)
        "all4one": (lambda x: all4one_terms(x).neighbour + all4one_terms(x).centroid, ["p", "c"]),
        "all4one_terms": (all4one_terms, []),
    }


def _slice(x: dict[str, torch.Tensor], rank: int) -> dict[str, torch.Tensor]:
    """This rank's half of every per-sample input (the queue is shared)."""
    out = {}
    for key, value in x.items():
        if key in ("queue", "queue_labels"):
            out[key] = value
        elif key in ("p", "c", "proj", "mz", "nn"):
            out[key] = value[:, rank * B : (rank + 1) * B]
        else:
            out[key] = value[rank * B : (rank + 1) * B]
    return out


def _loss_and_grads(fn, x: dict[str, torch.Tensor], grad_keys: list[str]):
    x = {k: v.clone().requires_grad_() if k in grad_keys else v for k, v in x.items()}
    loss = fn(x)
    return loss, torch.autograd.grad(loss, [x[k] for k in grad_keys])


def loss_checks(rank: int, world: int) -> dict:
    from solo_ext.host import gather

    results = {}
    single = _loss_fns(lambda x: x, 0, 1)  # one process with the whole batch: no gather
    fns = _loss_fns(gather, rank, world)
    # the default all4one objective's terms on this rank, and on this rank's half alone (one
    # process, no gather): the published code's feature term is computed on each rank's batch
    terms = fns.pop("all4one_terms")[0](_slice(_inputs(world), rank))
    own = single.pop("all4one_terms")[0](_slice(_inputs(world), rank))
    results["all4one_terms"] = {
        "feature": terms.feature.item(),
        "own_half_feature": own.feature.item(),
        "whole_feature": all4one_whole_feature(world),
    }
    for name, (fn, grad_keys) in fns.items():
        whole, whole_grads = _loss_and_grads(single[name][0], _inputs(world), grad_keys)
        mine, my_grads = _loss_and_grads(fn, _slice(_inputs(world), rank), grad_keys)
        results[name] = {
            "loss": mine.item(),
            "whole_loss": whole.item(),
            # DDP averages the ranks' parameter gradients: 1 / world of this rank's input grads
            "grads": {k: (g / world).detach() for k, g in zip(grad_keys, my_grads)},
            "whole_grads": _slice({k: g.detach() for k, g in zip(grad_keys, whole_grads)}, rank),
        }
    return results


def all4one_whole_feature(world: int) -> float:
    """The feature term of the whole 2B batch in one process."""
    from solo_ext.losses.all4one import redundancy_reduction

    x = _inputs(world)
    return redundancy_reduction(tuple(x["mz"]), tuple(x["proj"])).item()


def training_runs(out_dir: Path, rank: int) -> dict:
    from conftest import tiny_cfg

    from solo_ext.commands.pretrain import run
    from solo_ext.data.datasets import IndexedNCrop
    from solo_ext.methods.registry import SOLO_EXT_METHODS

    drawn: list[int] = []
    original = IndexedNCrop.__getitem__

    def recording(self, index):
        drawn.append(int(index))
        return original(self, index)

    IndexedNCrop.__getitem__ = recording
    from solo_ext.methods.scl import SCL

    anchors: list[int] = []  # the in-batch set's size, per contrastive loss
    contrastive_loss = SCL.contrastive_loss  # (the whole supervised family's)

    def counting(self, q, k, labels, queue):
        anchors.append(q.size(0))
        return contrastive_loss(self, q, k, labels, queue)

    SCL.contrastive_loss = counting
    runs = {}
    # every method, dscl with both directions and a queue per view, and dscl contrasting the
    # gathered batch
    variants = [(m, m, {}) for m in sorted(SOLO_EXT_METHODS)]
    variants.append(("dscl_symmetric", "dscl", {"method_kwargs.symmetric": True}))
    variants.append(("dscl_batch_gather", "dscl", {"method_kwargs.batch_gather": True}))
    for name, method, extra in variants:
        drawn.clear()
        anchors.clear()
        cfg = tiny_cfg(
            method,
            out_dir / "models",
            **{
                "strategy": "ddp",
                "devices": 2,
                "limit_train_batches": 3,
                "limit_val_batches": 0,
                "checkpoint.enabled": False,
                "method_kwargs.queue_size": 20,  # 2 x 4 per view per step: wraps around
                "optimizer.batch_size": 4,
                **extra,
            },
        )
        if method == "all4one_ct":
            cfg.method_kwargs.pred_hidden_dim = 16
        print(f"rank {rank}: {name}", flush=True)
        model = run(cfg)["model"]
        buffers = {
            k: v.clone()
            for k, v in model.state_dict().items()
            if k.startswith(("queue", "dense_queue"))
        }
        # the momentum encoder (bcl has none: its trained backbone)
        encoder = getattr(model, "momentum_backbone", model.backbone)
        momentum = torch.cat([p.flatten() for p in encoder.parameters()])
        runs[name] = {
            "buffers": buffers,
            "momentum": momentum,
            "drawn": list(drawn),
            "seed": torch.initial_seed(),  # the last epoch's reseed (EpochSeed)
            "anchors": list(anchors),
        }
    IndexedNCrop.__getitem__ = original
    SCL.contrastive_loss = contrastive_loss
    return runs


# the online metrics' inputs: a rank's share of the train / test rows (unequal on purpose, as
# at the end of an epoch), each share fed in two updates
KNN_SPLIT = {"train": (37, 60), "test": (9, 15)}


def knn_inputs() -> dict[str, torch.Tensor]:
    """Fixed features of 4 long-tailed classes around 4 centres (the kNN is neither always
    right nor always wrong on them), with the training counts of their classes."""
    gen = torch.Generator().manual_seed(7)
    centres = torch.randn(4, D, generator=gen)
    train_y = torch.tensor([0] * 30 + [1] * 16 + [2] * 10 + [3] * 4)
    test_y = torch.arange(4).repeat(4)[:15]
    noise = 1.2
    return {
        "train_x": centres[train_y] + noise * torch.randn(60, D, generator=gen),
        "train_y": train_y,
        "test_x": centres[test_y] + noise * torch.randn(15, D, generator=gen),
        "test_y": test_y,
        "counts": torch.bincount(train_y),
        "logits": torch.randn(15, 4, generator=gen),
    }


def rank_rows(kind: str, rank: int) -> slice:
    cut, end = KNN_SPLIT[kind]
    return slice(0, cut) if rank == 0 else slice(cut, end)


def online_metrics(train: list[slice], test: list[slice]) -> dict:
    """Each online metric fed the rows of ``knn_inputs`` in ``train`` / ``test`` (an update a
    slice), computed (synced over the ranks, in a process group), and computed after a reset."""
    from solo_ext.eval.knn_classifier import LongTailKNN
    from solo_ext.eval.shot_accuracy import ShotGroupAccuracy
    from solo_ext.modules.knn import WeightedKNNClassifier

    x = knn_inputs()
    counts = x["counts"].tolist()
    knns = {
        "knn": WeightedKNNClassifier(k=5, T=0.1, distance_fx="cosine"),
        "lt_knn": LongTailKNN(counts, many_threshold=20, few_threshold=5, k=5, T=0.1),
    }
    results = {}
    for name, metric in knns.items():
        for rows in train:
            metric.update(train_features=x["train_x"][rows], train_targets=x["train_y"][rows])
        for rows in test:
            metric.update(test_features=x["test_x"][rows], test_targets=x["test_y"][rows])
        results[name] = metric.compute()
        metric.reset()
        results[f"{name}_after_reset"] = metric.compute()
    shots = ShotGroupAccuracy(counts, many_threshold=20, few_threshold=5)
    for rows in test:
        shots.update(x["logits"][rows], x["test_y"][rows])
    results["shots"] = {k: float(v) for k, v in shots.compute().items()}
    return results


def nan_on_second_rank(out_dir: Path, rank: int) -> str:
    """A dscl fit whose loss is NaN on rank 1 only: the message this rank stops with."""
    from conftest import tiny_cfg

    import solo_ext.methods.dscl as dscl
    from solo_ext.commands.pretrain import run

    original = dscl.dscl_loss

    def poisoned(*args, **kwargs):
        loss = original(*args, **kwargs)
        return loss * float("nan") if rank == 1 else loss

    dscl.dscl_loss = poisoned
    cfg = tiny_cfg(
        "dscl",
        out_dir / "nan",
        **{"strategy": "ddp", "devices": 2, "optimizer.batch_size": 4, "limit_val_batches": 0},
    )
    try:
        run(cfg)
    except FloatingPointError as err:
        return str(err)
    finally:
        dscl.dscl_loss = original
    return "went on"


def main() -> None:
    import faulthandler

    faulthandler.dump_traceback_later(int(os.environ.get("DDP_WORKER_STACKS_AFTER", "600")))
    out_dir = Path(sys.argv[1])
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    result = {"runs": training_runs(out_dir, rank)}  # Lightning sets up the process group
    assert dist.is_initialized() and dist.get_backend() == "gloo"
    result["losses"] = loss_checks(rank, dist.get_world_size())
    train, test = rank_rows("train", rank), rank_rows("test", rank)  # each in two updates
    result["metrics"] = online_metrics(
        [slice(train.start, train.start + 5), slice(train.start + 5, train.stop)],
        [slice(test.start, test.start + 2), slice(test.start + 2, test.stop)],
    )
    result["nan_stop"] = nan_on_second_rank(out_dir, rank)  # last: the fit stops with an error
    torch.save(result, out_dir / f"rank{rank}.pt")


if __name__ == "__main__":
    os.environ.setdefault("SOLO_EXT_AUTOLOAD", "0")
    main()
