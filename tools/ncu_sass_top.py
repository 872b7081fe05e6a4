"""The SASS instructions where a kernel's warps spend their time, from Nsight Compute's source page.

Reads the csv that `tools/profile.sh source` writes (`ncu -i REPORT --page source --csv --print-source sass`,
one block per profiled launch) and prints, per launch, the instructions with the most warp-stall samples
(all samples: issued or not), each with its share of the launch's samples and its three largest stall
reasons. A wait on an mbarrier shows as the `@!P0 BRA` of its try_wait loop with stall_long_sb; the set-up
barrier as stall_barrier; match addresses to code by the instructions around them (the HMMA of the
consumers' dot, the i % S divisions at a loop's top).

    python3 tools/ncu_sass_top.py results/ncu_step_sass.csv [--top 25]
"""

import argparse
import csv


def number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def launches(path: str):
    """Header and rows of each launch's block (each block starts with a header holding Address and Source)."""
    blocks = []
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if "Address" in row and "Source" in row:
                blocks.append((row, []))
            elif blocks and len(row) == len(blocks[-1][0]):
                blocks[-1][1].append(row)
    return blocks


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    for k, (header, rows) in enumerate(launches(args.csv)):
        samples = header.index("Warp Stall Sampling (All Samples)")
        reasons = [i for i, name in enumerate(header) if name.startswith("stall_") and "(Not Issued)" not in name]
        total = sum(number(r[samples]) for r in rows) or 1.0
        print(f"launch {k}: {total:.0f} samples over {len(rows)} instructions")
        for r in sorted(rows, key=lambda r: -number(r[samples]))[:args.top]:
            top = sorted(((number(r[i]), header[i]) for i in reasons), reverse=True)[:3]
            why = " ".join(f"{name}={value:.0f}" for value, name in top if value > 0)
            print(f"{100 * number(r[samples]) / total:5.1f}%  {r[header.index('Address')]}  "
                  f"{r[header.index('Source')].strip()[:60]:60s}  {why}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
