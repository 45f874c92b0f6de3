"""Advice in the framework's terms (issue 17): the Lightning / Trainer / Accelerate knob first, plain PyTorch
second, from rules/data/frameworks.toml, whenever a run or a script shows the framework."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import FIXTURES, cli
from torchdoctor.consistency import contradictions
from torchdoctor.model import Fix
from torchdoctor.rules import catalog
from torchdoctor.specialists.frameworks import framework_ids, in_framework_terms, table

FRAMEWORKS = FIXTURES / "frameworks"

CLIP = Fix(title="Clip the gradient norm before the optimizer step", why="w", verify="v",
           snippet="torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)")
ANOMALY = Fix(title="Find the op", why="w", verify="v", snippet="with torch.autograd.detect_anomaly():\n    ...")
OTHER = Fix(title="Normalise between layers", why="w", verify="v", snippet="nn.LayerNorm(64)")


# -- the data ------------------------------------------------------------------------------------


def test_every_framework_is_a_routing_context_and_every_knob_is_complete():
    contexts = {c["id"] for c in catalog.routing()["context"]}
    assert set(framework_ids()) <= contexts
    for knob in table()["knob"]:
        assert knob["matches"] and knob["verify"], knob["id"]
        forms = {k: v for k, v in knob.items() if isinstance(v, dict)}
        assert forms and set(forms) <= set(framework_ids()), knob["id"]
        for framework, form in forms.items():
            assert form["title"] and form["snippet"] and form["why"], (knob["id"], framework)


# -- the matching --------------------------------------------------------------------------------


@pytest.mark.parametrize("contexts, first", [
    (["lightning"], "Lightning: Clip with Trainer(gradient_clip_val=…)"),
    (["hf-trainer", "accelerate"], "Hugging Face Trainer: Set TrainingArguments(max_grad_norm=…)"),
    (["accelerate"], "Accelerate: Clip with accelerator.clip_grad_norm_ on the synchronising step"),
])
def test_the_frameworks_knob_comes_first_and_the_plain_form_second(contexts, first):
    fixes = in_framework_terms([OTHER, CLIP], contexts)
    assert [f.title for f in fixes] == [OTHER.title, first, CLIP.title]
    assert fixes[1].applies_when.startswith("training with ") and "plain-PyTorch form follows" in fixes[1].why


def test_without_a_framework_the_fixes_are_unchanged():
    fixes = [OTHER, CLIP, ANOMALY]
    assert in_framework_terms(fixes, ["distributed", "amp"]) == fixes


def test_a_knob_the_framework_lacks_keeps_the_plain_fix_alone():
    assert [f.title for f in in_framework_terms([ANOMALY], ["accelerate"])] == [ANOMALY.title]
    assert "detect_anomaly=True" in in_framework_terms([ANOMALY], ["lightning"])[0].snippet


def test_each_knob_is_given_once_per_report():
    twice = Fix(title="Clip again", why="w", verify="v", snippet="clip_grad_norm_(params, 0.5)")
    titles = [f.title for f in in_framework_terms([CLIP, twice], ["lightning"])]
    assert titles.count("Lightning: Clip with Trainer(gradient_clip_val=…)") == 1 and len(titles) == 3


# -- the doors -------------------------------------------------------------------------------------


LIGHTNING_SCRIPT = '''import lightning as L
import torch
from torch import nn


class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


model = Net()
L.Trainer(max_epochs=1).fit(model)
torch.save(model, "model.pt")
'''


def test_check_gives_the_lightning_knob_first_for_a_lightning_script(tmp_path):
    (tmp_path / "lit.py").write_text(LIGHTNING_SCRIPT)
    proc = cli("check", "lit.py", "--format", "json", cwd=str(tmp_path))
    report = json.loads(proc.stdout_text)
    assert "lightning" in report["contexts"]
    fixes = [f["title"] for r in report["reports"] for f in r["fixes"]]
    first = next(i for i, t in enumerate(fixes) if t.startswith("Lightning: Save with ModelCheckpoint"))
    assert fixes[first + 1] == "Save the state_dict; rebuild the model from code"
    plain = (tmp_path / "plain.py")
    plain.write_text(LIGHTNING_SCRIPT.replace("import lightning as L\n", "").replace("L.LightningModule",
                                                                                    "nn.Module"))
    report = json.loads(cli("check", "plain.py", "--format", "json", cwd=str(tmp_path)).stdout_text)
    assert not [f for r in report["reports"] for f in r["fixes"] if f["title"].startswith("Lightning:")]


@pytest.mark.parametrize("text, context, first", [
    ("my lightning model's loss goes nan after a few hundred steps, gradients explode", "lightning",
     "Lightning: Clip with Trainer(gradient_clip_val=…)"),
    ("loss is nan with the HF Trainer and TrainingArguments fp16=True", "hf-trainer",
     "Hugging Face Trainer: Set TrainingArguments(max_grad_norm=…)"),
    ("with accelerator.backward(loss) the loss goes nan after a few hundred steps, gradients explode", "accelerate",
     "Accelerate: Clip with accelerator.clip_grad_norm_ on the synchronising step"),
])
def test_ask_names_the_framework_from_the_users_words(text, context, first):
    report = json.loads(cli("ask", text, "--format", "json").stdout_text)
    assert context in report["contexts"]
    titles = [f["title"] for r in report["reports"] if r["specialist"] == "debugging" for f in r["fixes"]]
    assert titles[titles.index(first) + 1] == "Clip the gradient norm before the optimizer step"


def test_ask_without_a_framework_gives_plain_pytorch():
    report = json.loads(cli("ask", "loss goes nan after a few hundred steps, gradients explode", "--format",
                            "json").stdout_text)
    assert not {"lightning", "hf-trainer", "accelerate"} & set(report["contexts"])
    assert not [f for r in report["reports"] for f in r["fixes"] if f.get("applies_when", "") and
                f["applies_when"].startswith("training with ")]


def _script(name: str, out, *args: str) -> dict:
    env = {**os.environ, "NO_COLOR": "1", "HF_HOME": str(out.parent / "hf")}
    env.pop("TORCHDOCTOR_RUN", None)
    proc = subprocess.run([sys.executable, str(FRAMEWORKS / name), str(out), *args], capture_output=True,
                          text=True, env=env, cwd=str(out.parent), timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert not contradictions(report), [str(c) for c in contradictions(report)]  # the advice fits the framework run
    return report


def _titles(report: dict, specialist: str) -> list[str]:
    return [f["title"] for r in report["reports"] if r["specialist"] == specialist for f in r["fixes"]]


@pytest.mark.heavy
@pytest.mark.slow
def test_a_diverging_lightning_fit_is_found_and_advised_in_lightnings_terms(tmp_path, validate_report):
    pytest.importorskip("lightning", reason="lightning is an optional extra")
    report = validate_report(_script("lightning_fit.py", tmp_path / "run", "explode"))
    assert {"nan-loss", "exploding-gradients"} <= {s["id"] for s in report["symptoms"]}
    assert "lightning" in report["contexts"]
    titles = _titles(report, "debugging")
    clip = titles.index("Lightning: Clip with Trainer(gradient_clip_val=…)")
    assert titles[clip + 1] == "Clip the gradient norm before the optimizer step"
    assert "Lightning: Return the scheduler with \"interval\": \"step\" from configure_optimizers" in titles


@pytest.mark.heavy
@pytest.mark.slow
def test_a_nan_under_the_trainer_is_found_and_advised_in_the_trainers_terms(tmp_path, validate_report):
    pytest.importorskip("transformers", reason="transformers is an optional extra")
    report = validate_report(_script("hf_train.py", tmp_path / "run", "nan"))
    nan = [s for s in report["symptoms"] if s["id"] == "nan-loss"]
    assert nan and nan[0]["severity"] == "error"
    assert "hf-trainer" in report["contexts"]
    titles = _titles(report, "debugging")
    assert titles[0] == "Make `model.bert.embeddings.word_embeddings` numerically safe"  # the NaN's own module
    clip = titles.index("Hugging Face Trainer: Set TrainingArguments(max_grad_norm=…)")
    assert titles[clip + 1] == "Clip the gradient norm before the optimizer step"
    assert not [t for t in titles if t.startswith(("Lightning:", "Accelerate:"))]
