"""Make a script that asks for CUDA run on a machine without one, under fake tensors.

- `torch.cuda` answers as one GPU of the target card would (`is_available`, `device_count`,
  `get_device_properties`, `synchronize`, ...);
- every CUDA device in a torch call (`device="cuda"`, `.cuda()`, `.to("cuda")`, `Module.to`) becomes
  the CPU, and the tensor it makes is counted as a GPU allocation (tracker.py);
- CUDA autocast becomes CPU autocast with the same dtype (CUDA's default is float16);
- CUDA's optimizer default (foreach, one kernel over all parameters, with its temporaries) is
  kept, as the CPU default (a loop per parameter) would hide the step's temporaries;
- attention runs as the GPU's fused kernels spend memory (kernels.py);
- a GradScaler always steps (no gradient is inf in the step being measured);
- DataLoader workers are not started (fake tensors do not cross processes), `torch.compile`
  returns the function (the estimate is eager's), `torch.save` writes nothing.
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from torchdoctor.fit.tracker import Tracker

# Ops CUDA autocast runs in float32 where CPU autocast keeps the low precision (PyTorch's
# autocast_mode.cpp: the CUDA "fp32" and "fp32_set_opt_dtype" lists, the ones training code meets).
# Their outputs, and what backward saves of them, are twice as large on the GPU.
CUDA_FP32_OPS = frozenset({
    "layer_norm", "group_norm", "softmax", "log_softmax", "exp", "expm1", "log", "log1p", "log2", "log10", "pow",
    "rsqrt", "reciprocal", "sum", "prod", "cumsum", "cumprod", "norm", "logsumexp", "softplus", "cross_entropy",
    "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy_with_logits",
    "kl_div", "cosine_similarity", "cdist", "erfinv", "acos", "asin", "cosh", "sinh", "tan",
})
# > 0 inside an autocast of the script's. Once it has opened one for CUDA, every CPU autocast counts:
# here the CPU stands for the GPU, and checkpointing re-enters the region as a CPU autocast on recompute.
cuda_autocast = {"depth": 0, "seen": False}


def _float32(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != torch.float32:
        return value.float()
    if isinstance(value, (list, tuple)):
        return type(value)(_float32(v) for v in value)
    return value


def _is_cuda(value: Any) -> bool:
    if isinstance(value, torch.device):
        return value.type == "cuda"
    if isinstance(value, str):
        return value == "cuda" or value.startswith("cuda:")
    return False


def _cpu(value: Any) -> Any:
    return torch.device("cpu") if isinstance(value, torch.device) else "cpu"


class Remap(TorchFunctionMode):
    """Rewrites CUDA devices to the CPU and tells the tracker which results are GPU tensors."""

    def __init__(self, tracker: Tracker) -> None:
        super().__init__()
        self.tracker = tracker

    def __torch_function__(self, func: Any, types_: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = dict(kwargs or {})
        wants_gpu = False
        if func is torch.device:  # a device object stays "cuda"; it is remapped where a tensor is made
            return func(*args, **kwargs)
        if (cuda_autocast["depth"] and getattr(func, "__name__", "") in CUDA_FP32_OPS
                and torch.is_autocast_enabled("cpu")):
            with torch.autocast("cpu", enabled=False):
                return func(*_float32(args), **{k: _float32(v) for k, v in kwargs.items()})
        if func is torch.Tensor.cuda:
            return self._copy_to_gpu(args[0], None)
        if func is torch.Tensor.to:
            device, dtype = _to_args(args[1:], kwargs, self.tracker)
            if _is_cuda(device):
                return self._copy_to_gpu(args[0], dtype)
        if "device" in kwargs and _is_cuda(kwargs["device"]):
            kwargs["device"] = _cpu(kwargs["device"])
            wants_gpu = True
        args = tuple(_cpu(a) if _is_cuda(a) else a for a in args)
        if wants_gpu:
            self.tracker.gpu_request += 1
            try:
                return func(*args, **kwargs)
            finally:
                self.tracker.gpu_request -= 1
        return func(*args, **kwargs)

    def _copy_to_gpu(self, t: torch.Tensor, dtype: Any) -> torch.Tensor:
        """What `.to("cuda")` does: a new contiguous copy on the device (a view copies only itself)."""
        if self.tracker.on_gpu(t):
            return t if dtype is None or dtype == t.dtype else t.to(dtype)
        self.tracker.gpu_request += 1
        try:
            with torch._C.DisableTorchFunctionSubclass():
                src = t if dtype is None else t.to(dtype)
                out = torch.empty_like(src, memory_format=torch.contiguous_format, device="cpu")
                out.copy_(src)
                out.requires_grad_(t.requires_grad)
        finally:
            self.tracker.gpu_request -= 1
        self.tracker.mark(out)
        return out


def _to_args(args: tuple, kwargs: dict, tracker: Tracker) -> tuple[Any, Any]:
    """`Tensor.to`'s device and dtype, from any of its signatures (`to(other)` takes other's)."""
    device = kwargs.get("device")
    dtype = kwargs.get("dtype")
    for a in args:
        if isinstance(a, torch.Tensor):
            device, dtype = ("cuda" if tracker.on_gpu(a) else None), a.dtype
        elif isinstance(a, torch.dtype):
            dtype = a
        elif isinstance(a, (torch.device, str)) and device is None:
            device = a
        elif isinstance(a, int) and not isinstance(a, bool) and device is None:
            device = f"cuda:{a}"
    return device, dtype


# -- torch.cuda as one card ----------------------------------------------------------------------


def install(card: dict[str, Any]) -> None:
    """Answer `torch.cuda`'s questions as one GPU of `card` (name, bytes, compute capability)."""
    cuda = torch.cuda
    props = types.SimpleNamespace(name=card["name"], total_memory=card["bytes"], major=card["major"],
                                  minor=card["minor"], multi_processor_count=card.get("sms", 108),
                                  is_integrated=False, is_multi_gpu_board=False)
    # One function object per name: dynamo keeps a table keyed by torch.cuda's functions, and one
    # object under two names is a "duplicate torch object" to it.
    def const(value: Any) -> Any:
        return lambda *a, **k: value

    replace = {
        "is_available": const(True), "device_count": const(1), "current_device": const(0),
        "is_initialized": const(True), "init": const(None), "set_device": const(None), "synchronize": const(None),
        "empty_cache": const(None), "reset_peak_memory_stats": const(None), "reset_max_memory_allocated": const(None),
        "manual_seed": const(None), "manual_seed_all": const(None), "seed": const(None), "seed_all": const(None),
        "get_device_name": const(card["name"]), "get_device_capability": const((card["major"], card["minor"])),
        "get_device_properties": const(props), "is_bf16_supported": const(card["major"] >= 8),
        "mem_get_info": const((card["bytes"], card["bytes"])),
        "memory_allocated": const(0), "memory_reserved": const(0),
        "max_memory_allocated": const(0), "max_memory_reserved": const(0),
    }
    for name, fn in replace.items():
        setattr(cuda, name, fn)
    torch.cuda.amp.common.amp_definitely_not_available = lambda: False

    # CUDA autocast -> CPU autocast, same dtype (CUDA's default dtype is float16, the CPU's bfloat16).
    autocast = torch.amp.autocast_mode.autocast
    original_init = autocast.__init__

    def init(self: Any, device_type: str, dtype: Any = None, enabled: bool = True, cache_enabled: Any = None) -> None:
        if device_type == "cuda" and enabled:
            cuda_autocast["seen"] = True
        self._td_cuda = enabled and (device_type == "cuda" or cuda_autocast["seen"])
        if device_type == "cuda":
            device_type, dtype = "cpu", dtype or torch.float16
        original_init(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    original_enter, original_exit = autocast.__enter__, autocast.__exit__

    def enter(self: Any) -> Any:
        if getattr(self, "_td_cuda", False):
            cuda_autocast["depth"] += 1
        return original_enter(self)

    def exit_(self: Any, *exc: Any) -> Any:
        if getattr(self, "_td_cuda", False):
            cuda_autocast["depth"] -= 1
        return original_exit(self, *exc)

    autocast.__init__ = init
    autocast.__enter__ = enter
    autocast.__exit__ = exit_

    # The optimizers' CUDA default: foreach (fused stays what the script asked for).
    from torch.optim import optimizer as optim_module

    def default_to_fused_or_foreach(params: Any, differentiable: bool, use_fused: bool = False) -> tuple[bool, bool]:
        if torch.jit.is_scripting() or differentiable:
            return False, False
        return use_fused, not use_fused

    optim_module._default_to_fused_or_foreach = default_to_fused_or_foreach
    for module in list(vars(torch.optim).values()):
        if isinstance(module, types.ModuleType) and hasattr(module, "_default_to_fused_or_foreach"):
            module._default_to_fused_or_foreach = default_to_fused_or_foreach

    # No worker processes, no pinned memory: fake tensors stay in this process.
    loader = torch.utils.data.DataLoader
    loader_init = loader.__init__

    def loader_init_here(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs["num_workers"] = 0
        kwargs["pin_memory"] = False
        kwargs.pop("prefetch_factor", None)
        kwargs["persistent_workers"] = False
        loader_init(self, *args, **kwargs)

    loader.__init__ = loader_init_here
    _module_moves()
    # The function itself is replaced, not intercepted in Remap: checkpointing recomputes the
    # forward during backward, where Remap is not on the stack, and must meet the same kernel.
    from torchdoctor.fit.kernels import attention

    torch.nn.functional.scaled_dot_product_attention = attention
    # A GradScaler steps when no gradient was inf; fake gradients have no values, and the healthy
    # step (the one every later step repeats) is the one to measure.
    def opt_step(self: Any, optimizer: Any, optimizer_state: Any, *args: Any, **kwargs: Any) -> Any:
        return optimizer.step(*args, **kwargs)

    torch.amp.GradScaler._maybe_opt_step = opt_step  # type: ignore[method-assign]
    torch.compile = lambda model=None, *a, **k: model if model is not None else (lambda m: m)  # type: ignore[assignment]
    torch.save = const(None)  # never write the user's checkpoints from an estimate


def _module_moves() -> None:
    """`Module.to("cuda")` and `Module.cuda()` move each parameter and buffer with `.data =`:
    `Module._apply` would swap fake tensors, which PyTorch refuses ("Couldn't swap")."""
    module_cls = torch.nn.Module
    original_to = module_cls.to

    def move(module: Any, dtype: Any) -> Any:
        for sub in module.modules():
            for p in sub._parameters.values():
                if p is not None:
                    want = dtype if dtype is not None and p.is_floating_point() else None
                    p.data = p.data.to("cuda", want) if want else p.data.cuda()
                    if p.grad is not None:
                        p.grad.data = p.grad.data.cuda()
            for name, b in sub._buffers.items():
                if b is not None:
                    want = dtype if dtype is not None and b.is_floating_point() else None
                    sub._buffers[name] = b.to("cuda", want) if want else b.cuda()
        return module

    def to(self: Any, *args: Any, **kwargs: Any) -> Any:
        with torch._C.DisableTorchFunction():  # Remap would turn "cuda" into "cpu" here
            device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        if device is not None and device.type == "cuda":
            return move(self, dtype)
        return original_to(self, *args, **kwargs)

    def cuda(self: Any, device: Any = None) -> Any:
        return move(self, None)

    module_cls.to = to  # type: ignore[method-assign]
    module_cls.cuda = cuda  # type: ignore[method-assign]
