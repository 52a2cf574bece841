"""Test-only start-up code for solo-learn's scripts run as subprocesses by
tests/test_solo_learn_scripts.py (on ``PYTHONPATH``, so DDP's child processes load it too).

- ``SOLO_EXT_TEST_SPY=<dir>``: every training step appends the labels of its batch, as
  ``training_step`` receives them, to ``<dir>/labels-<rank>.jsonl`` (solo-ext's methods and
  solo-learn's linear model), so a test can compare them with the sampler's law.
- ``SOLO_EXT_TEST_CUDA_IS_CPU=1``: ``.cuda()`` is a no-op (solo-learn's ``main_knn.py`` moves
  every batch with ``.cuda()``; this machine has no GPU).
- ``SOLO_EXT_TEST_CIFAR_UNCHECKED=1``: torchvision skips the checksums of CIFAR's files (the
  tests write tiny stand-ins).
- ``SOLO_EXT_TEST_KILL_AT=<step>``: SIGKILL to the whole process group (every process of a
  DDP run) when training step ``<step>`` (the global step) is about to run, as a pre-emption.
- ``SOLO_EXT_TEST_KILL_IN_SAVE=<text>``: SIGKILL to the process group in the middle of the
  ``torch.save`` of a file whose name contains ``<text>``: half the bytes are on disk.
- ``SOLO_EXT_TEST_RENAME=<module>:<name>``: renames a name of a solo-learn module (or
  ``<Class>.<name>``) to ``<name>_renamed`` right after the module is executed, before solo-ext's
  patches look at it: a solo-learn release that renamed what the patches need.
"""

from __future__ import annotations

import json
import os
import sys


def _spy_on(cls, label_index: int) -> None:
    step = cls.training_step

    def training_step(self, batch, batch_idx):
        rank = os.environ.get("LOCAL_RANK", "0")
        with open(os.path.join(os.environ["SOLO_EXT_TEST_SPY"], f"labels-{rank}.jsonl"), "a") as f:
            f.write(json.dumps([int(t) for t in batch[label_index].tolist()]) + "\n")
        return step(self, batch, batch_idx)

    cls.training_step = training_step


# module -> what to do once it has been executed
AFTER = {}
if os.environ.get("SOLO_EXT_TEST_SPY"):
    AFTER["solo_ext.methods.base"] = lambda m: _spy_on(m.MomentumQueueMethod, 2)
    AFTER["solo.methods.linear"] = lambda m: _spy_on(m.LinearModel, 1)


def _kill_all() -> None:
    import signal

    os.killpg(os.getpgrp(), signal.SIGKILL)


if os.environ.get("SOLO_EXT_TEST_KILL_AT"):

    def _kill_at(base) -> None:
        from lightning.pytorch.callbacks import Callback

        step = int(os.environ["SOLO_EXT_TEST_KILL_AT"])

        class KillAt(Callback):
            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
                if trainer.global_step == step:
                    _kill_all()

        base.SCRIPT_CALLBACKS.append(lambda model: [KillAt()])

    AFTER["solo_ext.methods.base"] = _kill_at
if os.environ.get("SOLO_EXT_TEST_KILL_IN_SAVE"):

    def _kill_in_save(torch) -> None:
        import io

        save, text = torch.save, os.environ["SOLO_EXT_TEST_KILL_IN_SAVE"]

        def killed_save(obj, f, *args, **kwargs):
            name = str(getattr(f, "name", f))
            try:  # (a file opened from a descriptor is named by its number)
                name = os.readlink(f"/proc/self/fd/{f.fileno()}")
            except (AttributeError, OSError):  # a path, a buffer
                pass
            if text not in os.path.basename(name):
                return save(obj, f, *args, **kwargs)
            buffer = io.BytesIO()
            save(obj, buffer, *args, **kwargs)
            data = buffer.getvalue()[: buffer.tell() // 2]
            if hasattr(f, "write"):
                f.write(data)
                f.flush()
            else:
                with open(f, "wb") as out:
                    out.write(data)
            _kill_all()

        torch.save = killed_save

    AFTER["torch"] = _kill_in_save
if os.environ.get("SOLO_EXT_TEST_CUDA_IS_CPU"):

    def _cuda_is_cpu(torch):
        torch.Tensor.cuda = lambda self, *args, **kwargs: self
        torch.nn.Module.cuda = lambda self, *args, **kwargs: self

    AFTER["torch"] = _cuda_is_cpu
if os.environ.get("SOLO_EXT_TEST_CIFAR_UNCHECKED"):

    def _unchecked(cifar):
        cifar.CIFAR10._check_integrity = lambda self: True
        cifar.check_integrity = lambda *args, **kwargs: True

    AFTER["torchvision.datasets.cifar"] = _unchecked


if AFTER:
    from solo_ext.solo_learn.autoload import AfterImport  # imports nothing else

    sys.meta_path.insert(0, AfterImport(AFTER))

if os.environ.get("SOLO_EXT_TEST_RENAME"):
    from solo_ext.solo_learn.autoload import AfterImport, _SoloExtHook

    _target, _path = os.environ["SOLO_EXT_TEST_RENAME"].split(":")

    def _rename(module):
        owner, name = module, _path
        if "." in _path:
            cls, name = _path.split(".")
            owner = getattr(module, cls)
        setattr(owner, f"{name}_renamed", getattr(owner, name))
        delattr(owner, name)

    # after solo-ext's hook in the finders' order, so that its callback runs before solo-ext's
    _hook = next(i for i, f in enumerate(sys.meta_path) if isinstance(f, _SoloExtHook))
    sys.meta_path.insert(_hook + 1, AfterImport({_target: _rename}))
