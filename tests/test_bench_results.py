"""The benchmark's rows, tables and results file (replayssm_cuda.bench.results, runner, compare, plot), with
made-up measurements on the CPU: derived columns, the markdown table, a rerun replacing the rows of its
configurations, the runner's baselines, override sets and errors, and a whole command with the GPU faked."""

import contextlib
import datetime
import json

import pytest

import replayssm_cuda
from replayssm_cuda.bench import cli, compare, results, runner, timing
from replayssm_cuda.bench.registry import Bench, Case, Measurement

RUN = {"id": "2026-01-02T03:04:05Z", "gpu": "NVIDIA H100 80GB HBM3", "date": "2026-01-02 03:04 UTC",
       "commit": "abc1234567", "torch": "2.13.0+cu130", "cuda": "13.0", "copy_bw": 3.0e12,
       "settings": {"hold µs": "300"}, "command": "python -m replayssm_cuda bench mamba2 cycle"}


def row(batch, kind, us, nbytes=None, baseline=None, copy="none", table="mamba2 cycle", **extra):
    config = {"dims": "nano4b", "batch": batch, "row": kind, "copy": copy, "L": 16, "launch": "rule"}
    return results.make_row(table, config, us, nbytes, 3.0e12, baseline, extra, meta={"dims": "H=96 P=80 N=128 G=8"})


# ---- rows and tables --------------------------------------------------------------------------------

def test_derived_columns():
    r = row(64, "lock-step cycle", 100.0, nbytes=240e6, baseline=180.0)
    assert r["gbps"] == pytest.approx(2400.0)          # 240 MB in 100 µs
    assert r["copy_pct"] == pytest.approx(80.0)        # of 3 TB/s
    assert r["speedup"] == pytest.approx(1.8)
    bare = row(64, "verify + commit", 50.0)
    assert bare["gbps"] is None and bare["copy_pct"] is None and bare["speedup"] is None


def test_markdown_table_keeps_varying_columns_and_states_the_rest():
    rows = [row(64, "update", 180.0, 400e6, 180.0, copy="-"), row(64, "lock-step cycle", 100.0, 240e6, 180.0),
            row(256, "lock-step cycle", 380.0, 960e6, 700.0, **{"slowest/mean": 1.234})]
    text = results.markdown_table(rows)
    lines = text.splitlines()
    assert lines[0] == "All rows: dims nano4b, L 16, launch rule."
    assert lines[2] == "| batch | row | copy | µs | GB/s | % copy | baseline µs | speed-up | slowest/mean |"
    assert lines[3] == "|---|---|---|---|---|---|---|---|---|"
    assert lines[5] == "| 64 | lock-step cycle | none | 100.00 | 2400 | 80.0 | 180.00 | 1.80x | - |"
    assert lines[6] == "| 256 | lock-step cycle | none | 380.00 | 2526 | 84.2 | 700.00 | 1.84x | 1.23 |"


def test_an_error_row_says_what_failed():
    r = results.make_row("mamba2 cycle", {"batch": 1}, None, None, 3e12, None, error="RuntimeError: no kernel")
    assert results.table_line(r, ["batch"], []) == "| 1 | error: RuntimeError: no kernel | - | - | - | - |"


def test_kernel_table():
    r = row(64, "update", 180.0, extra=None)
    r["extra"]["kernels"] = {"update_kernel": 170e-6, "(replay)": 180e-6}
    text = results.kernel_table([r, row(64, "lock-step cycle", 100.0)])
    assert "| update_kernel | 170.00 |" in text and "| (replay) | 180.00 |" in text


@pytest.mark.parametrize("name, model", [
    ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"), ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA H100 NVL", "h100-nvl"), ("NVIDIA A100-SXM4-80GB", "a100-sxm4"), ("NVIDIA B200", "b200"),
    ("NVIDIA GH200 480GB", "gh200"), ("NVIDIA H200 NVL 141GB HBM3e", "h200-nvl")])
def test_gpu_model_file_names(name, model):
    assert results.gpu_model(name) == model


# ---- the results file -------------------------------------------------------------------------------

def test_results_file_header_and_rows(tmp_path):
    store = results.ResultsFile(tmp_path, "h100")
    rows = [row(64, "update", 180.0, 400e6, 180.0, copy="-"), row(64, "lock-step cycle", 100.0, 240e6, 180.0)]
    store.merge(RUN, rows, {"mamba2 cycle": "µs per step of the cycle."})
    store.write()
    md = (tmp_path / "h100.md").read_text()
    assert md.startswith("# Benchmarks: NVIDIA H100 80GB HBM3\n")
    assert "Dims: nano4b: H=96 P=80 N=128 G=8." in md
    assert "## mamba2 cycle\n\nµs per step of the cycle.\n" in md
    assert ("Run 2026-01-02 03:04 UTC, commit abc1234567, torch 2.13.0+cu130, CUDA 13.0, device-to-device copy "
            "3.000 TB/s (read + write), hold µs 300.") in md
    assert "`python -m replayssm_cuda bench mamba2 cycle`" in md
    assert "| update | - | 180.00 | 2222 | 74.1 | 180.00 | 1.00x |" in md
    data = json.loads((tmp_path / "h100.json").read_text())
    assert data["gpu"] == RUN["gpu"] and list(data["runs"]) == [RUN["id"]] and len(data["rows"]) == 2


def test_a_rerun_replaces_the_rows_of_its_configurations_and_keeps_the_others(tmp_path):
    store = results.ResultsFile(tmp_path, "h100")
    store.merge(RUN, [row(64, "update", 180.0, copy="-"), row(64, "lock-step cycle", 100.0),
                      row(256, "lock-step cycle", 380.0)])
    store.write()
    later = dict(RUN, id="2026-02-03T00:00:00Z", date="2026-02-03 00:00 UTC", commit="def7654321")
    store = results.ResultsFile(tmp_path, "h100")             # read back from the JSON
    store.merge(later, [row(64, "lock-step cycle", 95.0), row(512, "lock-step cycle", 700.0),
                        results.make_row("mamba2 cycle", {"batch": 1}, None, None, 3e12, None, error="boom")])
    store.write()
    data = json.loads((tmp_path / "h100.json").read_text())
    got = [(r["config"]["batch"], r["config"]["row"], r["us"], r["run"]) for r in data["rows"]]
    assert got == [(64, "update", 180.0, RUN["id"]), (64, "lock-step cycle", 95.0, later["id"]),
                   (256, "lock-step cycle", 380.0, RUN["id"]), (512, "lock-step cycle", 700.0, later["id"])]
    md = (tmp_path / "h100.md").read_text()
    assert md.count("## mamba2 cycle") == 1 and "commit abc1234567" in md and "commit def7654321" in md
    assert "| 100.00 |" not in md and "boom" not in md
    # A run none of whose rows is left is dropped.
    store = results.ResultsFile(tmp_path, "h100")
    store.merge(dict(later, id="2026-03-01T00:00:00Z"), [row(64, "update", 181.0, copy="-"),
                                                        row(256, "lock-step cycle", 381.0)])
    assert set(store.data["runs"]) == {later["id"], "2026-03-01T00:00:00Z"}


def test_a_results_file_of_another_schema_is_not_overwritten(tmp_path):
    (tmp_path / "h100.json").write_text(json.dumps({"schema": 99, "rows": []}))
    with pytest.raises(ValueError, match="schema 99"):
        results.ResultsFile(tmp_path, "h100")


def test_run_info_names_the_versions_and_the_commit(monkeypatch):
    monkeypatch.setattr(results, "git_commit", lambda root=None: "0123456789+dirty")
    info = results.run_info("NVIDIA H200", 4.2e12, {"hold µs": "300"}, "cmd",
                            now=datetime.datetime(2026, 5, 6, 7, 8, tzinfo=datetime.timezone.utc))
    assert info["id"] == "2026-05-06T07:08:00Z" and info["date"] == "2026-05-06 07:08 UTC"
    assert info["commit"] == "0123456789+dirty" and info["torch"] and info["command"] == "cmd"
    assert "device-to-device copy 4.200 TB/s" in results.run_header(info)
    assert results.run_info("NVIDIA H200", None, commit="given")["commit"] == "given"


# ---- the runner -------------------------------------------------------------------------------------

def test_runner_baselines_speedups_and_errors():
    base = {"batch": 64, "row": "update"}

    def fail():
        raise RuntimeError("mamba2_step: no kernel for this shape\nmore detail")

    cases = [Case(base, lambda: Measurement(180e-6, 360e6), baseline=base),
             Case({"batch": 64, "row": "cycle"}, lambda: Measurement(100e-6, 240e6, {"x": 1.0}), baseline=base),
             Case({"batch": 64, "row": "broken"}, fail, baseline=base)]
    seen = []
    rows = runner.execute("t", cases, {runner.RULE: {}}, 1, 3e12, on_row=seen.append)
    assert seen == rows and len(rows) == 3
    assert rows[0]["us"] == pytest.approx(180.0) and rows[0]["speedup"] == pytest.approx(1.0)
    assert rows[1]["baseline_us"] == pytest.approx(180.0) and rows[1]["speedup"] == pytest.approx(1.8)
    assert rows[1]["copy_pct"] == pytest.approx(80.0) and rows[1]["extra"] == {"x": 1.0}
    assert rows[2]["error"] == "RuntimeError: mamba2_step: no kernel for this shape" and rows[2]["us"] is None


def test_override_sets_alternate_and_the_baseline_runs_under_the_rule(monkeypatch):
    log = []

    @contextlib.contextmanager
    def fake_overrides(**fields):
        log.append(("enter", tuple(sorted(fields.items()))))
        yield
        log.append(("exit",))

    monkeypatch.setattr(replayssm_cuda, "launch_overrides", fake_overrides, raising=False)
    times = iter([180, 170, 190, 100, 110, 90, 120, 95, 105] + [60, 61, 62, 63, 64, 65])
    base = {"row": "update"}
    cases = [Case(base, lambda: Measurement(next(times) * 1e-6), baseline=base),
             Case({"row": "cycle"}, lambda: Measurement(next(times) * 1e-6), baseline=base)]
    sets = runner.override_sets([runner.parse_override_set("step_order=0"), runner.parse_override_set("k=8")])
    rows = runner.execute("t", cases, sets, 3, None)
    got = {(r["config"]["row"], r["config"]["launch"]): r for r in rows}
    assert list(got) == [("update", "rule"), ("update", "step_order=0"), ("update", "k=8"),
                         ("cycle", "step_order=0"), ("cycle", "k=8")]
    # rounds: rule, s, k | k, s, rule | rule, s, k
    assert got[("update", "rule")]["samples_us"] == pytest.approx([180, 90, 120])
    assert got[("update", "rule")]["us"] == pytest.approx(120)
    assert got[("update", "step_order=0")]["samples_us"] == pytest.approx([170, 110, 95])
    assert got[("update", "step_order=0")]["speedup"] == pytest.approx(120 / 110)
    assert got[("update", "k=8")]["extra"]["range µs"] == "100.00-190.00"
    assert got[("cycle", "k=8")]["baseline_us"] == pytest.approx(120)
    entered = [e[1] for e in log if e[0] == "enter"]
    assert entered[:5] == [(("step_order", 0),), (("k", 8),), (("k", 8),), (("step_order", 0),), (("step_order", 0),)]


def test_override_names_are_checked_against_the_package(monkeypatch):
    runner.check_override_names({runner.RULE: {}})           # nothing named: nothing to check
    monkeypatch.delattr(replayssm_cuda, "get_launch_overrides", raising=False)
    with pytest.raises(runner.BenchError, match="needs replayssm_cuda.launch_overrides"):
        runner.check_override_names({"step_order=0": {"step_order": 0}})
    monkeypatch.setattr(replayssm_cuda, "launch_overrides", lambda **k: contextlib.nullcontext(), raising=False)
    monkeypatch.setattr(replayssm_cuda, "get_launch_overrides", lambda: {"step_order": -1, "update_stages": 0},
                        raising=False)
    runner.check_override_names({"step_order=0": {"step_order": 0}})
    with pytest.raises(runner.BenchError, match="unknown launch override step_tf32_replay; expected one of "
                                                "step_order, update_stages"):
        runner.check_override_names({"x": {"step_tf32_replay": 0}})


def test_plain_progress_is_one_line_on_a_terminal(capsys, monkeypatch):
    import builtins
    real_import = builtins.__import__

    def no_tqdm(name, *a, **k):
        if name == "tqdm":
            raise ImportError(name)
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_tqdm)
    p = runner.Progress(3, enabled=True)
    p.start("nano4b 64 update")
    p.advance()
    p.write("| a row |")
    p.close()
    out, err = capsys.readouterr()
    assert out == "| a row |\n"
    assert "\r\033[K[0/3] nano4b 64 update" in err and "\n" not in err
    quiet = runner.Progress(3, enabled=False)
    quiet.start("x")
    quiet.write("| row |")
    assert capsys.readouterr() == ("| row |\n", "")


# ---- compare ----------------------------------------------------------------------------------------

def test_compare_takes_medians_per_side(tmp_path):
    def side(name, us_update, us_cycle):
        path = tmp_path / f"{name}.json"
        results.write_json(path, RUN, [row(256, "update", us_update, copy="-"), row(256, "lock-step cycle", us_cycle)])
        return path

    base = [side("b1", 500.0, 130.0), side("b2", 502.0, 132.0)]
    new = [side("n1", 501.0, 126.0), side("n2", 503.0, 128.0), side("n3", 900.0, 127.0)]
    text = compare.compare(base, new)
    assert "## mamba2 cycle" in text
    assert "| row | copy | base µs | new µs | change | new range | files |" in text
    assert "| lock-step cycle | none | 131.00 | 127.00 | -3.1% | 126.00-128.00 | 2/3 |" in text
    assert "| update | - | 501.00 | 503.00 | +0.4% | 501.00-900.00 | 2/3 |" in text
    (tmp_path / "other.json").write_text("[]")
    with pytest.raises(ValueError, match="expected a benchmark JSON file"):
        compare.compare([tmp_path / "other.json"], new)


# ---- plots ------------------------------------------------------------------------------------------

def test_plot_series_one_line_per_configuration():
    from replayssm_cuda.bench import plot
    rows = [row(b, kind, us, 1e6, copy=copy) for b, us in ((64, 10.0), (1, 2.0))
            for kind in ("lock-step cycle", "staggered cycle") for copy in ("none", "fp8")]
    data = plot.series(rows)
    assert list(data) == ["nano4b"]
    assert set(data["nano4b"]) == {"lock-step cycle, none", "lock-step cycle, fp8", "staggered cycle, none",
                                   "staggered cycle, fp8"}
    assert [p[0] for p in data["nano4b"]["staggered cycle, fp8"]] == [1, 64]


def test_plot_without_matplotlib_says_how_to_install_it(monkeypatch, tmp_path):
    import builtins

    from replayssm_cuda.bench import plot
    real_import = builtins.__import__

    def no_matplotlib(name, *a, **k):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(RuntimeError, match=r'pip install "replayssm-cuda\[bench\]"'):
        plot.plot([row(1, "update", 1.0)], tmp_path / "p.png", "t")


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    from replayssm_cuda.bench import plot
    rows = [row(b, "lock-step cycle", us, 1e6 * b) for b, us in ((1, 5.0), (64, 60.0), (256, 200.0))]
    path = plot.plot(rows, tmp_path / "cycle.png", "mamba2 cycle")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---- a whole command, the GPU faked -----------------------------------------------------------------

def test_a_command_prints_the_table_and_writes_the_results_file(monkeypatch, tmp_path, capsys):
    import torch

    calls = iter(range(100))
    fake = Bench("fake", "a fake benchmark", "µs per fake step.\n\nMore.",
                 plan=lambda args, dims: ([Case({"batch": b, "row": r}, lambda: Measurement((next(calls) + 1) * 1e-6, 3e6),
                                                baseline={"batch": b, "row": "base"}, meta={})
                                           for b in args.mib for r in ("base", "other")], ["a note"]),
                 add_arguments=lambda p: p.add_argument("--mib", nargs="+", type=int), options=())
    monkeypatch.setattr(cli, "COPY", fake)
    monkeypatch.setattr(cli, "require_gpu", lambda table, needs: None)
    monkeypatch.setattr(timing, "measure_copy_bandwidth", lambda: 3e12)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(results, "git_commit", lambda root=None: "0123456789")
    monkeypatch.setattr(timing, "HOLD_US", timing.HOLD_US)
    monkeypatch.setattr(timing, "REPLAYS", timing.REPLAYS)
    monkeypatch.setattr(timing, "KERNEL_TIMES", timing.KERNEL_TIMES)
    argv = ["copy", "--mib", "1", "2", "--results-dir", str(tmp_path), "--json", str(tmp_path / "run.json")]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("# bench fake on NVIDIA H100 80GB HBM3: ")
    assert "# µs per fake step." in out and "# a note" in out
    assert "| 2 | other | 4.00 | 750 | 25.0 | 3.00 | 0.75x |" in out
    assert "h100.md" in out
    assert json.loads((tmp_path / "run.json").read_text())["runs"].popitem()[1]["command"] == (
        "python -m replayssm_cuda bench copy --mib 1 2 --results-dir " + str(tmp_path) + " --json "
        + str(tmp_path / "run.json"))
    data = json.loads((tmp_path / "h100.json").read_text())
    assert len(data["rows"]) == 4 and data["tables"] == {"fake": "µs per fake step."}
    assert json.loads((tmp_path / "run.json").read_text())["rows"][3]["us"] == pytest.approx(4.0)
    # The same command again replaces the four rows.
    assert cli.main(argv) == 0
    data = json.loads((tmp_path / "h100.json").read_text())
    assert len(data["rows"]) == 4 and data["rows"][0]["us"] == pytest.approx(5.0)


def test_launch_variables_in_the_environment_are_reported(monkeypatch):
    monkeypatch.delattr(replayssm_cuda, "get_launch_overrides", raising=False)
    monkeypatch.setenv("REPLAYSSM_STEP_ORDER", "0")
    monkeypatch.setenv("REPLAYSSM_TEST_TIMEOUT", "300")
    assert runner.environment_overrides() == {"REPLAYSSM_STEP_ORDER": "0"}
