"""The KDA benchmark (replayssm_cuda.bench.kda: bench/gdn.py's set-ups with family "kda") on the CPU: its byte
models against numbers worked out by hand for kimi48b (H = HV = 32, K = V = 128), batch 2, bf16 activations,
L = 16 (the log decays per key channel: K fp32 a v-head in every entry); its dims; the plans (--dry-run) and
the buffer length KDA's float32 fold refuses; the set-ups run on the checked reference (the kda ops' own
shape checks); a clear refusal without a GPU."""

import subprocess
import sys

import pytest
import torch

from replayssm_cuda.bench import cli, gdn, kda
from replayssm_cuda.bench.gdn import Setup

STATE = 32 * 128 * 128                               # elements of one row's state: 524,288
# A token of 2 rows: q, k (32 heads x 128, bf16), v and out (32 v-heads x 128, bf16), a (32 x 128 bf16: a gate
# input per key channel) and b (32, bf16).
IO = 2 * (2 * 32 * 128 * 2 + 32 * (2 * 128 * 2 + 128 * 2 + 2))   # 82,048
# What a replay reads of one window entry of 2 rows: u (32 x 128 fp32), g (32 x 128 fp32), keys (32 x 128 bf16).
WINDOW = 2 * (32 * (4 * 128 + 4 * 128) + 32 * 128 * 2)           # 81,920
# One appended entry of 2 rows: u (fp32), v (bf16), g (128 fp32) and beta (fp32) of 32 v-heads, 32 keys (bf16).
ENTRY = 2 * (32 * (4 * 128 + 2 * 128 + 4 * 128 + 4) + 32 * 128 * 2)   # 98,560
SCALES = 2 * 32 * 128 * 4                            # fp8 scales of 2 rows: one fp32 per (v-head, value row)


@pytest.fixture
def s():
    return Setup(32, 32, 128, 128, batch=2, L=16, act=torch.bfloat16, family="kda")


def test_the_parts(s):
    assert s.gate == (128,) and s.gate_channels == 128
    assert s.state_elems == STATE
    assert s.io_bytes() == IO == 82_048
    assert s.window_bytes(1) == WINDOW == 81_920 and s.window_bytes(3) == 3 * WINDOW
    assert s.entry_bytes() == ENTRY == 98_560


def test_the_gdn_setup_is_unchanged_by_the_family_field():
    g = Setup(32, 32, 128, 128, batch=2, L=16, act=torch.bfloat16)
    assert g.family == "gdn" and g.gate == () and g.gate_channels == 1
    assert g.io_bytes() == 2 * (2 * 32 * 128 * 2 + 32 * (2 * 128 * 2 + 2 * 2))
    assert g.entry_bytes() == 2 * (32 * (4 * 128 + 2 * 128 + 8) + 32 * 128 * 2)


def test_a_family_without_ops_is_refused():
    with pytest.raises(ValueError, match="family must be one of gdn, kda, got 'mamba2'"):
        Setup(1, 2, 64, 64, batch=1, family="mamba2")


def test_conventional_and_replay_steps(s):
    assert gdn.update_bytes(s, 4) == 2 * 2 * STATE * 4 + IO
    # w = 3, no copy: the fp32 checkpoint tile, 3 window entries (with their 128 decays), one entry appended
    assert gdn.step_bytes(s, 3, 4) == 2 * STATE * 4 + 3 * WINDOW + ENTRY + IO == 4_620_672
    assert gdn.step_bytes(s, 3, 4, 1, fp8=True) == 2 * STATE + SCALES + 3 * WINDOW + ENTRY + IO
    assert gdn.step_bytes(s, 0, 4, 2) == 2 * STATE * 2 + ENTRY + IO


def test_fold_step_per_the_kernel(s):
    # No copy: the checkpoint tile read once and written; 15 entries with their stored u (fp32), 128 decays,
    # beta and the key.
    fold_entry = 2 * (32 * (4 * 128 + 4 * 128 + 4) + 32 * 128 * 2)
    assert fold_entry == 82_176
    assert gdn.step_bytes(s, 15, 4) == 2 * STATE * 8 + 15 * fold_entry + IO == 9_703_296
    # fp8 copy: the copy tile read (not used), the checkpoint read and written, the copy and its scales written;
    # the entries bring their values (bf16) instead of u.
    fold_entry = 2 * (32 * (2 * 128 + 4 * 128 + 4) + 32 * 128 * 2)
    assert gdn.step_bytes(s, 15, 4, 1, fp8=True) == 2 * STATE * 10 + SCALES + 15 * fold_entry + IO


def test_a_cycle_and_the_speculative_models(s):
    replays = sum(2 * STATE * 4 + w * WINDOW + ENTRY + IO for w in range(15))
    assert gdn.cycle_bytes(s, 4) == pytest.approx((replays + 9_703_296) / 16)
    spec = Setup(32, 32, 128, 128, batch=2, L=16, act=torch.bfloat16, T=4, family="kda")
    assert gdn.snapshot_bytes(spec) == 2 * 5 * STATE * 4 + 4 * IO
    assert gdn.verify_bytes(spec, 3, 4) == 2 * STATE * 4 + 3 * WINDOW + 4 * ENTRY + 4 * IO


# ---- dims -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, values", [
    ("kimi48b", (32, 32, 128, 128)),
    ("kimi48b@tp4", (8, 8, 128, 128)),
    ("kimi48b@tp8", (4, 4, 128, 128)),
    ("H=16,HV=32,K=64,V=64", (16, 32, 64, 64)),
])
def test_dims(text, values):
    d = kda.DIMS_TABLE.parse(text)
    assert (d.H, d.HV, d.K, d.V) == values and d.label == text


def test_bad_dims_say_what_was_expected():
    with pytest.raises(ValueError, match="unknown dims 'qwen4b'; expected one of kimi48b"):
        kda.DIMS_TABLE.parse("qwen4b")
    with pytest.raises(ValueError, match="H=3 must divide HV=16"):
        kda.DIMS_TABLE.parse("H=3,HV=16,K=128,V=128")


# ---- plans ------------------------------------------------------------------------------------------

def plan(*argv):
    args = cli.build_parser().parse_args(list(argv))
    family, bench, table, dims = cli.resolve(args)
    cases, notes = bench.plan(args, dims)
    return args, table, cases, notes


def test_the_default_cycle_set():
    args, table, cases, notes = plan("kda", "cycle")
    assert table == "kda cycle"
    assert list(dict.fromkeys(c.config["dims"] for c in cases)) == ["kimi48b", "kimi48b@tp4"]
    assert args.batches == [1, 8, 64, 256, 512] and args.copies == ["none", "bf16", "fp8"]
    kinds = {(c.config["row"], c.config["copy"]) for c in cases}
    assert kinds == {("update", "-")} | {(k, c) for k in ("lock-step cycle", "staggered cycle")
                                         for c in ("none", "bf16", "fp8")}
    assert len(cases) == 2 * 5 * 7 and notes == []
    assert cases[0].meta == {"dims": "H=32 HV=32 K=128 V=128"}
    # Every measurement runs the kda ops.
    assert all(c.measure.args[0].family == "kda" for c in cases)


def test_the_cycle_rows_have_no_fla():
    _, _, cases, _ = plan("kda", "cycle", "--dims", "kimi48b@tp4", "--batches", "64", "--copies", "fp8", "--rows",
                          "step", "fold", "staggered-steps", "--buffer-len", "8")
    assert [c.config["row"] for c in cases] == ["update", "step w=4", "fold step", "staggered steps"]
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["kda", "cycle", "--rows", "fla"])


def test_a_buffer_length_kdas_float32_fold_refuses_is_noted_not_timed():
    # KDA's fold holds the window's (L, K) log decays beside a float32 128 x 128 tile: L <= 63 (ops.py). The
    # replay rows would go to the reference: they are noted and left out; the update and a bf16 checkpoint stay.
    _, _, cases, notes = plan("kda", "cycle", "--dims", "kimi48b", "--batches", "1", "--buffer-len", "64",
                              "--copies", "none", "fp8", "--checkpoint-dtype", "float32", "bfloat16")
    assert [(c.config["checkpoint"], c.config["row"], c.config["copy"]) for c in cases] == [
        ("float32", "update", "-"), ("bfloat16", "update", "-"), ("bfloat16", "lock-step cycle", "none"),
        ("bfloat16", "staggered cycle", "none"), ("bfloat16", "lock-step cycle", "fp8"),
        ("bfloat16", "staggered cycle", "fp8")]
    assert any(n.startswith("none copy with a float32 checkpoint skipped at kimi48b: KDA's fold") and
               "buffer_len must be <= 63, got 64" in n for n in notes)
    _, _, cases, notes = plan("kda", "spec", "--dims", "kimi48b", "--batches", "1", "--buffer-len", "64")
    assert [c.config["row"] for c in cases] == ["snapshots (conventional)"]
    assert any("buffer_len must be <= 63" in n for n in notes)
    # GDN has no such limit at L = 64.
    _, _, cases, _ = plan("gdn", "cycle", "--dims", "qwen4b", "--batches", "1", "--buffer-len", "64", "--copies",
                          "none", "--rows", "lockstep")
    assert [c.config["row"] for c in cases] == ["update", "lock-step cycle"]


def test_a_buffer_longer_than_the_kernels_take_is_noted():
    _, _, cases, notes = plan("kda", "cycle", "--dims", "kimi48b", "--batches", "1", "--buffer-len", "65",
                              "--checkpoint-dtype", "bfloat16", "--copies", "none")
    assert [c.config["row"] for c in cases] == ["update"]
    assert any("buffer_len = 65 exceeds the compiled kernels' 64" in n for n in notes)


def test_spec_plan():
    args, table, cases, _ = plan("kda", "spec", "--dims", "kimi48b", "--batches", "256", "--breakdown")
    assert table == "kda spec"
    assert [(c.config["row"], c.config["copy"]) for c in cases] == [
        ("snapshots (conventional)", "-"), ("verify + commit", "none"), ("verify + commit", "bf16"),
        ("verify + commit", "fp8")]
    assert cases[1].baseline == cases[0].config and cases[1].config["T"] == 4
    assert all(c.measure.args[0].family == "kda" for c in cases)


# ---- the command ------------------------------------------------------------------------------------

def run(*args):
    return subprocess.run([sys.executable, "-m", "replayssm_cuda", "bench", *args], capture_output=True, text=True,
                          timeout=300)


def test_dry_run_and_help():
    result = run("kda", "cycle", "--dims", "kimi48b@tp4", "--batches", "1", "512", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "# bench kda cycle: 14 rows" in result.stdout
    assert "kimi48b@tp4: H=8 HV=8 K=128 V=128" in result.stdout
    assert "| 512 | staggered cycle | fp8 |" in result.stdout
    result = run("kda", "cycle", "--help")
    assert result.returncode == 0
    assert "Byte models" in result.stdout and "kda_step" in result.stdout and "4 c" in result.stdout
    result = run("--help")
    assert result.returncode == 0 and "bench kda cycle" in result.stdout


@pytest.mark.parametrize("what", ["cycle", "spec"])
def test_without_a_gpu_the_benchmark_says_so(tmp_path, what):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    result = run("kda", what, "--dims", "kimi48b", "--batches", "1", "--results-dir", str(tmp_path))
    assert result.returncode == 2
    assert f"bench kda {what} needs a CUDA GPU" in result.stderr
    assert list(tmp_path.iterdir()) == []


# ---- the set-ups, on the checked reference ----------------------------------------------------------

@pytest.fixture
def on_cpu(monkeypatch):
    """Run the set-ups on the CPU: torch.ops.replayssm.kda_* are the checked reference there (the ops' own
    argument checks, the gate shapes included), two slot groups, every timed graph one eager pass."""
    from replayssm_cuda import ops
    monkeypatch.setattr(gdn, "DEVICE", "cpu")
    monkeypatch.setattr(gdn.timing, "cold_groups", lambda batch, nbytes: 2)

    def timed(record, per_graph, before_replay=None):
        if before_replay is not None:
            before_replay()
        record()
        return 1e-3, None

    def time_graph(record, replays=None, before_replay=None, hold_us=None):
        return timed(record, 1, before_replay)[0]

    monkeypatch.setattr(gdn.timing, "timed", timed)
    monkeypatch.setattr(gdn.timing, "time_graph", time_graph)
    for name in ("make_read_copy", "stagger_cursors"):
        fn = getattr(ops, name)
        monkeypatch.setattr(ops, name, lambda *a, _fn=fn, **kw: _fn(*a, **dict(kw, backend="reference")))


SMALL = dict(H=1, HV=2, K=64, V=64, batch=3, L=4, family="kda")


@pytest.mark.parametrize("copy", [None, torch.bfloat16, torch.float8_e4m3fn])
def test_the_cycle_set_ups_call_the_kda_ops(on_cpu, copy):
    s = Setup(**SMALL)
    r_bytes = None if copy is None else gdn.dtype_bytes(copy)
    fp8 = copy == torch.float8_e4m3fn
    assert gdn.measure_update(s).nbytes == gdn.update_bytes(s, 4)
    for staggered in (False, True):
        assert gdn.measure_cycle(s, copy, staggered=staggered).nbytes == gdn.cycle_bytes(s, 4, r_bytes, fp8)
    assert gdn.measure_phase(s, copy, s.L - 1).nbytes == gdn.step_bytes(s, s.L - 1, 4, r_bytes, fp8)
    assert gdn.measure_cycle_steps(s, copy, staggered=True).extra["slowest/mean"] == pytest.approx(1.0)


def test_the_pool_has_kda_shapes(on_cpu):
    pool = gdn.ReplayPool(Setup(**SMALL), torch.bfloat16, staggered_flush=True)
    assert pool.g_buf.shape == (6, 2, 4, 64) and pool.beta_buf.shape == (6, 2, 4)
    assert pool.A_log.shape == (2,) and pool.dt_bias.shape == (2, 64)
    (q, k, v, a, b), = gdn.make_inputs(pool.s, 1)
    assert a.shape == (3, 2, 64) and b.shape == (3, 2)


def test_the_spec_set_ups_call_the_kda_ops(on_cpu):
    s = Setup(**SMALL, T=2)
    assert gdn.measure_snapshots(s).nbytes == gdn.snapshot_bytes(s)
    for copy in (None, torch.float8_e4m3fn):
        m = gdn.measure_verify_commit(s, copy, breakdown=True)
        assert m.nbytes is None and {"tokens/s", "verify µs", "verify GB/s", "commit µs"} <= set(m.extra)


def test_the_set_ups_with_gdn_shapes_fail_the_kda_checks(on_cpu, monkeypatch):
    # The reference checks the per-channel gate: a GDN-shaped g_buf in a KDA pool is refused, so the KDA
    # set-ups above do pass KDA's shapes.
    s = Setup(**SMALL)
    pool = gdn.ReplayPool(s, None)
    pool.g_buf = pool.g_buf[..., 0].contiguous()
    out = torch.empty(s.batch, s.HV, s.V, dtype=s.act)
    with pytest.raises(Exception, match="g_buf"):
        pool.record_steps(gdn.make_inputs(s, 1), out)
