"""scripts/ab_summary.py reads the tables scripts/ab_bench.sh collects (CPU only): bench_mamba2.py's, one
time column per row, and scripts/step_knob_sweep.py's, whose knob value sits where a time used to be read and
which has four time columns a row."""

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location("ab_summary", os.path.join(ROOT, "scripts", "ab_summary.py"))
ab_summary = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ab_summary)

BENCH = """# NVIDIA H200; copy 4.2 TB/s
| dims | batch | kernel | us/step | GB/s | % copy BW | speedup vs conventional |
|---|---|---|---|---|---|---|
| nano4b | 256 | conventional update | {update} | 3990 | 94.0 | 1.00x |
| nano4b | 256 | lock-step cycle, fp8 copy: mean step | {cycle} | 3500 | 82.0 | 3.86x |
"""

SWEEP = """# NVIDIA H200; copy 4.262 TB/s; L = 16
| dims | batch | copy | REPLAYSSM_X | step us | step % copy | fold us | fold / update | cycle us/step | update us | update / cycle |
|---|---|---|---|---|---|---|---|---|---|---|
| nano4b | 64 | bf16 | unset | {step} | 79.9 | {fold} | 1.568 | 50.2 | 130.2 | 2.59 |
| nano4b | 64 | bf16 | 8 | 41.0 | 79.9 | 205.0 | 1.568 | 50.4 | 130.2 | 2.59 |
"""


def write(tmp_path, side, round_, text):
    (tmp_path / f"ab_{side}_{round_}.md").write_text(text)


def test_bench_mamba2_rows_keep_their_kernel_names(tmp_path):
    write(tmp_path, "base", 1, BENCH.format(update=500.0, cycle=130.0))
    write(tmp_path, "base", 2, BENCH.format(update=502.0, cycle=132.0))
    write(tmp_path, "new", 1, BENCH.format(update=501.0, cycle=126.0))
    write(tmp_path, "new", 2, BENCH.format(update=503.0, cycle=128.0))
    rows = ab_summary.read_rows(tmp_path / "ab_base_1.md")
    assert rows == {("nano4b", 256, "conventional update"): 500.0,
                    ("nano4b", 256, "lock-step cycle, fp8 copy: mean step"): 130.0}
    table = ab_summary.summarize(tmp_path)
    assert "| nano4b | 256 | lock-step cycle, fp8 copy: mean step | 131.0 | 127.0 | -3.1% | 126.0-128.0 |" in table


def test_knob_sweep_rows_give_one_entry_per_time_column(tmp_path):
    write(tmp_path, "base", 1, SWEEP.format(step=40.9, fold=204.1))
    write(tmp_path, "new", 1, SWEEP.format(step=40.8, fold=194.0))
    rows = ab_summary.read_rows(tmp_path / "ab_new_1.md")
    assert rows[("nano4b", 64, "bf16, unset: step us")] == 40.8
    assert rows[("nano4b", 64, "bf16, unset: fold us")] == 194.0
    assert rows[("nano4b", 64, "bf16, 8: cycle us/step")] == 50.4
    assert rows[("nano4b", 64, "bf16, 8: update us")] == 130.2
    assert len(rows) == 8  # 2 rows x 4 time columns; ratios and percentages are not times
    table = ab_summary.summarize(tmp_path)
    assert "| nano4b | 64 | bf16, unset: fold us | 204.1 | 194.0 | -4.9% | 194.0-194.0 |" in table


def test_a_table_without_its_header_reads_the_fourth_column(tmp_path):
    body = "| super120b | 512 | update | 1070.3 | 4000 |\n"
    (tmp_path / "t.md").write_text(body)
    assert ab_summary.read_rows(tmp_path / "t.md") == {("super120b", 512, "update"): 1070.3}
