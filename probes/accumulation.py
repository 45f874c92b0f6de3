"""The accumulation probe: backward passes per optimizer step, whether the loss was divided, what is dropped.

Measures
--------
- micro-steps: backward calls (`torch.autograd.backward`, shared wrapper in
  probes/patches.py) between two optimizer steps (a global step post-hook;
  a step a GradScaler skipped ends the window too), as a histogram, with
  the steps whose count differs from the step before (a leftover window
  merged into the next step shows up as one);
- the scale of the loss reaching backward: the autograd graph is walked
  from the tensor being differentiated through multiplications and
  divisions by constants (`loss / accum_steps`, `loss * 0.25`) — a
  GradScaler's own multiplication is recognised by its scale tensor and
  skipped — on the first `factor_samples` backward calls and every
  `factor_every`-th after;
- the gradient norm after the first micro-step and after the whole
  accumulation (`torch._foreach_norm` over the primary optimizer's
  gradients) on `norm_samples` accumulating steps: how the accumulated
  gradient grows with the micro-steps;
- `optimizer.zero_grad()` / `model.zero_grad()` (wrapped) called while
  backward passes since the last optimizer step are pending: those
  gradients are thrown away; and backward passes still pending when the
  script finishes;
- gradients never cleared: after each optimizer step of the primary
  optimizer a few of its parameters' `.grad` tensors are noted (the tensor
  and its version counter); when the next backward starts with those very
  tensors unchanged and non-zero (no `zero_grad()`, no `grad = None`, no
  in-place zeroing) and the next step applies them with no `zero_grad()`
  in between, that step summed the previous steps' gradients into its own;
- top-level forwards per window (probes/forwards.py): accumulation runs one
  forward per micro-step, while two losses of one forward backpropagated
  one after the other (`loss_a.backward(); loss_b.backward()`) do not;
- how often a different live optimizer steps than the one before (several
  optimizers stepping in turn: a GAN's alternating losses are not
  accumulation, and the analysis says so instead of judging);
- where backwards come from: the user's call path (functions and lines) of
  every backward in the first `path_dense_windows` windows, of the first
  backward of every `path_every`-th window after, and of each backward that
  grows a window past its usual count; a zero_grad() forgets the paths
  before it. At the end, a path no window of the usual size ever took, in
  windows past that size whose gradients the step applied, is reported
  (`backward-elsewhere`: an evaluation routine backpropagating through the
  training step's own helper, judged in doctor/analysis/validation.py).

Costs: < 1 µs per backward and per step; ~3 µs per loss-scale sample; a
gradient-norm pass on `norm_samples` steps only; a stack walk (~5 µs) per
backward of the first 16 windows, then one per 64 windows, plus one per
backward past a window's usual count (at most 48 such windows kept).

Symptoms (thresholds in rules/data/thresholds.toml, [accumulation];
classified in doctor/analysis/accumulation.py)
--------------------------------------------------------------------
- accumulation-not-normalized: the usual step accumulates k ≥ 2
  micro-steps and the loss reaching backward is not divided by about k:
  the accumulated gradient is `gradient_scale` = k × factor ≥
  `max_gradient_scale` times the mean gradient of the effective batch;
- missing-zero-grad: steps whose first backward added into the gradient
  the previous step had already applied (counted in the summary as
  `stale_steps` of `stale_checked`; judged in the analysis);
- missing-zero-grad, inside a closure: an optimizer that re-evaluates its
  closure within one step (LBFGS) moved the parameters between two of its
  backwards and nothing cleared the first one's gradients, so the second
  evaluation's gradient is summed with one taken at other weights
  (`closure_stale_steps` of `closure_steps`; skorch #636). Checked only at
  backwards that run inside `optimizer.step()`: nothing for other loops;
- partial-accumulation-dropped: micro-steps thrown away by zero_grad,
  left pending at the end of the script, or a trailing partial window
  merged into the next step (the step after it accumulates k + r).
"""

from __future__ import annotations

import math
import sys
import weakref
from typing import Any

from torchdoctor.probes.base import Probe
from torchdoctor.probes.forwards import forward_watch
from torchdoctor.probes.patches import backward_watch
from torchdoctor.probes.scalers import scaler_watch
from torchdoctor.probes.sites import call_site, here
from torchdoctor.probes.transparent import transparent
from torchdoctor.probes.userframes import is_library_file


class AccumulationProbe(Probe):
    name = "accumulation"

    def install(self) -> None:
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self.torch = torch
        opt = self.options
        self.factor_samples = int(opt.get("factor_samples", 16))
        self.factor_every = int(opt.get("factor_every", 64))
        self.norm_samples = int(opt.get("norm_samples", 3))
        self.max_sequence = int(opt.get("max_sequence", 256))
        self.micro = 0
        # Backward passes since the last optimizer step, zero_grad or not, and the zero_grad calls among them
        # that threw away pending gradients of the optimizer (or a model) that then steps: zeroing between the
        # micro-steps of one optimizer step, which `micro` (reset by zero_grad) cannot see.
        self.window = 0
        self.window_zeroed: list[tuple[Any, dict[str, Any] | None]] = []  # (the zeroing owner, its site)
        self.window_hist: dict[int, int] = {}
        self.window_retained = False  # a backward of the window kept its graph for another one
        self.window_version: int | None = None  # a parameter's version at the window's first backward
        self.window_moved = False  # the parameters changed in place within the window (SAM's two steps)
        self.zeroed_hist: dict[int, int] = {}  # backwards per step -> steps zeroed before every micro-step but one
        self.partly_zeroed_hist: dict[int, int] = {}  # backwards per step -> steps zeroed inside, fewer times
        self.zero_site: dict[str, Any] | None = None
        # Gradients never cleared between optimizer steps: (parameter, its grad tensor, the grad's version) noted
        # after each primary step; a candidate when the next backward finds them untouched, confirmed at the
        # next step if no zero_grad() covering the optimizer ran in between.
        self.stale_watch: list[tuple[weakref.ref, weakref.ref, int]] = []
        self.stale_candidate: dict[str, Any] | None = None  # the site of the backward that added into old grads
        # the latest backward that found the watched gradients untouched: it adds into them if their version moves
        # before the next backward (with several optimizers, the next backward may not reach them: a GAN's D loss)
        self.stale_pending: dict[str, Any] | None = None
        self.zeroed_since_step: list[Any] = []  # zero_grad owners since the primary optimizer's last step
        self.zeroed_count = 0  # zero_grad calls since that step (the list keeps the first 8)
        self.stale_pending_zeroed = 0  # zeroed_count when the pending backward ran
        self.stale_candidate_zeroed = 0  # ... and for the candidate: only later zero_grad calls clear what it added
        self.stale_added_params: list[weakref.ref] = []  # the watched parameters that backward added into
        self.stale_params = int(opt.get("stale_params", 4))
        self.stale_steps = 0
        self.stale_checked = 0
        self.stale_sampled = False  # the last step noted gradients for the next one to check
        self.stale_site: dict[str, Any] | None = None
        self.stale_limit = int(opt.get("stale_steps_limit", 8))  # enough evidence: stop looking
        self.stale_dense = int(opt.get("stale_dense_steps", 32))  # every step at first, then every stale_every-th
        self.stale_every = int(opt.get("stale_every", 8))
        self.stepping = 0  # inside optimizer.step(): a closure's zero_grad() there is the optimizer's own business
        # Gradients left across another optimizer's step (a GAN's generator loss reaching the discriminator, an
        # actor loss reaching the critic; or a second optimizer's own gradients, never cleared): after any step,
        # a few gradients of each optimizer seen (`cross_optimizers`, at most 4) whose parameters the stepping one
        # does not share, or of the stepping one itself when it is not the primary (whose check is the one above).
        # A backward that adds into them untouched, with no zero_grad() covering that optimizer before its own
        # step, makes that step apply a gradient the earlier backward left for another update. Sampled like the
        # primary check (`stale_dense_steps`, `stale_every`); stops at `stale_steps_limit` findings.
        self.cross_optimizers: list[weakref.ref] = []
        self.cross_watch: dict[int, dict[str, Any]] = {}  # id(optimizer) -> its watched gradients and findings
        self.cross_steps = 0
        self.cross_checked = 0
        self.cross_site: dict[str, Any] | None = None
        self.any_steps = 0
        # Closure re-evaluations within one step (LBFGS): the primary parameter's version at the step's previous
        # backward (None: no backward inside this step yet), whether a zero_grad() ran since, and the counts.
        self.closure_version: int | None = None
        self.closure_zeroed = False
        self.closure_counted = False  # this step was counted in closure_steps
        self.closure_stale = False  # this step was counted in closure_stale_steps
        self.closure_steps = 0  # steps whose closure ran again after the parameters moved
        self.closure_stale_steps = 0  # ... and found the earlier evaluation's gradients still there
        self.closure_site: dict[str, Any] | None = None
        self.forwards = 0  # top-level forwards in the current window (probes/forwards.py)
        # Whether every top-level forward of the window had the same first input tensor: several losses of one
        # batch (a slimmable network's sandwich rule, sub-networks, heads), not micro-batches.
        self.window_input: tuple[int, int, int] | None = None
        self.window_inputs = 0  # forwards of the window whose input matched window_input
        self.same_input_hist: dict[int, int] = {}
        self.backwards = 0
        # Where backwards come from: the user's call path of each backward (code objects, outermost first),
        # taken for every backward of the first `path_dense_windows` windows, for the first backward of every
        # `path_every`-th window after, and for each backward of a window that has grown past the usual count
        # (an evaluation routine backpropagating between two training steps). Per window: the paths seen and the
        # first stack (with lines) of each, kept only until a zero_grad() clears what they added.
        self.path_dense = int(opt.get("path_dense_windows", 16))
        self.path_every = int(opt.get("path_every", 64))
        # The phase a backward runs in, when the script names it (`for phase in ["train", "val"]`, `mode="test"`):
        # read from the user's frames on the backwards of the first path_dense_windows steps, then on every
        # phase_every-th backward. Per window: the first backward in an evaluation phase (the gradients of a
        # validation batch the step applies) and whether one ran in a training phase; per optimizer, the tallies.
        self.phase_every = int(opt.get("phase_every", 8))
        self.window_phase: dict[str, Any] | None = None
        self.window_train_phase = False
        self.phase_eval: dict[int, dict[str, Any]] = {}  # id(optimizer) -> windows, first backward, the phase
        self.phase_train: dict[int, int] = {}  # id(optimizer) -> windows with a backward in a training phase
        self.windows_seen = 0
        self.user_code: dict[Any, bool] = {}  # code object -> is it the user's (cached: read per frame)
        self.window_paths: dict[tuple, tuple] = {}  # path -> its first stack in this window, (code, line) pairs
        self.usual_k: int | None = None
        self.path_counts: dict[int, dict[tuple, int]] = {}  # window size -> path -> windows holding it
        self.window_records: list[tuple[int, int, list[tuple]]] = []  # (size, step, stacks): the first windows,
        # and later ones past the usual size
        self.hist: dict[int, int] = {}
        self.forward_hist: dict[int, int] = {}  # micro-steps per window -> forwards summed over those windows
        self.sequence: list[tuple[int, int]] = []  # (step, micro-steps) where the count changed
        self.last_k: int | None = None
        self.factors: list[float] = []
        self.factor_site: dict[str, Any] | None = None
        self.norms: list[dict[str, float]] = []
        self.first_norm: float | None = None
        self.params: list[weakref.ref] = []
        self.dropped: list[dict[str, Any]] = []
        self.dropped_total = 0
        self.steps = 0  # optimizer steps of any optimizer that ended a window of micro-steps
        self.last_optimizer: weakref.ref | None = None
        # The class of the first optimizer that stepped: whether the loss's scale reaches the update depends on it
        # (SGD's step is proportional to the gradient, Adam's normalises it away)
        self.optimizer_class: str | None = None
        self.alternations = 0
        self.scalers = scaler_watch(torch)
        self.scalers.subscribe(self, self._scaler_stepped)
        self.skipped_by_scaler = 0
        self.next_progress = 1
        self.backwards_watch = backward_watch(torch)
        self.backwards_watch.subscribe(self, self._backward)
        self.forward_watch = forward_watch(torch, self)
        self.forward_watch.subscribe(self, self._forward, _nothing)
        register_optimizer_step_pre_hook(self._any_step_starts)
        register_optimizer_step_post_hook(self._any_step)
        for owner in (torch.optim.Optimizer, torch.nn.Module):
            owner.zero_grad = self._wrap_zero_grad(owner.zero_grad)

    # -- wrappers -----------------------------------------------------------------------------------

    def _any_step_starts(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.cross_watch and not self.stepping:
            self._cross_at_step(optimizer)
        self.stepping += 1
        if self.window_version is not None and not self.stepping - 1:
            moved = self._param_version() != self.window_version
            self.window_moved = self.window_moved or moved

    def _any_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """Every optimizer's step ends a window of micro-steps; optimizers stepping in turn are noted."""
        self.stepping = max(self.stepping - 1, 0)
        if self.closure_version is not None and not self.stepping:
            self.closure_version, self.closure_counted, self.closure_stale = None, False, False
        last = self.last_optimizer() if self.last_optimizer is not None else None
        if last is not None and last is not optimizer:
            self.alternations += 1  # another live optimizer stepped since: a GAN-like loop, or a second phase
        if last is not optimizer:
            self.last_optimizer = weakref.ref(optimizer)
        if self.optimizer_class is None:
            self.optimizer_class = type(optimizer).__name__
        if not self.stepping:
            self._cross_note(optimizer)
        k, forwards = self.micro, self.forwards
        self.micro = self.forwards = 0
        self._end_window(optimizer)
        if k == 0:
            return
        self.steps += 1
        self.hist[k] = self.hist.get(k, 0) + 1
        self.forward_hist[k] = self.forward_hist.get(k, 0) + forwards
        if k != self.last_k and len(self.sequence) < self.max_sequence:
            self.sequence.append((self.steps, k))
        self.last_k = k
        if self.steps >= self.next_progress:  # 1, 2, 4, …: a crash keeps a recent histogram
            self.next_progress *= 2
            self._summary("accumulation-progress", None)

    def _end_window(self, optimizer: Any) -> None:
        """An optimizer step: how many backwards it follows, and whether its gradients were zeroed in between."""
        n = self.window
        if n == 0:
            return
        zeroed = [site for owner, site in self.window_zeroed if owner is optimizer or _shares_parameters(owner, optimizer)]
        retained = self.window_retained
        moved, self.window_moved, self.window_version = self.window_moved, False, None
        same_input = self.window_input is not None and self.window_inputs >= n
        self.window_input, self.window_inputs = None, 0
        if n >= 2 and same_input:
            self.same_input_hist[n] = self.same_input_hist.get(n, 0) + 1
        self.window = 0
        self.window_retained = False
        self.window_zeroed = []
        self.window_hist[n] = self.window_hist.get(n, 0) + 1
        self._close_paths(n)
        self._close_phase(optimizer)
        # retained: one graph's losses read one by one; moved: the parameters changed between the micro-steps
        # (SAM's ascent step, a lookahead): each backward was taken at other weights and its gradient used there
        if n >= 2 and zeroed and not retained and not moved:
            # every micro-step but the first, or fewer times (Accelerate runs the wrapped zero_grad only on the
            # micro-step that syncs, so one at the top of accumulate() clears the window once, near its end)
            hist = self.zeroed_hist if len(zeroed) >= n - 1 else self.partly_zeroed_hist
            hist[n] = hist.get(n, 0) + 1
            if self.zero_site is None:
                self.zero_site = zeroed[0]

    def _wrap_zero_grad(self, original: Any) -> Any:
        probe = self

        def zero_grad(owner: Any, *args: Any, **kwargs: Any) -> None:
            probe.zeroed_count += 1
            if len(probe.zeroed_since_step) < 8:
                probe.zeroed_since_step.append(owner)
            if probe.cross_watch and not probe.stepping:
                probe._cross_zeroed(owner)
            if probe.stepping:
                probe.closure_zeroed = True
            if probe.micro and probe.enabled:
                site = probe._dropped(probe.micro, "zero_grad")
                # Which gradients it zeroed: an optimizer's (counted only if that optimizer steps next) or a
                # model's (counted if it holds parameters of the optimizer that steps next). Not inside a step:
                # LBFGS re-evaluates its closure (zero_grad, backward) several times within one step.
                if not probe.stepping:
                    probe.window_zeroed.append((owner, site))
                    probe.window_paths.clear()  # their gradients are gone: the step will not apply them
                    probe.window_phase, probe.window_train_phase = None, False
                probe.micro = probe.forwards = 0
            return original(owner, *args, **kwargs)

        zero_grad.__wrapped__ = original  # type: ignore[attr-defined]
        zero_grad.__doc__ = original.__doc__
        return transparent(zero_grad)

    def _dropped(self, count: int, how: str) -> dict[str, Any] | None:
        self.dropped_total += count
        if len(self.dropped) < 20:
            self.dropped.append({"micro_steps": count, "how": how, "at_step": self.step,
                                 "site": call_site("zero_grad")})
            self.emit("accumulation-dropped", **self.dropped[-1])
            return self.dropped[-1]["site"]
        return self.zero_site

    # -- forward and backward ---------------------------------------------------------------------------

    def _forward(self, module: Any) -> None:
        self.forwards += 1
        key = self.forward_watch.input_key
        if self.window_inputs == 0:
            self.window_input, self.window_inputs = key, 1
        elif key is not None and key == self.window_input:
            self.window_inputs += 1
        else:
            self.window_input = None

    def _backward(self, tensors: Any) -> None:
        if self.stale_watch and not self.stepping:
            self._stale_at_backward()
        if self.cross_watch and not self.stepping:
            self._cross_at_backward()
        if self.stepping and self.params:
            self._closure_backward()
        if self._want_path():
            self._note_path()
        if not self.stepping and (self.windows_seen < self.path_dense or self.backwards % self.phase_every == 0):
            self._note_phase()
        self.micro += 1
        if not self.window and self.params:
            self.window_version = self._param_version()
        self.window += 1
        if self.backwards_watch.retain_graph:
            self.window_retained = True
        self.backwards += 1
        if self.micro == 2 and self.first_norm is None and len(self.norms) < self.norm_samples and self.params:
            self.first_norm = self._grad_norm()
        n = self.backwards
        if n <= self.factor_samples or n % self.factor_every == 0:
            root = tensors if isinstance(tensors, self.torch.Tensor) else None
            if root is not None and root.numel() == 1:
                factor = self._loss_factor(root)
                if factor is not None:
                    self.factors.append(factor)
                    if self.factor_site is None:
                        self.factor_site = here()

    def _want_path(self) -> bool:
        """Whether this backward's call path is taken (see `window_paths`): never inside optimizer.step()."""
        if self.stepping:
            return False
        if self.windows_seen < self.path_dense:
            return True
        if self.window == 0:
            return self.windows_seen % self.path_every == 0
        # this backward grows the window past the usual count (while records are still kept)
        return self.usual_k is not None and self.window >= self.usual_k and len(self.window_records) < 48

    def _note_path(self) -> None:
        frame = sys._getframe(1)
        stack = []
        while frame is not None and len(stack) < 24:
            code = frame.f_code
            user = self.user_code.get(code)
            if user is None:
                user = self.user_code[code] = not is_library_file(code.co_filename)
            if user:
                stack.append((code, frame.f_lineno))
            frame = frame.f_back
        stack.reverse()
        path = tuple(stack)  # the functions and the lines: a validation loop calling the training step's helper
        if path and path not in self.window_paths and len(self.window_paths) < 8:
            self.window_paths[path] = tuple(stack)

    def _note_phase(self) -> None:
        """The phase this backward runs in, from the innermost user frame holding a phase-like local (`phase`,
        `mode`, `split`, `stage`) whose value names training or evaluation; with the backward's own line."""
        frame = sys._getframe(2)
        backward_site = None
        for _ in range(24):
            if frame is None:
                return
            code = frame.f_code
            user = self.user_code.get(code)
            if user is None:
                user = self.user_code[code] = not is_library_file(code.co_filename)
            if user:
                if backward_site is None:
                    backward_site = _frame_site(code, frame.f_lineno)
                names = frame.f_locals
                for name in PHASE_NAMES:
                    value = names.get(name)
                    if isinstance(value, str):
                        word = value.strip().lower()
                        if word in EVAL_PHASES:
                            if self.window_phase is None:
                                self.window_phase = {"site": backward_site, "name": name, "value": value[:20],
                                                     "phase_site": _frame_site(code, frame.f_lineno)}
                            return
                        if word in TRAIN_PHASES:
                            self.window_train_phase = True
                            return
            frame = frame.f_back

    def _close_phase(self, optimizer: Any) -> None:
        key = id(optimizer)
        if self.window_phase is not None and (key in self.phase_eval or len(self.phase_eval) < 4):
            entry = self.phase_eval.setdefault(key, {"windows": 0, "first_step": self.steps, **self.window_phase})
            entry["windows"] += 1
        if self.window_train_phase and (key in self.phase_train or len(self.phase_train) < 4):
            self.phase_train[key] = self.phase_train.get(key, 0) + 1
        self.window_phase, self.window_train_phase = None, False

    def _close_paths(self, n: int) -> None:
        """A window of `n` backwards ended with an optimizer step: tally the paths whose gradients it applied (a
        zero_grad() in the window forgets those before it) by window size; keep the first windows and those past
        the usual size for the end."""
        self.windows_seen += 1
        paths, self.window_paths = self.window_paths, {}
        if not paths:
            return
        counts = self.path_counts.setdefault(n, {})
        for path in paths:
            if path in counts or len(counts) < 32:
                counts[path] = counts.get(path, 0) + 1
        dense = self.windows_seen <= self.path_dense
        if (dense or (self.usual_k is not None and n > self.usual_k)) and len(self.window_records) < 48:
            self.window_records.append((n, self.step, list(paths.values())))
        if self.window_hist:
            self.usual_k = max(self.window_hist.items(), key=lambda kv: (kv[1], -kv[0]))[0]

    def _closure_backward(self) -> None:
        """A backward inside optimizer.step(closure): if the optimizer moved the parameters since the step's previous
        backward (a new evaluation of the closure) and nothing zeroed the gradients in between, they still hold that
        evaluation's gradient, taken at the old weights, and this backward adds into it."""
        param = self.params[0]()
        if param is None:
            return
        version, previous = param._version, self.closure_version
        self.closure_version = version
        zeroed, self.closure_zeroed = self.closure_zeroed, False
        if previous is None or version == previous:
            return  # the step's first evaluation, or two backwards of one evaluation (the same weights)
        if not self.closure_counted:
            self.closure_counted = True
            self.closure_steps += 1
        if zeroed or self.closure_stale:
            return
        last = self.params[-1]()
        if not any(g is not None and bool(g.detach().reshape(-1)[:256].any())
                   for g in (param.grad, getattr(last, "grad", None))):
            return  # grad = None, or zeroed in place without zero_grad() (or a saturated layer's zero gradient)
        self.closure_stale = True
        self.closure_stale_steps += 1
        if self.closure_site is None:
            self.closure_site = call_site("backward")

    def _param_version(self) -> int | None:
        """The version counter of the primary optimizer's first parameter: every in-place update bumps it."""
        param = self.params[0]() if self.params else None
        return param._version if param is not None else None

    def _stale_at_backward(self) -> None:
        """A backward since the primary step, while the gradients that step applied are watched: did the backward
        before this one add into them? Else, which of them are still there, untouched, for this one to add into?
        Each watched gradient is judged on its own: zeroing a submodule, or setting `grad = None` on a list that
        misses some of the optimizer's parameters, clears only those, and the others still sum across steps."""
        if self._stale_added():
            return
        kept = []
        for entry in self.stale_watch:
            param, grad = entry[0](), entry[1]()
            current = getattr(param, "grad", None) if param is not None else None
            # The same tensor, untouched since the step (zero_() bumps the version; grad = None replaces it),
            # and not zero (`p.grad.data.zero_()` bypasses the version counter): this backward may add into it.
            if current is None or current is not grad or current._version != entry[2]:
                continue
            if bool(current.detach().reshape(-1)[:256].any()):
                kept.append(entry)
        self.stale_watch = kept
        if kept:
            self.stale_pending = call_site("backward") or {}
            self.stale_pending_zeroed = self.zeroed_count
        else:
            self.stale_pending = None

    def _stale_added(self) -> bool:
        """Whether the backward noted as pending added into the watched gradients (the same tensors, a version
        moved): that backward is the one a zero_grad() should have preceded."""
        if self.stale_pending is None:
            return False
        added = []
        for ref, grad_ref, version in self.stale_watch:
            param, grad = ref(), grad_ref()
            current = getattr(param, "grad", None) if param is not None else None
            if current is not None and current is grad and current._version != version:
                added.append(ref)
        if not added:
            return False
        self.stale_candidate, self.stale_pending, self.stale_watch = self.stale_pending, None, []
        self.stale_added_params, self.stale_candidate_zeroed = added, self.stale_pending_zeroed
        return True

    def _note_gradients(self, optimizer: Any) -> None:
        """After a primary step: the grad tensors (and versions) of a few of its parameters, for the next backward.
        Up to `stale_params` parameters spread over all groups (the first non-zero gradient at or after each of a
        few evenly spaced positions): the first and last parameters alone may get no gradient (a frozen embedding,
        an unused head) or be the only ones a partial zero_grad() clears."""
        self.stale_candidate = None
        self.stale_pending = None
        self.zeroed_since_step = []
        self.zeroed_count = 0
        if self.stale_steps >= self.stale_limit or (self.step > self.stale_dense and self.step % self.stale_every):
            return  # a missing zero_grad() repeats every step: a sample of the steps finds it
        params = [p for g in optimizer.param_groups for p in g["params"]]
        n, want = len(params), self.stale_params
        picked: list[tuple[weakref.ref, weakref.ref, int]] = []
        taken: set[int] = set()
        for slot in range(want):
            start = (slot * (n - 1)) // max(want - 1, 1) if n else 0
            for index in range(start, min(start + 8, n)):
                grad = params[index].grad
                if index in taken or grad is None or not bool(grad.detach().reshape(-1)[:256].any()):
                    continue
                taken.add(index)
                # weak: a gradient the script drops (zero_grad's set_to_none) must be freed, not kept by us
                picked.append((weakref.ref(params[index]), weakref.ref(grad), grad._version))
                break
        self.stale_watch = picked
        self.stale_sampled = bool(picked)

    def _stale_at_step(self, optimizer: Any) -> None:
        """The primary optimizer is about to step: did a backward since the last step add into that step's gradients?"""
        self._stale_added()  # the last backward before this step
        candidate, self.stale_candidate = self.stale_candidate, None
        self.stale_watch, self.stale_pending = [], None
        if not self.stale_sampled or self.stale_steps >= self.stale_limit:
            return
        self.stale_sampled = False
        self.stale_checked += 1
        if candidate is None:
            return
        # zeroed after that backward, where it added (a GAN's other loss came first): not stale; a zero_grad() before
        # it, or of other parameters (a submodule's), does not clear what it added into
        later = self.zeroed_since_step[self.stale_candidate_zeroed:]
        if self.zeroed_count > len(self.zeroed_since_step) or any(
                _holds_any(o, self.stale_added_params) for o in later):
            return
        self.stale_steps += 1
        if self.stale_site is None:
            self.stale_site = candidate or None

    def _cross_note(self, stepped: Any) -> None:
        """After any optimizer's step: watch a few gradients of each optimizer seen that this step did not apply
        (other optimizers' parameters, disjoint from the stepping one's), and the stepping one's own when it is
        not the primary optimizer (the primary's are watched by _note_gradients)."""
        self.any_steps += 1
        if all(ref() is not stepped for ref in self.cross_optimizers) and len(self.cross_optimizers) < 4:
            self.cross_optimizers.append(weakref.ref(stepped))
        if len(self.cross_optimizers) < 2 or self.cross_steps >= self.stale_limit or (
                self.any_steps > self.stale_dense and self.any_steps % self.stale_every):
            return
        primary = self.params[0]() if self.params else None
        for ref in self.cross_optimizers:
            other = ref()
            if other is None:
                continue
            if other is stepped:
                if primary is not None and _holds(other, primary):
                    continue  # the primary's own gradients: _note_gradients watches them
            elif _covers(other, stepped):
                continue  # shared parameters: this step applied (some of) them
            picked = _picked_grads(other)
            if picked:
                self.cross_watch[id(other)] = {"ref": ref, "picked": picked, "pending": None, "candidate": None}

    def _cross_at_backward(self) -> None:
        """A backward: did the one before add into a watched optimizer's left gradients? Are they still there,
        untouched and non-zero, for this one to add into?"""
        site = None
        for key, entry in list(self.cross_watch.items()):
            if entry["candidate"] is not None:
                continue
            state = _grads_state(entry["picked"])
            if entry["pending"] is not None and state == "added":
                entry["candidate"] = entry["pending"]
            elif state == "kept":
                if site is None:
                    site = call_site("backward") or {}
                entry["pending"] = site
            else:
                del self.cross_watch[key]

    def _cross_zeroed(self, owner: Any) -> None:
        """A zero_grad(): the watched gradients it covers are cleared before their optimizer steps."""
        for key, entry in list(self.cross_watch.items()):
            optimizer = entry["ref"]()
            if optimizer is None or owner is optimizer or _covers(owner, optimizer):
                del self.cross_watch[key]

    def _cross_at_step(self, optimizer: Any) -> None:
        """A watched optimizer is about to step: a backward since the watch added into its left gradients?"""
        entry = self.cross_watch.pop(id(optimizer), None)
        if entry is None or entry["ref"]() is not optimizer:
            return
        candidate = entry["candidate"]
        if candidate is None and entry["pending"] is not None and _grads_state(entry["picked"]) == "added":
            candidate = entry["pending"]  # the last backward before this step
        if candidate is None and entry["pending"] is None:
            return  # no backward since the watch began (two optimizers stepping one after the other): nothing checked
        self.cross_checked += 1
        if candidate is not None:
            self.cross_steps += 1
            if self.cross_site is None:
                self.cross_site = candidate or None

    def _loss_factor(self, root: Any) -> float | None:
        """The product of the constants the loss was multiplied by on its way to backward."""
        torch = self.torch
        node = root.grad_fn
        factor = 1.0
        scales: set[int] | None = None
        for _ in range(8):
            if node is None:
                break
            name = node.name()
            if name not in ("MulBackward0", "DivBackward0"):
                break
            other = getattr(node, "_saved_other", None)
            index = 0
            if other is None and name == "MulBackward0":
                other, index = getattr(node, "_saved_self", None), 1
            if not isinstance(other, torch.Tensor) or other.numel() != 1 or other.requires_grad:
                break
            if name == "MulBackward0":
                if scales is None:
                    scales = self.scalers.scale_pointers()
                if other.data_ptr() in scales:  # the GradScaler's multiplication
                    node = node.next_functions[index][0]
                    continue
            value = float(other)
            if name == "DivBackward0":
                value = 1.0 / value if value else math.inf
            factor *= value
            node = node.next_functions[index][0]
        return factor if math.isfinite(factor) else None

    def _grad_norm(self) -> float | None:
        grads = [g for g in (p.grad for p in (r() for r in self.params) if p is not None) if g is not None]
        if not grads:
            return None
        norms = self.torch._foreach_norm(grads)
        return float(self.torch.linalg.vector_norm(self.torch.stack([n.float() for n in norms])))

    # -- steps --------------------------------------------------------------------------------------

    def _scaler_stepped(self) -> None:
        """A GradScaler skipped optimizer.step() (inf/NaN gradients): its micro-steps were consumed all the same."""
        if self.micro:
            self.skipped_by_scaler += 1
            self.micro = self.forwards = 0
        self.window = 0
        self.window_retained = False
        self.window_zeroed = []
        self.window_version, self.window_moved = None, False
        self.window_input, self.window_inputs = None, 0

    def before_step(self, step: int, optimizer: Any) -> None:
        """The primary optimizer is about to step: the gradient it will apply is complete."""
        if not self.params:
            self.params = [weakref.ref(p) for g in optimizer.param_groups for p in g["params"]]
        if self.step:  # the first step has no earlier gradients to keep
            self._stale_at_step(optimizer)
        k = self.micro
        if self.first_norm is not None and k >= 2:
            total = self._grad_norm()
            if total is not None and self.first_norm > 0:
                self.norms.append({"micro_steps": k, "first_norm": self.first_norm, "accumulated_norm": total})
        self.first_norm = None

    def after_step(self, step: int, optimizer: Any) -> None:
        self._note_gradients(optimizer)
        return None

    def _summary(self, kind: str, reason: str | None) -> None:
        self.emit(
            kind,
            histogram={str(k): v for k, v in sorted(self.hist.items())},
            forwards={str(k): v for k, v in sorted(self.forward_hist.items())},
            sequence=self.sequence,
            backwards=self.backwards,
            pending=self.micro,
            reason=reason,
            factors=[float(f"{f:.6g}") for f in self.factors[:64]],
            factor_site=self.factor_site,
            optimizer_class=self.optimizer_class,
            norms=self.norms,
            dropped_total=self.dropped_total,
            skipped_by_scaler=self.skipped_by_scaler,
            alternations=self.alternations,
            windows={str(k): v for k, v in sorted(self.window_hist.items())},
            zeroed_windows={str(k): v for k, v in sorted(self.zeroed_hist.items())},
            partly_zeroed_windows={str(k): v for k, v in sorted(self.partly_zeroed_hist.items())},
            same_input_windows={str(k): v for k, v in sorted(self.same_input_hist.items())},
            zero_site=self.zero_site,
            stale_steps=self.stale_steps,
            stale_checked=self.stale_checked,
            stale_site=self.stale_site,
            closure_steps=self.closure_steps,
            closure_stale_steps=self.closure_stale_steps,
            closure_site=self.closure_site,
            cross_stale_steps=self.cross_steps,
            cross_checked=self.cross_checked,
            cross_site=self.cross_site,
        )

    def finish(self, reason: str) -> None:
        if self.micro and reason == "completed" and self.hist:
            self._dropped(self.micro, "end")
        self._summary("accumulation-summary", reason)
        self._extra_paths()
        self._phase_steps()

    def _phase_steps(self) -> None:
        """Optimizer steps that applied gradients of a backward run in an evaluation phase, by an optimizer that
        also stepped on backwards of a training phase: the phase loop backpropagates its validation batches."""
        for key, entry in self.phase_eval.items():
            train = self.phase_train.get(key, 0)
            if train:
                self.emit("backward-in-phase", train_windows=train, steps=self.steps, **entry)
                return

    def _extra_paths(self) -> None:
        """Backwards from a call path that no window of the usual size ever took, in windows grown past that size,
        whose gradients the next optimizer step applied (no zero_grad() in between): a routine other than the
        training step (an evaluation) backpropagated into the gradients of the training update. Emitted with a
        usual path to compare with (the analysis names where the two part)."""
        if not self.window_hist or not self.window_records:
            return
        k = max(self.window_hist.items(), key=lambda kv: (kv[1], -kv[0]))[0]
        usual = self.path_counts.get(k, {})
        if not usual:
            return
        odd: dict[tuple, dict[str, Any]] = {}
        extra = [(n, step, stacks) for n, step, stacks in self.window_records if n > k]
        for _, step, stacks in extra:
            for stack in stacks:
                path = tuple(stack)
                if path not in usual:
                    entry = odd.setdefault(path, {"stack": stack, "windows": 0, "first_step": step})
                    entry["windows"] += 1
        if not odd:
            return
        entry = max(odd.values(), key=lambda e: e["windows"])
        common = max(usual.items(), key=lambda kv: kv[1])[0]
        usual_stack = common
        self.emit("backward-elsewhere", usual_micro_steps=k, windows=entry["windows"], extra_windows=len(extra),
                  steps=self.steps, first_step=entry["first_step"], alternations=self.alternations,
                  windows_by_size={str(n): c for n, c in sorted(self.window_hist.items())},
                  stack=[_frame_site(code, line) for code, line in entry["stack"]],
                  usual_stack=[_frame_site(code, line) for code, line in usual_stack])


# Locals that name the phase a loop is in, and the values that mean training or evaluation
PHASE_NAMES = ("phase", "mode", "split", "stage")
EVAL_PHASES = frozenset({"val", "valid", "validation", "validate", "eval", "evaluate", "evaluation", "test",
                         "testing", "dev"})
TRAIN_PHASES = frozenset({"train", "training", "fit"})


def _frame_site(code: Any, line: int | None) -> dict[str, Any]:
    return {"path": code.co_filename, "line": line, "function": code.co_name}


def _covers(owner: Any, optimizer: Any) -> bool:
    """A zero_grad() owner (a model, or another optimizer) zeroed some of the parameters `optimizer` steps."""
    stepped = _stepped_ids(optimizer)
    return stepped is not None and _holds_ids(owner, stepped)


def _holds_any(owner: Any, refs: list[weakref.ref]) -> bool:
    """Whether a zero_grad() owner (an optimizer or a model) holds any of these parameters."""
    return _holds_ids(owner, {id(p) for p in (r() for r in refs) if p is not None})


def _stepped_ids(optimizer: Any) -> set[int] | None:
    """The ids of the parameters an optimizer steps (None for an object without param_groups)."""
    try:
        return {id(p) for g in optimizer.param_groups for p in g["params"]}
    except Exception:  # noqa: BLE001 - not an optimizer, or a half-built one
        return None


def _holds_ids(owner: Any, wanted: set[int], modules_only: bool = False) -> bool:
    """Whether a zero_grad() owner holds any parameter in `wanted`: an optimizer through its param_groups (unless
    `modules_only`), a model through parameters()."""
    try:
        groups = getattr(owner, "param_groups", None)
        if groups is not None:
            return not modules_only and any(id(p) in wanted for g in groups for p in g["params"])
        parameters = getattr(owner, "parameters", None)
        return parameters is not None and any(id(p) in wanted for p in parameters())
    except Exception:  # noqa: BLE001 - a half-built module
        return False


def _holds(optimizer: Any, param: Any) -> bool:
    """Whether `param` is one of the optimizer's parameters."""
    try:
        return any(p is param for g in optimizer.param_groups for p in g["params"])
    except Exception:  # noqa: BLE001
        return False


def _picked_grads(optimizer: Any) -> list[tuple[weakref.ref, weakref.ref, int]]:
    """(parameter, its grad tensor, the grad's version) of the first and last parameter of the optimizer's first
    group with a non-zero gradient: what the next backward may add into."""
    picked = []
    try:
        params = optimizer.param_groups[0]["params"] if optimizer.param_groups else []
    except Exception:  # noqa: BLE001
        return picked
    for param in (params[0], params[-1]) if params else ():
        grad = getattr(param, "grad", None)
        if grad is not None and bool(grad.detach().reshape(-1)[:256].any()):
            picked.append((weakref.ref(param), weakref.ref(grad), grad._version))  # weak: set_to_none frees it
    return picked


def _grads_state(picked: list[tuple[weakref.ref, weakref.ref, int]]) -> str:
    """'kept': the very grad tensors, untouched and non-zero; 'added': the same tensors, their version moved (a
    backward added into them; an in-place zeroing is seen by the zero_grad wrapper first); 'cleared' otherwise."""
    moved = False
    for ref, grad_ref, version in picked:
        param, grad = ref(), grad_ref()
        current = getattr(param, "grad", None) if param is not None else None
        if current is None or current is not grad:
            return "cleared"
        if current._version != version:
            moved = True
        elif not bool(current.detach().reshape(-1)[:256].any()):
            return "cleared"
    return "added" if moved else "kept"


def _shares_parameters(module: Any, optimizer: Any) -> bool:
    """A model's zero_grad() zeroed some of the parameters this optimizer steps."""
    stepped = _stepped_ids(optimizer)
    return stepped is not None and _holds_ids(module, stepped, modules_only=True)


def _nothing(module: Any, output: Any, token: Any) -> None:
    """The forward watch's end callback: the accumulation probe only counts forwards as they start."""
