"""Two resume claims (TD709, TD710) in the shapes real projects use. TD709: an optimizer, GradScaler or LR scheduler
built again after its state was loaded on the resume path, in
the shapes real projects use: a plain script (a GradScaler built again at the top of every epoch), a trainer class
(`self.resume()` then a method that sets `self.optimizer` again), train/evaluate functions called from main.py (a
load helper of the same file, then the optimizer factory called again), the load helper in another file (a
scheduler built again), names that say nothing. Each shape is a folder with a `bad` project (the line a diagnosis
must name ends in `# variant: TD709`) and a `good` twin that builds the object once, before the load, and must stay
silent. TD710: a resume that restores the optimizer but never reads back the epoch/step counter the save writes (a
plain script's epoch loop, a trainer's `self.step` with a warm-up keyed to it, a train() function, an iteration
counter next to a model of another file, names that say nothing); its twin reads the counter back. `check` runs on
each folder as it would from the command line (the project pass included)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.check_variants_support import VARIANTS, findings, marked, shapes

CODES = {"state_rebuilt_after_load": "TD709", "resume_counter_not_restored": "TD710"}
SHAPES = shapes(CODES)


def _findings(folder: Path, monkeypatch, code: str = "TD709") -> list[tuple[str, int]]:
    return [(name, line) for name, line, _code in findings(folder, monkeypatch, {code})]


def _marked(folder: Path, code: str) -> set[tuple[str, int]]:
    return marked(folder, re.compile(rf"#\s*variant:\s*{code}\s*$"))


@pytest.mark.parametrize(("family", "shape"), SHAPES)
def test_variant_is_found_and_its_twin_stays_silent(family: str, shape: str, monkeypatch) -> None:
    code = CODES[family]
    bad, good = VARIANTS / family / shape / "bad", VARIANTS / family / shape / "good"
    marked = _marked(bad, code)
    assert marked, f"a bad variant marks its line with `# variant: {code}`"
    assert set(_findings(bad, monkeypatch, code)) == marked
    assert _findings(good, monkeypatch, code) == []


def test_a_rebuild_on_the_other_branch_or_after_a_training_stage_is_not_reported(tmp_path, monkeypatch) -> None:
    """The constructor on the `else` of the load, in the `except` of a failed load, after the loaded optimizer
    stepped (a second stage), or a scheduler built with `last_epoch=`: none throws a resume away."""
    (tmp_path / "stages.py").write_text(
        "import torch\nfrom torch import nn\n\nmodel = nn.Linear(4, 2)\n"
        "opt = torch.optim.Adam(model.parameters())\n"
        "sched = torch.optim.lr_scheduler.StepLR(opt, 10)\n"
        "try:\n    ck = torch.load('a.pt')\n    opt.load_state_dict(ck['opt'])\n    sched.load_state_dict(ck['s'])\n"
        "except FileNotFoundError:\n    opt = torch.optim.Adam(model.parameters())\n"
        "if ck:\n    opt.load_state_dict(ck['opt'])\nelse:\n    opt = torch.optim.Adam(model.parameters())\n"
        "for _ in range(10):\n    opt.zero_grad()\n    model(torch.randn(2, 4)).sum().backward()\n    opt.step()\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "sched = torch.optim.lr_scheduler.StepLR(opt, 10, last_epoch=ck['epoch'])\n"
    )
    assert _findings(tmp_path, monkeypatch) == []


def test_a_counter_read_elsewhere_or_started_from_a_value_is_not_reported(tmp_path, monkeypatch) -> None:
    """TD710 stays silent where the counter may come back: the loaded dict handed to a helper, a loop started from
    a value (`range(first, ...)` parsed from the file name), a weights-only load (fine-tuning), and a batch index
    of `enumerate` saved as "iter" (not a counter that starts the run)."""
    body = (
        "import torch\nfrom torch import nn\n\nmodel = nn.Linear(4, 2)\n"
        "opt = torch.optim.Adam(model.parameters())\n"
    )
    (tmp_path / "handed.py").write_text(
        body + "ck = torch.load('a.pt')\nmodel.load_state_dict(ck['model'])\nopt.load_state_dict(ck['opt'])\n"
        "report(ck)\nfor epoch in range(10):\n    opt.step()\n"
        "    torch.save({'model': model.state_dict(), 'opt': opt.state_dict(), 'epoch': epoch}, 'a.pt')\n"
    )
    (tmp_path / "parsed.py").write_text(
        body + "ck = torch.load('e_7.pt')\nopt.load_state_dict(ck['opt'])\nfirst = int('e_7.pt'[2:-3])\n"
        "for epoch in range(first, 10):\n    opt.step()\n"
        "    torch.save({'model': model.state_dict(), 'opt': opt.state_dict(), 'epoch': epoch}, 'e.pt')\n"
    )
    (tmp_path / "weights.py").write_text(
        body + "ck = torch.load('a.pt')\nmodel.load_state_dict(ck['model'])\n"
        "for epoch in range(10):\n    opt.step()\n"
        "    torch.save({'model': model.state_dict(), 'opt': opt.state_dict(), 'epoch': epoch}, 'a.pt')\n"
    )
    (tmp_path / "batches.py").write_text(
        body + "ck = torch.load('a.pt')\nopt.load_state_dict(ck['opt'])\n"
        "for it, batch in enumerate(range(100)):\n    opt.step()\n    if it > 50:\n"
        "        torch.save({'opt': opt.state_dict(), 'iter': it}, 'a.pt')\n"
    )
    assert _findings(tmp_path, monkeypatch, "TD710") == []
