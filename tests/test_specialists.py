"""The eight specialists: coverage of the catalogue, use of evidence, and the text they write."""

from __future__ import annotations

import ast
import io
import re
import tokenize

import pytest

from torchdoctor.model import Evidence, Location, Report
from torchdoctor.rules import catalog
from torchdoctor.specialists import MODULES, consult, get
from torchdoctor.specialists.base import is_shell

SYMPTOMS = catalog.symptoms()
PAIRS = [(sid, sp) for sid, info in SYMPTOMS.items() for sp in info.route]
LOCATION = Location("train.py", 42, code="total_loss += loss")


def _symptom(sid: str, values: dict | None = None, location: Location | None = None, source: str | None = None):
    evidence = [Evidence(kind="probe", summary="measured", values=values or {}, source=source)] if values or source else []
    return catalog.make_symptom(sid, evidence=evidence, location=location)


def _report(sid: str, sp: str, **kw):
    contexts = kw.pop("contexts", ())
    return consult(sp, [_symptom(sid, **kw)], contexts=contexts, command="run", target="train.py")


def _texts(fr) -> list[str]:
    """Every sentence a report shows, snippets aside."""
    out = [fr.diagnosis, *fr.next_steps]
    for f in fr.fixes:
        out += [f.title, f.why, f.verify] + ([f.applies_when] if f.applies_when else [])
    return out


# -- coverage ---------------------------------------------------------------


@pytest.mark.parametrize("sid,sp", PAIRS)
def test_every_routed_specialist_answers_every_symptom(sid, sp):
    fr = _report(sid, sp)
    assert fr.specialist == sp and fr.symptoms == [sid]
    assert fr.diagnosis.strip()
    assert fr.next_steps, f"{sp} gives no next step for {sid}"


@pytest.mark.parametrize("sid", sorted(SYMPTOMS))
def test_primary_specialist_has_a_dedicated_handler(sid):
    primary = SYMPTOMS[sid].route[0]
    assert sid in get(primary).handlers, f"{primary} handles {sid} only with its general handler"


@pytest.mark.parametrize("sp", sorted(MODULES))
def test_each_specialist_has_at_least_three_dedicated_handlers(sp):
    assert len(get(sp).handlers) >= 3


@pytest.mark.parametrize("sp", sorted(MODULES))
def test_specialist_without_symptoms_gives_its_general_view(sp):
    fr = consult(sp, [], command="ask")
    assert fr.diagnosis.strip() and fr.fixes


@pytest.mark.parametrize("sid,sp", PAIRS)
def test_primary_problems_come_with_fixes(sid, sp):
    if sp != SYMPTOMS[sid].route[0]:
        return
    assert _report(sid, sp).fixes, f"{sp} has no fix for {sid}"


# -- evidence ---------------------------------------------------------------


@pytest.mark.parametrize("sid,sp", PAIRS)
def test_a_located_symptom_names_the_line_and_a_fix_points_at_it(sid, sp):
    fr = _report(sid, sp, location=LOCATION)
    assert "line 42" in fr.diagnosis.lower(), fr.diagnosis
    if sid in get(sp).handlers and fr.fixes:
        assert any(f.location == LOCATION for f in fr.fixes), f"{sp}/{sid}: no fix points at the line"
    elif sid not in get(sp).handlers:  # general advice from another angle pins no fix to the user's line
        assert all(f.location is None for f in fr.fixes)


# symptom, specialist, values, substrings the diagnosis must contain
MEASURED = [
    ("oom", "memory", {"requested_gib": 2.0, "total_gib": 23.69, "free_gib": 1.21, "allocated_gib": 19.8},
     ["2.00 GiB", "23.69 GiB", "1.21 GiB", "19.80 GiB"]),
    ("oom", "memory", {"requested_gib": 0.5, "reserved_unallocated_gib": 1.6}, ["1.60 GiB", "fragmentation"]),
    ("memory-growth", "memory", {"slope_mib_per_step": 12.5, "steps_observed": 30}, ["12.5 MiB per step", "30 steps"]),
    ("high-memory", "memory", {"peak_gib": 13.2, "budget_gib": 10.0, "activations_gib": 9.0, "parameters_gib": 1.0},
     ["13.20 GiB", "10.00 GiB", "does not fit", "activations 9.00 GiB"]),
    ("fragmentation", "memory", {"reserved_unallocated_gib": 3.0, "reserved_gib": 20.0}, ["3.00 GiB", "20.00 GiB"]),
    ("host-oom", "memory", {"rss_gib": 30.0, "num_workers": 8}, ["30.00 GiB", "8 DataLoader workers"]),
    ("eval-without-no-grad", "debugging", {"extra_gib": 1.5}, ["1.50 GiB"]),
    ("dataloader-bound", "profiling", {"data_wait_fraction": 0.62, "step_ms": 120.0, "num_workers": 0},
     ["62%", "74.4 ms", "num_workers=0"]),
    ("host-sync", "profiling", {"syncs_per_step": 3}, ["3 host-device synchronisations per step"]),
    ("graph-break", "profiling", {"graph_breaks": 4, "reason": "call to print"}, ["4 times", "call to print"]),
    ("recompile", "profiling", {"recompiles": 9, "guard": "tensor 'x' size mismatch at index 1. expected 128, actual 97"},
     ["9 times", "size mismatch at index 1"]),
    ("slow-step", "profiling", {"step_ms": 412.0, "data_wait_fraction": 0.1, "backward_fraction": 0.55},
     ["412 ms", "backward 55%", "data wait 10%"]),
    ("low-gpu-util", "profiling", {"gpu_util": 0.3}, ["30%"]),
    ("loss-scale-collapse", "mixed-precision", {"scale": 1.5e-5, "skipped_steps": 180, "steps": 200},
     ["1.5e-05", "180 steps of 200 steps"]),
    ("scheduler-granularity", "mixed-precision", {"scheduler": "OneCycleLR", "lr_steps_planned": 10000, "lr_steps_taken": 10},
     ["10000 steps", "10 times", "0.1%"]),
    ("clip-before-unscale", "mixed-precision", {"scale": 65536.0}, ["65536"]),
    ("accumulation-not-normalized", "mixed-precision", {"micro_steps": 8}, ["8 micro-batches", "8x"]),
    ("fp16-without-scaler", "mixed-precision", {"zero_grad_fraction": 0.4}, ["40%"]),
    ("nan-loss", "debugging", {"step": 412, "first_bad_module": "encoder.layers.3.attn", "phase": "forward"},
     ["step 412", "`encoder.layers.3.attn`", "forward"]),
    ("exploding-gradients", "debugging", {"grad_norm": 32000.0, "grad_norm_ratio": 1e4, "step": 120},
     ["3.2e+04", "1.0e+04", "step 120"]),
    ("loss-not-decreasing", "debugging", {"loss_first": 2.302585, "loss_last": 2.302585, "steps": 50},
     ["2.3026", "50 steps", "ln(10)"]),
    ("ddp-hang", "distributed", {"seconds": 30.0, "ranks": [0, 1], "collective": "all_reduce"},
     ["Ranks 0 and 1", "30.0 s", "`all_reduce`"]),
    ("rank-crashed", "distributed", {"rank": 1, "exit_code": 1, "error": "ValueError: boom"},
     ["Rank 1", "code 1", "ValueError: boom"]),
    ("straggler", "distributed", {"rank": 3, "slowdown": 1.4, "median_step_ms": 250.0}, ["Rank 3", "1.40x", "250 ms"]),
    ("unused-parameters", "distributed", {"unused_parameters": ["head.bias", "aux.weight"]}, ["`head.bias`", "`aux.weight`"]),
    ("accumulation-without-no-sync", "distributed", {"allreduces_per_step": 4, "micro_steps": 4},
     ["4 gradient all-reduces", "4 micro-steps"]),
    ("sampler-epoch-not-set", "distributed", {"epochs": 3}, ["3 epochs"]),
    ("state-dict-mismatch", "checkpointing", {"missing_keys": ["fc.weight"], "unexpected_keys": ["module.fc.weight"]},
     ["1 missing key", "`module.fc.weight`", "`module.` prefix"]),
    ("checkpoint-incomplete", "checkpointing", {"missing": ["optimizer", "scheduler"], "saved": ["model"]},
     ["`optimizer` and `scheduler`", "`model`"]),
    ("nondeterminism", "checkpointing", {"op": "aten::index_add_"}, ["`aten::index_add_`"]),
    ("bad-custom-backward", "autograd", {"function": "MyGelu", "max_abs_error": 0.25}, ["`MyGelu`", "0.25"]),
    ("bad-custom-backward", "autograd", {"expected": 2, "got": 1}, ["1 gradient for 2 forward inputs"]),
    ("shape-mismatch", "module-design", {"mat1_shape": "64x512", "mat2_shape": "256x10"},
     ["(64, 512)", "256 input features", "in_features=512"]),
    ("shape-mismatch", "module-design", {"expected_channels": 3, "got_channels": 1}, ["3 input channels", "receives 1"]),
    ("slow-custom-layer", "module-design", {"module": "MyAttention"}, ["`MyAttention`"]),
]


@pytest.mark.parametrize("sid,sp,values,expected", MEASURED, ids=[f"{m[0]}-{i}" for i, m in enumerate(MEASURED)])
def test_measured_values_are_quoted_with_units(sid, sp, values, expected):
    fr = _report(sid, sp, values=values)
    for text in expected:
        assert text in fr.diagnosis, f"{text!r} not in: {fr.diagnosis}"


def test_measured_values_change_the_ranking_of_fixes():
    activations = _report("high-memory", "memory", values={"peak_gib": 20.0, "activations_gib": 15.0, "optimizer_state_gib": 2.0})
    optimizer = _report("high-memory", "memory", values={"peak_gib": 20.0, "activations_gib": 2.0, "optimizer_state_gib": 15.0})
    assert "autocast" in activations.fixes[0].title
    assert "optimizer state" in optimizer.fixes[0].title


def test_fragmentation_from_a_pasted_oom_puts_expandable_segments_first():
    from torchdoctor.ask import build_report

    text = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total capacity of "
        "79.11 GiB of which 301.56 MiB is free. Including non-PyTorch memory, this process has 78.80 GiB memory in "
        "use. Of the allocated memory 76.50 GiB is allocated by PyTorch, and 1.60 GiB is reserved by PyTorch but "
        "unallocated."
    )
    fr = next(r for r in build_report(text).reports if r.specialist == "memory")
    assert "512 MiB" in fr.diagnosis and "1.60 GiB" in fr.diagnosis and "fragmentation" in fr.diagnosis
    assert "expandable_segments:True" in fr.fixes[0].snippet


# Values of the wrong kind, or absent, must not crash a handler nor leak into the text.
ODD_VALUES = [
    {},
    {k: None for k in ("requested_gib", "step", "rank", "scale", "parameters", "missing_keys", "first_bad_module")},
    {k: "n/a" for k in ("requested_gib", "slope_mib_per_step", "peak_gib", "data_wait_fraction", "grad_norm", "seconds")},
    {k: [] for k in ("missing_keys", "unexpected_keys", "parameters", "ranks", "calls", "modules", "mat1_shape")},
    {k: True for k in ("requested_gib", "step", "rank", "exit_code", "lr_steps_planned", "micro_steps")},
]
CODE_SPAN = re.compile(r"`[^`]*[\s(\[][^`]*`")
ARTEFACTS = re.compile(r"\bNone\b|[{}]|(?<!--probe )\bnan\b|\bn/a\b")


@pytest.mark.parametrize("values", ODD_VALUES, ids=["empty", "none", "strings", "empty-lists", "bools"])
def test_missing_or_odd_values_leave_no_artefacts(values):
    for sid, sp in PAIRS:
        fr = _report(sid, sp, values=values, source="probe")
        for text in [t for t in _texts(fr) if t]:
            if "\n" in text:  # a next step that carries a code block
                text = text.split("\n", 1)[0]
            text = CODE_SPAN.sub("", text)  # quoted code (not a single interpolated name) may say None
            assert not ARTEFACTS.search(text), f"{sp}/{sid}: {text}"


def test_ask_target_sentence_never_becomes_a_script_name():
    fr = consult("memory", [_symptom("memory-growth")], command="ask", target="memory grows in train.py")
    assert all("memory grows" not in step for step in fr.next_steps)
    assert any("train.py" in step for step in fr.next_steps)


def test_located_symptom_names_its_own_file_in_commands():
    loc = Location("src/model/train_gpt.py", 10, code="x")
    fr = consult("profiling", [_symptom("host-sync", location=loc)], command="check", target="src")
    assert any("src/model/train_gpt.py" in step for step in fr.next_steps)


def test_static_rule_code_is_used_in_the_next_check_command():
    s = catalog.make_symptom(
        "sampler-epoch-not-set",
        evidence=[Evidence(kind="static", summary="no set_epoch", source="TD301", location=LOCATION)],
        location=LOCATION,
    )
    fr = consult("distributed", [s], command="check", target="train.py")
    assert any("torchdoctor check --select TD301 train.py" in step for step in fr.next_steps)


# -- the text itself --------------------------------------------------------


def _all_reports():
    for sid, sp in PAIRS:
        for kw in ({}, {"location": LOCATION}, {"contexts": ("amp", "distributed", "eval")}):
            yield sid, sp, _report(sid, sp, **kw)


def _code_only(snippet: str) -> str:
    """The snippet without comments and string literals' comment-like text."""
    tokens = tokenize.generate_tokens(io.StringIO(snippet).readline)
    return " ".join(t.string for t in tokens if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE))


def test_every_python_snippet_parses():
    for sid, sp, fr in _all_reports():
        for f in fr.fixes:
            if f.snippet and not is_shell(f.snippet):
                try:
                    ast.parse(f.snippet)
                except SyntaxError as exc:
                    pytest.fail(f"{sp}/{sid} '{f.title}': {exc}\n{f.snippet}")


def test_snippets_use_current_apis():
    for sid, sp, fr in _all_reports():
        for f in fr.fixes:
            if not f.snippet or is_shell(f.snippet):
                continue
            code = _code_only(f.snippet)
            assert "torch . cuda . amp" not in code, f"{sp}/{sid}: {f.snippet}"
            assert "set_to_none = True" not in code, f"{sp}/{sid}: {f.snippet}"
            if "weights_only = False" in code:
                assert "trust" in f"{f.why} {f.applies_when} {f.snippet}", f"{sp}/{sid} unsafe load without a reason"


def test_advice_mentions_no_deprecated_settings_as_a_fix():
    for sid, sp, fr in _all_reports():
        for f in fr.fixes:
            snippet = f.snippet or ""
            assert not snippet.startswith("NCCL_ASYNC_ERROR_HANDLING"), f"{sp}/{sid}"
            assert "sdp_kernel(" not in snippet, f"{sp}/{sid}: torch.backends.cuda.sdp_kernel is deprecated"
            assert "cache_size_limit" not in snippet, f"{sp}/{sid}: the name is recompile_limit now"


def test_fixes_are_unique_within_a_report():
    for sid, sp, fr in _all_reports():
        titles = [f.title for f in fr.fixes]
        assert len(titles) == len(set(titles)), f"{sp}/{sid}: {titles}"
    # several symptoms for one specialist: shared fixes appear once
    many = [_symptom(s) for s in ("oom", "high-memory", "memory-growth", "fragmentation")]
    fr = consult("memory", many)
    titles = [f.title for f in fr.fixes]
    assert len(titles) == len(set(titles))


def test_fixes_state_how_to_verify():
    for sid, sp, fr in _all_reports():
        for f in fr.fixes:
            assert f.title.strip() and f.why.strip() and f.verify.strip(), f"{sp}/{sid}"


def test_expand_advice_is_precise_not_a_ban():
    fr = _report("expand-in-forward", "distributed", location=LOCATION)
    text = " ".join(_texts(fr)).lower()
    assert "never use .expand" not in text
    assert "in place" in text and "fine" in text
    assert "repeat() copies" in " ".join(fr.next_steps)


def test_unused_parameters_prefers_fixing_the_model_over_find_unused():
    fr = _report("unused-parameters", "distributed")
    titles = [f.title for f in fr.fixes]
    assert "find_unused_parameters" in titles[-1]
    assert "slower" in fr.fixes[-1].why
    assert "static_graph=True" in fr.fixes[1].snippet and fr.fixes[1].applies_when


def test_bf16_advice_has_no_scaler_and_fp16_advice_does():
    bf16 = _report("scaler-with-bf16", "mixed-precision").fixes[0].snippet
    fp16 = _report("fp16-without-scaler", "mixed-precision").fixes[0].snippet
    assert "GradScaler" not in _code_only(bf16)
    assert 'GradScaler("cuda")' in fp16 and fp16.index("unscale_") < fp16.index("clip_grad_norm_")


def test_unsafe_load_explains_what_to_do_with_full_checkpoints():
    fr = _report("unsafe-load", "checkpointing", values={"unsupported_global": "__main__.TrainConfig"})
    assert "`__main__.TrainConfig`" in fr.diagnosis
    snippets = " ".join(f.snippet or "" for f in fr.fixes)
    assert "add_safe_globals" in snippets and "map_location" in snippets


# -- the advice works: run the code it recommends --------------------------


def test_a_plain_checkpoint_loads_into_the_compiled_model_it_is_advised_for():
    import torch

    plain = torch.nn.Linear(4, 2)
    compiled = torch.compile(torch.nn.Linear(4, 2))  # keys `_orig_mod.weight`: the model carries the prefix
    fr = _report("state-dict-mismatch", "checkpointing",
                 values={"missing_keys": ["_orig_mod.weight", "_orig_mod.bias"], "unexpected_keys": ["weight", "bias"]})
    fix = fr.fixes[0]
    assert fix.title == "Load into the module inside the wrapper, `model._orig_mod`"
    scope = {"model": compiled, "state": plain.state_dict()}
    exec(fix.snippet, scope)  # strict load_state_dict into the wrapped module
    assert torch.equal(compiled._orig_mod.weight, plain.weight)
    ddp = _report("state-dict-mismatch", "checkpointing",
                  values={"missing_keys": ["module.fc.weight"], "unexpected_keys": ["fc.weight"]})
    assert ddp.fixes[0].snippet.startswith("model.module.load_state_dict(state)")


def test_recommended_checkpoint_round_trips_under_weights_only(tmp_path):
    import random

    import torch

    from torchdoctor.specialists import advice

    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=10)
    optimizer.step()
    scheduler.step()
    scaler = torch.amp.GradScaler("cpu")
    scope = {"torch": torch, "random": random}
    exec(advice.snippet("checkpointing", "save"), scope)  # defines save_checkpoint
    path = str(tmp_path / "ckpt.pt")
    scope["save_checkpoint"](path, model, optimizer, scheduler, scaler, 3, 30)
    model2 = torch.nn.Linear(4, 2)
    optimizer2 = torch.optim.AdamW(model2.parameters(), lr=0.1)
    scheduler2 = torch.optim.lr_scheduler.OneCycleLR(optimizer2, max_lr=0.1, total_steps=10)
    scope.update(path=path, model=model2, optimizer=optimizer2, scheduler=scheduler2, scaler=torch.amp.GradScaler("cpu"))
    exec(advice.snippet("checkpointing", "resume"), scope)  # torch.load(..., weights_only=True)
    assert scope["start_epoch"] == 4
    assert torch.equal(model2.weight, model.weight)
    assert optimizer2.state_dict()["state"], "optimizer state was not restored"
    assert scheduler2.get_last_lr() == scheduler.get_last_lr()


def test_recommended_custom_function_passes_gradcheck():
    import torch

    from torchdoctor.specialists import advice

    scope = {"torch": torch}
    exec(advice.snippet("autograd", "function").split("\nout = ")[0], scope)  # rules/data/advice/<specialist>.toml
    x = torch.randn(5, dtype=torch.double, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: scope["ScaledTanh"].apply(t, 2.0), (x,))


def test_recommended_decay_groups_separate_biases_and_norms():
    import torch
    from torch import nn

    from torchdoctor.specialists import advice

    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2))
    scope = {"torch": torch, "model": model}
    exec(advice.snippet("mixed-precision", "decay-groups"), scope)
    decay, no_decay = scope["optimizer"].param_groups
    assert len(decay["params"]) == 2 and len(no_decay["params"]) == 4
    assert no_decay["weight_decay"] == 0.0


def test_recommended_bf16_loop_runs_on_cpu():
    import torch
    from torch import nn

    from torchdoctor.specialists import advice

    model = nn.Linear(4, 2)
    scope = {
        "torch": torch,
        "model": model,
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
        "criterion": nn.CrossEntropyLoss(),
        "loader": [(torch.randn(3, 4), torch.tensor([0, 1, 0]))],
    }
    before = model.weight.detach().clone()
    exec(advice.snippet("mixed-precision", "bf16-loop").replace('device_type="cuda"', 'device_type="cpu"'), scope)
    assert not torch.equal(before, model.weight)


# -- JSON ------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "OOM after a few batches and memory grows every step",
        "loss goes nan with amp after 300 steps",
        "training is slow, gpu util only 30%",
        "stuck at allreduce with DDP on 8 GPUs",
        "RuntimeError: Error(s) in loading state_dict for Net: Missing key(s) in state_dict: \"fc.weight\". "
        "Unexpected key(s) in state_dict: \"module.fc.weight\".",
    ],
)
def test_ask_report_json_validates(text, validate_report):
    from torchdoctor.ask import build_report

    report = build_report(text)
    assert report.reports
    validate_report(report.to_dict())


def test_report_with_every_symptom_validates(validate_report):
    from torchdoctor.diagnosis import diagnose

    symptoms = [_symptom(sid, location=LOCATION if i % 2 else None) for i, sid in enumerate(SYMPTOMS)]
    report = diagnose(Report(command="check", target="train.py", symptoms=symptoms, contexts=["amp", "distributed"]))
    assert {r.specialist for r in report.reports} == set(MODULES)
    validate_report(report.to_dict())


def test_memory_growth_of_plain_tensors_is_not_blamed_on_autograd_graphs():
    from torchdoctor.model import Evidence, Location
    from torchdoctor.rules.catalog import make_symptom
    from torchdoctor.specialists import consult

    loc = Location("train.py", 15, code="history.append(torch.full((512, 1024), loss.item()))")
    for holds in (False, "False"):  # a probe's bool, or a rule's text
        s = make_symptom(
            "memory-growth",
            location=loc,
            evidence=[Evidence("probe", "history grows", values={"variable": "history", "holds_graph": holds, "slope_mib_per_step": 2.0})],
        )
        fr = consult("memory", [s], target="train.py")
        assert "keeps adding tensors to `history`" in fr.diagnosis
        assert "autograd graph" not in fr.diagnosis
        assert fr.fixes[0].location == loc and ".item()" in fr.fixes[0].snippet
