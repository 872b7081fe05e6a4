"""Staggered flush on the GPU: the compiled stagger_cursors op is bitwise the reference's (pads and
out-of-range ids skipped, unnamed slots untouched, graph-capturable), and a staggered CUDA cache decodes
like the fp64 reference over several cycles, with its folds spread over the steps of a cycle."""

import pytest
import torch

from replayssm_cuda import ops
from test_mamba2_cuda import NANO4B, SUPER120B, Layer, bits, cuda_step, gpu_cache, ref_cache, rel_err
from test_slot_ops_cuda import cpu_copy, mamba2_tensors


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("with_slots", [True, False])
def test_stagger_cursors_bitwise_equal_to_reference(index_dtype, with_slots):
    tensors = mamba2_tensors(NANO4B, 12, L=16, seed=2)
    buffers, cursors = tensors[3:6], tensors[6]
    ref_buffers, ref_cursors = cpu_copy(buffers), cursors.cpu().clone()
    slots = torch.tensor([3, -1, 11, 40, 0, 7], dtype=index_dtype) if with_slots else None
    ops.stagger_cursors(buffers, cursors, 13, None if slots is None else slots.cuda(), -1, backend="cuda")
    ops.stagger_cursors(ref_buffers, ref_cursors, 13, slots, -1, backend="reference")
    assert torch.equal(cursors.cpu(), ref_cursors)
    for g, c in zip(buffers, ref_buffers):
        assert torch.equal(bits(g.cpu()), bits(c))
    if with_slots:       # slot 11 -> 11 % 13; the others named keep their own phase; 1, 2, 4.. untouched
        assert int(cursors[11]) == 11 and int(cursors[3]) == 3


def test_stagger_cursors_in_a_cuda_graph():
    tensors = mamba2_tensors(SUPER120B, 8, L=8, seed=5)
    buffers, cursors = tensors[3:6], tensors[6]
    slots = torch.tensor([1, 6], dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.stagger_cursors(buffers, cursors, 5, slots, -1, backend="cuda")
    cursors.fill_(7)
    graph.replay()
    torch.cuda.synchronize()
    assert cursors.cpu().tolist() == [7, 1, 7, 7, 7, 7, 1, 7]
    assert not bool(buffers[0][6].any()) and bool(buffers[0][5].any())


@pytest.mark.parametrize("heads_per_cta", [None, 64], ids=["auto", "whole-group"])
@pytest.mark.parametrize("rc", [None, torch.bfloat16])
def test_staggered_cuda_cache_matches_reference(rc, heads_per_cta, set_overrides):
    if heads_per_cta is not None:
        set_overrides(step_heads_per_cta=heads_per_cta)
    layer = Layer(NANO4B, seed=21)
    num_slots, L = 8, 4
    gpu = gpu_cache(layer, num_slots, buffer_len=L, read_copy_dtype=rc, staggered_flush=True)
    ref = ref_cache(layer, num_slots, read_copy_dtype=rc, buffer_len=L, staggered_flush=True)
    init = layer.states(num_slots)
    gpu.load(init.to("cuda", torch.float32))
    ref.load(init.float().double())
    assert gpu.num_committed.cpu().tolist() == [s % L for s in range(num_slots)]
    slots = torch.arange(num_slots)
    out_tol = 8e-3 if rc is None else 2e-2
    for step in range(3 * L + 1):
        x, dt, B, C, z = layer.inputs(num_slots)
        before = gpu.checkpoint.clone()
        out = cuda_step(gpu, x.cuda(), dt.cuda(), B.cuda(), C.cuda(), z.cuda(), slots.cuda(), staggered_flush=True)
        ref_out = ref.step(x.double(), dt.double(), B.double(), C.double(), z.double(), slots=slots)
        assert rel_err(out, ref_out) < out_tol, f"step {step}"
        assert torch.equal(gpu.num_committed.cpu(), ref.num_committed)
        folded = int((gpu.checkpoint != before).flatten(1).any(1).sum())
        assert folded == num_slots // L, f"step {step}: {folded} slots folded, expected {num_slots // L}"
    assert rel_err(gpu.checkpoint, ref.checkpoint) < 2e-5
