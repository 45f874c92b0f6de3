"""Selection, configuration and .gitignore matching, in-process (fast)."""

from __future__ import annotations

import os

import pytest

from tests.conftest import cli
from torchdoctor.check import CheckRequest, UsageError, build_report, prepare
from torchdoctor.config import ConfigError, find_config, load
from torchdoctor.rules.static.gitignore import IgnoreFile, matches_path_or_parent
from torchdoctor.rules.static.registry import is_enabled, selected


@pytest.mark.parametrize(
    "pattern, path, is_dir, ignored",
    [
        ("*.pyc", "a/b/c.pyc", False, True),
        ("build/", "build", True, True),
        ("build/", "build", False, False),  # dir-only
        ("/build", "src/build", True, False),  # anchored to the .gitignore's folder
        ("/build", "build", True, True),
        ("docs/*.py", "docs/conf.py", False, True),
        ("docs/*.py", "x/docs/conf.py", False, False),  # a middle slash anchors too
        ("**/gen", "a/b/gen", True, True),
        ("a/**/b", "a/b", True, True),
        ("a/**/b", "a/x/y/b", True, True),
        ("logs/**", "logs/x/y.py", False, True),
        ("[ab].py", "b.py", False, True),
        ("[!ab].py", "b.py", False, False),
        ("?.py", "xy.py", False, False),
        ("\\#notes.py", "#notes.py", False, True),
        ("trailing.py   ", "trailing.py", False, True),
        ("# a comment", "# a comment", False, False),
    ],
)
def test_gitignore_patterns(pattern, path, is_dir, ignored):
    assert bool(IgnoreFile("", [pattern]).decide(path, is_dir)) is ignored


def test_gitignore_negation_last_match_wins():
    f = IgnoreFile("", ["*.py", "!keep.py", "keep.py.bak"])
    assert f.decide("drop.py", False) is True
    assert f.decide("keep.py", False) is False
    assert f.decide("other.txt", False) is None


def test_per_file_ignore_patterns_match_parents():
    assert matches_path_or_parent(IgnoreFile("", ["tests/"]), "tests/unit/test_a.py")
    assert matches_path_or_parent(IgnoreFile("", ["tests/**/*.py"]), "tests/unit/test_a.py")
    assert not matches_path_or_parent(IgnoreFile("", ["/scripts/*.py"]), "src/scripts/a.py")


def test_selection_specificity():
    assert is_enabled("TD101", ["TD"], [])
    assert not is_enabled("TD101", ["TD"], ["TD1"])
    assert is_enabled("TD101", ["TD"], ["TD1", "TD2"]) is False
    assert is_enabled("TD101", ["TD101"], ["TD1"])  # the more specific select wins
    assert not is_enabled("TD101", ["TD1"], ["TD1"])  # a tie: ignore wins
    assert is_enabled("TD205", ["ALL"], [])
    codes = [r.code for r in selected(["TD2"], [])]
    assert "TD000" in codes and "TD101" not in codes  # TD000 stays on unless ignored
    assert "TD000" not in [r.code for r in selected(["TD"], ["TD000"])]


def test_find_config_takes_the_nearest_table(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[tool.torchdoctor]\nignore = ['TD206']\n")
    sub = tmp_path / "pkg" / "inner"
    sub.mkdir(parents=True)
    (tmp_path / "pkg" / "pyproject.toml").write_text("[project]\nname = 'inner'\n")  # no table: keep looking
    assert find_config(str(sub)) == tmp_path / "pyproject.toml"
    settings = load(None, str(sub))
    assert settings.ignore == ["TD206"] and settings.root == str(tmp_path)
    assert settings.torch_version is not None and settings.torch_version_source.startswith("installed torch")


def test_config_values_are_validated(tmp_path):
    cfg = tmp_path / "td.toml"
    for body, message in [
        ("select = 3", "`select` must be a list of strings"),
        ("fail-on = 'sometimes'", "fail-on must be one of"),
        ("per-file-ignores = ['x']", "`per-file-ignores` must be a table"),
        ("max-file-bytes = -1", "`max-file-bytes` must be a positive integer"),
        ("respect-gitignore = 'yes'", "`respect-gitignore` must be true or false"),
        ("severity = { TD703 = 'loud' }", "`severity` must be a table of code"),
        ("severity = ['TD703']", "`severity` must be a table of code"),
    ]:
        cfg.write_text(body + "\n")
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
            load(str(cfg), str(tmp_path))


def test_per_file_ignores_and_cli_overrides(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tests").mkdir()
    leaky = "import torch\nmodel = torch.nn.Linear(2, 2)\ny = model.forward(x)\n"
    (tmp_path / "tests" / "test_a.py").write_text(leaky)
    (tmp_path / "main.py").write_text(leaky)
    (tmp_path / "pyproject.toml").write_text(
        '[tool.torchdoctor]\nper-file-ignores = { "tests/**" = ["TD2"] }\nfail-on = "error"\ninclude-tests = true\n'
    )
    request = CheckRequest(paths=["."], fmt="json")
    settings = prepare(request)
    assert settings.fail_on == "error"
    report = build_report(request, settings)
    assert [f.path for f in report.findings] == ["main.py"]
    request = CheckRequest(paths=["."], fmt="json", fail_on="info", ignore=["TD202"])
    settings = prepare(request)
    assert settings.fail_on == "info" and build_report(request, settings).findings == []
    with pytest.raises(UsageError, match="per-file-ignores: TD9"):
        (tmp_path / "pyproject.toml").write_text('[tool.torchdoctor]\nper-file-ignores = { "x.py" = ["TD9"] }\n')
        prepare(CheckRequest(paths=["."]))
    assert os.getcwd() == str(tmp_path)


LEAK = ("import torch\nmodel = torch.nn.Linear(2, 2)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "total = 0\nfor x in loader:\n    loss = model(x).sum()\n    loss.backward()\n    opt.step()\n"
        "    total += loss\n")
TEST_FILES = ["tests/test_train.py", "test/helpers.py", "pkg/tests/util.py", "pkg/test_model.py",
              "pkg/model_test.py", "conftest.py", "benchmarks/bench_step.py", "pkg/benchmark/run.py"]


def _tree(root):
    for name in ["train.py", "pkg/trainer.py", *TEST_FILES]:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(LEAK)


def _paths(paths, **kw):
    request = CheckRequest(paths=paths, fmt="json", **kw)
    return sorted({f.path for f in build_report(request, prepare(request)).findings})


def test_tests_and_benchmarks_are_skipped_by_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _tree(tmp_path)
    assert _paths(["."]) == ["pkg/trainer.py", "train.py"]
    assert _paths(["tests"]) == ["tests/test_train.py"]  # a tests folder named on the command line is checked
    assert _paths(["pkg/test_model.py"]) == ["pkg/test_model.py"]  # and so is a file named
    (tmp_path / "pyproject.toml").write_text("[tool.torchdoctor]\ninclude-tests = true\n")
    assert _paths(["."]) == sorted(["pkg/trainer.py", "train.py", *TEST_FILES])
    (tmp_path / "pyproject.toml").write_text("[tool.torchdoctor]\ninclude-tests = 1\n")
    with pytest.raises(UsageError, match="include-tests"):
        prepare(CheckRequest(paths=["."]))


def test_an_unknown_code_in_severity_is_a_usage_error(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.torchdoctor]\nseverity = { TD999 = "error" }\n')
    (tmp_path / "train.py").write_text("x = 1\n")
    proc = cli("check", "train.py", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr_text == "torchdoctor: unknown rule code or prefix in severity: TD999\n"
