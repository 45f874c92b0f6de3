"""Whole pasted logs are read for their most telling line, not their first.

The logs under tests/fixtures/triage/ were produced for real on this machine (torch 2.13 CPU,
torchrun with gloo, TORCH_LOGS for dynamo); the others below are built from real messages.
"""

from __future__ import annotations

import pytest

from tests.conftest import FIXTURES
from torchdoctor import triage
from torchdoctor.ask import build_report

LOGS = FIXTURES / "triage"


def route_of(text: str) -> list[str]:
    return [step.specialist for step in build_report(text).route]


CHAINED = """\
Traceback (most recent call last):
  File "/opt/venv/lib/python3.11/site-packages/torch/serialization.py", line 1487, in load
    with _open_zipfile_reader(opened_file) as opened_zipfile:
RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "resume.py", line 14, in <module>
    state = load_checkpoint(args.ckpt)
  File "resume.py", line 9, in load_checkpoint
    raise RuntimeError(f"could not resume from {path}") from exc
RuntimeError: could not resume from runs/last.pt
"""

WARNING_THEN_ERROR = """\
/opt/venv/lib/python3.11/site-packages/torch/cuda/amp/grad_scaler.py:126: FutureWarning: `torch.cuda.amp.GradScaler(args...)` is deprecated. Please use `torch.amp.GradScaler('cuda', args...)` instead.
  scaler = torch.cuda.amp.GradScaler()
Epoch 3:  45%|####5     | 450/1000 [02:13<02:42,  3.38it/s]
Traceback (most recent call last):
  File "train.py", line 88, in <module>
    scaler.scale(loss).backward()
  File "/opt/venv/lib/python3.11/site-packages/torch/_tensor.py", line 626, in backward
    torch.autograd.backward(
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of 23.64 GiB of which 1.12 GiB is free. Including non-PyTorch memory, this process has 22.50 GiB memory in use. Of the allocated memory 18.20 GiB is allocated by PyTorch, and 3.90 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.
"""

DDP_OOM = """\
[rank1]: Traceback (most recent call last):
[rank1]:   File "/work/train.py", line 61, in <module>
[rank1]:     out = model(x)
[rank1]:   File "/opt/venv/lib/python3.11/site-packages/torch/nn/parallel/distributed.py", line 1643, in forward
[rank1]:     else self._run_ddp_forward(*inputs, **kwargs)
[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 39.38 GiB of which 17.06 MiB is free. Process 4101 has 20.18 GiB memory in use. Process 4102 has 19.16 GiB memory in use. Of the allocated memory 18.52 GiB is allocated by PyTorch, and 123.58 MiB is reserved by PyTorch but unallocated.
[rank0]:[W1104 10:12:01.123456 4242 ProcessGroupNCCL.cpp:1250] Warning: WARNING: process group has NOT been destroyed before we destruct ProcessGroupNCCL.
"""


def test_chained_exception_reads_the_cause_not_the_wrapper():
    symptoms, _, telling = triage.read_errors(CHAINED)
    assert symptoms[0].id == "checkpoint-corrupt"
    assert "PytorchStreamReader" in telling
    assert route_of(CHAINED)[0] == "checkpointing"


def test_warning_before_the_error_does_not_win():
    t = triage.triage(WARNING_THEN_ERROR)
    ids = [s.id for s in t.symptoms]
    assert ids[0] == "oom" and "fragmentation" in ids and "deprecated-amp-api" in ids
    assert t.telling_line.startswith("torch.OutOfMemoryError")
    assert "amp" in t.contexts
    # the progress bar and the frames' file paths are not read as a description
    assert "slow-step" not in ids and "checkpoint-setup" not in ids
    assert route_of(WARNING_THEN_ERROR)[0] == "memory"


def test_ddp_rank_prefixed_oom_routes_distributed_first_and_keeps_the_rank():
    t = triage.triage(DDP_OOM)
    assert t.symptoms[0].id == "oom" and "distributed" in t.contexts
    assert t.symptoms[0].evidence[0].values["rank"] == 1
    assert route_of(DDP_OOM)[:2] == ["distributed", "memory"]


def test_long_log_whose_error_is_near_the_end():
    noise = "".join(f"step {i:5d} | loss {2.3 - i * 1e-4:.4f} | lr 3.0e-04 | 112.4 ms/it\n" for i in range(4000))
    tail = (
        "Traceback (most recent call last):\n"
        '  File "train.py", line 120, in <module>\n'
        "    loss.backward()\n"
        "RuntimeError: one of the variables needed for gradient computation has been modified by an inplace operation: "
        "[torch.cuda.FloatTensor [256, 1024]], which is output 0 of ReluBackward0, is at version 2; expected version 1 instead.\n"
    )
    text = noise + tail
    assert len(text) > 200_000
    t = triage.triage(text)
    assert t.symptoms[0].id == "inplace-modification"
    assert t.symptoms[0].evidence[0].values["tensor_shape"] == [256, 1024]
    assert route_of(text)[:2] == ["debugging", "autograd"]


def test_torchrun_log_names_the_crashed_rank():
    text = (LOGS / "torchrun_rank_raised.log").read_text()
    t = triage.triage(text)
    assert t.symptoms[0].id == "rank-crashed" and "distributed" in t.contexts
    # torchrun's OMP_NUM_THREADS banner ("...optimal performance...") is not a slowness report
    assert "slow-step" not in [s.id for s in t.symptoms]
    assert route_of(text)[0] == "distributed"


@pytest.mark.parametrize(
    "name,first_symptom,first_specialist",
    [
        ("ddp_unused_parameters.log", "unused-parameters", "distributed"),
        ("ddp_collective_mismatch.log", "collective-mismatch", "distributed"),
        ("torchrun_rank_sigkill.log", "rank-crashed", "distributed"),
        ("dataloader_worker_keyerror.log", "dataloader-worker-error", "debugging"),
        ("dataloader_spawn_pickle.log", "dataloader-worker-error", "debugging"),
        ("anomaly_nan_backward.log", "nonfinite-grad", "debugging"),
        ("compile_recompiles_graph_breaks.log", "recompile", "profiling"),
    ],
)
def test_real_logs(name, first_symptom, first_specialist):
    text = (LOGS / name).read_text()
    t = triage.triage(text)
    assert t.kind == "error" and t.symptoms[0].id == first_symptom, [s.id for s in t.symptoms]
    assert route_of(text)[0] == first_specialist


def test_log_prefixes_are_stripped_and_ranks_kept():
    log = triage.clean_log(
        "[rank2]:[E626 06:24:44.903881913 ProcessGroupNCCL.cpp:616] [Rank 2] Watchdog caught collective operation timeout\n"
        "W1121 09:01:55.916000 8727 torch/_dynamo/convert_frame.py:1994] [0/2] torch._dynamo hit config.recompile_limit (8)\n"
        "V1121 09:01:55.887000 8727 torch/_dynamo/guards.py:5396] [0/1] [__recompiles] Recompiling function f in a.py:3\n"
        "plain line\n"
    )
    lines = log.text.split("\n")
    assert lines[0].startswith("[Rank 2] Watchdog")
    assert lines[1].startswith("torch._dynamo hit")
    assert lines[2].startswith("Recompiling function f")
    assert lines[3] == "plain line"
    assert log.ranks == {0: 2}


def test_unknown_traceback_reads_only_the_final_message():
    text = (
        "Traceback (most recent call last):\n"
        '  File "/opt/venv/lib/python3.11/site-packages/torch/utils/checkpoint.py", line 20, in run\n'
        "    x = step()\n"
        "ValueError: loss is nan at step 1200\n"
    )
    t = triage.triage(text)
    ids = [s.id for s in t.symptoms]
    assert ids and ids[0] == "nan-loss"
    assert "checkpoint-setup" not in ids  # 'checkpoint.py' in a frame is not the user's topic


def test_users_own_words_around_a_paste_still_count():
    text = "this only happens with DDP on 8 gpus:\nRuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB"
    t = triage.triage(text)
    assert t.symptoms[0].id == "oom" and "distributed" in t.contexts
    assert route_of(text)[:2] == ["distributed", "memory"]
