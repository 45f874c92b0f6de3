"""TD506 / TD507 beyond the table-driven fixtures: which host waits are warnings and which are info.

Running totals and histories (`total += loss.item()`), and synchronisations that only time the step, still wait
every step; they are reported at info severity and stay below the rule's level when a project raises TD507
(calibrated to info by default), and a log-interval guard silences both. The fixtures themselves run in tests/test_check_rules.py.
"""

from __future__ import annotations

import ast
import json

import pytest

from tests.conftest import FIXTURES, cli
from torchdoctor.rules.static import registry
from torchdoctor.rules.static.api import Context
from torchdoctor.rules.static.engine import analyse_text

RULES = FIXTURES / "check" / "rules"


def severities(path, code: str) -> dict[int, str]:
    result = analyse_text(path.read_text(), str(path), codes=[code])
    return {r.finding.line: r.finding.severity for r in result.results if r.finding.code == code}


def test_running_totals_are_info():
    found = severities(RULES / "TD507" / "fire_running_total.py", "TD507")
    assert found and set(found.values()) == {"info"}, found


@pytest.mark.parametrize("name", ["fire.py", "fire_config_branch.py", "fire_loss_stats.py"])
def test_other_per_step_reads_report_at_the_rules_level(name):
    # TD507 is calibrated to info by its record on real code, so by default every finding is info; the
    # running totals stay below the rule's own level even when a project raises it (next test).
    found = severities(RULES / "TD507" / name, "TD507")
    assert found and set(found.values()) == {"info"}, found
    assert registry.rules()["TD507"].doc.severity == "warning" and registry.rules()["TD507"].doc.level == "info"


def test_a_project_that_raises_td507_gets_warnings_except_for_running_totals(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.torchdoctor]\nseverity = { TD5 = "info", TD507 = "warning" }\n')
    (tmp_path / "train.py").write_text((RULES / "TD507" / "fire.py").read_text())
    (tmp_path / "totals.py").write_text((RULES / "TD507" / "fire_running_total.py").read_text())
    proc = cli("check", "--format", "json", "--select", "TD507", "train.py", "totals.py", cwd=tmp_path)
    levels = {(f["path"], f["severity"]) for f in json.loads(proc.stdout_text)["findings"]}
    assert levels == {("train.py", "warning"), ("totals.py", "info")}, levels  # the longest prefix decides
    assert proc.returncode == 1


def test_the_running_total_message_says_when_it_matters():
    text = (RULES / "TD507" / "fire_running_total.py").read_text()
    result = analyse_text(text, "train.py", codes=["TD507"])
    message = result.results[0].finding.message
    assert "running total" in message and "steps are short" in message and "loss.detach()" in message


def test_a_running_total_under_a_log_interval_guard_is_silent():
    text = '''
import torch
model = torch.nn.Linear(4, 1).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
total = 0.0
for step in range(1000):
    loss = model(torch.randn(8, 4, device="cuda")).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 100 == 0:
        total += loss.item()
'''
    assert not analyse_text(text, "train.py", codes=["TD507"]).results


def test_a_finding_may_lower_its_severity_but_not_raise_it():
    rule = registry.rules()["TD507"]
    ctx = Context("x.py", "", None, None, None)
    ctx.rule = rule
    ctx.report(ast.Pass(), severity="info", variable="v", kind="k", loop="l")
    assert ctx.hits[0].severity == "info"
    with pytest.raises(ValueError):
        ctx.report(ast.Pass(), severity="error", variable="v", kind="k", loop="l")


def test_a_training_loop_that_times_its_steps_is_info():
    found = severities(RULES / "TD506" / "fire_timed_steps.py", "TD506")
    assert found and set(found.values()) == {"info"}, found
    assert set(severities(RULES / "TD506" / "fire.py", "TD506").values()) == {"warning"}


def test_the_timing_message_says_how_to_time_cheaper():
    text = (RULES / "TD506" / "fire_timed_steps.py").read_text()
    message = analyse_text(text, "trainer.py", codes=["TD506"]).results[0].finding.message
    assert "to time the step" in message and "steps you log" in message


def test_a_file_named_for_benchmarking_is_not_reported():
    text = (RULES / "TD506" / "fire_timed_steps.py").read_text()
    assert not analyse_text(text, "tools/benchmark_train.py", codes=["TD506"]).results


# -- a step loop in a file that names no GPU: its caller decides ----------------------------------------------

ENGINE = """import torch.nn.functional as F


def train(model, loader, optimizer, device):
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(loss.item())
"""
MAIN = """import torch
from torch import nn

from engine import train

device = torch.device({device!r})
model = nn.Linear(4, 2).to(device)
loader = [(torch.randn(8, 4), torch.randint(0, 2, (8,)))]
train(model, loader, torch.optim.SGD(model.parameters(), lr=0.1), device)
"""
CPU_NOTEBOOK_STYLE = """import torch
from torch import nn

model = nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in [(torch.randn(8, 4), torch.randint(0, 2, (8,)))]:
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(loss.item())
"""


def _project_findings(tmp_path, monkeypatch, files: dict[str, str]) -> list[tuple[str, int, str]]:
    from torchdoctor.check import CheckRequest, build_report, prepare

    monkeypatch.chdir(tmp_path)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    request = CheckRequest(paths=["."], fmt="json", fail_on="never")
    return [(f.path, f.line, f.code) for f in build_report(request, prepare(request)).findings if f.code == "TD507"]


def test_a_loop_called_by_a_gpu_file_of_the_project_waits(tmp_path, monkeypatch):
    found = _project_findings(tmp_path, monkeypatch, {"engine.py": ENGINE, "main.py": MAIN.format(device="cuda")})
    assert found == [("engine.py", 11, "TD507")]


def test_a_loop_whose_callers_stay_on_the_cpu_does_not(tmp_path, monkeypatch):
    assert _project_findings(tmp_path, monkeypatch, {"engine.py": ENGINE, "main.py": MAIN.format(device="cpu")}) == []


def test_a_script_of_its_own_is_not_moved_to_the_gpu_by_another_file(tmp_path, monkeypatch):
    # a CPU tutorial beside a GPU script in one repository: nothing calls the tutorial's loop
    files = {"cpu_tutorial.py": CPU_NOTEBOOK_STYLE, "engine.py": ENGINE, "main.py": MAIN.format(device="cuda")}
    assert ("cpu_tutorial.py", 11, "TD507") not in _project_findings(tmp_path, monkeypatch, files)
