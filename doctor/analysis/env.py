"""Classify the env probe's evidence: the report's `environment`, and anomaly mode left on.

The last `environment` event of rank 0 (taken at the end, else at the first
step) becomes `report.environment`. `anomaly-detection-enabled` is raised
when any recorded moment had `torch.autograd.set_detect_anomaly(True)` on —
no threshold: it is either on or off (probes/env.py says why it matters).
"""

from __future__ import annotations

from typing import Any

from torchdoctor.analysis import Analysis
from torchdoctor.analysis.evidence import RunEvidence

PROBE = "env"


def analyse(run: RunEvidence) -> Analysis:
    out = Analysis()
    events = run.of_kind("environment", PROBE, run.ranks[0])
    if not events:
        return out
    env = {k: v for k, v in events[-1].items() if k not in ("kind", "probe", "t", "step", "when", "pid")}
    out.environment = env
    if env.get("device") == "cuda":
        out.contexts.append("gpu")
    loaded = set(env.get("framework_modules") or [])
    if loaded:
        from torchdoctor.specialists.frameworks import table

        out.contexts += [f["id"] for f in table().get("framework", []) if loaded & set(f["modules"])]
    for rank in run.ranks:
        on = [e for e in run.of_kind("environment", PROBE, rank) if e.get("anomaly_detection")]
        if on:
            out.symptoms.append(
                run.symptom(
                    "anomaly-detection-enabled",
                    probe=PROBE,
                    summary="torch.autograd anomaly detection was on while training "
                    f"(seen {'at the first step' if on[0].get('when') == 'first-step' else 'at the end'})",
                    values={"anomaly_detection": True, "step": on[0].get("step")},
                    step=on[0].get("step"),
                    rank=rank,
                )
            )
    out.measurements = {"summary": summary(env), **_flags(env)}
    return out


def _flags(env: dict[str, Any]) -> dict[str, Any]:
    keys = ("torch", "cuda_version", "cudnn_version", "device", "num_threads", "float32_matmul_precision",
            "tf32_matmul", "cudnn_benchmark", "deterministic_algorithms")
    return {k: env[k] for k in keys if env.get(k) is not None}


def summary(env: dict[str, Any]) -> str:
    parts = [f"torch {env.get('torch', '?')}", f"Python {env.get('python', '?')}"]
    if env.get("device") == "cuda":
        devices = env.get("cuda_devices") or []
        names = ", ".join(f"{d['name']} ({d['total_memory_gib']} GiB)" for d in devices) or "CUDA"
        parts.append(f"on {names}, CUDA {env.get('cuda_version')}, cuDNN {env.get('cudnn_version')}")
        parts.append(f"TF32 matmul {'on' if env.get('tf32_matmul') else 'off'}")
    else:
        parts.append(f"on CPU ({env.get('num_threads')} threads)")
    parts.append(f"float32 matmul precision {env.get('float32_matmul_precision')}")
    if env.get("deterministic_algorithms"):
        parts.append("deterministic algorithms on")
    if env.get("cudnn_benchmark"):
        parts.append("cudnn.benchmark on")
    variables = env.get("variables") or {}
    if variables:
        parts.append("set: " + ", ".join(sorted(variables)))
    return "; ".join(parts)
