"""TD3xx / TD4xx beyond the table-driven fixtures: the PyTorch behaviour each message quotes is checked
against real torch (CPU), version awareness, computed figures, and the way findings reach the specialists.

The fixtures themselves (fire*.py / ok*.py under tests/fixtures/check/rules/TD3*, TD4*) run in
tests/test_check_rules.py.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from torch import nn

from tests.conftest import FIXTURES, cli
from torchdoctor.rules.static import registry
from torchdoctor.rules.static.engine import analyse_text

RULES = FIXTURES / "check" / "rules"


def findings(text: str, code: str, torch_version=None) -> list:
    return [r for r in analyse_text(text, "train.py", codes=[code], torch_version=torch_version).results]


def messages(path, code: str) -> list[str]:
    return [r.finding.message for r in findings(path.read_text(), code)]


# -- the errors and warnings the messages quote are torch's own ---------------------------------


def test_shuffle_with_sampler_quotes_the_dataloader_errors():
    dataset = torch.utils.data.TensorDataset(torch.randn(8, 2))
    with pytest.raises(ValueError) as sampler_error:
        torch.utils.data.DataLoader(dataset, shuffle=True, sampler=torch.utils.data.SequentialSampler(dataset))
    batches = torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(dataset), batch_size=2, drop_last=False)
    with pytest.raises(ValueError) as batch_error:
        torch.utils.data.DataLoader(dataset, shuffle=True, batch_sampler=batches)
    found = messages(RULES / "TD302" / "fire.py", "TD302")
    assert any(f"ValueError: {sampler_error.value}" in m for m in found)
    assert any(f"ValueError: {batch_error.value}" in m for m in found)


def test_scheduler_order_quotes_torchs_warning():
    model = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scheduler.step()
        optimizer.step()
    text = " ".join(str(w.message) for w in caught)
    (message,) = [r.finding.message for r in findings(registry.get("TD408").doc.bad, "TD408")]
    quoted = message.split('"')[1]
    assert quoted in text


def test_ddp_prefix_and_load_error_match_the_message():
    wrapped = nn.DataParallel(nn.Linear(2, 2))  # on CPU it only wraps: the same `module.` prefix as DDP
    state = wrapped.state_dict()
    assert all(k.startswith("module.") for k in state)
    with pytest.raises(RuntimeError) as error:
        nn.Linear(2, 2).load_state_dict(state)
    assert "Missing key(s)" in str(error.value) and "Unexpected key(s) in state_dict" in str(error.value)
    found = messages(RULES / "TD304" / "fire.py", "TD304")
    assert len(found) == 2 and all("Missing key(s)" in m and "Unexpected key(s) in state_dict: module." in m for m in found)


def test_expand_messages_quote_the_errors_of_writing_into_a_view():
    parameter = nn.Parameter(torch.zeros(1, 4))
    buffer = torch.zeros(1, 4)
    errors = []
    for tensor in (parameter, buffer):
        view = tensor.expand(3, -1)
        with pytest.raises(RuntimeError) as error:
            view[:, 0] = 1.0
        errors.append(str(error.value).split(".")[0].split(": ")[-1])
    found = " ".join(messages(RULES / "TD307" / "fire.py", "TD307"))
    assert errors[1] in found  # the buffer written in place
    (bad,) = [r.finding.message for r in findings(registry.get("TD307").doc.bad, "TD307")]
    assert errors[0] in bad  # the parameter written in place
    read_only = [m for m in messages(RULES / "TD307" / "fire.py", "TD307") if "cls_token" in m]
    assert read_only and "only read here, which is fine" in read_only[0]


def test_autocast_defaults_are_what_the_rule_assumes():
    assert torch.get_autocast_dtype("cuda") == torch.float16
    assert torch.get_autocast_dtype("cpu") == torch.bfloat16
    (message,) = [r.finding.message for r in findings(registry.get("TD402").doc.bad, "TD402")]
    assert "float16 (the CUDA default when no dtype is given)" in message


def test_torch_cuda_amp_really_warns_and_the_rule_follows_the_targeted_version():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.amp.GradScaler(enabled=False)
    assert any(issubclass(w.category, FutureWarning) and "is deprecated" in str(w.message) for w in caught)
    bad = registry.get("TD401").doc.bad
    assert len(findings(bad, "TD401", torch_version=(2, 4))) == 2
    assert findings(bad, "TD401", torch_version=(2, 3)) == []


# -- the figures the scheduler messages compute --------------------------------------------------


def test_one_cycle_stepped_per_epoch_stays_in_warm_up():
    results = findings((RULES / "TD406" / "fire.py").read_text(), "TD406")
    (fixed,) = [r for r in results if r.values["variable"] == "fixed"]
    assert "20 scheduler steps where it plans 2,000: 1.0% of the schedule" in fixed.finding.message
    assert (fixed.values["lr_steps_planned"], fixed.values["lr_steps_taken"]) == (2000, 20)  # numbers, as the schedule probe sends them
    optimizer = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=2000)
    for _ in range(20):
        optimizer.step()
        schedule.step()
    assert schedule.get_last_lr()[0] < 3e-3 / 10  # still at the bottom of the warm-up


def test_cosine_sized_in_epochs_climbs_back_when_stepped_per_batch():
    optimizer = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=1.0)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=5)
    lrs = []
    for _ in range(10):
        optimizer.step()
        cosine.step()
        lrs.append(cosine.get_last_lr()[0])
    assert lrs[4] == pytest.approx(0.0, abs=1e-9) and lrs[9] == pytest.approx(1.0)
    (message,) = [r.finding.message for r in findings(registry.get("TD407").doc.bad, "TD407")]
    assert "climbs back up" in message


# -- from findings to fix reports ------------------------------------------------------------------


@pytest.fixture(scope="module")
def check_report(tmp_path_factory):
    folder = tmp_path_factory.mktemp("td34")
    for code in ("TD301", "TD305", "TD409", "TD412"):
        (folder / f"{code.lower()}.py").write_text(registry.get(code).doc.bad)
    done = cli("check", "--format", "json", str(folder))
    assert done.returncode == 1, done.stderr_text
    return json.loads(done.stdout_text)


def test_findings_become_symptoms_that_reach_their_specialists(check_report):
    codes = {f["code"] for f in check_report["findings"]}
    assert {"TD301", "TD305", "TD409", "TD412"} <= codes
    symptoms = {s["id"] for s in check_report["symptoms"]}
    assert {"sampler-epoch-not-set", "accumulation-without-no-sync", "accumulation-not-normalized", "adam-weight-decay"} <= symptoms
    by_specialist = {r["specialist"]: r for r in check_report["reports"]}
    assert {"distributed", "mixed-precision"} <= set(by_specialist)
    distributed = by_specialist["distributed"]
    assert "set_epoch" in distributed["diagnosis"]  # the dedicated handler, located at the sampler
    assert "Call set_epoch at the start of every epoch" in [f["title"] for f in distributed["fixes"]]
    titles = [f["title"] for f in by_specialist["mixed-precision"]["fixes"]]
    assert "Divide each micro-batch loss by the number of micro-steps" in titles
    assert "Switch to AdamW (and retune the decay)" in titles
