"""A real model end to end: transformers' own greedy generate() against the same model decoded with every
SSM layer's recurrence on our caches (examples/decode_with_replayssm.py, which this test runs).

Models: tiny random Mamba2ForCausalLM (SSM only), NemotronHForCausalLM (Mamba-2 + attention + MLP),
Qwen3NextForCausalLM (Gated DeltaNet + attention) and KimiLinearForCausalLM (Kimi Delta Attention + MLA
attention), with SSM dims the compiled kernels take (Mamba-2 (P, N) = (64, 64), GDN / KDA K = V = 64).
Decoding: plain steps (cache.step), and speculative rounds (verify 4 tokens, accept the drafts that match
the model's argmax, a random count per round, commit).

Tolerances, as |logit - generate()'s logit| / max |generate()'s logit|:
  fp32 model, reference path (CPU): 1e-5. Both sides compute in fp32; they differ only in the order of
    the sums (the replay form against the per-token recurrence), measured at ~1e-6.
  bf16 model (GPU: compiled kernels; CPU: the reference on bf16 activations): 3e-2. Every layer rounds
    its activations to bf16 (2^-8 relative); the two sides keep the SSM state in different precisions
    and round in different places, measured at ~1.1e-2 (1-2 bf16 ulps of the largest logit).
Tokens: identical under fp32. Under bf16 the logits themselves are bf16, so exact ties between the top
two happen; a row may take the other token only where generate()'s own top-two gap is within the
tolerance, and is compared up to that token.
"""

import importlib.util
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from replayssm_cuda import _extension  # noqa: E402

_spec = importlib.util.spec_from_file_location(
    "decode_with_replayssm", Path(__file__).resolve().parents[1] / "examples" / "decode_with_replayssm.py")
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)

FAMILIES = ("mamba2", "nemotron_h", "qwen3_next", "kimi_linear")
STEP_OP = {"mamba2": "mamba2_step", "nemotron_h": "mamba2_step", "qwen3_next": "gdn_step", "kimi_linear": "kda_step"}
RTOL = {torch.float32: 1e-5, torch.bfloat16: 3e-2}
BATCH, PROMPT, NEW_TOKENS, T = 4, 8, 12, 4
NUM_SLOTS = 8
_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# (device, dtype): fp32 on the CPU for every family; bf16 on the GPU (the compiled kernels) for every
# family; bf16 on the CPU for one family, so that CI runs the bf16 comparison rule too.
CASES = ([pytest.param(f, "cpu", torch.float32, id=f"{f}-cpu-fp32") for f in FAMILIES]
         + [pytest.param("mamba2", "cpu", torch.bfloat16, id="mamba2-cpu-bf16")]
         + [pytest.param(f, "cuda", torch.bfloat16, id=f"{f}-cuda-bf16", marks=_cuda) for f in FAMILIES])

_references = {}


@pytest.fixture(autouse=True, scope="module")
def _one_cpu_thread():
    """Tiny models are many small ops: torch's thread pool only adds overhead (on a busy machine, most of
    the run time)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def reference(family, device, dtype):
    """The tiny model and generate()'s tokens and logits for it (once per case)."""
    key = (family, device, dtype)
    if key not in _references:
        transformers.logging.set_verbosity_error()
        model = example.tiny_model(family, device, dtype)
        prompt = torch.randint(0, 256, (BATCH, PROMPT), generator=torch.Generator().manual_seed(1)).to(device)
        _references[key] = (model, prompt, *example.reference_generate(model, prompt, NEW_TOKENS))
    return _references[key]


def backend_for(family, device):
    """The compiled kernels on the GPU where this build has them (an error, never a silent fallback),
    else the reference (with a warning on CUDA tensors)."""
    if device == "cpu":
        return "reference"
    return "cuda" if _extension.has_op(STEP_OP[family]) else "auto"


def decoder_for(model, family, device, dtype):
    # Wrap a fresh copy: the cached reference model stays transformers' own.
    import copy
    return example.ReplayDecoder(copy.deepcopy(model), num_slots=NUM_SLOTS, buffer_len=8, max_draft_tokens=T,
                                 activation_dtype=dtype, backend=backend_for(family, device))


def slots_on(device):
    return torch.tensor([5, 0, 7, 2], dtype=torch.int32, device=device)


def assert_matches_generate(tokens, logits, ref_tokens, ref_logits, dtype):
    tol = RTOL[dtype] * ref_logits.abs().max().item()
    compared = 0
    for r in range(tokens.shape[0]):
        differ = (tokens[r] != ref_tokens[r]).nonzero().flatten()
        end = tokens.shape[1] if differ.numel() == 0 else int(differ[0]) + 1
        if differ.numel():
            j = int(differ[0])
            top2 = ref_logits[r, j].topk(2).values
            assert dtype != torch.float32 and (top2[0] - top2[1]).item() <= tol, (
                f"row {r}: token {j} is {int(tokens[r, j])}, generate() chose {int(ref_tokens[r, j])} with a "
                f"top-two gap of {(top2[0] - top2[1]).item():.3g} (tolerance {tol:.3g})")
        err = (logits[r, :end] - ref_logits[r, :end]).abs().max().item()
        assert err <= tol, f"row {r}: logits differ from generate()'s by {err:.3g} > {tol:.3g}"
        compared += end
    if dtype == torch.float32:
        assert compared == tokens.numel()


@pytest.mark.parametrize("family,device,dtype", CASES)
def test_greedy_steps_match_generate(family, device, dtype):
    model, prompt, ref_tokens, ref_logits = reference(family, device, dtype)
    decoder = decoder_for(model, family, device, dtype)
    tokens, logits = example.greedy_decode(decoder, prompt, slots_on(device), NEW_TOKENS)
    assert_matches_generate(tokens, logits, ref_tokens, ref_logits, dtype)


@pytest.mark.parametrize("family,device,dtype", CASES)
def test_speculative_rounds_match_generate(family, device, dtype):
    model, prompt, ref_tokens, ref_logits = reference(family, device, dtype)
    decoder = decoder_for(model, family, device, dtype)
    counts = []
    commit = decoder.commit
    decoder.commit = lambda n: (counts.append(n.tolist()), commit(n))
    tokens, logits = example.speculative_decode(decoder, prompt, slots_on(device), NEW_TOKENS, T,
                                                example.oracle_drafter(ref_tokens))
    assert_matches_generate(tokens, logits, ref_tokens, ref_logits, dtype)
    flat = [c for row in counts for c in row]
    assert min(flat) < T and max(flat) == T, f"acceptance did not vary: {counts}"
    if family == "mamba2":   # an SSM-only model takes a different count per row
        assert any(len(set(row)) > 1 for row in counts), counts


@pytest.mark.parametrize("family", FAMILIES)
def test_the_ssm_state_decides_the_logits(family):
    """Decoding from zeroed caches (the prefill state dropped) changes the logits far beyond the
    tolerance: the comparisons above do test the recurrence."""
    model, prompt, ref_tokens, ref_logits = reference(family, "cpu", torch.float32)
    decoder = decoder_for(model, family, "cpu", torch.float32)
    prefill = decoder.prefill

    def prefill_then_forget(input_ids, slots):
        logits = prefill(input_ids, slots)
        for m in decoder.mixers:
            m.cache.reset(slots)
        return logits
    decoder.prefill = prefill_then_forget
    _, logits = example.greedy_decode(decoder, prompt, slots_on("cpu"), 4)
    change = ((logits[:, 1:] - ref_logits[:, 1:4]).abs().max() / ref_logits.abs().max()).item()
    assert change > 1e3 * RTOL[torch.float32], change


def test_attention_model_needs_one_accepted_count():
    """With attention layers, transformers' KV cache holds one length for the batch: the decoder says so
    instead of committing different counts."""
    model, prompt, _, _ = reference("qwen3_next", "cpu", torch.float32)
    decoder = decoder_for(model, "qwen3_next", "cpu", torch.float32)
    slots = slots_on("cpu")
    decoder.prefill(prompt, slots)
    decoder.verify(torch.zeros(BATCH, T, dtype=torch.long), slots)
    with pytest.raises(ValueError, match="one accepted count"):
        decoder.commit(torch.tensor([1, 2, 1, 1], dtype=torch.int32))
