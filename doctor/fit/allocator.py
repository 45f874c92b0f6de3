"""A pure-Python replay of PyTorch's CUDA caching allocator.

`fit` knows, in program order, every storage the training step allocates and
frees (from fake tensors, with no GPU). What a card must hold is not the sum of
the live storages but what the caching allocator has reserved from the driver:
requests are rounded up, packed into 2 MiB and 20 MiB segments, split and
merged, and cached segments are not given back. `replay` runs the allocator's
rules over the event sequence and reports the reserved peak, the figure
`torch.cuda.max_memory_reserved()` gives on a real GPU.

The rules follow c10/cuda/CUDACachingAllocator.cpp (DeviceCachingAllocator:
`malloc`, `round_size`, `get_pool`, `get_allocation_size`, `get_free_block`,
`should_split`, `alloc_found_block`, `free_block`, `try_merge_blocks`,
`alloc_block`, `release_available_cached_blocks`, `release_cached_blocks`),
the native allocator of torch 2.x with the default settings unless told
otherwise:

- a request is rounded up to a multiple of 512 B (at least 512 B), or to a
  power-of-two division when `roundup_power2_divisions` is set;
- rounded sizes up to 1 MiB come from the small pool, whose segments are
  2 MiB; larger ones from the large pool, whose segments are 20 MiB for
  requests under 10 MiB and the request rounded up to 2 MiB otherwise;
- the cached block chosen is the smallest that fits, lowest address first;
- a block is split when the remainder is at least 512 B (small pool) or more
  than 1 MiB (large pool), and a freed block merges with free neighbours of
  its segment;
- segments go back to the driver only when a new one would pass `capacity`
  (what `set_per_process_memory_fraction` sets): first, with
  `max_split_size` set, oversize cached blocks; then every cached segment
  that is wholly free; if the new segment still does not fit, that is the OOM.

Which of two cached blocks of the same size gets reused depends on their
addresses, that is, on where the CUDA driver placed their segments. That
placement does not follow from the allocation sequence (on the recorded traces
it is mostly top-down, with runs going up and old gaps refilled), so the
replay guesses it: see ADDRESS_ORDERS. Fed the addresses a real run got, the
replay puts every block of the 13 recorded H100 traces at the same address as
the real allocator did, and its peaks equal max_memory_reserved and
max_memory_allocated to the byte (tests/test_fit_allocator.py); with the
default guess 12 of the 13 peaks are exact and one is 5.1 % high
(bench/fit/eval_allocator.py).

Not modelled (the numbers are then a lower bound or approximate):
- `expandable_segments:True` (segments grown by mapping pages);
- `garbage_collection_threshold`, which frees aged blocks before the cap;
- `max_non_split_rounding_size`: with `max_split_size` set, an oversize
  cached block serves requests up to 20 MiB smaller, that setting's default;
- more than one stream: blocks are per stream in the real allocator, and a
  block used on a side stream (`record_stream`) is freed late, when its event
  completes: feed that late free, as the trace's `free_completed` does;
- CUDA graph private pools and `torch.cuda.MemPool`;
- the driver's own refusal below `capacity` (fragmentation of device memory,
  other processes); `capacity` is the only limit;
- per-size-interval `roundup_power2_divisions` lists: one value applies to
  every size here;
- memory the allocator never sees: the CUDA context, cuBLAS/cuDNN workspaces
  taken outside it, NCCL buffers.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field

MIN_BLOCK = 512  # kMinBlockSize: every request is rounded to a multiple of this
SMALL_SIZE = 1 << 20  # kSmallSize: the largest request the small pool serves
SMALL_BUFFER = 2 << 20  # kSmallBuffer: the small pool's segment size
LARGE_BUFFER = 20 << 20  # kLargeBuffer: the segment for large requests under 10 MiB
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc: from here a segment is the request itself
ROUND_LARGE = 2 << 20  # kRoundLarge: big segments are rounded up to this

# Where a replay puts its first segment. Addresses only order blocks of equal
# size (best fit takes the lowest address), so any base works; this one leaves
# room to go down as well as up.
_BASE_ADDRESS = 1 << 56

# Address orders for new segments. The allocator's logic is deterministic, but
# which of two equal-size cached blocks it reuses depends on where the driver
# put their segments, which the replay cannot know. On the H100 traces in
# bench/fit/data the driver mostly hands out addresses top-down (a newer
# segment usually lies lower), so that is the default; "ascending" is the
# opposite guess. On those traces the two peaks bracket the real one, so the
# pair shows how much the unknown placement can matter for a given step.
ADDRESS_ORDERS = ("descending", "ascending")


class AllocatorError(ValueError):
    """The event sequence is not a valid program: a free of an unknown block, a
    block allocated twice, an unknown action or a negative size."""


@dataclass
class AllocatorPeak:
    """What the replay saw. Byte counts are of blocks (rounded sizes), as the
    allocator's own statistics count them."""

    peak_reserved: int = 0  # max_memory_reserved(): bytes of segments held at the worst moment
    peak_allocated: int = 0  # max_memory_allocated(): bytes of live blocks at the worst moment
    segments: int = 0  # segments obtained from the driver (cudaMalloc calls)
    segment_bytes: int = 0  # their total size, released ones included
    segments_released: int = 0  # segments given back to make room under `capacity`
    reserved: int = 0  # held when the events ended (or at the OOM)
    allocated: int = 0  # live when the events ended (or at the OOM)
    peak_requested: int = 0  # the peak of live bytes as requested, before rounding
    oom: bool = False  # an allocation did not fit under `capacity`; replay stopped there
    oom_event: int | None = None  # index, in the events, of the allocation that failed
    oom_bytes: int = 0  # the segment size that could not be obtained
    segment_sizes: list[int] = field(default_factory=list)  # each segment's size, in order


class _Block:
    """One block of a segment: a run of bytes, allocated or cached."""

    __slots__ = ("address", "size", "small", "prev", "next", "allocated", "requested")

    def __init__(self, address: int, size: int, small: bool) -> None:
        self.address = address
        self.size = size
        self.small = small
        self.prev: _Block | None = None
        self.next: _Block | None = None
        self.allocated = False
        self.requested = 0

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None


class _Pool:
    """Cached (free) blocks of one pool, ordered by (size, address) as the
    allocator's std::set with BlockComparatorSize orders them. One stream only,
    so the stream key is left out."""

    __slots__ = ("keys", "blocks", "small")

    def __init__(self, small: bool) -> None:
        self.small = small
        self.keys: list[tuple[int, int]] = []
        self.blocks: dict[tuple[int, int], _Block] = {}

    def add(self, block: _Block) -> None:
        key = (block.size, block.address)
        bisect.insort(self.keys, key)
        self.blocks[key] = block

    def remove(self, block: _Block) -> None:
        key = (block.size, block.address)
        index = bisect.bisect_left(self.keys, key)
        del self.keys[index]
        del self.blocks[key]

    def smallest_fit(self, size: int) -> _Block | None:
        """The block `pool.blocks.lower_bound(size)` finds: the smallest that
        holds `size`, lowest address among equals."""
        index = bisect.bisect_left(self.keys, (size, 0))
        if index == len(self.keys):
            return None
        return self.blocks[self.keys[index]]


def round_size(size: int, roundup_power2_divisions: int = 0) -> int:
    """The block size a request of `size` bytes gets (`round_size`)."""
    if size < MIN_BLOCK:
        return MIN_BLOCK
    divisions = roundup_power2_divisions
    if divisions > 1 and size > MIN_BLOCK * divisions:
        return _roundup_power2_next_division(size, divisions)
    return MIN_BLOCK * ((size + MIN_BLOCK - 1) // MIN_BLOCK)


def _roundup_power2_next_division(size: int, divisions: int) -> int:
    # Splits [2^k, 2^(k+1)) into `divisions` equal steps and rounds up to the
    # next step, as roundup_power2_next_division does (divisions is a power of
    # two in practice; the allocator uses its floor power of two).
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    rounded_down = size & ~(step - 1)
    return size if rounded_down == size else rounded_down + step


def segment_size(rounded: int) -> int:
    """The segment cudaMalloc'd when no cached block holds a block of
    `rounded` bytes (`get_allocation_size`)."""
    if rounded <= SMALL_SIZE:
        return SMALL_BUFFER
    if rounded < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * ((rounded + ROUND_LARGE - 1) // ROUND_LARGE)


class CachingAllocator:
    """The allocator's state. `replay` drives it; tests may drive it by hand."""

    def __init__(
        self,
        capacity: int | None = None,
        *,
        max_split_size: int | None = None,
        roundup_power2_divisions: int = 0,
        address_order: str = "descending",
        segment_addresses: Iterable[int] | None = None,
    ) -> None:
        if address_order not in ADDRESS_ORDERS:
            raise ValueError(f"address_order must be one of {ADDRESS_ORDERS}, not {address_order!r}")
        self.capacity = capacity
        # None is the allocator's default, SIZE_MAX: every block may be split.
        self.max_split_size = max_split_size
        self.divisions = roundup_power2_divisions
        self.small = _Pool(small=True)
        self.large = _Pool(small=False)
        self.live: dict[object, _Block] = {}
        self.stats = AllocatorPeak()
        self._requested = 0
        self._step = -1 if address_order == "descending" else 1
        self._next_address = _BASE_ADDRESS
        # Known cudaMalloc addresses (from a recorded trace) replace the guess,
        # so a test can check the allocator's logic alone.
        self._addresses = iter(segment_addresses) if segment_addresses is not None else None

    # -- allocation ---------------------------------------------------------

    def malloc(self, block_id: object, nbytes: int) -> bool:
        """Allocate `nbytes` for `block_id`; False when it does not fit under
        `capacity` even after giving cached segments back (a CUDA OOM)."""
        if nbytes < 0:
            raise AllocatorError(f"negative allocation size {nbytes} for block {block_id!r}")
        if block_id in self.live:
            raise AllocatorError(f"block {block_id!r} allocated again before it was freed")
        size = round_size(nbytes, self.divisions)
        pool = self.small if size <= SMALL_SIZE else self.large
        block = self._cached_block(pool, size)
        if block is None:
            wanted = segment_size(size)
            block = (
                self._new_segment(pool, wanted)
                or (self._release_oversize(pool, size) and self._new_segment(pool, wanted))
                or (self._release_all_free_segments() and self._new_segment(pool, wanted))
            )
            if not block:
                self.stats.oom = True
                self.stats.oom_bytes = wanted
                return False
        if self._should_split(block, size):
            block = self._split(pool, block, size)
        block.allocated = True
        block.requested = nbytes
        self.live[block_id] = block
        stats = self.stats
        stats.allocated += block.size
        stats.peak_allocated = max(stats.peak_allocated, stats.allocated)
        self._requested += nbytes
        stats.peak_requested = max(stats.peak_requested, self._requested)
        return True

    def _cached_block(self, pool: _Pool, size: int) -> _Block | None:
        # get_free_block: best fit, with the two max_split_size guards that keep
        # oversize blocks for oversize requests.
        block = pool.smallest_fit(size)
        if block is None:
            return None
        limit = self.max_split_size
        if limit is not None:
            if size < limit and block.size >= limit:
                return None
            if size >= limit and block.size >= size + LARGE_BUFFER:
                return None
        pool.remove(block)
        return block

    def _should_split(self, block: _Block, size: int) -> bool:
        remaining = block.size - size
        if block.small:
            return remaining >= MIN_BLOCK
        limit = self.max_split_size
        return (limit is None or size < limit) and remaining > SMALL_SIZE

    def _split(self, pool: _Pool, block: _Block, size: int) -> _Block:
        # alloc_found_block: the front `size` bytes are handed out; the rest
        # stays cached, in place, as the next block of the segment.
        front = _Block(block.address, size, block.small)
        front.prev = block.prev
        if front.prev is not None:
            front.prev.next = front
        front.next = block
        block.prev = front
        block.address += size
        block.size -= size
        pool.add(block)
        return front

    def _new_segment(self, pool: _Pool, size: int) -> _Block | None:
        # alloc_block: the cap is checked against every segment held, as
        # set_fraction's allowed_memory_maximum is.
        stats = self.stats
        if self.capacity is not None and stats.reserved + size > self.capacity:
            return None
        address = next(self._addresses, None) if self._addresses is not None else None
        if address is None:
            # Segments never overlap: stepping by more than any segment (1 TiB)
            # keeps them apart whichever way the addresses go.
            address = self._next_address
            self._next_address += self._step << 40
        block = _Block(address, size, pool.small)
        stats.segments += 1
        stats.segment_bytes += size
        stats.segment_sizes.append(size)
        stats.reserved += size
        stats.peak_reserved = max(stats.peak_reserved, stats.reserved)
        return block

    # -- giving segments back -----------------------------------------------

    def _release(self, pool: _Pool, block: _Block) -> None:
        pool.remove(block)
        self.stats.reserved -= block.size
        self.stats.segments_released += 1

    def _release_oversize(self, pool: _Pool, size: int) -> bool:
        # release_available_cached_blocks: only with max_split_size set. Frees
        # the smallest oversize cached segment that covers the request, else the
        # largest ones until their total does.
        limit = self.max_split_size
        if limit is None:
            return False
        key = max(size, limit)
        index = bisect.bisect_left(pool.keys, (key, 0))
        if index < len(pool.keys):
            block = pool.blocks[pool.keys[index]]
            if block.is_split():  # cannot happen: oversize blocks are never split
                return False
            self._release(pool, block)
            return True
        released = 0
        index -= 1
        while index >= 0 and released < key:
            block = pool.blocks[pool.keys[index]]
            if block.size < limit or block.is_split():
                break
            # Oversize blocks are never split, so each is a whole segment.
            released += block.size
            self._release(pool, block)
            index -= 1
        return released >= key

    def _release_all_free_segments(self) -> bool:
        # release_cached_blocks: every cached block that is a whole segment
        # goes back; a segment with any block in use stays.
        for pool in (self.large, self.small):
            for key in list(pool.keys):
                block = pool.blocks[key]
                if not block.is_split():
                    self._release(pool, block)
        return True

    # -- freeing -------------------------------------------------------------

    def free(self, block_id: object) -> None:
        block = self.live.pop(block_id, None)
        if block is None:
            raise AllocatorError(f"free of block {block_id!r}, which is not allocated")
        stats = self.stats
        stats.allocated -= block.size
        self._requested -= block.requested
        block.allocated = False
        pool = self.small if block.small else self.large
        # free_block + try_merge_blocks: absorb free neighbours in the segment.
        prev = block.prev
        if prev is not None and not prev.allocated:
            pool.remove(prev)
            block.address = prev.address
            block.size += prev.size
            block.prev = prev.prev
            if block.prev is not None:
                block.prev.next = block
        nxt = block.next
        if nxt is not None and not nxt.allocated:
            pool.remove(nxt)
            block.size += nxt.size
            block.next = nxt.next
            if block.next is not None:
                block.next.prev = block
        pool.add(block)


def replay(
    events: Iterable[tuple[str, object, int]],
    capacity: int | None = None,
    *,
    max_split_size: int | None = None,
    roundup_power2_divisions: int = 0,
    address_order: str = "descending",
    segment_addresses: Iterable[int] | None = None,
) -> AllocatorPeak:
    """Replay ("alloc", block_id, requested_nbytes) and ("free", block_id, _)
    events, in program order on one stream, through the caching allocator.

    `capacity` is the most the allocator may reserve (the card's memory less
    the CUDA context, or what `set_per_process_memory_fraction` allows); None
    means no limit. When an allocation does not fit, the result has `oom` set
    and the replay stops there, as the real step would raise
    `torch.OutOfMemoryError`. `max_split_size` and `roundup_power2_divisions`
    are the PYTORCH_CUDA_ALLOC_CONF settings of those names, in bytes and
    divisions.

    `address_order` is the guess at where the driver puts each new segment
    (see ADDRESS_ORDERS); `segment_addresses`, when known, are the addresses
    it did return, in order (the trace's `segment_alloc` entries), and replace
    the guess while they last.
    """
    allocator = CachingAllocator(
        capacity,
        max_split_size=max_split_size,
        roundup_power2_divisions=roundup_power2_divisions,
        address_order=address_order,
        segment_addresses=segment_addresses,
    )
    for index, (action, block_id, nbytes) in enumerate(events):
        if action == "alloc":
            if not allocator.malloc(block_id, nbytes):
                allocator.stats.oom_event = index
                break
        elif action == "free":
            allocator.free(block_id)
        else:
            raise AllocatorError(f"event {index}: unknown action {action!r} (expected 'alloc' or 'free')")
    return allocator.stats


def trace_events(recorded: Iterable[object]) -> list[tuple[str, object, int]]:
    """Turn a `torch.cuda.memory._record_memory_history` trace (the entries of
    `_snapshot()["device_traces"][device]`, as dicts or as
    [action, addr, size, stream] lists) into replay events.

    An `alloc` entry's size is the size requested (the allocator records
    `orig_size`, before rounding). A block is free for reuse at
    `free_completed`, not `free_requested`: the two differ when a block used on
    another stream waits for its event. Segment, snapshot and OOM entries are
    the allocator's own doing, which the replay recomputes, so they are skipped.
    """
    events: list[tuple[str, object, int]] = []
    for entry in recorded:
        action, address, size = _entry(entry)
        if action == "alloc":
            events.append(("alloc", address, int(size)))
        elif action == "free_completed":
            events.append(("free", address, 0))
    return events


def _entry(entry: object) -> tuple[str, int, int]:
    if isinstance(entry, dict):
        return entry["action"], entry["addr"], entry["size"]
    return entry[0], entry[1], entry[2]  # type: ignore[index]


def trace_segments(recorded: Iterable[object]) -> tuple[int, list[tuple[int, int]]]:
    """What the real allocator did in a recorded trace: the peak of reserved
    bytes (segments obtained less segments given back, pages mapped less pages
    unmapped with expandable segments) and each segment obtained, as
    (address, size) in order."""
    reserved = peak = 0
    segments: list[tuple[int, int]] = []
    for entry in recorded:
        action, address, size = _entry(entry)
        if action in ("segment_alloc", "segment_map"):
            reserved += size
            peak = max(peak, reserved)
            if action == "segment_alloc":
                segments.append((address, size))
        elif action in ("segment_free", "segment_unmap"):
            reserved -= size
    return peak, segments
