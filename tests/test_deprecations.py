"""The deprecated-torch-API table (rules/data/deprecated.toml) is generated from torch's source, not kept
by hand, and `check` reads it without importing torch."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tomllib

from torchdoctor.rules.static import deprecations
from torchdoctor.rules.static.engine import analyse_text

COMMITTED = Path(deprecations.__file__).parents[1] / "data" / "deprecated.toml"


def _table(path: Path) -> dict:
    with open(path, "rb") as fh:
        return tomllib.load(fh)


def _by_name(table: dict) -> dict[tuple[str, str], dict]:
    return {(e["name"], e.get("argument", "")): e for e in table["deprecated"]}


# -- the committed table is what the generator writes from the installed torch --------------------


def _unchanged_since_generated(committed: dict) -> bool:
    """The table is a function of torch's source and the generator's: when the header says both are as
    installed now and the entries hash to what the generator wrote, a fresh run would write this file."""
    text = COMMITTED.read_text()
    body = text[text.index("\n\n[[deprecated]]") + 1:] if "\n\n[[deprecated]]" in text else ""
    return (committed.get("generator") == deprecations.generator_digest()
            and committed.get("entries") == deprecations.entries_digest(body))


def test_committed_table_is_the_generators_output_for_the_installed_torch(tmp_path):
    root = deprecations.torch_dir()
    committed = _table(COMMITTED)
    installed = deprecations.torch_version(root)
    if committed["torch"] != installed:
        pytest.skip(f"table from torch {committed['torch']}, installed {installed}: regenerate to compare")
    if _unchanged_since_generated(committed) and not os.environ.get("TORCHDOCTOR_REGENERATE"):
        return  # same torch, same generator, entries as written: regeneration (a minute) would match
    out = tmp_path / "deprecated.toml"
    assert deprecations.main(["--out", str(out)]) == 0
    assert out.read_text() == COMMITTED.read_text(), (
        "rules/data/deprecated.toml differs from a fresh run: "
        "python -m torchdoctor.rules.static.deprecations"
    )


def test_committed_table_holds_what_torch_says_is_deprecated():
    entries = _by_name(_table(COMMITTED))
    # The amp wrappers TorchFix's hand list misses, found from @deprecated on a class and on __init__.
    for name in ("torch.cuda.amp.autocast", "torch.cuda.amp.GradScaler", "torch.cpu.amp.autocast",
                 "torch.cuda.amp.custom_fwd"):
        assert (name, "") in entries, name
    assert "torch.amp.autocast('cuda', args...)" in entries[("torch.cuda.amp.autocast", "")]["replacement"]
    # A factory (`normal = _make_deprecate(normal_)`) rendered with its argument.
    assert entries[("torch.nn.init.normal", "")]["replacement"] == "nn.init.normal_"
    assert entries[("torch.cuda.memory_cached", "")]["replacement"] == "torch.cuda.memory_reserved"
    # Removed names that only raise, with the version the message gives.
    solve = entries[("torch.solve", "")]
    assert solve["removed"] is True and solve["since"] == "1.9" and solve["replacement"] == "torch.linalg.solve"
    # Arguments: through a private helper in another module, and through a base class's __init__.
    assert entries[("torch.nn.functional.softmax", "dim")]["when"] == "omitted"
    assert entries[("torch.nn.functional.mse_loss", "size_average")]["when"] == "passed"
    assert entries[("torch.nn.CrossEntropyLoss", "size_average")]["position"] == 1
    assert entries[("torch.nn.MSELoss", "reduce")]["when"] == "passed"  # no __init__ of its own
    # A module __getattr__ table.
    assert entries[("torch.has_cuda", "")]["replacement"] == "torch.backends.cuda.is_built()"
    # Private names stay out.
    assert not [n for n, _ in entries if any(p.startswith("_") for p in n.split("."))]


# -- the generator on a torch tree written here: each way torch marks a deprecation ---------------


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


FAKE_TORCH = {
    "torch/__init__.py": """
        import warnings
        from torch._impl import kept, old_helper_user, Scaler
        from torch import nn

        _deprecated_attrs = {"has_thing": torch.backends.thing.is_built}

        def __getattr__(name):
            replacement = _deprecated_attrs.get(name)
            if replacement is not None:
                warnings.warn(
                    f"'{name}' is deprecated, please use '{replacement.__module__}.{replacement.__name__}()'"
                )
                return replacement()
            raise AttributeError(name)
    """,
    "torch/version.py": "__version__ = '9.9.0'\n",
    "torch/_impl.py": """
        import os
        import warnings
        from typing_extensions import deprecated


        def _warn_old(name, new):
            warnings.warn(f"torch.{name} is deprecated, use {new} instead.", FutureWarning)


        def old_helper_user(x):
            _warn_old("old_helper_user", "torch.new_thing")
            return x


        def kept(x, dim=None, legacy=None, verbose=False):
            if dim is None:
                warnings.warn("Implicit dim is deprecated. Pass dim=.")
            if legacy is not None:
                warnings.warn("`legacy` is deprecated since 2.1, use `mode=` instead", FutureWarning)
            if verbose:
                warnings.warn("verbose is deprecated and will be removed in 3.0")
            if x > 0:
                warnings.warn("positive x is deprecated")  # depends on a value: not the name's fault
            if os.environ.get("OLD_SETTING"):
                warnings.warn("OLD_SETTING is deprecated")  # a setting, not the call
            for item in x:
                warnings.warn("items are deprecated")  # once per item of the caller's data
            try:
                pass
            except ImportError:
                warnings.warn("the fallback is deprecated")  # a failure path
            return x


        class Scaler:
            @deprecated("`torch.Scaler()` is deprecated. Please use `torch.amp.Scaler('cuda')` instead.",
                        category=FutureWarning)
            def __init__(self, scale=1.0):
                self.scale = scale

            def step(self):
                warnings.warn("The scale is large; consider a smaller one.")


        def not_exported():
            warnings.warn("not_exported is deprecated")
    """,
    "torch/nn/__init__.py": """
        from torch.nn.init import uniform, uniform_
        from torch.nn.loss import BaseLoss, MSELoss
    """,
    "torch/nn/init.py": """
        import warnings


        def uniform_(t):
            return t


        def _make_deprecate(meth):
            new_name = meth.__name__
            old_name = new_name[:-1]

            def deprecated_init(*args, **kwargs):
                warnings.warn(f"`nn.init.{old_name}` is now deprecated in favor of `nn.init.{new_name}`.",
                              FutureWarning)
                return meth(*args, **kwargs)

            return deprecated_init


        uniform = _make_deprecate(uniform_)
    """,
    "torch/nn/loss.py": """
        from torch.nn import _reduction


        class BaseLoss:
            def __init__(self, size_average=None, reduce=None, reduction="mean"):
                if size_average is not None or reduce is not None:
                    self.reduction = _reduction.legacy(size_average, reduce)


        class MSELoss(BaseLoss):
            pass


        class WeightedLoss(BaseLoss):
            def __init__(self, weight=None, size_average=None, reduce=None, reduction="mean"):
                super().__init__(size_average, reduce, reduction)
    """,
    "torch/nn/_reduction.py": """
        import warnings


        def legacy(size_average, reduce, emit_warning=True):
            warning = "size_average and reduce args will be deprecated, please use reduction='{}' instead."
            ret = "mean" if size_average else "sum"
            if emit_warning:
                warnings.warn(warning.format(ret))
            return ret
    """,
    "torch/optim/sched.py": """
        import warnings


        class Sched:
            def step(self, epoch=None):
                if epoch is not None:
                    warnings.warn("The epoch parameter is being deprecated. Please use `scheduler.step()`.")


        class StepSched(Sched):
            pass


        class OwnStep(Sched):
            def step(self, epoch=None):
                pass
    """,
    "torch/linalg.py": """
        import textwrap


        def old_inverse(a):
            raise RuntimeError(textwrap.dedent('''
                old_inverse() was removed.
                Use torch.linalg.inv instead.
            '''))


        def lookup(table, key):
            if key not in table:
                raise KeyError(f"{key} was removed from the table")  # a data error, not a removed name
            return table[key]


        def solve(a, b):
            raise RuntimeError(
                "This function was deprecated since version 1.9 and is now removed. "
                "`torch.linalg.old` is deprecated in favor of `torch.linalg.solve_ex`."
            )
    """,
}


@pytest.fixture(scope="module")
def fake_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("site") / "torch"
    _write(root.parent, FAKE_TORCH)
    return root


@pytest.fixture(scope="module")
def fake_table(fake_root) -> dict[tuple[str, str], dict]:
    root = fake_root
    out = root.parent / "deprecated.toml"
    assert deprecations.main(["--torch-dir", str(root), "--out", str(out)]) == 0
    table = _table(out)
    assert table["torch"] == "9.9.0"
    return _by_name(table)


def test_decorated_init_marks_the_class_and_its_reexport(fake_table):
    e = fake_table[("torch.Scaler", "")]
    assert e["kind"] == "class" and e["replacement"] == "torch.amp.Scaler('cuda')"
    assert e["defined"] == "torch._impl.Scaler"


def test_a_private_helpers_message_is_rendered_with_the_callers_arguments(fake_table):
    e = fake_table[("torch.old_helper_user", "")]
    assert e["message"] == "torch.old_helper_user is deprecated, use torch.new_thing instead."
    assert e["replacement"] == "torch.new_thing"


def test_factory_made_aliases_are_found(fake_table):
    for name in ("torch.nn.uniform", "torch.nn.init.uniform"):
        assert fake_table[(name, "")]["replacement"] == "nn.init.uniform_"
    assert ("torch.nn.init.uniform_", "") not in fake_table


def test_module_getattr_table(fake_table):
    assert fake_table[("torch.has_thing", "")]["replacement"] == "torch.backends.thing.is_built()"


def test_arguments_passed_set_or_left_out(fake_table):
    assert fake_table[("torch.kept", "dim")]["when"] == "omitted"
    legacy = fake_table[("torch.kept", "legacy")]
    assert (legacy["when"], legacy["position"], legacy["since"], legacy["replacement"]) == ("passed", 2, "2.1", "mode=")
    assert fake_table[("torch.kept", "verbose")]["when"] == "set"
    assert ("torch.kept", "") not in fake_table  # value-, setting-, data- and failure-dependent warnings


def test_arguments_through_helpers_and_base_classes(fake_table):
    for name, position in (("torch.nn.BaseLoss", 0), ("torch.nn.MSELoss", 0), ("torch.nn.loss.WeightedLoss", 1)):
        e = fake_table[(name, "size_average")]
        assert (e["when"], e["position"]) == ("passed", position), name
        assert e["message"].startswith("size_average and reduce args will be deprecated")


def test_a_subclass_gets_its_bases_method_arguments_unless_it_overrides_them(fake_table):
    for name in ("torch.optim.sched.Sched.step", "torch.optim.sched.StepSched.step"):
        e = fake_table[(name, "epoch")]
        assert (e["when"], e["position"], e["replacement"]) == ("passed", 0, "scheduler.step()"), name
    assert ("torch.optim.sched.OwnStep.step", "epoch") not in fake_table


def test_removed_functions(fake_table):
    e = fake_table[("torch.linalg.solve", "")]
    assert e["removed"] is True and e["since"] == "1.9" and e["replacement"] == "torch.linalg.solve_ex"
    e = fake_table[("torch.linalg.old_inverse", "")]
    assert e["removed"] is True and e["replacement"] == "torch.linalg.inv"
    assert e["message"] == "old_inverse() was removed. Use torch.linalg.inv instead."
    assert ("torch.linalg.lookup", "") not in fake_table


def test_private_and_unrelated_names_stay_out(fake_table):
    names = {n for n, _ in fake_table}
    assert not any(n.startswith("torch._") for n in names)
    assert "torch.Scaler.step" not in names  # a warning about something else
    assert "torch.not_exported" not in names  # defined in a private module, re-exported nowhere


def test_generator_refuses_a_folder_that_is_not_torch(tmp_path, capsys):
    assert deprecations.main(["--torch-dir", str(tmp_path), "--out", str(tmp_path / "x.toml")]) == 2
    assert "not a torch package folder" in capsys.readouterr().err
    assert not (tmp_path / "x.toml").exists()


def test_generator_says_when_it_cannot_write(tmp_path, capsys, fake_root):
    out = tmp_path / "missing" / "deprecated.toml"
    assert deprecations.main(["--torch-dir", str(fake_root), "--out", str(out)]) == 2
    assert "cannot write" in capsys.readouterr().err


@pytest.mark.parametrize(
    "message,old,expected",
    [
        ("`torch.cuda.amp.autocast(args...)` is deprecated. Please use `torch.amp.autocast('cuda', args...)` "
         "instead.", "torch.cuda.amp.autocast", "torch.amp.autocast('cuda', args...)"),
        ("Usage of 'torch.nn.quantized' is deprecated; please use 'torch.ao.nn.quantized' instead.",
         "torch.nn.quantized", "torch.ao.nn.quantized"),
        ("`torch.cuda.memory_cached` has been renamed to `torch.cuda.memory_reserved`", "torch.cuda.memory_cached",
         "torch.cuda.memory_reserved"),
        ("Positional args are being deprecated, use kwargs instead.", "torch.nn.Module.state_dict", ""),
        ("`torch.solve` is deprecated in favor of `torch.linalg.solve`.", "torch.solve", "torch.linalg.solve"),
    ],
)
def test_replacement_is_read_from_the_message(message, old, expected):
    assert deprecations.replacement(message, old) == expected


# -- check reads the table without torch ------------------------------------------------------


def test_check_does_not_import_torch(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import torch\nfrom torch import nn\nnn.init.normal(w)\ny = torch.nn.functional.softmax(x)\n")
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "torchdoctor.cli", "check", "--select", "TD608",
         "--fail-on", "never", str(script)],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "TD608" in done.stdout
    imported = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")]
    assert imported, done.stderr[-500:]
    assert not [m for m in imported if re.fullmatch(r"torch(\..*)?", m)]


def test_older_target_torch_keeps_only_entries_with_a_version():
    text = "import torch\nfrom torch import nn\nnn.init.normal(w)\ntorch.solve(b, a)\n"
    codes = ["TD608"]
    assert [r.finding.line for r in analyse_text(text, codes=codes).results] == [3, 4]
    # torch 2.0 already had torch.solve removed (deprecated in 1.9); the table says nothing about when
    # nn.init.normal started to warn, so an older target hears nothing about it.
    assert [r.finding.line for r in analyse_text(text, codes=codes, torch_version=(2, 0)).results] == [4]
    assert analyse_text(text, codes=codes, torch_version=(1, 8)).results == []
