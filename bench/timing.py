"""What every benchmark here shares: the reference dims, the cold-L2 slot rotation, the copy-bandwidth
ceiling, random Mamba-2 weights, and the CUDA-graph timing loop (capture once, replay, median of the
replays, each replay queued behind a spinning kernel so that only GPU time is timed: HOLD_US), plus a
per-kernel breakdown of such a graph (graph_kernel_times)."""

import math
import os
import re
import statistics

import torch


# (H, P, N, G) of the reference Mamba-2 layers (docs/DESIGN.md section 6).
DIMS = {"nano4b": (96, 80, 128, 8), "super120b": (128, 64, 128, 8)}
L2_BYTES = 60 * 2**20
COLD_FACTOR = 4          # rotate over at least this many L2s worth of state


def cold_groups(batch: int, bytes_per_row: int) -> int:
    """Slot groups to rotate over so the bytes a graph touches are well over L2 (at least 2 groups)."""
    return max(2, math.ceil(COLD_FACTOR * L2_BYTES / (batch * bytes_per_row)))


# The timed region starts with its work already queued. With the GPU idle (the previous replay was
# waited for), the start event ran at once and the GPU then waited for what the host was still
# launching, so host time was counted as GPU time: graph.replay()'s launch, 1.3-2.4 us a step where a
# graph holds two steps (every batch from 64 on), 2-6 us once torch.profiler had run in the process
# (its callbacks slow every launch); and torch's dispatch of the copy, which made the 1 GiB copy
# 1.8-3.2% slower and so every "% of copy" as much too high (session 25, scripts/wave_probe.py, runs 2
# and 6). A spinning kernel (torch.cuda._sleep) ahead of the start event keeps the GPU busy while the
# host queues the timed work, so the interval between the events is GPU time only: the kernels and the
# gaps between them. It moves no memory, so L2 stays as cold as before. REPLAYSSM_BENCH_HOLD_US sets its
# length (0: the old method, for comparison).
HOLD_US = float(os.environ.get("REPLAYSSM_BENCH_HOLD_US", "300"))


def hold_gpu(us: float | None = None) -> None:
    """Queue a kernel that keeps the GPU busy for about `us` microseconds (default HOLD_US)."""
    us = HOLD_US if us is None else us
    if us > 0:
        torch.cuda._sleep(int(us * 2000))  # clock cycles; ~us at the H200's 1.98 GHz, longer at lower clocks


def measure_copy_bandwidth(hold_us=None) -> float:
    """Bytes read + written per second of a 1 GiB device-to-device copy (median of 20; hold_us: see
    HOLD_US)."""
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda").random_(0, 255)
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


def weights(s):
    """A (negative), D and dt_bias for the s.H heads of a benchmark setup."""
    A = -(0.5 + torch.rand(s.H, device="cuda"))
    return A, torch.randn(s.H, device="cuda"), 0.1 * torch.randn(s.H, device="cuda")


def time_graph(record, replays=15, before_replay=None, hold_us=None) -> float:
    """Capture record() (the steps or rounds to time) into a CUDA graph; return the median replay
    time in seconds (hold_us: see HOLD_US)."""
    graph = _capture(record)
    times = _replay_times(graph, replays + 3, before_replay, hold_us)
    del graph
    return statistics.median(times[3:])


def _capture(record):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        record()                            # warm-up (module load, first launches) outside the graph
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        record()
    return graph


def _replay_times(graph, count, before_replay=None, hold_us=None):
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


def graph_kernel_times(record, replays=10, before_replay=None) -> dict:
    """Capture record() as time_graph does and replay it under torch.profiler (CUPTI kernel records):
    GPU seconds per replay of each kernel, keyed by its name without namespace and template arguments,
    and under "(replay)" the median replay time between CUDA events, so that the gaps between kernels
    show as replay minus the kernels' sum. Kernels launched by before_replay, and the hold kernel, are left
    out (they run before the start event, so they are not counted in "(replay)" either)."""
    from torch.profiler import ProfilerActivity, profile

    graph = _capture(record)
    _replay_times(graph, 3, before_replay)  # warm-up replays, outside the profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        times = _replay_times(graph, replays, before_replay)
    del graph
    with profile(activities=[ProfilerActivity.CUDA]) as probe:  # the names of the kernels ahead of the start
        if before_replay is not None:
            before_replay()
        hold_gpu(1.0)
        torch.cuda.synchronize()
    before = {_kernel_name(e.key) for e in probe.key_averages()}
    totals = {}
    for e in prof.key_averages():
        name = _kernel_name(e.key)
        device_us = getattr(e, "device_time_total", None)
        if device_us is None:
            device_us = e.cuda_time_total
        if name in before or device_us <= 0:
            continue
        totals[name] = totals.get(name, 0.0) + device_us / 1e6 / replays
    totals["(replay)"] = statistics.median(times)
    return totals


def _kernel_name(key: str) -> str:
    """'void ns::(anonymous namespace)::cursor_kernel<64, ...>(Params)' -> 'cursor_kernel'."""
    head = re.split(r"[<(]", key.replace("(anonymous namespace)::", ""), maxsplit=1)[0]
    return head.replace("void ", "").strip().split("::")[-1]
