"""Static rules: `torchdoctor check` reads training scripts without running them.

How it works
------------
engine.py parses each file once and walks it once. The walk records every
node's parent and collects the node types that the semantic index
(index.py) and the enabled rules asked for. The index is built from those
nodes; then each rule is called on each node of the types it subscribed to,
in source order. Findings become `Finding`s and, in doctor/check.py,
`Symptom`s with static evidence that go through the router to the
specialists like every other door's symptoms.

Adding a rule (ruff-style: a small unit with its docs and two fixtures)
---------------------------------------------------------------------
1. The check, in the family module `rules/static/rules/<family>.py`
   (memory, module_design, distributed, mixed_precision, profiling,
   debugging, checkpointing, autograd; create the file if it is new — families
   are discovered, nothing to register)::

       import ast

       from torchdoctor.rules.static.api import Context, rule


       @rule("TD103", ast.Call)
       def empty_cache_in_training_loop(node: ast.Call, ctx: Context) -> None:
           if ctx.index.callee(node) != "torch.cuda.empty_cache":
               return
           loop = ctx.index.step_loop_of(node)
           if loop is not None:
               ctx.report(node, variable="torch.cuda.empty_cache()")

   `@rule(code, *node_types)` subscribes the function to node types
   (`ast.Module` for once per file). A check on `ast.Call` that returns at
   once for any call but a few names declares them, `callees=(...)`
   (qualified, as `index.callee` gives them) or `methods=("forward",)`, and
   is called on those calls alone; a check on `ast.BinOp` declares its
   operators the same way, `ops=(ast.Div,)`. A check that wants one rare
   shape of a common node (an assignment binding a call, `x.data[0]`)
   subscribes to `ast.Module`, declares the type in `reads=`, and tests the
   shape in its own loop over `ctx.index.nodes(...)`: a call per node of a
   type every file has thousands of is a measurable share of `check`.
   It receives the node and a `Context`:
   `ctx.index` (the semantic index), `ctx.source`, `ctx.lines`,
   `ctx.segment(node)`, `ctx.torch_at_least(2, 6)` (the targeted torch
   version: installed, or `torch-version` in [tool.torchdoctor]) and
   `ctx.report(node, **values)`. The values fill the rule's message and fix
   templates and travel as the symptom's evidence values, so name the
   user's variable `variable=` (the specialists read it). Every value's key
   is declared in rules/data/evidence.toml with its type and `static:TD103`
   among its producers; a template field that is not fails when the rules
   load. Numbers go as numbers (`line=node.lineno`, not `str(...)`), and a
   key means one thing everywhere (code text of a step call is `step_call`,
   because a probe's `step` is a step number).

2. The docs, as data, in `rules/static/rules/<family>.toml` (the file starts
   with `specialist = "<id>"`, the specialist the hundreds digit names)::

       [[rule]]
       code = "TD103"
       name = "empty-cache-in-training-loop"       # kebab-case
       severity = "warning"                        # error | warning | info
       # calibrated = "info"                      # optional: the default level when the rule's record on real
       #                                          # code is weaker than its claim (bench/realcode/README.md)
       symptom = "empty-cache-in-loop"             # an id of rules/data/symptoms.toml
       summary = "one line for `torchdoctor rules`"
       message = "`{variable}` runs every training step ..."   # names the user's variable or call
       fix = "what to change, with {variable}"
       why = "why it matters, and when it does not"
       bad = '''a short script that fires the rule'''
       good = '''the same script, fixed (must not fire)'''

   `torchdoctor explain TD103` prints it; SARIF carries it as help text.

3. Two fixtures in `tests/fixtures/check/rules/TD103/`: `fire*.py` where
   every line that must fire ends with `# expect: TD103`, and `ok*.py`, a
   near miss that must not fire. tests/test_check_rules.py runs every rule
   on its fixtures and on its own bad/good doc examples, and checks every
   rule's metadata; the healthy scripts in tests/fixtures/check/healthy/
   must stay free of warnings and errors with all rules on.

The index at a glance (index.py composes it; rules/static/semantic/ has one module per question)
-----------------------------------------------
- names: `resolve(expr)` / `callee(call)` -> qualified names through import
  aliases; `calls_to("torch.save")`, `method_calls("step")`, `imported`, `uses(prefix)`;
- bindings: `binding(expr)` -> `Binding(kind, cls, call, kwargs, arg(name, pos),
  star_kwargs, wrapper, compiled, inner)` for dataloader, sampler, scheduler,
  optimizer, scaler, autocast, grad-mode, module and loss; `bindings_of(kind)`,
  `kind_of(expr)` (falls back to the name: `train_loader`, `optimizer`), `is_model(expr)`;
- loops: `loops`, `loop_of(node)`, `loops_around(node)`, `step_loop_of(node)`,
  `training_loop_of(node)`, `epoch_loops()`, `validation_loops()`; a `Loop` has
  kind (batch | epoch | other), source (what it iterates), has_backward,
  has_step, trains, validation, calls (in source order), children;
  `backward_calls`, `step_calls`, `training_functions`, `callers(fn)`;
- classes: `classes`, `module_classes`, `function_classes` (autograd.Function),
  `class_of(node)`, `forward_of(node)`, `self_assignments(info, method)`,
  `self_reads(info)`;
- regions: `grad_disabled(node)`, `autocast_at(node)` (device, dtype),
  `autocast_regions()`, `rank_guarded(node)`, `is_rank_zero_test(expr)`;
- data flow in one function: `definitions(name, at)`, `defs(scope)`;
  patterns.py builds on it (`holds_graph`, `is_probabilities`, `is_scores`,
  `tensor_factory`, ...);
- `contexts()` for the router; `ctx.torch_at_least(major, minor)` for advice
  that changed between torch versions.

Precision is the product: prefer a missed finding to a false alarm, ask the
index rather than matching text, and put the narrow cases in `why`.

Codes: TD + three digits, the hundreds digit naming the specialist (1 memory,
2 module-design, 3 distributed, 4 mixed-precision, 5 profiling, 6 debugging,
7 checkpointing, 8 autograd). TD000 (could not analyse) is the engine's own.
"""
