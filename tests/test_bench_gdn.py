"""The Gated DeltaNet benchmark (replayssm_cuda.bench.gdn) on the CPU: its byte models against numbers worked
out by hand for qwen4b (H=16, HV=32, K=V=128), batch 2, bf16 activations, L = 16; its dims and their
tensor-parallel shards; the plans (--dry-run), with and without flash-linear-attention (a stand-in module
with fla's signature); a clear refusal without a GPU."""

import subprocess
import sys

import pytest
import torch

from replayssm_cuda.bench import cli, gdn
from replayssm_cuda.bench.gdn import Setup

STATE = 32 * 128 * 128                               # elements of one row's state: 524,288
# A token of 2 rows: q, k (16 heads x 128, bf16), v and out (32 v-heads x 128, bf16), a and b (32, bf16).
IO = 2 * (2 * 16 * 128 * 2 + 32 * (2 * 128 * 2 + 2 * 2))          # 49,408
# What a replay reads of one window entry of 2 rows: u (32 x 128 fp32), g (32 fp32), the keys (16 x 128 bf16).
WINDOW = 2 * (32 * (4 * 128 + 4) + 16 * 128 * 2)                  # 41,216
# One appended entry of 2 rows: u (fp32), v (bf16), g and beta (fp32) of 32 v-heads, the 16 keys (bf16).
ENTRY = 2 * (32 * (4 * 128 + 2 * 128 + 8) + 16 * 128 * 2)         # 57,856
SCALES = 2 * 32 * 128 * 4                            # fp8 scales of 2 rows: one fp32 per (v-head, value row)


@pytest.fixture
def s():
    return Setup(16, 32, 128, 128, batch=2, L=16, act=torch.bfloat16)


def test_the_parts(s):
    assert s.state_elems == STATE == 524_288
    assert s.io_bytes() == IO == 49_408
    assert s.window_bytes(1) == WINDOW == 41_216 and s.window_bytes(3) == 3 * WINDOW
    assert s.entry_bytes() == ENTRY == 57_856


def test_conventional_update_reads_and_writes_the_state(s):
    assert gdn.update_bytes(s, 4) == 2 * 2 * STATE * 4 + IO == 8_438_016
    assert gdn.update_bytes(s, 2) == 2 * 2 * STATE * 2 + IO


def test_replay_step_reads_the_tile_and_w_entries_and_appends_one(s):
    # w = 3, no copy: the fp32 checkpoint tile, 3 window entries, one entry appended
    assert gdn.step_bytes(s, 3, 4) == 2 * STATE * 4 + 3 * WINDOW + ENTRY + IO == 4_425_216
    # w = 3, fp8 copy: one byte an element and its scales
    assert gdn.step_bytes(s, 3, 4, 1, fp8=True) == 2 * STATE + SCALES + 3 * WINDOW + ENTRY + IO == 1_312_256
    # w = 0, bf16 copy: no window
    assert gdn.step_bytes(s, 0, 4, 2) == 2 * STATE * 2 + ENTRY + IO


def test_fold_step_per_the_kernel(s):
    # No copy: the checkpoint tile read once and written; 15 entries with their stored u (fp32), g, beta, key.
    fold_entry = 2 * (32 * (4 * 128 + 8) + 16 * 128 * 2)
    assert gdn.step_bytes(s, 15, 4) == 2 * STATE * 8 + 15 * fold_entry + IO == 9_060_096
    # fp8 copy: the copy tile read (and not used), the checkpoint read and written, the copy and its scales
    # written; the entries bring their values (bf16, u is recomputed) instead of u.
    fold_entry = 2 * (32 * (2 * 128 + 8) + 16 * 128 * 2)
    assert gdn.step_bytes(s, 15, 4, 1, fp8=True) == 2 * STATE * (8 + 2) + SCALES + 15 * fold_entry + IO == 10_944_256
    # a bf16 checkpoint with an fp8 copy
    assert gdn.step_bytes(s, 15, 2, 1, fp8=True) == 2 * STATE * (4 + 2) + SCALES + 15 * fold_entry + IO


def test_a_cycle_is_the_mean_of_its_steps(s):
    replays = sum(2 * STATE * 4 + w * WINDOW + ENTRY + IO for w in range(15))
    assert gdn.cycle_bytes(s, 4) == pytest.approx((replays + 9_060_096) / 16)
    assert gdn.rows_step_bytes(s, [0, 15], 4) == (gdn.step_bytes(s, 0, 4) + 9_060_096) / 2


def test_the_cycle_against_the_update_is_what_the_kernel_comment_says():
    # step_kernel.cuh: at qwen4b, fp32 checkpoint, L = 16, the cycle ~1.74x under 16 updates, bf16 copy
    # ~2.7x, fp8 copy ~4.2x (counting the state and window only; the tokens and fp8 scales take a little).
    s = Setup(16, 32, 128, 128, batch=256)
    update = gdn.update_bytes(s, 4)
    assert update / gdn.cycle_bytes(s, 4) == pytest.approx(1.74, abs=0.02)
    assert update / gdn.cycle_bytes(s, 4, 2) == pytest.approx(2.7, abs=0.05)
    assert update / gdn.cycle_bytes(s, 4, 1, fp8=True) == pytest.approx(4.1, abs=0.1)


def test_speculative_models(s):
    spec = Setup(16, 32, 128, 128, batch=2, L=16, act=torch.bfloat16, T=4)
    assert spec.io_bytes() == 4 * IO
    assert gdn.snapshot_bytes(spec) == 2 * 5 * STATE * 4 + 4 * IO == 21_169_152
    # verify at w = 3: the tile once, 3 window entries, 4 entries appended, 4 tokens
    assert gdn.verify_bytes(spec, 3, 4) == 2 * STATE * 4 + 3 * WINDOW + 4 * ENTRY + 4 * IO == 4_747_008
    assert gdn.verify_bytes(spec, 0, 1, fp8=True) == 2 * STATE + SCALES + 4 * ENTRY + 4 * IO
    assert gdn.verify_bytes(spec, 1.5, 2) == pytest.approx(2 * STATE * 2 + 1.5 * WINDOW + 4 * ENTRY + 4 * IO)
    assert spec.tokens_per_round() == 2 * 5 / 2


def test_grouped_heads_share_the_keys():
    # qwen122b@tp4: H = 4, HV = 16 (G = 4): a k-head's key is read once for its 4 v-heads.
    d = gdn.DIMS_TABLE.parse("qwen122b@tp4")
    s = Setup.of(d, 64, 16)
    assert (s.H, s.HV, s.K, s.V) == (4, 16, 128, 128)
    assert gdn.update_bytes(s, 4) == 64 * (2 * 16 * 128 * 128 * 4 + 2 * 4 * 128 * 2 + 16 * (2 * 128 * 2 + 4))
    assert s.window_bytes(1) == 64 * (16 * 516 + 4 * 128 * 2)


# ---- dims -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, values", [
    ("qwen4b", (16, 32, 128, 128)),
    ("qwen122b", (16, 64, 128, 128)),
    ("qwen122b@tp4", (4, 16, 128, 128)),
    ("qwen122b@tp8", (2, 8, 128, 128)),
    ("qwen4b@tp2", (8, 16, 128, 128)),
    ("H=16,HV=32,K=64,V=64", (16, 32, 64, 64)),
])
def test_dims(text, values):
    d = gdn.DIMS_TABLE.parse(text)
    assert (d.H, d.HV, d.K, d.V) == values
    assert d.label == text


@pytest.mark.parametrize("text, message", [
    ("qwen122b@tp32", "tensor parallelism 32 must divide H=16 and HV=64; it does not divide H=16"),
    ("qwen3", "unknown dims 'qwen3'; expected one of qwen4b, qwen122b"),
    ("H=3,HV=16,K=128,V=128", "H=3 must divide HV=16"),
    ("H=4,HV=16,K=128", "missing V"),
])
def test_bad_dims_say_what_was_expected(text, message):
    with pytest.raises(ValueError, match="--dims") as err:
        gdn.DIMS_TABLE.parse(text)
    assert message in str(err.value)


# ---- plans ------------------------------------------------------------------------------------------

def plan(*argv):
    args = cli.build_parser().parse_args(list(argv))
    family, bench, table, dims = cli.resolve(args)
    cases, notes = bench.plan(args, dims)
    return args, table, cases, notes


FLA_SOURCE = '''
__version__ = "{version}"
'''
FLA_OPS = '''
def fused_recurrent_gated_delta_rule(q, k, v, g=None, gk=None, gv=None, beta=None, scale=None, initial_state=None,
                                     output_final_state=False, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                                     A_log=None, dt_bias=None, use_beta_sigmoid_in_kernel=False,
                                     allow_neg_eigval=False, {layout}cu_seqlens=None, **kwargs):
    raise RuntimeError("a stand-in")
'''


@pytest.fixture
def fake_fla(tmp_path, monkeypatch):
    """Install a stand-in `fla` package (fla 0.6.0's signature; layout=False: without state_v_first)."""
    def install(layout=True):
        pkg = tmp_path / "fla"
        (pkg / "ops" / "gated_delta_rule").mkdir(parents=True)
        (pkg / "__init__.py").write_text(FLA_SOURCE.format(version="0.6.0"))
        (pkg / "ops" / "__init__.py").write_text("")
        (pkg / "ops" / "gated_delta_rule" / "__init__.py").write_text(
            FLA_OPS.format(layout="state_v_first=False, " if layout else ""))
        monkeypatch.syspath_prepend(str(tmp_path))
        gdn.load_fla.cache_clear()

    yield install
    for name in [m for m in sys.modules if m == "fla" or m.startswith("fla.")]:
        del sys.modules[name]
    gdn.load_fla.cache_clear()


def test_the_default_cycle_set():
    gdn.load_fla.cache_clear()
    args, table, cases, notes = plan("gdn", "cycle")
    assert table == "gdn cycle"
    assert list(dict.fromkeys(c.config["dims"] for c in cases)) == ["qwen4b", "qwen122b", "qwen122b@tp4"]
    assert args.batches == [1, 8, 64, 256, 512] and args.copies == ["none", "bf16", "fp8"]
    kinds = {(c.config["row"], c.config["copy"]) for c in cases}
    base = {("update", "-")} | {(k, c) for k in ("lock-step cycle", "staggered cycle") for c in ("none", "bf16", "fp8")}
    if isinstance(gdn.load_fla(), str):
        assert kinds == base and len(cases) == 3 * 5 * 7
        assert any(n.startswith("fla rows skipped: flash-linear-attention") for n in notes)
    update = {"dims": "qwen4b", "batch": 1, "row": "update", "copy": "-", "checkpoint": "float32", "L": 16,
              "activations": "bfloat16"}
    assert cases[0].config == update and cases[0].baseline == update
    assert all(c.baseline["row"] == "update" and c.baseline["batch"] == c.config["batch"] for c in cases)
    assert cases[0].meta == {"dims": "H=16 HV=32 K=128 V=128"}


def test_fla_rows_where_fla_imports(fake_fla):
    fake_fla()
    _, _, cases, notes = plan("gdn", "cycle", "--dims", "qwen122b@tp4", "--batches", "64", "--copies", "fp8",
                              "--checkpoint-dtype", "float32", "bfloat16")
    rows = [(c.config["checkpoint"], c.config["row"]) for c in cases]
    assert rows == [("float32", "update"), ("float32", "fla fused_recurrent [V,K]"),
                    ("float32", "fla fused_recurrent [K,V]"), ("float32", "lock-step cycle"),
                    ("float32", "staggered cycle"), ("bfloat16", "update"), ("bfloat16", "lock-step cycle"),
                    ("bfloat16", "staggered cycle")]
    fla_cases = cases[1:3]
    assert all(c.baseline == cases[0].config and not c.overridable for c in fla_cases)
    assert fla_cases[0].meta["fla"] == "0.6.0"
    assert any("flash-linear-attention 0.6.0" in n for n in notes)
    assert any("only with a float32 state" in n for n in notes)


def test_an_fla_without_a_v_first_state_gives_its_default_layout_only(fake_fla):
    fake_fla(layout=False)
    _, _, cases, notes = plan("gdn", "cycle", "--dims", "qwen4b", "--batches", "8", "--rows", "fla")
    assert [c.config["row"] for c in cases] == ["update", "fla fused_recurrent [K,V]"]
    assert any("no [V, K] state option" in n for n in notes)


def test_cycle_rows_and_options():
    args, _, cases, _ = plan("gdn", "cycle", "--dims", "H=16,HV=32,K=64,V=64", "--batches", "64", "64", "--copies",
                             "fp8", "--rows", "step", "fold", "staggered-steps", "--buffer-len", "8",
                             "--activation-dtype", "float16")
    assert args.batches == [64]
    assert [c.config["row"] for c in cases] == ["update", "step w=4", "fold step", "staggered steps"]
    assert cases[0].config["activations"] == "float16" and cases[0].config["L"] == 8
    assert cases[-1].extras == ("slowest µs", "slowest/mean")


def test_shapes_this_build_has_no_kernel_for_are_skipped_with_the_reason():
    _, _, cases, notes = plan("gdn", "cycle", "--dims", "H=2,HV=4,K=96,V=96", "qwen4b", "--batches", "1",
                              "--copies", "none", "--rows", "lockstep")
    assert {c.config["dims"] for c in cases} == {"qwen4b"}
    assert any(n.startswith("H=2,HV=4,K=96,V=96 with a float32 state skipped: (head_v_dim, head_k_dim) = (96, 96)")
               for n in notes)
    _, _, cases, notes = plan("gdn", "cycle", "--dims", "qwen4b", "--batches", "1", "--checkpoint-dtype", "bfloat16",
                              "--copies", "bf16", "fp8", "--rows", "lockstep")
    assert [c.config["copy"] for c in cases] == ["-", "fp8"]
    assert any("bf16 copy with a bfloat16 checkpoint skipped at qwen4b" in n for n in notes)


def test_spec_plan():
    args, table, cases, _ = plan("gdn", "spec", "--dims", "qwen4b", "--batches", "256", "512", "--breakdown")
    assert table == "gdn spec"
    assert [(c.config["batch"], c.config["row"], c.config["copy"]) for c in cases] == [
        (b, r, c) for b in (256, 512) for r, c in [("snapshots (conventional)", "-"), ("verify + commit", "none"),
                                                   ("verify + commit", "bf16"), ("verify + commit", "fp8")]]
    assert cases[1].baseline == cases[0].config and cases[1].config["T"] == 4
    assert cases[1].extras == ("tokens/s", "verify µs", "verify GB/s", "commit µs")


@pytest.mark.parametrize("argv, message", [
    (("gdn", "spec", "--tokens", "17"), "--tokens must be in [1, min(16, --buffer-len=16)], got 17"),
    (("gdn", "spec", "--tokens", "8", "--buffer-len", "4"), "--buffer-len=4"),
    (("gdn", "cycle", "--dims", "qwen4b", "qwen4b"), "--dims: qwen4b given twice"),
])
def test_cross_option_checks_name_the_option(argv, message):
    with pytest.raises(ValueError) as err:
        cli.resolve(cli.build_parser().parse_args(list(argv)))
    assert message in str(err.value)


@pytest.mark.parametrize("argv", [
    ("gdn", "cycle", "--rows", "everything"),
    ("gdn", "cycle", "--stochastic-rounding"),
    ("gdn", "overhead"),
    ("gdn", "cycle", "--dims", "qwen122b@tp3"),
])
def test_bad_arguments_are_rejected(argv):
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(list(argv))


def test_fla_measurement_without_fla_says_why(monkeypatch):
    monkeypatch.setattr(gdn, "load_fla", lambda: "ModuleNotFoundError: No module named 'fla'")
    with pytest.raises(RuntimeError, match="flash-linear-attention is not usable here: ModuleNotFoundError"):
        gdn.measure_fla(Setup(16, 32, 128, 128, batch=1), True)


# ---- the command ------------------------------------------------------------------------------------

def run(*args):
    return subprocess.run([sys.executable, "-m", "replayssm_cuda", "bench", *args], capture_output=True, text=True,
                          timeout=300)


def test_dry_run_lists_the_rows_without_a_gpu():
    result = run("gdn", "cycle", "--dims", "qwen122b@tp4", "--batches", "1", "512", "--rows", "lockstep", "staggered",
                 "--dry-run")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "# bench gdn cycle: 14 rows" in out
    assert "qwen122b@tp4: H=4 HV=16 K=128 V=128" in out
    assert "| batch | row | copy |" in out and "| 512 | staggered cycle | fp8 |" in out
    result = run("gdn", "spec", "--dims", "qwen4b", "--batches", "256", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "# bench gdn spec: 4 rows" in result.stdout and "| verify + commit | bf16 |" in result.stdout


@pytest.mark.parametrize("what", ["cycle", "spec"])
def test_without_a_gpu_the_benchmark_says_so(tmp_path, what):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    result = run("gdn", what, "--dims", "qwen4b", "--batches", "1", "--results-dir", str(tmp_path))
    assert result.returncode == 2
    assert f"bench gdn {what} needs a CUDA GPU" in result.stderr and "--dry-run" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_help_states_the_byte_models():
    result = run("gdn", "cycle", "--help")
    assert result.returncode == 0
    assert "Byte models" in result.stdout and "fold step" in result.stdout and "--override" in result.stdout


# ---- the set-ups, on the checked reference ----------------------------------------------------------

@pytest.fixture
def on_cpu(monkeypatch):
    """Run the set-ups on the CPU: torch.ops.replayssm.* are the checked reference there (the ops' own
    argument checks), two slot groups, and every timed graph replaced by one eager pass."""
    from replayssm_cuda import ops
    monkeypatch.setattr(gdn, "DEVICE", "cpu")
    monkeypatch.setattr(gdn.timing, "cold_groups", lambda batch, nbytes: 2)
    calls = []

    def timed(record, per_graph, before_replay=None):
        if before_replay is not None:
            before_replay()
        record()
        calls.append(per_graph)
        return 1e-3, None

    def time_graph(record, replays=None, before_replay=None, hold_us=None):
        return timed(record, 1, before_replay)[0]

    monkeypatch.setattr(gdn.timing, "timed", timed)
    monkeypatch.setattr(gdn.timing, "time_graph", time_graph)
    for name in ("make_read_copy", "stagger_cursors"):
        fn = getattr(ops, name)
        monkeypatch.setattr(ops, name, lambda *a, _fn=fn, **kw: _fn(*a, **dict(kw, backend="reference")))
    return calls


SMALL = dict(H=1, HV=2, K=64, V=64, batch=3, L=4)


@pytest.mark.parametrize("copy", [None, torch.bfloat16, torch.float8_e4m3fn])
def test_the_cycle_set_ups_call_the_ops_as_they_take_them(on_cpu, copy):
    s = Setup(**SMALL)
    m = gdn.measure_update(s)
    assert m.seconds == pytest.approx(1e-3) and m.nbytes == gdn.update_bytes(s, 4)
    for staggered in (False, True):
        m = gdn.measure_cycle(s, copy, staggered=staggered)
        assert m.nbytes == gdn.cycle_bytes(s, 4, None if copy is None else gdn.dtype_bytes(copy),
                                           copy == torch.float8_e4m3fn)
    m = gdn.measure_phase(s, copy, s.L - 1)
    assert m.nbytes == gdn.step_bytes(s, s.L - 1, 4, None if copy is None else gdn.dtype_bytes(copy),
                                      copy == torch.float8_e4m3fn)
    m = gdn.measure_cycle_steps(s, copy, staggered=True)
    assert m.extra["slowest/mean"] == pytest.approx(1.0)
    assert on_cpu[:4] == [2, 2 * s.L, 2 * s.L, 2]


def test_a_staggered_pool_starts_at_slot_mod_L(on_cpu):
    s = Setup(**SMALL)
    pool = gdn.ReplayPool(s, torch.bfloat16, staggered_flush=True)
    pool.stagger()
    assert pool.cursors.tolist() == [0, 1, 2, 3, 0, 1]
    assert pool.k == 2 and pool.ck.shape == (6, 2, 64, 64) and pool.k_buf.shape == (6, 1, 4, 64)


def test_the_spec_set_ups_call_the_ops_as_they_take_them(on_cpu):
    s = Setup(**SMALL, T=2)
    m = gdn.measure_snapshots(s)
    assert m.nbytes == gdn.snapshot_bytes(s) and m.extra["tokens/s"] == pytest.approx(s.tokens_per_round() / 1e-3)
    for copy in (None, torch.float8_e4m3fn):
        m = gdn.measure_verify_commit(s, copy, breakdown=True)
        assert m.nbytes is None and {"tokens/s", "verify µs", "verify GB/s", "commit µs"} <= set(m.extra)
