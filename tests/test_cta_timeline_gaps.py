"""tools/cta_timeline_gaps.py on a hand-made record file (CPU): the slot turnover it reports is, per SM,
a CTA's start minus the latest end before it among that SM's earlier CTAs, skipping each SM's first
--ctas-per-sm CTAs; and it reads only the launch asked for. Also tools/cta_timeline.py's reading of CTA
records: a GDN / KDA step CTA's one tile is word 6 and the words after it are its set-up's chain, whose
links are medians from the start of the CTAs that replay (a folding CTA has no set-up mark and is left
out); a Mamba-2 CTA's words from 6 on are all items."""

import gzip
import importlib.util
import math
import os
import subprocess
import sys

import pytest

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


def record(tool, sm, start, end, marks):
    """A WORDS-long record: word 0 the SM, 1 the start, 2 the end, and {word: ns} marks."""
    r = [0] * tool.WORDS
    r[0], r[tool.START], r[tool.CONSUMER_END] = sm, start, end
    for word, t in marks.items():
        r[word] = t
    return r


def gdn_launch(tool, t0):
    """Three replaying CTAs (chain links 1, 2, 3 us apart by CTA) and one folding CTA (slot and cursor
    read only, far later, which must not move the medians)."""
    chain = tool.CHAIN
    rows = []
    for i, scale in enumerate((1, 2, 3)):
        start = t0 + 100 * i
        marks = {chain["slot"]: start + 500 * scale, chain["cursor read"]: start + 1000 * scale,
                 chain["token"]: start + 300 * scale, chain["keys"]: start + 1500 * scale,
                 chain["window"]: start + 2000 * scale, tool.CURSOR: start + 1200 * scale,
                 tool.SET_UP: start + 2500 * scale, tool.ITEM0: start + 2600 * scale}
        rows.append(record(tool, i, start, start + 4000 * scale, marks))
    fold_start = t0 + 50
    rows.append(record(tool, 3, fold_start, fold_start + 40000, {chain["slot"]: fold_start + 9000,
                                                                 chain["cursor read"]: fold_start + 9500,
                                                                 tool.CURSOR: fold_start + 9900}))
    return rows


def test_gdn_records_one_item_then_the_chain():
    tool = load_tool("cta_timeline")
    rows = tool.launch_records(gdn_launch(tool, 1_000_000), one_tile=True)
    assert len(rows) == 4
    first = rows[0]
    assert first[4] == [1_000_000 + 2600]  # word 6 only: the chain's words are not items
    assert first[7]["window"] == 1_000_000 + 2000
    folding = rows[3]
    assert folding[4] == [] and folding[6] == 0 and folding[7]["slot"] == 1_000_000 + 50 + 9000


def test_gdn_chain_medians_over_replaying_ctas():
    tool = load_tool("cta_timeline")
    launches = [tool.launch_records(gdn_launch(tool, t0), one_tile=True) for t0 in (1_000_000, 2_000_000)]
    f = tool.summarise(launches, ctas_per_sm=1, sms=4)
    # The median CTA is the one with scale 2: slot 1.0 us, cursor read 2.0, token 0.6, keys 3.0, window 4.0.
    assert f["chain_slot"] == pytest.approx(1.0)
    assert f["chain_cursor read"] == pytest.approx(2.0)
    assert f["chain_token"] == pytest.approx(0.6)
    assert f["chain_keys"] == pytest.approx(3.0)
    assert f["chain_window"] == pytest.approx(4.0)
    assert f["to_set_up"] == pytest.approx(2.6)  # cursor (2.4 us) -> set-up (5.0 us) of the median CTA
    assert f["ctas"] == 4


def test_mamba2_records_take_every_word_from_6_as_items_and_have_no_chain():
    tool = load_tool("cta_timeline")
    r = record(tool, 0, 1000, 9000, {6: 2000, 7: 3000, 8: 4000, 9: 5000})
    rows = tool.launch_records([r, r])
    assert rows[0][4] == [2000, 3000, 4000, 5000] and rows[0][7] == {}
    f = tool.summarise([rows, [record_shift(x, 10_000) for x in rows]], ctas_per_sm=1, sms=1)
    assert all(math.isnan(f["chain_" + name]) for name in tool.CHAIN)


def record_shift(row, dt):
    cta, sm, start, end, items, cursor, set_up, chain = row
    return (cta, sm, start + dt, end + dt, [t + dt for t in items], cursor, set_up, chain)
