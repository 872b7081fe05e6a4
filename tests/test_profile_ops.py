"""tools/profile_ops.py on the CPU: its calls cover every compiled op and run (through the checked
reference) with the argument lists the ops take; the table reads ncu's CSV exports (a hand-written sample
in ncu's documented `--page raw --csv` layout: a header row, a row of units, one row per kernel)."""

import re
import sys
from pathlib import Path

import pytest

from replayssm_cuda import _schemas
from test_library import cpp_schemas

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import profile_ops  # noqa: E402


def plan(*argv):
    return profile_ops.build_calls(profile_ops.parse_args(["--device", "meta", *argv]))


def test_the_calls_cover_every_compiled_op_in_an_order_the_table_can_split():
    calls = plan("--copies", "none,bf16,fp16,fp8")
    ops = {c.op for c in calls}
    assert set(cpp_schemas()) <= ops, f"no call for {sorted(set(cpp_schemas()) - ops)}"
    assert ops <= set(_schemas.SCHEMAS)
    profile_ops.check_order(calls)
    labels = [c.label for c in calls]
    assert len(labels) == len(set(labels)), "every call has its own label"
    for family in ("mamba2", "gdn", "kda"):  # the step once replaying and once folding, per read copy
        assert f"{family}_step replay w=8, fp8 copy" in labels and f"{family}_step fold, no copy" in labels


def test_neighbouring_calls_of_one_op_share_a_label():
    calls = [c for c in plan() if c.op == "mamba2_step" or c.op == "gdn_update"]
    runs = profile_ops.call_runs(calls)
    assert runs[0] == ("mamba2_step", "replay w=8, no copy + fold, no copy + replay w=8, fp8 copy + fold, fp8 copy")
    assert runs[1] == ("gdn_update", "T=1")


def test_the_calls_run_through_the_reference_on_the_cpu(tmp_path, capsys):
    out = tmp_path / "calls.tsv"
    argv = ["--device", "cpu", "--mamba2", "tiny", "--gdn", "tiny", "--kda", "tiny", "--batch", "5", "--buffer-len", "8",
            "--copies", "none,bf16,fp8", "--calls-out", str(out)]
    assert profile_ops.main(argv) == 0
    assert "profile_ops: ran 67 calls of 34 ops on cpu" in capsys.readouterr().out
    lines = out.read_text().splitlines()
    assert lines[0] == "mamba2_update\tT=1" and "gdn_step\tfold, bf16 copy" in lines and len(lines) == 67


RAW = '''==PROF== Disconnected from process 4242
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","dram__bytes.sum.per_second","dram__bytes_read.sum","dram__bytes_write.sum","dram__throughput.avg.pct_of_peak_sustained_elapsed","gpu__time_duration.sum","launch__block_size","launch__grid_size","launch__registers_per_thread","launch__shared_mem_per_block_dynamic","launch__shared_mem_per_block_static","sm__warps_active.avg.pct_of_peak_sustained_active","smsp__issue_active.avg.pct_of_peak_sustained_active","smsp__inst_executed.sum"
"","","","","","","","","","","","byte/second","byte","byte","%","nsecond","","","register/thread","byte/block","byte/block","%","%","inst"
"2","4242","python3","gpu0","void replayssm::mamba2::step_kernel<replayssm::mamba2::StepTraits<80, 128, (int)2>>(replayssm::mamba2::StepParams)","1","7","(256, 1, 1)","(3072, 1, 1)","0","9.0","3,012,000,000,000","1,006,632,960","4,194,304","89.5","335,210","256","3,072","128","99,328","1,024","47.3","48.6","24,686,592"
"0","4242","python3","gpu0","void replayssm::mamba2::update_kernel<80, 128>(replayssm::mamba2::UpdateParams)","1","7","(128, 1, 1)","(132, 1, 1)","0","9.0","3,100,000,000,000","1,006,632,960","1,006,632,960","92","650,000","128","132","96","65,536","0","n/a","12.5","1,000,000"
"1","4242","python3","gpu0","void replayssm::mamba2::step_kernel<replayssm::mamba2::StepTraits<80, 128, (int)0>>(replayssm::mamba2::StepParams)","1","7","(256, 1, 1)","(3072, 1, 1)","0","9.0","2,500,000,000,000","500,000,000","4,194,304","74.1","200,000","256","3,072","128","99,328","1,024","50","77.9","n/a"
"3","4242","python3","gpu0","void replayssm::cache::copy_slots_kernel(replayssm::cache::CopySlotsParams)","1","7","(256, 1, 1)","(64, 1, 1)","0","9.0","1,000,000,000,000","1,000,000","1,000,000","30","2,000","256","64","32","0","0","60","5","16,384"
'''
# The same report exported with --print-nvtx-rename kernel: each kernel named after its innermost range.
NVTX = '''"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","gpu__time_duration.sum"
"","","","","","","","","","","","nsecond"
"0","4242","python3","gpu0","replayssm::mamba2_update","1","7","(128, 1, 1)","(132, 1, 1)","0","9.0","650,000"
"1","4242","python3","gpu0","replayssm::mamba2_step","1","7","(256, 1, 1)","(3072, 1, 1)","0","9.0","200,000"
"2","4242","python3","gpu0","replayssm::mamba2_step","1","7","(256, 1, 1)","(3072, 1, 1)","0","9.0","335,210"
"3","4242","python3","gpu0","void replayssm::cache::copy_slots_kernel(replayssm::cache::CopySlotsParams)","1","7","(256, 1, 1)","(64, 1, 1)","0","9.0","2,000"
'''


def test_the_table_joins_the_exports_in_launch_order():
    calls = [("mamba2_update", ""), ("mamba2_materialize", "w=8"), ("mamba2_step", "replay w=8 + fold")]
    table = profile_ops.kernel_table(RAW, NVTX, calls)
    assert [r["op"] for r in table] == ["mamba2_update", "mamba2_step", "mamba2_step", "-"]
    # materialize launched nothing that was profiled: the step's two kernels still find their call
    assert [r["call"] for r in table] == ["", "replay w=8 + fold", "replay w=8 + fold", "?"]
    update, step = table[0], table[2]
    assert update["kernel"] == "update_kernel<80, 128>"
    assert step["kernel"] == "step_kernel<StepTraits<80, 128, (int)2>>"
    assert step["us"] == pytest.approx(335.21) and step["dram_GBs"] == pytest.approx(3012)
    assert step["dram_pct"] == pytest.approx(89.5) and step["occupancy_pct"] == pytest.approx(47.3)
    assert step["dram_MB"] == pytest.approx(1010.827264)
    assert (step["grid"], step["block"], step["regs"]) == (3072, 256, 128)
    assert step["smem_KiB"] == pytest.approx(98)
    # 24,686,592 warp instructions over 3072 CTAs of 256 threads: 1004.5 instructions a thread
    assert step["issue_pct"] == pytest.approx(48.6) and step["inst_per_thread"] == pytest.approx(1004.5)
    assert table[1]["inst_per_thread"] is None, "n/a is no number"
    assert update["occupancy_pct"] is None, "n/a is no number"
    text = profile_ops.format_table(table)
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["op", "call", "kernel"] and len(lines) == 2 + 4
    assert "335.2" in lines[4] and "3012" in lines[4]


def test_units_with_prefixes_and_the_ncu_default_layout():
    # ncu without --print-units base scales units (usecond, Gbyte/second, Kbyte); the parser converts.
    raw = ('"ID","Kernel Name","gpu__time_duration.sum","dram__bytes.sum.per_second","dram__bytes_read.sum",'
           '"dram__bytes_write.sum","launch__shared_mem_per_block_static","launch__shared_mem_per_block_dynamic"\n'
           '"","","usecond","Tbyte/second","Mbyte","Kbyte","Kbyte/block","byte/block"\n'
           '"0","k(int)","12.5","2.9","40","512","1","0"\n')
    (row,) = profile_ops.read_ncu_csv(raw)
    assert profile_ops.value(row, "gpu__time_duration.sum", "s") == pytest.approx(12.5e-6)
    assert profile_ops.value(row, "dram__bytes.sum.per_second", "B/s") == pytest.approx(2.9e12)
    (entry,) = profile_ops.kernel_table(raw, raw)
    assert entry["dram_MB"] == pytest.approx(40.512) and entry["smem_KiB"] == pytest.approx(1000 / 1024)
    assert entry["op"] == "-" and entry["kernel"] == "k" and entry["regs"] is None


def test_a_csv_without_an_ncu_header_is_refused():
    with pytest.raises(ValueError, match="no ncu CSV header"):
        profile_ops.read_ncu_csv("==PROF== No kernels were profiled.\n")


def test_the_table_command(tmp_path, capsys):
    (tmp_path / "raw.csv").write_text(RAW)
    (tmp_path / "nvtx.csv").write_text(NVTX)
    (tmp_path / "calls.tsv").write_text("mamba2_update\t\nmamba2_step\treplay w=8 + fold\n")
    assert profile_ops.main(["--table", str(tmp_path / "raw.csv"), str(tmp_path / "nvtx.csv"),
                             "--calls", str(tmp_path / "calls.tsv")]) == 0
    out = capsys.readouterr().out
    assert re.search(r"mamba2_step +replay w=8 \+ fold +step_kernel<StepTraits<80", out)
    assert "copy_slots_kernel" in out


class FakeNcuReport:
    """The part of ncu's ncu_report module that report_ranges reads (load_report, ranges of actions, each
    action's name and NVTX state: domains by id, each with its push/pop range stack, outermost first)."""

    class Domain:
        def __init__(self, name, stack):
            self._name, self._stack = name, stack

        def name(self):
            return self._name

        def push_pop_ranges(self):
            return list(self._stack)

    class State:
        def __init__(self, domains):
            self._domains = domains

        def domains(self):
            return list(range(len(self._domains)))

        def domain_by_id(self, i):
            return self._domains[i]

    class Action:
        def __init__(self, name, domains):
            self._name, self._state = name, FakeNcuReport.State(domains)

        def name(self):
            return self._name

        def nvtx_state(self):
            return self._state

    class Range:
        def __init__(self, actions):
            self._actions = actions

        def num_actions(self):
            return len(self._actions)

        def action_by_idx(self, i):
            return self._actions[i]

    def __init__(self, ranges):
        self._ranges = ranges

    def load_report(self, path):
        assert path == "ops.ncu-rep"
        return self

    def num_ranges(self):
        return len(self._ranges)

    def range_by_idx(self, i):
        return self._ranges[i]


def test_report_ranges_names_each_kernel_after_its_innermost_replayssm_range(monkeypatch):
    R, D, A = FakeNcuReport.Range, FakeNcuReport.Domain, FakeNcuReport.Action
    fake = FakeNcuReport([
        R([A("update_kernel", [D("replayssm", ["replayssm::mamba2_update"])]),
           A("fill_kernel", [D("other", ["outer", "inner"])]),      # another domain's range: the kernel's own name
           A("step_kernel", [D("other", ["x"]), D("replayssm", ["replayssm::outer", "replayssm::mamba2_step"])])]),
        R([A("copy_slots_kernel", [])]),
    ])
    monkeypatch.setattr(profile_ops, "_import_ncu_report", lambda: fake)
    text = profile_ops.report_ranges("ops.ncu-rep")
    rows = [(r["ID"][0], r["Kernel Name"][0]) for r in profile_ops.read_ncu_csv(text)]
    assert rows == [("0", "replayssm::mamba2_update"), ("1", "fill_kernel"), ("2", "replayssm::mamba2_step"),
                    ("3", "copy_slots_kernel")]
