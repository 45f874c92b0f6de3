"""The usual memory levers, applied to the user's script inside the fit child, so each one is
measured by running the step again, not guessed:

- `bf16`: the forward of each top-level model runs under bfloat16 autocast (the loss stays outside,
  as with `torch.autocast` around the forward);
- `checkpoint`: activation checkpointing (non-reentrant) of every block of a repeated stack
  (the children of an `nn.ModuleList`/`nn.Sequential` that repeat one class at least twice);
- `set_to_none`: `zero_grad(set_to_none=True)`, so gradients are freed between steps.

Sharding is arithmetic (estimate.py), not a run.
"""

from __future__ import annotations

from typing import Any

CHANGES = ("bf16", "checkpoint", "set_to_none")


def install(change: str | None, torch: Any) -> str | None:
    if change is None:
        return None
    if change == "bf16":
        _bf16(torch)
    elif change == "checkpoint":
        _checkpoint(torch)
    elif change == "set_to_none":
        original = torch.optim.Optimizer.zero_grad

        def zero_grad(self: Any, set_to_none: bool = True) -> None:
            original(self, set_to_none=True)

        torch.optim.Optimizer.zero_grad = zero_grad
    else:
        raise ValueError(f"unknown change {change!r}")
    return change


def _bf16(torch: Any) -> None:
    depth = {"n": 0, "ctx": None}

    def pre(module: Any, args: Any) -> None:
        depth["n"] += 1
        if depth["n"] == 1 and not torch.is_autocast_enabled("cpu"):
            depth["ctx"] = torch.autocast("cuda", dtype=torch.bfloat16)  # remapped, with CUDA's fp32 ops
            depth["ctx"].__enter__()

    def post(module: Any, args: Any, output: Any) -> None:
        depth["n"] -= 1
        if depth["n"] == 0 and depth["ctx"] is not None:
            depth["ctx"].__exit__(None, None, None)
            depth["ctx"] = None

    torch.nn.modules.module.register_module_forward_pre_hook(pre)
    torch.nn.modules.module.register_module_forward_hook(post, always_call=True)


def _checkpoint(torch: Any) -> None:
    """Wrap each block of a repeated stack the first time the model runs forward."""
    from torch.utils.checkpoint import checkpoint

    done: set[int] = set()

    def wrap(block: Any) -> None:
        forward = block.forward

        def checkpointed(*args: Any, **kwargs: Any) -> Any:
            if not torch.is_grad_enabled():
                return forward(*args, **kwargs)
            return checkpoint(forward, *args, use_reentrant=False, **kwargs)

        block.forward = checkpointed

    def pre(module: Any, args: Any) -> None:
        if id(module) in done:
            return
        for sub in module.modules():
            done.add(id(sub))
            if isinstance(sub, (torch.nn.ModuleList, torch.nn.Sequential)):
                kids = list(sub.children())
                if len(kids) >= 2 and len({type(k) for k in kids}) == 1 and any(
                        True for _ in kids[0].parameters()):
                    for kid in kids:
                        wrap(kid)

    torch.nn.modules.module.register_module_forward_pre_hook(pre)
