"""One table from scripts/ab_bench.sh's rounds: per benchmark row, the median us of the base rounds and
of the new rounds, the change, and the new rounds' range.

    python3 scripts/ab_summary.py $OUT            # reads $OUT/ab_{base,new}_*.md
    python3 scripts/ab_summary.py $OUT v1 base    # reads $OUT/ab_{base,v1}_*.md (scripts/ab_patches.sh)

Why: ab_bench.sh writes a table per side and round (8 files at 4 rounds), and a device call brings back
at most 8 files from $OUT (session 34 lost a run's new-side tables that way), so ab_bench.sh ends by
printing this table (the call's output always comes back) and writing it as ab_summary.md. Rows only
one side has (a benchmark the base lacks) are left out.
"""

import pathlib
import statistics
import sys


def read_rows(path):
    """{(dims, batch, kernel): us} from a bench table (its first three columns name the row, the fourth is us)."""
    rows = {}
    for line in path.read_text().splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) > 5 and cells[2].isdigit():
            try:
                rows[(cells[1], int(cells[2]), cells[3])] = float(cells[4])
            except ValueError:
                continue
    return rows


def summarize(out_dir, new_side="new", base_side="base"):
    times = {}  # row -> side -> [us per round]
    for side in (base_side, new_side):
        for path in sorted(pathlib.Path(out_dir).glob(f"ab_{side}_*.md")):
            for row, us in read_rows(path).items():
                times.setdefault(row, {}).setdefault(side, []).append(us)
    lines = [f"| dims | batch | kernel | {base_side} us | {new_side} us | change | {new_side} range |",
             "|---|---|---|---|---|---|---|"]
    for (dims, batch, kernel), sides in times.items():
        if base_side not in sides or new_side not in sides:
            continue
        base, new = statistics.median(sides[base_side]), statistics.median(sides[new_side])
        lines.append(f"| {dims} | {batch} | {kernel} | {base:.1f} | {new:.1f} | {100 * (new / base - 1):+.1f}% | "
                     f"{min(sides[new_side]):.1f}-{max(sides[new_side]):.1f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3, 4):
        sys.exit("usage: python3 scripts/ab_summary.py OUT_DIR [NEW_SIDE [BASE_SIDE]] (the folder of "
                 "ab_{base,new}_*.md; sides default to new and base)")
    new_side = sys.argv[2] if len(sys.argv) > 2 else "new"
    base_side = sys.argv[3] if len(sys.argv) > 3 else "base"
    table = summarize(sys.argv[1], new_side, base_side)
    suffix = "" if new_side == "new" else f"_{new_side}"
    (pathlib.Path(sys.argv[1]) / f"ab_summary{suffix}.md").write_text(table)
    print(table, end="")
