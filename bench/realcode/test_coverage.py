"""coverage.py on a small two-file project: which loops it finds and what the index answers about each.

    .venv/bin/python -m pytest bench/realcode/test_coverage.py -p no:xdist
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import coverage  # noqa: E402

MODEL = """\
import torch.nn as nn


class Net(nn.Module):
    def forward(self, x):
        return x
"""

TRAIN = """\
import torch
from torch.utils.data import DataLoader

from model import Net
from steps import run_step


def fit(data):
    net = Net()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    loader = DataLoader(data, batch_size=4)
    for epoch in range(3):
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(net(x), y)
            loss.backward()
            optimizer.step()
        scheduler.step()


def fit_elsewhere(batches, model, opt):
    for batch in batches:
        run_step(model, opt, batch)


def sample(net, n):
    for _ in range(n):
        net(torch.zeros(1))
"""

STEPS = """\
def run_step(model, opt, batch):
    out = model(batch)
    out.sum().backward()
    opt.step()
"""


def _reports(tmp_path, files):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    project = coverage.build_project(str(tmp_path), ["."])
    return {r.where: r for r in coverage.analyse_loops(project)}


def test_loops_are_found_directly_and_through_another_files_function(tmp_path):
    reports = _reports(tmp_path, {"model.py": MODEL, "train.py": TRAIN, "steps.py": STEPS})
    # the epoch and batch loops of fit, and the loop that trains through steps.run_step; not sample's loop
    assert sorted(reports) == ["train.py:13", "train.py:14", "train.py:23"]
    batch = reports["train.py:14"].answers
    assert batch == {"trains": True, "role": True, "optimizer": True, "model": True,
                     "model_class": True, "model_named": True, "loader": True, "loader_named": True, "loss": True,
                     "scheduler": None}
    assert reports["train.py:13"].answers["scheduler"] is True  # stepped in the epoch loop
    assert reports["train.py:13"].answers["loader"] is None  # a counted loop draws no batches itself
    elsewhere = reports["train.py:23"].answers
    # the step runs in another file on parameters nobody in that file binds: the index cannot know them
    assert elsewhere["optimizer"] is False and elsewhere["model"] is False and elsewhere["loader"] is False
    assert elsewhere["trains"] is False  # a call of another file's function with no model or optimizer built here
    assert elsewhere["model_named"] is True  # what the rules see: `model(batch)` is a model call by its name


def test_summary_counts_only_the_loops_a_question_applies_to(tmp_path):
    reports = list(_reports(tmp_path, {"model.py": MODEL, "train.py": TRAIN, "steps.py": STEPS}).values())
    summary = coverage.summarise(reports, coverage.Counter())
    assert summary["loops"] == 3
    assert summary["questions"]["scheduler"] == {"resolved": 1, "asked": 1, "fraction": 1.0}
    assert summary["questions"]["model_class"]["resolved"] == 2  # Net is known from model.py (the pre-pass)


def test_heldout_needs_summary():
    import pytest

    with pytest.raises(SystemExit) as exc:
        coverage.main(["--split", "heldout"])
    assert exc.value.code == 2
