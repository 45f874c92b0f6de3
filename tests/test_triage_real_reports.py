"""Misreadings found on real problem reports (bench/realcode/ask), each fixed for its whole class.

The texts here are written for these tests (not taken from the evaluation set); the error lines
are PyTorch's own messages.
"""

from __future__ import annotations

import pytest

from torchdoctor.ask import build_report
from torchdoctor.triage import triage


def first_route(text: str) -> str | None:
    report = build_report(text)
    assert report.question is None, f"asked {report.question.id!r} instead of routing"
    return report.route[0].specialist


def symptom_ids(text: str) -> list[str]:
    return [s.id for s in triage(text).symptoms]


@pytest.mark.parametrize(
    "text,specialist",
    [
        # how-to and topic questions go to the topic's specialist, not to a generic question
        ("How can I freeze the weights of the backbone while fine-tuning?", "module-design"),
        ("freezing the first few layers of a pretrained resnet, what is the right way", "module-design"),
        ("how do I change the number of output classes of a pretrained model's classifier", "module-design"),
        ("my registered buffer stays on the cpu after model.cuda()", "module-design"),
        ("how do I tell autograd to use my own gradient function for an approximated op", "autograd"),
        ("GPU memory is not freed after inference, even after del and empty_cache", "memory"),
        ("nvidia-smi still shows 3 GB held by my process after I delete the model", "memory"),
    ],
)
def test_topic_and_how_to_questions_reach_the_topic_specialist(text, specialist):
    assert first_route(text) == specialist


@pytest.mark.parametrize(
    "text",
    [
        "the model's performance on the test set is much worse than in the paper",
        "after loading my checkpoint the performance is bad, accuracy dropped to 40%",
    ],
)
def test_performance_that_means_accuracy_is_not_read_as_speed(text):
    assert "slow-step" not in symptom_ids(text)


def test_performance_of_the_gpu_is_still_speed():
    assert first_route("how do I improve GPU performance of my training loop") == "profiling"


@pytest.mark.parametrize(
    "text",
    [
        "with DeepSpeed ZeRO-3 on 8 GPUs, GPU 0 uses far more memory than the other GPUs",
        "DDP memory is unbalanced: rank 0's card holds twice the memory of the others",
        "torchrun starts 4 processes but only one GPU is used, the other GPUs are idle",
        "multi node job on slurm dies with an NCCL error after two hours",
    ],
)
def test_a_stated_symptom_on_several_gpus_is_routed_not_asked(text):
    assert first_route(text) == "distributed"


def test_a_bare_multi_gpu_setup_request_still_gets_its_question():
    report = build_report("setup distributed training")
    assert report.question is not None and report.question.specialist == "distributed"


USER_GRAPH_CUT = """\
Traceback (most recent call last):
  File "/home/me/proj/train.py", line 71, in <module>
    loss.backward()
  File "/opt/venv/lib/python3.11/site-packages/torch/_tensor.py", line 626, in backward
    torch.autograd.backward(
RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn
"""


@pytest.mark.parametrize(
    "text",
    [
        USER_GRAPH_CUT,
        "my loss has no grad_fn so backward fails, I compute it from model outputs with numpy",
        "after loss.backward() all my parameters have grad None and nothing updates",
        "RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn\n"
        "it happens when I call backward on the dice loss I wrote",
    ],
)
def test_a_graph_cut_in_the_users_own_code_goes_to_debugging(text):
    assert first_route(text) == "debugging"


@pytest.mark.parametrize(
    "text",
    [
        "my custom autograd.Function returns None from backward so x.grad is None",
        "RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn\n"
        "the loss comes out of my RoundSTE autograd Function with a custom backward",
    ],
)
def test_a_graph_cut_through_a_named_custom_function_goes_to_autograd(text):
    assert first_route(text) == "autograd"


def test_a_busy_gpu_is_not_read_as_an_idle_one():
    ids = symptom_ids("nvidia-smi shows 100% util on the GPU but every step still takes 2 seconds")
    assert "low-gpu-util" not in ids and ids[0] == "slow-step"


@pytest.mark.parametrize(
    "text",
    [
        "CUDA OOM after ~200 iterations, the first epoch was fine",
        "training runs out of memory after several epochs although it starts well",
    ],
)
def test_an_oom_after_a_while_puts_the_leak_hypothesis_first(text):
    assert symptom_ids(text)[0] == "memory-growth"


@pytest.mark.parametrize(
    "text",
    [
        "the model gives different results every time at inference on the same image",
        "same input, different predictions on every run in evaluation; my forward uses dropout",
    ],
)
def test_randomness_at_inference_is_eval_mode_before_seeds(text):
    assert symptom_ids(text)[0] == "eval-mode-missing"
    assert first_route(text) == "debugging"


def test_randomness_with_seeds_set_is_still_reproducibility():
    assert first_route("same seed but different validation accuracy on each run") == "checkpointing"


WORKER_TRACEBACK = """\
Traceback (most recent call last):
  File "/home/me/proj/train.py", line 52, in <module>
    for images, targets in loader:
  File "/opt/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", line 701, in __next__
    data = self._next_data()
  File "/opt/venv/lib/python3.11/site-packages/torch/_utils.py", line 705, in reraise
    raise exception
RuntimeError: Caught RuntimeError in DataLoader worker process 0.
Original Traceback (most recent call last):
  File "/opt/venv/lib/python3.11/site-packages/torch/utils/data/_utils/worker.py", line 349, in _worker_loop
    data = fetcher.fetch(index)
  File "/opt/venv/lib/python3.11/site-packages/torch/utils/data/_utils/fetch.py", line 55, in fetch
    return self.collate_fn(data)
  File "/home/me/proj/data/batching.py", line 33, in collate
    images = torch.stack(images)
RuntimeError: stack expects each tensor to be equal size, but got [3, 224, 224] at entry 0 and [3, 256, 256] at entry 1
"""


def test_the_users_last_frame_is_named_even_inside_a_dataloader_workers_traceback():
    report = build_report(WORKER_TRACEBACK)
    symptom = report.symptoms[0]
    assert symptom.id == "shape-mismatch"
    assert symptom.location is not None
    assert (symptom.location.path, symptom.location.line) == ("/home/me/proj/data/batching.py", 33)
    assert symptom.location.code == "images = torch.stack(images)"
    assert "batching.py" in report.reports[0].diagnosis


def test_the_users_frame_skips_torch_and_site_packages_frames():
    report = build_report(USER_GRAPH_CUT)
    assert str(report.symptoms[0].location) == "/home/me/proj/train.py:71"


def test_unequal_samples_in_a_batch_get_a_padding_collate_fn_not_in_features():
    report = build_report(WORKER_TRACEBACK)
    fixes = report.reports[0].fixes
    first = fixes[0]
    assert "collate" in first.title.lower() and "pad" in first.title.lower()
    assert "pad_sequence" in (first.snippet or "")
    assert not any("in_features" in (f.snippet or "") or "Linear" in (f.snippet or "") for f in fixes)


WEIGHTS_ONLY = """\
Traceback (most recent call last):
  File "eval.py", line 18, in <module>
    ckpt = torch.load("runs/best.pt")
  File "/opt/venv/lib/python3.11/site-packages/torch/serialization.py", line 1470, in load
    raise pickle.UnpicklingError(_get_wo_message(str(e))) from None
_pickle.UnpicklingError: Weights only load failed. This file can still be loaded, to do so you have two options, \
do those steps only if you trust the source of the checkpoint.
\tWeightsUnpickler error: Unsupported global: GLOBAL config.TrainConfig was not an allowed global by default. \
Please use `torch.serialization.add_safe_globals([TrainConfig])` or the \
`torch.serialization.safe_globals([TrainConfig])` context manager to allowlist this global if you trust this class/function.
"""


def test_a_failed_weights_only_load_is_not_told_to_repeat_the_call_that_failed():
    report = build_report(WEIGHTS_ONLY)
    advice = report.reports[0]
    assert report.route[0].specialist == "checkpointing"
    snippets = [f.snippet or "" for f in advice.fixes]
    assert not any("weights_only=True" in s for s in snippets)
    assert "add_safe_globals([TrainConfig])" in snippets[0]
    assert any("weights_only=False" in s for s in snippets[1:])
    assert "eval.py" in advice.diagnosis


def test_an_nccl_error_without_a_version_tail_is_still_read():
    text = "RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:260, unhandled cuda error"
    assert symptom_ids(text)[0] == "nccl-error"
    assert first_route(text) == "distributed"


def test_one_word_is_not_two_facts():
    """'restarted' is both a resume word and a jump word; alone it is not 'loss jumps after resuming'."""
    assert "checkpoint-incomplete" not in symptom_ids("one rank died with an NCCL error and the job was not restarted")


@pytest.mark.parametrize(
    "text",
    [
        "torch.compile hits cache_size_limit and then the step is slow",
        "my compiled model keeps hitting the dynamo cache limit",
        "accumulated_cache_size_limit reached with many modules",
    ],
)
def test_compile_limits_and_caches_are_recompiles_for_profiling(text):
    assert "recompile" in symptom_ids(text)
    assert first_route(text) == "profiling"


def test_a_non_resizable_storage_in_a_worker_is_the_same_batching_problem():
    text = WORKER_TRACEBACK.replace(
        "RuntimeError: stack expects each tensor to be equal size, but got [3, 224, 224] at entry 0 and [3, 256, 256] at entry 1",
        "RuntimeError: Trying to resize storage that is not resizable",
    )
    report = build_report(text)
    assert report.route[0].specialist == "module-design"
    assert "pad_sequence" in (report.reports[0].fixes[0].snippet or "")
    assert str(report.symptoms[0].location) == "/home/me/proj/data/batching.py:33"


def test_how_to_freeze_layers_is_answered_not_read_as_a_hang_or_a_bug():
    report = build_report("How can I freeze the weights of the backbone while fine-tuning?")
    ids = [s.id for s in report.symptoms]
    assert ids[0] == "freeze-layers" and "hang" not in ids
    advice = report.reports[0]
    assert "requires_grad_(False)" in (advice.fixes[0].snippet or "")
    assert not advice.fixes[0].title.lower().startswith("unfreeze")


def test_a_training_run_that_freezes_is_still_a_hang():
    assert symptom_ids("training freezes at the start of epoch 2, no error")[0] == "hang"
