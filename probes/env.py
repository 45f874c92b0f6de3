"""The env probe: the software and settings the run actually ran with.

Measures (once at the first optimizer step, when the script has set its
flags, and again at the end, since flags can change in between): Python,
platform, torch / CUDA / cuDNN versions, whether CUDA is available and, if
the script initialised it, the devices (name, capability, memory); float32
matmul precision, TF32 for matmul and cuDNN, cudnn.benchmark,
cudnn.deterministic, deterministic algorithms (and warn-only), anomaly
detection, intra/inter-op threads; and the environment variables that steer
PyTorch: PYTORCH_CUDA_ALLOC_CONF, PYTORCH_ALLOC_CONF, CUDA_VISIBLE_DEVICES,
CUDA_LAUNCH_BLOCKING, CUBLAS_WORKSPACE_CONFIG, OMP_NUM_THREADS,
MKL_NUM_THREADS, PYTHONHASHSEED, NCCL_*, TORCH_*, the torchrun variables.
The result is the report's `environment`.

The variables are recorded as the script was started with them (`variables`),
read when the probe is installed, before the script runs or imports torch:
torch sets some itself while it runs (torch.compile sets
TORCHINDUCTOR_CACHE_DIR), and those are not the user's settings. What changed
during the run, by the script or by torch, is kept apart
(`variables_changed`, None for a variable removed).

Cost: about a millisecond, twice per run. It never initialises CUDA itself.
It imports no torch at module level and reads torch only if the script
imported it.

Symptoms (doctor/analysis/env.py): anomaly-detection-enabled when
`torch.autograd.set_detect_anomaly(True)` was on at a step (no threshold:
anomaly mode slows every backward several times over and belongs in a
debugging session, not a training run).
"""

from __future__ import annotations

import os
import platform
import sys
from typing import Any

from torchdoctor.probes.base import Probe

ENV_NAMES = (
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_LAUNCH_BLOCKING",
    "CUBLAS_WORKSPACE_CONFIG",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "PYTHONHASHSEED",
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
)
ENV_PREFIXES = ("NCCL_", "TORCH_", "TORCHINDUCTOR_", "TORCHDYNAMO_")


def environment_variables() -> dict[str, str]:
    return {
        k: v for k, v in sorted(os.environ.items()) if k in ENV_NAMES or k.startswith(ENV_PREFIXES)
    }


def changed_variables(given: dict[str, str], now: dict[str, str]) -> dict[str, str | None]:
    """The variables set, changed (new value) or removed (None) since `given` was read."""
    changed: dict[str, str | None] = {k: v for k, v in now.items() if given.get(k) != v}
    changed.update({k: None for k in given if k not in now})
    return dict(sorted(changed.items()))


def _safe(fn: Any, default: Any = None) -> Any:
    try:
        return fn()
    except Exception:  # noqa: BLE001 - a flag this torch does not have
        return default


def torch_facts(torch: Any) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda_version": torch.version.cuda,
        "hip_version": getattr(torch.version, "hip", None),
        "cudnn_version": _safe(torch.backends.cudnn.version),
        "cuda_available": _safe(torch.cuda.is_available, False),
        "cuda_initialized": _safe(torch.cuda.is_initialized, False),
        "float32_matmul_precision": _safe(torch.get_float32_matmul_precision),
        "tf32_matmul": _safe(lambda: torch.backends.cuda.matmul.allow_tf32),
        "tf32_cudnn": _safe(lambda: torch.backends.cudnn.allow_tf32),
        "cudnn_benchmark": _safe(lambda: torch.backends.cudnn.benchmark),
        "cudnn_deterministic": _safe(lambda: torch.backends.cudnn.deterministic),
        "deterministic_algorithms": _safe(torch.are_deterministic_algorithms_enabled),
        "deterministic_warn_only": _safe(torch.is_deterministic_algorithms_warn_only_enabled),
        "anomaly_detection": _safe(torch.is_anomaly_enabled, False),
        "num_threads": _safe(torch.get_num_threads),
        "num_interop_threads": _safe(torch.get_num_interop_threads),
        "mps_available": _safe(lambda: torch.backends.mps.is_available(), False),
    }
    if facts["cuda_initialized"]:
        devices = []
        for i in range(_safe(torch.cuda.device_count, 0)):
            props = _safe(lambda i=i: torch.cuda.get_device_properties(i))
            if props is None:
                continue
            devices.append(
                {
                    "index": i,
                    "name": props.name,
                    "capability": f"{props.major}.{props.minor}",
                    "total_memory_gib": round(props.total_memory / 2**30, 2),
                }
            )
        facts["cuda_devices"] = devices
        facts["device"] = "cuda"
    else:
        facts["device"] = "cpu"
    return facts


# Modules whose presence in the process shows a training framework at work (frameworks.toml `modules`): a
# dictionary lookup each, no import.
FRAMEWORK_MODULES = ("lightning.pytorch", "pytorch_lightning", "transformers.trainer", "accelerate.accelerator")


class EnvProbe(Probe):
    name = "env"

    def install(self) -> None:
        self._recorded_at: int | None = None
        # Before the script runs: platform's first call (cached after) starts `uname -p`, and starting a
        # subprocess mutates the warning filters (os.get_exec_path), which empties every module's
        # once-per-line registry: after the first step the script's warnings would be shown a second time.
        self._platform = platform.platform()
        self._given = environment_variables()  # before the script runs: as the user gave them

    def _record(self, when: str) -> None:
        facts: dict[str, Any] = {
            "python": sys.version.split()[0],
            "platform": self._platform,
            "machine": platform.machine(),
            "cpu_count": os.cpu_count(),
            "variables": self._given,
        }
        changed = changed_variables(self._given, environment_variables())
        if changed:
            facts["variables_changed"] = changed
        torch = sys.modules.get("torch")
        if torch is not None and hasattr(torch, "__version__"):
            facts.update(torch_facts(torch))
        loaded = [name for name in FRAMEWORK_MODULES if name in sys.modules]
        if loaded:
            facts["framework_modules"] = loaded  # the analysis names the framework (rules/data/frameworks.toml)
        self.emit("environment", when=when, **facts)

    def after_step(self, step: int, optimizer: Any) -> None:
        if self._recorded_at is None:
            self._recorded_at = step
            self._record("first-step")
        self.session.stop_calling(self, "after_step")  # the first step is all it records per step
        return None

    def finish(self, reason: str) -> None:
        self._record("end")
