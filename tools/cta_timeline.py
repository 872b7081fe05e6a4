"""Where a launch's time goes, CTA by CTA: the per-CTA time lines of the conventional update, the
non-fold replay step (w = 8 of L = 16), the fold step (w = 15: every row folds; "item" is then the
interval between checkpoint tiles) and the staggered step (slot s at w = s % 16, so one row in 16 folds,
launched with the staggered_flush hint as a continuous-batching engine's steps are: the order pass and
the fold split where the launch plan takes them; the pass is not recorded, so it shows in "gap"),
recorded by a diagnostic build (csrc/diag/):

    REPLAYSSM_CTA_TIMELINE=1 REPLAYSSM_CUDA_ARCHS=90a python3 setup.py build_ext --inplace
    PYTHONPATH=. python3 tools/cta_timeline.py [--dims nano4b super120b super120b@tp4] [--batches 64 512]
        [--kernels update step-none step-fp8 fold-none fold-fp8 stag-none stag-fp8] [--csv FILE.csv.gz]
    PYTHONPATH=. python3 tools/cta_timeline.py --family gdn [--dims qwen4b qwen122b@tp4] [--kernels step-fp8 ...]

--family gdn (or kda) times gdn_step (kda_step) instead: its CTAs mark their start, the slot and cursor
known to every thread ("cursor"), the window terms done ("dots"), the tile landed ("first tile") and
their end; a folding CTA only its start, cursor and end. Its update has no time line ("update" is
refused), and a step CTA has one tile, so "item" and the ramp's tile are that tile. Its set-up's chain
is one more column, each link a median over the replaying CTAs from the CTA's start (csrc/diag/
cta_timeline.cuh): thread 0 has the slot / thread 0 has the cursor / warp 1 has the token (q, k, gates)
/ thread 0 has its window keys' dots / thread 0 has summed its window terms.

Each case is timed the benchmark's way (replayssm_cuda.bench: a CUDA graph of one launch per slot group
of a rotating pool, cold L2, behind the GPU hold), and the records of the graph's launches are read after
its last replay. Per case, medians over the graph's launches after the first (each of those follows a
launch of the same kind, as in decode):
    kernel     first CTA start -> last CTA end, against the launch's bytes at the copy rate ("ideal")
    gap        previous launch's last CTA end -> this launch's first CTA start
    ramp       launch start -> the first tile landing, median and last over the CTAs that start within
               1 us of the launch (its first wave)
    item       a CTA's steady interval between tiles (median over CTAs of their median, items 2 and on)
    tail       the SMs' last CTA end: launch end minus their median, and minus their first (how long the
               earliest-idle SM waits for the launch to end)
    busy       summed CTA lifetimes / (SMs x CTAs per SM x kernel time): the occupied share of the slots
               (CTAs per SM: the most that the records show on one SM at once)
    CTA life   p10 / p50 / p90 of the CTAs' start -> end
    set-up     a step CTA's start -> every thread has read the slot's cursor -> the tensor-core replay's
               set-up barrier (window dots, C's fragments) -> its first tile landed (medians over CTAs;
               Mamba-2's fold and CUDA-core replay, and every folding CTA, have no set-up mark: "dots" is
               nan, "first tile" counts from the cursor; a GDN / KDA replay CTA marks it in every variant)
--csv FILE writes every record (ns from the case's first launch: start, end, the cursor and set-up marks
where the kernel makes them, the item times) for a closer look. A product build has no
time line: the script says so and exits 2."""

import argparse
import gzip
import os
import statistics
import sys

sys.path.insert(0, os.getcwd())

import torch  # noqa: E402

from replayssm_cuda.bench.mamba2 import DIMS, DIMS_TABLE, ReplayPool, Setup, conventional_steps, make_inputs  # noqa: E402
from replayssm_cuda.bench.timing import capture as _capture, measure_copy_bandwidth  # noqa: E402
from replayssm_cuda.bench.timing import replay_times as _replay_times  # noqa: E402

WORDS = 64  # kCtaTimelineWords
START, CONSUMER_END, OTHER_END, CURSOR, SET_UP, ITEM0 = 1, 2, 3, 4, 5, 6  # csrc/diag/cta_timeline.cuh
# gdn_step / kda_step: one tile (word 6), then the set-up's chain (kCtaTimelineGdnSlot ..).
CHAIN = {"slot": 7, "cursor read": 8, "token": 9, "keys": 10, "window": 11}
MAX_CTAS = 16384
COPIES = {"step-none": None, "step-bf16": torch.bfloat16, "step-fp8": torch.float8_e4m3fn,
          "fold-none": None, "fold-bf16": torch.bfloat16, "fold-fp8": torch.float8_e4m3fn,
          "stag-none": None, "stag-bf16": torch.bfloat16, "stag-fp8": torch.float8_e4m3fn}
L = 16  # the buffer length of every case


def median(v):
    return statistics.median(v) if v else float("nan")


def launch_records(records, one_tile: bool = False):
    """[(cta, sm, start, end, [item times], cursor, set_up, chain)] of the CTAs one launch's record set
    holds (a tensor or lists of WORDS ints; cursor, set_up: 0 where the kernel does not mark them).
    one_tile (gdn_step, kda_step): word 6 is the one item, and chain the set-up's marks {name: ns or 0}."""
    rows = []
    for cta, r in enumerate(records.tolist() if hasattr(records, "tolist") else records):
        if r[START] == 0:
            continue
        end = max(r[CONSUMER_END], r[OTHER_END])
        items = [t for t in (r[ITEM0:ITEM0 + 1] if one_tile else r[ITEM0:]) if t != 0]
        chain = {name: r[word] for name, word in CHAIN.items()} if one_tile else {}
        rows.append((cta, r[0], r[START], end if end else r[START], items, r[CURSOR], r[SET_UP], chain))
    return rows


def summarise(launches, ctas_per_sm, sms):
    """The module doc's figures (us) for one case, medians over launches 1..; sms: the GPU's SMs."""
    out = {k: [] for k in ("kernel", "gap", "ramp_med", "ramp_last", "item", "tail_med", "tail_first", "busy", "ctas",
                           "life_p10", "life_p50", "life_p90", "to_cursor", "to_set_up", "to_item0",
                           *(f"chain_{name}" for name in CHAIN))}
    prev_end = None
    for k, rows in enumerate(launches):
        if not rows:
            continue
        t0 = min(r[2] for r in rows)
        t1 = max(r[3] for r in rows)
        if k > 0 and prev_end is not None:
            out["gap"].append((t0 - prev_end) / 1e3)
            first_wave = [r for r in rows if r[2] - t0 < 1000 and r[4]]
            out["kernel"].append((t1 - t0) / 1e3)
            out["ramp_med"].append(median([r[4][0] - t0 for r in first_wave]) / 1e3)
            out["ramp_last"].append(max((r[4][0] - t0 for r in first_wave), default=float("nan")) / 1e3)
            per_cta = [median([b - a for a, b in zip(r[4][1:], r[4][2:])]) for r in rows if len(r[4]) >= 4]
            out["item"].append(median(per_cta) / 1e3)
            last_by_sm = {}
            for r in rows:
                last_by_sm[r[1]] = max(last_by_sm.get(r[1], 0), r[3])
            ends = sorted(last_by_sm.values())
            out["tail_med"].append((t1 - median(ends)) / 1e3)
            out["tail_first"].append((t1 - ends[0]) / 1e3)
            out["busy"].append(sum(r[3] - r[2] for r in rows) / (sms * ctas_per_sm * (t1 - t0)))
            out["ctas"].append(len(rows))
            # A CTA's set-up, median over the CTAs that mark it: start -> every thread has the cursor ->
            # the set-up barrier (window dots, C's fragments) -> its first tile (item 0) landed.
            out["to_cursor"].append(median([(r[5] - r[2]) / 1e3 for r in rows if r[5]]))
            out["to_set_up"].append(median([(r[6] - r[5]) / 1e3 for r in rows if r[5] and r[6]]))
            out["to_item0"].append(median([(r[4][0] - (r[6] or r[5])) / 1e3 for r in rows if r[5] and r[4]]))
            # The set-up's chain (gdn_step, kda_step), from the start of the CTAs that replay (set-up mark).
            for name in CHAIN:
                out[f"chain_{name}"].append(median([(r[7][name] - r[2]) / 1e3 for r in rows
                                                    if r[6] and r[7].get(name)]))
            lives = sorted((r[3] - r[2]) / 1e3 for r in rows)
            for q in (10, 50, 90):
                out[f"life_p{q}"].append(lives[min(len(lives) - 1, len(lives) * q // 100)])
        prev_end = t1
    return {k: median(v) for k, v in out.items()}


def pool_case(kind, pool, record, keep):
    """A step case of a replay pool (either family's: cursors, stagger, step_bytes): the run_case tuple,
    the cursors set before each replay (w = L / 2 a replay, L - 1 a fold, slot % L staggered)."""
    if kind.startswith("stag"):
        # Every launch from the same spread (slot % L): the bytes are the mean over w of a launch at w.
        nbytes = sum(pool.step_bytes(w) for w in range(L)) / L
        return record, pool.stagger, pool.k, nbytes, keep
    w = L - 1 if kind.startswith("fold") else L // 2
    return record, (lambda: pool.cursors.fill_(w)), pool.k, pool.step_bytes(w), keep


def run_case(kind, s: Setup):
    """(graph record, before_replay, launches per replay, bytes per launch, what to keep alive) of one case."""
    if kind == "update":
        record, k, nbytes = conventional_steps(s)
        return record, None, k, nbytes, None
    pool = ReplayPool(s, COPIES[kind], staggered_flush=kind.startswith("stag"))
    inputs = make_inputs(s, pool.k)
    return pool_case(kind, pool, lambda: pool.record_steps(inputs), pool)


def run_gdn_case(kind, s):
    """run_case for gdn_step / kda_step (replayssm_cuda.bench.gdn's pool; s a gdn.Setup)."""
    from replayssm_cuda.bench import gdn
    pool = gdn.ReplayPool(s, COPIES[kind], staggered_flush=kind.startswith("stag"))
    inputs = gdn.make_inputs(s, pool.k)
    out = torch.empty(s.batch, s.HV, s.V, device="cuda", dtype=s.act)
    return pool_case(kind, pool, lambda: pool.record_steps(inputs, out), (pool, out))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--family", default="mamba2", choices=["mamba2", "gdn", "kda"],
                        help="whose update / step (gdn, kda: the step only)")
    parser.add_argument("--dims", nargs="*", default=None,
                        help="model names, NAME@tpK or explicit dims (mamba2 H=..,P=..,N=..,G=..; gdn H=..,HV=..,K=..,V=..)")
    parser.add_argument("--batches", nargs="*", type=int, default=[64, 512])
    parser.add_argument("--kernels", nargs="*", default=None, choices=["update", *COPIES],
                        help="default: update step-none (mamba2), step-none (gdn, kda)")
    parser.add_argument("--csv", default=None, help="write every case's records to this .csv.gz file")
    args = parser.parse_args()
    mamba2 = args.family == "mamba2"
    if args.kernels is None:
        args.kernels = ["update", "step-none"] if mamba2 else ["step-none"]
    if not mamba2 and "update" in args.kernels:
        parser.error(f"--family {args.family}: the update has no time line (its kernel marks nothing)")
    if mamba2:
        dims_table = DIMS_TABLE
    else:
        from replayssm_cuda.bench import gdn, kda
        dims_table = gdn.DIMS_TABLE if args.family == "gdn" else kda.DIMS_TABLE
    if args.dims is None:
        args.dims = list(DIMS) if mamba2 else (["qwen4b"] if args.family == "gdn" else ["kimi48b"])
    import replayssm_cuda._extension  # noqa: F401  (loads the extension and with it its ops)
    if not hasattr(torch.ops, "replayssm_diag") or not hasattr(torch.ops.replayssm_diag, "set_cta_timeline"):
        print("this build has no CTA time line: rebuild with REPLAYSSM_CTA_TIMELINE=1 (see the doc)", file=sys.stderr)
        return 2
    copy_bw = measure_copy_bandwidth()
    print(f"# {torch.cuda.get_device_name()}; {args.family}; copy {copy_bw / 1e12:.3f} TB/s; update / step at w = "
          f"{L // 2} / fold at w = {L - 1} / staggered at w = slot % {L}, L = {L}, bf16 activations"
          f"{', z gate' if mamba2 else ''}; us, medians over a graph's launches after its first")
    chain_head = f" set-up chain from the start: {' / '.join(CHAIN)} |" if not mamba2 else ""
    print("| dims | kernel | batch | CTAs | kernel us | ideal us | gap | ramp med / last | item | "
          f"tail med / first | CTA life p10 / p50 / p90 | busy | set-up: cursor / dots / first tile |{chain_head}")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if not mamba2 else ""))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    csv_rows = [CSV_HEADER]
    for name in args.dims:
        dims = dims_table.parse(name)
        for batch in args.batches:
            for kind in args.kernels:
                if mamba2:
                    record, before, k, nbytes, keep = run_case(kind, Setup(dims.H, dims.P, dims.N, dims.G, batch, L))
                else:
                    s = gdn.Setup.of(dims, batch, L, family=args.family)
                    record, before, k, nbytes, keep = run_gdn_case(kind, s)
                # The capture's warm-up call takes the first k record sets, the captured launches the next k.
                buf = torch.zeros(2 * k, MAX_CTAS, WORDS, dtype=torch.int64, device="cuda")
                torch.ops.replayssm_diag.set_cta_timeline(buf)
                graph = _capture(record)
                taken = torch.ops.replayssm_diag.cta_timeline_launches()
                torch.ops.replayssm_diag.set_cta_timeline(None)
                if taken != 2 * k:
                    print(f"# {name} {kind} b{batch}: {taken} launches took record sets, {2 * k} expected",
                          file=sys.stderr)
                    return 1
                buf[k:].zero_()
                _replay_times(graph, 4, before)
                torch.cuda.synchronize()
                launches = [launch_records(buf[k + j].cpu(), one_tile=not mamba2) for j in range(k)]
                occupancy = max_concurrent(launches)
                f = summarise(launches, occupancy, sms)
                links = [f["chain_" + name] for name in CHAIN]
                chain = " " + " / ".join(f"{t:.2f}" for t in links) + " |" if not mamba2 else ""
                print(f"| {name} | {kind} | {batch} | {f['ctas']:.0f} ({occupancy}/SM) | {f['kernel']:.1f} | "
                      f"{nbytes / copy_bw * 1e6:.1f} | {f['gap']:.1f} | {f['ramp_med']:.1f} / {f['ramp_last']:.1f} | "
                      f"{f['item']:.2f} | {f['tail_med']:.1f} / {f['tail_first']:.1f} | "
                      f"{f['life_p10']:.1f} / {f['life_p50']:.1f} / {f['life_p90']:.1f} | {100 * f['busy']:.0f}% | "
                      f"{f['to_cursor']:.2f} / {f['to_set_up']:.2f} / {f['to_item0']:.2f} |{chain}",
                      flush=True)
                if args.csv:
                    csv_rows.extend(csv_lines(f"{name},{kind},{batch}", launches))
                del graph, buf, keep
                torch.cuda.empty_cache()
    if args.csv:
        with gzip.open(args.csv, "wt") as f:
            f.write("\n".join(csv_rows) + "\n")
    return 0


def max_concurrent(launches) -> int:
    """The most CTAs that ran on one SM at once in the second launch (the occupancy the records show)."""
    rows = launches[1] if len(launches) > 1 else launches[0]
    best = 0
    by_sm = {}
    for r in rows:
        by_sm.setdefault(r[1], []).append((r[2], r[3]))
    for spans in by_sm.values():
        events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans], key=lambda e: (e[0], e[1]))
        n = 0
        for _, d in events:
            n += d
            best = max(best, n)
    return best


CSV_HEADER = "dims,kernel,batch,launch,cta,sm,start_ns,end_ns,cursor_ns,set_up_ns,item_ns..."


def csv_lines(case, launches):
    """One line per CTA record, times in ns from the first launch's start; cursor_ns and set_up_ns empty
    where the kernel does not mark them (tools/cta_timeline_gaps.py reads the first eight columns)."""
    t_base = min((r[2] for rows in launches for r in rows), default=0)

    def mark(t):
        return str(t - t_base) if t else ""

    return [",".join([case, *(str(v) for v in [j, cta, sm, start - t_base, end - t_base]), mark(cursor), mark(set_up),
                      *[str(t - t_base) for t in items]])
            for j, rows in enumerate(launches) for cta, sm, start, end, items, cursor, set_up, _ in rows]


if __name__ == "__main__":
    sys.exit(main())
