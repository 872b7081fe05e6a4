"""The measured method every benchmark row uses.

- GPU time: the work is captured once into a CUDA graph and replayed; a row's time is the median of the
  replays (the first few are warm-up and dropped), each replay timed between two CUDA events.
- Cold L2: the state a graph touches rotates over enough slot groups (cold_groups) that a group's bytes
  have left L2 before the group is visited again: at least COLD_FACTOR times the L2 size in all.
- No host time: the timed region starts with its work already queued. With the GPU idle, the start event
  would run at once and the GPU would then wait for whatever the host was still launching, so host time
  would be counted as GPU time: graph.replay()'s own launch, 1.3-2.4 us a step where a graph holds two
  steps (every batch from 64 on), 2-6 us once torch.profiler has run in the process (its callbacks slow
  every launch); and torch's dispatch of the copy, which made the 1 GiB copy 1.8-3.2% slower and so every
  "% of copy" as much too high. A spinning kernel (torch.cuda._sleep, hold_gpu) queued ahead of the start
  event keeps the GPU busy while the host queues the timed work, so the interval between the events is
  GPU time only: the kernels and the gaps between them. It moves no memory, so L2 stays as cold as
  before. `--hold-us` sets its length (0: no hold, the host launch is timed too).
- The ceiling: the device-to-device copy bandwidth (bytes read + written per second of a 1 GiB copy),
  measured in the same run and the same way; every row's byte model is also given as a fraction of it.
- Host time (the eager overhead rows only): wall time of back-to-back calls with no synchronisation
  between them, divided by the calls, median over loops (host_us_per_call).

The settings (HOLD_US, REPLAYS, KERNEL_TIMES) are module globals that the command line sets once.
"""

from __future__ import annotations

import functools
import math
import re
import statistics
import time

import torch

L2_BYTES = 60 * 2**20    # the least L2 size assumed (H100 / H200); a larger device L2 is used when reported
COLD_FACTOR = 4          # rotate over at least this many L2s worth of state

HOLD_US = 300.0          # length of the GPU hold ahead of every timed region (--hold-us)
REPLAYS = 15             # timed replays per row after 3 warm-up replays (--replays)
KERNEL_TIMES = False     # also break each graph's time down per kernel under torch.profiler (--kernel-times)
WARMUP_REPLAYS = 3


def configure(hold_us: float | None = None, replays: int | None = None, kernel_times: bool | None = None) -> None:
    """Set the method's settings for the rest of the process (the command line calls this once)."""
    global HOLD_US, REPLAYS, KERNEL_TIMES
    if hold_us is not None:
        if hold_us < 0:
            raise ValueError(f"hold_us must be >= 0, got {hold_us!r}")
        HOLD_US = float(hold_us)
    if replays is not None:
        if replays < 1:
            raise ValueError(f"replays must be >= 1, got {replays!r}")
        REPLAYS = int(replays)
    if kernel_times is not None:
        KERNEL_TIMES = bool(kernel_times)


@functools.lru_cache(maxsize=None)
def device_l2_bytes() -> int:
    """The L2 size to stay clear of: the device's when CUDA reports a larger one, else L2_BYTES."""
    if torch.cuda.is_available():
        reported = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 0)
        return max(L2_BYTES, int(reported or 0))
    return L2_BYTES


def cold_groups(batch: int, bytes_per_row: int, l2_bytes: int | None = None) -> int:
    """Slot groups to rotate over so the bytes a graph touches are well over L2 (at least 2 groups)."""
    l2 = device_l2_bytes() if l2_bytes is None else l2_bytes
    return max(2, math.ceil(COLD_FACTOR * l2 / (batch * bytes_per_row)))


def hold_gpu(us: float | None = None) -> None:
    """Queue a kernel that keeps the GPU busy for about `us` microseconds (default HOLD_US)."""
    us = HOLD_US if us is None else us
    if us > 0:
        torch.cuda._sleep(int(us * 2000))  # clock cycles; ~us at 1.98 GHz, longer at lower clocks


def measure_copy_bandwidth(hold_us: float | None = None, nbytes: int = 2**30) -> float:
    """Bytes read + written per second of an `nbytes` device-to-device copy (median of 20 after 5
    warm-up copies; each copy queued behind hold_gpu(hold_us))."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    times = []
    for _ in range(25):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        hold_gpu(hold_us)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * src.numel() / statistics.median(times[5:])


def time_graph(record, replays: int | None = None, before_replay=None, hold_us: float | None = None) -> float:
    """Capture record() (the steps or rounds to time) into a CUDA graph; return the median replay time in
    seconds over `replays` (default REPLAYS) replays after WARMUP_REPLAYS. before_replay() runs before
    each replay's hold, outside the timed region (e.g. to reset cursors)."""
    replays = REPLAYS if replays is None else replays
    graph = capture(record)
    times = replay_times(graph, replays + WARMUP_REPLAYS, before_replay, hold_us)
    del graph
    return statistics.median(times[WARMUP_REPLAYS:])


def timed(record, per_graph: int, before_replay=None) -> tuple[float, dict | None]:
    """Seconds per unit of work of a graph that does `per_graph` units (time_graph / per_graph), and with
    KERNEL_TIMES the GPU seconds per unit of each kernel (graph_kernel_times, "(replay)" included)."""
    seconds = time_graph(record, before_replay=before_replay) / per_graph
    kernels = None
    if KERNEL_TIMES:
        kernels = {name: t / per_graph for name, t in graph_kernel_times(record, before_replay=before_replay).items()}
    return seconds, kernels


def capture(record):
    """record() once on a side stream (module load and first launches stay out of the graph), then
    captured into a CUDA graph, which is returned."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        record()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        record()
    return graph


def replay_times(graph, count: int, before_replay=None, hold_us: float | None = None) -> list[float]:
    """Seconds of each of `count` replays between CUDA events (before_replay() runs before each start,
    then hold_gpu(hold_us))."""
    times = []
    for _ in range(count):
        if before_replay is not None:
            before_replay()
        hold_gpu(hold_us)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return times


def graph_kernel_times(record, replays: int = 10, before_replay=None) -> dict:
    """Capture record() as time_graph does and replay it under torch.profiler (CUPTI kernel records):
    GPU seconds per replay of each kernel, keyed by its name without namespace and template arguments,
    and under "(replay)" the median replay time between CUDA events, so that the gaps between kernels
    show as replay minus the kernels' sum. Kernels launched by before_replay, and the hold kernel, are left
    out (they run before the start event, so they are not counted in "(replay)" either)."""
    from torch.profiler import ProfilerActivity, profile

    graph = capture(record)
    replay_times(graph, 3, before_replay)  # warm-up replays, outside the profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        times = replay_times(graph, replays, before_replay)
    del graph
    with profile(activities=[ProfilerActivity.CUDA]) as probe:  # the names of the kernels ahead of the start
        if before_replay is not None:
            before_replay()
        hold_gpu(1.0)
        torch.cuda.synchronize()
    before = {kernel_name(e.key) for e in probe.key_averages()}
    totals = {}
    for e in prof.key_averages():
        name = kernel_name(e.key)
        device_us = getattr(e, "device_time_total", None)
        if device_us is None:
            device_us = e.cuda_time_total
        if name in before or device_us <= 0:
            continue
        totals[name] = totals.get(name, 0.0) + device_us / 1e6 / replays
    totals["(replay)"] = statistics.median(times)
    return totals


def kernel_name(key: str) -> str:
    """'void ns::(anonymous namespace)::cursor_kernel<64, ...>(Params)' -> 'cursor_kernel'."""
    head = re.split(r"[<(]", key.replace("(anonymous namespace)::", ""), maxsplit=1)[0]
    return head.replace("void ", "").strip().split("::")[-1]


def host_us_per_call(call, calls: int, loops: int, warmup: int = 20) -> float:
    """Host microseconds per eager call: median over `loops` loops of the wall time of `calls` back-to-back
    calls (no synchronisation inside a loop: the GPU runs behind the host, and a few hundred launches stay
    well inside the runtime's launch queue); the GPU is synchronised between loops, outside the timing."""
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(loops):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        per_call.append((time.perf_counter() - start) / calls)
        torch.cuda.synchronize()
    return statistics.median(per_call) * 1e6
