"""The script's own loss functions, kept so that a non-finite loss made in one can be replayed.

A criterion written as a plain function (`geo_scal_loss(pred, target)` with a 0/0 in it) runs outside
every module: the nan probe's module replay sees finite outputs and can only say "the loss computation
itself produced it", at the `backward()` line. To name the op's own line, the function's calls must be
replayable like a top-level module's.

Discovery, once: for one step (armed by the nan probe after `loss_functions_step`, 2, only while a step takes
under a second and nothing is compiled) a TorchFunctionMode notes, for each torch op, the user's frames
that led to it. At that step's backward, the functions that the frame calling `backward()` called
directly, that ran torch ops and called no module, are the loss functions. Each is replaced, in the
globals of the module that defines it and of the module that calls it, by a wrapper that hands every
call's arguments (references, as for a module's call) to the nan probe before running the function.

Under a framework (Lightning's `training_step`, a Hugging Face Trainer's `compute_loss`), `backward()` is called by
the framework's code, and the user's frame above it is the `trainer.fit(...)` line, which computed nothing: the
loss was computed in a user function the framework called earlier in the step. There, the user functions that
library code (not a module's call) entered during the watched step are taken as loops too, and their direct
callees are the loss functions.

Replay (probes/nanlocate.py) runs such a call again on copies of its tensor arguments, under no_grad and
the op check: the first op that turns finite inputs into non-finite outputs is named at its line.

Cost: one step under the mode (a frame walk per op), then one Python call per loss-function call. The mode is
popped at the optimizer step after its backward (never left on the stack: every op would pay for it).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any

from torchdoctor.probes.transparent import transparent
from torchdoctor.probes.userframes import is_library_file

MAX_FUNCTIONS = 8  # loss functions wrapped per run
MAX_CHAIN = 12  # user frames looked at per op


class LossFunctions:
    """One step's discovery of the loss functions, and the wrappers that keep their calls."""

    def __init__(self, torch: Any, on_call: Callable[[Any, tuple, dict], None]) -> None:
        self.torch = torch
        self.on_call = on_call
        self.mode: Any = None
        self.armed = False
        self.done = False
        # (caller code, callee code) -> [callee's globals, a module ran below the callee]
        self.edges: dict[tuple[Any, Any], list[Any]] = {}
        self.user: dict[Any, bool] = {}  # code object -> the user's own code
        self.entries: set[Any] = set()  # user code entered from library code that is not a module's call
        self.wrapped: list[str] = []
        # the loop's function and the framework's entries into user code (compute_loss): where the loss is written
        self.loss_code: list[tuple[str, int, str]] = []
        # the lines of the user's code that ran a torch op during the watched step: which of a helper's lines
        # writing the same op ran (a masked mean's `dim=None` branch, not its other one)
        self.ran: set[tuple[Any, int]] = set()
        self.loss_callees: list[tuple[str, int, str]] = []
        self.loss_lines: list[tuple[str, int]] = []
        self._call_impl = torch.nn.Module._call_impl.__code__
        self._module_call = {self._call_impl, torch.nn.Module._wrapped_call_impl.__code__}
        self._torch_root = os.path.dirname(os.path.realpath(torch.__file__)) + os.sep

    def arm(self) -> None:
        if self.armed or self.done:
            return
        from torch.overrides import TorchFunctionMode

        watch = self

        class LossFunctionWatch(TorchFunctionMode):
            def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                out = func(*args, **(kwargs or {}))
                if watch.armed:
                    try:
                        watch._note(sys._getframe(1))
                    except Exception:  # noqa: BLE001 - the watch never disturbs the script's op
                        pass
                return out

        self.mode = LossFunctionWatch()
        self.mode.__enter__()
        self.armed = True

    def _is_user(self, code: Any) -> bool:
        known = self.user.get(code)
        if known is None:
            known = self.user[code] = not is_library_file(code.co_filename)
        return known

    def _note(self, frame: Any) -> None:
        chain: list[tuple[Any, Any, bool, int]] = []  # (code, globals, a module ran below this frame, its line)
        below = False
        while frame is not None and len(chain) < MAX_CHAIN:
            code = frame.f_code
            if code is self._call_impl:
                below = True
            elif self._is_user(code):
                chain.append((code, frame.f_globals, below, frame.f_lineno))
                caller = frame.f_back
                if caller is not None and len(self.entries) < 64 and caller.f_code not in self._module_call \
                        and not self._is_user(caller.f_code):
                    self.entries.add(code)  # called by library code: a framework's hook (training_step)
            frame = frame.f_back
        if chain and len(self.ran) < 4096:
            self.ran.add((chain[0][0], chain[0][3]))
        for (code, globals_, module_below, _), (parent, _, _, _) in zip(chain, chain[1:], strict=False):
            edge = self.edges.get((parent, code))
            if edge is None:
                if len(self.edges) < 4096:
                    self.edges[(parent, code)] = [globals_, module_below]
            elif module_below:
                edge[1] = True

    def disarm(self, caller: Any) -> None:
        """At the watched step's backward, `caller` the frame that called it: wrap its loss functions."""
        if not self.armed:
            return
        self.armed = False
        self.done = True
        self.tidy()
        try:
            self._wrap_callees(caller)
        finally:
            self.edges = {}
            self.user = {}
            self.entries = set()
            self.ran = set()

    def tidy(self) -> None:
        """Pop the mode when it is the innermost one. Inside backward() (a torch function the mode's handler runs,
        with the mode off the stack meanwhile), or under a mode the script entered later, it is not: it stays
        inert and the nan probe pops it at the optimizer step."""
        from torch.overrides import _get_current_function_mode

        if self.mode is not None and _get_current_function_mode() is self.mode:
            self.mode.__exit__(None, None, None)
            self.mode = None

    def _wrap_callees(self, caller: Any) -> None:
        framework = False  # library code other than torch's between backward() and the user's frame
        while caller is not None and not self._is_user(caller.f_code):
            path = os.path.realpath(caller.f_code.co_filename)
            if not path.startswith(self._torch_root) and not caller.f_code.co_filename.startswith("<") \
                    and not _ours(path):
                framework = True
            caller = caller.f_back
        if caller is None:
            return
        loops = {caller.f_code} | (self.entries if framework else set())
        # the loss code: the loops, and the functions and methods below them that ran torch ops and called no
        # module (`loss_fn(out, batch)` → its `__call__` → `masked_mean`), where a graph-named op's line is looked for
        code_of = set(loops)
        for _ in range(4):
            code_of |= {code for (parent, code), (_, module_below) in self.edges.items()
                        if parent in code_of and not module_below}
        code_of = set(list(code_of)[:32])
        self.loss_code = [(c.co_filename, c.co_firstlineno, c.co_name) for c in list(loops)[:16]]
        self.loss_callees = [(c.co_filename, c.co_firstlineno, c.co_name) for c in code_of - loops]
        self.loss_lines = sorted({(c.co_filename, line) for c, line in self.ran if c in code_of})[:256]
        for (parent, code), (globals_, module_below) in list(self.edges.items()):
            if parent not in loops or module_below or len(self.wrapped) >= MAX_FUNCTIONS:
                continue
            function = globals_.get(code.co_name)
            if getattr(function, "__code__", None) is not code:
                continue  # a method, a closure or a rebound name: not reachable through a module's globals
            wrapper = self._wrapper(function)
            for namespace in (globals_, caller.f_globals):
                for name, value in list(namespace.items()):
                    if value is function:
                        namespace[name] = wrapper
            self.wrapped.append(code.co_name)

    def _wrapper(self, function: Any) -> Any:
        on_call = self.on_call

        @functools.wraps(function)
        def loss_function(*args: Any, **kwargs: Any) -> Any:
            try:
                on_call(function, args, kwargs)
            except Exception:  # noqa: BLE001 - keeping a call for a replay never breaks the script
                pass
            return function(*args, **kwargs)

        return transparent(loss_function)


_HERE = os.path.dirname(os.path.realpath(__file__))
_OURS = tuple(os.path.join(os.path.dirname(_HERE), d) + os.sep for d in ("doctor", "probes", "rules", "specialists"))


def _ours(path: str) -> bool:
    return path.startswith(_OURS)
