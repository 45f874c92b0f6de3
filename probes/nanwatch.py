"""After a non-finite loss no replay could place: watch the next steps' ops for the one that makes it.

The nan probe's replay runs the step's recorded module calls, and the script's loss functions once they are
known (discovered at step 2, probes/lossfuncs.py). A loss made non-finite by the script's own code outside
them -- a helper applied to the target (`maxDepth / depth` on a depth map with holes), or a loss function at
step 1, before its discovery -- comes out as "the loss computation itself produced it", with the
`backward()` line. Data that does this usually does it again: for up to `watch_steps` steps after that
verdict, a TorchFunctionMode checks every torch op, and the first one that turns finite inputs (tensors and
Python numbers: `masked_fill(mask, float('-inf'))` is asked for, not made) into a non-finite output is
reported at the innermost line of the user's code that ran it.

Cost: nothing until such a verdict; then one Python call and a finiteness check per op for at most
`watch_steps` steps (armed only while a step takes under a second). The mode is popped at an optimizer step,
where it is the innermost mode again (inside `backward()` the mode's own handler has it off the stack).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from typing import Any

from torchdoctor.probes.nanlocate import finite, op_name, tensors_in
from torchdoctor.probes.userframes import is_library_file

MAX_OUTPUTS = 8  # output tensors checked per op


class OpWatch:
    """A one-off watch of the ops of the next steps, for the first op that makes a non-finite value."""

    def __init__(self, torch: Any, on_found: Callable[[dict[str, Any]], None]) -> None:
        self.torch = torch
        self.on_found = on_found
        self.mode: Any = None
        self.active = False
        self.done = False
        self.steps_left = 0
        self.pid = os.getpid()  # a DataLoader worker forked while the mode is on inherits it: it reports nothing

    def arm(self, steps: int) -> None:
        if self.done or self.mode is not None:
            return
        from torch.overrides import TorchFunctionMode

        watch = self

        class FirstNonfiniteOp(TorchFunctionMode):
            def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                kwargs = kwargs or {}
                out = func(*args, **kwargs)
                name = getattr(func, "__name__", "")
                # attribute reads are not ops; empty() hands out uninitialised memory, which may hold anything
                if watch.active and name != "__get__" and "empty" not in name:
                    try:
                        watch._check(func, args, kwargs, out, sys._getframe(1))
                    except Exception:  # noqa: BLE001 - the watch never disturbs the script's op
                        pass
                return out

        self.mode = FirstNonfiniteOp()
        self.mode.__enter__()
        self.active = True
        self.steps_left = steps

    def _check(self, func: Any, args: Any, kwargs: Any, out: Any, frame: Any) -> None:
        torch = self.torch
        with torch._C.DisableTorchFunction():  # our own checks are not the script's ops
            outs = tensors_in(out, torch, limit=MAX_OUTPUTS)
            if not outs or all(finite(t) for _, t in outs):
                return
            if not (_finite_inputs(args, torch) and _finite_inputs(kwargs, torch)):
                return
        if os.getpid() != self.pid:
            return
        while frame is not None and is_library_file(frame.f_code.co_filename):
            frame = frame.f_back
        if frame is None:
            return
        self.active = False
        self.done = True
        self.on_found({"op": op_name(func), "path": frame.f_code.co_filename, "line": frame.f_lineno,
                       "function": frame.f_code.co_name})

    def step_ended(self) -> None:
        """At an optimizer step: one watched step less; the mode is popped once the watch is over."""
        if self.mode is None:
            return
        if self.active:
            self.steps_left -= 1
            if self.steps_left > 0:
                return
            self.active = False
            self.done = True
        self.tidy()

    def tidy(self) -> None:
        from torch.overrides import _get_current_function_mode

        if self.mode is not None and _get_current_function_mode() is self.mode:
            self.mode.__exit__(None, None, None)
            self.mode = None


def _finite_inputs(value: Any, torch: Any, depth: int = 0) -> bool:
    """Every tensor and Python number in the op's arguments is finite."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, torch.Tensor):
        return finite(value)
    if depth > 3:
        return True
    if isinstance(value, dict):
        return all(_finite_inputs(v, torch, depth + 1) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(_finite_inputs(v, torch, depth + 1) for v in value[:64])
    return True
