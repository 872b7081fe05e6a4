"""`python -m replayssm_cuda demo`: decode a hybrid SSM stack the way a serving engine does, conventional
against ReplaySSM, and check that the two agree.

The stack: Mamba-2 layers (Nemotron-H nano4b H=96 P=80 N=128 G=8, or super120b H=128 P=64 N=128 G=8)
and Gated DeltaNet layers (Qwen3-Next H=16 HV=32 K=V=128), each fed from the residual stream through a
random projection (RMS-normalised input, bf16 activations) and added back through another. Only the SSM
part is what the demo is about; the projections keep the layers' inputs well scaled and different.

Two copies of the stack run the same inputs: conventional (one fp32 state per slot, read and written
every token: ops.mamba2_update / ops.gdn_update; speculative rounds through per-token snapshots) and
ReplaySSM (Mamba2Cache / GDNCache: step, verify + commit). A slot pool twice the batch serves requests
that finish (reset), arrive (load of a prefill state) and fork (copy_slots) between decode steps, as
under continuous batching; the rows' slot ids live in one device tensor that the steps read. On a GPU
each path's decode step, speculative verify and commit are captured in CUDA graphs and replayed.

Reported: tokens/s of the whole stack, the SSM time per layer (a graph of the SSM op alone, over whole
fold cycles), memory per slot, which path (compiled or reference) every op ran, and the agreement of the
two paths: every step's stack output, and every layer's state (materialize) at the end. On a CPU the
same runs at a small size on the reference path.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
import warnings
from dataclasses import dataclass

import torch

from . import _extension, ops
from .cache import DeltaRuleWeights, GDNCache, Mamba2Cache, Mamba2Weights

MAMBA2_DIMS = {"nano4b": (96, 80, 128, 8), "super120b": (128, 64, 128, 8)}     # H, P, N, G
GDN_DIMS = {"qwen": (16, 32, 128, 128)}                                          # H, HV, K, V
SMALL_MAMBA2, SMALL_GDN = (8, 64, 64, 2), (2, 4, 64, 64)

# Agreement of the two paths (relative L2 error over the batch). Outputs: both paths round their
# activations to bf16 (2^-8) in every layer and differ in where (the read copy, the replay form), so
# the stack outputs agree to a few bf16 roundings; an fp8 read copy adds its own (2^-4 per element,
# averaged over the state row). State: the first layer sees bitwise the same inputs on both paths, and
# both keep fp32 states, so its materialized state agrees to fp32 rounding.
OUTPUT_TOL = {None: 2e-2, torch.bfloat16: 2e-2, torch.float16: 2e-2, torch.float8_e4m3fn: 5e-2}
STATE_TOL = 1e-4


@dataclass
class Config:
    device: torch.device
    batch: int
    num_slots: int
    d_model: int
    pattern: str                 # one letter per layer: M (Mamba-2) or G (GDN)
    mamba2: tuple
    gdn: tuple
    read_copy: torch.dtype | None
    draft_tokens: int = 4
    mamba2_buffer: int = 16
    gdn_buffer: int = 8
    act: torch.dtype = torch.bfloat16
    big_gen: torch.Generator | None = None   # on the device: the large random tensors (weights, states, inputs)


# ---- one layer of each family, both paths --------------------------------------------------------

def _rms(h):
    hf = h.float()
    return (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(h.dtype)


class _Layer:
    """Shared: the projections in and out of the residual stream, and the slot churn on both paths."""

    def __init__(self, cfg: Config, gen, in_scales: list[tuple[int, float]], out_dim: int):
        dev, d = cfg.device, cfg.d_model
        big = cfg.big_gen
        cols = [torch.randn(d, n, generator=big, device=dev) * (s / math.sqrt(d)) for n, s in in_scales]
        self.w_in = torch.cat(cols, 1).to(cfg.act)
        self.w_out = (torch.randn(out_dim, d, generator=big, device=dev) * (0.5 / math.sqrt(out_dim))).to(cfg.act)
        self.sizes = [n for n, _ in in_scales]

    def project(self, h):
        return list(torch.split(_rms(h) @ self.w_in, self.sizes, dim=-1))

    def residual(self, h, y):
        return h + y.flatten(-2) @ self.w_out

    def churn(self, finished, arrived, prefill, fork_src, fork_dst):
        """Between decode steps: free the finished slots, load prefill states into new slots, fork."""
        self.cache.reset(finished)
        self.state.index_fill_(0, finished.long(), 0)
        self.cache.load(prefill, slots=arrived)
        self.state.index_copy_(0, arrived.long(), prefill)
        self.cache.copy_slots(fork_src, fork_dst)
        self.state.index_copy_(0, fork_dst.long(), self.state.index_select(0, fork_src.long()))

    def accept(self, snapshots, num_accepted, slots):
        """Conventional speculative commit: the state after the last accepted token."""
        rows = torch.arange(num_accepted.shape[0], device=num_accepted.device)
        self.state.index_copy_(0, slots.long(), snapshots[rows, num_accepted.long() - 1])


class Mamba2Layer(_Layer):
    family = "mamba2"

    def __init__(self, cfg: Config, gen):
        H, P, N, G = self.dims = cfg.mamba2
        dev = cfg.device
        # x, z ~ N(0, 1); dt_raw ~ N(0, 0.5) around dt_bias: softplus gives dt in ~[1e-3, 0.1]; B, C ~ N(0, 1).
        super().__init__(cfg, gen, [(H * P, 1.0), (H * P, 1.0), (H, 0.5), (G * N, 1.0), (G * N, 1.0)], H * P)
        dt = torch.empty(H).uniform_(1e-3, 0.1, generator=gen)
        self.weights = Mamba2Weights(A=-torch.empty(H).uniform_(1.0, 16.0, generator=gen).to(dev),
                                     D=torch.empty(H).uniform_(0.5, 1.5, generator=gen).to(dev),
                                     dt_bias=(dt + torch.log(-torch.expm1(-dt))).to(dev), dt_softplus=True)
        self.cache = Mamba2Cache(cfg.num_slots, H, P, N, G, self.weights, buffer_len=cfg.mamba2_buffer,
                                 max_draft_tokens=cfg.draft_tokens, read_copy_dtype=cfg.read_copy,
                                 activation_dtype=cfg.act, device=dev, staggered_flush=True)
        self.state = torch.zeros(cfg.num_slots, H, P, N, device=dev)
        self.snapshots = torch.empty(cfg.batch, cfg.draft_tokens, H, P, N, device=dev)

    def inputs(self, h):
        H, P, N, G = self.dims
        lead = h.shape[:-1]
        x, z, dt, B, C = self.project(h)
        return (x.reshape(*lead, H, P).contiguous(), dt.contiguous(), B.reshape(*lead, G, N).contiguous(),
                C.reshape(*lead, G, N).contiguous(), z.reshape(*lead, H, P).contiguous())

    def prefill_states(self, n, gen):
        return torch.randn(n, *self.state.shape[1:], generator=gen, device=self.state.device).mul_(0.3)

    # ReplaySSM
    def replay_step(self, h, slots):
        return self.residual(h, self.cache.step(*self.inputs(h), slots=slots))

    def replay_verify(self, h, slots):
        return self.residual(h, self.cache.verify(*self.inputs(h), slots=slots))

    def replay_commit(self, num_accepted, slots):
        self.cache.commit(num_accepted, slots=slots)

    # conventional
    def conv_step(self, h, slots):
        x, dt, B, C, z = self.inputs(h)
        w = self.weights
        y = ops.mamba2_update(self.state, x, dt, w.A, B, C, torch.empty_like(x), w.D, z, w.dt_bias, True, slots)
        return self.residual(h, y)

    def conv_verify(self, h, slots):
        x, dt, B, C, z = self.inputs(h)
        w = self.weights
        y = ops.mamba2_update_snapshots(self.state, x, dt, w.A, B, C, torch.empty_like(x), self.snapshots, w.D, z,
                                        w.dt_bias, True, slots)
        return self.residual(h, y)

    def conv_commit(self, num_accepted, slots):
        self.accept(self.snapshots, num_accepted, slots)


class GDNLayer(_Layer):
    family = "gdn"

    def __init__(self, cfg: Config, gen):
        H, HV, K, V = self.dims = cfg.gdn
        dev = cfg.device
        # q, k are L2-normalised by the op; v ~ N(0, 1); a ~ N(0, 1) with decays exp(-A softplus(a + 1)),
        # A in [0.02, 0.5] (a memory of a few to tens of tokens); beta = sigmoid(b), b ~ N(0, 1).
        super().__init__(cfg, gen, [(H * K, 1.0), (H * K, 1.0), (HV * V, 1.0), (HV, 1.0), (HV, 1.0)], HV * V)
        self.weights = DeltaRuleWeights(A_log=torch.empty(HV).uniform_(0.02, 0.5, generator=gen).log().to(dev),
                                        dt_bias=torch.ones(HV, device=dev))
        self.cache = GDNCache(cfg.num_slots, H, HV, K, V, self.weights, buffer_len=cfg.gdn_buffer,
                              max_draft_tokens=cfg.draft_tokens, read_copy_dtype=cfg.read_copy,
                              activation_dtype=cfg.act, device=dev, staggered_flush=True)
        self.state = torch.zeros(cfg.num_slots, HV, V, K, device=dev)
        self.snapshots = torch.empty(cfg.batch, cfg.draft_tokens, HV, V, K, device=dev)

    def inputs(self, h):
        H, HV, K, V = self.dims
        lead = h.shape[:-1]
        q, k, v, a, b = self.project(h)
        return (q.reshape(*lead, H, K).contiguous(), k.reshape(*lead, H, K).contiguous(),
                v.reshape(*lead, HV, V).contiguous(), a.contiguous(), b.contiguous())

    def prefill_states(self, n, gen):
        return torch.randn(n, *self.state.shape[1:], generator=gen, device=self.state.device).mul_(0.1)

    def replay_step(self, h, slots):
        return self.residual(h, self.cache.step(*self.inputs(h), slots=slots))

    def replay_verify(self, h, slots):
        return self.residual(h, self.cache.verify(*self.inputs(h), slots=slots))

    def replay_commit(self, num_accepted, slots):
        self.cache.commit(num_accepted, slots=slots)

    def conv_step(self, h, slots):
        q, k, v, a, b = self.inputs(h)
        w = self.weights
        o = ops.gdn_update(self.state, q, k, v, a, b, w.A_log, w.dt_bias, torch.empty_like(v), slots=slots)
        return self.residual(h, o)

    def conv_verify(self, h, slots):
        q, k, v, a, b = self.inputs(h)
        w = self.weights
        o = ops.gdn_update_snapshots(self.state, q, k, v, a, b, w.A_log, w.dt_bias, torch.empty_like(v),
                                     self.snapshots, slots=slots)
        return self.residual(h, o)

    def conv_commit(self, num_accepted, slots):
        self.accept(self.snapshots, num_accepted, slots)


# ---- which path every op ran ---------------------------------------------------------------------

PATH_OPS = {
    "conventional": {"mamba2": ["mamba2_update", "mamba2_update_snapshots"],
                     "gdn": ["gdn_update", "gdn_update_snapshots"]},
    "ReplaySSM": {"mamba2": ["mamba2_step", "mamba2_verify", "mamba2_commit"],
                  "gdn": ["gdn_step", "gdn_verify", "gdn_commit"]},
    "slot churn": {"mamba2": ["load", "reset", "copy_slots", "stagger_cursors"],
                   "gdn": ["load", "reset", "copy_slots", "stagger_cursors"]},
    "check": {"mamba2": ["mamba2_materialize"], "gdn": ["gdn_materialize"]},
}


def _expected_paths(layers, cfg: Config) -> dict[str, str]:
    """compiled / reference per op, from the build and (Mamba-2) the kernels' shape and dtype limits."""
    paths = {}
    families = {layer.family: layer for layer in layers}
    for group in PATH_OPS.values():
        for family, names in group.items():
            if family not in families:
                continue
            layer = families[family]
            for name in names:
                if cfg.device.type != "cuda":
                    paths[name] = "reference (CPU)"
                    continue
                if not _extension.has_op(name):
                    paths[name] = f"reference: {ops.why_not_compiled(name)}"
                    continue
                limit = None
                if family == "mamba2" and name.startswith("mamba2_"):
                    x = layer.cache.x_buf
                    read_copy = layer.cache.read_copy if name in ("mamba2_step", "mamba2_verify",
                                                                   "mamba2_commit") else None
                    limit = ops.mamba2_kernel_limit(layer.cache.checkpoint, read_copy, x)
                paths[name] = "compiled" if limit is None else f"reference: {limit}"
    return paths


class _FallbackLog:
    """Records the ops that warned that they ran the reference on CUDA tensors (ops._run)."""

    def __init__(self):
        self.ctx = warnings.catch_warnings(record=True)

    def __enter__(self):
        self.records = self.ctx.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc):
        return self.ctx.__exit__(*exc)

    def update(self, paths: dict[str, str]) -> None:
        for w in self.records:
            text = str(w.message)
            if text.startswith("replayssm_cuda: ") and " runs the PyTorch reference" in text:
                name = text[len("replayssm_cuda: "):].split(" ")[0]
                reason = text.split(" because ", 1)[-1].split(". Pass backend=")[0]
                paths[name] = f"reference: {reason}"


# ---- the run -------------------------------------------------------------------------------------

class _Progress:
    def __init__(self, total: int):
        try:
            from tqdm import tqdm
            self.bar = tqdm(total=total, desc="demo", unit="it", file=sys.stderr, leave=False)
        except ImportError:
            self.bar, self.done, self.total = None, 0, total

    def update(self, what: str):
        if self.bar is not None:
            self.bar.set_postfix_str(what, refresh=False)
            self.bar.update(1)
        else:
            self.done += 1
            print(f"\rdemo: {self.done}/{self.total} {what:<24s}", end="", file=sys.stderr, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()
        else:
            print(file=sys.stderr)


class _Runner:
    """Runs a callable eagerly or as a captured CUDA graph, timing each run."""

    def __init__(self, fn, device, capture: bool, note: str | None = None):
        self.fn, self.device = fn, device
        self.graph, self.out, self.note = None, None, note
        self.times: list[float] = []
        if capture:
            try:
                self.graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(self.graph):
                    self.out = fn()
            except Exception as exc:   # a reference op synchronises; say why and run eagerly
                self.graph, self.note = None, f"not captured ({type(exc).__name__}: {str(exc).splitlines()[0][:80]})"

    def __call__(self):
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = self.fn() if self.graph is None else (self.graph.replay(), self.out)[1]
            end.record()
            self._pending = (start, end)
            return out
        t0 = time.perf_counter()
        out = self.fn()
        self.times.append(time.perf_counter() - t0)
        return out

    def collect(self):
        """After a synchronize: the time of the last run, in seconds."""
        if self.device.type == "cuda":
            start, end = self._pending
            self.times.append(start.elapsed_time(end) / 1e3)


def _rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def _time_op(fn, iters: int, device, capture: bool) -> tuple[float, str]:
    """Seconds per call of fn (a graph of `iters` calls on a GPU when it captures, else eager)."""
    if device.type == "cuda":
        graph, how = None, "graph"
        fn()
        torch.cuda.synchronize()
        if capture:
            try:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    for _ in range(iters):
                        fn()
            except Exception:
                graph, how = None, "eager"
        else:
            how = "eager"
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        if graph is not None:
            graph.replay()
        else:
            for _ in range(iters):
                fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / iters, how
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters, "eager"


def _config(args) -> Config:
    device = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("demo: --device cuda asked for, but torch sees no CUDA GPU")
    big = device.type == "cuda"
    batch = args.batch or (128 if big else 8)
    n_m, n_g = args.mamba2_layers, args.gdn_layers
    # GDN layers spread among the Mamba-2 ones, a Mamba-2 layer first (the tight state check's layer).
    pattern = args.layers or "".join("G" if (i + 1) * n_g // (n_m + n_g) > i * n_g // (n_m + n_g) else "M"
                                     for i in range(n_m + n_g))
    if not pattern or set(pattern) - {"M", "G"}:
        raise SystemExit(f"demo: --layers must be a string of M (Mamba-2) and G (GDN), got {pattern!r}")
    read_copy = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16,
                 "fp8": torch.float8_e4m3fn}[args.read_copy]
    return Config(device=device, batch=batch, num_slots=2 * batch, d_model=1024 if big else 128, pattern=pattern,
                  mamba2=MAMBA2_DIMS[args.mamba2] if big else SMALL_MAMBA2, gdn=GDN_DIMS["qwen"] if big else SMALL_GDN,
                  read_copy=read_copy)


def run(args) -> bool:
    cfg = _config(args)
    dev, batch, T = cfg.device, cfg.batch, cfg.draft_tokens
    gen = torch.Generator().manual_seed(0)
    big = cfg.big_gen = torch.Generator(device=dev).manual_seed(1)
    layers = [Mamba2Layer(cfg, gen) if c == "M" else GDNLayer(cfg, gen) for c in cfg.pattern]
    families = sorted({layer.family for layer in layers}, reverse=True)
    H, P, N, G = cfg.mamba2
    Hg, HV, K, V = cfg.gdn
    dims = {"mamba2": f"Mamba-2 H={H} P={P} N={N} G={G}, L={cfg.mamba2_buffer}",
            "gdn": f"GDN H={Hg} HV={HV} K={K} V={V}, L={cfg.gdn_buffer}"}
    copy_name = "no" if cfg.read_copy is None else str(cfg.read_copy).replace("torch.", "")
    print(f"demo on {dev}{' (' + torch.cuda.get_device_name(dev) + ')' if dev.type == 'cuda' else ''}: "
          f"{len(layers)} layers {cfg.pattern} ({'; '.join(dims[f] for f in families)}), batch {batch} in a pool "
          f"of {cfg.num_slots} slots, {str(cfg.act).replace('torch.', '')} activations, fp32 checkpoints with "
          f"{copy_name} read copy, {T}-token speculative rounds")
    paths = _expected_paths(layers, cfg)

    # Requests: row r holds the request in slot slots[r]; the rest of the pool is free.
    slots = torch.arange(batch, dtype=torch.int32, device=dev)
    free = list(range(batch, cfg.num_slots))
    for layer in layers:
        first = layer.prefill_states(batch, big)
        layer.cache.load(first, slots=slots)
        layer.state.index_copy_(0, slots.long(), first)
    h_step = torch.zeros(batch, cfg.d_model, dtype=cfg.act, device=dev)
    h_spec = torch.zeros(batch, T, cfg.d_model, dtype=cfg.act, device=dev)
    num_accepted = torch.ones(batch, dtype=torch.int32, device=dev)

    def stack(kind, h):
        for layer in layers:
            h = getattr(layer, kind)(h, slots)
        return h

    def commit(kind):
        for layer in layers:
            getattr(layer, kind)(num_accepted, slots)

    def churn():
        """A few requests finish; half of their rows get new requests (prefill + load), half fork a
        running request (copy_slots); the rows' slot ids change between graph replays."""
        n = max(2, batch // 16)
        rows = torch.randperm(batch, generator=gen)[:n]
        finished = slots[rows.to(dev)].clone()
        new = torch.tensor([free.pop(0) for _ in range(n)], dtype=torch.int32, device=dev)
        arrive, fork = new[: n // 2], new[n // 2:]
        keep = [r for r in range(batch) if r not in set(rows.tolist())]
        src = slots[torch.tensor(keep[: len(fork)], device=dev)].clone()
        for layer in layers:
            layer.churn(finished, arrive, layer.prefill_states(len(arrive), big), src, fork)
        free.extend(finished.tolist())
        slots[rows.to(dev)] = new

    capture = dev.type == "cuda"
    progress = _Progress(2 + args.steps + args.spec_rounds + 2 * len(families))
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def new_inputs():
        h_step.copy_(torch.randn(batch, cfg.d_model, generator=big, device=dev))
        h_spec.copy_(torch.randn(batch, T, cfg.d_model, generator=big, device=dev))
        # The engine's acceptance: 1..T tokens per row (the last token and the accepted drafts).
        num_accepted.copy_(torch.randint(1, T + 1, (batch,), generator=gen, dtype=torch.int32).to(dev))

    with _FallbackLog() as fallbacks:
        # A decode step and a speculative round of each path run eagerly first (checked like the rest):
        # libraries initialise lazily outside capture, and the ops that fall back to the reference say so.
        new_inputs()
        worst = _rel(stack("replay_step", h_step), stack("conv_step", h_step))
        progress.update("warm-up")
        worst_spec = _rel(stack("replay_verify", h_spec), stack("conv_verify", h_spec))
        commit("replay_commit")
        commit("conv_commit")
        accepted_total = int(num_accepted.sum())
        progress.update("warm-up")
        fallbacks.update(paths)

        def graphable(kind):
            return capture and all(paths[n] == "compiled" for f in families for n in PATH_OPS[kind][f])
        runners = {}
        for kind, prefix in (("conventional", "conv"), ("ReplaySSM", "replay")):
            note = None if graphable(kind) or not capture else "eager: an op runs the reference"
            runners[kind, "step"] = _Runner(lambda p=prefix: stack(f"{p}_step", h_step), dev, graphable(kind), note)
            runners[kind, "verify"] = _Runner(lambda p=prefix: stack(f"{p}_verify", h_spec), dev, graphable(kind), note)
            runners[kind, "commit"] = _Runner(lambda p=prefix: commit(f"{p}_commit"), dev, graphable(kind), note)

        churns = 0
        for step in range(args.steps):
            if step % 8 == 7:
                churn()
                churns += 1
            new_inputs()
            out_c = runners["conventional", "step"]()
            out_r = runners["ReplaySSM", "step"]()
            sync()
            for kind in ("conventional", "ReplaySSM"):
                runners[kind, "step"].collect()
            worst = max(worst, _rel(out_r, out_c))
            progress.update("decode")

        spec_time = {"conventional": 0.0, "ReplaySSM": 0.0}
        for rnd in range(args.spec_rounds):
            if rnd % 4 == 3:
                churn()
                churns += 1
            new_inputs()
            out_c = runners["conventional", "verify"]()
            out_r = runners["ReplaySSM", "verify"]()
            runners["conventional", "commit"]()
            runners["ReplaySSM", "commit"]()
            sync()
            for kind in ("conventional", "ReplaySSM"):
                for what in ("verify", "commit"):
                    runners[kind, what].collect()
                spec_time[kind] += runners[kind, "verify"].times[-1] + runners[kind, "commit"].times[-1]
            worst_spec = max(worst_spec, _rel(out_r, out_c))
            accepted_total += int(num_accepted.sum())
            progress.update("speculative")

        # States at the end: the first layer sees bitwise the same inputs on both paths (a tight check);
        # deeper layers see inputs that differ by the paths' bf16 rounding (the output tolerance).
        state_err = _rel(layers[0].cache.materialize(slots=slots), layers[0].state[slots.long()])
        deep_err = max([_rel(layer.cache.materialize(slots=slots), layer.state[slots.long()]) for layer in layers[1:]],
                       default=0.0)
        fallbacks.update(paths)

        # SSM time per layer: the op alone on static inputs, over whole fold cycles.
        ssm = {}
        for family in families:
            layer = next(lay for lay in layers if lay.family == family)
            period = layer.cache.flush_period
            iters = period * (4 if dev.type == "cuda" else 1)
            h1 = torch.randn(batch, cfg.d_model, generator=big, device=dev).to(cfg.act)
            hT = torch.randn(batch, T, cfg.d_model, generator=big, device=dev).to(cfg.act)
            one, many = layer.inputs(h1), layer.inputs(hT)
            w = layer.weights
            if family == "mamba2":
                y1, yT = torch.empty_like(one[0]), torch.empty_like(many[0])
                snaps = torch.empty(batch, T, *layer.state.shape[1:], device=dev)
                x, dt, B, C, z = one
                xs, dts, Bs, Cs, zs = many

                def conv_step():
                    ops.mamba2_update(layer.state, x, dt, w.A, B, C, y1, w.D, z, w.dt_bias, True, slots)

                def conv_spec():
                    ops.mamba2_update_snapshots(layer.state, xs, dts, w.A, Bs, Cs, yT, snaps, w.D, zs, w.dt_bias,
                                                True, slots)
                    layer.accept(snaps, num_accepted, slots)
            else:
                y1, yT = torch.empty_like(one[2]), torch.empty_like(many[2])
                snaps = torch.empty(batch, T, *layer.state.shape[1:], device=dev)

                def conv_step():
                    ops.gdn_update(layer.state, *one, w.A_log, w.dt_bias, y1, slots=slots)

                def conv_spec():
                    ops.gdn_update_snapshots(layer.state, *many, w.A_log, w.dt_bias, yT, snaps, slots=slots)
                    layer.accept(snaps, num_accepted, slots)

            def rep_step():
                layer.cache.step(*one, slots=slots, out=y1)

            def rep_spec():
                layer.cache.verify(*many, slots=slots)
                layer.cache.commit(num_accepted, slots=slots)
            fam_graph = {k: all(paths[n] == "compiled" for n in PATH_OPS[k][family]) and capture
                         for k in ("conventional", "ReplaySSM")}
            ssm[family, "step", "conventional"] = _time_op(conv_step, iters, dev, fam_graph["conventional"])
            ssm[family, "step", "ReplaySSM"] = _time_op(rep_step, iters, dev, fam_graph["ReplaySSM"])
            progress.update(f"{family} step")
            ssm[family, "spec", "conventional"] = _time_op(conv_spec, iters, dev, fam_graph["conventional"])
            ssm[family, "spec", "ReplaySSM"] = _time_op(rep_spec, iters, dev, fam_graph["ReplaySSM"])
            progress.update(f"{family} speculative")
        fallbacks.update(paths)
    progress.close()

    # ---- report ---------------------------------------------------------------------------------
    print(f"  {args.steps} decode steps and {args.spec_rounds} speculative rounds ({accepted_total} tokens "
          f"accepted), {churns} times requests finished (reset), arrived (load) and forked (copy_slots)")
    print("  ops (which path ran):")
    for kind, group in PATH_OPS.items():
        names = list(dict.fromkeys(n for f in families for n in group[f]))
        print(f"    {kind:12s} " + "; ".join(f"{n}: {paths[n]}" for n in names))
    for k in ("conventional", "ReplaySSM"):
        r = runners[k, "step"]
        how = "CUDA graphs" if r.graph is not None else (r.note or "eager (CPU)")
        print(f"    {k} step, verify and commit of the stack: {how}")
    if capture and any(runners[k, "step"].graph is None for k in ("conventional", "ReplaySSM")):
        print("    (whole-stack times below are eager; --gdn-layers 0 or --mamba2-layers 0 times the family whose "
              "ops are compiled in graphs)")

    def med(xs):
        return statistics.median(xs) if xs else float("nan")
    step_s = {k: med(runners[k, "step"].times) for k in ("conventional", "ReplaySSM")}
    spec_tok = {k: accepted_total / spec_time[k] if spec_time[k] else float("nan") for k in spec_time}
    rows = [("decode step, whole stack", "ms", step_s["conventional"] * 1e3, step_s["ReplaySSM"] * 1e3),
            ("decode tokens/s", "", batch / step_s["conventional"], batch / step_s["ReplaySSM"]),
            ("speculative tokens/s (accepted)", "", spec_tok["conventional"], spec_tok["ReplaySSM"])]
    for family in families:
        name = "Mamba-2" if family == "mamba2" else "GDN"
        for what, label in (("step", "decode step"), ("spec", f"verify {T} + commit")):
            conv = ssm.get((family, what, "conventional"))
            rep = ssm[family, what, "ReplaySSM"]
            rows.append((f"{name} layer SSM {label}{'' if rep[1] == 'graph' else ' (eager)'}", "us",
                         conv[0] * 1e6 if conv else float("nan"), rep[0] * 1e6))
    for family in families:
        layer = next(lay for lay in layers if lay.family == family)
        name = "Mamba-2" if family == "mamba2" else "GDN"
        conv_bytes = layer.state[0].numel() * layer.state.element_size()
        rows.append((f"memory per slot, {name} layer", "MiB", conv_bytes / 2**20,
                     layer.cache.bytes_per_slot()["total"] / 2**20))
    # ratio: the speed-up for times and tokens/s, ReplaySSM's share for memory.
    print(f"  {'':48s}{'conventional':>14s}{'ReplaySSM':>12s}{'ratio':>8s}")
    for label, unit, c, r in rows:
        text = f"{label}{' (' + unit + ')' if unit else ''}"
        ratio = c / r if unit in ("ms", "us") else r / c
        print(f"  {text:48s}{_fmt(c):>14s}{_fmt(r):>12s}{_fmt(ratio, 'x'):>8s}")
    if not capture:
        print("  (CPU: every op runs the PyTorch reference; these times say nothing about the kernels)")
    tol = OUTPUT_TOL[cfg.read_copy]
    print(f"  agreement, relative L2 error of the stack output: decode {worst:.2e}, speculative {worst_spec:.2e} "
          f"(tolerance {tol:.0e}); materialized state: first layer {state_err:.2e} (tolerance {STATE_TOL:.0e}), "
          f"deeper layers {deep_err:.2e} (tolerance {tol:.0e})")
    _plot(args.png, cfg, rows, families, ssm, T)
    ok = worst < tol and worst_spec < tol and state_err < STATE_TOL and deep_err < tol
    print("demo: OK" if ok else "demo: FAILED (the paths disagree beyond the tolerance)")
    return ok


def _fmt(v: float, suffix: str = "") -> str:
    if v != v:   # nan
        return "-"
    if suffix:
        return f"{v:.2f}{suffix}"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _plot(path: str, cfg: Config, rows, families, ssm, T) -> None:
    if path in ("", "none"):
        return
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("  no PNG: matplotlib is not installed (pip install matplotlib)")
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    labels, conv, rep = [], [], []
    for family in families:
        name = "Mamba-2" if family == "mamba2" else "GDN"
        for what, text in (("step", "step"), ("spec", f"verify {T}+commit")):
            c = ssm.get((family, what, "conventional"))
            labels.append(f"{name}\n{text}")
            conv.append(c[0] * 1e6 if c else 0.0)
            rep.append(ssm[family, what, "ReplaySSM"][0] * 1e6)
    xs = range(len(labels))
    ax1.bar([x - 0.2 for x in xs], conv, 0.4, label="conventional")
    ax1.bar([x + 0.2 for x in xs], rep, 0.4, label="ReplaySSM")
    ax1.set_xticks(list(xs), labels)
    ax1.set_ylabel("us per layer")
    ax1.set_title(f"SSM time per layer, batch {cfg.batch}")
    ax1.legend()
    tps = [r for r in rows if r[0].endswith("tokens/s") or "tokens/s" in r[0]]
    ax2.bar([x - 0.2 for x in range(len(tps))], [r[2] for r in tps], 0.4, label="conventional")
    ax2.bar([x + 0.2 for x in range(len(tps))], [r[3] for r in tps], 0.4, label="ReplaySSM")
    ax2.set_xticks(list(range(len(tps))), [r[0].replace(" tokens/s", "\ntokens/s") for r in tps])
    ax2.set_ylabel("tokens/s")
    ax2.set_title(f"whole stack ({cfg.pattern})")
    ax2.legend()
    dev = torch.cuda.get_device_name(cfg.device) if cfg.device.type == "cuda" else "CPU, reference path"
    fig.suptitle(f"replayssm_cuda demo: {dev}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"  wrote {path}")


def _count(text: str) -> int:
    """argparse type of a count: an int >= 0, else a usage error naming the value."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an int >= 0, got {text!r}")
    return value


def _positive(text: str) -> int:
    value = _count(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="auto: the GPU when there is one (realistic sizes), else the CPU (small sizes)")
    parser.add_argument("--steps", type=_count, default=None, help="decode steps (GPU 64, CPU 32)")
    parser.add_argument("--spec-rounds", type=_count, default=None, help="speculative rounds (GPU 16, CPU 8)")
    parser.add_argument("--batch", type=_positive, default=None, help="rows per step (GPU 128, CPU 8); pool = 2x")
    parser.add_argument("--mamba2", choices=sorted(MAMBA2_DIMS), default="nano4b", help="Mamba-2 layer dims (GPU)")
    parser.add_argument("--mamba2-layers", type=_count, default=3)
    parser.add_argument("--gdn-layers", type=_count, default=2)
    parser.add_argument("--layers", default=None, help="the layer pattern instead, e.g. MMGMMG")
    parser.add_argument("--read-copy", choices=("none", "bf16", "fp16", "fp8"), default="bf16")
    parser.add_argument("--png", default="replayssm_demo.png", help="where to write the plot ('none': no plot)")


def main(args) -> int:
    gpu = (args.device == "cuda") or (args.device == "auto" and torch.cuda.is_available())
    if args.steps is None:
        args.steps = 64 if gpu else 32
    if args.spec_rounds is None:
        args.spec_rounds = 16 if gpu else 8
    if not gpu:
        # The small CPU run is many small ops: torch's thread pool costs more than it brings (and on a
        # busy machine far more).
        torch.set_num_threads(1)
    start = time.perf_counter()
    ok = run(args)
    print(f"  wall time {time.perf_counter() - start:.1f} s")
    return 0 if ok else 1
