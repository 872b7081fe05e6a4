"""torch.ops.replayssm.make_read_copy (CUDA) against the rule of docs/DESIGN.md, bitwise.

Two oracles: the rule written inline with IEEE divisions (the kernel's promise), and
replayssm_cuda.reference.make_read_copy (the package's spec and CPU path), run on CPU copies.
"""

import re

import pytest
import torch

from replayssm_cuda import reference

FP8 = torch.float8_e4m3fn
CHECKPOINT_DTYPES = [torch.float32, torch.bfloat16, torch.float16]
COPY_DTYPES = [torch.bfloat16, torch.float16, FP8]
COLS = [64, 128, 256, 80, 100, 8, 1]   # 100 and 1: rows not a whole number of 16-byte vectors
POISON_BYTE = 0x5A
POISON_SCALE = -7.25



def op(*args):
    # Looked up at call time: without the compiled extension the namespace has no such op (and the
    # conftest skips these tests).
    return torch.ops.replayssm.make_read_copy(*args)


def _name(dtype):
    return str(dtype).removeprefix("torch.")


def bits(t):
    """The raw bits of t (any strides), for bitwise comparison."""
    int_type = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()]
    return t.contiguous().view(int_type)


def rule(checkpoint, copy_dtype):
    """The DESIGN.md rule on whole rows, with IEEE divisions (torch.full_like(...) / x is a true
    division on every device; `448.0 / x` is reciprocal(x) * 448 in torch). Returns (copy, scale)."""
    x = checkpoint.float()
    if copy_dtype == FP8:
        amax = x.abs().amax(dim=-1)
        nonzero = amax > 0
        one = torch.ones_like(amax)
        fp8_max = torch.full_like(amax, 448.0)
        inv = torch.where(nonzero, fp8_max / amax, one)
        scale = torch.where(nonzero, amax / fp8_max, one)
        return (x * inv[..., None]).clamp(-448.0, 448.0).to(FP8), scale
    if copy_dtype == torch.float16:
        return x.clamp(-65504.0, 65504.0).to(torch.float16), None
    return x.to(copy_dtype), None


def make_checkpoint(shape, dtype, seed, *, padded=False, slot_gap=0):
    """Rows of very different magnitudes, one all-zero row, one row of huge values (fp16 saturation).
    padded: a row stride of cols + 1 and a storage offset of 1, so no row is 16-byte aligned."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    num_slots, heads, rows, cols = shape
    values = torch.randn(shape, generator=g, device="cuda")
    values *= torch.exp2(torch.randint(-20, 20, (num_slots, heads, rows, 1), generator=g, device="cuda").float())
    values[0, 0, 0] = 0.0
    if rows > 1:
        values[-1, -1, 1] *= 1e6
    if dtype != torch.float32:
        values = values.clamp(-6e4, 6e4) if dtype == torch.float16 else values
    base_shape = (num_slots * (1 + slot_gap), heads, rows, cols + (1 if padded else 0))
    base = torch.empty(int(torch.Size(base_shape).numel()) + 1, dtype=dtype, device="cuda")
    base = base[1:] if padded else base[:-1]
    t = base.view(base_shape)[:: 1 + slot_gap, :, :, :cols]
    t.copy_(values)
    return t


def make_outputs(shape, copy_dtype, *, padded=False, slot_gap=0):
    num_slots, heads, rows, cols = shape
    base_shape = (num_slots * (1 + slot_gap), heads, rows, cols + (1 if padded else 0))
    rc = torch.empty(base_shape, dtype=copy_dtype, device="cuda")[:: 1 + slot_gap, :, :, :cols]
    rc.view(torch.uint8).fill_(POISON_BYTE)
    scale = None
    if copy_dtype == FP8:
        # (slots, rows, heads) storage transposed: non-contiguous head/row strides.
        scale = torch.full((num_slots * (1 + slot_gap), rows, heads), POISON_SCALE, device="cuda")
        scale = scale[:: 1 + slot_gap].transpose(1, 2)
    return rc, scale


def expected_after(checkpoint, rc, scale, selected):
    """(copy, scale) expected after the op: the rule on the selected slots, the old bits elsewhere."""
    want_rc, want_scale = rc.clone(), scale.clone() if scale is not None else None
    if selected:
        idx = torch.tensor(selected, device="cuda")
        q, s = rule(checkpoint[idx], rc.dtype)
        want_rc.view(torch.uint8)[idx] = q.view(torch.uint8)
        if scale is not None:
            want_scale[idx] = s
    return want_rc, want_scale


def assert_bitwise(got, want, what):
    if not torch.equal(bits(got), bits(want)):
        diff = (bits(got) != bits(want)).nonzero()
        first = tuple(diff[0].tolist())
        raise AssertionError(f"{what}: {diff.shape[0]} of {got.numel()} elements differ; first at {first}: "
                             f"got {got[first].item()!r}, want {want[first].item()!r}")


def run_and_check(checkpoint, rc, scale, slots=None, pad_slot_id=-1):
    num_slots = checkpoint.shape[0]
    if slots is None:
        selected = list(range(num_slots))
    else:
        selected = [s for s in slots.tolist() if s != pad_slot_id and 0 <= s < num_slots]
    want_rc, want_scale = expected_after(checkpoint, rc, scale, selected)
    op(checkpoint, rc, scale, slots, pad_slot_id)
    torch.cuda.synchronize()
    assert_bitwise(rc, want_rc, "read_copy")
    if scale is not None:
        assert_bitwise(scale, want_scale, "read_scale")


# ---- the rule, every dtype pair and row length ---------------------------------------------------

@pytest.mark.parametrize("cols", COLS)
@pytest.mark.parametrize("copy_dtype", COPY_DTYPES, ids=_name)
@pytest.mark.parametrize("ck_dtype", CHECKPOINT_DTYPES, ids=_name)
def test_matches_rule(ck_dtype, copy_dtype, cols):
    shape = (4, 3, 5, cols)
    ck = make_checkpoint(shape, ck_dtype, seed=cols)
    rc, scale = make_outputs(shape, copy_dtype)
    run_and_check(ck, rc, scale)
    if copy_dtype == FP8:
        assert scale[0, 0, 0].item() == 1.0          # the all-zero row
        assert torch.count_nonzero(rc[0, 0, 0].view(torch.uint8)) == 0


@pytest.mark.parametrize("copy_dtype", COPY_DTYPES, ids=_name)
@pytest.mark.parametrize("ck_dtype", CHECKPOINT_DTYPES, ids=_name)
def test_strided_slot_pool(ck_dtype, copy_dtype):
    """Slot stride 3x the slot size (a pool slice), aligned rows: the vector path on strided memory."""
    shape = (5, 4, 6, 128)
    ck = make_checkpoint(shape, ck_dtype, seed=7, slot_gap=2)
    rc, scale = make_outputs(shape, copy_dtype, slot_gap=1)
    assert not ck.is_contiguous() and not rc.is_contiguous()
    run_and_check(ck, rc, scale)


@pytest.mark.parametrize("cols", [64, 80, 256])
@pytest.mark.parametrize("copy_dtype", COPY_DTYPES, ids=_name)
@pytest.mark.parametrize("ck_dtype", CHECKPOINT_DTYPES, ids=_name)
def test_unaligned_rows(ck_dtype, copy_dtype, cols):
    """Row stride cols + 1 and storage offset 1: the scalar fallback inside the same kernel."""
    shape = (3, 2, 5, cols)
    ck = make_checkpoint(shape, ck_dtype, seed=11, padded=True)
    rc, scale = make_outputs(shape, copy_dtype, padded=True)
    run_and_check(ck, rc, scale)


@pytest.mark.parametrize("copy_dtype", COPY_DTYPES, ids=_name)
def test_fp16_saturates_bf16_does_not(copy_dtype):
    ck = torch.zeros(1, 1, 2, 64, device="cuda")
    ck[0, 0, 0, :4] = torch.tensor([1e5, -1e5, 65519.0, 65520.0])
    ck[0, 0, 1, :2] = torch.tensor([3e38, -3.4e38])
    rc, scale = make_outputs(tuple(ck.shape), copy_dtype)
    run_and_check(ck, rc, scale)
    if copy_dtype == torch.float16:
        assert rc[0, 0, 0, :4].float().tolist() == [65504.0, -65504.0, 65504.0, 65504.0]


@pytest.mark.parametrize("padded", [False, True], ids=["aligned", "unaligned"])
def test_fp8_saturation_is_the_rules_clamp(padded):
    """The kernels leave the rule's clamp to +-448 (NaN kept) to the conversion's saturation
    (cvt .satfinite): rows with +-Inf (an Inf maximum: inverse scale 0, so Inf * 0 = NaN and finite
    values 0), NaN, a maximum whose scaled value rounds past 448 and huge values must still match the
    clamped rule bit for bit, in the paired conversion (aligned rows) and the one-by-one fallback
    (padded rows)."""
    cols = 64
    values = torch.zeros(1, 1, 5, cols)
    values[0, 0, :, :] = torch.linspace(-3.0, 3.0, cols)
    values[0, 0, 0, 5] = float("inf")
    values[0, 0, 1, 7] = float("-inf")
    values[0, 0, 2, 9] = float("nan")
    # A maximum whose product with its own inverse scale rounds past 448 (448.00003 in fp32).
    top = torch.tensor(1.0052499771118164)
    assert (top * (torch.full_like(top, 448.0) / top)).item() > 448.0
    values[0, 0, 3, :] = torch.linspace(-1.0, 1.0, cols) * top
    values[0, 0, 4, :8] = torch.tensor([-1e30, 1e30, 5e29, -7e29, 3.4e38, -3.4e38, 1e-38, 0.0])
    shape = tuple(values.shape)
    ck = make_checkpoint(shape, torch.float32, seed=0, padded=padded)
    ck.copy_(values.cuda())
    rc, scale = make_outputs(shape, FP8, padded=padded)
    run_and_check(ck, rc, scale)
    assert torch.isnan(rc[0, 0, :3].float()).any(dim=-1).tolist() == [True, True, True]


# ---- slots ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("pad_slot_id", [-1, 0])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=_name)
@pytest.mark.parametrize("copy_dtype", COPY_DTYPES, ids=_name)
def test_slots_skip_pads_and_out_of_range(copy_dtype, index_dtype, pad_slot_id):
    shape = (6, 3, 4, 128)
    ck = make_checkpoint(shape, torch.float32, seed=3, slot_gap=1)
    rc, scale = make_outputs(shape, copy_dtype, slot_gap=1)
    # pad, a valid slot, out of range above and below, 0 (a pad when pad_slot_id == 0), another valid one.
    slots = torch.tensor([pad_slot_id, 4, 6, -5, 0, 2, 1 << 20], dtype=index_dtype, device="cuda")
    run_and_check(ck, rc, scale, slots, pad_slot_id)
    untouched = [s for s in range(6) if s not in (4, 2) and not (s == 0 and pad_slot_id != 0)]
    assert (rc[untouched].view(torch.uint8) == POISON_BYTE).all()
    if scale is not None:
        assert (scale[untouched] == POISON_SCALE).all()


def test_strided_slots_tensor_and_empty_slots():
    shape = (4, 2, 3, 64)
    ck = make_checkpoint(shape, torch.bfloat16, seed=5)
    rc, scale = make_outputs(shape, FP8)
    slots = torch.tensor([3, 99, 1, 99], dtype=torch.int64, device="cuda")[::2]   # [3, 1], stride 2
    run_and_check(ck, rc, scale, slots)
    rc2, scale2 = make_outputs(shape, FP8)
    run_and_check(ck, rc2, scale2, torch.empty(0, dtype=torch.int32, device="cuda"))
    assert (rc2.view(torch.uint8) == POISON_BYTE).all()


def test_64bit_offsets():
    """A slot pool whose last slot starts past 2**31 elements."""
    if torch.cuda.mem_get_info()[0] < 16 * 2**30:
        pytest.skip("needs 16 GiB of free GPU memory")
    slot_stride = 2**30 + 64
    shape, strides = (3, 2, 4, 64), (slot_stride, 256, 64, 1)
    ck_store = torch.empty(2 * slot_stride + 512, device="cuda")
    rc_store = torch.empty(2 * slot_stride + 512, dtype=torch.bfloat16, device="cuda")
    ck = ck_store.as_strided(shape, strides)
    ck.copy_(torch.randn(shape, device="cuda"))
    rc = rc_store.as_strided(shape, strides)
    rc.view(torch.uint8).fill_(POISON_BYTE)
    run_and_check(ck, rc, None, torch.tensor([2, 0], device="cuda"))
    assert (rc[1].view(torch.uint8) == POISON_BYTE).all()
    del ck_store, rc_store


# ---- bad inputs: a RuntimeError that names the argument ------------------------------------------

def _good(copy_dtype=FP8):
    shape = (4, 3, 5, 64)
    ck = torch.randn(shape, device="cuda")
    rc = torch.empty(shape, dtype=copy_dtype, device="cuda")
    scale = torch.empty(4, 3, 5, device="cuda") if copy_dtype == FP8 else None
    return ck, rc, scale


BAD_INPUTS = {
    "checkpoint_on_cpu": (lambda ck, rc, sc: (ck.cpu(), rc, sc, None),
                          "make_read_copy: checkpoint must be a CUDA tensor, got a tensor on cpu"),
    "checkpoint_3d": (lambda ck, rc, sc: (ck[0], rc, sc, None),
                      "make_read_copy: checkpoint must be 4-D (num_slots, heads, rows, cols), got 3-D with shape (3, 5, 64)"),
    "checkpoint_fp64": (lambda ck, rc, sc: (ck.double(), rc, sc, None),
                        "make_read_copy: checkpoint must have dtype float32, bfloat16 or float16, got float64"),
    "checkpoint_cols_257": (lambda ck, rc, sc: (torch.randn(4, 3, 5, 257, device="cuda"), rc, sc, None),
                            "make_read_copy: checkpoint last dim (cols) must be in [1, 256], got 257 in shape (4, 3, 5, 257)"),
    "checkpoint_last_dim_strided": (lambda ck, rc, sc: (torch.randn(4, 3, 64, 5, device="cuda").transpose(2, 3), rc, sc, None),
                                    "make_read_copy: checkpoint must have a contiguous last dimension (stride 1), got strides (960, 320, 1, 5)"),
    "read_copy_shape": (lambda ck, rc, sc: (ck, rc[..., :32], sc, None),
                        "make_read_copy: read_copy must have the same shape as checkpoint (4, 3, 5, 64), got (4, 3, 5, 32)"),
    "read_copy_fp32": (lambda ck, rc, sc: (ck, torch.empty_like(ck), sc, None),
                       "make_read_copy: read_copy must have dtype bfloat16, float16 or float8_e4m3fn, got float32"),
    "read_copy_on_cpu": (lambda ck, rc, sc: (ck, rc.cpu(), sc, None),
                         "make_read_copy: read_copy must be a CUDA tensor, got a tensor on cpu"),
    "read_copy_expanded": (lambda ck, rc, sc: (ck, rc[:1].expand(4, 3, 5, 64), sc, None),
                           "make_read_copy: read_copy must not have overlapping elements"),
    "read_copy_last_dim_strided": (lambda ck, rc, sc: (ck, torch.empty(4, 3, 64, 5, dtype=FP8, device="cuda").transpose(2, 3), sc, None),
                                   "make_read_copy: read_copy must have a contiguous last dimension (stride 1)"),
    "fp8_without_scale": (lambda ck, rc, sc: (ck, rc, None, None),
                          "make_read_copy: read_scale is required when read_copy is float8_e4m3fn (a float32 tensor of shape (4, 3, 5)), got None"),
    "bf16_with_scale": (lambda ck, rc, sc: (ck, torch.empty_like(ck, dtype=torch.bfloat16), sc, None),
                        "make_read_copy: read_scale must be None when read_copy is bfloat16 (scales exist only for float8_e4m3fn read copies), got a tensor of shape (4, 3, 5)"),
    "scale_shape": (lambda ck, rc, sc: (ck, rc, sc[..., 0], None),
                    "make_read_copy: read_scale must have shape (num_slots, heads, rows) = (4, 3, 5), got (4, 3)"),
    "scale_dtype": (lambda ck, rc, sc: (ck, rc, sc.bfloat16(), None),
                    "make_read_copy: read_scale must have dtype float32, got bfloat16"),
    "scale_on_cpu": (lambda ck, rc, sc: (ck, rc, sc.cpu(), None),
                     "make_read_copy: read_scale must be a CUDA tensor, got a tensor on cpu"),
    "slots_2d": (lambda ck, rc, sc: (ck, rc, sc, torch.zeros(2, 2, dtype=torch.int64, device="cuda")),
                 "make_read_copy: slots must be 1-D (num_entries,), got 2-D with shape (2, 2)"),
    "slots_float": (lambda ck, rc, sc: (ck, rc, sc, torch.zeros(2, device="cuda")),
                    "make_read_copy: slots must have dtype int32 or int64, got float32"),
    "slots_on_cpu": (lambda ck, rc, sc: (ck, rc, sc, torch.zeros(2, dtype=torch.int64)),
                     "make_read_copy: slots must be a CUDA tensor, got a tensor on cpu"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_names_the_argument(case):
    make_args, message = BAD_INPUTS[case]
    ck, rc, sc = _good()
    args = make_args(ck, rc, sc)
    with pytest.raises(RuntimeError, match=re.escape(message)):
        op(*args, -1)


def test_read_copy_aliasing_checkpoint_is_rejected():
    ck = torch.randn(2, 2, 2, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match=re.escape("make_read_copy: read_copy must not share memory with checkpoint")):
        op(ck, ck, None, None, -1)


# ---- the package reference (the spec and the CPU path) ---------------------------------------------

@pytest.mark.parametrize("reference_device", ["cpu", "cuda"])
@pytest.mark.parametrize("copy_dtype", COPY_DTYPES, ids=_name)
@pytest.mark.parametrize("ck_dtype", CHECKPOINT_DTYPES, ids=_name)
def test_matches_package_reference(ck_dtype, copy_dtype, reference_device):
    shape = (5, 4, 16, 128)
    ck = make_checkpoint(shape, ck_dtype, seed=17, slot_gap=1)
    rc, scale = make_outputs(shape, copy_dtype)
    slots = torch.tensor([4, -1, 0, 2], device="cuda")
    ref_rc = rc.to(reference_device, copy=True)
    ref_scale = scale.to(reference_device, copy=True) if scale is not None else None
    reference.make_read_copy(ck.to(reference_device), ref_rc, ref_scale, slots.to(reference_device), -1)
    op(ck, rc, scale, slots, -1)
    assert_bitwise(rc.cpu(), ref_rc.cpu(), f"read_copy vs reference on {reference_device}")
    if scale is not None:
        assert_bitwise(scale.cpu(), ref_scale.cpu(), f"read_scale vs reference on {reference_device}")


# ---- CUDA graphs ---------------------------------------------------

@pytest.mark.parametrize("copy_dtype", COPY_DTYPES, ids=_name)
def test_cuda_graph_replay_equals_eager(copy_dtype):
    shape = (8, 4, 8, 128)
    ck = make_checkpoint(shape, torch.float32, seed=23, slot_gap=1)
    slots = torch.tensor([5, -1, 0, 7, 3], dtype=torch.int32, device="cuda")
    rc, scale = make_outputs(shape, copy_dtype)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        op(ck, rc, scale, slots, -1)                  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        op(ck, rc, scale, slots, -1)
    for seed in (29, 31):
        ck.copy_(make_checkpoint(shape, torch.float32, seed=seed))
        slots.copy_(torch.tensor([seed % 8, 2, -1, 6, 1], dtype=torch.int32))
        rc.view(torch.uint8).fill_(POISON_BYTE)
        if scale is not None:
            scale.fill_(POISON_SCALE)
        eager_rc, eager_scale = make_outputs(shape, copy_dtype)
        op(ck, eager_rc, eager_scale, slots, -1)
        graph.replay()
        torch.cuda.synchronize()
        assert_bitwise(rc, eager_rc, "read_copy, graph replay vs eager")
        if scale is not None:
            assert_bitwise(scale, eager_scale, "read_scale, graph replay vs eager")


# ---- torch.library, torch.compile ------------------------------------------------------------------

def test_opcheck():
    shape = (3, 2, 4, 64)
    ck = make_checkpoint(shape, torch.float32, seed=37)
    slots = torch.tensor([2, -1, 0], device="cuda")
    for copy_dtype in (torch.bfloat16, torch.float16):
        rc, _ = make_outputs(shape, copy_dtype)
        torch.library.opcheck(torch.ops.replayssm.make_read_copy.default, (ck, rc, None, slots, -1))
    # opcheck's test_schema compares tensors with arithmetic that float8 does not implement.
    rc, scale = make_outputs(shape, FP8)
    torch.library.opcheck(torch.ops.replayssm.make_read_copy.default, (ck, rc, scale, slots, -1),
                          test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))


def test_torch_compile_fullgraph():
    shape = (3, 2, 4, 64)
    ck = make_checkpoint(shape, torch.float32, seed=41)
    slots = torch.tensor([2, -1, 0], device="cuda")

    @torch.compile(fullgraph=True)
    def refresh(ck, rc, scale, slots):
        op(ck, rc, scale, slots, -1)

    rc, scale = make_outputs(shape, FP8)
    want_rc, want_scale = make_outputs(shape, FP8)
    op(ck, want_rc, want_scale, slots, -1)
    refresh(ck, rc, scale, slots)
    assert_bitwise(rc, want_rc, "read_copy under torch.compile")
    assert_bitwise(scale, want_scale, "read_scale under torch.compile")
