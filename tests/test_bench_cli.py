"""`python -m replayssm_cuda bench`: argument parsing, dims (NAME, NAME@tpK, explicit), override sets, the
plan a command makes (--dry-run), and a clear refusal without a GPU (CPU only)."""

import subprocess
import sys

import pytest

from replayssm_cuda.bench import cli, mamba2
from replayssm_cuda.bench.runner import RULE, override_sets, parse_override_set, planned_rows


def parse(*argv):
    return cli.build_parser().parse_args(list(argv))


def plan(*argv):
    args = parse(*argv)
    family, bench, table, dims = cli.resolve(args)
    cases, notes = bench.plan(args, dims)
    return args, table, cases, notes


# ---- dims -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, values", [
    ("nano4b", (96, 80, 128, 8)),
    ("super120b", (128, 64, 128, 8)),
    ("super120b@tp4", (32, 64, 128, 2)),
    ("super120b@tp8", (16, 64, 128, 1)),
    ("nano4b@tp2", (48, 80, 128, 4)),
    ("nano4b@tp4", (24, 80, 128, 2)),
    ("nano4b@TP8", (12, 80, 128, 1)),
    ("H=32,P=64,N=128,G=2", (32, 64, 128, 2)),
])
def test_dims(text, values):
    d = mamba2.DIMS_TABLE.parse(text)
    assert tuple(d.values.values()) == values
    assert (d.H, d.P, d.N, d.G) == values
    assert d.label == (text if "=" in text else text.replace("TP", "tp"))


@pytest.mark.parametrize("text, message", [
    ("nano4b@tp16", "tensor parallelism 16 must divide H=96 and G=8; it does not divide G=8"),
    ("super120b@tp3", "it does not divide H=128, G=8"),
    ("nano4b@tp0", "must be >= 1"),
    ("mamba7b", "unknown dims 'mamba7b'; expected one of nano4b, super120b"),
    ("H=32,P=64,N=128", "missing G"),
    ("H=32,P=64,N=128,G=3", "G=3 must divide H=32"),
    ("H=32,P=64,N=x,G=2", "got the part 'N=x'"),
    ("H=32,P=64,N=128,G=2,H=16", "H is given twice"),
])
def test_bad_dims_say_what_was_expected(text, message):
    with pytest.raises(ValueError, match="--dims") as err:
        mamba2.DIMS_TABLE.parse(text)
    assert message in str(err.value)


def test_bad_dims_on_the_command_line_name_the_argument(capsys):
    with pytest.raises(SystemExit):
        parse("mamba2", "cycle", "--dims", "super120b@tp3")
    assert "argument --dims: super120b@tp3: tensor parallelism 3" in capsys.readouterr().err


# ---- override sets ----------------------------------------------------------------------------------

def test_override_sets():
    assert parse_override_set("rule") == (RULE, {})
    assert parse_override_set("step_heads_per_cta=8,step_order=0") == (
        "step_heads_per_cta=8,step_order=0", {"step_heads_per_cta": 8, "step_order": 0})
    assert parse_override_set("REPLAYSSM_STEP_FOLD_SPLIT=-1") == ("step_fold_split=-1", {"step_fold_split": -1})
    for bad in ("step_order", "step_order=on", "=3", "step_order=1,step_order=0", ""):
        with pytest.raises(ValueError, match="--override"):
            parse_override_set(bad)
    assert override_sets(None) == {RULE: {}}
    with pytest.raises(ValueError, match="given twice"):
        override_sets([parse_override_set("rule"), parse_override_set("rule")])


def test_every_case_runs_under_every_set_and_the_baseline_under_the_rule_too():
    args, _, cases, _ = plan("mamba2", "cycle", "--dims", "nano4b", "--batches", "64", "--copies", "fp8",
                             "--rows", "staggered", "--override", "step_heads_per_cta=8", "--override", "step_order=0")
    rows = planned_rows(cases, override_sets(args.override))
    assert [(r["row"], r["launch"]) for r in rows] == [
        ("update", RULE), ("update", "step_heads_per_cta=8"), ("update", "step_order=0"),
        ("staggered cycle", "step_heads_per_cta=8"), ("staggered cycle", "step_order=0")]


# ---- plans ------------------------------------------------------------------------------------------

def test_the_default_cycle_set_has_the_sharded_dims_and_the_staggered_rows():
    args, table, cases, notes = plan("mamba2", "cycle")
    assert table == "mamba2 cycle"
    labels = list(dict.fromkeys(c.config["dims"] for c in cases))
    assert labels == ["nano4b", "nano4b@tp2", "nano4b@tp4", "super120b", "super120b@tp4", "super120b@tp8"]
    assert args.batches == [1, 64, 256, 512] and args.copies == ["none", "bf16", "fp8"]
    kinds = {(c.config["row"], c.config["copy"]) for c in cases}
    assert kinds == {("update", "-")} | {(k, c) for k in ("lock-step cycle", "staggered cycle")
                                         for c in ("none", "bf16", "fp8")}
    assert len(cases) == 6 * 4 * 7
    update = {"dims": "nano4b", "batch": 1, "row": "update", "copy": "-", "checkpoint": "float32", "L": 16,
              "activations": "bfloat16", "rounding": "nearest"}
    assert cases[0].config == update and cases[0].baseline == update
    assert all(c.baseline["row"] == "update" and c.baseline["batch"] == c.config["batch"] for c in cases)
    assert cases[0].meta == {"dims": "H=96 P=80 N=128 G=8"}


def test_cycle_rows_and_options():
    args, _, cases, _ = plan("mamba2", "cycle", "--dims", "super120b@tp4", "--batches", "64", "64", "--copies",
                             "fp8", "--rows", "step", "fold", "lockstep-steps", "--buffer-len", "32",
                             "--checkpoint-dtype", "float32", "float16")
    assert args.batches == [64]
    rows = [(c.config["checkpoint"], c.config["row"]) for c in cases]
    assert rows == [(ck, r) for ck in ("float32", "float16")
                    for r in ("update", "step w=16", "fold step", "lock-step steps")]
    assert cases[-1].extras == ("slowest µs", "slowest/mean")


def test_copies_this_build_has_no_kernel_for_are_skipped_with_the_reason():
    _, _, cases, notes = plan("mamba2", "cycle", "--dims", "nano4b", "--batches", "1", "--checkpoint-dtype",
                              "bfloat16", "--copies", "none", "bf16", "fp8")
    assert {c.config["copy"] for c in cases} == {"-", "none", "fp8"}
    assert any("bf16 copy with a bfloat16 checkpoint skipped" in n for n in notes)


def test_spec_and_overhead_plans():
    args, table, cases, _ = plan("mamba2", "spec", "--dims", "nano4b", "--batches", "256", "--tokens", "3",
                                 "--breakdown")
    assert table == "mamba2 spec"
    assert [(c.config["row"], c.config["copy"]) for c in cases] == [
        ("snapshots (conventional)", "-"), ("verify + commit", "none"), ("verify + commit", "bf16"),
        ("verify + commit", "fp8")]
    assert cases[1].baseline == cases[0].config and cases[1].config["T"] == 3
    assert cases[1].extras == ("tokens/s", "verify µs", "verify GB/s", "commit µs")
    _, table, cases, _ = plan("mamba2", "overhead", "--copies", "none", "fp8")
    assert table == "mamba2 overhead"
    rows = [(c.config["dims"], c.config["row"], c.config["copy"]) for c in cases]
    assert rows[:7] == [("nano4b", r, "-" if r in mamba2.COPY_FREE_ROWS else "none") for r in mamba2.OVERHEAD_ROWS]
    assert ("nano4b", "Mamba2Cache.step", "fp8") in rows and ("nano4b", "torch.ops mamba2_update", "fp8") not in rows
    assert all(c.config["batch"] == 1 for c in cases)
    assert {c.baseline["row"] for c in cases} == {"torch.ops mamba2_update"}


def test_copy_plan():
    _, table, cases, _ = plan("copy", "--mib", "64", "1024")
    assert table == "copy"
    assert [(c.config["MiB"], c.config["row"]) for c in cases] == [
        (64, "copy"), (64, "read-only sum"), (1024, "copy"), (1024, "read-only sum")]


@pytest.mark.parametrize("argv, message", [
    (("mamba2", "cycle", "--stochastic-rounding"), "--stochastic-rounding needs --checkpoint-dtype bfloat16"),
    (("mamba2", "spec", "--tokens", "20"), "--tokens must be in [1, min(16, --buffer-len=16)], got 20"),
    (("mamba2", "spec", "--tokens", "8", "--buffer-len", "4"), "--buffer-len=4"),
    (("mamba2", "cycle", "--dims", "nano4b", "nano4b"), "--dims: nano4b given twice"),
])
def test_cross_option_checks_name_the_option(argv, message):
    with pytest.raises(ValueError) as err:
        cli.resolve(parse(*argv))
    assert message in str(err.value)


@pytest.mark.parametrize("argv", [
    ("mamba2", "cycle", "--copies", "fp4"),
    ("mamba2", "cycle", "--batches", "0"),
    ("mamba2", "cycle", "--hold-us", "-5"),
    ("mamba2", "cycle", "--rows", "everything"),
    ("mamba2", "nothing"),
    ("rwkv7", "cycle"),
])
def test_bad_arguments_are_rejected(argv):
    with pytest.raises(SystemExit):
        parse(*argv)


# ---- the command ------------------------------------------------------------------------------------

def run(*args):
    return subprocess.run([sys.executable, "-m", "replayssm_cuda", "bench", *args], capture_output=True, text=True,
                          timeout=300)


def test_dry_run_lists_the_rows_without_a_gpu():
    result = run("mamba2", "cycle", "--dims", "super120b@tp4", "--batches", "1", "64", "--dry-run")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "# bench mamba2 cycle: 14 rows" in out
    assert "super120b@tp4: H=32 P=64 N=128 G=2" in out
    assert "| batch | row | copy |" in out and "| 64 | staggered cycle | fp8 |" in out


def test_without_a_gpu_the_benchmark_says_so(tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    result = run("mamba2", "cycle", "--dims", "nano4b", "--batches", "1", "--results-dir", str(tmp_path))
    assert result.returncode == 2
    assert "bench mamba2 cycle needs a CUDA GPU" in result.stderr and "--dry-run" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_package_module_runs_the_same_command():
    result = subprocess.run([sys.executable, "-m", "replayssm_cuda.bench", "copy", "--dry-run"], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "| 1024 | read-only sum |" in result.stdout


def test_help_lists_the_benchmarks():
    result = run("--help")
    assert result.returncode == 0
    for name in ("mamba2", "gdn", "copy", "compare"):
        assert name in result.stdout
    result = run("mamba2", "cycle", "--help")
    assert "Byte models" in result.stdout and "--override" in result.stdout
