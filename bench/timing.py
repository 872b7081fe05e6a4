"""What every benchmark here shares: the reference dims, the cold-L2 slot rotation, the copy-bandwidth
ceiling, random Mamba-2 weights, and the CUDA-graph timing loop (capture once, replay, median of the
replays)."""

import math
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
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        record()                            # warm-up (module load, first launches) outside the graph
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        record()
    times = []
    for _ in range(replays + 3):
        if before_replay is not None:
            before_replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del graph
    return statistics.median(times[3:])
