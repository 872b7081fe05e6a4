"""Quick H200 timing of the compiled Mamba-2 speculative ops (not the full benchmark of bench/): nano4b
(H=96 P=80 N=128 G=8), batch 256, fp32 checkpoint, L=16, T=4 drafts, random acceptance in [0, 4],
verify + commit rounds replayed from one CUDA graph of 16 rounds (so folds are included at their
rate), against the conventional T=4 baseline (state read once, 4 snapshots written).

Byte model of a spec round (no fold): the read state (fp32 checkpoint or its bf16/fp8 read copy), the
window's x/B/dt rows and the drafts' inputs; a fold adds one checkpoint read + write (+ read copy write)
for the folding rows. The baseline moves 1 state read + T state writes. The state is ~1 GB at batch 256,
far beyond the 60 MB L2, so every round runs cold.
    python3 scripts/time_spec_mamba2.py
"""

import statistics

import torch

from replayssm_cuda import Mamba2Cache, Mamba2Weights, _extension, ops

H, P, N, G = 96, 80, 128, 8
BATCH, L, T, ROUNDS = 256, 16, 4, 16
COPY_BW = 4.25e12   # measured device-to-device copy, bytes read + written per second
dev = "cuda"
torch.manual_seed(0)
weights = Mamba2Weights(A=-(0.5 + torch.rand(H, device=dev)), D=torch.randn(H, device=dev),
                        dt_bias=0.1 * torch.randn(H, device=dev), dt_softplus=True)


def timed(fn, reps=7):
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def drafts():
    return (torch.randn(BATCH, T, H, P, device=dev).bfloat16(), (0.5 * torch.randn(BATCH, T, H, device=dev)).bfloat16(),
            torch.randn(BATCH, T, G, N, device=dev).bfloat16(), torch.randn(BATCH, T, G, N, device=dev).bfloat16(),
            torch.randn(BATCH, T, H, P, device=dev).bfloat16())


def spec_round_us(read_copy_dtype):
    cache = Mamba2Cache(BATCH, H, P, N, G, weights, buffer_len=L, max_draft_tokens=T,
                        read_copy_dtype=read_copy_dtype, device=dev, backend="auto")
    cache.load(0.3 * torch.randn(BATCH, H, P, N, device=dev))
    slots = torch.randperm(BATCH, device=dev)
    inputs = [drafts() for _ in range(ROUNDS)]
    accepted = torch.randint(0, T + 1, (ROUNDS, BATCH), device=dev, dtype=torch.int32)
    out = torch.empty_like(inputs[0][0])
    w = cache.weights

    def verify(r):
        x, dt, B, C, z = inputs[r]
        ops.mamba2_verify(*cache._cache_args(), x, dt, w.A, B, C, out, w.D, z, w.dt_bias, True, slots, -1,
                          backend="cuda")

    def commit(r):
        ops.mamba2_commit(*cache._cache_args(), accepted[r], w.A, T, slots, -1, backend="cuda")

    def rounds():
        for r in range(ROUNDS):
            verify(r)
            commit(r)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        rounds()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        rounds()
    verify_graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(verify_graph):
        verify(0)
    per_round = timed(graph.replay) / ROUNDS
    verify_only = timed(verify_graph.replay)
    read = cache.read_copy if cache.read_copy is not None else cache.checkpoint
    state_bytes = read.numel() * read.element_size()
    return per_round, verify_only, state_bytes


def baseline_us():
    state = 0.3 * torch.randn(BATCH, H, P, N, device=dev)
    x, dt, B, C, z = drafts()
    out = torch.empty_like(x)
    if _extension.has_op("mamba2_update_snapshots"):
        snaps = torch.empty(BATCH, T, H, P, N, device=dev)
        fn = lambda: ops.mamba2_update_snapshots(state, x, dt, weights.A, B, C, out, snaps, weights.D, z,  # noqa: E731
                                                 weights.dt_bias, True, backend="cuda")
        what = "mamba2_update_snapshots (compiled)"
    else:   # T conventional updates: 2T state passes instead of 1 + T, so a generous stand-in
        fn = lambda: [ops.mamba2_update(state, x[:, t], dt[:, t], weights.A, B[:, t], C[:, t], out[:, t],  # noqa: E731
                                        weights.D, z[:, t], weights.dt_bias, True, backend="cuda") for t in range(T)]
        what = f"{T} x mamba2_update (snapshot kernel not compiled)"
    fn()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    model = (1 + T) * state.numel() * 4 / COPY_BW * 1e6
    return timed(graph.replay), what, model


if __name__ == "__main__":
    base, what, model = baseline_us()
    print(f"baseline {what}: {base:.0f} us per round; snapshot byte model at copy bandwidth {model:.0f} us")
    for rc in (None, torch.bfloat16, torch.float8_e4m3fn):
        per_round, verify_only, state_bytes = spec_round_us(rc)
        floor = state_bytes / COPY_BW * 1e6
        print(f"read copy {str(rc):>20}: verify T={T} {verify_only:.0f} us (state read floor {floor:.0f} us, "
              f"{100 * floor / verify_only:.0f}%), verify+commit round {per_round:.0f} us; "
              f"speedup vs baseline {base / per_round:.2f}x, vs snapshot byte model {model / per_round:.2f}x")
