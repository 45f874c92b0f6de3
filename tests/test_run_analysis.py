"""The parent-side analysis on its own: statistics, stack dumps, source attribution, outcomes,
exit codes, the event stream, and the CUDA-only analysis on data in torch's own layout.

No subprocess runs torch here, except the one that writes a real faulthandler dump.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torchdoctor import exitcodes
from torchdoctor.analysis import analyse
from torchdoctor.analysis.evidence import EventTail, Outcome, RunEvidence, read_events
from torchdoctor.analysis.memory import batch_that_fits, fragmentation_of
from torchdoctor.analysis.outcome import decide
from torchdoctor.analysis.source import accumulation_line, in_place_line
from torchdoctor.analysis.stacks import parse
from torchdoctor.analysis.stats import sustained_growth, theil_sen
from torchdoctor.model import Report, RunInfo
from torchdoctor.rules import catalog
from torchdoctor.run_options import UsageError, parse_size_gib
from torchdoctor.runner import exit_code

LIMITS = catalog.load_toml("thresholds.toml")


# -- statistics ------------------------------------------------------------------------------


def test_theil_sen_ignores_wild_points():
    xs = list(range(40))
    ys = [2.0 * x + 5 for x in xs]
    for i in (3, 17, 30):
        ys[i] += 500  # three allocator spikes
    assert theil_sen(xs, ys) == pytest.approx(2.0)


def _growth(ys, **kw):
    args = {"after": 5, "min_points": 8, "min_slope": 0.05, "min_total": 16.0, "sustained_fraction": 0.5}
    args.update(kw)
    return sustained_growth(list(range(1, len(ys) + 1)), ys, **args)


def test_sustained_growth_finds_a_noisy_leak():
    rng = random.Random(0)
    ys = [300 + 1.5 * s + rng.uniform(-3, 3) for s in range(1, 61)]
    g = _growth(ys)
    assert g is not None and g.slope == pytest.approx(1.5, rel=0.1) and g.from_step == 6 and g.to_step == 60


@pytest.mark.parametrize(
    "ys",
    [
        [300.0] * 60,  # flat
        [300 + min(s, 20) * 3.0 for s in range(1, 61)],  # a cache that fills once, then plateaus
        [300 + (5 if s % 2 else -5) for s in range(1, 61)],  # jitter
        [300 + 2.0 * s for s in range(1, 10)],  # too few points after warm-up
        [300 + 0.2 * s for s in range(1, 61)],  # real but below min_growth_mib in total
    ],
)
def test_sustained_growth_rejects_what_is_not_a_leak(ys):
    assert _growth(ys) is None


# -- faulthandler dumps ------------------------------------------------------------------------------


def test_parse_a_real_faulthandler_dump(tmp_path):
    script = tmp_path / "dump.py"
    script.write_text(textwrap.dedent("""
        import faulthandler, sys, threading, time
        def worker(ready):
            ready.set()
            time.sleep(30)
        ready = threading.Event()
        threading.Thread(target=worker, args=(ready,), daemon=True).start()
        ready.wait()
        with open(sys.argv[1], "w") as fh:
            faulthandler.dump_traceback(fh, all_threads=True)
            faulthandler.dump_traceback(fh, all_threads=True)  # a second dump: the last one wins
        print(threading.main_thread().ident)
    """))
    out = tmp_path / "stacks.txt"
    main_ident = int(subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True,
                                    check=True).stdout)
    dump = parse(out.read_text())
    assert dump is not None and len(dump.threads) == 2 and dump.fatal is None
    main = dump.main(main_ident)
    assert main is not None and main.current
    assert main.frames[0][0] == str(script) and main.frames[0][2] == "<module>"
    other = next(t for t in dump.threads if t is not main)
    assert other.frames[0][2] == "worker"


def test_parse_a_fatal_dump():
    text = (
        "Fatal Python error: Segmentation fault\n\n"
        "Current thread 0x00007fb4867c7b80 (most recent call first):\n"
        '  File "/usr/lib/python3.11/ctypes/__init__.py", line 519 in string_at\n'
        '  File "/home/u/train.py", line 12 in <module>\n\n'
        "Extension modules: torch._C (total: 1)\n"
    )
    dump = parse(text)
    assert dump is not None and dump.fatal == "Segmentation fault"
    assert dump.threads[0].frames[1] == ("/home/u/train.py", 12, "<module>")


# -- where a variable grows ------------------------------------------------------------------------


SOURCE = """\
import torch

total = 0
history = []
for step in range(10):
    loss = compute()
    total += loss
    history.append(loss)


class Trainer:
    def fit(self):
        running = None
        for batch in self.loader:
            loss = self.step(batch)
            running = loss if running is None else running + loss
            self.losses.append(loss)
        return running


def evaluate():
    total = 0
    total += 1
"""


@pytest.mark.parametrize(
    "name,current,first,function,expected",
    [
        ("total", 6, 1, "<module>", 7),  # module level: `total += loss`, not evaluate()'s own `total`
        ("history", 6, 1, "<module>", 8),
        ("running", 15, 12, "fit", 16),  # `running = … running + loss` inside the loop
        ("self.losses", 15, 12, "fit", 17),
        ("total", 23, 21, "evaluate", 23),
        ("nothing", 6, 1, "<module>", None),
    ],
)
def test_accumulation_line(tmp_path, name, current, first, function, expected):
    path = tmp_path / f"train_{name.replace('.', '_')}_{function.strip('<>')}.py"
    path.write_text(SOURCE)
    assert accumulation_line(str(path), name, current, first, function) == expected


IN_PLACE_SOURCE = """\
stats = Stats()
total = zeros()
for step in range(10):
    loss = compute()
    total.add_(loss)
    stats.device_stat("loss").add_(loss)
    stats.totals["loss"] += loss.detach()
    update(optimizer, stats)


def update(optimizer, stats):
    optimizer.step()
"""


@pytest.mark.parametrize(
    "head,current,first,function,expected",
    [
        ("stats", 4, 1, "<module>", 6),  # the first in-place growth of a tensor reached from `stats`, in the loop
        ("stats", 12, 11, "update", None),  # found in the helper it was handed to: two candidates in the file
        ("total", 12, 11, "update", 5),  # one candidate in the file: `total.add_(loss)`
        ("nothing", 4, 1, "<module>", None),
    ],
)
def test_in_place_line(tmp_path, head, current, first, function, expected):
    path = tmp_path / f"train_in_place_{head}_{function.strip('<>')}.py"
    path.write_text(IN_PLACE_SOURCE)
    assert in_place_line(str(path), head, current, first, function) == expected


def test_accumulation_line_counts_an_in_place_add(tmp_path):
    path = tmp_path / "train_total_add.py"
    path.write_text(IN_PLACE_SOURCE)
    assert accumulation_line(str(path), "total", 4, 1, "<module>") == 5


# -- how a run ended, and the exit code ---------------------------------------------------------------


@pytest.mark.parametrize(
    "returncode,decided,exit_event,stopped,code,sig",
    [
        (0, None, {"reason": "completed", "code": 0}, "completed", 0, None),
        (0, None, {"reason": "steps", "code": 0}, "steps", 0, None),
        (3, None, {"reason": "exit", "code": 3}, "exited", 3, None),  # sys.exit(3)
        (5, None, None, "exited", 5, None),  # os._exit(5): no exit event
        (1, None, {"reason": "exception", "code": 1}, "crashed", 1, None),
        (-11, None, None, "crashed", None, "SIGSEGV"),
        (-9, None, None, "killed", None, "SIGKILL"),
        (143, None, {"reason": "terminated", "code": 143}, "killed", 143, "SIGTERM"),
        (143, "hang", {"reason": "terminated", "code": 143}, "hang", 143, "SIGTERM"),
        (-9, "timeout", None, "timeout", None, "SIGTERM"),
        (130, "interrupted", {"reason": "interrupted", "code": 130}, "interrupted", 130, "SIGINT"),
        (-6, None, {"reason": "completed", "code": 0}, "completed", 0, "SIGABRT"),  # died at exit, after training
    ],
)
def test_outcome(returncode, decided, exit_event, stopped, code, sig):
    sent = {"hang": "SIGTERM", "timeout": "SIGTERM", "interrupted": "SIGINT"}.get(decided)
    outcome = decide(returncode, decided, exit_event, 1.0, sent)
    assert (outcome.stopped, outcome.exit_code, outcome.signal) == (stopped, code, sig)
    if returncode == -6:
        assert "after the script had finished" in outcome.notes[0]


def _report(stopped: str, code: int | None, severities: list[str]) -> Report:
    symptoms = [catalog.make_symptom("memory-growth" if s == "error" else "anomaly-detection-enabled", severity=s)
                for s in severities]
    return Report(command="run", symptoms=symptoms, run=RunInfo(code, 1, stopped, 1.0))


@pytest.mark.parametrize(
    "stopped,code,severities,fail_on,expected",
    [
        ("completed", 0, [], "error", exitcodes.OK),
        ("completed", 0, ["error"], "error", exitcodes.FINDINGS),
        ("completed", 0, ["warning"], "error", exitcodes.OK),
        ("completed", 0, ["warning"], "warning", exitcodes.FINDINGS),
        ("completed", 0, ["error"], "never", exitcodes.OK),
        ("steps", 0, ["error"], "error", exitcodes.FINDINGS),
        ("exited", 3, [], "error", exitcodes.SCRIPT_FAILED),
        ("crashed", 1, ["error"], "error", exitcodes.SCRIPT_FAILED),  # the failure outranks the symptoms
        ("hang", None, [], "never", exitcodes.SCRIPT_FAILED),  # --fail-on never does not hide a failure
        ("killed", None, [], "error", exitcodes.SCRIPT_FAILED),
        ("timeout", 143, [], "error", exitcodes.SCRIPT_FAILED),
        ("interrupted", 130, ["error"], "error", exitcodes.INTERRUPTED),  # Ctrl-C outranks everything
    ],
)
def test_exit_code_precedence(stopped, code, severities, fail_on, expected):
    assert exit_code(_report(stopped, code, severities), fail_on) == expected


@pytest.mark.parametrize(
    "text,gib",
    [("10GiB", 10.0), ("10 gib", 10.0), ("12", 12.0), ("8000MiB", 8000 / 1024), ("24GB", 24.0),
     ("1.5TiB", 1536.0), ("512M", 0.5), ("3090", 25_441_665_024 / 2**30), ("A100-80GB", 85_051_572_224 / 2**30)],
)
def test_sizes(text, gib):
    assert parse_size_gib(text) == pytest.approx(gib)


@pytest.mark.parametrize("text", ["ten", "10XB", "-1GiB", "0", "potato"])
def test_bad_sizes(text):
    # a size that `fit --gpu` would not take is refused by `run --gpu-memory` too: one grammar
    with pytest.raises(UsageError):
        parse_size_gib(text)


# -- the event stream --------------------------------------------------------------------------------


def test_read_events_survives_a_cut_last_line(tmp_path):
    lines = [json.dumps({"kind": "start", "pid": 1, "t": 0.0}), json.dumps({"kind": "step", "step": 1, "t": 0.5})]
    (tmp_path / "events.rank0.jsonl").write_text("\n".join(lines) + '\n{"kind":"step","st')
    (tmp_path / "events.rank1.jsonl").write_text(lines[0] + "\n")
    events = read_events(tmp_path)
    assert [e["kind"] for e in events[0]] == ["start", "step"] and list(events) == [0, 1]


def test_event_tail_follows_appends_and_partial_lines(tmp_path):
    path = tmp_path / "events.rank0.jsonl"
    tail = EventTail(tmp_path)
    assert tail.poll() is False
    path.write_text('{"kind":"start","step":0,"pid":4242}\n{"kind":"step","st')
    assert tail.poll() is False and tail.pids == {0: 4242}
    with open(path, "a") as fh:
        fh.write('ep":1}\n')
    assert tail.poll() is True and tail.steps == {0: 1}
    assert tail.poll() is False


# -- the memory analysis on recorded evidence, including CUDA data in torch's layout -------------------


def _evidence(tmp_path: Path, events: list[dict], stopped: str = "completed", signal: str | None = None,
              options: dict | None = None) -> RunEvidence:
    return RunEvidence(
        run_dir=tmp_path, cwd=str(tmp_path), target="train.py", project=str(tmp_path), probes=["memory"],
        events={0: [{"kind": "start", "pid": 1, "world_size": 1, "main_thread": 1, "t": 0.0, "step": 0}, *events]},
        outcome=Outcome(stopped, 0, signal, 10.0), thresholds=LIMITS, options=options or {},
    )


def _cuda_stats(allocated: int, reserved: int, total: int) -> dict:
    """Flattened `torch.cuda.memory_stats()` keys (torch/cuda/memory.py) plus the device's total memory."""
    stats = {}
    for stat, value in (("allocated_bytes", allocated), ("reserved_bytes", reserved),
                        ("active_bytes", allocated), ("inactive_split_bytes", reserved - allocated),
                        ("requested_bytes", allocated)):
        for pool in ("all", "large_pool", "small_pool"):
            for metric in ("current", "peak", "allocated", "freed"):
                stats[f"{stat}.{pool}.{metric}"] = value if pool == "all" else 0
    stats.update({"num_ooms": 1, "num_alloc_retries": 3, "max_split_size": -1, "device_total_bytes": total})
    return stats


GiB = 2**30


def test_cuda_oom_with_fragmentation(tmp_path):
    """CUDA data format: an `oom` event as the probe records it from torch.cuda.memory_stats()."""
    stats = _cuda_stats(allocated=45 * GiB, reserved=75 * GiB, total=80 * GiB)
    events = [
        {"kind": "step", "step": s, "t": s * 0.1, "memory": {"rss_mib": 2000.0, "cuda_allocated_mib": 61000.0,
                                                             "cuda_reserved_mib": 76000.0, "cuda_peak_mib": 70000.0}}
        for s in range(1, 4)
    ] + [
        {"kind": "exception", "step": 3, "type": "OutOfMemoryError", "message": "CUDA out of memory.",
         "traceback": "torch.OutOfMemoryError: CUDA out of memory.", "frames": [],
         "user_frame": {"path": str(tmp_path / "train.py"), "line": 7, "function": "<module>"}},
        {"kind": "oom", "probe": "memory", "step": 3, "error_type": "OutOfMemoryError", "rss_mib": 2000.0,
         "peak_rss_mib": 2100.0, "cuda": stats},
    ]
    (tmp_path / "train.py").write_text("\n" * 6 + "out = model(x)\n")
    found = analyse(_evidence(tmp_path, events, stopped="crashed"))
    ids = [s.id for s in found.symptoms]
    assert "oom" in ids and "fragmentation" in ids and "gpu" in found.contexts
    oom = next(s for s in found.symptoms if s.id == "oom" and s.evidence[0].source == "memory")
    assert oom.location.line == 7 and oom.location.code == "out = model(x)"
    values = oom.evidence[0].values
    assert values["allocated_gib"] == 45 and values["reserved_unallocated_gib"] == 30 and values["total_gib"] == 80
    frag = next(s for s in found.symptoms if s.id == "fragmentation")
    assert frag.evidence[0].values["reserved_unallocated_gib"] == 30  # 40% of reserved


def test_fragmentation_needs_a_large_gap():
    assert fragmentation_of(_cuda_stats(70 * GiB, 75 * GiB, 80 * GiB), LIMITS["memory"]) is None  # 5 GiB of 75: 7%
    assert fragmentation_of(_cuda_stats(int(0.2 * GiB), int(0.5 * GiB), 80 * GiB), LIMITS["memory"]) is None  # < 1 GiB


def test_cuda_growth_and_capacity(tmp_path):
    """CUDA data format: per-step allocator counters (MiB) and a breakdown near the device's memory."""
    steps = [{"kind": "step", "step": s, "t": s * 0.1,
              "memory": {"rss_mib": 3000.0, "cuda_allocated_mib": 20000.0 + 100 * s, "cuda_reserved_mib": 40000.0,
                         "cuda_peak_mib": 74000.0}} for s in range(1, 41)]
    breakdown = {"kind": "breakdown", "probe": "memory", "step": 3, "parameters_mib": 14000.0,
                 "gradients_mib": 14000.0, "optimizer_state_mib": 28000.0, "activations_mib": 12000.0,
                 "batch_size": 32, "device": "cuda:0", "cuda_peak_mib": 74000.0, "device_total_mib": 81920.0}
    found = analyse(_evidence(tmp_path, [*steps, breakdown]))
    growth = next(s for s in found.symptoms if s.id == "memory-growth")
    assert growth.evidence[0].values["series"] == "cuda_allocated"
    assert growth.evidence[0].values["slope_mib_per_step"] == pytest.approx(100)
    assert growth.confidence == 1.0
    high = next(s for s in found.symptoms if s.id == "high-memory")
    assert high.severity == "warning"  # 72.3 GiB of 80: near, not over
    v = high.evidence[0].values
    assert v["device_gib"] == 80 and v["peak_gib"] == pytest.approx(74000 / 1024) and v["estimated"] is False
    assert v["other_gib"] == pytest.approx((74000 - 68000) / 1024)


def test_fit_verdict_and_the_batch_that_fits(tmp_path):
    steps = [{"kind": "step", "step": s, "t": s * 0.1, "memory": {"rss_mib": 900.0}} for s in range(1, 11)]
    breakdown = {"kind": "breakdown", "probe": "memory", "step": 3, "parameters_mib": 2048.0,
                 "gradients_mib": 2048.0, "optimizer_state_mib": 4096.0, "activations_mib": 5324.8,
                 "batch_size": 32, "device": "cpu"}
    found = analyse(_evidence(tmp_path, [*steps, breakdown], options={"gpu_memory_gib": 10.0}))
    high = next(s for s in found.symptoms if s.id == "high-memory")
    assert high.severity == "error"
    assert high.evidence[0].summary.startswith("peak ≈ 13.20 GiB at batch 32: does not fit in 10.00 GiB")
    # 8 GiB is fixed; 0.9 × 10 GiB leaves 1 GiB for activations of 0.1625 GiB per 32/… sample
    assert high.evidence[0].values["batch_that_fits"] == 6
    assert batch_that_fits({"batch_size": 32, "activations_gib": 5.2, "peak_gib": 13.2}, 10.0, 0.9) == 6


def test_graph_growth_and_its_healthy_twin(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("total = 0\nfor step in range(100):\n    loss = f()\n    total += loss\n")

    def holders(step: int, total_nodes: int) -> dict:
        where = {"path": str(script), "function": "<module>", "firstlineno": 1, "lineno": 3, "scope": "global"}
        return {"kind": "holders", "probe": "memory", "step": step, "holders": [
            {"kind": "tensor", "name": "total", "graph_nodes": total_nodes, "truncated": False, "mib": 0.0, **where},
            {"kind": "tensor", "name": "loss", "graph_nodes": 10, "truncated": False, "mib": 0.0, **where},
        ]}

    leak = [holders(s, 10 + 7 * s) for s in range(1, 41)]
    found = analyse(_evidence(tmp_path, leak))
    growth = [s for s in found.symptoms if s.id == "memory-growth"]
    assert len(growth) == 1 and growth[0].location.line == 4 and growth[0].location.code == "total += loss"
    assert growth[0].evidence[0].values["variable"] == "total"
    assert growth[0].evidence[0].values["graph_nodes_growth_per_step"] == pytest.approx(7)

    healthy = [holders(s, 10) for s in range(1, 41)]
    assert not [s for s in analyse(_evidence(tmp_path, healthy)).symptoms if s.id == "memory-growth"]

    # a graph that reached the walk limit keeps counting as growth
    capped = [holders(s, min(10 + 7 * s, 150)) for s in range(1, 41)]
    for event in capped:
        event["holders"][0]["truncated"] = event["holders"][0]["graph_nodes"] == 150
    assert [s for s in analyse(_evidence(tmp_path, capped)).symptoms if s.id == "memory-growth"]

    # reset every epoch (64 steps), sampled densely to step 40 then sparsely: the pattern of a real
    # `total_loss = 0.0` per epoch; the whole series is a saw-tooth, each epoch a leak
    steps = [*range(1, 41), 46, 57, 72, 95, 110, 132, 151, 163, 183]
    sawtooth = [holders(s, 4 + 9 * ((s - 1) % 64)) for s in steps]
    growth = [s for s in analyse(_evidence(tmp_path, sawtooth)).symptoms if s.id == "memory-growth"]
    assert growth and growth[0].evidence[0].values["graph_nodes_growth_per_step"] == pytest.approx(9)
    # a graph rebuilt every step at a size that wanders is no leak
    wander = [holders(s, 10 + (s * 7) % 13) for s in range(1, 80)]
    assert not [s for s in analyse(_evidence(tmp_path, wander)).symptoms if s.id == "memory-growth"]


def test_sigkill_near_the_memory_limit_is_a_host_oom(tmp_path):
    events = [{"kind": "memory-start", "probe": "memory", "step": 0, "ram_limit_mib": 16000.0, "rss_mib": 300.0}]
    events += [{"kind": "step", "step": s, "t": s, "memory": {"rss_mib": 300.0 + 1500 * s}} for s in range(1, 11)]
    found = analyse(_evidence(tmp_path, events, stopped="killed", signal="SIGKILL"))
    host = next(s for s in found.symptoms if s.id == "host-oom")
    assert host.evidence[0].values["rss_gib"] == pytest.approx(15300 / 1024, rel=1e-3)
    calm = analyse(_evidence(tmp_path, events[:4], stopped="killed", signal="SIGKILL"))  # 4.8 of 16 GB
    assert not [s for s in calm.symptoms if s.id == "host-oom"]


def test_a_fatal_signal_without_a_dump_is_still_a_native_crash(tmp_path):
    """The script may have pointed faulthandler elsewhere (python -X faulthandler): no stack, still the crash."""
    steps = [{"kind": "step", "step": s, "t": s * 0.1} for s in range(1, 4)]
    found = analyse(_evidence(tmp_path, steps, stopped="crashed", signal="SIGABRT"))
    crash = next(s for s in found.symptoms if s.id == "native-crash")
    assert crash.location is None and crash.evidence[0].values["signal"] == "SIGABRT"
    assert crash.evidence[0].summary == "The process died of SIGABRT after 3 optimizer steps"


def test_an_oom_after_the_breakdown_step_offers_fit_with_the_run_s_own_numbers(tmp_path):
    """Issue 18: after a run's CUDA OOM the memory specialist offers `torchdoctor fit` with the arguments
    the script ran with, and the breakdown measured on an earlier step, scaled to the card that ran out."""
    from torchdoctor.diagnosis import diagnose

    steps = [{"kind": "step", "step": s, "t": s * 0.1, "memory": {"rss_mib": 900.0}} for s in range(1, 5)]
    breakdown = {"kind": "breakdown", "probe": "memory", "step": 3, "parameters_mib": 2048.0,
                 "gradients_mib": 2048.0, "optimizer_state_mib": 4096.0, "activations_mib": 5324.8,
                 "batch_size": 32, "device": "cuda:0"}
    oom = {"kind": "oom", "probe": "memory", "step": 4, "error_type": "OutOfMemoryError", "rss_mib": 900.0,
           "peak_rss_mib": 950.0, "cuda": _cuda_stats(allocated=9 * GiB, reserved=9 * GiB + GiB // 2, total=10 * GiB)}
    evidence = _evidence(tmp_path, [*steps, breakdown, oom], stopped="crashed")
    evidence.events[0][0]["argv"] = ["train.py", "--batch-size", "32", "--name", "run one"]
    found = analyse(evidence)
    symptom = next(s for s in found.symptoms if s.id == "oom")
    values = symptom.evidence[0].values
    assert values["script_args"] == ["--batch-size", "32", "--name", "run one"]
    assert values["measured_activations_gib"] == pytest.approx(5.2) and values["measured_batch_size"] == 32
    # 8 GiB of parameters, gradients and Adam state; 0.9 × 10 GiB leaves 1 GiB at 0.1625 GiB a sample
    assert values["batch_that_fits"] == 6
    report = diagnose(Report(command="run", target="train.py", symptoms=[symptom]))
    memory = next(r for r in report.reports if r.specialist == "memory")
    assert "Measured on an earlier step: parameters 2.00 GiB" in memory.diagnosis
    assert "about 6 samples per step fit with 10% to spare" in memory.diagnosis
    assert any("torchdoctor fit train.py --gpu 10GB -- --batch-size 32 --name 'run one'" in s
               for s in memory.next_steps), memory.next_steps


def test_an_oom_before_any_breakdown_names_no_measured_parts(tmp_path):
    oom = {"kind": "oom", "probe": "memory", "step": 0, "error_type": "OutOfMemoryError", "rss_mib": 900.0,
           "peak_rss_mib": 950.0, "cuda": _cuda_stats(allocated=9 * GiB, reserved=9 * GiB, total=10 * GiB)}
    found = analyse(_evidence(tmp_path, [oom], stopped="crashed"))
    values = next(s for s in found.symptoms if s.id == "oom").evidence[0].values
    assert not any(k.startswith("measured_") for k in values) and "batch_that_fits" not in values
