"""torch.ops.replayssm.* on every install (CPU): one schema list for Python and C++, opcheck of every op
with the reference as its CPU kernel, and the cache methods under torch.compile(fullgraph=True)."""

import ast
import re
from pathlib import Path

import pytest
import torch

from families import FAMILY_NAMES, family, random_states
from replayssm_cuda import LayerCaches, _checks, _schemas, capabilities, ops

ROOT = Path(__file__).resolve().parents[1]


def cpp_schemas() -> dict[str, str]:
    """name -> schema of every X(name, "...") in the REPLAYSSM_CUDA_OPS X-macro under csrc/."""
    for header in sorted((ROOT / "csrc").rglob("*.h")):
        text = header.read_text()
        start = text.find("#define REPLAYSSM_CUDA_OPS(X)")
        if start < 0:
            continue
        body = []
        for line in text[start:].split("\n"):
            body.append(line.rstrip().removesuffix("\\"))
            if not line.rstrip().endswith("\\"):
                break
        body = " ".join(body)[len("#define REPLAYSSM_CUDA_OPS(X)"):]
        entries = re.findall(r'X\(\s*(\w+)\s*,((?:\s*"(?:[^"\\]|\\.)*")+)\s*\)', body)
        return {name: "".join(ast.literal_eval(s) for s in re.findall(r'"(?:[^"\\]|\\.)*"', strings))
                for name, strings in entries}
    raise AssertionError("no header under csrc/ defines REPLAYSSM_CUDA_OPS(X)")


def test_python_schemas_equal_the_compiled_ones():
    cpp = cpp_schemas()
    assert cpp, "REPLAYSSM_CUDA_OPS lists no op"
    for name, schema in cpp.items():
        assert name in _schemas.SCHEMAS, f"{name} is compiled (csrc) but has no schema in replayssm_cuda/_schemas.py"
        assert _schemas.SCHEMAS[name] == schema, f"{name}: the schemas differ\n  C++:    {schema}\n  Python: {_schemas.SCHEMAS[name]}"


@pytest.mark.parametrize("name", _schemas.ALL_OPS)
def test_every_op_is_registered_with_its_schema(name):
    op = getattr(torch.ops.replayssm, name).default
    assert str(op._schema) == "replayssm::" + _schemas.SCHEMAS[name]
    assert name in _checks.OP_CHECKS


def test_capabilities_without_the_extension_list_no_op():
    caps = capabilities()
    assert set(caps) >= {"mamba2", "gdn", "cache"}
    if not ops._extension.is_compiled():
        assert all(entry["ops"] == [] for entry in caps.values())
    assert [80, 128] in caps["mamba2"]["shapes"] and caps["cache"]["copy_slots_max_pairs"] > 0
    assert [128, 64] in caps["gdn"]["shapes"] and "float32" in caps["cache"]["checkpoint_dtypes"]
    # KDA's fold keeps the window's decays per key channel: a float32 128 x 128 checkpoint folds L <= 63.
    assert caps["kda"]["fold_max_buffer_len"] == [[128, 128, "float32", 63]] and caps["gdn"]["fold_max_buffer_len"] == []
    caps["mamba2"]["shapes"].clear()                       # a copy: the table inside stays
    assert capabilities()["mamba2"]["shapes"]


# --------------------------------------------------------------------------------------------------
# opcheck: every op, CPU tensors (the checked reference), arguments that make every branch write
# --------------------------------------------------------------------------------------------------

def _filled_cache(name, read_copy_dtype):
    fam = family(name, dtype=torch.float32, seed=5)
    cache = fam.make_cache(5, buffer_len=4, max_draft_tokens=2, read_copy_dtype=read_copy_dtype)
    cache.load(random_states(fam, 5).float())
    cache.step(*fam.inputs(5))                          # cursors at 1: the next step or commit of 2 folds
    return fam, cache


def _op_args(op_name):
    """Arguments of torch.ops.replayssm.<op_name> on the CPU."""
    slots = torch.tensor([3, -1, 0], dtype=torch.int32)
    if op_name in _schemas.CACHE_OPS:
        fam, cache = _filled_cache("mamba2", torch.bfloat16)   # SchemaCheckMode cannot compare fp8 tensors
        ck, rc, rs = cache.checkpoint, cache.read_copy, cache.read_scale
        bufs = list(cache._buffers().values())
        return {
            "make_read_copy": (ck, rc, rs, slots, -1),
            "load": (ck, rc, rs, cache.num_committed, random_states(fam, 3).float(), slots, -1),
            "reset": (ck, rc, rs, bufs, cache.num_committed, slots, -1),
            "stagger_cursors": (bufs, cache.num_committed, slots, -1, 3),
            "copy_slots": (cache.cache_tensors, torch.tensor([0, 1]), torch.tensor([2, 0]), -1),
            "fill_slots_table": (cache.cache_tensors, torch.zeros(0, dtype=torch.int64),
                                 [1.0 if t is rs else 0.0 for t in cache.cache_tensors],
                                 [3 if t is cache.num_committed else 0 for t in cache.cache_tensors], slots, -1),
            "copy_slots_table": (cache.cache_tensors, torch.zeros(0, dtype=torch.int64), torch.tensor([0, 1]),
                                 torch.tensor([2, 0]), -1),
        }[op_name]
    if op_name in _schemas.LAYER_OPS:   # two layers of the op's family, their lists as LayerCaches passes them
        family_name, kind = op_name.split("_")[:2]
        _, first = _filled_cache(family_name, torch.bfloat16)
        layers = LayerCaches([first, _filled_cache(family_name, torch.bfloat16)[1]])
        head = (torch.zeros(0, dtype=torch.int64), *layers._layer_lists)
        flags = (True,) if family_name == "gdn" else ()   # GDN: use_qk_l2norm
        return {
            "commit": (*head, torch.tensor([2, 1, 1], dtype=torch.int32), 2, *flags, slots, -1),
            "flush": (*head, *flags, slots, -1),
            "materialize": (*head, torch.empty(2, 3, *first.checkpoint.shape[1:]), *flags, slots, -1),
        }[kind]
    family_name, kind = op_name.split("_", 1)
    fam, cache = _filled_cache(family_name, torch.bfloat16)
    batch, T = 3, 2
    if family_name == "mamba2":
        w = cache.weights
        x, dt, B, C, z = fam.inputs(batch)
        xs, dts, Bs, Cs, zs = fam.inputs(batch, T)
        state_out = torch.empty(batch, *cache.checkpoint.shape[1:])
        return {
            "update": (cache.checkpoint, x, dt, w.A, B, C, torch.empty_like(x), w.D, z, w.dt_bias, True, slots, -1),
            "update_snapshots": (cache.checkpoint, xs, dts, w.A, Bs, Cs, torch.empty_like(xs),
                                 torch.empty(batch, T, *cache.checkpoint.shape[1:]), w.D, zs, w.dt_bias, True,
                                 slots, -1),
            "step": (*cache._cache_args(), x, dt, w.A, B, C, torch.empty_like(x), w.D, z, w.dt_bias, True, 2, slots,
                     -1, None, True),
            "verify": (*cache._spec_cache_args(), xs, dts, w.A, Bs, Cs, torch.empty_like(xs), w.D, zs, w.dt_bias, True,
                       slots, -1),
            "commit": (*cache._spec_cache_args(), torch.tensor([2, 1, 1], dtype=torch.int32), w.A, 2, slots, -1),
            "flush": (*cache._cache_args(), w.A, slots, -1),
            "materialize": (cache.checkpoint, cache.x_buf, cache.B_buf, cache.dt_buf, cache.num_committed, w.A,
                            state_out, slots, -1),
        }[kind]
    w = cache.weights
    q, k, v, a, b = fam.inputs(batch)
    qs, ks, vs, as_, bs = fam.inputs(batch, T)
    return {
        "update": (cache.checkpoint, q, k, v, a, b, w.A_log, w.dt_bias, torch.empty_like(v), None, True, slots, -1),
        "update_snapshots": (cache.checkpoint, qs, ks, vs, as_, bs, w.A_log, w.dt_bias, torch.empty_like(vs),
                             torch.empty(batch, T, *cache.checkpoint.shape[1:]), None, True, slots, -1),
        "step": (*cache._cache_args(), q, k, v, a, b, w.A_log, w.dt_bias, torch.empty_like(v), None, True, 2, slots, -1,
                 True),
        "verify": (*cache._spec_cache_args(), qs, ks, vs, as_, bs, w.A_log, w.dt_bias, torch.empty_like(vs), 0.5, True,
                   slots, -1),
        "commit": (*cache._spec_cache_args(), torch.tensor([2, 1, 1], dtype=torch.int32), 2, True, slots, -1),
        "flush": (*cache._cache_args(), True, slots, -1),
        "materialize": (cache.checkpoint, cache.k_buf, cache.v_buf, cache.g_buf, cache.beta_buf, cache.u_buf,
                        cache.num_committed, torch.empty(batch, *cache.checkpoint.shape[1:]), True, slots, -1),
    }[kind]


@pytest.mark.parametrize("name", _schemas.ALL_OPS)
def test_opcheck(name):
    torch.library.opcheck(getattr(torch.ops.replayssm, name).default, _op_args(name))


def test_torch_ops_on_cpu_run_the_checked_reference():
    _, cache = _filled_cache("mamba2", None)
    x = torch.zeros(2, 6, 5)
    with pytest.raises(TypeError, match=r"mamba2_step: `x` must have dtype in \{float32\}, got bfloat16"):
        torch.ops.replayssm.mamba2_step(*cache._cache_args(), x.bfloat16(), torch.zeros(2, 6), cache.weights.A,
                                        torch.zeros(2, 2, 4), torch.zeros(2, 2, 4), x.clone(), None, None, None,
                                        True, 2, None, -1)


# --------------------------------------------------------------------------------------------------
# torch.compile(fullgraph=True) of the cache methods on the reference path
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,staggered", [("mamba2", False), ("gdn", False), ("gdn", True)])
def test_cache_methods_compile_fullgraph(name, staggered):
    """The cache methods trace whole; GDNCache with staggered_flush passes the hint to gdn_step."""
    torch._dynamo.reset()
    fam = family(name, dtype=torch.float32, seed=9)
    eager, compiled = (fam.make_cache(4, buffer_len=4, max_draft_tokens=2, staggered_flush=staggered)
                       for _ in range(2))
    init = random_states(fam, 4).float()
    eager.load(init)
    compiled.load(init)
    step = torch.compile(compiled.step, fullgraph=True)
    verify = torch.compile(compiled.verify, fullgraph=True)
    commit = torch.compile(compiled.commit, fullgraph=True)
    slots = torch.tensor([2, 0, 3], dtype=torch.int32)
    for i in range(5):                                   # across folds (every 3 tokens)
        inputs = fam.inputs(3)
        assert torch.equal(step(*inputs, slots=slots), eager.step(*inputs, slots=slots)), f"step {i}"
    drafts = fam.inputs(3, 2)
    assert torch.equal(verify(*drafts, slots=slots), eager.verify(*drafts, slots=slots))
    accepted = torch.tensor([2, 0, 1], dtype=torch.int32)
    commit(accepted, slots=slots)
    eager.commit(accepted, slots=slots)
    for a, b in zip(compiled.cache_tensors, eager.cache_tensors):
        assert torch.equal(a, b)
