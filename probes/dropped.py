"""Where a loss term that trains some modules was left out of the loss: the last op on values made from them.

When trainable parameters got no gradient although their module ran with autograd recording, the gradflow
probe watches one forward to see which call cut the graph (`.detach()`, `.item()`, ...). Often nothing was cut:
the module's output went into a term that the script computed and then did not use (a line left over from a
test, `total_loss = score_loss`, tom-roddick/oft #6). For that same forward and until the backward after it, a
TorchFunctionMode marks the tensors made from those modules' outputs and keeps the last op of the script's
code that made one with a graph: where the values last went before they were dropped. That line (the
weighted sum no backward used) sits next to the line that dropped it.

Cost: one forward and its loss under the mode, once per run, only after such parameters were seen.
"""

from __future__ import annotations

import sys
from typing import Any

from torchdoctor.probes.nanlocate import op_name
from torchdoctor.probes.patches import user_site
from torchdoctor.probes.sites import as_dict

MAX_ARGS = 16  # tensor arguments looked at per op (a torch.cat of many parts is judged by its first ones)
# torch functions that build a new tensor from the values of their data argument: given values with a graph,
# the result has none (predrnn's `torch.mean(torch.tensor(decouple_loss))`)
CONSTRUCTORS = ("tensor", "as_tensor", "asarray")


class DroppedTerms:
    """Marks the values derived from some modules' outputs during one forward and the loss after it."""

    def __init__(self, torch: Any, is_user_file: Any) -> None:
        self.torch = torch
        self.is_user_file = is_user_file
        self.armed = False
        self.mode: Any = None
        self.marks: Any = None
        self.last: dict[str, Any] | None = None
        self.ops = 0
        # A host read (`.item()`) of a value that a graph op also consumed is a log line, not where the graph was
        # cut: reads waits for the consuming op, consumed for the read (either may come first).
        self.reads: Any = None
        self.consumed: Any = None
        # called with (tensor, op, site) when a constructor copies a marked value that has a graph into a new
        # tensor without one (`torch.tensor(list_of_losses)`): a cut no Tensor method makes (set by gradflow)
        self.on_cut: Any = None
        # The parameters that got no gradient (id -> parameter) and the storages of every trainable parameter
        # (data_ptr -> parameter), set by gradflow: a use of one of the former with autograd off (a `no_grad`
        # block inside a module's forward, a helper the trainer runs under `no_grad`), or a value with a graph
        # written into a parameter through an alias (`weight.data[i] = g`) or under no_grad, cuts the graph inside
        # the model, where no Tensor method on its output does; `on_param_cut(op, site, how)` is told the first.
        self.params: dict[int, Any] = {}
        self.storages: dict[int, Any] = {}
        self.on_param_cut: Any = None

    def arm(self) -> None:
        if self.armed:
            return
        from torch.overrides import TorchFunctionMode
        from torch.utils.weak import WeakTensorKeyDictionary

        watch = self
        self.marks = WeakTensorKeyDictionary()
        self.reads = WeakTensorKeyDictionary()
        self.consumed = WeakTensorKeyDictionary()
        self.last = None

        class DroppedWatch(TorchFunctionMode):
            def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                out = func(*args, **(kwargs or {}))
                if not watch.armed:  # left on the stack under a mode the script pushed later: inert
                    return out
                try:
                    if watch.params and watch.on_param_cut is not None:
                        watch._param_use(func, args)
                    watch._follow(func, args, kwargs, out)
                except Exception:  # noqa: BLE001 - the watch never disturbs the script's op
                    pass
                return out

        self.mode = DroppedWatch()
        self.mode.__enter__()
        self.armed = True

    def mark(self, output: Any) -> None:
        """A watched module's output: every tensor in it starts a mark."""
        if not self.armed:
            return
        for t in output if isinstance(output, (tuple, list)) else (output,):
            if isinstance(t, self.torch.Tensor):
                self.marks[t] = True

    def made_from_owners(self, t: Any) -> bool:
        """Whether `t` was made from a watched module's output (True when nothing is followed: no narrowing)."""
        if not self.armed or self.marks is None:
            return True
        try:
            return t in self.marks
        except TypeError:
            return False

    def _follow(self, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        if getattr(func, "__name__", "") == "__get__" or not len(self.marks):
            return
        tensor, marks = self.torch.Tensor, self.marks
        seen = 0
        hit = None
        for value in (*args, *(kwargs or {}).values()):
            parts = value if isinstance(value, (tuple, list)) else (value,)
            for part in parts:
                if isinstance(part, tensor):
                    seen += 1
                    if part in marks:
                        hit = part
                        break
                if seen >= MAX_ARGS:
                    break
            if hit is not None or seen >= MAX_ARGS:
                break
        if hit is None:
            return
        outs = out if isinstance(out, (tuple, list)) else (out,)
        graph = False
        for t in outs:
            if isinstance(t, tensor):
                marks[t] = True
                graph = graph or t.requires_grad
        if not graph and hit.requires_grad and getattr(func, "__name__", "") in CONSTRUCTORS \
                and self.torch.is_grad_enabled() and self.on_cut is not None:
            site = user_site(sys._getframe(2))
            if site is not None and self.is_user_file(site[0]):
                self.on_cut(hit, op_name(func), site)
        if graph:
            self.consumed[hit] = True
            for call in self.reads.get(hit, ()):
                call["read"] = True
            site = user_site(sys._getframe(2))
            if site is not None and self.is_user_file(site[0]):
                self.ops += 1
                self.last = {"op": op_name(func), "site": as_dict(site)}

    def _param_use(self, func: Any, args: Any) -> None:
        """A watched parameter used with autograd off or read through `.data`, or a value with a graph written into
        a parameter's storage where no graph can record it: the first one is reported, with the user's line."""
        if not args or not isinstance(args[0], self.torch.Tensor):
            return
        name = getattr(func, "__name__", "")
        first = args[0]
        how = None
        if name == "__get__":
            if id(first) in self.params and getattr(getattr(func, "__self__", None), "__name__", "") == "data":
                how = "data"
        elif name in ("__setitem__", "copy_") and len(args) > 1:
            value = args[-1]
            target = self.storages.get(first.data_ptr()) if first.numel() else None
            if target is not None and isinstance(value, self.torch.Tensor) and value.requires_grad and \
                    (first is not target or not self.torch.is_grad_enabled()):
                how = "write"
        elif not self.torch.is_grad_enabled() and any(
                isinstance(a, self.torch.Tensor) and id(a) in self.params for a in args[:MAX_ARGS]):
            how = "no_grad"
        if how is None:
            return
        site = user_site(sys._getframe(2))
        if site is not None and self.is_user_file(site[0]):
            callback, self.on_param_cut = self.on_param_cut, None  # the first one only
            callback(op_name(func) if name != "__get__" else ".data", site, how)

    def note_read(self, t: Any, call: dict[str, Any]) -> None:
        """A cutting call on `t` (gradflow's `.item()`, `.detach()`, ...): marked a read once a graph op uses `t`."""
        if not self.armed or self.reads is None:
            return
        try:
            if t in self.consumed:
                call["read"] = True
            else:
                self.reads.setdefault(t, []).append(call)
        except TypeError:
            pass

    def disarm(self) -> dict[str, Any] | None:
        """Stop following; the last op of the script's code that made a marked value with a graph."""
        if not self.armed:
            return None
        self.armed = False
        self.tidy()
        self.marks = self.reads = self.consumed = None
        last, self.last = self.last, None
        return last

    def tidy(self) -> None:
        """Pop the mode when it is the innermost one; under a mode the script entered later, ours stays inert."""
        from torch.overrides import _get_current_function_mode

        if self.mode is not None and _get_current_function_mode() is self.mode:
            self.mode.__exit__(None, None, None)
            self.mode = None
