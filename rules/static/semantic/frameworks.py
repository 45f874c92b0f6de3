"""Training frameworks' runner objects (Accelerate's `Accelerator`, Lightning's `Fabric`) and what their methods
mean: which call is the framework's backward, which context skips the gradient all-reduce, which call unwraps or
saves a model. The facts are data (vocabulary.toml [frameworks]); this module only finds the runners."""

from __future__ import annotations

import ast

from torchdoctor.rules.static.semantic.syntax import dotted

_ROLE_METHODS: dict[tuple[int, str], tuple[dict, frozenset[str]]] = {}


def _role_methods(frameworks: dict, role: str) -> frozenset[str]:
    """The method names any framework lists under `role`, once per vocabulary: the bindings ask `framework_call`
    of every assignment of a call's value (`x = a.b(...)`), and nearly none calls a framework's `setup`."""
    cached = _ROLE_METHODS.get((id(frameworks), role))
    if cached is not None and cached[0] is frameworks:
        return cached[1]
    found = frozenset(m for facts in frameworks.values() for m in facts.get(role, ()))
    _ROLE_METHODS[(id(frameworks), role)] = (frameworks, found)
    return found


class Frameworks:
    """Runners by name, and framework calls by role."""

    def _runners(self) -> dict[str, str]:
        """Names bound to a framework runner (`accelerator = Accelerator(...)`, `self.fabric = fabric` after
        `fabric = Fabric(...)`) -> the framework, from the constructors of this file and plain copies of them."""
        if self._runner_names is not None:
            return self._runner_names
        found: dict[str, str] = {}
        for framework, facts in self.vocab["frameworks"].items():
            for call in self.calls_to(*facts["constructors"]):
                stmt = self.parent(call)
                if isinstance(stmt, ast.Assign) and stmt.value is call:
                    found.update({d: framework for d in (dotted(t) for t in stmt.targets) if d})
        changed = bool(found)
        while changed:  # copies: `self.fabric = fabric`, `acc = self.accelerator`
            changed = False
            for stmt in self.nodes(ast.Assign):
                source = dotted(stmt.value)  # type: ignore[attr-defined]
                if source in found:
                    for target in stmt.targets:  # type: ignore[attr-defined]
                        name = dotted(target)
                        if name and name not in found:
                            found[name] = found[source]
                            changed = True
        self._runner_names = found
        return found

    def framework_of(self, expr: ast.AST | None) -> str | None:
        """The framework whose runner `expr` names: bound to its constructor in this file, or called by the
        framework's usual name (`self.accelerator`) in a file that imports the framework."""
        name = dotted(expr) if expr is not None else None
        if not name:
            return None
        runners = self._runners()
        if name in runners:
            return runners[name]
        last = name.rsplit(".", 1)[-1]
        for framework, facts in self.vocab["frameworks"].items():
            # the receiver's name first: the framework's import roots are worked out only for a name it uses
            if last in facts["receivers"] and any(
                    self.uses(root) for root in {c.split(".", 1)[0] for c in facts["constructors"]}):
                return framework
        return None

    def framework_call(self, call: ast.AST, role: str) -> str | None:
        """The framework, when `call` is `runner.method(...)` and the framework lists `method` under `role`
        (backward, no_sync, unwrap, save, setup)."""
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
            return None
        if call.func.attr not in _role_methods(self.vocab["frameworks"], role):
            return None  # no framework names the method for the role: the receiver needs no looking up
        framework = self.framework_of(call.func.value)
        if framework is None or call.func.attr not in self.vocab["frameworks"][framework].get(role, ()):
            return None
        return framework

    def framework_facts(self, framework: str) -> dict:
        return self.vocab["frameworks"][framework]

    def single_process_runner(self, framework: str) -> bool:
        """Every runner of the framework built in this file is pinned to one process (`Fabric(devices=1)`): what it
        wraps is no DDP model."""
        facts = self.vocab["frameworks"][framework]
        calls = self.calls_to(*facts["constructors"])
        if not calls:
            return False
        pinned = facts["single_process"]
        for call in calls:
            given = {k.arg: k.value for k in call.keywords if k.arg is not None}
            if not any(isinstance(given.get(key), ast.Constant) and given[key].value in values  # type: ignore[union-attr]
                       for key, values in pinned.items()):
                return False
        return True

    def sharded_runner(self, framework: str) -> bool:
        """The script hands the framework's runner a sharding engine (vocabulary.toml `sharding_*`):
        `Accelerator(fsdp_plugin=plugin)`, `Fabric(strategy="fsdp")`, a `FullyShardedDataParallelPlugin(...)` or
        `FSDPStrategy(...)` built in the file, or `os.environ["ACCELERATE_USE_FSDP"] = "true"`. What it prepares
        is then FSDP or DeepSpeed, not a DDP model."""
        facts = self.vocab["frameworks"][framework]
        if facts["sharding_classes"] and self.calls_to(*facts["sharding_classes"]):
            return True
        for call in self.calls_to(*facts["constructors"]):
            for k in call.keywords:
                if k.arg in facts["sharding_keywords"] and not (isinstance(k.value, ast.Constant) and k.value.value is None):
                    return True
                values = facts["sharding_values"].get(k.arg or "", ())
                if isinstance(k.value, ast.Constant) and k.value.value in values:
                    return True
        return any(name in self.source for name in facts["sharding_env"])

