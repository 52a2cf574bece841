"""Faults through solo-learn's own, unmodified ``main_pretrain.py`` (only with the real
solo-learn): a run killed in mid-epoch, or in the middle of a checkpoint write, and started again
with ``auto_resume.enabled=True`` ends with the very weights of the uninterrupted run, in the
killed run's directory, on one process and on two.

The kills are real (SIGKILL to every process of the run, from the test shim: in a training step,
or with half a checkpoint's bytes on disk); the comparison is every tensor of the last
checkpoints, bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_solo_learn_scripts import CPU, SMALL, cpu, ok, solo

pytestmark = pytest.mark.solo_learn

# SMALL's synthetic_lt (24 ... 6 images of 6 classes, 78 in all) for three epochs; with batch 8
# an epoch is 9 steps on one process (batch 4 on each of two: 9 steps too; drop_last)
EPOCHS = [a for a in SMALL if not a.startswith("max_epochs")] + ["max_epochs=3"]
STEPS_PER_EPOCH = 9
RUNS = {
    "1 process": [*CPU, *EPOCHS],
    "2 processes": [*cpu(2), "strategy=ddp", *EPOCHS, "optimizer.batch_size=4"],
}
RESUME = ["auto_resume.enabled=True"]


def pretrain(where: Path, args: list[str], method: str = "scl", **env: str):
    """main_pretrain.py with synthetic-lt/<method> in its own process group (the shim's kill
    takes every process of the run, and only those)."""
    return solo(
        "main_pretrain.py",
        ["--config-name", f"synthetic-lt/{method}", *args],
        where,
        start_new_session=True,
        OMP_NUM_THREADS="1",
        **env,
    )


def killed(proc) -> None:
    assert proc.returncode == -9, (proc.returncode, proc.stderr[-3000:])


def run_dir_of(where: Path, method: str = "scl") -> Path:
    (run_dir,) = (where / "trained_models" / method).iterdir()
    return run_dir


def weights(ckpt: Path) -> dict[str, torch.Tensor]:
    return torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]


def assert_same_weights(got: Path, want: Path) -> None:
    mine, theirs = weights(got), weights(want)
    assert mine.keys() == theirs.keys()
    differ = [k for k in theirs if not torch.equal(mine[k], theirs[k])]
    assert not differ, f"{len(differ)} of {len(theirs)} tensors differ, e.g. {differ[:3]}"


def last_ckpt(run_dir: Path) -> Path:
    """The run's one checkpoint: solo-learn keeps only the newest (checkpoint.keep_prev)."""
    (ckpt,) = run_dir.glob("*.ckpt")
    return ckpt


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The uninterrupted run's last checkpoint, by processes and method (each run once)."""
    done = {}

    def last(processes: str = "1 process", method: str = "scl") -> Path:
        if (processes, method) not in done:
            where = tmp_path_factory.mktemp(f"{method}-{processes.replace(' ', '-')}")
            ok(pretrain(where, RUNS[processes], method))
            done[processes, method] = last_ckpt(run_dir_of(where, method))
            assert done[processes, method].name.endswith("-ep=2.ckpt")
        return done[processes, method]

    return last


# Every method's own state (queues, support sets, targets, heads, DenseCL's dense queue) resumes
# exactly through solo-ext-pretrain (tests/test_resume.py); through main_pretrain.py, beside
# scl: pbsd, whose patches and box generator solo-learn's patched loader makes (the loader is
# the script's, not the method's).
@pytest.mark.parametrize(
    "processes,method", [("1 process", "scl"), ("2 processes", "scl"), ("1 process", "pbsd")]
)
def test_killed_in_mid_epoch_resumes_to_the_uninterrupted_weights(
    processes, method, uninterrupted, tmp_path
):
    args = RUNS[processes]
    killed(pretrain(tmp_path, args, method, SOLO_EXT_TEST_KILL_AT=str(STEPS_PER_EPOCH + 4)))
    run_dir = run_dir_of(tmp_path, method)
    assert last_ckpt(run_dir).name.endswith("-ep=0.ckpt")
    proc = ok(pretrain(tmp_path, [*args, *RESUME], method))
    assert "Resuming from previous checkpoint" in proc.stdout
    # the run continued in its directory, whose one checkpoint is now the last epoch's
    assert run_dir_of(tmp_path, method) == run_dir
    assert last_ckpt(run_dir).name.endswith(f"-{run_dir.name}-ep=2.ckpt")
    assert_same_weights(last_ckpt(run_dir), uninterrupted(processes, method))


def test_killed_in_a_checkpoint_write_loses_nothing(uninterrupted, tmp_path):
    """The kill leaves the previous checkpoint whole (the write went to a temporary file), the
    next start removes the temporary file, and the run ends as the uninterrupted one."""
    args = RUNS["1 process"]
    killed(pretrain(tmp_path, args, SOLO_EXT_TEST_KILL_IN_SAVE="-ep=1.ckpt"))
    run_dir = run_dir_of(tmp_path)
    (partial,) = (p for p in run_dir.iterdir() if p.name.endswith(".tmp"))
    assert partial.name.startswith(".") and "-ep=1.ckpt" in partial.name
    assert last_ckpt(run_dir).name.endswith("-ep=0.ckpt")  # whole, and the only checkpoint
    proc = ok(pretrain(tmp_path, [*args, *RESUME]))
    assert "-ep=0.ckpt" in proc.stdout.split("Resuming from previous checkpoint")[1]
    assert not partial.exists()
    assert sorted(p.name for p in run_dir.iterdir() if p.name.startswith(".")) == []
    assert_same_weights(last_ckpt(run_dir), uninterrupted())


def test_an_unreadable_last_checkpoint_is_passed_over_in_one_line(uninterrupted, tmp_path):
    """A truncated file under a checkpoint's name (a write killed before writes were atomic, a
    full disk): the resume says so in one line, starts from the last readable checkpoint and
    ends as the uninterrupted run (the truncated file is written again, whole)."""
    args = [*RUNS["1 process"], "checkpoint.keep_prev=True"]
    killed(pretrain(tmp_path, args, SOLO_EXT_TEST_KILL_AT=str(2 * STEPS_PER_EPOCH + 3)))
    run_dir = run_dir_of(tmp_path)
    ep0, ep1 = sorted(run_dir.glob("*.ckpt"))
    assert ep0.name.endswith("-ep=0.ckpt") and ep1.name.endswith("-ep=1.ckpt")
    data = ep1.read_bytes()
    ep1.write_bytes(data[: len(data) // 2])
    proc = ok(pretrain(tmp_path, [*args, *RESUME]))
    said = [line for line in proc.stdout.splitlines() if "passing over" in line]
    assert len(said) == 1, proc.stdout
    assert ep1.name in said[0] and "not a readable checkpoint" in said[0], said[0]
    assert ep0.name in proc.stdout.split("Resuming from previous checkpoint")[1]
    ep2 = run_dir / ep1.name.replace("-ep=1.ckpt", "-ep=2.ckpt")
    assert sorted(run_dir.glob("*.ckpt")) == [ep0, ep1, ep2]
    assert len(ep1.read_bytes()) == len(data)
    assert_same_weights(ep2, uninterrupted())
