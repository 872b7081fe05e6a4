"""One table from scripts/ab_bench.sh's rounds: per benchmark row, the median us of the base rounds and
of the new rounds, the change, and the new rounds' range.

    python3 scripts/ab_summary.py $OUT            # reads $OUT/ab_{base,new}_*.md
    python3 scripts/ab_summary.py $OUT v1 base    # reads $OUT/ab_{base,v1}_*.md (scripts/ab_patches.sh)

Why: ab_bench.sh writes a table per side and round (8 files at 4 rounds), and a device call brings back
at most 8 files from $OUT (session 34 lost a run's new-side tables that way), so ab_bench.sh ends by
printing this table (the call's output always comes back) and writing it as ab_summary.md. Rows only
one side has (a benchmark the base lacks) are left out.

A row is named by the cells before its table's first time column (a header cell with "us" in it: "us/step",
"fold us", ...) and gives one summary row per time column, so tables with several (scripts/step_knob_sweep.py:
copy and knob value before step, fold, cycle and update times) are read too; a benchmark with one time column
after dims, batch and kernel (bench_mamba2.py) keeps its kernel names. Without a header line the fourth
column is taken as the time.
"""

import pathlib
import statistics
import sys


def is_time_column(header_cell):
    return "us" in header_cell.replace("/", " ").split()


def read_rows(path):
    """{(dims, batch, name): us} from a bench table: name is the row's cells between batch and the first time
    column (joined by ", "), and with several time columns one entry per column (name + ": " + its header)."""
    rows = {}
    header = None
    for line in path.read_text().splitlines():
        cells = [c.strip() for c in line.split("|")][1:-1]
        if len(cells) < 3:
            continue
        if cells[0] == "dims" and cells[1] == "batch":
            header = cells
            continue
        if not cells[1].isdigit():
            continue
        if header is None or len(header) != len(cells):
            columns = [(cells[2], 3)]  # no header: dims | batch | kernel | us | ...
        else:
            times = [i for i, h in enumerate(header) if i >= 2 and is_time_column(h)]
            if not times:
                continue
            name = ", ".join(cells[2:times[0]])
            columns = [(name, times[0])] if len(times) == 1 else [(f"{name}: {header[i]}", i) for i in times]
        for name, i in columns:
            try:
                rows[(cells[0], int(cells[1]), name)] = float(cells[i])
            except (ValueError, IndexError):
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
