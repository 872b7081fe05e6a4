"""One table from scripts/ab_bench.sh's rounds: per benchmark row, the median us of the base rounds and
of the new rounds, the change, and the new rounds' range.

    python3 scripts/ab_summary.py $OUT            # reads $OUT/ab_{base,new}_*.md

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


def summarize(out_dir):
    times = {}  # row -> side -> [us per round]
    for side in ("base", "new"):
        for path in sorted(pathlib.Path(out_dir).glob(f"ab_{side}_*.md")):
            for row, us in read_rows(path).items():
                times.setdefault(row, {}).setdefault(side, []).append(us)
    lines = ["| dims | batch | kernel | base us | new us | change | new range |", "|---|---|---|---|---|---|---|"]
    for (dims, batch, kernel), sides in times.items():
        if "base" not in sides or "new" not in sides:
            continue
        base, new = statistics.median(sides["base"]), statistics.median(sides["new"])
        lines.append(f"| {dims} | {batch} | {kernel} | {base:.1f} | {new:.1f} | {100 * (new / base - 1):+.1f}% | "
                     f"{min(sides['new']):.1f}-{max(sides['new']):.1f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python3 scripts/ab_summary.py OUT_DIR (the folder of ab_bench.sh's ab_{base,new}_*.md)")
    table = summarize(sys.argv[1])
    (pathlib.Path(sys.argv[1]) / "ab_summary.md").write_text(table)
    print(table, end="")
