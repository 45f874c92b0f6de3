"""The step records' memory-mapped file: written without system calls, read back whole or while it grows.

A real SIGKILL after three steps is in test_run_faults.py (`test_sigkill_keeps_what_was_measured`).
"""

from __future__ import annotations

import json
import os

import pytest

from torchdoctor.analysis.evidence import EventTail, read_events
from torchdoctor.probes import stepfile
from torchdoctor.probes.session import Session
from torchdoctor.probes.stepfile import CHUNK, open_step_file, records_in


def _line(step: int, t: float, pad: int = 0) -> bytes:
    return (json.dumps({"kind": "step", "step": step, "t": t, "pad": "x" * pad}, separators=(",", ":"))
            + "\n").encode()


def test_records_across_chunks_read_back_in_order_and_close_cuts_the_padding(tmp_path):
    path = tmp_path / "steps.rank0.jsonl"
    steps = open_step_file(str(path))
    assert steps is not None
    lines = [_line(i, i * 0.01, pad=i % 300) for i in range(1, 3001)]  # ~600 KiB: three chunks, records split
    for line in lines:
        steps.write(line)
    assert os.path.getsize(path) % CHUNK == 0 and os.path.getsize(path) > steps.size  # reserved ahead
    steps.close()
    assert path.read_bytes() == b"".join(lines)
    events = read_events(tmp_path)[0]
    assert [e["step"] for e in events] == list(range(1, 3001))


def test_a_killed_writer_leaves_nul_padding_that_readers_drop(tmp_path):
    path = tmp_path / "steps.rank0.jsonl"
    steps = open_step_file(str(path))
    for i in range(1, 6):
        steps.write(_line(i, float(i)))
    # no close(): what a SIGKILL leaves (the mapping's pages are the kernel's, so they reach the file)
    data = path.read_bytes()
    assert len(data) == CHUNK and data.rstrip(b"\x00") == b"".join(_line(i, float(i)) for i in range(1, 6))
    assert [e["step"] for e in read_events(tmp_path)[0]] == [1, 2, 3, 4, 5]


def test_records_in_keeps_a_record_still_being_copied_for_later():
    lines, used = records_in(_line(1, 0.1) + b'{"kind":"step","st' + b"\x00" * 64)
    assert lines == [_line(1, 0.1).rstrip(b"\n")] and used == len(_line(1, 0.1))
    assert records_in(b"\x00" * 10) == ([], 0)


def test_the_tail_counts_steps_as_they_are_written(tmp_path):
    (tmp_path / "events.rank0.jsonl").write_text('{"kind":"start","step":0,"pid":4242,"t":0.0}\n')
    steps = open_step_file(str(tmp_path / "steps.rank0.jsonl"))
    tail = EventTail(tmp_path)
    assert tail.poll() is False and tail.pids == {0: 4242}
    steps.write(_line(1, 0.5))
    steps.write(_line(2, 0.6))
    assert tail.poll() is True and tail.steps == {0: 2}
    assert tail.poll() is False
    steps.write(_line(3, 0.7))
    assert tail.poll() is True and tail.steps == {0: 3}


def test_steps_sit_between_the_events_by_time(tmp_path):
    events = [{"kind": "start", "step": 0, "t": 0.0}, {"kind": "holders", "step": 1, "t": 1.5},
              {"kind": "exit", "step": 2, "t": 3.0}]
    (tmp_path / "events.rank0.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (tmp_path / "steps.rank0.jsonl").write_bytes(_line(1, 1.0) + _line(2, 2.0))
    kinds = [(e["kind"], e["step"]) for e in read_events(tmp_path)[0]]
    assert kinds == [("start", 0), ("step", 1), ("holders", 1), ("step", 2), ("exit", 2)]


class _Optimizer:
    pass


@pytest.mark.parametrize("mapped", [True, False])
def test_a_session_writes_its_steps_where_the_platform_allows(tmp_path, monkeypatch, mapped):
    if not mapped:  # macOS and some filesystems: no posix_fallocate, the steps go to the event stream
        monkeypatch.delattr(stepfile.os, "posix_fallocate", raising=False)
    session = Session({"run_dir": str(tmp_path), "probes": [], "steps": None, "project": str(tmp_path)})
    tail = EventTail(tmp_path)
    optimizer = _Optimizer()
    for _ in range(3):
        session._post_hook(optimizer, (), {})
    assert tail.poll() is True and tail.steps == {0: 3}
    session.finish("completed", 0)
    assert (tmp_path / "steps.rank0.jsonl").exists() is mapped
    events = read_events(tmp_path)[0]
    assert [e["kind"] for e in events] == ["step", "step", "step", "finishing", "exit"]


def test_the_tail_reads_records_longer_than_its_slice_and_many_at_once(tmp_path):
    steps = open_step_file(str(tmp_path / "steps.rank0.jsonl"))
    tail = EventTail(tmp_path)
    steps.write(_line(1, 0.1, pad=40000))  # longer than the tail's 16 KiB slice
    for i in range(2, 502):  # ~40 KiB of ordinary records between two polls
        steps.write(_line(i, i * 0.01))
    assert tail.poll() is True and tail.steps == {0: 501}


@pytest.mark.parametrize("fields", [
    {},
    {"memory": {"rss_mib": 412.33}, "nan": {"loss": 0.123456789, "grad_norm": 3}},
    {"nan": {"loss": float("nan"), "grad_norm": float("inf"), "scale": float("-inf")}},
    {"data": {"wait_ms": 1e-300, "big": 10**30, "loader": "train \"x\"", "ok": True, "none": None, "l": [1, 2.5]}},
    {"odd key \u00e9\n": {"\t": -0.0}, "empty": {}},
])
def test_a_hand_built_step_record_is_the_json_the_json_module_reads(tmp_path, fields):
    from torchdoctor.probes.evidence import EvidenceWriter

    writer = EvidenceWriter(str(tmp_path / "events.jsonl"))
    line = writer.step_line(7, fields)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    record = json.loads(line)
    t = record.pop("t")
    assert isinstance(t, float) and 0 <= t < 60
    want = {"kind": "step", "step": 7, **fields}
    # NaN != NaN: compare the text of both sides, keys in the same order
    assert json.dumps(record) == json.dumps(want)
