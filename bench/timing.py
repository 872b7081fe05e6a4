"""What every benchmark here shares: the reference dims, the cold-L2 slot rotation, the copy-bandwidth
ceiling, random Mamba-2 weights, and the CUDA-graph timing loop (capture once, replay, median of the
replays), plus a per-kernel breakdown of such a graph (graph_kernel_times)."""

import math
import re
import statistics

import torch


# (H, P, N, G) of the reference Mamba-2 layers (SPEC.md section 6).
DIMS = {"nano4b": (96, 80, 128, 8), "super120b": (128, 64, 128, 8)}
L2_BYTES = 60 * 2**20
COLD_FACTOR = 4          # rotate over at least this many L2s worth of state


def cold_groups(batch: int, bytes_per_row: int) -> int:
    """Slot groups to rotate over so the bytes a graph touches are well over L2 (at least 2 groups)."""
    return max(2, math.ceil(COLD_FACTOR * L2_BYTES / (batch * bytes_per_row)))


def measure_copy_bandwidth() -> float:
    """Bytes read + written per second of a 1 GiB device-to-device copy (median of 20)."""
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    times = []
    for _ in range(25):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
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


def time_graph(record, replays=15, before_replay=None) -> float:
    """Capture record() (the steps or rounds to time) into a CUDA graph; return the median replay
    time in seconds."""
    graph = _capture(record)
    times = _replay_times(graph, replays + 3, before_replay)
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


def _replay_times(graph, count, before_replay=None):
    """Seconds of each of `count` replays between CUDA events (before_replay() runs before each start)."""
    times = []
    for _ in range(count):
        if before_replay is not None:
            before_replay()
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
    show as replay minus the kernels' sum. Kernels launched by before_replay are left out (they run
    before the start event, so they are not counted in "(replay)" either)."""
    from torch.profiler import ProfilerActivity, profile

    graph = _capture(record)
    _replay_times(graph, 3, before_replay)  # warm-up replays, outside the profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        times = _replay_times(graph, replays, before_replay)
    del graph
    before = set()
    if before_replay is not None:           # the names of before_replay's own kernels
        with profile(activities=[ProfilerActivity.CUDA]) as probe:
            before_replay()
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
