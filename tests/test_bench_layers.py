"""`bench mamba2 layers` / `bench gdn layers` (replayssm_cuda.bench.layers) on the CPU: the plans (--dry-run),
the argument checks, the byte model against numbers worked out by hand, and --kernel-times reaching the
measurement (a stand-in model and timing, so nothing runs on a GPU)."""

import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from replayssm_cuda import DeltaRuleWeights, GDNCache, Mamba2Cache, Mamba2Weights
from replayssm_cuda.bench import cli, layers, timing


def plan(*argv):
    args = cli.build_parser().parse_args(list(argv))
    family, bench, table, dims = cli.resolve(args)
    cases, notes = bench.plan(args, dims)
    return args, table, cases, notes


@pytest.mark.parametrize("family, dims", [("mamba2", "super120b@tp4"), ("gdn", "qwen122b@tp4")])
def test_the_default_plan(family, dims):
    args, table, cases, notes = plan(family, "layers")
    assert table == f"{family} layers" and notes == []
    assert (args.layers, args.slots, args.tokens, args.batches, args.copies) == (40, 512, 4, [8, 64, 256], ["bf16"])
    # every op at every batch, the per-layer loop first (the baseline) then LayerCaches' one launch
    assert len(cases) == 3 * len(layers.OPS) * 2
    assert [(c.config["op"], c.config["path"]) for c in cases[:4]] == [
        ("reset", "loop"), ("reset", "one launch"), ("copy_slots", "loop"), ("copy_slots", "one launch")]
    for c in cases:
        assert c.config["dims"] == dims and c.config["layers"] == 40 and c.config["L"] == 16
        assert c.baseline == dict(c.config, path="loop") and not c.overridable


def test_batches_over_the_slots_are_noted_and_options_reach_the_rows():
    _, _, cases, notes = plan("gdn", "layers", "--batches", "8", "64", "--slots", "32", "--layers", "3",
                              "--ops", "commit", "materialize", "--tokens", "2", "--buffer-len", "8", "--copies",
                              "none", "fp8")
    assert notes == ["batch 64 skipped: more than --slots 32"] * 2
    assert [(c.config["copy"], c.config["op"], c.config["path"]) for c in cases] == [
        (copy, op, path) for copy in ("none", "fp8") for op in ("commit", "materialize")
        for path in ("loop", "one launch")]
    assert {(c.config["batch"], c.config["layers"], c.config["T"], c.config["L"]) for c in cases} == {(8, 3, 2, 8)}


@pytest.mark.parametrize("argv, message", [
    (("--layers", "0"), "--layers and --slots must be >= 1, got 0 and 512"),
    (("--slots", "0"), "--layers and --slots must be >= 1, got 40 and 0"),
    (("--tokens", "8", "--buffer-len", "4"), "--tokens must be in [1, min(16, --buffer-len=4)], got 8"),
])
def test_bad_options_name_the_option(argv, message):
    with pytest.raises(ValueError) as err:
        cli.resolve(cli.build_parser().parse_args(["mamba2", "layers", *argv]))
    assert message in str(err.value)


def test_an_unknown_op_is_rejected():
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["gdn", "layers", "--ops", "step"])


def test_dry_run_lists_the_rows_without_a_gpu():
    result = subprocess.run([sys.executable, "-m", "replayssm_cuda", "bench", "gdn", "layers", "--batches", "8",
                             "--ops", "flush", "--kernel-times", "--dry-run"], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert "# bench gdn layers: 2 rows; all rows: dims qwen122b@tp4, layers 40, batch 8" in result.stdout
    assert "op flush" in result.stdout and "| loop |\n| one launch |" in result.stdout


# ---- the byte model ---------------------------------------------------------------------------------

def mamba2_caches(n):
    # H=2 P=4 N=8 G=1, L=3, fp32 checkpoint with a bf16 copy, bf16 activations
    return [Mamba2Cache(5, 2, 4, 8, 1, Mamba2Weights(A=-torch.ones(2)), buffer_len=3, max_draft_tokens=2,
                        read_copy_dtype=torch.bfloat16, device="cpu", backend="reference") for _ in range(n)]


def gdn_caches(n):
    # H=1 HV=2 K=8 V=4, L=3, fp32 checkpoint, no copy, bf16 activations
    w = DeltaRuleWeights(A_log=torch.zeros(2), dt_bias=torch.zeros(2))
    return [GDNCache(5, 1, 2, 8, 4, w, buffer_len=3, max_draft_tokens=2, device="cpu", backend="reference")
            for _ in range(n)]


# One slot: checkpoint, read copy, x_buf (2 x 3 x 4 bf16), B_buf (1 x 3 x 8 bf16), dt_buf (2 x 3 fp32), the
# two int32 cursors.
MAMBA2_SLOT = 2 * 4 * 8 * 4 + 2 * 4 * 8 * 2 + 2 * 3 * 4 * 2 + 3 * 8 * 2 + 2 * 3 * 4 + 2 * 4       # 552
# One slot: checkpoint (2 x 4 x 8 fp32), k_buf (3 x 8 bf16), v_buf (2 x 3 x 4 bf16), g_buf and beta_buf
# (2 x 3 fp32 each), u_buf (2 x 3 x 4 fp32), the two cursors.
GDN_SLOT = 2 * 4 * 8 * 4 + 3 * 8 * 2 + 2 * 3 * 4 * 2 + 2 * 2 * 3 * 4 + 2 * 3 * 4 * 4 + 2 * 4      # 520


@pytest.mark.parametrize("make, slot, state", [(mamba2_caches, MAMBA2_SLOT, 2 * 4 * 8),
                                               (gdn_caches, GDN_SLOT, 2 * 4 * 8)])
def test_the_byte_model(make, slot, state):
    caches = make(3)
    assert sum(caches[0].bytes_per_slot()[k] for k in caches[0].bytes_per_slot() if k != "total") == slot
    assert layers.op_bytes("reset", caches, 2) == 2 * 3 * slot                 # the rows' slots written
    assert layers.op_bytes("copy_slots", caches, 2) == 2 * 2 * 3 * slot        # read and written
    assert layers.op_bytes("materialize", caches, 2) == 2 * 3 * state * (4 + 4)  # fp32 rows read, fp32 written
    assert layers.op_bytes("commit", caches, 2) is None and layers.op_bytes("flush", caches, 2) is None


# ---- --kernel-times ---------------------------------------------------------------------------------

def test_the_measurement_carries_the_kernel_times(monkeypatch):
    caches = gdn_caches(2)
    model = SimpleNamespace(caches=caches, layers=None, device=torch.device("cpu"), slots=5, L=3, T=2,
                            restore=lambda cursors: None)
    seen = {}

    def timed(record, per_graph, before_replay=None):
        seen["per_graph"] = per_graph
        return 4e-6, {"fold_layers_kernel": 3e-6, "(replay)": 4e-6} if timing.KERNEL_TIMES else None

    monkeypatch.setattr(timing, "timed", timed)
    monkeypatch.setattr(timing, "KERNEL_TIMES", True)
    m = layers.measure(model, "reset", "loop", 2)
    assert seen["per_graph"] == 1      # µs per call: one call per graph
    assert (m.seconds, m.nbytes, m.kernels) == (4e-6, 2 * 2 * GDN_SLOT, {"fold_layers_kernel": 3e-6, "(replay)": 4e-6})
    monkeypatch.setattr(timing, "KERNEL_TIMES", False)
    assert layers.measure(model, "commit", "one launch", 2).kernels is None
