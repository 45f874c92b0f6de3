"""The validation probe: forward passes that no backward reaches, and the mode they ran in.

Measures
--------
Every top-level forward of the script's models (probes/forwards.py) records
whether autograd was recording (grad enabled and not inference mode), how
many of the model's dropout and batch-norm modules were in training mode,
and the user's line. A forward that autograd recorded is trained when the
next backward starts before another forward (the usual loop); when another
forward comes first (an evaluation loop, or several forwards per loss), a
pre-hook on the grad_fn of its outputs marks it trained if a backward
reaches it later (the grad_fn nodes are held from the forward's end to the
next forward, backward or step — no longer than the script's own variables
hold them).
At the next optimizer step (and at the end) each forward is classified:

- trained: a backward reached it (a training forward);
- evaluation with grad: autograd recorded a graph that no backward used —
  the graph and the activations it saves were built for nothing;
- evaluation without grad: under `torch.no_grad()` / `inference_mode()`.

An evaluation forward with dropout or batch-norm modules in training mode
is recorded with their names. A trained forward whose dropout/batch-norm
modules are all in eval mode, after earlier trained forwards ran them in
training mode, means `model.train()` was not restored after validation.
A model that never trained in train mode and trains in eval mode after a
routine called model.eval(), ran its forwards without grad and returned
(an evaluation before the first epoch, an RL rollout) was left in eval mode
by that routine: the stack of each model.eval() call is kept, and the first
forward after it says whether that routine ran it. A script that trains in
eval mode on purpose switches the model itself (frozen batch norm).
Once a line is known to run evaluation forwards with grad, up to
`measure_forwards` later forwards from that line count the bytes their
graph saves for backward (a saved-tensor pack hook that returns the tensor unchanged;
parameters excluded): the memory an evaluation batch costs.

Costs (bench/bench_run.py, CPU)
-------------------------------
~10 µs per top-level forward (grad/train flags, the user's line, a
reference to its outputs' grad_fn nodes; a pre-hook only when another forward
follows before a backward), nothing per layer; < 1 µs per backward; a pack hook per
saved tensor on at most `measure_forwards` forwards, only from a line that
ran evaluation forwards with grad; a stack walk per model.eval() call, at the
first forward after it, and on at most `routine_checks` training forwards in
eval mode of a model an evaluation routine switched (never per step after).
A model's key (the module reached through wrappers such as DDP's `.module`,
so the wrapper and what it wraps are one model) is a dict look-up per forward
(~0.3 µs). A model.eval() of a model that trained in train mode arms one
global forward pre-hook that removes itself at the next module call (did the
routine that called eval() run a part of the model, its encoder?).

Symptoms (thresholds in rules/data/thresholds.toml, [validation];
classified in doctor/analysis/validation.py)
------------------------------------------------------------------
- eval-without-no-grad: at least `min_eval_forwards` evaluation forwards
  built a graph no backward used (`extra_gib`: the bytes saved per batch);
- eval-mode-missing: evaluation forwards ran dropout/batch-norm modules in
  training mode (`modules`), or training resumed with them in eval mode
  (`train_not_restored`).
"""

from __future__ import annotations

import sys
import time
import weakref
from typing import Any

from torchdoctor.probes.base import Probe
from torchdoctor.probes.forwards import forward_watch, owns_parameters, wrapped_model
from torchdoctor.probes.patches import backward_watch
from torchdoctor.probes.sites import as_dict
from torchdoctor.probes.transparent import transparent
from torchdoctor.probes.userframes import is_library_file

MIB = 2**20


class _Forward:
    __slots__ = ("model", "name", "grad", "train", "droppers", "site", "step", "trained", "graph", "saved", "waited",
                 "stack", "mode", "module", "backward_site", "updated", "after_eval", "train_call", "zeroed")

    def __init__(self) -> None:
        self.trained = False
        self.graph = False
        self.waited = False  # kept past one optimizer step for a backward that may still come (several optimizers)
        self.saved: dict[int, int] | None = None
        self.stack: tuple[tuple[Any, int], ...] | None = None
        self.mode = True  # the model's own .training flag at the forward (model.eval() clears it)
        self.module: Any = None  # a weak reference, only for a forward in eval mode
        self.backward_site: tuple[str, int, str] | None = None
        self.updated: bool | None = None  # eval mode only: does the optimizer step that follows update this model
        self.after_eval = False  # eval mode only: an evaluation-like forward ran since the model was in train mode
        self.train_call: tuple[str, int, str] | None = None  # a model.train() call made after model.eval()
        self.zeroed = False  # trained, then a zero_grad() before the step: its gradients never reached an update


class ValidationProbe(Probe):
    name = "validation"

    def install(self) -> None:
        import torch

        self.torch = torch
        opt = self.options
        self.measure_forwards = int(opt.get("measure_forwards", 8))
        self.max_pending = int(opt.get("max_pending_forwards", 256))
        self.max_events = int(opt.get("max_events", 50))
        self.min_switched_steps = int(opt.get("min_switched_steps", 3))
        self.is_dropper = (torch.nn.modules.dropout._DropoutNd, torch.nn.modules.batchnorm._BatchNorm)
        self.droppers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # Modules seen owning parameters: `module.parameters()` walks a generator per nesting level before it
        # reaches the first parameter (~5 µs warm for a 2-layer transformer, every forward); a model keeps its
        # parameters, so a yes is remembered (a no is not: a lazy module gets its parameters later). By id, with a
        # weak reference to tell a new module at a freed one's address: a module class may be unhashable.
        self.models_seen: dict[int, weakref.ref] = {}
        self.pending: list[_Forward] = []
        self.user_code: dict[Any, bool] = {}  # code object -> is it the user's (not a library's)
        self.groups: dict[tuple, dict[str, Any]] = {}
        self.trained_in_train_mode: set[int] = set()
        self.not_restored_reported: set[int] = set()
        self.last_eval_site: dict[int, Any] = {}
        # Optimizer steps on forwards run after model.eval() by a model that also trains in train mode, per
        # model: an evaluation phase that trains (backward and step on validation batches) — judged once the
        # script has switched back to train mode, which a model merely left in eval mode never does.
        self.eval_steps: dict[int, dict[str, Any]] = {}
        self.train_mode_models: set[int] = set()
        self.updates: dict[tuple[int, int], bool] = {}
        # A model's identity: the innermost module that holds all of its parameters, through wrappers that own
        # none themselves (DataParallel/DDP's .module, torch.compile's _orig_mod, a script's own wrapper): a script
        # trains through the wrapper and evaluates the inner model (or calls eval() on either), and both are the
        # same model. Per module: (weak reference, key); one dict look-up per forward.
        self.keys: dict[int, tuple[weakref.ref, int]] = {}
        self.clears: dict[tuple[int, int], bool] = {}  # (model, zero_grad owner) -> clears all its trainable params
        # model.eval() on a model that trained in train mode: did the routine that called it run any module after it
        # (an evaluation of a submodule, `model.encoder(x)` for a kNN monitor, which the forward watch does not see)?
        # One global forward pre-hook, removed at the first module call after that eval(): nothing per step.
        self.eval_ran_module: dict[int, bool] = {}
        self.armed: list[tuple[int, Any]] = []
        self.arm_handle: Any = None
        self.train_sites: set[tuple[str, int]] = set()  # lines whose forwards trained in train mode
        self.eval_forwards_waiting = False  # an eval-mode forward with grad since the last backward
        self.since_eval: set[int] = set()  # models with an evaluation-like forward since their last train-mode one
        self.last_eval_stack: dict[int, Any] = {}
        self.measure_left = self.measure_forwards
        self.measure_sites: set[tuple[str, int]] = set()  # lines that ran evaluation forwards with grad
        self.memory_reported = False
        self.counts = {"trained": 0, "eval_grad": 0, "eval_no_grad": 0, "other": 0}
        # Optimizer steps that no backward came before since the previous step, right after forwards no backward
        # reached (an evaluation loop that kept the training loop's optimizer.step()): each re-applies the
        # gradients the last training batch left (and Adam's or momentum's state moves the weights again).
        self.backwards_since_step = 0
        self.stepped_with_backward = 0
        self.blind: dict[str, Any] | None = None
        self.events = 0
        self.cost_s = 0.0
        self.forwards = 0
        # The latest forward with a graph, not resolved yet, with its outputs' grad_fn nodes: held only until
        # the next forward, backward or optimizer step (the script's own variables hold them that long anyway).
        self.last: tuple[_Forward, list[Any]] | None = None
        self.watch = forward_watch(torch, self)
        self.watch.subscribe(self, self._start, self._end)
        backward_watch(torch).subscribe(self, self._backward)
        # torch.autograd.grad is a backward too (training by `p.grad = g` from it, MAML's inner loop, a saliency map
        # of the inputs): the latest forward's graph gets its pre-hook before that pass, so a forward it reaches is
        # not an evaluation that built a graph for nothing. One attribute check per call, nothing per step.
        torch.autograd.grad = self._wrap_grad(torch.autograd.grad)
        # Where each model was last put in eval mode: when evaluation runs inline in the training loop, that
        # model.eval() is the line a model left in eval mode comes from. Module.eval is called once per phase
        # (not recursively: it calls train(False)), so wrapping it costs nothing per step.
        self.eval_calls: dict[int, tuple[str, int, str] | None] = {}
        # model.eval() called on a model that was in train mode, per model: (the optimizer step it fell in, the user's
        # stack of that call). A forward that step trains in eval mode after it: the script put the model in train
        # mode and a routine it calls inside the step (a helper reading predictions) switched it off again.
        self.switched_off: dict[int, tuple[int, tuple[tuple[Any, int], ...]]] = {}
        self.switched_steps: dict[int, int] = {}
        # model.train() calls between a model.eval() and the next backward: a validation block that switches the
        # model back to training mode before its forwards is named at that call. Module.train recurses into every
        # child, so it is watched only in that window (from eval() to the next backward), never during training.
        self.train_calls: dict[int, tuple[str, int, str] | None] = {}
        # The user's stack of the latest model.eval() per model, and whether the routine that called it then ran
        # the model's forwards itself (an evaluation or a rollout, not a switch made for training): a model that
        # never trained in train mode and trains in eval mode after such a routine returned was left there by it.
        # One stack walk per eval() call and per model at most `routine_checks` training forwards; never per step.
        self.eval_stacks: dict[int, tuple[tuple[Any, int], ...]] = {}
        self.eval_routine_ran: dict[int, bool] = {}
        self.eval_routine_pending: set[int] = set()
        self.eval_reasserted: set[int] = set()  # model.eval() again on a model already in eval mode
        self.routine_checks: dict[int, int] = {}
        self.max_routine_checks = int(opt.get("routine_checks", 8))
        self.left_by_routine: dict[int, int] = {}
        self.train_original = torch.nn.Module.train
        self.train_wrapper = self._wrap_train(self.train_original)
        self.train_watched = False
        torch.nn.Module.eval = self._wrap_eval(torch.nn.Module.eval)
        # a zero_grad() after an evaluation's backward discards its gradients: no step applies them
        torch.optim.Optimizer.zero_grad = self._wrap_zero_grad(torch.optim.Optimizer.zero_grad)
        torch.nn.Module.zero_grad = self._wrap_zero_grad(torch.nn.Module.zero_grad)

    def _wrap_grad(self, original: Any) -> Any:
        probe = self

        def grad(*args: Any, **kwargs: Any) -> Any:
            probe.backwards_since_step += 1
            if probe.last is not None and probe.enabled:
                try:
                    probe._settle_last()
                except Exception as exc:  # noqa: BLE001 - a probe's bug never reaches the script
                    probe.enabled = False
                    probe.emit("probe-error", where="autograd.grad", error=f"{type(exc).__name__}: {exc}"[:500])
            return original(*args, **kwargs)

        grad.__wrapped__ = original  # type: ignore[attr-defined]
        grad.__doc__ = original.__doc__
        return transparent(grad)

    def _wrap_zero_grad(self, original: Any) -> Any:
        probe = self

        def zero_grad(owner: Any, *args: Any, **kwargs: Any) -> Any:
            for rec in probe.pending[-16:]:
                if rec.trained and not rec.mode and not rec.zeroed and probe._clears(owner, rec):
                    rec.zeroed = True  # an eval-mode forward whose gradients are thrown away before any step
            return original(owner, *args, **kwargs)

        zero_grad.__wrapped__ = original  # type: ignore[attr-defined]
        zero_grad.__doc__ = original.__doc__
        return transparent(zero_grad)

    def _key(self, module: Any) -> int:
        """The id of the innermost module `module` wraps with no parameters of its own (itself when it owns some or
        has several children): the same model whether the script calls the wrapper or what it wraps."""
        found = self.keys.get(id(module))
        if found is not None and found[0]() is module:
            return found[1]
        inner = wrapped_model(module)
        key = id(inner)
        if len(self.keys) < 512:
            self.keys[id(module)] = (weakref.ref(module), key)
        return key

    def _clears(self, owner: Any, rec: _Forward) -> bool:
        """Whether this zero_grad() (an optimizer's or a module's, set_to_none or in place) clears every trainable
        parameter of the model of an eval-mode forward a backward reached: only then are its gradients gone before
        the next step. A zero_grad() of another optimizer or another model (a GAN's generator) leaves them.
        Cached per (model, owner); asked only while such a forward waits for a step (an evaluation that backpropagates)."""
        module = rec.module() if rec.module is not None else None
        if module is None:
            return True  # the model is gone: nothing of it can reach a step
        key = (id(module), id(owner))
        found = self.clears.get(key)
        if found is None:
            try:
                groups = getattr(owner, "param_groups", None)
                if groups is not None:
                    cleared = {id(p) for g in groups for p in g["params"]}
                else:
                    cleared = {id(p) for p in owner.parameters()}
                trainable = [p for p in module.parameters() if p.requires_grad]
                found = bool(trainable) and all(id(p) in cleared for p in trainable)
            except Exception:  # noqa: BLE001 - an owner of the script's own making: keep the old reading
                found = True
            if len(self.clears) < 64:
                self.clears[key] = found
        return found

    def _wrap_eval(self, original: Any) -> Any:
        probe = self

        def eval(module: Any) -> Any:  # noqa: A001 - it stands for Module.eval
            if probe.enabled and len(probe.eval_calls) < 256:
                key = probe._key(module)
                probe.eval_calls[key] = probe._site(sys._getframe(1))
                if key not in probe.trained_in_train_mode and key not in probe.not_restored_reported:
                    if module.training:  # the call that switches it: which routine put the model in eval mode
                        probe.eval_stacks[key] = probe._stack(sys._getframe(1))
                        probe.eval_routine_ran[key] = False
                        probe.eval_routine_pending.add(key)
                    elif len(probe.eval_reasserted) < 256:
                        probe.eval_reasserted.add(key)  # already in eval mode: the next forward tells why
                if module.training and len(probe.switched_off) < 64:
                    probe.switched_off[key] = (probe.step, probe._stack(sys._getframe(1)))
                    if key in probe.trained_in_train_mode and key not in probe.not_restored_reported:
                        probe._arm(key, probe.switched_off[key][1])
            if probe.enabled and not probe.train_watched:
                probe._watch_train(True)
            return original(module)

        eval.__wrapped__ = original  # type: ignore[attr-defined]
        eval.__doc__ = original.__doc__
        return transparent(eval)

    def _arm(self, key: int, stack: tuple[tuple[Any, int], ...]) -> None:
        """Watch the first module call after this model.eval(): made inside the routine that called eval()?"""
        if not stack or self.watch.compiled or len(self.eval_ran_module) >= 64:
            return
        self.armed.append((key, stack[-1][0]))
        if self.arm_handle is None:
            self.arm_handle = self.torch.nn.modules.module.register_module_forward_pre_hook(self._first_module_call)

    def _first_module_call(self, module: Any, args: Any) -> None:
        # torch copies the global hooks before calling them: removing this one from inside it is safe
        if self.arm_handle is not None:
            self.arm_handle.remove()
            self.arm_handle = None
        frame = sys._getframe(1)
        for key, routine in self.armed:
            self.eval_ran_module[key] = _on_stack(routine, frame)
        self.armed = []

    def _wrap_train(self, original: Any) -> Any:
        probe = self
        own_code = original.__code__

        def train(module: Any, mode: bool = True) -> Any:
            if mode and probe.enabled and len(probe.train_calls) < 256:
                caller = sys._getframe(1)
                if caller.f_code is not own_code:  # not train()'s own recursion into the children
                    probe.train_calls[probe._key(module)] = probe._site(caller)
            return original(module, mode)

        train.__wrapped__ = original  # type: ignore[attr-defined]
        train.__doc__ = original.__doc__
        return transparent(train)

    def _watch_train(self, on: bool) -> None:
        module_class = self.torch.nn.Module
        if on:
            if module_class.train is self.train_original:
                module_class.train = self.train_wrapper
                self.train_watched = True
        else:
            if module_class.train is self.train_wrapper:  # unless someone patched it since
                module_class.train = self.train_original
            self.train_watched = False
            self.train_calls.clear()

    # -- per forward ---------------------------------------------------------------------------

    def _droppers_of(self, module: Any) -> tuple[list[str], list[Any]]:
        found = self.droppers.get(module)
        if found is None:
            pairs = [(f"{n} ({type(m).__name__})" if n else type(m).__name__, m)
                     for n, m in module.named_modules() if isinstance(m, self.is_dropper)]
            found = ([n for n, _ in pairs], [m for _, m in pairs])
            self.droppers[module] = found
        return found

    def _site(self, frame: Any) -> tuple[str, int, str] | None:
        """The caller of `model(...)`: usually the frame just below Module.__call__ (cached per code object)."""
        while frame is not None:
            code = frame.f_code
            if self._is_user(code):
                back = frame.f_back
                if code.co_name == "forward" and back is not None and self._is_user(back.f_code):
                    # the script called `model.forward(x)` itself (no Module.__call__ in between): the model's
                    # own forward is not the call site, the line that called it is
                    frame = back
                    continue
                return code.co_filename, frame.f_lineno, code.co_name
            frame = frame.f_back
        return None

    def _is_user(self, code: Any) -> bool:
        """Whether a code object is the user's, not a library's (cached: asked for every frame of every forward)."""
        user = self.user_code.get(code)
        if user is None:
            user = self.user_code[code] = not is_library_file(code.co_filename)
        return user

    def _stack(self, frame: Any, limit: int = 32) -> tuple[tuple[Any, int], ...]:
        """The user's frames of this call, outermost first: (code object, current line)."""
        out = []
        while frame is not None and len(out) < limit:
            code = frame.f_code
            if self._is_user(code):
                out.append((code, frame.f_lineno))
            frame = frame.f_back
        return tuple(reversed(out))

    def _start(self, module: Any) -> _Forward | None:
        seen = self.models_seen.get(id(module))
        if seen is None or seen() is not module:
            if not owns_parameters(module):
                return None  # a metric (torchmetrics' MeanMetric called on the loss), a loss module: no model
            if len(self.models_seen) < 256:
                self.models_seen[id(module)] = weakref.ref(module)
        started = time.perf_counter()
        if self.last is not None:
            self._settle_last()
        torch = self.torch
        rec = _Forward()
        rec.model = self._key(module)
        rec.name = type(module).__name__
        rec.grad = torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
        rec.droppers = self._droppers_of(module)
        if not module.training:
            rec.mode = False
            rec.module = weakref.ref(module)
        else:
            self.since_eval.discard(rec.model)
        rec.train = sum(1 for m in rec.droppers[1] if m.training)
        if rec.train and self.train_calls:
            rec.train_call = self.train_calls.get(rec.model)
        frame = sys._getframe(4)
        rec.site = self._site(frame)
        if not rec.mode and rec.model in self.eval_reasserted:
            self.eval_reasserted.discard(rec.model)
            if rec.grad:  # model.eval() again right before a training forward: eval mode chosen for training
                self.eval_routine_ran[rec.model] = False
        if not rec.mode and rec.model in self.eval_routine_pending:
            # the first forward after model.eval(): did the routine that called eval() run it (an evaluation)?
            self.eval_routine_pending.discard(rec.model)
            callers = self.eval_stacks.get(rec.model)
            if callers and not rec.grad:
                self.eval_routine_ran[rec.model] = _on_stack(callers[-1][0], sys._getframe(4))
        if not rec.mode:
            self.eval_forwards_waiting = rec.grad
            # An evaluation-like forward (no grad, or from a line that never trained in train mode) since the model
            # last ran in train mode: training forwards in eval mode after it resume after an evaluation.
            if not rec.grad or rec.site is None or rec.site[:2] not in self.train_sites:
                self.since_eval.add(rec.model)
            rec.after_eval = rec.model in self.since_eval
        rec.step = self.step
        if not rec.train and rec.droppers[0] and rec.model not in self.not_restored_reported and (
                rec.model in self.trained_in_train_mode or self.switched_off.get(rec.model, (None,))[0] == self.step):
            rec.stack = self._stack(frame)  # an eval-mode forward of a model that trained in train mode before
        elif (rec.grad and not rec.train and rec.droppers[0] and self.eval_routine_ran.get(rec.model)
              and rec.model not in self.not_restored_reported
              and self.routine_checks.get(rec.model, 0) < self.max_routine_checks):
            # a model that never trained in train mode, forwarded with grad in eval mode after an evaluation
            # routine put it there: its stack says whether that routine is still running (then this is its own
            # forward) or has returned (training in eval mode left over from it)
            self.routine_checks[rec.model] = self.routine_checks.get(rec.model, 0) + 1
            rec.stack = self._stack(frame)
        if rec.grad and self.measure_left > 0 and rec.site is not None and rec.site[:2] in self.measure_sites:
            self._measure(rec)
        self.cost_s += time.perf_counter() - started
        return rec

    def _end(self, module: Any, output: Any, rec: _Forward) -> None:
        started = time.perf_counter()
        if rec.saved is not None:
            try:
                self.torch._C._autograd._pop_saved_tensors_default_hooks()
            except RuntimeError:
                pass
        if rec.grad:
            outputs = _graph_outputs(output, self.torch.Tensor)
            if outputs:
                rec.graph = True
                self.last = (rec, [t.grad_fn for t in outputs])
        self.pending.append(rec)
        self.forwards += 1
        if self.forwards == 1:  # the first forward pays for one-off work (module lists, caches)
            self.cost_s = 0.0
            return
        if len(self.pending) > self.max_pending:  # no optimizer step for a long time: an inference loop
            self._classify(self.pending[: len(self.pending) // 2])
            del self.pending[: len(self.pending) // 2]
        self.cost_s += time.perf_counter() - started

    def _backward(self, tensors: Any) -> None:
        """A backward right after a forward trains it (the usual loop: forward, loss, backward)."""
        self.backwards_since_step += 1
        if self.last is not None:
            self.last[0].trained = True
            self.last = None
        if self.train_watched:
            self._watch_train(False)  # training resumed: a model.train() from now on is the training loop's own
        if self.eval_forwards_waiting:  # forwards made in eval mode since the last backward: where it ran
            self.eval_forwards_waiting = False
            site = self._site(sys._getframe(3))
            for rec in self.pending[-16:]:
                if not rec.mode and rec.backward_site is None and rec.graph:
                    rec.backward_site = site

    def _settle_last(self) -> None:
        """Another forward before any backward: let the graph itself say whether a backward reaches it.

        The pre-hook lives in the graph's node: if nothing but this probe held the graph, it is freed
        with the reference dropped here and the forward stays untrained, as it should.
        """
        rec, nodes = self.last
        self.last = None
        for node in nodes:
            node.register_prehook(_Mark(rec))

    def _measure(self, rec: _Forward) -> None:
        autograd = self.torch._C._autograd
        try:
            if autograd._top_saved_tensors_default_hooks(True) is not None:
                return  # the script's own saved-tensor hooks (save_on_cpu, checkpointing): never override them
        except (AttributeError, RuntimeError):
            return
        saved: dict[int, int] = {}

        def pack(t: Any) -> Any:
            if not (t.is_leaf and t.requires_grad):
                try:
                    storage = t.untyped_storage()
                    saved[storage.data_ptr()] = storage.nbytes()
                except Exception:  # noqa: BLE001 - a tensor subclass without storage
                    pass
            return t

        try:
            autograd._push_saved_tensors_default_hooks(pack, _unpack)
        except RuntimeError:
            return
        rec.saved = saved
        self.measure_left -= 1

    # -- classification --------------------------------------------------------------------------

    def before_step(self, step: int, optimizer: Any) -> None:
        if self.backwards_since_step:
            self.backwards_since_step = 0
            self.stepped_with_backward += 1
        elif self.pending:
            self._blind_step(optimizer)
        if self.last is not None:
            self._settle_last()
        if self.pending:
            # A forward with a graph that no backward has reached yet is judged one step later: with several
            # optimizers stepping in turn (a GAN), its graph may be used by the backward of the next optimizer,
            # after this step (the discriminator's forward on real data, used by the discriminator's backward
            # after the generator's step). Its pre-hook still marks it trained then; a graph nobody holds is freed.
            ready = [r for r in self.pending if r.trained or r.waited or not (r.grad and r.graph)]
            waiting = [r for r in self.pending if not (r.trained or r.waited) and r.grad and r.graph]
            for rec in ready:
                if rec.trained and not rec.zeroed:
                    self._mode_of_step(rec, optimizer)
            for rec in waiting:
                rec.waited = True
            self._classify(ready)
            self.pending = waiting

    def _blind_step(self, optimizer: Any) -> None:
        """An optimizer step with no backward since the previous one, after forwards of this step that no backward
        reached: with gradients left in the parameters, it applies them again. Only on such steps (rare): a stack
        walk for the step's line and a look at the optimizer's first parameters' gradients."""
        window = [r for r in self.pending if r.step == self.step]
        if not window or any(r.trained for r in window) or not self.stepped_with_backward:
            return
        try:
            left = any(p.grad is not None for g in optimizer.param_groups for p in g["params"][:4])
        except Exception:  # noqa: BLE001 - an optimizer of the script's own making
            return
        if not left:
            return  # nothing to apply: the step leaves the weights as they are (plain SGD, gradients set to None)
        found = self.blind
        if found is None:
            first = window[0]
            found = self.blind = {"steps": 0, "first_step": self.step, "site": as_dict(self._site(sys._getframe(1))),
                                  "forward_site": as_dict(first.site), "model": first.name,
                                  "eval_mode": not first.mode, "grad": first.grad}
        found["steps"] += 1
        found["last_step"] = self.step

    def _mode_of_step(self, rec: _Forward, optimizer: Any) -> None:
        """A trained forward at an optimizer step: in train mode, or in eval mode for parameters this step updates."""
        phase = self.eval_steps.get(rec.model)
        if rec.mode:
            self.train_mode_models.add(rec.model)
            if rec.site is not None and len(self.train_sites) < 64:
                self.train_sites.add(rec.site[:2])
            if phase is not None and phase["in_eval"]:
                phase["in_eval"] = False  # the script switched the model back to train mode and trained on
                phase["returned"] = True
                if phase["steps"] >= 2 and phase["phases"] == 1:
                    self._emit("eval-mode-steps", **phase)
            return
        module = rec.module() if rec.module is not None else None
        rec.updated = module is not None and self._updates(module, optimizer)
        if rec.model not in self.train_mode_models or rec.module is None:
            return  # a model that never trained in train mode: trained in eval mode on purpose, or one phase only
        if rec.after_eval and rec.site is not None and rec.site[:2] in self.train_sites:
            return  # the training loop's own forward, left in eval mode by an evaluation: model.train() not restored
        if not rec.updated:
            return  # a frozen model in eval mode inside another model's loss (a GAN's discriminator)
        if phase is None:
            phase = self.eval_steps[rec.model] = {
                "model": rec.name, "site": as_dict(rec.site), "backward_site": as_dict(rec.backward_site),
                "first_step": rec.step, "steps": 0, "returned": False, "phases": 0, "in_eval": False,
            }
        if not phase["in_eval"]:
            phase["in_eval"] = True
            phase["phases"] += 1
        phase["steps"] += 1
        phase["last_step"] = rec.step

    def _updates(self, module: Any, optimizer: Any) -> bool:
        """The optimizer holds the module's first parameter: this step updates that model (cached per pair)."""
        key = (id(module), id(optimizer))
        found = self.updates.get(key)
        if found is None:
            first = next(iter(module.parameters()), None)
            found = first is not None and any(p is first for g in optimizer.param_groups for p in g["params"])
            if len(self.updates) < 64:
                self.updates[key] = found
        return found

    def _classify(self, records: list[_Forward]) -> None:
        for rec in records:
            if rec.trained:
                self.counts["trained"] += 1
                self._trained(rec)
            elif rec.grad and rec.graph:
                self.counts["eval_grad"] += 1
                self._evaluation(rec)
                if rec.site is not None:
                    self.measure_sites.add(rec.site[:2])
            elif not rec.grad:
                self.counts["eval_no_grad"] += 1
                self._evaluation(rec)
            else:
                self.counts["other"] += 1  # autograd on, but nothing in the output requires grad

    def _trained(self, rec: _Forward) -> None:
        names = rec.droppers[0]
        if not names:
            return
        if rec.train:
            self.trained_in_train_mode.add(rec.model)
            return
        if rec.updated is False:
            return  # a model in eval mode inside another model's loss (a GAN's critic): this step does not train it
        switched = self.switched_off.get(rec.model)
        if switched is not None and switched[0] == rec.step and rec.model not in self.trained_in_train_mode:
            self._switched_in_step(rec, switched[1], names)
            return
        if rec.model not in self.last_eval_site:
            if rec.model in self.trained_in_train_mode and switched is not None and self.eval_ran_module.get(rec.model):
                # the evaluation ran only a part of the model (its encoder, for a kNN monitor): unseen by the
                # forward watch, but the routine that called model.eval() ran modules and returned
                routine = switched[1][-1][0] if switched[1] else None
                if rec.stack and routine is not None and not any(code is routine for code, _ in rec.stack) \
                        and rec.model not in self.not_restored_reported:
                    self._not_restored(rec, names, switched[1])
            return  # no evaluation ran before: eval mode chosen for training itself (frozen batch norm), not left over
        if rec.model not in self.trained_in_train_mode:
            self._left_by_routine(rec, names)
            return
        if rec.model not in self.not_restored_reported:
            self._not_restored(rec, names, self.last_eval_stack.get(rec.model))

    def _left_by_routine(self, rec: _Forward, names: list[str]) -> None:
        """A model that never trained in train mode trains in eval mode, after a routine called model.eval(), ran
        its forwards (no grad: an evaluation, a rollout) and returned: training went on in the mode it left. The
        training code that puts the model in eval mode itself (frozen batch norm: `model.eval()` before the loop,
        in the training function or in a freeze helper that runs no forward) is not such a routine. Reported on
        `min_switched_steps` such forwards, at the call in the training code that ran the routine."""
        callers = self.eval_stacks.get(rec.model)
        if not callers or not rec.stack or not self.eval_routine_ran.get(rec.model):
            return
        routine = callers[-1][0]
        if any(code is routine for code, _ in rec.stack):
            return  # the routine is still running: this forward is its own (it trains while evaluating)
        count = self.left_by_routine[rec.model] = self.left_by_routine.get(rec.model, 0) + 1
        if count < self.min_switched_steps or rec.model in self.not_restored_reported:
            return
        self._not_restored(rec, names, callers, never_in_train_mode=True)

    def _not_restored(self, rec: _Forward, names: list[str], eval_stack: Any, **extra: Any) -> None:
        """One `train-not-restored` event per model, at the call in the training code that ran the evaluation."""
        self.not_restored_reported.add(rec.model)
        self._emit(
            "train-not-restored",
            model=rec.name,
            at_step=rec.step,
            site=as_dict(rec.site),
            eval_site=as_dict(self.last_eval_site.get(rec.model)),
            call_site=as_dict(_evaluation_call(eval_stack, rec.stack, self.eval_calls.get(rec.model))),
            eval_call_site=as_dict(self.eval_calls.get(rec.model)),
            **extra,
            modules=names[:8],
            droppers=len(names),
        )

    def _switched_in_step(self, rec: _Forward, eval_stack: tuple[tuple[Any, int], ...], names: list[str]) -> None:
        """A forward trained in eval mode by the step in which the script switched the model from train mode to eval
        mode: on `min_switched_steps` steps, the routine that called model.eval() inside the step is named (a loss
        helper reading predictions, LCFCN #20). A model put in eval mode once, to train with frozen batch norm,
        is switched before training, not inside each step."""
        count = self.switched_steps[rec.model] = self.switched_steps.get(rec.model, 0) + 1
        if count < self.min_switched_steps or rec.model in self.not_restored_reported:
            return
        self.not_restored_reported.add(rec.model)
        call = _evaluation_call(eval_stack, rec.stack)
        if call is None and eval_stack:  # model.eval() in the training function itself: that line
            code, line = eval_stack[-1]
            call = (code.co_filename, line, code.co_name)
        self._emit(
            "train-not-restored",
            model=rec.name,
            at_step=rec.step,
            site=as_dict(rec.site),
            call_site=as_dict(call),
            eval_call_site=as_dict(self.eval_calls.get(rec.model)),
            switched_in_step=count,
            modules=names[:8],
            droppers=len(names),
        )

    def _evaluation(self, rec: _Forward) -> None:
        self.last_eval_site[rec.model] = rec.site
        self.last_eval_stack[rec.model] = rec.stack
        key = (rec.model, rec.site[:2] if rec.site else None, rec.grad, rec.train > 0)
        group = self.groups.get(key)
        if group is None:
            names = [n for n, m in zip(*rec.droppers, strict=True) if m.training] if rec.train else []
            group = self.groups[key] = {
                "model": rec.name,
                "site": as_dict(rec.site),
                "grad": rec.grad,
                "training_modules": names[:8],
                "training_count": rec.train,
                "droppers": len(rec.droppers[0]),
                "count": 0,
                "first_step": rec.step,
            }
            if rec.train_call is not None:
                group["train_call_site"] = as_dict(rec.train_call)
                group["eval_call_site"] = as_dict(self.eval_calls.get(rec.model))
            self._emit("eval", **group)
        group["count"] += 1
        group["last_step"] = rec.step
        if rec.saved is not None and not self.memory_reported:
            self.memory_reported = True
            self._emit("eval-memory", saved_mib=round(sum(rec.saved.values()) / MIB, 4), site=as_dict(rec.site),
                       at_step=rec.step)

    def _emit(self, kind: str, **fields: Any) -> None:
        if self.events < self.max_events:
            self.events += 1
            self.emit(kind, **fields)

    # -- the end ---------------------------------------------------------------------------------

    def finish(self, reason: str) -> None:
        self.last = None
        if self.arm_handle is not None:
            self.arm_handle.remove()
            self.arm_handle = None
        if self.pending:
            if reason != "completed":
                # The script stopped early (an exception, --steps, a signal): a forward whose graph no backward
                # has reached yet may only have lost its backward to the stop. Undecided, never an evaluation.
                undecided = [r for r in self.pending if not (r.trained or r.waited) and r.grad and r.graph]
                self.counts["undecided"] = len(undecided)
                self.pending = [r for r in self.pending if r.trained or r.waited or not (r.grad and r.graph)]
            self._classify(self.pending)
            self.pending = []
        if self.blind is not None:
            self._emit("blind-steps", **self.blind, steps_with_backward=self.stepped_with_backward)
        for phase in self.eval_steps.values():
            if phase["returned"]:
                self._emit("eval-mode-steps", **phase)  # the final counts
        self.emit(
            "validation-summary",
            groups=list(self.groups.values())[:50],
            models=len(self.watch.models),
            forwards=self.forwards,
            us_per_forward=round(self.cost_s / max(self.forwards - 1, 1) * 1e6, 2),
            compiled=self.watch.compiled,
            **self.counts,
        )


class _Mark:
    """A grad_fn pre-hook: a backward reached this forward's output."""

    __slots__ = ("rec",)

    def __init__(self, rec: _Forward) -> None:
        self.rec = rec

    def __call__(self, grad_outputs: Any) -> None:
        self.rec.trained = True


def _evaluation_call(evaluation: Any, training: Any,
                     eval_call: tuple[str, int, str] | None = None) -> tuple[str, int, str] | None:
    """The call in the training code that ran the evaluation: where model.train() belongs after it.

    The deepest frame the evaluation forward's stack shares (by function) with the training forward's that
    then ran in eval mode; its line on the evaluation's path is the `validate()` / `eval_net(...)` call. None
    when the evaluation ran inline in that function (its own forward is the line) or a stack is unknown, and when
    both leave that frame through the same line (a framework's fit() ran the step and the callback that evaluated).
    The paths part at the first shared frame whose lines differ; when the model.eval() (`eval_call`) was made in
    the frame where they part, the evaluation is inline there, whatever helper then ran its forwards: None, and
    that model.eval() is the line.
    """
    if not evaluation or not training:
        return None
    shared = -1
    for i, ((code, line), (other, other_line)) in enumerate(zip(evaluation, training, strict=False)):
        if code is not other:
            break
        shared = i
        if line != other_line:
            # the two paths part here: deeper frames of one function are two calls of it (one `run(loader,
            # training)` for both phases, a timing decorator's wrapper), not a frame they share
            break
    if shared < 0 or shared == len(evaluation) - 1:
        return None
    code, line = evaluation[shared]
    if eval_call is not None and eval_call[0] == code.co_filename and eval_call[2] == code.co_name:
        # `model.eval()` inline in the frame where the paths part, then a helper on the test batches (the training's
        # own loss function, a predict() of the evaluation's): the evaluation is inline, that model.eval() the line
        return None
    if shared < len(training) and training[shared][1] == line:
        # both paths leave the user's code through the same call (a framework's `trainer.fit(...)` runs the
        # training step and the callback that evaluated): no call of the user's own ran the evaluation alone
        return None
    return code.co_filename, line, code.co_name


def _on_stack(code: Any, frame: Any, limit: int = 64) -> bool:
    """Whether `code` runs in `frame` or one of its callers."""
    for _ in range(limit):
        if frame is None:
            return False
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


def _unpack(t: Any) -> Any:
    return t


def _graph_outputs(output: Any, tensor_type: type, limit: int = 4, depth: int = 3, budget: int = 32) -> list[Any]:
    """Output tensors that carry a graph: the output itself, or inside what the model returned — tuples, lists,
    dicts (a ModelOutput is one) and plain objects with attributes (a dataclass), nested up to `depth` levels
    (`((logits, aux), hidden)`, `{"out": {"logits": ...}}`). A model whose outputs are all out of reach would
    have none of its forwards classified. At most `budget` items are looked at; a plain tensor output costs one
    isinstance check, as before."""
    if isinstance(output, tensor_type):
        return [output] if output.grad_fn is not None else []
    found: list[Any] = []
    level = [output]
    for _ in range(depth):
        nxt: list[Any] = []
        for item in level:
            if isinstance(item, (tuple, list)):
                children = list(item[:limit])
            elif isinstance(item, dict):
                children = list(item.values())[:limit]
            elif hasattr(item, "__dict__") and not isinstance(item, type) and type(item).__module__ != "builtins":
                try:
                    children = [v for v in vars(item).values() if isinstance(v, (tensor_type, tuple, list, dict))][:limit]
                except TypeError:
                    continue
            else:
                continue
            for child in children:
                budget -= 1
                if budget < 0:
                    return found
                if isinstance(child, tensor_type):
                    if child.grad_fn is not None:
                        found.append(child)
                        if len(found) >= limit:
                            return found
                else:
                    nxt.append(child)
        if not nxt:
            break
        level = nxt
    return found
