"""tools/cta_timeline_gaps.py on a hand-made record file (CPU): the slot turnover it reports is, per SM,
a CTA's start minus the latest end before it among that SM's earlier CTAs, skipping each SM's first
--ctas-per-sm CTAs; and it reads only the launch asked for."""

import gzip
import importlib.util
import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "tools", "cta_timeline_gaps.py")


def load_tool(name):
    """tools/<name>.py as a module (tools/ is no package)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(os.path.dirname(SCRIPT), f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_records(path, rows):
    with gzip.open(path, "wt") as f:
        f.write("dims,kernel,batch,launch,cta,sm,start_ns,end_ns,item_ns...\n")
        for r in rows:
            f.write(",".join(str(v) for v in r) + "\n")


def test_turnover_start_order_and_lives(tmp_path):
    path = tmp_path / "tl.csv.gz"
    case = ("nano4b", "step-fp8", 256)
    rows = [
        # SM 0, two slots: CTAs 0 and 1 first (skipped), CTA 2 starts 1000 ns after CTA 0 ends,
        # CTA 3 starts 3000 ns after CTA 1 ends (CTA 2, still running, does not count).
        (*case, 1, 0, 0, 0, 10_000),
        (*case, 1, 1, 0, 0, 12_000),
        (*case, 1, 2, 0, 11_000, 30_000),
        (*case, 1, 3, 0, 15_000, 31_000),
        # SM 1: CTA 4 and 5 first; CTA 6 starts 2000 ns after CTA 5, the later of the two ends.
        (*case, 1, 4, 1, 0, 8_000),
        (*case, 1, 5, 1, 0, 9_000),
        (*case, 1, 6, 1, 11_000, 20_000),
        # Another launch, which must not be read.
        (*case, 0, 0, 0, 0, 99_000_000),
    ]
    write_records(path, rows)
    out = subprocess.run([sys.executable, SCRIPT, str(path), "--ctas-per-sm", "2", "--split-index", "4"],
                         check=True, capture_output=True, text=True).stdout
    line = [ln for ln in out.splitlines() if ln.startswith("| nano4b")]
    assert len(line) == 1, out
    cells = [c.strip() for c in line[0].strip("|").split("|")]
    assert cells[3] == "7"  # CTAs of launch 1
    # Turnovers 1000, 2000, 3000 ns: p10 / p50 / p90 1.00 / 2.00 / 3.00 us.
    assert cells[4] == "1.00 / 2.00 / 3.00"
    # The last tenth of 7 CTAs to start is the last one: CTA 3 (start 15000).
    assert cells[5] == "3"
    # Lives: CTAs 0-3 10, 12, 19, 16 us (median 14.0); CTAs 4-6 8, 9, 9 us (median 9.0).
    assert "< 4 14.0 (4)" in cells[6] and ">= 4 9.0 (3)" in cells[6], cells[6]


def test_timeline_csv_carries_the_marks_and_reads_back(tmp_path):
    # tools/cta_timeline.py --csv: start, end, then the cursor and set-up marks (empty where a kernel makes
    # none) and the item times, in ns from the first launch's start; cta_timeline_gaps reads the first
    # eight columns of the same lines.
    timeline = load_tool("cta_timeline")
    # (cta, sm, start, end, items, cursor, set_up, the GDN set-up chain: not in the file)
    launches = [[(0, 5, 1_000, 9_000, [4_000, 6_000], 2_000, 3_000, {"slot": 1_500})],
                [(1, 7, 10_000, 20_000, [], 0, 0, {})]]
    lines = timeline.csv_lines("qwen4b,step-fp8,64", launches)
    assert lines == ["qwen4b,step-fp8,64,0,0,5,0,8000,1000,2000,3000,5000",
                     "qwen4b,step-fp8,64,1,1,7,9000,19000,,"]
    path = tmp_path / "tl.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write(timeline.CSV_HEADER + "\n" + "\n".join(lines) + "\n")
    gaps = load_tool("cta_timeline_gaps")
    assert dict(gaps.load(str(path))) == {("qwen4b", "step-fp8", "64", 0): [(0, 5, 0, 8000)],
                                          ("qwen4b", "step-fp8", "64", 1): [(1, 7, 9000, 19000)]}
