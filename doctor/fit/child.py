"""The fit child: runs the user's script under fake tensors until its second optimizer step ends.

`python -m torchdoctor.fit.child SPEC OUT` where SPEC is a JSON file written by estimate.py:
script (or module), argv, batch (a batch size to force on the script's batch argument, or null),
batch_arg, card, steps, what_if. OUT receives one JSON object: the GPU allocation events, the kind
of each storage, where the script stopped, and what it read that fake tensors cannot know.

Two optimizer steps: the first creates the optimizer's state lazily (Adam's moments, SGD's
momentum), so the second is the first whole step, the one every later step repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import traceback
from pathlib import Path
from typing import Any

# Argument names that hold the batch size in the scripts users write (argparse dests).
BATCH_DESTS = ("batch_size", "train_batch_size", "per_device_train_batch_size", "batch", "bs",
               "micro_batch_size", "batchsize")


class FitDone(BaseException):
    """Raised after the last step measured; a BaseException so the script's `except Exception`
    does not swallow it."""


def _patch_batch(spec: dict[str, Any], seen: dict[str, Any]) -> None:
    """Force the batch size on the script's own argparse argument (`--batch-size` and kin)."""
    wanted = spec.get("batch")
    names = [spec["batch_arg"]] if spec.get("batch_arg") else list(BATCH_DESTS)
    original = argparse.ArgumentParser.parse_known_args

    def parse_known_args(self: Any, args: Any = None, namespace: Any = None) -> Any:
        ns, rest = original(self, args, namespace)
        for name in names:
            value = getattr(ns, name.replace("-", "_"), None)
            if isinstance(value, int) and not isinstance(value, bool):
                seen.setdefault("arg", name)
                seen.setdefault("value", value)
                if wanted is not None:
                    setattr(ns, name.replace("-", "_"), int(wanted))
                break
        return ns, rest

    argparse.ArgumentParser.parse_known_args = parse_known_args  # type: ignore[method-assign]


def _user_frame(tb: Any, script_dir: str) -> dict[str, Any] | None:
    """The innermost frame of the user's code: not torch, not site-packages, not torchdoctor."""
    ours = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    import torch

    theirs = (os.path.dirname(os.path.abspath(torch.__file__)), ours, os.path.dirname(os.__file__))
    for frame in reversed(traceback.extract_tb(tb)):
        path = os.path.abspath(frame.filename)
        if frame.filename.startswith("<") or "site-packages" in path or path.startswith(theirs):
            continue
        return {"path": frame.filename, "line": frame.lineno, "code": (frame.line or "").strip()}
    return None


def _recompute_under(remap_cls: Any, tracker: Any, torch: Any) -> None:
    """Activation checkpointing runs the forward again inside backward, where the autograd engine
    does not carry torch-function modes: put Remap back around the recompute, so it makes what the
    forward made (CUDA autocast's float32 ops, GPU storages)."""
    from torch.utils import checkpoint

    frame_init = checkpoint._CheckpointFrame.__init__

    def init(self: Any, recompute_fn: Any, *args: Any, **kwargs: Any) -> None:
        def recompute(*inner: Any) -> Any:
            with remap_cls(tracker):
                return recompute_fn(*inner)

        frame_init(self, recompute, *args, **kwargs)

    checkpoint._CheckpointFrame.__init__ = init
    reentrant = checkpoint.CheckpointFunction.backward

    def backward(ctx: Any, *grads: Any) -> Any:
        with remap_cls(tracker):
            return reentrant(ctx, *grads)

    checkpoint.CheckpointFunction.backward = staticmethod(backward)


def main(spec_path: str, out_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from torchdoctor.fit import remap, what_if
    from torchdoctor.fit.tracker import Tracker

    remap.install(spec["card"])
    batch_seen: dict[str, Any] = {}
    _patch_batch(spec, batch_seen)
    tracker = Tracker()
    optimizers: dict[int, Any] = {}
    steps = {"done": 0}
    stop_after = int(spec.get("steps", 2))
    autocast_regions: set[str] = set()

    def step_pre(optimizer: Any, args: Any, kwargs: Any) -> None:
        tracker.events.append(("phase", 1, 0))  # the optimizer step begins
        optimizers[id(optimizer)] = optimizer
        for group in optimizer.param_groups:
            for p in group["params"]:
                tracker.label(p, "parameter")
                if p.grad is not None:
                    tracker.label(p.grad, "gradient")

    def step_post(optimizer: Any, args: Any, kwargs: Any) -> None:
        tracker.events.append(("phase", 0, 0))
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    tracker.label(value, "optimizer_state")
        steps["done"] += 1
        if steps["done"] >= stop_after:
            raise FitDone

    from torch.optim import optimizer as optim_module

    optim_module.register_optimizer_step_pre_hook(step_pre)
    optim_module.register_optimizer_step_post_hook(step_post)

    def forward_pre(module: Any, args: Any) -> None:
        first = next(module.parameters(), None)
        on = first is not None and tracker.on_gpu(first)
        module.__dict__["_td_fit_gpu"] = on
        if on:
            tracker.gpu_forward += 1
        if torch.is_autocast_enabled("cpu"):
            autocast_regions.add(str(torch.get_autocast_dtype("cpu")).replace("torch.", ""))

    def forward_post(module: Any, args: Any, output: Any) -> None:
        if module.__dict__.pop("_td_fit_gpu", False):
            tracker.gpu_forward -= 1

    torch.nn.modules.module.register_module_forward_pre_hook(forward_pre)
    torch.nn.modules.module.register_module_forward_hook(forward_post, always_call=True)

    def pack(t: Any) -> Any:
        tracker.label(t, "activation")
        return t

    changes = what_if.install(spec.get("what_if"), torch)
    _recompute_under(remap.Remap, tracker, torch)

    script = spec.get("script")
    script_dir = os.path.dirname(os.path.abspath(script)) if script else os.getcwd()
    sys.argv = [script or spec["module"], *spec.get("argv", [])]
    if script:
        sys.path.insert(0, script_dir)
    result: dict[str, Any] = {"stopped": "completed", "steps": 0}
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    try:
        with fake, tracker, remap.Remap(tracker), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            if script:
                runpy.run_path(script, run_name="__main__")
            else:
                runpy.run_module(spec["module"], run_name="__main__", alter_sys=True)
        result["stopped"] = "script-ended"
    except FitDone:
        result["stopped"] = "measured"
    except SystemExit as exc:
        result["stopped"] = "script-exited"
        result["exit_code"] = exc.code if isinstance(exc.code, int) else 1
    except BaseException as exc:  # noqa: BLE001 - reported with the user's line, never a traceback
        result["stopped"] = "blocked"
        result["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:400]
        result["where"] = _user_frame(exc.__traceback__, script_dir)
    result["steps"] = steps["done"]
    result["events"] = tracker.events
    result["kinds"] = {str(k): v for k, v in tracker.kind.items()}
    result["faked_scalars"] = len(tracker.faked_scalars)
    result["batch"] = batch_seen
    result["autocast"] = sorted(autocast_regions)
    result["optimizers"] = sorted({type(o).__name__ for o in optimizers.values()})
    result["what_if"] = changes
    import resource

    result["max_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    Path(out_path).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
