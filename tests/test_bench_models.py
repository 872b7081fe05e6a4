"""The Mamba-2 byte models of the benchmark (replayssm_cuda.bench.mamba2) against numbers worked out by hand
for nano4b (H=96, P=80, N=128, G=8), batch 2, bf16 activations, L = 16 (CPU only)."""

import pytest
import torch

from replayssm_cuda.bench import mamba2
from replayssm_cuda.bench.mamba2 import Setup

STATE = 96 * 80 * 128                          # elements of one row's state: 983,040
IO = 2 * (3 * 96 * 80 * 2 + 2 * 8 * 128 * 2 + 96 * 2)   # x, z, out + B, C + dt, bf16, 2 rows: 100,736
ENTRY = 2 * (96 * 80 * 2 + 8 * 128 * 2 + 4 * 96)        # one buffer entry of 2 rows: x, B (bf16), dt (fp32): 35,584


@pytest.fixture
def s():
    return Setup(96, 80, 128, 8, batch=2, L=16, act=torch.bfloat16)


def test_the_parts(s):
    assert s.state_elems == STATE == 983_040
    assert s.io_bytes() == IO == 100_736
    assert s.entry_bytes() == ENTRY == 35_584


def test_conventional_update_reads_and_writes_the_state(s):
    assert mamba2.update_bytes(s, 4) == 2 * 2 * STATE * 4 + IO == 15_829_376
    assert mamba2.update_bytes(s, 2) == 2 * 2 * STATE * 2 + IO


def test_replay_step_reads_the_checkpoint_or_copy_and_w_plus_one_entries(s):
    # w = 3, no copy: the fp32 checkpoint read once, 4 entries
    assert mamba2.step_bytes(s, 3, 4) == 2 * STATE * 4 + 4 * ENTRY + IO == 8_107_392
    # w = 3, fp8 copy: 1 byte an element + the scales (4 H P a row)
    assert mamba2.step_bytes(s, 3, 4, 1, fp8=True) == 2 * STATE * 1 + 2 * 4 * 96 * 80 + 4 * ENTRY + IO == 2_270_592
    # w = 3, bf16 copy
    assert mamba2.step_bytes(s, 3, 4, 2) == 2 * STATE * 2 + 4 * ENTRY + IO


def test_fold_step_reads_and_writes_the_checkpoint_writes_the_copy_and_reads_w_entries(s):
    assert mamba2.step_bytes(s, 15, 4) == 2 * STATE * 8 + 15 * ENTRY + IO == 16_363_136
    assert mamba2.step_bytes(s, 15, 4, 1, fp8=True) == 2 * STATE * 9 + 2 * 4 * 96 * 80 + 15 * ENTRY + IO == 18_390_656
    assert mamba2.step_bytes(s, 15, 2, 1, fp8=True) == 2 * STATE * 5 + 2 * 4 * 96 * 80 + 15 * ENTRY + IO  # bf16 checkpoint


def test_a_cycle_is_the_mean_of_its_steps(s):
    replay = sum(2 * STATE * 4 + (w + 1) * ENTRY + IO for w in range(15))
    assert mamba2.cycle_bytes(s, 4) == pytest.approx((replay + 16_363_136) / 16) == 8_756_816.0


def test_a_staggered_step_is_the_mean_over_its_rows(s):
    # one row at w = 0, one folding at w = 15
    assert mamba2.rows_step_bytes(s, [0, 15], 4) == (2 * STATE * 4 + ENTRY + IO + 16_363_136) / 2 == 12_181_888


def test_speculative_models(s):
    spec = Setup(96, 80, 128, 8, batch=2, L=16, act=torch.bfloat16, T=4)
    assert spec.io_bytes() == 4 * IO
    assert mamba2.snapshot_bytes(spec) == 2 * 5 * STATE * 4 + 4 * IO == 39_724_544
    assert mamba2.verify_bytes(spec, 2) == 2 * STATE * 2 + 4 * IO == 4_335_104
    assert spec.tokens_per_round() == 2 * 5 / 2


def test_tensor_parallel_dims_shard_heads_and_groups():
    d = mamba2.DIMS_TABLE.parse("super120b@tp4")
    s = Setup.of(d, 64, 16)
    assert (s.H, s.P, s.N, s.G) == (32, 64, 128, 2)
    assert mamba2.update_bytes(s, 4) == 64 * (2 * 32 * 64 * 128 * 4 + 3 * 32 * 64 * 2 + 2 * 2 * 128 * 2 + 32 * 2)
