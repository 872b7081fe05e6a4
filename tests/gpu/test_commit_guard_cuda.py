"""Commit is safe by construction on the compiled path (Mamba-2 and GDN): verify records per slot how
many entries it appended (num_verified), commit accepts num_accepted clamped to [0, that count] and
zeroes it. The compiled ops must give the reference's cursors and counts exactly, and its states at fp32
rounding, for counts larger than the drafts, negative counts, second commits without a verify, commits
of some slots only, rows whose cursor leaves no room, pads and out-of-range slots; eagerly and replayed
from a CUDA graph.

Both caches hold an fp32 checkpoint and bf16 activations; the reference runs the same dtypes on the
GPU, so states differ only by the order of fp32 operations (CKPT_TOL)."""

import pytest
import torch

from replayssm_cuda import DeltaRuleWeights, GDNCache, Mamba2Cache, Mamba2Weights

FAMILIES = ("mamba2", "gdn")
CKPT_TOL = 1e-4
SLOTS = [3, -1, 0, 7, 4, 1]     # a pad (-1) and an out-of-range slot (7 of 5)


def rel_err(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp(min=1e-300)).item()


def make_cache(name, backend, num_slots=5, buffer_len=8, max_draft_tokens=4, seed=0):
    """A cache with random weights of `seed` (the same for both backends) and random loaded states."""
    gen = torch.Generator().manual_seed(seed)
    kw = dict(buffer_len=buffer_len, max_draft_tokens=max_draft_tokens, device="cuda", backend=backend,
              activation_dtype=torch.bfloat16)
    if name == "mamba2":
        H, P, N, G = 4, 64, 64, 2
        w = Mamba2Weights(A=-(0.5 + torch.rand(H, generator=gen)).cuda(), D=torch.randn(H, generator=gen).cuda(),
                          dt_bias=(0.1 * torch.randn(H, generator=gen)).cuda())
        cache = Mamba2Cache(num_slots, H, P, N, G, w, **kw)
    else:
        H, HV, K, V = 2, 4, 64, 64
        w = DeltaRuleWeights(A_log=(0.5 * torch.randn(HV, generator=gen)).cuda(),
                             dt_bias=(0.5 * torch.randn(HV, generator=gen)).cuda())
        cache = GDNCache(num_slots, H, HV, K, V, w, **kw)
    cache.load((0.3 * torch.randn(num_slots, *cache.checkpoint.shape[1:], generator=gen)).cuda())
    return cache


def draft_inputs(name, cache, batch, T, gen):
    def rand(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=gen)).to("cuda", torch.bfloat16)

    if name == "mamba2":
        H, P, N, G = cache.num_heads, cache.head_dim, cache.state_dim, cache.num_groups
        return [rand(batch, T, H, P), rand(batch, T, H, scale=0.5), rand(batch, T, G, N), rand(batch, T, G, N),
                rand(batch, T, H, P)]
    H, HV, K, V = cache.num_heads, cache.num_v_heads, cache.head_k_dim, cache.head_v_dim
    return [rand(batch, T, H, K), rand(batch, T, H, K), rand(batch, T, HV, V), rand(batch, T, HV),
            rand(batch, T, HV)]


def assert_same(gpu, ref, what):
    assert torch.equal(gpu.num_committed, ref.num_committed), f"{what}: cursors differ"
    assert torch.equal(gpu.num_verified, ref.num_verified), f"{what}: verified counts differ"
    err = rel_err(gpu.checkpoint, ref.checkpoint)
    assert err < CKPT_TOL, f"{what}: checkpoint error {err:.3g}"
    err = rel_err(gpu.materialize(), ref.materialize())
    assert err < CKPT_TOL, f"{what}: materialized state error {err:.3g}"


@pytest.mark.parametrize("name", FAMILIES)
def test_misused_commits_match_the_reference(name):
    gpu, ref = make_cache(name, "cuda", seed=1), make_cache(name, "reference", seed=1)
    slots = torch.tensor(SLOTS, dtype=torch.int32, device="cuda")
    gen = torch.Generator().manual_seed(2)
    for rnd in range(24):
        T = int(torch.randint(1, gpu.max_draft_tokens + 1, (1,), generator=gen))
        if rnd == 5:                            # slot 4 without room for T >= 2 drafts: it records 0
            T = 3
            for c in (gpu, ref):
                c.num_committed[4] = gpu.buffer_len - 1
        inputs = draft_inputs(name, gpu, len(SLOTS), T, gen)
        for c in (gpu, ref):
            c.verify(*inputs, slots=slots)
        assert_same(gpu, ref, f"round {rnd} verify")
        accepted = torch.randint(-3, T + 5, (len(SLOTS),), generator=gen, dtype=torch.int32)
        accepted[rnd % len(SLOTS)] = T + 1 + rnd    # always one count beyond the drafts
        accepted[(rnd + 1) % len(SLOTS)] = -rnd - 1
        if rnd % 4 == 3:                        # commit some slots only: the others keep their count
            part, acc = slots[:3], accepted[:3].cuda()
        else:
            part, acc = slots, accepted.cuda()
        for c in (gpu, ref):
            c.commit(acc, slots=part)
        assert_same(gpu, ref, f"round {rnd} commit")
        if rnd % 3 == 2:                        # a second commit without a verify accepts nothing
            cursors = gpu.num_committed.clone()
            again = torch.full((len(SLOTS),), T, dtype=torch.int64, device="cuda")
            for c in (gpu, ref):
                c.commit(again, slots=slots)
            assert_same(gpu, ref, f"round {rnd} second commit")
            if part is slots:                   # (after a partial commit the others' verify is still pending)
                assert torch.equal(gpu.num_committed, cursors)
        assert bool((gpu.num_committed + gpu.max_draft_tokens <= gpu.buffer_len).all())


@pytest.mark.parametrize("name", FAMILIES)
def test_cuda_graph_replay_matches_the_reference(name):
    """verify + commit captured once; every replay draws new drafts and counts (beyond the drafts and
    negative among them), and a second captured commit replayed after it accepts nothing."""
    gpu, ref = make_cache(name, "cuda", seed=3), make_cache(name, "reference", seed=3)
    slots = torch.tensor(SLOTS, dtype=torch.int64, device="cuda")
    T, batch = 3, len(SLOTS)
    gen = torch.Generator().manual_seed(4)
    static_in = draft_inputs(name, gpu, batch, T, gen)
    static_out = torch.empty_like(static_in[2] if name == "gdn" else static_in[0])
    static_acc = torch.zeros(batch, dtype=torch.int32, device="cuda")
    static_again = torch.full((batch,), T, dtype=torch.int32, device="cuda")

    def spec():
        gpu.verify(*static_in, slots=slots, out=static_out)
        gpu.commit(static_acc, slots=slots)

    def commit_again():
        gpu.commit(static_again, slots=slots)

    warm = make_cache(name, "cuda", seed=3)      # warm-up launches on a side stream, on another cache
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        warm.verify(*static_in, slots=slots)
        warm.commit(static_acc, slots=slots)
    torch.cuda.current_stream().wait_stream(stream)
    graphs = {}
    for key, record in (("spec", spec), ("again", commit_again)):
        graphs[key] = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graphs[key]):
            record()
    for rnd in range(16):                       # crosses folds at L = 8
        for s, n in zip(static_in, draft_inputs(name, gpu, batch, T, gen)):
            s.copy_(n)
        acc = torch.randint(-2, T + 4, (batch,), generator=gen, dtype=torch.int32)
        static_acc.copy_(acc)
        graphs["spec"].replay()
        ref.verify(*static_in, slots=slots)
        ref.commit(acc.cuda(), slots=slots)
        torch.cuda.synchronize()
        assert_same(gpu, ref, f"replay {rnd}")
        if rnd % 4 == 1:
            cursors = gpu.num_committed.clone()
            graphs["again"].replay()
            ref.commit(static_again.clone(), slots=slots)
            torch.cuda.synchronize()
            assert torch.equal(gpu.num_committed, cursors), "a replayed second commit accepted entries"
            assert_same(gpu, ref, f"replay {rnd} second commit")


@pytest.mark.parametrize("name", FAMILIES)
def test_error_word_matches_the_reference(name):
    """One misuse per op (so that the first violation is the only one): the compiled kernels record the
    reference's [code, row, value, limit]; check() raises it and clears the word; correct use records
    nothing. Also replayed from a CUDA graph."""
    gpu, ref = make_cache(name, "cuda", seed=5), make_cache(name, "reference", seed=5)
    gen = torch.Generator().manual_seed(6)
    T = 3
    cases = [  # (verify slots, commit slots, num_accepted): at most one misuse each
        ([0, 1, 2], [0, 1, 2], [3, 0, 2]),
        ([0, -1, 4], [0, -1, 4], [3, 3, 7]),          # commit row 2 accepts 7 of 3
        ([3, 9, 1], [3, 1], [1, 1]),                  # verify row 1 names slot 9
        ([2, 0], [2, -4], [1, 1]),                    # commit row 1 names slot -4
        ([1, 2], [1, 2], [-1, 0]),                    # commit row 0: -1
        ([4], [4, 1], [0, 1]),                        # commit row 1: slot 1 has nothing verified
    ]
    for v_slots, c_slots, acc in cases:
        inputs = draft_inputs(name, gpu, len(v_slots), T, gen)
        vs, cs = (torch.tensor(s, device="cuda") for s in (v_slots, c_slots))
        a = torch.tensor(acc, dtype=torch.int32, device="cuda")
        for c in (gpu, ref):
            c.verify(*inputs, slots=vs)
        assert torch.equal(gpu.error_word, ref.error_word), f"verify {v_slots}: error words differ"
        if int(ref.error_word[0]) == 0:
            for c in (gpu, ref):
                c.commit(a, slots=cs)
            assert torch.equal(gpu.error_word, ref.error_word), f"commit {c_slots} {acc}: error words differ"
        assert_same(gpu, ref, f"case {v_slots} {c_slots} {acc}")
        expected = ref.error_word.tolist()
        ref.error_word.zero_()
        if expected[0] == 0:
            gpu.check()
        else:
            with pytest.raises(ValueError, match=rf"{name}_(verify|commit) row {expected[1]}: "):
                gpu.check()
        assert int(gpu.error_word.count_nonzero()) == 0, "check() clears the word"

    slots = torch.tensor([0, 2], device="cuda")
    static_in = draft_inputs(name, gpu, 2, T, gen)
    static_acc = torch.zeros(2, dtype=torch.int32, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        warm = make_cache(name, "cuda", seed=5)
        warm.verify(*static_in, slots=slots)
        warm.commit(static_acc, slots=slots)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gpu.verify(*static_in, slots=slots)
        gpu.commit(static_acc, slots=slots)
    for acc in ([1, 3], [0, 4], [2, 2], [-5, 1]):
        static_acc.copy_(torch.tensor(acc, dtype=torch.int32))
        graph.replay()
        ref.verify(*static_in, slots=slots)
        ref.commit(static_acc.clone(), slots=slots)
        torch.cuda.synchronize()
        assert torch.equal(gpu.error_word, ref.error_word), f"replay {acc}: error words differ"
        assert_same(gpu, ref, f"replay {acc}")
        gpu.error_word.zero_()
        ref.error_word.zero_()
