"""verify_varlen on the reference path: flattened drafts (total_tokens, ...) with cu_seqlens, 0 ..
max_draft_tokens of them per row, equal row by row to a dense verify of each row's own drafts, over
spec rounds with pads in the slot list; the padding-free layout of the output; commit after it; bad
arguments; torch.compile(fullgraph=True).

Tolerance: the reference's einsums sum in an order that depends on the batch size and T (CPU BLAS
blocking), so a row verified alone with its own T drafts differs from the same row in the padded
block in the last bits: fp64 rounding level, 1e-12 relative. Against a dense verify of the very block
the wrapper packs, the output is bitwise."""

import pytest
import torch

from families import FAMILY_NAMES, family, random_states, rel_err

T_MAX = 4


def cu_of(counts, dtype=torch.int32):
    return torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=dtype)


def random_counts(batch, gen):
    """Random draft counts in [0, T_MAX], with a 0 and a T_MAX in every batch."""
    counts = torch.randint(0, T_MAX + 1, (batch,), generator=gen).tolist()
    counts[0], counts[-1] = 0, T_MAX
    perm = torch.randperm(batch, generator=gen).tolist()
    return [counts[p] for p in perm]


def pack_by_hand(flat_inputs, counts, T):
    """The dense (batch, T, ...) block of the rows' drafts, zeros after each row's own."""
    dense = []
    for t in flat_inputs:
        block = torch.zeros(len(counts), T, *t.shape[1:], dtype=t.dtype)
        start = 0
        for r, n in enumerate(counts):
            block[r, :n] = t[start:start + n]
            start += n
        dense.append(block)
    return dense


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_rows_match_their_own_dense_verify(name, index_dtype):
    fam = family(name, seed=7)
    varlen = fam.make_cache(8, buffer_len=9, max_draft_tokens=T_MAX)
    dense = fam.make_cache(8, buffer_len=9, max_draft_tokens=T_MAX)
    init = random_states(fam, 8)
    varlen.load(init)
    dense.load(init)
    slots = torch.tensor([5, -1, 0, 7, 2, -1, 3], dtype=index_dtype)
    gen = torch.Generator().manual_seed(3)
    for _ in range(8):                       # crosses folds at L = 9
        counts = random_counts(slots.shape[0], gen)
        cu = cu_of(counts, index_dtype)
        flat = fam.inputs(sum(counts))
        y = varlen.verify_varlen(*flat, cu_seqlens=cu, slots=slots)
        assert y.shape == (sum(counts), *y.shape[1:])
        accepted = torch.zeros(slots.shape[0], dtype=torch.int32)
        for r, n in enumerate(counts):
            rows = slice(int(cu[r]), int(cu[r + 1]))
            if int(slots[r]) < 0:
                assert torch.count_nonzero(y[rows]) == 0, "a pad row's tokens get zero output"
                continue
            accepted[r] = int(torch.randint(0, n + 1, (1,), generator=gen))
            if n == 0:
                continue
            y_row = dense.verify(*(t[rows][None] for t in flat), slots=slots[r:r + 1])
            assert rel_err(y[rows], y_row[0]) < 1e-12
            dense.commit(accepted[r:r + 1], slots=slots[r:r + 1])
        varlen.commit(accepted, slots=slots)
        assert torch.equal(varlen.num_committed, dense.num_committed)
    assert rel_err(varlen.materialize(), dense.materialize()) < 1e-12


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_output_is_the_padded_dense_block_without_padding(name):
    """Token cu_seqlens[r] + t of the output is row r, position t of a dense verify of the zero-padded
    block, bitwise; also without `slots` (row r uses slot r), with out=, and a smaller max_draft_tokens."""
    fam = family(name, seed=8)
    init = random_states(fam, 4)
    counts = [2, 0, 1, 2]
    flat = fam.inputs(sum(counts))
    caches = [fam.make_cache(4, buffer_len=8, max_draft_tokens=T_MAX) for _ in range(2)]
    for c in caches:
        c.load(init)
    expected = caches[0].verify(*pack_by_hand(flat, counts, 2))
    out = torch.full_like(flat[0] if name == "mamba2" else flat[2], float("nan"))
    y = caches[1].verify_varlen(*flat, cu_seqlens=cu_of(counts), max_draft_tokens=2, out=out)
    assert y is out
    assert torch.equal(y, torch.cat([expected[r, :n] for r, n in enumerate(counts)]))
    for a, b in zip(caches[0].cache_tensors[:-1], caches[1].cache_tensors[:-1]):
        assert torch.equal(a, b), "the varlen verify writes what the dense verify of its block writes"
    # ... except the verified counts (cache_tensors' last): the dense verify's T, lowered to each row's drafts
    assert caches[0].cache_tensors[-1] is caches[0].num_verified
    assert caches[0].num_verified.tolist() == [2, 2, 2, 2]
    assert caches[1].num_verified.tolist() == counts


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_tokens_after_the_last_row_get_zero_output(name):
    """total_tokens may exceed cu_seqlens[-1] (an engine padding the flattened batch to a graph's size):
    those tokens get zero output and change nothing."""
    fam = family(name, seed=13)
    init = random_states(fam, 3)
    caches = [fam.make_cache(3, buffer_len=8, max_draft_tokens=T_MAX) for _ in range(2)]
    for c in caches:
        c.load(init)
    counts = [1, 3, 0]
    flat = fam.inputs(sum(counts) + 2)
    exact = caches[0].verify_varlen(*(t[:4] for t in flat), cu_seqlens=cu_of(counts))
    padded = caches[1].verify_varlen(*flat, cu_seqlens=cu_of(counts))
    assert torch.equal(padded[:4], exact)
    assert torch.count_nonzero(padded[4:]) == 0
    for a, b in zip(caches[0].cache_tensors, caches[1].cache_tensors):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_no_draft_tokens_at_all(name):
    fam = family(name, seed=9)
    cache = fam.make_cache(3, buffer_len=8, max_draft_tokens=T_MAX)
    cache.load(random_states(fam, 3))
    before = cache.materialize()
    y = cache.verify_varlen(*fam.inputs(0), cu_seqlens=cu_of([0, 0, 0]))
    assert y.shape[0] == 0
    cache.commit(torch.zeros(3, dtype=torch.int32))
    assert torch.equal(cache.num_committed, torch.zeros(3, dtype=torch.int32))
    assert torch.equal(cache.materialize(), before)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_commit_accepts_at_most_the_rows_drafts(name):
    """num_accepted above a row's draft count commits only its drafts (commit clamps to num_verified,
    which verify_varlen lowers to each row's count); a pad row's slot keeps its verified count."""
    fam = family(name, seed=10)
    cache = fam.make_cache(5, buffer_len=9, max_draft_tokens=T_MAX)
    reference = fam.make_cache(5, buffer_len=9, max_draft_tokens=T_MAX)
    init = random_states(fam, 5)
    cache.load(init)
    reference.load(init)
    slots = torch.tensor([4, -1, 0, 2], dtype=torch.int32)
    counts = [3, 2, 0, 1]
    flat = fam.inputs(sum(counts))
    cache.verify_varlen(*flat, cu_seqlens=cu_of(counts), slots=slots)
    reference.verify_varlen(*flat, cu_seqlens=cu_of(counts), slots=slots)
    assert cache.num_verified[[4, 0, 2]].tolist() == [3, 0, 1]
    cache.commit(torch.full((4,), T_MAX, dtype=torch.int32), slots=slots)
    reference.commit(torch.tensor(counts, dtype=torch.int32), slots=slots)
    assert torch.equal(cache.num_committed, reference.num_committed)
    assert cache.num_committed.tolist() == [0, 0, 1, 0, 3]
    assert rel_err(cache.materialize(), reference.materialize()) < 1e-12


def test_bad_arguments_name_the_argument():
    fam = family("mamba2", seed=11)
    cache = fam.make_cache(4, buffer_len=8, max_draft_tokens=T_MAX)
    flat = fam.inputs(3)
    slots = torch.tensor([1, 0])
    cu = cu_of([2, 1])

    def call(*inputs, **kw):
        kw = {"cu_seqlens": cu, "slots": slots, **kw}
        return cache.verify_varlen(*(inputs or flat), **kw)

    with pytest.raises(TypeError, match=r"`cu_seqlens` must have dtype in \{int32, int64\}, got float32"):
        call(cu_seqlens=cu.float())
    with pytest.raises(TypeError, match=r"`cu_seqlens` must be a torch.Tensor, got list"):
        call(cu_seqlens=[0, 2, 3])
    with pytest.raises(ValueError, match=r"`cu_seqlens` must have shape \(\*\), got \(1, 3\)"):
        call(cu_seqlens=cu[None])
    with pytest.raises(ValueError, match=r"`cu_seqlens` must have batch \+ 1 = 3 offsets for the 2 rows of "
                                         r"`slots`, got shape \(4,\)"):
        call(cu_seqlens=cu_of([2, 1, 0]))
    with pytest.raises(ValueError, match=r"`cu_seqlens` must be on cpu \(like the cache\), got meta"):
        call(cu_seqlens=cu.to("meta"))
    with pytest.raises(ValueError, match=r"`B` must hold total_tokens = 3 tokens in dim 0 \(like `x`\), "
                                         r"got shape \(2, 2, 4\)"):
        call(flat[0], flat[1], flat[2][:2], *flat[3:])
    with pytest.raises(ValueError, match=r"`out` must hold total_tokens = 3 tokens in dim 0"):
        call(out=torch.empty_like(flat[0][:1]))
    with pytest.raises(ValueError, match=r"`max_draft_tokens` must be None or an int in \[1, 4\] .* got 5"):
        call(max_draft_tokens=5)
    with pytest.raises(ValueError, match=r"without `slots`, row r uses slot r, so batch \(5\) must be <= "
                                         r"num_slots \(4\)"):
        cache.verify_varlen(*fam.inputs(0), cu_seqlens=cu_of([0] * 5))
    # the values of cu_seqlens, read on the reference path only
    with pytest.raises(ValueError, match=r"`cu_seqlens` must start at 0, got cu_seqlens\[0\] = 1"):
        call(cu_seqlens=torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match=r"must grow by 0 .. max_draft_tokens = 2 per row, "
                                         r"got cu_seqlens\[1\] - cu_seqlens\[0\] = 3 - 0"):
        call(cu_seqlens=torch.tensor([0, 3, 3]), max_draft_tokens=2)
    with pytest.raises(ValueError, match=r"must grow by 0 .. max_draft_tokens = 4 per row, "
                                         r"got cu_seqlens\[2\] - cu_seqlens\[1\] = 1 - 2"):
        call(cu_seqlens=torch.tensor([0, 2, 1]))
    with pytest.raises(ValueError, match=r"`cu_seqlens` must end at most at total_tokens = 3 \(the inputs' "
                                         r"dim 0\), got cu_seqlens\[-1\] = 4"):
        call(cu_seqlens=torch.tensor([0, 2, 4]))
    # the per-token inputs, checked as step's are
    with pytest.raises(ValueError, match=r"mamba2_verify: `x` must have shape \(3, 6, 5\), got \(3, 6, 4\)"):
        call(flat[0][..., :4], *flat[1:])

    gdn = family("gdn", seed=12)
    cache = gdn.make_cache(4, buffer_len=8, max_draft_tokens=T_MAX)
    q, k, v, a, b = gdn.inputs(3)
    with pytest.raises(ValueError, match=r"gdn_verify: `a` must hold total_tokens = 3 tokens in dim 0 \(like `q`\)"):
        cache.verify_varlen(q, k, v, a[:1], b, cu_seqlens=cu)


@pytest.mark.parametrize("name", ["mamba2", "gdn"])
def test_compiles_fullgraph(name):
    """verify_varlen traces whole (no host read of cu_seqlens to break the graph) and equals eager."""
    torch._dynamo.reset()
    fam = family(name, dtype=torch.float32, seed=14)
    eager, compiled = (fam.make_cache(4, buffer_len=4, max_draft_tokens=2) for _ in range(2))
    init = random_states(fam, 4).float()
    eager.load(init)
    compiled.load(init)
    verify_varlen = torch.compile(compiled.verify_varlen, fullgraph=True)
    slots, cu = torch.tensor([2, 0, 3], dtype=torch.int32), cu_of([2, 0, 1])
    flat = fam.inputs(3)
    assert torch.equal(verify_varlen(*flat, cu_seqlens=cu, slots=slots),
                       eager.verify_varlen(*flat, cu_seqlens=cu, slots=slots))
    for a, b in zip(compiled.cache_tensors, eager.cache_tensors):
        assert torch.equal(a, b)
