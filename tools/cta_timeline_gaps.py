"""Slot turnover and start order from the per-CTA records that tools/cta_timeline.py --csv writes:

    PYTHONPATH=. python3 tools/cta_timeline.py --batches 256 --kernels step-fp8 --csv tl.csv.gz   # GPU, diagnostic build
    python3 tools/cta_timeline_gaps.py tl.csv.gz [--launch 1] [--ctas-per-sm 3] [--split-index 792]

Per case (dims, kernel, batch), for one launch of its graph (default the second: it follows a launch of the
same kind, as in decode):
    turnover   on each SM, a CTA's start mark minus the latest end mark of that SM's CTAs that ended
               before it (CTAs after the SM's first --ctas-per-sm): the CTA exit, the next CTA's launch
               and its work before the start mark (the slot index), p10 / p50 / p90
    last tenth the smallest CTA index among the last tenth of the CTAs to start (CTAs start in blockIdx
               order when it is close to the count less a tenth)
    life       CTA start -> end p50, and with --split-index I separately for CTAs of index < I and >= I
               (e.g. the two kinds of CTA of a launch whose grid is split by kind)
CPU only: it reads the file."""

import argparse
import gzip
import statistics
import sys
from collections import defaultdict


def load(path):
    """{(dims, kernel, batch, launch): [(cta, sm, start_ns, end_ns)]}"""
    cases = defaultdict(list)
    with gzip.open(path, "rt") as f:
        next(f)  # header
        for line in f:
            v = line.strip().split(",")
            cases[(v[0], v[1], v[2], int(v[3]))].append((int(v[4]), int(v[5]), int(v[6]), int(v[7])))
    return cases


def quantile(sorted_values, q):
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]


def turnover_ns(records, ctas_per_sm):
    by_sm = defaultdict(list)
    for _, sm, start, end in records:
        by_sm[sm].append((start, end))
    gaps = []
    for ctas in by_sm.values():
        ctas.sort()
        for i in range(ctas_per_sm, len(ctas)):
            start = ctas[i][0]
            ended = [end for _, end in ctas[:i] if end <= start]
            if ended:
                gaps.append(start - max(ended))
    return sorted(gaps)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv", help="a .csv.gz from tools/cta_timeline.py --csv")
    ap.add_argument("--launch", type=int, default=1)
    ap.add_argument("--ctas-per-sm", type=int, default=3)
    ap.add_argument("--split-index", type=int, default=None)
    args = ap.parse_args()
    print("| dims | kernel | batch | CTAs | turnover p10 / p50 / p90 us | last tenth from CTA | life p50 us |")
    print("|---|---|---|---|---|---|---|")
    for (dims, kernel, batch, launch), records in load(args.csv).items():
        if launch != args.launch:
            continue
        gaps = turnover_ns(records, args.ctas_per_sm)
        by_start = sorted(records, key=lambda r: r[2])
        last_tenth = min(r[0] for r in by_start[len(by_start) - max(1, len(by_start) // 10):])
        lives = {"all": [(r[3] - r[2]) / 1e3 for r in records]}
        if args.split_index is not None:
            lives[f"< {args.split_index}"] = [(r[3] - r[2]) / 1e3 for r in records if r[0] < args.split_index]
            lives[f">= {args.split_index}"] = [(r[3] - r[2]) / 1e3 for r in records if r[0] >= args.split_index]
        life = ", ".join(f"{k} {statistics.median(v):.1f} ({len(v)})" for k, v in lives.items() if v)
        turnover = " / ".join(f"{quantile(gaps, q) / 1e3:.2f}" for q in (0.1, 0.5, 0.9)) if gaps else "-"
        print(f"| {dims} | {kernel} | {batch} | {len(records)} | {turnover} | {last_tenth} | {life} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
