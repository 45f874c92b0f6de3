"""The error-signature catalogue (rules/data/signatures.toml): every entry is well formed, matches
its own real example, routes where its symptoms say, and the rich ones pull out their values."""

from __future__ import annotations

import pytest
import tomllib

from tests.conftest import ROOT
from torchdoctor import triage
from torchdoctor.ask import build_report
from torchdoctor.rules import catalog

ROWS = tomllib.loads((ROOT / "rules" / "data" / "signatures.toml").read_text())["signature"]
BY_ID = {s.id: s for s in triage.signatures()}


def test_catalogue_is_large_and_ids_are_unique():
    ids = [r["id"] for r in ROWS]
    assert len(ids) >= 60
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("row", ROWS, ids=[r["id"] for r in ROWS])
def test_signature_is_well_formed(row):
    for key in ("id", "needle", "pattern", "symptoms", "priority", "summary", "example", "origin"):
        assert row.get(key) not in (None, "", []), key
    for sid in row["symptoms"]:
        catalog.symptom(sid)  # raises on an id missing from symptoms.toml
    known_contexts = {c["id"] for c in catalog.routing()["context"]}
    assert set(row.get("contexts", ())) <= known_contexts
    group_names = set(BY_ID[row["id"]].regex.groupindex)
    assert set(row.get("units", {})) <= group_names, "a unit names a group the pattern lacks"
    assert row.get("derive") is None or row["derive"] in triage._DERIVE


@pytest.mark.parametrize("row", ROWS, ids=[r["id"] for r in ROWS])
def test_example_matches_its_own_pattern(row):
    sig = BY_ID[row["id"]]
    text = triage.clean_log(row["example"]).text
    assert sig.needle in text, "the needle must be a literal part of the message"
    assert triage.search(sig, text) is not None


@pytest.mark.parametrize("row", ROWS, ids=[r["id"] for r in ROWS])
def test_example_routes_to_its_first_symptom(row):
    """The example, pasted alone, is read by this signature (or one naming the same primary
    symptom, e.g. a more complete form of the message) and routed accordingly."""
    sig = BY_ID[row["id"]]
    hits = triage.find_hits(triage.clean_log(row["example"]))
    top = hits[0]
    reading = triage.read_match(top.sig, top.match)
    own = triage.read_match(sig, triage.search(sig, triage.clean_log(row["example"]).text))
    assert top.sig.id == sig.id or reading.symptoms[0] == own.symptoms[0], [h.sig.id for h in hits]
    report = build_report(row["example"])
    assert report.question is None
    expected_first = catalog.symptom(own.symptoms[0]).route[0]
    route = [step.specialist for step in report.route]
    assert route[0] == expected_first, (route, [s.id for s in report.symptoms])


def values_of(text: str, source: str | None = None) -> dict:
    symptoms, _, _ = triage.read_errors(text)
    for s in symptoms:
        for ev in s.evidence:
            if source is None or ev.source == source:
                return ev.values
    raise AssertionError(f"no evidence from {source}")


def test_cuda_oom_current_format_values():
    text = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        "23.64 GiB of which 1.12 GiB is free. Including non-PyTorch memory, this process has 22.50 GiB memory in use. "
        "Of the allocated memory 18.20 GiB is allocated by PyTorch, and 3.90 GiB is reserved by PyTorch but unallocated."
    )
    v = values_of(text, "cuda-oom")
    assert v["requested_gib"] == 2.0 and v["total_gib"] == 23.64 and v["free_gib"] == 1.12
    assert v["process_in_use_gib"] == 22.5 and v["allocated_gib"] == 18.2
    assert v["reserved_unallocated_gib"] == 3.9 and v["reserved_gib"] == pytest.approx(22.1)
    assert v["fragmented"] is True  # 3.9 GiB reserved-but-free >= the 2 GiB asked for
    ids = [s.id for s in triage.read_errors(text)[0]]
    assert ids[:2] == ["oom", "fragmentation"]


def test_cuda_oom_without_fragmentation_and_with_sizes_in_mib():
    text = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total capacity of "
        "79.11 GiB of which 301.56 MiB is free. Process 2752205 has 78.80 GiB memory in use. Of the allocated memory "
        "76.50 GiB is allocated by PyTorch, and 120.54 MiB is reserved by PyTorch but unallocated."
    )
    v = values_of(text, "cuda-oom")
    assert v["requested_gib"] == 0.5 and v["free_gib"] == pytest.approx(0.2945, abs=1e-4)
    assert v["reserved_unallocated_gib"] == pytest.approx(0.1177, abs=1e-4)
    assert "fragmented" not in v
    assert "fragmentation" not in [s.id for s in triage.read_errors(text)[0]]


def test_cuda_oom_legacy_format_values():
    text = (
        "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 23.69 GiB total capacity; "
        "19.80 GiB already allocated; 1.21 GiB free; 21.10 GiB reserved in total by PyTorch)"
    )
    v = values_of(text, "cuda-oom-legacy")
    assert v["requested_gib"] == 2.0 and v["allocated_gib"] == 19.8 and v["reserved_gib"] == 21.1
    assert v["reserved_unallocated_gib"] == pytest.approx(1.3)
    assert "fragmented" not in v  # 1.3 GiB spare < 2 GiB asked for


def test_recompile_limit_values_from_current_multiline_log():
    text = (ROOT / "tests" / "fixtures" / "triage" / "compile_recompiles_graph_breaks.log").read_text()
    v = values_of(text, "dynamo-recompile-limit")
    assert v["limit_name"] == "recompile_limit" and v["limit"] == 2
    assert v["function"] == "f" and v["function_location"].endswith("comp.py:3")
    assert v["last_reason"] == "tensor 'x' size mismatch at index 0. expected 3, actual 4"
    assert (v["reason_kind"], v["guard_tensor"], v["guard_dim"], v["expected_size"], v["actual_size"]) == (
        "size",
        "x",
        0,
        3,
        4,
    )


def test_recompile_limit_values_from_one_line_form():
    text = "torch._dynamo hit config.recompile_limit (8) function: 'forward'. Last reason: tensor 'x' size mismatch at index 1. expected 128, actual 131"
    v = values_of(text, "dynamo-recompile-limit")
    assert v["function"] == "forward" and v["guard_dim"] == 1 and v["actual_size"] == 131


def test_graph_break_values():
    text = (ROOT / "tests" / "fixtures" / "triage" / "compile_recompiles_graph_breaks.log").read_text()
    log = triage.clean_log(text)
    sig = BY_ID["dynamo-graph-break"]
    v = triage.read_match(sig, triage.search(sig, log.text)).values
    assert v["file"].endswith("comp.py") and v["line"] == 11
    assert v["reason"] == "Data-dependent branching"


@pytest.mark.parametrize(
    "keys,prefix,side,source",
    [
        ('Missing key(s) in state_dict: "fc.weight", "fc.bias". \n\tUnexpected key(s) in state_dict: "module.fc.weight", "module.fc.bias". ', "module.", "checkpoint", "DistributedDataParallel / DataParallel"),
        ('Missing key(s) in state_dict: "fc.weight", "fc.bias". \n\tUnexpected key(s) in state_dict: "_orig_mod.fc.weight", "_orig_mod.fc.bias". ', "_orig_mod.", "checkpoint", "torch.compile"),
        ('Missing key(s) in state_dict: "module.fc.weight", "module.fc.bias". \n\tUnexpected key(s) in state_dict: "fc.weight", "fc.bias". ', "module.", "model", "DistributedDataParallel / DataParallel"),
        ('Missing key(s) in state_dict: "head.weight". \n\tUnexpected key(s) in state_dict: "backbone.head.weight". ', "backbone.", "checkpoint", None),
    ],
)
def test_state_dict_prefix_explains_the_keys(keys, prefix, side, source):
    text = f"RuntimeError: Error(s) in loading state_dict for Net:\n\t{keys}"
    v = values_of(text, "state-dict-keys")
    assert v["prefix"] == prefix and v["prefix_side"] == side
    assert v.get("prefix_source") == source
    assert v["model_class"] == "Net" and v["missing_count"] >= 1


def test_state_dict_without_a_prefix_and_with_a_size_mismatch():
    text = (
        'RuntimeError: Error(s) in loading state_dict for Net:\n\tMissing key(s) in state_dict: "fc.bias". \n'
        "\tsize mismatch for fc.weight: copying a param with shape torch.Size([10, 512]) from checkpoint, "
        "the shape in current model is torch.Size([100, 512])."
    )
    v = values_of(text, "state-dict-keys")
    assert "prefix" not in v
    assert v["missing_keys"] == ["fc.bias"] and v["param"] == "fc.weight"
    assert v["checkpoint_shape"] == [10, 512] and v["model_shape"] == [100, 512] and v["size_mismatch"]


def test_matmul_shapes_name_the_features():
    v = values_of("RuntimeError: mat1 and mat2 shapes cannot be multiplied (32x512 and 256x10)")
    assert v["mat1_shape"] == [32, 512] and v["mat2_shape"] == [256, 10]
    assert (v["input_features"], v["expected_features"], v["out_features"]) == (512, 256, 10)


def test_nccl_watchdog_values_and_rank_prefix():
    text = "[rank3]:[E1206 18:44:12.755262105 ProcessGroupNCCL.cpp:607] [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7753, OpType=_REDUCE_SCATTER_BASE, NumelIn=544997376, NumelOut=68124672, Timeout(ms)=600000) ran for 600089 milliseconds before timing out."
    v = values_of(text, "nccl-watchdog-timeout")
    assert (v["rank"], v["seq_num"], v["op_type"], v["timeout_ms"], v["ran_ms"]) == (3, 7753, "_REDUCE_SCATTER_BASE", 600000, 600089)
    assert v["timeout_s"] == 600.0 and v["numel_out"] == 68124672


def test_nccl_watchdog_old_format_without_numel():
    text = "[E ProcessGroupNCCL.cpp:737] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=469508, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1802212 milliseconds before timing out."
    v = values_of(text, "nccl-watchdog-timeout")
    assert v["seq_num"] == 469508 and v["timeout_s"] == 1800.0 and "numel_in" not in v


def test_dataloader_worker_pid_and_signal():
    v = values_of("RuntimeError: DataLoader worker (pid 12345) is killed by signal: Killed. ")
    assert v["worker_pid"] == 12345 and v["signal"] == "Killed"
    symptoms, _, _ = triage.read_errors("RuntimeError: DataLoader worker (pid 12345) is killed by signal: Segmentation fault. ")
    assert symptoms[0].id == "dataloader-worker-error"


def test_dtype_messages_split_amp_from_plain_dtype_errors():
    amp, _, _ = triage.read_errors("RuntimeError: expected scalar type Half but found Float")
    plain, _, _ = triage.read_errors("RuntimeError: expected scalar type Long but found Float")
    assert amp[0].id == "amp-dtype-mismatch" and plain[0].id == "dtype-mismatch"
    device, _, _ = triage.read_errors("RuntimeError: Input type (torch.cuda.FloatTensor) and weight type (torch.FloatTensor) should be the same")
    half, _, _ = triage.read_errors("RuntimeError: Input type (torch.cuda.HalfTensor) and weight type (torch.cuda.FloatTensor) should be the same")
    assert device[0].id == "device-mismatch" and half[0].id == "amp-dtype-mismatch"
    assert device[0].evidence[0].values["input_device"] == "cuda"


def test_device_mismatch_devices():
    v = values_of("RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!")
    assert v["devices"] == ["cuda:0", "cpu"]


def test_ddp_unused_parameters_names_from_real_log():
    text = (ROOT / "tests" / "fixtures" / "triage" / "ddp_unused_parameters.log").read_text()
    v = values_of(text, "ddp-unfinished-reduction")
    assert v["unused_parameters"] == ["b.bias", "b.weight"] and v["unused_parameter_indices"] == [2, 3]
    assert v["rank"] in (0, 1)


def test_collective_mismatch_values_from_real_log():
    text = (ROOT / "tests" / "fixtures" / "triage" / "ddp_collective_mismatch.log").read_text()
    symptoms, contexts, telling = triage.read_errors(text)
    assert symptoms[0].id == "collective-mismatch" and "distributed" in contexts
    v = symptoms[0].evidence[0].values
    assert {v["op_type"], v["other_op_type"]} == {"ALLREDUCE", "BROADCAST"}
    assert {v["rank"], v["other_rank"]} == {0, 1}


def test_torchrun_root_cause_sigkill_suggests_host_oom():
    text = (ROOT / "tests" / "fixtures" / "triage" / "torchrun_rank_sigkill.log").read_text()
    symptoms, contexts, _ = triage.read_errors(text)
    ids = [s.id for s in symptoms]
    assert ids[0] == "rank-crashed" and "host-oom" in ids
    root = values_of(text, "torchrun-child-failed")
    assert (root["rank"], root["exitcode"], root["signal"]) == (1, -9, "SIGKILL")


def test_nccl_error_kind():
    v = values_of("torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:268, remote process exited or there was a network error, NCCL version 2.21.5")
    assert v["nccl_error_kind"] == "remote" and v["nccl_version"] == "2.21.5"
    symptoms, _, _ = triage.read_errors("torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:268, remote process exited or there was a network error, NCCL version 2.21.5")
    assert symptoms[0].id == "rank-crashed"


def test_needle_prefilter_skips_signatures_whose_needle_is_absent(monkeypatch):
    compiled: list[str] = []
    original = triage._compile.__wrapped__

    def spy(pattern):
        compiled.append(pattern)
        return original(pattern)

    monkeypatch.setattr(triage, "_compile", spy)
    triage.read_errors("my loss goes nan after a few hundred steps with bf16")
    assert compiled == []
    triage.read_errors("RuntimeError: mat1 and mat2 shapes cannot be multiplied (32x512 and 256x10)")
    assert compiled == [BY_ID["matmul-shapes"].pattern]


def test_a_number_past_float16s_range_is_fp16_overflow_and_other_types_are_not():
    """c10/util/TypeCast.cpp's report_overflow names the target type: only float16 is the fp16 overflow."""
    report = build_report("RuntimeError: value cannot be converted to type c10::Half without overflow")
    assert [s.id for s in report.symptoms][:1] == ["fp16-overflow"]
    assert report.route[0].specialist == catalog.symptom("fp16-overflow").route[0]
    other = triage.find_hits(triage.clean_log("RuntimeError: value cannot be converted to type int8_t without overflow"))
    assert "fp16-fill-overflow" not in [h.sig.id for h in other]
