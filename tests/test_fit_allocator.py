"""The caching-allocator replay (torchdoctor.fit.allocator) against what the real
allocator did on an H100 (bench/fit/data, torch 2.11), and on small hand-made
sequences whose answer follows from the allocator's rules."""

from __future__ import annotations

import gzip
import json
import time

import pytest

from tests.conftest import ROOT
from torchdoctor.fit.allocator import (
    AllocatorError,
    CachingAllocator,
    replay,
    round_size,
    segment_size,
    trace_events,
    trace_segments,
)

MiB = 1 << 20
DATA = ROOT / "bench" / "fit" / "data"
TRACES = json.loads(gzip.decompress((DATA / "allocator_traces.json.gz").read_bytes()))
TRUTH = {config["name"]: config for config in json.loads((DATA / "truth.json").read_text())["configs"]}


def first_peak(name: str) -> dict:
    """truth.json's measurement at the batch the trace was recorded at (same process)."""
    batch = TRACES[name]["batch"]
    return next(p for p in TRUTH[name]["peaks"] if p.get("batch") == batch)


# -- real traces -----------------------------------------------------------------------------------


def test_every_config_has_a_trace():
    assert len(TRACES) >= 13
    assert set(TRACES) <= set(TRUTH)


@pytest.mark.parametrize("name", sorted(TRACES))
def test_replay_with_the_recorded_addresses_is_the_real_allocator(name):
    """Given the addresses cudaMalloc returned, every block lands where the real
    allocator put it, the same segments are obtained in the same order, and the
    peaks equal max_memory_reserved / max_memory_allocated."""
    recorded = TRACES[name]["events"]
    peak, segments = trace_segments(recorded)
    allocator = CachingAllocator(segment_addresses=[address for address, _ in segments])
    for action, address, size, _stream in recorded:
        if action == "alloc":
            assert allocator.malloc(address, size)
            assert allocator.live[address].address == address, f"{name}: block of {size} B misplaced"
        elif action == "free_completed":
            allocator.free(address)
    stats = allocator.stats
    assert stats.segment_sizes == [size for _, size in segments]
    assert stats.segment_bytes == sum(size for _, size in segments)
    assert stats.peak_reserved == peak == first_peak(name)["max_reserved"]
    assert stats.peak_allocated == first_peak(name)["max_allocated"]


def _error(name: str, order: str) -> float:
    peak, _ = trace_segments(TRACES[name]["events"])
    got = replay(trace_events(TRACES[name]["events"]), address_order=order).peak_reserved
    return (got - peak) / peak


def test_replay_without_addresses_matches_the_real_peaks():
    """Without a GPU the segment addresses are guessed (newest lowest). Measured:
    exact on 12 of the 13 traces; vit-bf16-ckpt reuses a different one of two
    equal cached blocks and ends 5.1 % high. The floors hold that."""
    errors = {name: _error(name, "descending") for name in TRACES}
    assert all(error >= -0.01 for error in errors.values()), errors  # never low by more than 1 %
    assert sum(abs(error) <= 0.01 for error in errors.values()) >= len(errors) - 1, errors
    assert max(errors.values()) <= 0.06, errors


def test_the_two_address_guesses_bracket_the_real_peak():
    for name in TRACES:
        low, high = sorted((_error(name, "descending"), _error(name, "ascending")))
        assert low - 0.01 <= 0 <= high + 0.01, (name, low, high)


def test_replay_is_fast_on_the_largest_trace():
    name = max(TRACES, key=lambda n: len(TRACES[n]["events"]))
    events = trace_events(TRACES[name]["events"])
    started = time.perf_counter()
    replay(events)
    assert time.perf_counter() - started < 1.0


CAP = json.loads(gzip.decompress((DATA / "allocator_cap_trace.json.gz").read_bytes()))


def _replay_capped(**options) -> tuple[CachingAllocator, int, int]:
    """Drive the replay through the capped trace: each `oom` entry is an
    allocation (of the rounded size it records) that must fail, every `alloc`
    one that must succeed. Returns the allocator, the OOMs and the misplaced
    blocks."""
    allocator = CachingAllocator(capacity=CAP["allowed_bytes"], **options)
    ooms = misplaced = 0
    for index, (action, address, size, _stream) in enumerate(CAP["events"]):
        if action == "alloc":
            assert allocator.malloc(address, size), f"event {index}: the real allocator found room"
            misplaced += allocator.live[address].address != address
        elif action == "free_completed":
            allocator.free(address)
        elif action == "oom":
            assert not allocator.malloc(("oom", index), size), f"event {index}: the real allocator ran out"
            ooms += 1
    return allocator, ooms, misplaced


def test_under_a_cap_the_replay_releases_and_runs_out_where_the_real_allocator_did():
    """A real run under set_per_process_memory_fraction (1 GiB): 19 OOMs, 53
    segments given back to make room. With the recorded addresses the replay
    gives back the same segments and fails the same 19 requests."""
    _, segments = trace_segments(CAP["events"])
    allocator, ooms, misplaced = _replay_capped(segment_addresses=[address for address, _ in segments])
    assert ooms == CAP["ooms"] == 19 and misplaced == 0
    assert allocator.stats.segment_sizes == [size for _, size in segments]
    assert allocator.stats.segments_released == sum(e[0] == "segment_free" for e in CAP["events"]) > 0
    assert allocator.stats.peak_reserved == CAP["max_reserved"]
    assert allocator.stats.peak_allocated == CAP["max_allocated"]


@pytest.mark.parametrize("order", ["descending", "ascending"])
def test_under_a_cap_the_address_guess_still_finds_every_oom(order):
    allocator, ooms, _ = _replay_capped(address_order=order)
    assert ooms == CAP["ooms"]
    assert allocator.stats.peak_reserved == CAP["max_reserved"]


def test_replay_reports_the_first_oom_and_stops_there():
    events = []
    for index, (action, address, size, _stream) in enumerate(CAP["events"]):
        if action == "alloc":
            events.append(("alloc", address, size))
        elif action == "free_completed":
            events.append(("free", address, 0))
        elif action == "oom":
            events.append(("alloc", ("oom", index), size))
    first = next(i for i, event in enumerate(events) if isinstance(event[1], tuple))
    result = replay(events, capacity=CAP["allowed_bytes"])
    assert result.oom and result.oom_event == first
    assert result.peak_reserved <= CAP["allowed_bytes"] and result.segments_released > 0
    assert replay(events).oom is False  # no cap, no OOM


def test_trace_events_reads_dicts_and_lists_and_frees_at_free_completed():
    as_dicts = [
        {"action": "segment_alloc", "addr": 0, "size": 2 * MiB},
        {"action": "alloc", "addr": 0, "size": 100},
        {"action": "free_requested", "addr": 0, "size": 100},
        {"action": "free_completed", "addr": 0, "size": 100},
    ]
    as_lists = [[e["action"], e["addr"], e["size"], 0] for e in as_dicts]
    expected = [("alloc", 0, 100), ("free", 0, 0)]
    assert trace_events(as_dicts) == trace_events(as_lists) == expected
    assert trace_segments(as_lists) == (2 * MiB, [(0, 2 * MiB)])


# -- rules, by hand ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("requested", "rounded"),
    [(0, 512), (1, 512), (4, 512), (512, 512), (513, 1024), (1000, 1024), (MiB + 1, MiB + 512)],
)
def test_requests_round_up_to_512_bytes(requested, rounded):
    assert round_size(requested) == rounded


def test_roundup_power2_divisions():
    # 5 MiB + 1 lies in [4, 8) MiB; 4 divisions make 1 MiB steps.
    assert round_size(5 * MiB + 1, roundup_power2_divisions=4) == 6 * MiB
    assert round_size(4 * MiB, roundup_power2_divisions=4) == 4 * MiB  # a power of two stays
    assert round_size(1500, roundup_power2_divisions=4) == 1536  # under 512 * divisions: plain rounding
    events = [("alloc", "a", 5 * MiB + 1)]
    assert replay(events, roundup_power2_divisions=4).peak_allocated == 6 * MiB
    assert replay(events).peak_allocated == 5 * MiB + 512


@pytest.mark.parametrize(
    ("rounded", "segment"),
    [(512, 2 * MiB), (MiB, 2 * MiB), (MiB + 512, 20 * MiB), (10 * MiB - 512, 20 * MiB),
     (10 * MiB, 10 * MiB), (10 * MiB + 512, 12 * MiB), (101 * MiB, 102 * MiB)],
)
def test_segment_sizes(rounded, segment):
    assert segment_size(rounded) == segment


def test_one_mib_is_small_and_one_byte_more_is_large():
    small = replay([("alloc", "a", MiB)])
    assert small.segment_sizes == [2 * MiB] and small.peak_reserved == 2 * MiB
    large = replay([("alloc", "a", MiB + 1)])
    assert large.segment_sizes == [20 * MiB]
    # Split: the block is the rounded request, the 20 MiB segment's rest stays cached.
    assert large.peak_allocated == MiB + 512


def test_small_pool_packs_a_2mib_segment_and_splits_down_to_512_bytes():
    two_halves = replay([("alloc", "a", MiB), ("alloc", "b", MiB)])
    assert two_halves.segments == 1
    third = replay([("alloc", "a", MiB), ("alloc", "b", MiB - 512), ("alloc", "c", 1), ("alloc", "d", 1)])
    assert third.segments == 2  # "c" takes the last 512 B; "d" needs a new segment
    assert third.peak_allocated == 2 * MiB + 512


def test_large_pool_splits_only_when_more_than_1mib_remains():
    # A cached 20 MiB block: 19 MiB of it leaves 1 MiB, not split, so the
    # block is all 20 MiB and a 1 MiB-and-more request needs a new segment.
    cached = [("alloc", "x", 20 * MiB), ("free", "x", 0)]
    whole = replay(cached + [("alloc", "a", 19 * MiB), ("alloc", "b", 2 * MiB)])
    assert whole.peak_allocated == 20 * MiB + 2 * MiB
    assert whole.segments == 2
    # 18 MiB of it leaves 2 MiB: split, and a 2 MiB request fits in the rest.
    split = replay(cached + [("alloc", "a", 18 * MiB), ("alloc", "b", 2 * MiB)])
    assert split.segments == 1 and split.peak_allocated == 20 * MiB
    # The same from a fresh 20 MiB segment (requests under 10 MiB): 8 MiB splits.
    assert replay([("alloc", "a", 8 * MiB), ("alloc", "b", 12 * MiB)]).segments == 1
    # 11 MiB gets a 12 MiB segment; the 1 MiB over is not split off.
    assert replay([("alloc", "a", 11 * MiB)]).peak_allocated == 12 * MiB


def test_freed_neighbours_merge():
    # One 20 MiB segment: a, b, c of 4 MiB and t on the 8 MiB tail. Freed a and b
    # merge into the only 8 MiB run, which d reuses.
    full = [("alloc", "a", 4 * MiB), ("alloc", "b", 4 * MiB), ("alloc", "c", 4 * MiB), ("alloc", "t", 8 * MiB)]
    merged = full + [("free", "a", 0), ("free", "b", 0), ("alloc", "d", 8 * MiB)]
    assert replay(merged).segments == 1
    # a and c are free but not neighbours (b is live between them): d needs a new segment.
    apart = full + [("free", "a", 0), ("free", "c", 0), ("alloc", "d", 8 * MiB)]
    assert replay(apart).segments == 2
    # Everything freed merges back into the whole segment, which a 20 MiB request reuses.
    back = merged + [("free", "c", 0), ("free", "t", 0), ("free", "d", 0), ("alloc", "e", 20 * MiB)]
    result = replay(back)
    assert result.segments == 1 and result.peak_reserved == 20 * MiB


def test_best_fit_takes_the_smallest_cached_block():
    allocator = CachingAllocator()
    allocator.malloc("x", 16 * MiB)
    allocator.malloc("y", 12 * MiB)
    small_address = allocator.live["y"].address
    allocator.free("x")
    allocator.free("y")
    allocator.malloc("z", 11 * MiB)
    assert allocator.live["z"].address == small_address
    assert allocator.stats.segments == 2


@pytest.mark.parametrize(("order", "takes"), [("descending", "y"), ("ascending", "x")])
def test_equal_blocks_go_lowest_address_first(order, takes):
    allocator = CachingAllocator(address_order=order)
    allocator.malloc("x", 12 * MiB)
    allocator.malloc("y", 12 * MiB)
    addresses = {name: allocator.live[name].address for name in ("x", "y")}
    allocator.free("x")
    allocator.free("y")
    allocator.malloc("z", 12 * MiB)
    assert allocator.live["z"].address == addresses[takes] == min(addresses.values())


def test_freed_blocks_are_reused_and_segments_kept():
    events = [("alloc", "a", 30 * MiB), ("free", "a", 0), ("alloc", "b", 30 * MiB), ("free", "b", 0)]
    result = replay(events)
    assert result.segments == 1 and result.reserved == 30 * MiB and result.allocated == 0
    assert result.peak_allocated == 30 * MiB and result.peak_requested == 30 * MiB


def test_capacity_releases_free_segments_before_giving_up():
    events = [("alloc", "a", 12 * MiB), ("free", "a", 0), ("alloc", "b", 30 * MiB)]
    assert replay(events).peak_reserved == 42 * MiB  # no cap: the 12 MiB segment stays cached
    capped = replay(events, capacity=40 * MiB)
    assert not capped.oom
    assert capped.segments_released == 1
    assert capped.peak_reserved == 30 * MiB and capped.reserved == 30 * MiB


def test_capacity_oom_when_the_cached_memory_is_in_use():
    events = [("alloc", "a", 12 * MiB), ("alloc", "b", 30 * MiB), ("free", "a", 0), ("free", "b", 0)]
    result = replay(events, capacity=40 * MiB)
    assert result.oom and result.oom_event == 1 and result.oom_bytes == 30 * MiB
    assert result.segments_released == 0 and result.reserved == 12 * MiB  # stopped at the OOM


def test_a_partly_used_segment_is_not_released():
    # a takes 4 MiB of a 20 MiB segment; its cached 16 MiB rest cannot go back.
    events = [("alloc", "a", 4 * MiB), ("alloc", "b", 30 * MiB)]
    result = replay(events, capacity=40 * MiB)
    assert result.oom and result.segments_released == 0


def test_max_split_size_keeps_oversize_blocks_for_oversize_requests():
    events = [("alloc", "a", 40 * MiB), ("free", "a", 0), ("alloc", "b", 12 * MiB)]
    assert replay(events).segments == 1  # the cached 40 MiB block is split
    limited = replay(events, max_split_size=32 * MiB)
    assert limited.segments == 2  # 40 MiB >= max_split_size: not handed to a 12 MiB request
    # Under a cap, the oversize cached segment is the one given back first.
    capped = replay(events, capacity=50 * MiB, max_split_size=32 * MiB)
    assert not capped.oom and capped.segments_released == 1 and capped.reserved == 12 * MiB


@pytest.mark.parametrize(
    "events",
    [[("free", "a", 0)], [("alloc", "a", 1), ("alloc", "a", 1)], [("resize", "a", 1)], [("alloc", "a", -1)]],
)
def test_invalid_sequences_are_named(events):
    with pytest.raises(AllocatorError):
        replay(events)


def test_unknown_address_order_is_refused():
    with pytest.raises(ValueError, match="address_order"):
        replay([], address_order="random")
