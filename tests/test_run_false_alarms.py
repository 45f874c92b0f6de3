"""Healthy scripts written the ways real training code is written must not raise warning-or-worse symptoms
(issue 13): steps through a closure (Lightning, LBFGS), accelerate's wrapped optimizer, Lightning's
checkpoint layout, weight exports in scripts that never resume, graphs that grow with the episode, long
validation without an optimizer step. Each scenario is a real script under tests/fixtures/run/ run
through the CLI."""

from __future__ import annotations

import os

import pytest

from tests.test_run_distributed import dist_run
from tests.test_run_support import assert_sound, diagnosed, line_of, shared_run
from torchdoctor import exitcodes

pytestmark = pytest.mark.slow


def ids(result) -> list[str]:
    return [s["id"] for s in result.report["symptoms"]]


# -- optimizer.step(closure): the gradients exist only once the closure has run ---------------------


def test_a_closure_step_reads_the_gradients_the_closure_made(tmp_path_factory, validate_report):
    result = shared_run(tmp_path_factory, "closure-step", "closure_step.py")
    assert_sound(result, validate_report, exitcodes.OK)
    assert result.run["steps_completed"] == 8
    assert not {"frozen-parameters", "non-differentiable", "unused-parameters"} & set(ids(result)), ids(result)
    assert result.run["measurements"]["nan"]["grad_checks"] >= 1  # the gradients were read, not skipped


@pytest.mark.distributed
@pytest.mark.heavy  # a 2-rank torchrun (~6 s); the quick suite was at 603 s on a clean clone of stop 26 (budget 600)
def test_ddp_with_a_closure_step_has_no_unused_parameters(tmp_path_factory, validate_report):
    result = dist_run(tmp_path_factory, "closure", "-p", "distributed", "--nproc-per-node", "2", "ddp_closure.py")
    assert_sound(result, validate_report, exitcodes.OK)
    assert result.run["steps_completed"] == 5
    assert "unused-parameters" not in ids(result), result.report["symptoms"]


# -- accelerate: the scheduler holds the wrapper, the inner optimizer fires the step hooks ---------


def test_a_scheduler_on_accelerates_wrapped_optimizer_counts_its_steps(tmp_path_factory, validate_report):
    pytest.importorskip("accelerate", reason="accelerate is an optional extra")
    result = shared_run(tmp_path_factory, "accelerate-schedule", "accelerate_schedule.py", timeout=240)
    assert_sound(result, validate_report, exitcodes.OK)
    assert "scheduler-order" not in ids(result), result.report["symptoms"]
    assert result.run["measurements"]["schedule"]["summary"] == (
        "LambdaLR: 6 steps over 6 optimizer steps, every 1 optimizer step")


# -- checkpoints in the frameworks' layouts -------------------------------------------------------


def test_lightnings_checkpoint_is_complete_and_named_by_its_file(tmp_path_factory, validate_report):
    pytest.importorskip("lightning", reason="lightning is an optional extra")
    scratch = tmp_path_factory.mktemp("lightning-root")
    result = shared_run(tmp_path_factory, "lightning-fit", "lightning_fit.py", str(scratch), timeout=240)
    assert_sound(result, validate_report, exitcodes.OK)
    assert result.run["steps_completed"] == 12  # 3 epochs of 4 batches, stepped through Lightning's closure
    assert not {"checkpoint-incomplete", "frozen-parameters", "non-differentiable"} & set(ids(result)), (
        result.report["symptoms"])
    saved = result.run["measurements"]["checkpoint"]
    assert {"model", "optimizer", "scheduler", "epoch", "step"} <= set(saved["last_save_holds"])
    assert "epoch=2-step=12.ckpt" in saved["summary"] and "BytesIO" not in saved["summary"]


def test_a_checkpoint_written_as_several_files_per_step_is_one_checkpoint(tmp_path_factory, validate_report):
    scratch = tmp_path_factory.mktemp("split-checkpoint")
    result = shared_run(tmp_path_factory, "split-checkpoint", "split_checkpoint.py", str(scratch))
    assert_sound(result, validate_report, exitcodes.OK)
    assert result.run["measurements"]["checkpoint"]["saves"] == 12
    assert "checkpoint-incomplete" not in ids(result), result.report["symptoms"]


# -- weight exports in a script that never resumes -----------------------------------------------


def test_best_model_exports_in_a_script_that_never_resumes_are_not_checkpoints(tmp_path_factory, validate_report):
    scratch = tmp_path_factory.mktemp("export-best")
    result = shared_run(tmp_path_factory, "export-best", "export_best.py", str(scratch))
    assert_sound(result, validate_report, exitcodes.OK)
    assert result.run["measurements"]["checkpoint"]["saves"] >= 4  # the saves were seen, and judged exports
    assert "checkpoint-incomplete" not in ids(result), result.report["symptoms"]


def test_weights_only_saves_in_a_script_with_a_resume_path_are_still_incomplete(tmp_path_factory, validate_report):
    scratch = tmp_path_factory.mktemp("resume-untaken")
    result = shared_run(tmp_path_factory, "resume-untaken", "resume_untaken.py", str(scratch))
    assert_sound(result, validate_report, exitcodes.OK)
    incomplete = result.symptoms("checkpoint-incomplete")
    assert len(incomplete) == 1, result.report["symptoms"]
    assert "optimizer" in incomplete[0]["evidence"][0]["values"]["missing"]


# -- a graph that grows with the episode, not across steps ----------------------------------------


def test_a_longer_episode_each_step_is_not_a_memory_leak(tmp_path_factory, validate_report):
    result = shared_run(tmp_path_factory, "growing-episode", "growing_episode.py", "-p", "memory")
    assert_sound(result, validate_report, exitcodes.OK)
    assert result.run["steps_completed"] == 40
    assert result.run["measurements"]["memory"]["scans"] >= 10  # the holders were scanned every step
    assert "memory-growth" not in ids(result), result.report["symptoms"]


# -- the watchdog: progress is any training activity, not only an optimizer step -------------------


@pytest.mark.heavy  # waits out the hang watchdog
def test_long_validation_and_output_without_a_step_are_not_a_hang(tmp_path_factory, validate_report):
    result = shared_run(tmp_path_factory, "long-validation", "long_validation.py", "--hang-timeout", "2")
    assert_sound(result, validate_report, exitcodes.OK)
    assert result.run["stopped"] == "completed"  # 4 s of forwards, then 4 s of output, each past the 2 s limit
    assert result.run["steps_completed"] == 5
    assert "hang" not in ids(result)
    assert not any(name.startswith("heartbeat.") for name in os.listdir(result.run_dir))  # the counters are gone


@pytest.mark.heavy  # waits out the hang watchdog
def test_a_script_that_blocks_after_validation_is_still_a_hang(tmp_path_factory, validate_report):
    result = shared_run(tmp_path_factory, "long-validation-block", "long_validation.py", "--hang-timeout", "2",
                        "--", "--block")
    assert_sound(result, validate_report, exitcodes.SCRIPT_FAILED)
    assert result.run["stopped"] == "hang" and result.run["steps_completed"] == 3
    hang = result.symptoms("hang")
    assert len(hang) == 1 and hang[0]["location"]["line"] == line_of("long_validation.py", "threading.Event().wait()")


# -- a metric module called on the loss is no model under evaluation --------------------------------


def test_a_parameterless_metric_on_the_loss_is_not_evaluation_without_no_grad(tmp_path_factory, validate_report):
    result = shared_run(tmp_path_factory, "metric-on-loss", "metric_on_loss.py")
    assert_sound(result, validate_report, exitcodes.OK)
    assert result.run["steps_completed"] == 20
    assert "eval-without-no-grad" not in ids(result), result.report["symptoms"]


# -- gradients cleared by hand, or zeroed by another loss's optimizer first ---------------------------


@pytest.mark.parametrize("how", ["none", "data", "after"])
def test_gradients_cleared_by_hand_are_no_missing_zero_grad(tmp_path_factory, validate_report, how):
    result = shared_run(tmp_path_factory, f"zeroed-by-hand-{how}", "zeroed_by_hand.py", "--fail-on", "warning",
                        "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    assert result.run["steps_completed"] == 20
    assert "missing-zero-grad" not in ids(result), result.report["symptoms"]


@pytest.mark.parametrize("how", ["simsiam", "straight-through", "td-target", "logging", "dice", "gan", "probe"])
def test_deliberate_stop_gradients_and_logged_values_are_not_cut_off_loss_terms(tmp_path_factory, validate_report,
                                                                                 how):
    result = shared_run(tmp_path_factory, f"detached-{how}", "detached_terms.py", "--fail-on", "error", "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    assert "non-differentiable" not in ids(result), result.report["symptoms"]


def test_a_second_training_phase_with_its_own_optimizer_is_counted_and_healthy(tmp_path_factory, validate_report):
    # the first phase's optimizer stays referenced by its scheduler: the second one takes over after 32 steps
    result = shared_run(tmp_path_factory, "two-phase", "two_phase_optimizers.py", "--fail-on", "warning")
    assert_sound(result, validate_report, exitcodes.OK)
    assert result.run["steps_completed"] == 5 + 80 - 31, result.run
    assert diagnosed(result) == [], result.report["symptoms"]


def test_a_model_saved_whole_while_the_probes_time_it_is_saved_without_their_hooks(tmp_path_factory,
                                                                                  validate_report):
    # the profile window (steps 6-10) is still open: its forward hooks are on the model when it is pickled
    result = shared_run(tmp_path_factory, "save-whole-model", "save_whole_model.py", "--fail-on", "never")
    assert_sound(result, validate_report, exitcodes.OK)
    assert result.run["stopped"] == "completed", result.stderr[-2000:]
    assert "saved RNNModel hooks 0 torchdoctor in the file False" in result.stderr + result.stdout, result.stderr[-2000:]


def test_a_gan_whose_other_loss_runs_first_after_a_step_zeroes_in_time(tmp_path_factory, validate_report):
    # opt_g steps, then the discriminator's backward runs while the generator's gradients are still there;
    # opt_g.zero_grad() clears them before the generator's own backward.
    result = shared_run(tmp_path_factory, "gan-stale-order", "gan_two_optimizers.py", "--fail-on", "warning")
    assert_sound(result, validate_report, exitcodes.OK)
    assert "missing-zero-grad" not in ids(result), result.report["symptoms"]


def test_a_loss_module_with_a_guarded_log_on_saturated_scores_is_finite(tmp_path_factory, validate_report):
    result = shared_run(tmp_path_factory, "loss-module-log-eps", "loss_module_log.py", "--fail-on", "warning",
                        "--", "eps")
    assert_sound(result, validate_report, exitcodes.OK)
    assert not {"nan-loss", "nonfinite-grad", "nonfinite-input"} & set(ids(result)), result.report["symptoms"]


def test_distillation_soft_targets_and_log_of_softmax_are_no_softmax_before_loss(tmp_path_factory,
                                                                                  validate_report):
    result = shared_run(tmp_path_factory, "softmax-healthy-losses", "softmax_healthy_losses.py", "--fail-on", "error")
    assert_sound(result, validate_report, exitcodes.OK)
    assert result.run["steps_completed"] == 12
    assert "softmax-before-loss" not in ids(result), result.report["symptoms"]
    assert not [s for s in result.report["symptoms"] if s["severity"] in ("warning", "error")], ids(result)


def test_an_iteration_sized_steplr_stepped_per_batch_is_healthy(tmp_path_factory, validate_report):
    result = shared_run(tmp_path_factory, "steplr-iterations", "steplr_per_batch.py", "--fail-on", "warning",
                        "--", "iterations")
    assert_sound(result, validate_report, exitcodes.OK)
    assert "scheduler-granularity" not in ids(result), result.report["symptoms"]


@pytest.mark.parametrize("how", ["once", "inline"])
def test_loaders_built_once_or_without_workers_are_not_rebuilt(tmp_path_factory, validate_report, how):
    result = shared_run(tmp_path_factory, f"loader-{how}", "loader_per_epoch.py", "--fail-on", "never", "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    assert result.run["steps_completed"] == 16
    assert "dataloader-rebuilt" not in ids(result), result.report["symptoms"]


@pytest.mark.parametrize("how", ["gan", "freeze"])
def test_eval_mode_on_purpose_is_neither_validation_training_nor_train_not_restored(tmp_path_factory,
                                                                                     validate_report, how):
    # gan: the critic runs in eval mode inside the generator's loss; freeze: the last epochs train in eval mode
    # (frozen dropout/batch norm) without any evaluation before.
    result = shared_run(tmp_path_factory, f"eval-phase-{how}", "eval_phase_steps.py", "--fail-on", "warning",
                        "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    assert result.run["steps_completed"] == 24
    assert not {"backward-in-validation", "eval-mode-missing"} & set(ids(result)), result.report["symptoms"]


def test_a_training_loop_left_in_eval_mode_is_not_backward_in_validation(tmp_path_factory, validate_report):
    result = shared_run(tmp_path_factory, "train-not-restored-not-bv", "train_not_restored_call.py",
                        "--fail-on", "never")
    assert_sound(result, validate_report, exitcodes.OK)
    assert "eval-mode-missing" in ids(result) and "backward-in-validation" not in ids(result), ids(result)


def test_sams_two_steps_are_not_zero_grad_between_micro_steps(tmp_path_factory, validate_report):
    # first_step reads the gradient, moves the weights and zeroes; the second backward is taken at other weights
    result = shared_run(tmp_path_factory, "sam-two-steps", "sam_two_steps.py", "--fail-on", "warning")
    assert_sound(result, validate_report, exitcodes.OK)
    assert result.run["steps_completed"] == 40
    assert result.run["measurements"]["accumulation"]["backwards"] == 80
    assert not {"zero-grad-every-micro-step", "partial-accumulation-dropped"} & set(ids(result)), ids(result)


# -- a history of detached losses is a few bytes a step, not a leak --------------------------------


def test_a_list_of_detached_losses_is_no_memory_growth(tmp_path_factory, validate_report):
    result = shared_run(tmp_path_factory, "loss-history-detach", "loss_history.py", "--fail-on", "warning",
                        "--", "detach")
    assert_sound(result, validate_report, exitcodes.OK)
    assert result.run["steps_completed"] == 120
    assert "memory-growth" not in ids(result), result.report["symptoms"]


def test_the_same_list_holding_graphs_is_memory_growth(tmp_path_factory, validate_report):
    result = shared_run(tmp_path_factory, "loss-history-graph", "loss_history.py", "--fail-on", "never",
                        "--", "graph")
    assert_sound(result, validate_report, exitcodes.OK)
    found = result.symptoms("memory-growth")
    assert len(found) == 1 and found[0]["location"]["line"] == line_of("loss_history.py", "losses.append(loss if")
    assert found[0]["evidence"][0]["values"]["holds_graph"], found[0]["evidence"][0]


@pytest.mark.distributed
@pytest.mark.heavy  # a 2-rank torchrun (~5 s); the quick suite is at its 10-minute budget
def test_a_schedule_that_switches_sync_back_on_for_its_last_micro_step_is_healthy(tmp_path_factory, validate_report):
    # picotron's 1F1B step after its fix: sync off for the steady state, on again before the last micro-step
    result = dist_run(tmp_path_factory, "sync-off-schedule-fixed", "-p", "distributed", "--nproc-per-node", "2",
                      "ddp_sync_off.py", "--", "schedule-fixed")
    assert result.returncode in (exitcodes.OK, exitcodes.FINDINGS), result.stderr[-2000:]
    validate_report(result.report)
    assert result.run["steps_completed"] == 10
    assert "ddp-ranks-diverged" not in ids(result), result.report["symptoms"]


@pytest.mark.distributed
def test_ddp_accumulation_under_no_sync_keeps_the_ranks_equal(tmp_path_factory, validate_report):
    result = dist_run(tmp_path_factory, "sync-off-nosync", "-p", "distributed", "--nproc-per-node", "2",
                      "ddp_sync_off.py", "--", "nosync")
    assert result.returncode in (exitcodes.OK, exitcodes.FINDINGS), result.stderr[-2000:]
    validate_report(result.report)
    assert result.run["steps_completed"] == 10
    assert "ddp-ranks-diverged" not in ids(result), result.report["symptoms"]
    # the replicas were compared, and equal: every rank's step records carry the same checksums
    from torchdoctor.analysis.evidence import read_events

    sums = {rank: {e["step"]: e["distributed"]["checksum"] for e in events
                   if e.get("kind") == "step" and "checksum" in (e.get("distributed") or {})}
            for rank, events in read_events(result.run_dir).items()}
    assert set(sums) == {0, 1} and len(sums[0]) >= 4 and sums[0] == sums[1], sums


@pytest.mark.parametrize("how", ["resume",
                                 # heavy: one more run (~6 s); the quick suite was at 603 s on a clean clone of stop 26 (budget 600)
                                 pytest.param("pretrained", marks=pytest.mark.heavy),
                                 # heavy: one more run (~4-8 s); the weights and the optimizer in two files
                                 pytest.param("separate-resume", marks=pytest.mark.heavy),
                                 # heavy: one more run (~4-8 s); a trainer's fit() that loads what its load() kept
                                 pytest.param("trainer-resume", marks=pytest.mark.heavy)])
def test_a_restored_optimizer_or_a_weights_only_start_is_no_empty_resume(tmp_path_factory, validate_report, how):
    result = shared_run(tmp_path_factory, f"resume-optimizer-{how}", "resume_optimizer.py", "--fail-on", "never",
                        "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    assert result.run["steps_completed"] == 10
    assert "resume-optimizer-state-missing" not in ids(result), result.report["symptoms"]


def test_accelerate_accumulation_with_zero_grad_after_the_step_is_healthy(tmp_path_factory, validate_report):
    pytest.importorskip("accelerate", reason="accelerate is an optional test extra")
    result = shared_run(tmp_path_factory, "zero-grad-after-accelerate-step", "zero_grad_after_accelerate_step.py",
                        "--fail-on", "warning")
    assert_sound(result, validate_report, exitcodes.OK)
    assert result.run["measurements"]["accumulation"]["backwards"] == 48
    assert not result.symptoms("zero-grad-every-micro-step"), result.report["symptoms"]
    assert not result.symptoms("partial-accumulation-dropped"), result.report["symptoms"]


def test_sandwich_rule_summing_sub_network_losses_of_one_batch_is_not_undivided_accumulation(tmp_path_factory,
                                                                                          validate_report):
    result = shared_run(tmp_path_factory, "sandwich-rule", "sandwich_rule_sum.py", "--fail-on", "warning")
    assert_sound(result, validate_report, exitcodes.OK)
    assert result.run["measurements"]["accumulation"]["micro_steps_per_step"] == 4
    assert not result.symptoms("accumulation-not-normalized"), result.report["symptoms"]
    assert any("same input batch" in note for note in result.report["notes"]), result.report["notes"]


@pytest.mark.heavy  # one more `torchdoctor run` (~5 s); the quick suite is at its 600 s budget on a clean clone
def test_gradients_divided_after_backward_are_not_undivided_accumulation(tmp_path_factory, validate_report):
    # fairseq's trainer: sum-reduced losses, backward per micro-batch, then `p.grad.div_(sample_size)` before the
    # step; the gradient norm the step sees is far below one micro-step's, which no undivided sum gives
    result = shared_run(tmp_path_factory, "accum-divided-after", "accum_grads_divided_after_backward.py",
                        "--fail-on", "warning")
    assert_sound(result, validate_report, exitcodes.OK)
    assert result.run["measurements"]["accumulation"]["micro_steps_per_step"] == 2
    assert not result.symptoms("accumulation-not-normalized"), result.report["symptoms"]
    assert any("rescaled after backward" in note for note in result.report["notes"]), result.report["notes"]


@pytest.mark.heavy  # a training run per case (~4 s each); the quick suite is at its 10-minute budget
@pytest.mark.parametrize("how", ["epoch", "plain"])
def test_a_scheduler_placed_with_step_epoch_every_iteration_is_not_counted_in_calls(tmp_path_factory,
                                                                                     validate_report, how):
    # HowToTrainYourMAMLPytorch: scheduler.step(epoch=epoch) before every optimizer step sets the value at that
    # epoch; counting its calls read it as stepped per batch (10x its length) and as stepped before the optimizer.
    # The same loop with plain step() per batch is the real granularity bug and stays found.
    result = shared_run(tmp_path_factory, f"scheduler-step-epoch-{how}", "scheduler_step_epoch.py",
                        "--fail-on", "never", "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    assert "done" in result.stdout + result.stderr
    found = {s["id"] for s in result.report["symptoms"]}
    if how == "epoch":
        assert not found & {"scheduler-granularity", "scheduler-order"}, result.report["symptoms"]
    else:
        assert "scheduler-granularity" in found, result.report["symptoms"]


# -- load_state_dict(strict=False): a replaced head is a partial load on purpose, a prefix is not ------------


def test_a_fine_tune_that_replaced_its_head_is_an_info_level_partial_load(tmp_path_factory, validate_report):
    result = shared_run(tmp_path_factory, "finetune-head", "finetune_partial_load.py", "--fail-on", "warning",
                        "--", "head")
    assert_sound(result, validate_report, exitcodes.OK)
    mismatch = result.symptoms("state-dict-mismatch")
    assert [s["severity"] for s in mismatch] == ["info"], result.report["symptoms"]
    assert "6 of 8 keys loaded" in mismatch[0]["evidence"][0]["summary"]


@pytest.mark.heavy  # one more run (~4-8 s); the same fine-tune whose file carries `module.` on every key
def test_a_fine_tune_whose_keys_all_carry_a_prefix_is_an_error(tmp_path_factory, validate_report):
    result = shared_run(tmp_path_factory, "finetune-prefix", "finetune_partial_load.py", "--fail-on", "error",
                        "--", "prefix")
    assert_sound(result, validate_report, exitcodes.FINDINGS)
    mismatch = result.symptoms("state-dict-mismatch")
    assert [s["severity"] for s in mismatch] == ["error"], result.report["symptoms"]
    assert "nothing was loaded" in mismatch[0]["evidence"][0]["summary"]
