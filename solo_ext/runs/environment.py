"""The environment a run's numbers come from, recorded with the run (``args.json``, and with each
evaluation in ``metrics.json``): solo-ext's and solo-learn's versions and commits, the libraries,
the device (the CPU's model and the instruction set torch dispatches to, or the GPUs), the
precision, the processes and the deterministic settings. Evaluating a run in an environment that
differs in a way that changes numbers prints one line (:func:`warn_if_numbers_differ`).

The same command on one machine gives the same weights; on another CPU or GPU, or another
library version, floating-point results differ in their last bits and a short run ends at
another per-seed number. :func:`numbers_differ` says which differences matter for comparing an
evaluation with its run.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Any

# libraries whose version goes into the record (distribution names)
LIBRARIES = ("torch", "torchvision", "lightning", "torchmetrics", "timm", "omegaconf", "hydra-core")
# what changes a run's numbers when it changes: these libraries' major.minor, and the host
NUMBER_LIBRARIES = ("torch", "torchvision", "timm", "lightning")


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _commit(path: Path) -> str | None:
    """The git commit of the checkout holding ``path`` (with ``-dirty`` when it has uncommitted
    changes to tracked files); None outside a checkout or without git."""
    try:
        run = dict(cwd=path, capture_output=True, text=True, timeout=10, check=True)
        commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], **run).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "-uno"], **run).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{commit}-dirty" if dirty else commit or None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def solo_learn_version() -> str:
    """``solo-learn <release>`` and `` (commit <sha>)`` when the checkout says so."""
    try:
        import solo
    except ImportError:
        return "solo-learn (not importable)"
    root = os.path.dirname(os.path.dirname(os.path.abspath(solo.__file__)))
    version = None
    try:
        from importlib.metadata import PackageNotFoundError
        from importlib.metadata import version as dist_version

        version = dist_version("solo-learn")
    except (ImportError, PackageNotFoundError):
        setup = os.path.join(root, "setup.py")
        if os.path.isfile(setup):
            with open(setup) as f:
                found = re.search(r"version\s*=\s*[\"']([^\"']+)", f.read())
            version = found.group(1) if found else None
    text = f"solo-learn {version or '(unknown version)'}"
    if os.path.exists(os.path.join(root, ".git")):
        try:
            sha = subprocess.run(
                ["git", "-C", root, "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            sha = ""
        if sha:
            text += f" (commit {sha})"
    return text


def _solo_learn() -> dict[str, Any] | None:
    from solo_ext.host import HOST

    if HOST != "solo":
        return None
    import solo

    source = Path(solo.__file__).resolve().parent.parent
    return {"release": solo_learn_version(), "path": str(source)}


def _config() -> dict[str, Any] | None:
    """The Hydra config the running application composed: its name, the file it was read from
    (the first of the search path that has it, as Hydra looks) and, when that file is one of
    solo-ext's shipped recipes, the recipe (``pretrain/imagenet-lt/dscl``); None outside Hydra."""
    try:
        from hydra.core.hydra_config import HydraConfig

        if not HydraConfig.initialized():
            return None
        hydra = HydraConfig.get()
        name = hydra.job.config_name
        sources = list(hydra.runtime.config_sources)
    except Exception:  # (no Hydra, or another version's layout: nothing recorded)
        return None
    if not name:
        return None
    file = None
    for source in sources:
        if source.schema != "file":
            continue
        for candidate in (name, f"{name}.yaml"):
            path = Path(source.path) / candidate
            if path.is_file():
                file = path.resolve()
                break
        if file is not None:
            break
    from hydra_plugins.solo_ext_configs import scripts_dir

    scripts = scripts_dir()
    recipe = None
    if file is not None and scripts is not None and scripts.resolve() in file.parents:
        recipe = str(file.relative_to(scripts.resolve()).with_suffix(""))
    return {"name": name, "file": None if file is None else str(file), "recipe": recipe}


def environment(
    *,
    precision: Any = None,
    world_size: int | None = None,
    accelerator: str | None = None,
    data_format: str | None = None,
) -> dict[str, Any]:
    """What produced a run or an evaluation (JSON-ready)."""
    import torch  # (here: the leaderboard reads records without torch)

    gpus = None
    if accelerator in ("gpu", "cuda") and torch.cuda.is_available():
        count = torch.cuda.device_count()
        gpus = {
            "count": count,
            "names": sorted({torch.cuda.get_device_name(i) for i in range(count)}),
        }
    libraries = {name: _version(name) for name in LIBRARIES}
    # the builds as imported (``2.14.1+cu130``; the package metadata drops the local part)
    libraries["torch"] = torch.__version__
    try:
        import torchvision

        libraries["torchvision"] = torchvision.__version__
    except ImportError:
        pass
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    if data_format == "dali":
        libraries["nvidia-dali"] = next(
            (v for v in map(_version, ("nvidia-dali-cuda120", "nvidia-dali-cuda110")) if v), None
        )
    return {
        "solo_ext": {
            "version": _version("solo-ext"),
            "commit": _commit(Path(__file__).resolve().parent),
        },
        "solo_learn": _solo_learn(),  # None: the embedded host
        "python": platform.python_version(),
        "platform": platform.platform(),
        "libraries": libraries,
        # torch's build: None for a CPU-only build
        "cuda": {"version": torch.version.cuda, "cudnn": cudnn} if torch.version.cuda else None,
        "device": {
            "cpu": _cpu_model(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads(),
            "gpus": gpus,
        },
        "precision": None if precision is None else str(precision),
        "world_size": world_size,
        "config": _config(),  # the Hydra config composed (a shipped recipe: its name)
        "deterministic": {
            "torch_deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "cudnn_deterministic": torch.backends.cudnn.deterministic,
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        },
    }


def of_trainer(trainer: Any, data_format: str | None = None) -> dict[str, Any]:
    """:func:`environment` of a Lightning trainer's run."""
    accelerator = type(trainer.accelerator).__name__.lower().replace("accelerator", "")
    return environment(
        precision=trainer.precision,
        world_size=trainer.world_size,
        accelerator=accelerator,
        data_format=data_format,
    )


def _major_minor(version: str | None) -> str | None:
    return None if version is None else ".".join(version.split("+")[0].split(".")[:2])


def numbers_differ(run: dict[str, Any] | None, here: dict[str, Any]) -> list[str]:
    """What differs between a run's environment and this one in a way that changes numbers: the
    host, the major.minor of torch, torchvision, timm and Lightning, the precision (when both
    give one). Empty when the run has no record (made before runs recorded one)."""
    if not isinstance(run, dict):
        return []
    found = []
    hosts = [
        "solo-learn" if isinstance(e.get("solo_learn"), dict) else "embedded" for e in (run, here)
    ]
    if hosts[0] != hosts[1]:
        found.append(f"host {hosts[0]} -> {hosts[1]}")
    libs = (run.get("libraries") or {}, here.get("libraries") or {})
    for name in NUMBER_LIBRARIES:
        old, new = _major_minor(libs[0].get(name)), _major_minor(libs[1].get(name))
        if old and new and old != new:
            found.append(f"{name} {old} -> {new}")
    old, new = run.get("precision"), here.get("precision")
    if old and new and old != new:
        found.append(f"precision {old} -> {new}")
    return found


def summary(env: dict[str, Any] | None) -> str:
    """One short line: host, torch, device and capability, precision, processes."""
    if not isinstance(env, dict):
        return ""
    device = env.get("device") or {}
    gpus = device.get("gpus")
    where = (
        f"{gpus['count']} x {', '.join(gpus['names'])}"
        if gpus
        else f"CPU {device.get('cpu_capability') or '?'}"
    )
    host = "solo-learn" if isinstance(env.get("solo_learn"), dict) else "embedded host"
    torch_version = (env.get("libraries") or {}).get("torch")
    parts = [host, f"torch {torch_version}", where]
    cuda = env.get("cuda")
    if isinstance(cuda, dict) and cuda.get("version"):
        parts.insert(2, f"CUDA {cuda['version']}, cuDNN {cuda.get('cudnn') or '?'}")
    if env.get("precision"):
        parts.append(str(env["precision"]))
    if env.get("world_size"):
        parts.append(f"{env['world_size']} process" + ("es" if env["world_size"] > 1 else ""))
    return ", ".join(parts)


def warn_if_numbers_differ(run: dict[str, Any] | None, command: str) -> list[str]:
    """Prints one line when this process differs from the run's recorded environment in a way
    that changes numbers (never stops); returns the differences."""
    import sys

    found = numbers_differ(run, environment())
    if found:
        print(
            f"{command}: warning: this evaluation's environment differs from the run's "
            f"({'; '.join(found)}): its numbers may differ from those the run's own "
            "environment gives",
            file=sys.stderr,
        )
    return found
