"""One call of every compiled op at a serving size, for Nsight Compute (tools/profile.sh), and the table of
ncu's per-kernel numbers for those calls.

Launcher (the default): a Mamba-2 layer (nano4b: H=96 P=80 N=128 G=8), a GDN layer (qwen4b: H=16
HV=32 K=V=128) and a KDA layer (kimi: H=HV=32 K=V=128), batch 256, buffer length L=16, draft blocks of T=4, fp32 checkpoints, bf16 activations,
rows on a random permutation of the slots. Every call is made twice: a warm-up, then once more between
torch.cuda.profiler.start() and stop(), so that `ncu --profile-from-start off` sees each op's second
call only. The calls, in this order (no two neighbours share an op, so the kernels of consecutive ops
never merge in the table):

    <family>_update, <family>_update_snapshots (T tokens), <family>_materialize (cursors at L/2), then for
    each read copy of --copies: <family>_step replaying (cursors at L/2), <family>_verify (T drafts,
    cursors spread over [0, L-T]), <family>_step folding (cursors at L-1: the token fills the buffer),
    <family>_commit (1 to T accepted, max_draft_tokens T: some rows fold), <family>_flush (cursors at L/2)
    for mamba2, gdn then kda; then on the Mamba-2 layer: make_read_copy, load, reset, stagger_cursors and
    copy_slots (batch/8 slots or pairs: the requests that finish or fork in one decode step); then
    fill_slots_table and copy_slots_table over both layers' tensors (LayerCaches' one launch); then
    mamba2_commit_layers, mamba2_flush_layers and mamba2_materialize_layers over the Mamba-2 layer and a
    copy of it, and gdn_commit_layers, gdn_flush_layers and gdn_materialize_layers over the GDN layer and
    a copy of it (LayerCaches' one launch of each).

Each compiled op opens an NVTX range named after it (domain "replayssm"), so
`ncu --nvtx --nvtx-include "regex:replayssm@.+/"` profiles the ops' kernels and none of the launcher's
cursor fills. Without ncu the script still runs (cudaProfilerStart/Stop do nothing) and says what it ran;
`--device cpu --mamba2 tiny --gdn tiny --kda tiny` runs the same calls through the checked PyTorch reference (how
the CPU tests check the argument lists).

    python3 tools/profile_ops.py [--batch 64] [--mamba2 super120b] [--gdn qwen122b] [--kda kimi]
                                 [--copies none,bf16,fp8]
                                 [--only 'mamba2_step.*fold'] [--calls-out calls.tsv] [--list]

Table: `python3 tools/profile_ops.py --table RAW.csv NVTX.csv [--calls calls.tsv]` reads the report's raw
export (`ncu -i REPORT --page raw --csv --print-units base`) and its kernels' ranges (NVTX.csv: `--report-ranges
REPORT`, each kernel named after its innermost push/pop range of the replayssm domain, "replayssm::<op>",
read with ncu's ncu_report module; or ncu's own `--print-nvtx-rename kernel` export), joins them on the ID column, names each kernel's call from the launcher's list
(--calls-out) and prints one row per kernel: op, call, kernel, grid, block, time, DRAM bytes, DRAM % of
peak and GB/s, the share of cycles in which a scheduler issued an instruction ("issue %": near 100 the
kernel is bound by its instruction count, not by memory), instructions executed per thread, achieved
occupancy, registers per thread, shared memory per CTA (METRICS below).
"""

from __future__ import annotations

import argparse
import csv
import io
import re
import sys
from dataclasses import dataclass
from typing import Callable

# ---- the calls (torch is imported where the calls are built: --table needs neither torch nor a GPU) --

MAMBA2_DIMS = {"nano4b": (96, 80, 128, 8), "super120b": (128, 64, 128, 8), "tiny": (4, 64, 64, 2)}  # H, P, N, G
GDN_DIMS = {"qwen4b": (16, 32, 128, 128), "qwen122b": (16, 64, 128, 128), "tp4": (4, 16, 128, 128),
            "tiny": (1, 2, 64, 64)}  # H, HV, K, V
KDA_DIMS = {"kimi": (32, 32, 128, 128), "tiny": (1, 2, 64, 64)}  # H, HV, K, V (Kimi Linear's KDA layers)
COPIES = {"none": None, "bf16": "bfloat16", "fp16": "float16", "fp8": "float8_e4m3fn"}


@dataclass
class Call:
    op: str                       # torch.ops.replayssm.<op>
    what: str                     # which call of the op: "fold, fp8 copy"
    run: Callable[[], None]       # sets the cursors it needs, then calls the op

    @property
    def label(self) -> str:
        return f"{self.op} {self.what}".strip()


def _sequence(family, run, cache, copies, L, T) -> list[Call]:
    """One family's calls in launch order, each setting the cursors it needs first. `run[name]` calls
    <family>_<name> (the replay ops with the cache tuple (checkpoint, read copy, scale, buffers...,
    cursors) they are given)."""
    nc, spread = cache["num_committed"], cache["spread"]

    def at(cursors, fn, *args):
        def call():
            if isinstance(cursors, int):
                nc.fill_(cursors)
            else:
                nc.copy_(cursors)
            fn(*args)
        return call

    calls = [Call(f"{family}_update", "T=1", run["update"]),
             Call(f"{family}_update_snapshots", f"T={T}", run["update_snapshots"]),
             Call(f"{family}_materialize", f"w={L // 2}", at(L // 2, run["materialize"]))]
    for copy in copies:
        c = (cache["checkpoint"], *cache["copies"][copy], *cache["buffers"], nc)
        tag = "no copy" if copy == "none" else f"{copy} copy"
        calls += [Call(f"{family}_step", f"replay w={L // 2}, {tag}", at(L // 2, run["step"], c)),
                  Call(f"{family}_verify", f"T={T}, {tag}", at(spread, run["verify"], c)),
                  Call(f"{family}_step", f"fold, {tag}", at(L - 1, run["step"], c)),
                  Call(f"{family}_commit", f"T={T}, {tag}", at(spread, run["commit"], c)),
                  Call(f"{family}_flush", f"w={L // 2}, {tag}", at(L // 2, run["flush"], c))]
    return calls


def build_calls(args) -> list[Call]:
    """Allocates both layers' tensors on args.device and returns every call, in launch order."""
    import torch

    ops = torch.ops.replayssm
    dev, batch, L, T = args.device, args.batch, args.buffer_len, args.draft_tokens
    act = torch.bfloat16
    torch.manual_seed(0)
    slots = torch.randperm(batch, device=dev).int()
    accepted = torch.randint(1, T + 1, (batch,), device=dev, dtype=torch.int32)

    def randn(*shape, scale=1.0, dtype=act):
        return (scale * torch.randn(*shape, device=dev)).to(dtype)

    def make_cache(heads, rows, cols, buffers):
        """fp32 checkpoint (slots, heads, rows, cols) with every read copy of --copies, the buffers, the
        conventional state and the outputs of materialize and update_snapshots."""
        ck = randn(batch, heads, rows, cols, scale=0.1, dtype=torch.float32)
        copies = {}
        for name in args.copies:
            rc = rs = None
            if COPIES[name] is not None:
                rc = torch.empty_like(ck, dtype=getattr(torch, COPIES[name]))
                rs = torch.ones(batch, heads, rows, device=dev) if name == "fp8" else None
                ops.make_read_copy(ck, rc, rs, None, -1)
            copies[name] = (rc, rs)
        return {"checkpoint": ck, "copies": copies, "buffers": buffers,
                "num_committed": torch.zeros(batch, dtype=torch.int32, device=dev),
                "num_verified": torch.zeros(batch, dtype=torch.int32, device=dev),   # verify's count, commit's bound
                "spread": torch.randint(0, L - T + 1, (batch,), device=dev, dtype=torch.int32),
                "state": ck.clone(), "materialized": torch.empty_like(ck),
                "snapshots": torch.empty(batch, T, heads, rows, cols, device=dev)}

    # Mamba-2: per token x, dt, B, C, z; weights A, D, dt_bias; buffers x, B, dt.
    H, P, N, G = MAMBA2_DIMS[args.mamba2]
    A, D, dt_bias = -(0.5 + torch.rand(H, device=dev)), torch.randn(H, device=dev), 0.1 * torch.randn(H, device=dev)
    m = make_cache(H, P, N, (randn(batch, H, L, P), randn(batch, G, L, N), 0.1 * torch.rand(batch, H, L, device=dev)))
    m_one = (randn(batch, H, P), randn(batch, H, scale=0.5), randn(batch, G, N), randn(batch, G, N),
             randn(batch, H, P), torch.empty(batch, H, P, device=dev, dtype=act))
    m_block = (randn(batch, T, H, P), randn(batch, T, H, scale=0.5), randn(batch, T, G, N), randn(batch, T, G, N),
               randn(batch, T, H, P), torch.empty(batch, T, H, P, device=dev, dtype=act))

    def m_in(tokens, *extra):   # x, dt, A, B, C, out, [snapshots], D, z, dt_bias, dt_softplus
        x, dt, B, C, z, out = tokens
        return (x, dt, A, B, C, out, *extra, D, z, dt_bias, True)

    mamba2 = {
        "update": lambda: ops.mamba2_update(m["state"], *m_in(m_one), slots, -1),
        "update_snapshots": lambda: ops.mamba2_update_snapshots(m["state"], *m_in(m_block, m["snapshots"]), slots, -1),
        "materialize": lambda: ops.mamba2_materialize(m["checkpoint"], *m["buffers"], m["num_committed"], A,
                                                      m["materialized"], slots, -1),
        "step": lambda c: ops.mamba2_step(*c, *m_in(m_one), 1, slots, -1),
        "verify": lambda c: ops.mamba2_verify(*c, m["num_verified"], *m_in(m_block), slots, -1),
        "commit": lambda c: ops.mamba2_commit(*c, m["num_verified"], accepted, A, T, slots, -1),
        "flush": lambda c: ops.mamba2_flush(*c, A, slots, -1),
    }

    def delta_layer(family, dims):
        """A GDN or KDA layer (KDA: the decay per key channel, so a, dt_bias and g_buf have a K dim):
        per token q, k, v, a, b; weights A_log, dt_bias; buffers k, v, g, beta, u. Returns its cache and
        its calls by name."""
        Hq, HV, K, V = dims
        gate = (K,) if family == "kda" else ()
        A_log, g_bias = torch.log(0.05 + 0.45 * torch.rand(HV, device=dev)), 0.5 * torch.randn(HV, *gate, device=dev)
        g = make_cache(HV, V, K, (randn(batch, Hq, L, K), randn(batch, HV, L, V),
                                  -0.5 * torch.rand(batch, HV, L, *gate, device=dev),
                                  torch.rand(batch, HV, L, device=dev), 0.1 * torch.randn(batch, HV, L, V, device=dev)))
        g_one = (randn(batch, Hq, K), randn(batch, Hq, K), randn(batch, HV, V), randn(batch, HV, *gate),
                 randn(batch, HV), torch.empty(batch, HV, V, device=dev, dtype=act))
        g_block = (randn(batch, T, Hq, K), randn(batch, T, Hq, K), randn(batch, T, HV, V), randn(batch, T, HV, *gate),
                   randn(batch, T, HV), torch.empty(batch, T, HV, V, device=dev, dtype=act))

        def g_in(tokens, *extra):   # q, k, v, a, b, A_log, dt_bias, out, [snapshots], scale, use_qk_l2norm
            *qkvab, out = tokens
            return (*qkvab, A_log, g_bias, out, *extra, None, True)

        op = {name: getattr(ops, f"{family}_{name}") for name in
              ("update", "update_snapshots", "materialize", "step", "verify", "commit", "flush")}
        return g, {
            "update": lambda: op["update"](g["state"], *g_in(g_one), slots, -1),
            "update_snapshots": lambda: op["update_snapshots"](g["state"], *g_in(g_block, g["snapshots"]), slots, -1),
            "materialize": lambda: op["materialize"](g["checkpoint"], *g["buffers"], g["num_committed"],
                                                     g["materialized"], True, slots, -1),
            "step": lambda c: op["step"](*c, *g_in(g_one), 1, slots, -1, False),
            "verify": lambda c: op["verify"](*c, g["num_verified"], *g_in(g_block), slots, -1),
            "commit": lambda c: op["commit"](*c, g["num_verified"], accepted, T, True, slots, -1),
            "flush": lambda c: op["flush"](*c, True, slots, -1),
        }

    g, gdn = delta_layer("gdn", GDN_DIMS[args.gdn])
    kc, kda = delta_layer("kda", KDA_DIMS[args.kda])
    Hq, HV, K, V = GDN_DIMS[args.gdn]
    calls = (_sequence("mamba2", mamba2, m, args.copies, L, T) + _sequence("gdn", gdn, g, args.copies, L, T) +
             _sequence("kda", kda, kc, args.copies, L, T))

    # The cache ops on the Mamba-2 layer, with a read copy (the first of --copies that has one, else bf16).
    ck, nc, bufs = m["checkpoint"], m["num_committed"], list(m["buffers"])
    copy = next((c for c in args.copies if c != "none"), "bf16")
    rc, rs = m["copies"].get(copy) or (torch.empty_like(ck, dtype=torch.bfloat16), None)
    k = max(1, batch // 8)
    src, dst = slots[:k], slots[k:2 * k] if batch >= 2 * k else slots[:k]
    states = randn(k, H, P, N, scale=0.1, dtype=torch.float32)
    every = [t for t in (ck, rc, rs, *bufs, nc) if t is not None]
    calls += [Call("make_read_copy", copy, lambda: ops.make_read_copy(ck, rc, rs, slots, -1)),
              Call("load", f"{k} slots, {copy} copy", lambda: ops.load(ck, rc, rs, nc, states, src, -1)),
              Call("reset", f"{k} slots", lambda: ops.reset(ck, rc, rs, bufs, nc, src, -1)),
              Call("stagger_cursors", f"period {L}", lambda: ops.stagger_cursors(bufs, nc, slots, -1, L)),
              Call("copy_slots", f"{k} pairs", lambda: ops.copy_slots(every, src, dst, -1))]

    # The same two slot ops over both layers' tensors in one launch (replayssm_cuda.LayerCaches).
    layers = every + [g["checkpoint"], *g["buffers"], g["num_committed"]]
    fills = [1.0 if t is rs else 0.0 for t in layers]
    periods = [L if t is nc else 0 for t in layers]
    from replayssm_cuda import _extension

    table = (_extension._C.slot_table(layers, fills, periods) if ck.is_cuda and _extension.is_compiled()
             else torch.zeros(0, dtype=torch.int64))
    calls += [Call("fill_slots_table", f"{k} slots, 2 layers",
                   lambda: ops.fill_slots_table(layers, table, fills, periods, src, -1)),
              Call("copy_slots_table", f"{k} pairs, 2 layers",
                   lambda: ops.copy_slots_table(layers, table, src, dst, -1))]

    # Commit, flush and materialize of two Mamba-2 layers in one launch each (LayerCaches): the
    # Mamba-2 layer and a copy of it, with the read copy above; every slot with a pending verify of T.
    two = [[t, t.clone()] if t is not None else [] for t in (ck, rc, rs, *bufs, nc, m["num_verified"])]
    lists = [*two, [A, A], [], []]
    nv = lists[7]
    layer_table = (_extension._C.mamba2_layer_table(*lists) if ck.is_cuda and _extension.is_compiled()
                   else torch.zeros(0, dtype=torch.int64))
    out = torch.empty(2, batch, H, P, N, device=dev)

    def commit_layers():
        for t in nv:
            t.fill_(T)
        ops.mamba2_commit_layers(layer_table, *lists, accepted, T, slots, -1)

    calls += [Call("mamba2_commit_layers", "2 layers", commit_layers),
              Call("mamba2_flush_layers", "2 layers", lambda: ops.mamba2_flush_layers(layer_table, *lists, slots, -1)),
              Call("mamba2_materialize_layers", "2 layers",
                   lambda: ops.mamba2_materialize_layers(layer_table, *lists, out, slots, -1))]

    # The same three over the GDN layer and a copy of it, with the read copy of the Mamba-2 calls above.
    gck = g["checkpoint"]
    grc, grs = g["copies"].get(copy) or (torch.empty_like(gck, dtype=torch.bfloat16), None)
    gtwo = [[t, t.clone()] if t is not None else []
            for t in (gck, grc, grs, *g["buffers"], g["num_committed"], g["num_verified"])]
    glists = [*gtwo, []]
    gnv = glists[9]
    g_table = (_extension._C.gdn_layer_table(*glists) if gck.is_cuda and _extension.is_compiled()
               else torch.zeros(0, dtype=torch.int64))
    gout = torch.empty(2, batch, HV, V, K, device=dev)

    def gdn_commit_layers():
        for t in gnv:
            t.fill_(T)
        ops.gdn_commit_layers(g_table, *glists, accepted, T, True, slots, -1)

    calls += [Call("gdn_commit_layers", "2 layers", gdn_commit_layers),
              Call("gdn_flush_layers", "2 layers", lambda: ops.gdn_flush_layers(g_table, *glists, True, slots, -1)),
              Call("gdn_materialize_layers", "2 layers",
                   lambda: ops.gdn_materialize_layers(g_table, *glists, gout, True, slots, -1))]
    return calls


def check_order(calls: list[Call]) -> None:
    """The table names a call by the runs of one op in launch order: neighbours must differ."""
    for a, b in zip(calls, calls[1:]):
        if a.op == b.op:
            raise ValueError(f"calls {a.label!r} and {b.label!r} are neighbours of the same op")


def call_runs(calls: list[Call]) -> list[tuple[str, str]]:
    """(op, what) of each run of neighbouring calls of one op (--only can make neighbours of the calls of
    one op): the table cannot tell their kernels apart, so they share one label, "what + what"."""
    runs: list[tuple[str, str]] = []
    for c in calls:
        if runs and runs[-1][0] == c.op:
            runs[-1] = (c.op, f"{runs[-1][1]} + {c.what}")
        else:
            runs.append((c.op, c.what))
    return runs


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mamba2", choices=MAMBA2_DIMS, default="nano4b", help="Mamba-2 layer dims (default nano4b)")
    p.add_argument("--gdn", choices=GDN_DIMS, default="qwen4b", help="GDN layer dims (default qwen4b)")
    p.add_argument("--kda", choices=KDA_DIMS, default="kimi", help="KDA layer dims (default kimi)")
    p.add_argument("--batch", type=int, default=256, help="rows, one slot each (default 256)")
    p.add_argument("--buffer-len", type=int, default=16, help="L (default 16)")
    p.add_argument("--draft-tokens", type=int, default=4, help="T of verify, commit and update_snapshots (default 4)")
    p.add_argument("--copies", default="none,fp8",
                   help=f"read copies the replay ops run with, comma-separated from {list(COPIES)} (default none,fp8)")
    p.add_argument("--only", default="", help="a regex: run only the calls whose label ('op what') it matches")
    p.add_argument("--device", default="cuda", help="cuda (default), or cpu: the checked reference (use --mamba2 tiny "
                   "--gdn tiny --kda tiny)")
    p.add_argument("--calls-out", help="write the profiled calls here, one 'op<TAB>what' a line, for --table")
    p.add_argument("--list", action="store_true", help="print the calls (op and what) and exit; allocates nothing")
    p.add_argument("--table", nargs=2, metavar=("RAW_CSV", "NVTX_CSV"), help="print the table of two ncu exports")
    p.add_argument("--calls", help="with --table: the launcher's --calls-out file")
    p.add_argument("--report-ranges", metavar="REPORT", help="print REPORT's kernels named after their replayssm "
                   "NVTX range, as the CSV --table takes for its names (needs ncu's ncu_report module)")
    args = p.parse_args(argv)
    args.copies = [c.strip() for c in args.copies.split(",") if c.strip()]
    bad = [c for c in args.copies if c not in COPIES]
    if bad or not args.copies:
        p.error(f"--copies: expected names from {list(COPIES)}, got {args.copies}")
    if args.batch < 1 or args.draft_tokens < 1 or args.buffer_len < 2 * args.draft_tokens:
        p.error(f"need batch >= 1 and buffer_len >= 2 * draft_tokens, got batch {args.batch}, "
                f"buffer_len {args.buffer_len}, draft_tokens {args.draft_tokens}")
    return args


def launch(args) -> int:
    import torch

    from replayssm_cuda import _extension

    if args.list:                               # the plan only: meta tensors allocate nothing
        args.device = "meta"
    every_call = build_calls(args)
    check_order(every_call)
    calls = [c for c in every_call if re.search(args.only, c.label)]
    if args.list:
        print("\n".join(c.label for c in calls))
        return 0
    cuda = torch.device(args.device).type == "cuda"
    if cuda:
        compiled = set(_extension.compiled_ops())
        missing = sorted(compiled - {c.op for c in every_call})
        if missing:
            print(f"profile_ops: no call for the compiled ops {missing}", file=sys.stderr)
        left_out = [c.label for c in calls if c.op not in compiled]
        if left_out:
            print(f"profile_ops: not compiled (the reference would run, outside any NVTX range), left out: "
                  f"{left_out}", file=sys.stderr)
        calls = [c for c in calls if c.op in compiled]
    if args.calls_out:
        with open(args.calls_out, "w") as f:
            f.writelines(f"{op}\t{what}\n" for op, what in call_runs(calls))
    for profiled in (False, True):              # a warm-up, then the calls ncu profiles
        if profiled and cuda:
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
        for c in calls:
            c.run()
        if profiled and cuda:
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
    print(f"profile_ops: ran {len(calls)} calls of {len({c.op for c in calls})} ops on {args.device}, twice "
          f"(mamba2 {args.mamba2}, gdn {args.gdn}, kda {args.kda}, batch {args.batch}, L {args.buffer_len}, T {args.draft_tokens}, "
          f"copies {','.join(args.copies)})" + ("; the second time between cudaProfilerStart and Stop" if cuda else ""))
    return 0


# ---- the table ------------------------------------------------------------------------------------

METRICS = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
           "dram__throughput.avg.pct_of_peak_sustained_elapsed", "dram__bytes.sum.per_second",
           "smsp__issue_active.avg.pct_of_peak_sustained_active", "smsp__inst_executed.sum",
           "sm__warps_active.avg.pct_of_peak_sustained_active", "launch__registers_per_thread",
           "launch__shared_mem_per_block_static", "launch__shared_mem_per_block_dynamic",
           "launch__grid_size", "launch__block_size")

_PREFIX = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "k": 1e3}
_SECONDS = {"nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3, "second": 1.0}


def read_ncu_csv(text: str) -> list[dict[str, tuple[str, str]]]:
    """Rows of an ncu CSV export (`--page raw --csv`): {column: (value, unit)} per kernel. The first row
    that has an "ID" and a "Kernel Name" column is the header (lines before it, such as ==PROF== notes,
    are skipped); a following row with an empty ID holds the metrics' units."""
    rows = list(csv.reader(io.StringIO(text)))
    start = next((i for i, r in enumerate(rows) if "ID" in r and "Kernel Name" in r), None)
    if start is None:
        raise ValueError("no ncu CSV header (a row with the columns ID and Kernel Name) found")
    header, body = rows[start], rows[start + 1:]
    units = [""] * len(header)
    if body and body[0][header.index("ID")] == "":
        units, body = body[0], body[1:]
    return [{h: (v, u) for h, v, u in zip(header, r, units)} for r in body if len(r) == len(header)]


def value(row, column: str, unit: str):
    """Column `column` of a row in `unit` ("s", "B", "B/s", or "" for a plain number / percent); None
    when missing or not a number. Understands ncu's units with SI prefixes (Kbyte, Gbyte/second,
    usecond, ...) and thousands separators."""
    if column not in row:
        return None
    text, have = row[column]
    try:
        x = float(text.replace(",", ""))
    except ValueError:
        return None
    have = have.strip()
    if unit == "s":
        return x * _SECONDS.get(have, 1e-9)          # ncu's base unit for durations is nsecond
    if unit in ("B", "B/s"):
        m = re.fullmatch(r"([KMGTk]?)byte(?:/\w+)?", have)
        return x * _PREFIX[m.group(1)] if m else x
    return x


def kernel_name(name: str, width: int = 80) -> str:
    """A demangled kernel name without its return type, parameter list and namespaces (the op column
    says the family), cut to `width`: "step_kernel<StepTraits<80, 128, (CopyKind)2>>"."""
    name = re.sub(r"^void ", "", name.strip())
    if name.endswith(")"):                            # drop the outermost trailing (...) parameter list
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i]
                break
    name = re.sub(r"\b(?:\w+::)+", "", name)
    return name if len(name) <= width else name[:width - 1] + "~"


def label_calls(ops: list[str], calls: list[tuple[str, str]]) -> list[str]:
    """The launcher's call of each kernel (kernels in launch order, each with its op): a run of kernels
    of one op is one call, matched to the next call of that op in the list ("?" when none is left)."""
    labels, i, previous, current = [], 0, None, "?"
    for op in ops:
        if op != previous:
            j = next((j for j in range(i, len(calls)) if calls[j][0] == op), None)
            current, i = (calls[j][1], j + 1) if j is not None else ("?", i)
            previous = op
        labels.append(current)
    return labels


def _import_ncu_report():
    """Nsight Compute's own Python module for reports (ncu_report, in the install's extras/python)."""
    import glob
    import importlib
    import os
    import shutil

    ncu = shutil.which("ncu")
    roots = [os.path.dirname(os.path.realpath(ncu))] if ncu else []
    roots += sorted(glob.glob("/usr/local/cuda*/nsight-compute*")) + sorted(glob.glob("/opt/nvidia/nsight-compute/*"))
    for root in roots:
        path = os.path.join(root, "extras", "python")
        if os.path.isfile(os.path.join(path, "ncu_report.py")):
            sys.path.insert(0, path)
            return importlib.import_module("ncu_report")
    raise ImportError(f"no ncu_report.py under <ncu install>/extras/python (looked in {roots})")


def report_ranges(report_path: str) -> str:
    """The report's kernels as the CSV that kernel_table takes for its names ("ID", "Kernel Name"): each
    kernel named after its innermost push/pop range of the replayssm domain ("replayssm::<op>"), or its
    own name outside one, in the report's order (the ID column of its raw export). Read with ncu_report:
    ncu's own `--print-nvtx-rename kernel` export carried no replayssm name for our domain's ranges (H100,
    ncu of CUDA 13.0), so the table's op column came out empty."""
    ncu_report = _import_ncu_report()
    context = ncu_report.load_report(report_path)
    out = io.StringIO()
    writer = csv.writer(out, quoting=csv.QUOTE_ALL)
    writer.writerow(["ID", "Kernel Name"])
    index = 0
    for r in range(context.num_ranges()):
        workloads = context.range_by_idx(r)
        for a in range(workloads.num_actions()):
            action = workloads.action_by_idx(a)
            name, state = action.name(), action.nvtx_state()
            for domain_id in state.domains():
                domain = state.domain_by_id(domain_id)
                ranges = list(domain.push_pop_ranges()) if domain.name() == "replayssm" else []
                if ranges:
                    name = ranges[-1]   # the list runs from the outermost range in
            writer.writerow([str(index), name])
            index += 1
    return out.getvalue()


def kernel_table(raw_text: str, nvtx_text: str, calls: list[tuple[str, str]] | None = None) -> list[dict]:
    raw = read_ncu_csv(raw_text)
    renamed = {r["ID"][0]: r["Kernel Name"][0] for r in read_ncu_csv(nvtx_text)}
    raw.sort(key=lambda r: int(r["ID"][0]))
    ops = []
    for r in raw:
        m = re.fullmatch(r"(?:replayssm@)?replayssm::(\w+)", renamed.get(r["ID"][0], "").strip())
        ops.append(m.group(1) if m else "-")
    whats = label_calls(ops, calls) if calls else [""] * len(raw)
    table = []
    for r, op, what in zip(raw, ops, whats):
        smem = [value(r, f"launch__shared_mem_per_block_{k}", "B") for k in ("static", "dynamic")]
        read, write = value(r, "dram__bytes_read.sum", "B"), value(r, "dram__bytes_write.sum", "B")
        grid, block = value(r, "launch__grid_size", ""), value(r, "launch__block_size", "")
        warp_inst = value(r, "smsp__inst_executed.sum", "")  # warp instructions: 32 threads' each
        table.append({
            "op": op, "call": what, "kernel": kernel_name(r["Kernel Name"][0]),
            "grid": grid, "block": block,
            "us": _scaled(value(r, "gpu__time_duration.sum", "s"), 1e6),
            "dram_MB": None if read is None or write is None else (read + write) / 1e6,
            "dram_pct": value(r, "dram__throughput.avg.pct_of_peak_sustained_elapsed", ""),
            "dram_GBs": _scaled(value(r, "dram__bytes.sum.per_second", "B/s"), 1e-9),
            "issue_pct": value(r, "smsp__issue_active.avg.pct_of_peak_sustained_active", ""),
            "inst_per_thread": (None if None in (warp_inst, grid, block) or grid * block == 0
                                else 32 * warp_inst / (grid * block)),
            "occupancy_pct": value(r, "sm__warps_active.avg.pct_of_peak_sustained_active", ""),
            "regs": value(r, "launch__registers_per_thread", ""),
            "smem_KiB": None if None in smem else sum(smem) / 1024,
        })
    return table


def _scaled(x, factor):
    return None if x is None else x * factor


COLUMNS = [("op", "op", "{}"), ("call", "call", "{}"), ("kernel", "kernel", "{}"), ("grid", "grid", "{:.0f}"),
           ("block", "block", "{:.0f}"), ("us", "time us", "{:.1f}"), ("dram_MB", "DRAM MB", "{:.1f}"),
           ("dram_pct", "DRAM %", "{:.1f}"), ("dram_GBs", "DRAM GB/s", "{:.0f}"), ("issue_pct", "issue %", "{:.1f}"),
           ("inst_per_thread", "inst/thread", "{:.0f}"), ("occupancy_pct", "occup. %", "{:.1f}"),
           ("regs", "regs", "{:.0f}"), ("smem_KiB", "smem KiB", "{:.1f}")]


def format_table(table: list[dict]) -> str:
    """A plain-text table, one row per kernel; "-" where ncu gave no number."""
    cells = [[h for _, h, _ in COLUMNS]]
    cells += [["-" if row[k] in (None, "") else f.format(row[k]) for k, _, f in COLUMNS] for row in table]
    widths = [max(len(r[i]) for r in cells) for i in range(len(COLUMNS))]
    text = ["  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
            for r in cells]
    return "\n".join(text[:1] + ["-" * len(text[0])] + text[1:])


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.report_ranges:
        sys.stdout.write(report_ranges(args.report_ranges))
        return 0
    if args.table:
        calls = None
        if args.calls:
            with open(args.calls) as f:
                calls = [tuple((line.rstrip("\n").split("\t") + [""])[:2]) for line in f if line.strip()]
        raw, nvtx = (open(path).read() for path in args.table)
        table = kernel_table(raw, nvtx, calls)
        print(format_table(table))
        if table and all(row["op"] == "-" for row in table):
            print("no kernel carries a replayssm:: NVTX range: was the report taken with --nvtx, and the names "
                  "made with --report-ranges?", file=sys.stderr)
        return 0
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
