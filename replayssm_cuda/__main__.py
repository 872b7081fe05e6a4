"""`python -m replayssm_cuda info`, `python -m replayssm_cuda demo` and `python -m replayssm_cuda bench ...`."""

from __future__ import annotations

import argparse
import re
import time
import warnings

import torch

from . import __version__, _extension, ops
from ._schemas import ALL_OPS as ALL_SCHEMA_OPS
from .bench import cli as bench_cli
from .cache import DeltaRuleWeights, GDNCache, Mamba2Cache, Mamba2Weights

ALL_OPS = list(ALL_SCHEMA_OPS)


def info() -> None:
    print(f"replayssm_cuda {__version__}")
    print(f"install: {_extension.install_summary()}")
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda or 'none'})")
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        print(f"GPU: {p.name}, sm_{p.major}{p.minor}, {p.multi_processor_count} SMs, "
              f"{p.total_memory / 2**30:.0f} GiB")
    else:
        print("GPU: none (ops run the PyTorch reference)")
    if _extension.is_compiled():
        b = _extension.build_info()
        print(f"compiled extension: yes (CUDA {b['cuda_version']}, archs {b['archs']})")
    else:
        print(f"compiled extension: no ({_extension.load_error()})")
    compiled = [op for op in ALL_OPS if _extension.has_op(op)]
    print(f"compiled ops ({len(compiled)}/{len(ALL_OPS)}): {', '.join(compiled) or 'none'}")
    print(f"reference-only ops: {', '.join(op for op in ALL_OPS if op not in compiled) or 'none'}")


class _Stack:
    """A two-layer toy model: hidden -> Mamba-2 layer -> GDN layer, each with residual projections.
    The same weights drive a replay path (the state objects) and a conventional path (plain states
    updated token by token), so the demo can check one against the other."""

    def __init__(self, d_model, device, gen):
        def rnd(*shape, scale=1.0):
            return (scale * torch.randn(*shape, generator=gen)).to(device)
        self.d = d_model
        self.H, self.P, self.N, self.G = 8, 64, 64, 2     # a (P, N) the CUDA kernels compile
        self.mamba = Mamba2Weights(A=-(0.5 + torch.rand(self.H, generator=gen)).to(device), D=rnd(self.H),
                                   dt_bias=rnd(self.H, scale=0.1))
        self.Hk, self.HV, self.K, self.V = 2, 4, 32, 32
        self.gdn = DeltaRuleWeights(A_log=rnd(self.HV, scale=0.5), dt_bias=rnd(self.HV, scale=0.5))
        m_in = self.H * self.P * 2 + self.H + 2 * self.G * self.N
        g_in = 2 * self.Hk * self.K + self.HV * self.V + 2 * self.HV
        self.w_m_in, self.w_m_out = rnd(d_model, m_in, scale=d_model ** -0.5), rnd(self.H * self.P, d_model, scale=0.02)
        self.w_g_in, self.w_g_out = rnd(d_model, g_in, scale=d_model ** -0.5), rnd(self.HV * self.V, d_model, scale=0.02)

    def mamba_inputs(self, h):
        lead = h.shape[:-1]
        sizes = [self.H * self.P, self.H * self.P, self.H, self.G * self.N, self.G * self.N]
        x, z, dt, B, C = torch.split(h @ self.w_m_in, sizes, dim=-1)
        return (x.reshape(*lead, self.H, self.P).contiguous(), dt.contiguous(),
                B.reshape(*lead, self.G, self.N).contiguous(), C.reshape(*lead, self.G, self.N).contiguous(),
                z.reshape(*lead, self.H, self.P).contiguous())

    def gdn_inputs(self, h):
        lead = h.shape[:-1]
        sizes = [self.Hk * self.K, self.Hk * self.K, self.HV * self.V, self.HV, self.HV]
        q, k, v, a, b = torch.split(h @ self.w_g_in, sizes, dim=-1)
        return (q.reshape(*lead, self.Hk, self.K).contiguous(), k.reshape(*lead, self.Hk, self.K).contiguous(),
                v.reshape(*lead, self.HV, self.V).contiguous(), a.contiguous(), b.contiguous())

    def replay(self, h, mamba_cache, gdn_cache, slots, T=None):
        """One token per row (T None, via step) or T draft tokens per row (via verify)."""
        call_m = mamba_cache.step if T is None else mamba_cache.verify
        call_g = gdn_cache.step if T is None else gdn_cache.verify
        y = call_m(*self.mamba_inputs(h), slots=slots)
        h = h + y.flatten(-2) @ self.w_m_out
        o = call_g(*self.gdn_inputs(h), slots=slots)
        return h + o.flatten(-2) @ self.w_g_out

    def conventional(self, h, mamba_state, gdn_state, slots):
        m = self.mamba
        x, dt, B, C, z = self.mamba_inputs(h)
        y = torch.empty_like(x)
        ops.mamba2_update(mamba_state, x, dt, m.A, B, C, y, m.D, z, m.dt_bias, m.dt_softplus, slots,
                          backend="reference")
        h = h + y.flatten(-2) @ self.w_m_out
        q, k, v, a, b = self.gdn_inputs(h)
        o = torch.empty_like(v)
        ops.gdn_update(gdn_state, q, k, v, a, b, self.gdn.A_log, self.gdn.dt_bias, o, slots=slots,
                       backend="reference")
        return h + o.flatten(-2) @ self.w_g_out


def demo(steps: int, spec_rounds: int) -> bool:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gen = torch.Generator().manual_seed(0)
    num_slots, batch, L, T = 8, 4, 8, 3
    stack = _Stack(64, device, gen)
    print(f"demo on {device}: a Mamba-2 layer (H={stack.H} P={stack.P} N={stack.N} G={stack.G}) and a GDN "
          f"layer (H={stack.Hk} HV={stack.HV} K={stack.K} V={stack.V}), {batch} sequences in a pool of "
          f"{num_slots} slots, buffer length L={L}, up to {T} draft tokens")
    common = dict(buffer_len=L, max_draft_tokens=T, activation_dtype=torch.float32, device=device)
    with warnings.catch_warnings(record=True) as built:   # a cache names the ops it runs on the reference
        warnings.simplefilter("always")
        m_cache = Mamba2Cache(num_slots, stack.H, stack.P, stack.N, stack.G, stack.mamba,
                              read_copy_dtype=torch.bfloat16, **common)
        g_cache = GDNCache(num_slots, stack.Hk, stack.HV, stack.K, stack.V, stack.gdn, **common)
    m_state = torch.zeros(num_slots, stack.H, stack.P, stack.N, device=device)
    g_state = torch.zeros(num_slots, stack.HV, stack.V, stack.K, device=device)
    slots = torch.tensor([5, 0, 7, 2], device=device, dtype=torch.int32)

    worst, folds = 0.0, 0
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as fallbacks:
        warnings.simplefilter("always")
        for _ in range(steps):
            h = torch.randn(batch, stack.d, generator=gen).to(device)
            before = m_cache.num_committed[slots.long()].clone()
            out_replay = stack.replay(h, m_cache, g_cache, slots)
            out_conv = stack.conventional(h, m_state, g_state, slots)
            folds += int((m_cache.num_committed[slots.long()] < before).sum())
            worst = max(worst, ((out_replay - out_conv).norm() / out_conv.norm()).item())
        print(f"  {steps} decode steps: {folds} slot folds (flushes); max relative output error vs the "
              f"conventional recurrence {worst:.2e} (bf16 read copy on the Mamba-2 layer)")
        accepted_total, worst_spec = 0, 0.0
        for _ in range(spec_rounds):
            h = torch.randn(batch, T, stack.d, generator=gen).to(device)
            drafts = stack.replay(h, m_cache, g_cache, slots, T=T)
            accepted = torch.randint(0, T + 1, (batch,), generator=gen, dtype=torch.int32).to(device)
            m_cache.commit(accepted, slots=slots)
            g_cache.commit(accepted, slots=slots)
            for t in range(T):
                rows = (accepted > t).nonzero().flatten()
                if rows.numel() == 0:
                    continue
                conv = stack.conventional(h[rows, t], m_state, g_state, slots[rows])
                worst_spec = max(worst_spec, ((drafts[rows, t] - conv).norm() / conv.norm()).item())
            accepted_total += int(accepted.sum())
        print(f"  {spec_rounds} speculative rounds (verify {T} drafts, commit a random count): "
              f"{accepted_total} tokens accepted; max relative error {worst_spec:.2e}")
    m_final = m_cache.materialize(slots=slots)
    state_err = ((m_final - m_state[slots.long()]).norm() / m_state[slots.long()].norm()).item()
    print(f"  materialized Mamba-2 state vs conventional: relative error {state_err:.2e}")
    print(f"  bytes per slot: Mamba-2 {m_cache.bytes_per_slot()['total']}, GDN {g_cache.bytes_per_slot()['total']}")
    fallback = re.compile(r"replayssm_cuda: (.*?) runs? the PyTorch reference")
    paths = sorted({name for w in built + fallbacks if (m := fallback.match(str(w.message)))
                    for name in m.group(1).split(", ")})
    if device.type == "cuda":
        print(f"  ops that ran the PyTorch reference on the GPU (not compiled yet): {', '.join(paths) or 'none'}")
    print(f"  wall time {time.perf_counter() - start:.2f} s")
    ok = worst < 2e-2 and worst_spec < 2e-2 and state_err < 1e-4
    print("demo: OK" if ok else "demo: FAILED (errors above tolerance)")
    return ok


def _count(text: str) -> int:
    """An argparse type: an int >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an int >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an int >= 0, got {value}")
    return value


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m replayssm_cuda")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="version, build, GPU arch and which ops are compiled")
    d = sub.add_parser("demo", help="decode a small Mamba-2 + GDN stack, checked against the conventional recurrence")
    d.add_argument("--steps", type=_count, default=40, help="decode steps (>= 0)")
    d.add_argument("--spec-rounds", type=_count, default=10, help="speculative rounds (>= 0)")
    bench_cli.add_parser(sub)
    args = parser.parse_args(argv)
    if args.command == "bench":
        return bench_cli.run(args)
    if args.command == "info":
        info()
        return 0
    return 0 if demo(args.steps, args.spec_rounds) else 1


if __name__ == "__main__":
    raise SystemExit(main())
