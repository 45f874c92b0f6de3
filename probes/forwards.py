"""Top-level forward passes of the script's models, seen by the protocol probes.

A "top-level" forward is a call of a module that no other module is running
at that moment: `model(x)` in the training loop or in a validation loop, not
the layers inside it. The validation probe needs each one (with grad mode,
train/eval mode, and whether a backward later reached its output); the
gradflow probe needs the models themselves.

How the models are found, cheaply:

- until the first optimizer step, two global module hooks (forward pre-hook
  and an `always_call` forward hook) track the nesting depth, so every
  module called at depth 0 is a top-level candidate. Global hooks send every
  module call through PyTorch's slow path (a few µs per module), so they are
  removed at the first optimizer step — or as soon as `torch.compile` is
  called, so compiled code never guards on them;
- from then on, each top-level module that owns parameters gets one
  instance pre-hook and one `always_call` forward hook: two Python calls per
  top-level forward, nothing per layer. After `torch.compile`, the models
  are found once instead by one pass over the objects the garbage collector
  tracks (10-50 ms), at the first optimizer step.

A model first called after the first optimizer step is not seen. Only weak
references to the models are kept. The two instance hooks are invisible to
pickling and `copy.deepcopy` (`nn.Module.__getstate__` is wrapped to leave
them out): a model saved whole, or copied for an EMA, is the same as without
torchdoctor. The same goes for any other torchdoctor probe's module hooks.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from torchdoctor.probes.base import Probe
from torchdoctor.probes.heartbeat import beat
from torchdoctor.probes.transparent import transparent

Start = Callable[[Any], Any]  # module -> a token handed back to End
End = Callable[[Any, Any, Any], None]  # (module, output, token)


class ForwardWatch:
    def __init__(self, torch: Any) -> None:
        from torch.nn.modules import module as module_api
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.torch = torch
        self.subscribers: list[tuple[Probe, Start, End]] = []
        self.models: list[weakref.ref] = []  # top-level modules that own parameters, in first-call order
        self._model_ids: set[int] = set()
        self._candidates: list[weakref.ref] = []
        self._candidate_ids: set[int] = set()
        self._depth = 0
        self._inside = 0  # hooked models running now, one inside another (after the first optimizer step)
        self._tokens: list[list[Any]] = []
        # The first positional tensor of the latest top-level forward as (id, storage address, version), or None:
        # the accumulation probe tells micro-batches from several losses of one batch. A key, not the tensor:
        # holding the input would keep a graph alive (a GAN's D(fake)).
        self.input_key: tuple[int, int, int] | None = None
        self.paused = 0  # > 0 while a probe runs a model itself (the nan probe's replay): not the script's forwards
        self.settled = False
        self.compiled = False
        self._global = [
            module_api.register_module_forward_pre_hook(self._global_pre),
            module_api.register_module_forward_hook(self._global_post, always_call=True),
        ]
        self._settle_handle = register_optimizer_step_post_hook(self._on_first_step)
        self._hook_ids: set[int] = set()
        self._hide_hooks_from_pickle(torch.nn.Module)

    def subscribe(self, probe: Probe, start: Start, end: End) -> None:
        self.subscribers.append((probe, start, end))

    def on_compile(self) -> None:
        """torch.compile is about to run: drop the global hooks before dynamo can guard on them."""
        self.compiled = True
        self._remove_global()

    # -- the global phase --------------------------------------------------------------------

    def _global_pre(self, module: Any, args: Any) -> None:
        if self.paused:
            return
        if self._depth == 0:
            key = id(module)
            if key not in self._candidate_ids:
                self._candidate_ids.add(key)
                try:
                    self._candidates.append(weakref.ref(module))
                except TypeError:
                    pass
            self.input_key = self._key(args)
            self._start(module)
        self._depth += 1

    def _global_post(self, module: Any, args: Any, output: Any) -> None:
        if self.paused:
            return
        self._depth = max(self._depth - 1, 0)
        if self._depth == 0:
            self._end(module, output)

    def _remove_global(self) -> None:
        for handle in self._global:
            handle.remove()
        self._global = []
        # A forward cut short by the removal (compile called inside a forward) must not leave a token behind.
        self._tokens.clear()
        self._depth = 0

    # -- settling on the models ------------------------------------------------------------------

    def _on_first_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        # Called from inside PyTorch's loop over the global hooks: removing this hook here would mutate
        # that dict mid-iteration, so it stays and returns at once (the next forward removes it).
        if self.settled:
            return
        self.settled = True
        try:
            self._settle(optimizer)
        except Exception as exc:  # noqa: BLE001 - never reaches the script; the subscribers see no forwards
            for probe, _, _ in self.subscribers:
                _disable(probe, "forward-watch", exc)

    def _settle(self, optimizer: Any) -> None:
        self._remove_global()
        found = [m for m in (ref() for ref in self._candidates) if m is not None and owns_parameters(m)]
        if self.compiled or not found:
            found = self._find_models(optimizer)
        for module in found:
            self._hook(module)
        self._candidates.clear()

    def _find_models(self, optimizer: Any) -> list[Any]:
        """Top-level modules holding the optimizer's parameters: one pass over the gc's objects."""
        wanted = {id(p) for g in optimizer.param_groups for p in g["params"]}
        module_type = self.torch.nn.Module
        modules = [o for o in gc.get_objects() if issubclass(type(o), module_type)]
        children = {id(c) for m in modules for c in getattr(m, "_modules", {}).values() if c is not None}
        out = []
        for m in modules:
            if id(m) in children:
                continue
            try:
                if any(id(p) in wanted for p in m.parameters()):
                    out.append(m)
            except Exception:  # noqa: BLE001 - a half-built module
                continue
        return out

    def _hook(self, module: Any) -> None:
        if id(module) in self._model_ids:
            return
        try:
            self.models.append(weakref.ref(module))
        except TypeError:
            return
        self._model_ids.add(id(module))
        self._hook_ids.add(module.register_forward_pre_hook(self._instance_pre).id)
        self._hook_ids.add(module.register_forward_hook(self._instance_post, always_call=True).id)
        # The model a wrapper holds is called bare too, after the first step (an evaluation of DDP's `.module`, of
        # accelerate's unwrapped model): hooked as well, so that call is a top-level forward (inside the wrapper's
        # forward it is nested, not one of its own: two more Python calls per forward of a wrapped model only).
        # Not after torch.compile: a hook added to the compiled module's original would make dynamo recompile.
        inner = wrapped_model(module)
        if inner is not module and not self.compiled and id(inner) not in self._model_ids:
            self._model_ids.add(id(inner))
            self._hook_ids.add(inner.register_forward_pre_hook(self._instance_pre).id)
            self._hook_ids.add(inner.register_forward_hook(self._instance_post, always_call=True).id)

    def _hide_hooks_from_pickle(self, module_class: type) -> None:
        original = module_class.__getstate__
        ours = self._hook_ids

        def __getstate__(module: Any) -> Any:
            state = original(module)
            if isinstance(state, dict):
                for key in HOOK_DICTS:
                    hooks = state.get(key)
                    if hooks and any(k in ours or _is_ours(v) for k, v in hooks.items()):
                        drop = {k for k, v in hooks.items() if k in ours or _is_ours(v)}
                        state[key] = type(hooks)((k, v) for k, v in hooks.items() if k not in drop)
                        always = state.get("_forward_hooks_always_called")
                        if key == "_forward_hooks" and always:
                            state["_forward_hooks_always_called"] = type(always)(
                                (k, v) for k, v in always.items() if k not in drop)
            return state

        __getstate__.__wrapped__ = original  # type: ignore[attr-defined]
        module_class.__getstate__ = transparent(__getstate__)

    def _instance_pre(self, module: Any, args: Any) -> None:
        if self.paused:
            return
        # A model's forward can run another model inside it (an agent's forward running its actor and critic
        # heads, each called on its own elsewhere and so a model too; a wrapper around a model also called bare):
        # that inner call is part of the outer forward, not a top-level forward of its own.
        self._inside += 1
        if self._inside == 1:
            self.input_key = self._key(args)
            self._start(module)

    def _key(self, args: Any) -> tuple[int, int, int] | None:
        first = args[0] if isinstance(args, tuple) and args else None
        if not isinstance(first, self.torch.Tensor):
            return None
        try:
            return id(first), first.data_ptr(), first._version
        except Exception:  # noqa: BLE001 - a tensor without storage (meta, a functional wrapper, a subclass)
            return None

    def _instance_post(self, module: Any, args: Any, output: Any) -> None:
        if self.paused:
            return
        self._inside = max(self._inside - 1, 0)
        if self._inside == 0:
            self._end(module, output)

    # -- subscribers ---------------------------------------------------------------------------

    def _start(self, module: Any) -> None:
        beat()  # a top-level forward is training activity (validation, generation) for the hang watchdog
        if self.settled and self._settle_handle is not None:
            self._settle_handle.remove()
            self._settle_handle = None
        tokens = []
        for probe, start, _ in self.subscribers:
            token = None
            if probe.enabled:
                try:
                    token = start(module)
                except Exception as exc:  # noqa: BLE001 - a probe's bug never reaches the script
                    _disable(probe, "forward", exc)
            tokens.append(token)
        self._tokens.append(tokens)

    def _end(self, module: Any, output: Any) -> None:
        if not self._tokens:
            return
        tokens = self._tokens.pop()
        for (probe, _, end), token in zip(self.subscribers, tokens, strict=False):
            if probe.enabled and token is not None:
                try:
                    end(module, output, token)
                except Exception as exc:  # noqa: BLE001
                    _disable(probe, "forward", exc)

    def live_models(self) -> list[Any]:
        return [m for m in (ref() for ref in self.models) if m is not None]


HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")


def _is_ours(hook: Any) -> bool:
    """A hook some torchdoctor probe registered (a function, bound method or callable object of ours)."""
    for _ in range(3):  # unwrap torch's _WrappedHook and functools.partial
        inner = getattr(hook, "hook", None) or getattr(hook, "func", None)
        if inner is None:
            break
        hook = inner
    fn = getattr(hook, "__func__", hook)
    module = getattr(fn, "__module__", None) or type(hook).__module__
    return isinstance(module, str) and module.startswith("torchdoctor.")


def wrapped_model(module: Any, depth: int = 8) -> Any:
    """The innermost module `module` wraps: down through modules with one child and no parameters of their own
    (DataParallel/DDP's `.module`, torch.compile's `_orig_mod`, a script's own wrapper). `module` itself when it
    owns parameters or has several children."""
    inner = module
    for _ in range(depth):
        children = getattr(inner, "_modules", None) or {}
        own = getattr(inner, "_parameters", None) or {}
        if len(children) != 1 or any(p is not None for p in own.values()):
            break
        child = next(iter(children.values()))
        if child is None:
            break
        inner = child
    return inner


def owns_parameters(module: Any) -> bool:
    """Whether the module has at least one parameter (a model, not a metric or a loss module)."""
    try:
        return next(module.parameters(), None) is not None
    except Exception:  # noqa: BLE001
        return False


def _disable(probe: Probe, where: str, exc: BaseException) -> None:
    probe.enabled = False
    probe.emit("probe-error", where=where, error=f"{type(exc).__name__}: {exc}"[:500])


_WATCH: ForwardWatch | None = None


@contextmanager
def unwatched() -> Iterator[None]:
    """Forwards a probe runs itself (the nan probe's replay of a step) are not the script's: no subscriber
    sees them (a replay under no_grad would otherwise read as an evaluation forward in training mode)."""
    watch = _WATCH
    if watch is None:
        yield
        return
    watch.paused += 1
    try:
        yield
    finally:
        watch.paused -= 1


def forward_watch(torch: Any, probe: Probe) -> ForwardWatch:
    """The process's forward watch (created by the first probe that asks)."""
    global _WATCH
    if _WATCH is None:
        _WATCH = ForwardWatch(torch)
        from torchdoctor.probes.patches import compile_watch

        compile_watch(torch).subscribe(probe, _WATCH.on_compile)
    return _WATCH
