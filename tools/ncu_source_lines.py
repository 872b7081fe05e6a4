"""A kernel's executed instructions and warp-stall samples per CUDA source line, from Nsight Compute's
source page with CUDA and SASS together (`tools/profile.sh source` writes it: ncu_step_cudasass.csv). Counts
are divided by --items (e.g. batch x heads: 256 x 96 = 24576 for nano4b batch 256) to read as warp
instructions per (row, head); an inlined helper's instructions count on its own line.

    python3 tools/ncu_source_lines.py results/ncu_step_cudasass.csv --items 24576 [--top 60] [--by samples]

Lines come most-executed first, or with --by samples most-sampled first: where warps wait (an mbarrier
wait or __syncthreads line high there, with few instructions, is a hand-over the kernel stalls on), or
with --by conflicts by the shared-memory wavefronts beyond the ideal (ncu's "L1 Wavefronts Shared
Excessive": bank conflicts), printed per item with the line's share of the kernel's excess."""

import argparse
import collections
import csv


def number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--items", type=float, default=1.0, help="divide instruction counts by this")
    ap.add_argument("--top", type=int, default=60)
    ap.add_argument("--by", choices=("instructions", "samples", "conflicts"), default="instructions",
                    help="order lines by executed instructions (default), warp-stall samples or excess "
                         "shared-memory wavefronts")
    args = ap.parse_args()
    rows, per_file = [], collections.Counter()
    path, inst = "?", None
    with open(args.csv, newline="") as f:
        for r in csv.reader(f):
            if r and r[0] == "File Path":
                path = r[1].split("/")[-1]
            elif r and r[0] == "Line No":
                inst, samples = r.index("Instructions Executed"), r.index("Warp Stall Sampling (All Samples)")
                excess = [i for i, name in enumerate(r) if "Wavefronts Shared Excessive" in name]
                if args.by == "conflicts" and not excess:
                    raise SystemExit("no 'L1 Wavefronts Shared Excessive' column (profile with --set full); "
                                     f"columns with 'Shared': {[n for n in r if 'Shared' in n]}")
            elif inst is not None and len(r) > inst and r[0] and r[0] != "Function Name":
                conflicts = number(r[excess[0]]) if excess else 0.0
                rows.append((number(r[inst]), number(r[samples]), conflicts, path, r[0], r[1].strip()))
                per_file[path] += number(r[inst])
    total_inst = sum(r[0] for r in rows) or 1.0
    total_samples = sum(r[1] for r in rows) or 1.0
    total_excess = sum(r[2] for r in rows) or 1.0
    print(f"{total_inst / args.items:.1f} instructions per item, {total_samples:.0f} samples")
    for name, n in per_file.most_common():
        print(f"  {name:32s} {100 * n / total_inst:5.1f}% of instructions")
    key = {"instructions": 0, "samples": 1, "conflicts": 2}[args.by]
    for n, s, c, name, line, source in sorted(rows, key=lambda r: -r[key])[:args.top]:
        if args.by == "conflicts":
            print(f"{c / args.items:8.2f} {100 * c / total_excess:5.1f}%  {n / args.items:8.1f}  {name}:{line}  {source[:80]}")
        else:
            print(f"{n / args.items:8.1f} {100 * s / total_samples:5.1f}%  {name}:{line}  {source[:90]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
