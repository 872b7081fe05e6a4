"""The specification of every ReplaySSM op, as slow and readable PyTorch.

This module is the contract the CUDA kernels are tested against and the path the package takes when
there is no GPU or no compiled extension. Every function here has the signature of the op it specifies
(``ops.py``; ``delta_*`` serve both ``gdn_*`` and ``kda_*``): caller-allocated outputs, in-place cache
updates. It is written for clarity, not speed: it synchronises with the host (boolean indexing), so
unlike the compiled ops it cannot be captured in a CUDA graph.

Arithmetic is done in fp32, or in fp64 when any state or input tensor is fp64 (so the tests can check
the replay algebra to 1e-12 against independent fp64 loops). Works on any device.

Cache tensors (one layer, slot-major; see docs/DESIGN.md):
    checkpoint     (slots, H, P, N) Mamba-2 / (slots, HV, V, K) GDN, KDA: state after the last fold
    read_copy      same shape, bf16/fp16/fp8-e4m3, or None; read_scale (slots, H, rows) for fp8
    buffers        the inputs since the checkpoint, (slots, heads, L, dim)
    num_committed  int32 (slots,): committed buffer entries per slot
    num_verified   int32 (slots,): entries the slot's last verify appended, the most its commit accepts

Rows and slots: row r of a batch uses slot ``slots[r]`` (row r when ``slots`` is None). A row whose
slot equals ``pad_slot_id`` or lies outside [0, num_slots), or whose cursor leaves no room for its
tokens, touches no cache memory and gets a zero output. Each slot may appear at most once per call.

Flush-early rule: every op that advances a cursor (step, commit) folds a slot's buffer into its
checkpoint as soon as ``num_committed + max_draft_tokens > L``, so the next verify always fits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

FP8_E4M3_MAX = 448.0
FP16_MAX = 65504.0
L2NORM_EPS = 1e-6


# --------------------------------------------------------------------------------------------------
# Small helpers shared by all families
# --------------------------------------------------------------------------------------------------

def _compute_dtype(*tensors) -> torch.dtype:
    """fp64 when any tensor is fp64, else fp32: accumulation is never below fp32."""
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def _gather(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    # index_select on float8 is not implemented on every backend; move its bytes instead.
    if t.dtype == torch.float8_e4m3fn:
        return t.view(torch.uint8)[idx].view(torch.float8_e4m3fn)
    return t[idx]


def _scatter(t: torch.Tensor, idx: torch.Tensor, values: torch.Tensor) -> None:
    if t.dtype == torch.float8_e4m3fn:
        t.view(torch.uint8)[idx] = values.to(torch.float8_e4m3fn).view(torch.uint8)
    else:
        t[idx] = values.to(t.dtype)


def _resolve_rows(slots, batch: int, num_slots: int, pad_slot_id: int, device):
    """Slot index of every row (0 for rows that touch nothing) and the mask of rows that do."""
    if slots is None:
        slot_idx = torch.arange(batch, device=device)
    else:
        slot_idx = slots.to(device=device, dtype=torch.long)
    valid = (slot_idx != pad_slot_id) & (slot_idx >= 0) & (slot_idx < num_slots)
    return torch.where(valid, slot_idx, torch.zeros_like(slot_idx)), valid


def _named_slots(slots, num_slots: int, pad_slot_id: int, device):
    """The valid slot indices a slot-list op acts on: every slot when `slots` is None."""
    if slots is None:
        return torch.arange(num_slots, device=device)
    idx, valid = _resolve_rows(slots, slots.shape[0], num_slots, pad_slot_id, device)
    return idx[valid]


def _read_state(checkpoint, read_copy, read_scale, idx, cd):
    """The state the per-step reads use: the read copy when there is one, else the checkpoint."""
    if read_copy is None:
        return checkpoint[idx].to(cd)
    state = _gather(read_copy, idx).to(cd)
    if read_scale is not None:
        state = state * read_scale[idx].to(cd)[..., None]
    return state


def _put_entries(buffer, slot_idx, pos, values) -> None:
    """buffer[slot_idx[r], :, pos[r, i]] = values[r, i] for a (slots, heads, L, ...) buffer (no row: a no-op,
    with no branch on the data)."""
    buffer.transpose(1, 2)[slot_idx[:, None], pos] = values.to(buffer.dtype)


def _take_entry(window, pos):
    """window[r, :, pos[r]] for a (batch, heads, L, ...) window: (batch, heads, ...)."""
    rows = torch.arange(window.shape[0], device=window.device)
    return window.transpose(1, 2)[rows, pos]


def _expand_heads(t, num_heads: int, dim: int):
    """Head h of `num_heads` uses group h // (num_heads / groups): repeat each group along `dim`."""
    groups = t.shape[dim]
    return t if groups == num_heads else t.repeat_interleave(num_heads // groups, dim=dim)


def _window_masks(num_committed_rows, offset: int, length: int, device):
    """(batch, L) masks of the buffer entries up to and including position w + offset, and before it."""
    j = torch.arange(length, device=device)[None, :]
    t = (num_committed_rows + offset)[:, None]
    return j <= t, j < t


# --------------------------------------------------------------------------------------------------
# Stochastic rounding of 16-bit checkpoints (Philox4x32-10, seed and offset in a device tensor)
# --------------------------------------------------------------------------------------------------
#
# The spec of csrc/kernels/philox.cuh and stochastic_rounding.cuh, bit for bit. A bf16 / fp16
# checkpoint written from fp32 (the update, every fold) may round stochastically instead of to nearest:
# a value between two neighbouring 16-bit values goes to the one farther from zero with probability
# equal to its fractional distance from the one nearer zero (16 random bits per element), so
# E[SR(v)] = v and small increments that round-to-nearest would drop forever survive on average.
# `rounding_seed` is an int64 tensor (2,) = [seed, offset]; every call that may round advances the
# offset by one. The bits of element (slot, head, p, n) are those of one Philox draw covering
# 8 consecutive elements of a row:
#     key = (seed mod 2^32, seed >> 32 mod 2^32)
#     counter = ((p << 16) | (n >> 3), head, slot mod 2^32, offset mod 2^32)
#     bits = 16-bit half (n % 2, low half first) of word (n % 8) // 2
# so they depend on (seed, offset, slot, head, p, n) only, never on the batch row or batch size.
# `load` keeps round-to-nearest-even (it writes given states; nothing accumulates there).

_MASK32 = 0xFFFFFFFF
_PHILOX_MUL = (0xD2511F53, 0xCD9E8D57)
_PHILOX_WEYL = (0x9E3779B9, 0xBB67AE85)


def _mulhilo32(a: torch.Tensor, b: int):
    """(a * b) >> 32 and (a * b) mod 2^32 for int64 tensors a in [0, 2^32) and a 32-bit constant b,
    without int64 overflow (a is split into 16-bit halves)."""
    lo_part = (a & 0xFFFF) * b                    # < 2^48
    hi_part = (a >> 16) * b                       # < 2^48
    lo = (lo_part + ((hi_part & 0xFFFF) << 16)) & _MASK32
    hi = (hi_part + (lo_part >> 16)) >> 16
    return hi, lo


def philox4x32_10(counter, key):
    """Philox4x32-10 (Random123 constants) of int64 tensors: counter = (c0, c1, c2, c3), key = (k0, k1),
    every word in [0, 2^32), broadcast together. Returns the 4 output words as int64 tensors."""
    c0, c1, c2, c3 = (torch.as_tensor(c, dtype=torch.int64) & _MASK32 for c in counter)
    k0, k1 = (torch.as_tensor(k, dtype=torch.int64) & _MASK32 for k in key)
    for i in range(10):
        if i > 0:
            k0 = (k0 + _PHILOX_WEYL[0]) & _MASK32
            k1 = (k1 + _PHILOX_WEYL[1]) & _MASK32
        hi0, lo0 = _mulhilo32(c0, _PHILOX_MUL[0])
        hi1, lo1 = _mulhilo32(c2, _PHILOX_MUL[1])
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def rounding_bits(seed: int, offset: int, slots, heads: int, rows: int, cols: int, device=None):
    """The 16 random bits (int64 in [0, 2^16)) of every element of checkpoint[slots], shape
    (len(slots), heads, rows, cols), for one call with this seed and offset."""
    slots = torch.as_tensor(slots, dtype=torch.int64, device=device)
    device = slots.device
    blocks = (cols + 7) // 8
    p = torch.arange(rows, dtype=torch.int64, device=device)
    c0 = ((p[:, None] << 16) | torch.arange(blocks, dtype=torch.int64, device=device)[None, :])[None, None]
    c1 = torch.arange(heads, dtype=torch.int64, device=device)[None, :, None, None]
    c2 = (slots & _MASK32)[:, None, None, None]
    c3 = torch.tensor(offset & _MASK32, dtype=torch.int64, device=device)
    words = philox4x32_10((c0, c1, c2, c3), (seed & _MASK32, (seed >> 32) & _MASK32))
    words = torch.stack([torch.broadcast_to(w, (slots.numel(), heads, rows, blocks)) for w in words], dim=-1)
    halves = torch.stack([words & 0xFFFF, words >> 16], dim=-1)     # (..., blocks, 4 words, 2 halves)
    return halves.reshape(slots.numel(), heads, rows, blocks * 8)[..., :cols]


def stochastic_round(values: torch.Tensor, dtype: torch.dtype, bits: torch.Tensor) -> torch.Tensor:
    """Stochastic rounding of `values` (rounded to fp32 first when wider) to bf16 / fp16 with 16 random
    bits per element (`bits`, int64 in [0, 2^16), same shape). Representable values stay; NaN goes
    through as in a round-to-nearest cast; fp16 saturates to +-65504 first, like make_read_copy and the
    kernels' fp16 stores (so inf becomes +-65504). bf16: the fp32 bits plus the random bits, truncated to
    the top 16. fp16: the same on the fp32 mantissa bits below the fp16 spacing (13 in fp16's normal
    range, up to 23 below it, where the 16 random bits are scaled up, so the probability is the fraction
    truncated to 16 bits); below 2^-24, |v| becomes 2^-24 when bits + floor(2^16 |v| / 2^-24) >= 2^16,
    else 0. A larger bits value never rounds toward zero where a smaller one rounds away."""
    if dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"stochastic_round: dtype must be bfloat16 or float16, got {dtype}")
    v = values.to(torch.float32)
    if dtype == torch.float16:
        v = v.clamp(-FP16_MAX, FP16_MAX)
    a = v.contiguous().view(torch.int32).to(torch.int64) & _MASK32
    r = bits.to(device=v.device, dtype=torch.int64)
    if dtype == torch.bfloat16:
        out = (a + r) & 0xFFFF0000
    else:
        sign = a & 0x80000000
        m = a ^ sign
        e = m >> 23
        s = torch.where(e >= 113, 13, 126 - e).clamp(13, 23)             # used where e >= 103 only
        add = torch.where(s <= 16, r >> (16 - s).clamp(min=0), r << (s - 16).clamp(min=0))
        grid = (m + add) & (_MASK32 ^ ((torch.ones_like(s) << s) - 1))
        sig = torch.where(e == 0, m, (m & 0x7FFFFF) | 0x800000)
        shift = (126 - e.clamp(min=1) - 16).clamp(max=31)
        tiny = torch.where(r + (sig >> shift) >= 0x10000, 0x33800000, 0)  # 2^-24 or 0, a carry again
        out = sign | torch.where(e >= 103, grid, tiny)
    out = torch.where(out >= 2**31, out - 2**32, out).to(torch.int32).view(torch.float32)
    return torch.where(torch.isnan(v), v, out).to(dtype)


def _check_rounding_seed(checkpoint, rounding_seed):
    if rounding_seed is not None and checkpoint.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"rounding_seed (stochastic rounding) is only for a bfloat16 or float16 checkpoint, "
                         f"got a {str(checkpoint.dtype).replace('torch.', '')} checkpoint")


def _store_checkpoint(checkpoint, idx, values, rounding_seed) -> None:
    """checkpoint[idx] = values in the checkpoint dtype: round to nearest even, or stochastically with
    the bits of this call's (seed, offset) when rounding_seed is given."""
    if rounding_seed is None or idx.numel() == 0:
        checkpoint[idx] = values.to(checkpoint.dtype)
        return
    seed, offset = (int(v) for v in rounding_seed.tolist())
    bits = rounding_bits(seed, offset, idx.to(torch.int64), *checkpoint.shape[1:], device=checkpoint.device)
    checkpoint[idx] = stochastic_round(values, checkpoint.dtype, bits)


def _advance_rounding_offset(rounding_seed) -> None:
    """Every call with a rounding seed moves its offset by one (the kernels do it on the device)."""
    if rounding_seed is not None:
        rounding_seed[1] += 1


# --------------------------------------------------------------------------------------------------
# Read copies
# --------------------------------------------------------------------------------------------------

def make_read_copy(checkpoint, read_copy, read_scale=None, slots=None, pad_slot_id: int = -1) -> None:
    """Refresh the low-precision read copy of the named slots (all when ``slots`` is None).

    bf16 / fp16: round-to-nearest-even cast (fp16 saturates at +-65504).
    fp8-e4m3: per (slot, head, row) scale = amax / 448 (1 for an all-zero row), q = x * (448 / amax)
    clamped to +-448 and rounded to nearest even; dequantised value = q * scale.
    """
    idx = _named_slots(slots, checkpoint.shape[0], pad_slot_id, checkpoint.device)
    x = checkpoint[idx].float()
    if read_copy.dtype == torch.float8_e4m3fn:
        amax = x.abs().amax(dim=-1)
        nonzero = amax > 0
        one = torch.ones_like(amax)
        # IEEE divisions on every device: `448.0 / t` would be reciprocal(t) * 448 and, on CUDA,
        # `t / 448.0` a multiplication by 1/448; the kernels divide.
        fp8_max = torch.full_like(amax, FP8_E4M3_MAX)
        inv = torch.where(nonzero, fp8_max / amax, one)
        scale = torch.where(nonzero, amax / fp8_max, one)
        _scatter(read_copy, idx, (x * inv[..., None]).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX))
        read_scale[idx] = scale
    elif read_copy.dtype == torch.float16:
        _scatter(read_copy, idx, x.clamp(-FP16_MAX, FP16_MAX))
    else:
        _scatter(read_copy, idx, x)


# --------------------------------------------------------------------------------------------------
# Cache management shared by all families
# --------------------------------------------------------------------------------------------------

def load(checkpoint, read_copy, read_scale, num_committed, states, slots=None, pad_slot_id: int = -1) -> None:
    """Write prefill states into the checkpoints of the named slots, regenerate their read copies and
    empty their buffers. ``states`` is (batch, *checkpoint.shape[1:])."""
    idx, valid = _resolve_rows(slots, states.shape[0], checkpoint.shape[0], pad_slot_id, checkpoint.device)
    idx = idx[valid]
    checkpoint[idx] = states[valid].to(checkpoint.dtype)
    num_committed[idx] = 0
    if read_copy is not None:
        make_read_copy(checkpoint, read_copy, read_scale, idx)


def reset(checkpoint, read_copy, read_scale, buffers, num_committed, slots=None, pad_slot_id: int = -1) -> None:
    """Zero the state, read copy and buffers of the named slots (all when None) and their cursors."""
    idx = _named_slots(slots, checkpoint.shape[0], pad_slot_id, checkpoint.device)
    for t in [checkpoint, read_copy, *buffers]:
        if t is not None:
            _scatter(t, idx, torch.zeros((idx.numel(), *t.shape[1:]), dtype=torch.float32, device=t.device))
    if read_scale is not None:
        read_scale[idx] = 1.0
    num_committed[idx] = 0


def stagger_cursors(buffers, num_committed, slots=None, pad_slot_id: int = -1, period: int = 1) -> None:
    """Start the named slots' buffers (all when None) with slot % period neutral entries, so slots that
    start together fold at different steps (staggered flush). A zero entry changes nothing: Mamba-2
    folds dt_j e^(...) x_j B_j with dt_j = 0 and decays by e^(A * 0) = 1; GDN/KDA decay by e^0 = 1 and
    add beta_j (...) k_j with beta_j = 0 and k_j = 0. So outputs and states stay those of the
    recurrence; only the position of each slot's fold in the token stream moves."""
    idx = _named_slots(slots, num_committed.shape[0], pad_slot_id, num_committed.device)
    for t in buffers:
        _scatter(t, idx, torch.zeros((idx.numel(), *t.shape[1:]), dtype=torch.float32, device=t.device))
    num_committed[idx] = (idx % period).to(num_committed.dtype)


def copy_slots(cache_tensors, src_slots, dst_slots, pad_slot_id: int = -1) -> None:
    """Copy everything a slot owns (checkpoint, read copy, scales, buffers, cursor) from src to dst.
    Sources are read before any destination is written, so overlapping lists behave as a gather.
    A pair whose source or destination is pad_slot_id or outside [0, num_slots) is skipped."""
    tensors = [t for t in cache_tensors if t is not None]
    if not tensors:
        return
    num_slots = tensors[0].shape[0]
    src = src_slots.to(torch.long)
    dst = dst_slots.to(torch.long)

    def named(s):
        return (s != pad_slot_id) & (s >= 0) & (s < num_slots)

    keep = named(src) & named(dst)
    src, dst = src[keep], dst[keep]
    for t in tensors:
        values = _gather(t, src.to(t.device)).clone()
        if t.dtype == torch.float8_e4m3fn:
            t.view(torch.uint8)[dst.to(t.device)] = values.view(torch.uint8)
        else:
            t[dst.to(t.device)] = values


def fill_slots_table(cache_tensors, slot_table, fill_values, fill_periods, slots=None, pad_slot_id: int = -1) -> None:
    """The model-level reset: every tensor's named slots (all when None) <- fill_values[i], or, where
    fill_periods[i] > 0 (an int32 cursor tensor), slot % fill_periods[i]. slot_table (the compiled
    kernel's device table of the tensors) is not read here."""
    tensors = list(cache_tensors)
    idx = _named_slots(slots, tensors[0].shape[0], pad_slot_id, tensors[0].device)
    for t, value, period in zip(tensors, fill_values, fill_periods):
        i = idx.to(t.device)
        if period:
            t[i] = (i % period).to(t.dtype)
        elif value == 0:
            _scatter(t, i, torch.zeros((i.numel(), *t.shape[1:]), dtype=torch.float32, device=t.device))
        else:
            t[i] = value


def copy_slots_table(cache_tensors, slot_table, src_slots, dst_slots, pad_slot_id: int = -1) -> None:
    """copy_slots over the tensors of many layers at once (the tensors own disjoint memory, so this is
    each layer's copy_slots). slot_table is not read here."""
    copy_slots(cache_tensors, src_slots, dst_slots, pad_slot_id)


def _accepted_entries(num_accepted, verified):
    """What a commit row accepts: num_accepted clamped to [0, verified], the entries its slot's last
    verify appended (so no entry that verify did not write is ever accepted)."""
    most = verified.long().clamp(min=0)
    return torch.minimum(num_accepted.to(most.device).long().clamp(min=0), most)


def _commit_cursors(num_committed, num_verified, num_accepted, L: int, max_draft_tokens: int, slots,
                    pad_slot_id: int, error_word=None):
    """Move each row's cursor past its accepted entries (num_accepted clamped to [0, num_verified[slot]]
    and to the buffer's room), consume the verify (num_verified[slot] = 0); return the rows' slots and the
    mask of rows whose slot must fold now because the next verify of max_draft_tokens would not fit."""
    idx, named = _resolve_rows(slots, num_accepted.shape[0], num_committed.shape[0], pad_slot_id,
                               num_committed.device)
    w = num_committed[idx].long()
    valid = named & (w >= 0) & (w <= L)
    verified = num_verified[idx]
    if error_word is not None:
        codes, ids = _slot_errors(slots, num_accepted.shape[0], num_committed.shape[0], pad_slot_id,
                                  ERROR_COMMIT_SLOT, num_committed.device)
        asked = num_accepted.to(num_committed.device).long()
        outside = named & (asked != _accepted_entries(asked, verified))
        codes = torch.where(outside & (codes == 0), ERROR_COMMIT_ACCEPTED, codes)
        limits = torch.where(codes == ERROR_COMMIT_SLOT, num_committed.shape[0], verified.long().clamp(min=0))
        _record_error(error_word, codes, torch.where(codes == ERROR_COMMIT_SLOT, ids, asked), limits)
    accepted = torch.minimum(_accepted_entries(num_accepted, verified), L - w)
    new_w = w + accepted
    num_committed[idx[valid]] = new_w[valid].to(num_committed.dtype)
    num_verified[idx[named]] = 0
    return idx, valid & (new_w + max_draft_tokens > L)


ERROR_VERIFY_SLOT, ERROR_COMMIT_SLOT, ERROR_COMMIT_ACCEPTED = 1, 2, 3   # csrc/cache/error_word.cuh
_INT32 = (-2**31, 2**31 - 1)


def _slot_errors(slots, batch: int, num_slots: int, pad_slot_id: int, code: int, device):
    """Per row: `code` where the row's slot id is neither the pad id nor in [0, num_slots), else 0; and
    the slot ids (the values an error word records)."""
    named = torch.arange(batch, device=device) if slots is None else slots.to(device=device, dtype=torch.long)
    bad = (named != pad_slot_id) & ((named < 0) | (named >= num_slots))
    return torch.where(bad, code, 0), named


def _record_error(error_word, codes, values, limits) -> None:
    """The first row (in row order) with a nonzero code goes into an empty error word [code, row, value,
    limit] (int32 (4,)); a word that holds an error keeps it. No host synchronisation."""
    if codes.numel() == 0:
        return
    device = error_word.device
    codes, values, limits = (t.to(device=device, dtype=torch.long) for t in (codes, values, limits))
    first = torch.argmax((codes != 0).to(torch.int32))
    entry = torch.stack([codes[first], first, values[first].clamp(*_INT32), limits[first].clamp(*_INT32)])
    write = (codes != 0).any() & (error_word[0] == 0)
    error_word.copy_(torch.where(write, entry.to(error_word.dtype), error_word))


def _record_verified(num_verified, idx, named, appended, T: int) -> None:
    """num_verified[slot] = T for each named row whose verify appended its drafts, 0 for a named row
    without room; pad rows write nothing."""
    count = torch.where(appended, T, 0).to(num_verified.dtype)
    num_verified[idx[named]] = count[named]


def _rows_to_flush(num_committed, L: int, slots, pad_slot_id: int):
    """Slots of a flush (all when slots is None) and the mask of those holding committed entries."""
    num_slots = num_committed.shape[0]
    batch = num_slots if slots is None else slots.shape[0]
    idx, valid = _resolve_rows(slots, batch, num_slots, pad_slot_id, num_committed.device)
    w = num_committed[idx].long()
    return idx, valid & (w > 0) & (w <= L)


# --------------------------------------------------------------------------------------------------
# Mamba-2
# --------------------------------------------------------------------------------------------------

def _mamba2_dt(dt, dt_bias, dt_softplus: bool, cd):
    dt = dt.to(cd)
    if dt_bias is not None:
        dt = dt + dt_bias.to(cd)
    return F.softplus(dt) if dt_softplus else dt


def _mamba2_finish_output(y, x, D, z, cd):
    if D is not None:
        y = y + D.to(cd)[:, None] * x
    if z is not None:
        y = y * F.silu(z.to(cd))
    return y


def mamba2_update(state, x, dt, A, B, C, out, D=None, z=None, dt_bias=None, dt_softplus: bool = False,
                  slots=None, pad_slot_id: int = -1, rounding_seed=None):
    """Conventional T=1 Mamba-2 decode: read the state, update it, write it, return the output.

    state (slots, H, P, N); x, z, out (batch, H, P); dt (batch, H); A, D, dt_bias (H,); B, C (batch, G, N).
        dt = softplus(dt + dt_bias) if dt_softplus ; a = exp(dt * A)
        S  = a * S + dt * x (outer) B ;  y = S C + D x ;  y *= silu(z)
    rounding_seed: stochastic rounding of a bf16 / fp16 state (see stochastic_round); offset += 1.
    """
    _check_rounding_seed(state, rounding_seed)
    cd = _compute_dtype(state, x)
    H = state.shape[1]
    idx, valid = _resolve_rows(slots, x.shape[0], state.shape[0], pad_slot_id, state.device)
    xs = x.to(cd)
    dts = _mamba2_dt(dt, dt_bias, dt_softplus, cd)
    decay = torch.exp(dts * A.to(cd))
    Bh = _expand_heads(B.to(cd), H, 1)
    Ch = _expand_heads(C.to(cd), H, 1)
    s = state[idx].to(cd)
    s = decay[..., None, None] * s + (dts[..., None] * xs)[..., None] * Bh[:, :, None, :]
    y = _mamba2_finish_output((s * Ch[:, :, None, :]).sum(-1), xs, D, z, cd)
    _store_checkpoint(state, idx[valid], s[valid], rounding_seed)
    _advance_rounding_offset(rounding_seed)
    out.copy_(torch.where(valid[:, None, None], y, torch.zeros_like(y)))
    return out


def mamba2_update_snapshots(state, x, dt, A, B, C, out, snapshots, D=None, z=None, dt_bias=None,
                            dt_softplus: bool = False, slots=None, pad_slot_id: int = -1):
    """Conventional speculative step, as engines run it today: T tokens per row from state[slot], the
    state after every token written to snapshots (batch, T, H, P, N); the state itself is not written
    (the engine keeps the accepted snapshot). x, z, out (batch, T, H, P); dt (batch, T, H); B, C
    (batch, T, G, N). Token by token it is mamba2_update, so snapshot T-1 is mamba2_update's state.
    The baseline the replay verify/commit is measured against (one state read, T state writes)."""
    cd = _compute_dtype(state, x)
    batch, T = x.shape[:2]
    idx, valid = _resolve_rows(slots, batch, state.shape[0], pad_slot_id, state.device)
    work = state[idx].clone()                        # (batch, H, P, N): per-row copies, never written back
    rows = torch.arange(batch, device=state.device)
    for t in range(T):
        mamba2_update(work, x[:, t], dt[:, t], A, B[:, t], C[:, t], out[:, t], D,
                      None if z is None else z[:, t], dt_bias, dt_softplus, rows, -1)
        snapshots[:, t] = torch.where(valid[:, None, None, None], work, torch.zeros_like(work)).to(snapshots.dtype)
    out.masked_fill_(~valid[:, None, None, None], 0)
    return out


def _mamba2_fold_state(checkpoint, x_buf, B_buf, dt_buf, num_committed, A, idx, cd):
    """State after folding the first num_committed buffer entries into the checkpoint (fp32 or fp64):
        S = e^{Lambda_w} S_c + sum_j dt_j e^{Lambda_w - Lambda_j} x_j (outer) B_j,  Lambda_j = A sum_{i<=j} dt_i."""
    H, L = checkpoint.shape[1], x_buf.shape[2]
    w = num_committed[idx].long()
    _, before = _window_masks(w, 0, L, checkpoint.device)            # entries j < w
    dt = torch.where(before[:, None, :], dt_buf[idx].to(cd), 0.0)    # (b, H, L)
    cum = torch.cumsum(dt, dim=-1) * A.to(cd)[:, None]
    total = cum[..., -1:]                                             # Lambda_w (entries after w add 0)
    weight = dt * torch.exp(total - cum)
    xb = x_buf[idx].to(cd)                                            # (b, H, L, P)
    Bb = _expand_heads(B_buf[idx].to(cd), H, 1)                       # (b, H, L, N)
    s = torch.exp(total)[..., None] * checkpoint[idx].to(cd)
    return s + torch.einsum("bhl,bhlp,bhln->bhpn", weight, xb, Bb)


def _mamba2_fold(checkpoint, read_copy, read_scale, x_buf, B_buf, dt_buf, num_committed, A, idx, fold,
                 rounding_seed=None):
    """Fold the buffers of rows `fold` into their checkpoints, refresh their read copies (from the
    checkpoint as stored, so after any stochastic rounding), empty them."""
    idx = idx[fold]
    if idx.numel() == 0:
        return
    cd = _compute_dtype(checkpoint)
    state = _mamba2_fold_state(checkpoint, x_buf, B_buf, dt_buf, num_committed, A, idx, cd)
    _store_checkpoint(checkpoint, idx, state, rounding_seed)
    num_committed[idx] = 0
    if read_copy is not None:
        make_read_copy(checkpoint, read_copy, read_scale, idx)


def mamba2_verify(checkpoint, read_copy, read_scale, x_buf, B_buf, dt_buf, num_committed, num_verified,
                  x, dt, A, B, C, out, D=None, z=None, dt_bias=None, dt_softplus: bool = False,
                  slots=None, pad_slot_id: int = -1, error_word=None):
    """Outputs for T draft tokens per row; their entries go into the buffer after the committed
    history (positions w .. w+T-1). Never writes the checkpoint, read copy or cursor; sets
    num_verified[slot] to the entries appended (T, or 0 where the cursor leaves no room; pads: nothing).
    error_word: records the first row whose slot id is neither in range nor the pad id.

    x, z, out (batch, T, H, P); dt (batch, T, H); B, C (batch, T, G, N). For output position t:
        y_t = e^{Lambda_t} (S_read C_t) + sum_{j<=t} dt_j e^{Lambda_t - Lambda_j} (B_j . C_t) x_j + D x_t
    """
    cd = _compute_dtype(checkpoint, x)
    batch, T, H, _ = x.shape
    L = x_buf.shape[2]
    idx, valid = _resolve_rows(slots, batch, checkpoint.shape[0], pad_slot_id, checkpoint.device)
    w = torch.where(valid, num_committed[idx].long(), 0)
    named, valid = valid, valid & (w >= 0) & (w + T <= L)
    _record_verified(num_verified, idx, named, valid, T)
    if error_word is not None:
        codes, ids = _slot_errors(slots, batch, checkpoint.shape[0], pad_slot_id, ERROR_VERIFY_SLOT, x.device)
        _record_error(error_word, codes, ids, torch.full_like(ids, checkpoint.shape[0]))
    w = torch.where(valid, w, 0)
    pos = w[:, None] + torch.arange(T, device=x.device)[None, :]      # (batch, T)

    dts = _mamba2_dt(dt, dt_bias, dt_softplus, cd)                    # (batch, T, H)
    _put_entries(x_buf, idx[valid], pos[valid], x[valid])
    _put_entries(B_buf, idx[valid], pos[valid], B[valid])
    _put_entries(dt_buf, idx[valid], pos[valid], dts[valid])

    # The window every output reads: committed history plus this call's drafts (pad rows read slot 0).
    xb = x_buf[idx].to(cd)
    Bb = _expand_heads(B_buf[idx].to(cd), H, 1)
    dtb = dt_buf[idx].to(cd)
    s_read = _read_state(checkpoint, read_copy, read_scale, idx, cd)
    A = A.to(cd)
    for i in range(T):
        upto, _ = _window_masks(w, i, L, x.device)
        dt_i = torch.where(upto[:, None, :], dtb, 0.0)
        cum = torch.cumsum(dt_i, dim=-1) * A[:, None]
        total = cum[..., -1:]
        weight = dt_i * torch.exp(total - cum)                        # (batch, H, L)
        Ct = _expand_heads(C[:, i].to(cd), H, 1)                      # (batch, H, N)
        y = torch.exp(total) * torch.einsum("bhpn,bhn->bhp", s_read, Ct)
        y = y + torch.einsum("bhl,bhln,bhn,bhlp->bhp", weight, Bb, Ct, xb)
        y = _mamba2_finish_output(y, x[:, i].to(cd), D, None if z is None else z[:, i], cd)
        out[:, i] = torch.where(valid[:, None, None], y, torch.zeros_like(y))
    return out


def mamba2_commit(checkpoint, read_copy, read_scale, x_buf, B_buf, dt_buf, num_committed, num_verified,
                  num_accepted, A, max_draft_tokens: int, slots=None, pad_slot_id: int = -1,
                  rounding_seed=None, error_word=None) -> None:
    """Accept the first num_accepted[r] verified entries of each row (a cursor move), then fold the
    slots where the next verify of max_draft_tokens would not fit (flush-early rule). num_accepted is
    clamped to [0, num_verified[slot]] (what the slot's last verify appended), and num_verified[slot]
    becomes 0: a second commit without a verify accepts nothing.
    rounding_seed: stochastic rounding of a bf16 / fp16 checkpoint's folds; offset += 1 per call.
    error_word: records the first row whose slot id is neither in range nor the pad id, or whose
    num_accepted lies outside [0, num_verified[slot]]."""
    _check_rounding_seed(checkpoint, rounding_seed)
    idx, fold = _commit_cursors(num_committed, num_verified, num_accepted, x_buf.shape[2], max_draft_tokens,
                                slots, pad_slot_id, error_word)
    _mamba2_fold(checkpoint, read_copy, read_scale, x_buf, B_buf, dt_buf, num_committed, A, idx, fold,
                 rounding_seed)
    _advance_rounding_offset(rounding_seed)


def _rows_folding_after_append(num_committed, x_buf, slots, batch, pad_slot_id, max_draft_tokens):
    """Rows of a T=1 step whose slot folds in that step, and the cursors as they are after the append."""
    L = x_buf.shape[2]
    idx, valid = _resolve_rows(slots, batch, num_committed.shape[0], pad_slot_id, num_committed.device)
    w = num_committed[idx].long()
    valid = valid & (w >= 0) & (w + 1 <= L)
    counts = num_committed.clone()
    counts[idx[valid]] += 1
    return idx, valid & (w + 1 + max_draft_tokens > L), counts


def mamba2_step(checkpoint, read_copy, read_scale, x_buf, B_buf, dt_buf, num_committed,
                x, dt, A, B, C, out, D=None, z=None, dt_bias=None, dt_softplus: bool = False,
                max_draft_tokens: int = 1, slots=None, pad_slot_id: int = -1, rounding_seed=None,
                staggered_flush: bool = False):
    """T=1 decode: output from the read state + buffer + token, append, fold when the buffer is full.
    x, z, out (batch, H, P); dt (batch, H); B, C (batch, G, N).

    verify(T=1) followed by commit(1), with one difference: on a step that folds, the output comes
    from the freshly folded full-precision state, y = S_new C + D x (the fused kernel reads the
    checkpoint for the fold anyway, so this output is the more exact one and costs nothing).
    rounding_seed: as in mamba2_commit (the step's fold rounds with it; offset += 1 per call).
    staggered_flush: the CUDA kernel's launch hint (ops.mamba2_step); no effect on the results here."""
    _check_rounding_seed(checkpoint, rounding_seed)
    verified = torch.zeros_like(num_committed)     # the step's own verify(T=1) and commit(1)
    mamba2_verify(checkpoint, read_copy, read_scale, x_buf, B_buf, dt_buf, num_committed, verified,
                  x[:, None], dt[:, None], A, B[:, None], C[:, None], out[:, None], D,
                  None if z is None else z[:, None], dt_bias, dt_softplus, slots, pad_slot_id)
    idx, folding, counts = _rows_folding_after_append(num_committed, x_buf, slots, x.shape[0], pad_slot_id,
                                                      max_draft_tokens)
    if bool(folding.any()):
        cd = _compute_dtype(checkpoint, x)
        rows = folding.nonzero().flatten()
        state = _mamba2_fold_state(checkpoint, x_buf, B_buf, dt_buf, counts, A, idx[rows], cd)
        Ch = _expand_heads(C[rows].to(cd), checkpoint.shape[1], 1)
        y = _mamba2_finish_output(torch.einsum("bhpn,bhn->bhp", state, Ch), x[rows].to(cd), D,
                                  None if z is None else z[rows], cd)
        out[rows] = y.to(out.dtype)
    ones = torch.ones(x.shape[0], dtype=torch.int32, device=x.device)
    mamba2_commit(checkpoint, read_copy, read_scale, x_buf, B_buf, dt_buf, num_committed, verified, ones, A,
                  max_draft_tokens, slots, pad_slot_id, rounding_seed)
    return out


def mamba2_flush(checkpoint, read_copy, read_scale, x_buf, B_buf, dt_buf, num_committed, A,
                 slots=None, pad_slot_id: int = -1, rounding_seed=None) -> None:
    """Fold everything committed into the checkpoint of the named slots (all when None).
    rounding_seed: as in mamba2_commit."""
    _check_rounding_seed(checkpoint, rounding_seed)
    idx, fold = _rows_to_flush(num_committed, x_buf.shape[2], slots, pad_slot_id)
    _mamba2_fold(checkpoint, read_copy, read_scale, x_buf, B_buf, dt_buf, num_committed, A, idx, fold,
                 rounding_seed)
    _advance_rounding_offset(rounding_seed)


def mamba2_materialize(checkpoint, x_buf, B_buf, dt_buf, num_committed, A, out,
                       slots=None, pad_slot_id: int = -1):
    """Full-precision state at the committed position of each row's slot, into out (batch, H, P, N).
    The cache is not changed. Pad rows get zeros."""
    idx, valid = _resolve_rows(slots, out.shape[0], checkpoint.shape[0], pad_slot_id, checkpoint.device)
    w = num_committed[idx].long()
    valid = valid & (w >= 0) & (w <= x_buf.shape[2])
    state = _mamba2_fold_state(checkpoint, x_buf, B_buf, dt_buf, num_committed, A, idx,
                               _compute_dtype(checkpoint, out))
    out.copy_(torch.where(valid[:, None, None, None], state, torch.zeros_like(state)))
    return out


# --------------------------------------------------------------------------------------------------
# Gated DeltaNet and KDA (one delta rule; KDA's decay is per key channel)
# --------------------------------------------------------------------------------------------------

def _delta_keys(k, use_qk_l2norm: bool, cd):
    k = k.to(cd)
    if use_qk_l2norm:
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + L2NORM_EPS)
    return k


def _delta_gates(a, b, A_log, dt_bias, cd):
    """g = -exp(A_log) * softplus(a + dt_bias) (GDN: per v-head; KDA: per v-head and key channel),
    beta = sigmoid(b)."""
    A = torch.exp(A_log.to(cd))
    per_channel = dt_bias.dim() == 2   # KDA: dt_bias (HV, K) and a (..., HV, K); GDN: (HV,), (..., HV)
    g = -(A[:, None] if per_channel else A) * F.softplus(a.to(cd) + dt_bias.to(cd))
    return g, torch.sigmoid(b.to(cd))


def delta_update(state, q, k, v, a, b, A_log, dt_bias, out, scale=None, use_qk_l2norm: bool = True,
                 slots=None, pad_slot_id: int = -1):
    """Conventional T=1 decode of Gated DeltaNet (a: (batch, HV)) or KDA (a: (batch, HV, K)).

    state (slots, HV, V, K); q, k (batch, H, K); v, out (batch, HV, V); b (batch, HV);
    A_log (HV,); dt_bias (HV,) GDN or (HV, K) KDA. Per v-head (k-head hv // (HV/H)):
        S = S * exp(g) ; u = beta * (v - S k) ; S = S + u (outer) k ; o = S q
    """
    cd = _compute_dtype(state, q)
    HV, K = state.shape[1], state.shape[3]
    scale = K ** -0.5 if scale is None else scale
    idx, valid = _resolve_rows(slots, q.shape[0], state.shape[0], pad_slot_id, state.device)
    qn = _expand_heads(_delta_keys(q, use_qk_l2norm, cd) * scale, HV, 1)
    kn = _expand_heads(_delta_keys(k, use_qk_l2norm, cd), HV, 1)
    g, beta = _delta_gates(a, b, A_log, dt_bias, cd)
    alpha = torch.exp(g if dt_bias.dim() == 2 else g[..., None])          # (batch, HV, K or 1)
    s = state[idx].to(cd) * alpha[:, :, None, :]
    u = beta[..., None] * (v.to(cd) - torch.einsum("bhvk,bhk->bhv", s, kn))
    s = s + u[..., None] * kn[:, :, None, :]
    o = torch.einsum("bhvk,bhk->bhv", s, qn)
    state[idx[valid]] = s[valid].to(state.dtype)
    out.copy_(torch.where(valid[:, None, None], o, torch.zeros_like(o)))
    return out


def delta_update_snapshots(state, q, k, v, a, b, A_log, dt_bias, out, snapshots, scale=None,
                           use_qk_l2norm: bool = True, slots=None, pad_slot_id: int = -1):
    """Conventional speculative step of GDN / KDA, as engines run it today: T tokens per row from
    state[slot], the state after every token written to snapshots (batch, T, HV, V, K); the state itself
    is not written (the engine keeps the accepted snapshot). q, k (batch, T, H, K); v, out
    (batch, T, HV, V); a (batch, T, HV) GDN or (batch, T, HV, K) KDA; b (batch, T, HV). Token by token it
    is delta_update: the state is rounded to its dtype after every token (the snapshot) and the next
    token starts from the rounded value, so snapshot T-1 is T calls of delta_update's state. The
    baseline the replay verify/commit is measured against (one state read, T state writes)."""
    batch, T = q.shape[:2]
    idx, valid = _resolve_rows(slots, batch, state.shape[0], pad_slot_id, state.device)
    work = state[idx].clone()                        # (batch, HV, V, K): per-row copies, never written back
    rows = torch.arange(batch, device=state.device)
    for t in range(T):
        delta_update(work, q[:, t], k[:, t], v[:, t], a[:, t], b[:, t], A_log, dt_bias, out[:, t], scale,
                     use_qk_l2norm, rows, -1)
        snapshots[:, t] = torch.where(valid[:, None, None, None], work, torch.zeros_like(work)).to(snapshots.dtype)
    out.masked_fill_(~valid[:, None, None, None], 0)
    return out


def _delta_window(k_buf, g_buf, idx, HV: int, use_qk_l2norm: bool, cd):
    """Normalised keys (b, HV, L, K) and per-channel log decays (b, HV, L, K or 1) of the window."""
    kb = _expand_heads(_delta_keys(k_buf[idx], use_qk_l2norm, cd), HV, 1)
    gb = g_buf[idx].to(cd)
    return kb, (gb if gb.dim() == 4 else gb[..., None])


def _delta_decays(gb, mask):
    """Cumulative log decay Lambda up to the last entry in `mask` (b, HV, 1, K) and, per entry j in
    the mask, e^{Lambda - Lambda_j} (b, HV, L, K); zero outside the mask."""
    g = torch.where(mask[:, None, :, None], gb, 0.0)
    cum = torch.cumsum(g, dim=2)
    total = cum[:, :, -1:, :]
    rel = torch.where(mask[:, None, :, None], torch.exp(total - cum), 0.0)
    return total, rel


def _delta_corrected_value(s_read, kb, gb, ub, vb, betab, t, mask_upto, mask_before):
    """u_t = beta_t (v_t - S'_{t-1} k_t), with S'_{t-1} the state before token t already decayed by
    token t's gate, written as the read state times a decayed vector plus the buffer's corrections:
        S' k_t = S_read (e^{Lambda_t} k_t) + sum_{j<t} u_j ((k_j * e^{Lambda_t - Lambda_j}) . k_t)
    t, mask_*: per row; returns u_t (b, HV, V) and the decays used (for the readout)."""
    total, rel = _delta_decays(gb, mask_upto)
    k_t = _take_entry(kb, t)                                               # (b, HV, K)
    sk = torch.einsum("bhvk,bhk->bhv", s_read, torch.exp(total[:, :, 0]) * k_t)
    dots = torch.where(mask_before[:, None, :], torch.einsum("bhlk,bhk->bhl", kb * rel, k_t), 0.0)
    sk = sk + torch.einsum("bhl,bhlv->bhv", dots, torch.where(mask_before[:, None, :, None], ub, 0.0))
    u_t = _take_entry(betab, t)[..., None] * (_take_entry(vb, t) - sk)
    return u_t, total, rel


def _delta_set_entry(window, t, value) -> None:
    rows = torch.arange(window.shape[0], device=window.device)
    window.transpose(1, 2)[rows, t] = value


def _delta_fold_state(checkpoint, k_buf, v_buf, g_buf, beta_buf, u_buf, num_committed, idx,
                      use_qk_l2norm: bool, recompute_u: bool, cd):
    """State after folding the committed entries into the checkpoint:
        S = S_c diag(e^{Lambda_w}) + sum_{j<w} u_j (outer) (k_j * e^{Lambda_w - Lambda_j}).
    With recompute_u (a read copy served the window) every u_j is first recomputed in order from the
    full-precision checkpoint, so read-copy rounding never reaches the state (docs/DESIGN.md section 2)."""
    HV, L = checkpoint.shape[1], k_buf.shape[2]
    w = num_committed[idx].long()
    s_c = checkpoint[idx].to(cd)
    kb, gb = _delta_window(k_buf, g_buf, idx, HV, use_qk_l2norm, cd)
    ub = u_buf[idx].to(cd)
    if recompute_u:
        vb, betab = v_buf[idx].to(cd), beta_buf[idx].to(cd)
        for step in range(L):
            t = torch.full_like(w, step)
            mask_upto, mask_before = _window_masks(t, 0, L, checkpoint.device)
            u_t, _, _ = _delta_corrected_value(s_c, kb, gb, ub, vb, betab, t, mask_upto, mask_before)
            keep = (t < w)[:, None, None]
            _delta_set_entry(ub, t, torch.where(keep, u_t, _take_entry(ub, t)))
    _, committed = _window_masks(w, 0, L, checkpoint.device)
    total, rel = _delta_decays(gb, committed)
    s = s_c * torch.exp(total)
    ub = torch.where(committed[:, None, :, None], ub, 0.0)
    return s + torch.einsum("bhlv,bhlk->bhvk", ub, kb * rel)


def _delta_fold(checkpoint, read_copy, read_scale, k_buf, v_buf, g_buf, beta_buf, u_buf, num_committed,
                use_qk_l2norm: bool, idx, fold) -> None:
    idx = idx[fold]
    if idx.numel() == 0:
        return
    cd = _compute_dtype(checkpoint)
    state = _delta_fold_state(checkpoint, k_buf, v_buf, g_buf, beta_buf, u_buf, num_committed, idx,
                              use_qk_l2norm, read_copy is not None, cd)
    checkpoint[idx] = state.to(checkpoint.dtype)
    num_committed[idx] = 0
    if read_copy is not None:
        make_read_copy(checkpoint, read_copy, read_scale, idx)


def delta_verify(checkpoint, read_copy, read_scale, k_buf, v_buf, g_buf, beta_buf, u_buf, num_committed,
                 num_verified, q, k, v, a, b, A_log, dt_bias, out, scale=None, use_qk_l2norm: bool = True,
                 slots=None, pad_slot_id: int = -1, error_word=None):
    """Outputs for T draft tokens of GDN (a: (batch, T, HV)) or KDA (a: (batch, T, HV, K)); entries
    (raw k, v, g, beta and the corrected value u in fp32) go into the buffer after the committed
    history. Never writes the checkpoint, read copy or cursor; sets num_verified[slot] to the entries
    appended (T, or 0 where the cursor leaves no room; pads: nothing).

    q, k (batch, T, H, K); v, out (batch, T, HV, V); b (batch, T, HV). For output position t:
        o_t = S_read (e^{Lambda_t} q_t) + sum_{j<=t} u_j ((k_j * e^{Lambda_t - Lambda_j}) . q_t)
    """
    cd = _compute_dtype(checkpoint, q)
    batch, T, H, K = q.shape
    HV, L = checkpoint.shape[1], k_buf.shape[2]
    scale = K ** -0.5 if scale is None else scale
    idx, valid = _resolve_rows(slots, batch, checkpoint.shape[0], pad_slot_id, checkpoint.device)
    w = torch.where(valid, num_committed[idx].long(), 0)
    named, valid = valid, valid & (w >= 0) & (w + T <= L)
    _record_verified(num_verified, idx, named, valid, T)
    if error_word is not None:
        codes, ids = _slot_errors(slots, batch, checkpoint.shape[0], pad_slot_id, ERROR_VERIFY_SLOT, q.device)
        _record_error(error_word, codes, ids, torch.full_like(ids, checkpoint.shape[0]))
    w = torch.where(valid, w, 0)
    pos = w[:, None] + torch.arange(T, device=q.device)[None, :]

    g, beta = _delta_gates(a, b, A_log, dt_bias, cd)                    # (batch, T, HV[, K])
    _put_entries(k_buf, idx[valid], pos[valid], k[valid])
    _put_entries(v_buf, idx[valid], pos[valid], v[valid])
    _put_entries(g_buf, idx[valid], pos[valid], g[valid])
    _put_entries(beta_buf, idx[valid], pos[valid], beta[valid])

    kb, gb = _delta_window(k_buf, g_buf, idx, HV, use_qk_l2norm, cd)
    vb, betab = v_buf[idx].to(cd), beta_buf[idx].to(cd)
    ub = u_buf[idx].to(cd)
    s_read = _read_state(checkpoint, read_copy, read_scale, idx, cd)
    qn = _expand_heads(_delta_keys(q, use_qk_l2norm, cd) * scale, HV, 2)   # (batch, T, HV, K)
    for i in range(T):
        t = w + i
        mask_upto, mask_before = _window_masks(w, i, L, q.device)
        u_t, total, rel = _delta_corrected_value(s_read, kb, gb, ub, vb, betab, t, mask_upto, mask_before)
        _delta_set_entry(ub, t, u_t)
        q_t = qn[:, i]
        o = torch.einsum("bhvk,bhk->bhv", s_read, torch.exp(total[:, :, 0]) * q_t)
        dots = torch.where(mask_upto[:, None, :], torch.einsum("bhlk,bhk->bhl", kb * rel, q_t), 0.0)
        o = o + torch.einsum("bhl,bhlv->bhv", dots, torch.where(mask_upto[:, None, :, None], ub, 0.0))
        out[:, i] = torch.where(valid[:, None, None], o, torch.zeros_like(o))
    rows = torch.arange(batch, device=q.device)[:, None]
    _put_entries(u_buf, idx[valid], pos[valid], ub.transpose(1, 2)[rows, pos][valid])
    return out


def delta_commit(checkpoint, read_copy, read_scale, k_buf, v_buf, g_buf, beta_buf, u_buf, num_committed,
                 num_verified, num_accepted, max_draft_tokens: int, use_qk_l2norm: bool = True,
                 slots=None, pad_slot_id: int = -1, error_word=None) -> None:
    """Accept num_accepted[r] verified entries per row, then fold where the next verify would not fit.
    As mamba2_commit: num_accepted is clamped to [0, num_verified[slot]], which then becomes 0;
    error_word records the first misuse."""
    idx, fold = _commit_cursors(num_committed, num_verified, num_accepted, k_buf.shape[2], max_draft_tokens, slots,
                                pad_slot_id, error_word)
    _delta_fold(checkpoint, read_copy, read_scale, k_buf, v_buf, g_buf, beta_buf, u_buf, num_committed,
                use_qk_l2norm, idx, fold)


def delta_step(checkpoint, read_copy, read_scale, k_buf, v_buf, g_buf, beta_buf, u_buf, num_committed,
               q, k, v, a, b, A_log, dt_bias, out, scale=None, use_qk_l2norm: bool = True,
               max_draft_tokens: int = 1, slots=None, pad_slot_id: int = -1, staggered_flush: bool = False):
    """T=1 decode of GDN/KDA: verify(T=1) followed by commit(1), except that on a step that folds the
    output is o = S_new q from the freshly folded full-precision state (as in mamba2_step).
    staggered_flush: the compiled kernel's launch hint (see mamba2_step); no effect on the results."""
    verified = torch.zeros_like(num_committed)     # the step's own verify(T=1) and commit(1)
    delta_verify(checkpoint, read_copy, read_scale, k_buf, v_buf, g_buf, beta_buf, u_buf, num_committed, verified,
                 q[:, None], k[:, None], v[:, None], a[:, None], b[:, None], A_log, dt_bias, out[:, None],
                 scale, use_qk_l2norm, slots, pad_slot_id)
    idx, folding, counts = _rows_folding_after_append(num_committed, k_buf, slots, q.shape[0], pad_slot_id,
                                                      max_draft_tokens)
    if bool(folding.any()):
        cd = _compute_dtype(checkpoint, q)
        HV, K = checkpoint.shape[1], checkpoint.shape[3]
        rows = folding.nonzero().flatten()
        state = _delta_fold_state(checkpoint, k_buf, v_buf, g_buf, beta_buf, u_buf, counts, idx[rows],
                                  use_qk_l2norm, read_copy is not None, cd)
        qn = _expand_heads(_delta_keys(q[rows], use_qk_l2norm, cd) * (K ** -0.5 if scale is None else scale), HV, 1)
        out[rows] = torch.einsum("bhvk,bhk->bhv", state, qn).to(out.dtype)
    ones = torch.ones(q.shape[0], dtype=torch.int32, device=q.device)
    delta_commit(checkpoint, read_copy, read_scale, k_buf, v_buf, g_buf, beta_buf, u_buf, num_committed,
                 verified, ones, max_draft_tokens, use_qk_l2norm, slots, pad_slot_id)
    return out


def delta_flush(checkpoint, read_copy, read_scale, k_buf, v_buf, g_buf, beta_buf, u_buf, num_committed,
                use_qk_l2norm: bool = True, slots=None, pad_slot_id: int = -1) -> None:
    """Fold everything committed into the checkpoint of the named slots (all when None)."""
    idx, fold = _rows_to_flush(num_committed, k_buf.shape[2], slots, pad_slot_id)
    _delta_fold(checkpoint, read_copy, read_scale, k_buf, v_buf, g_buf, beta_buf, u_buf, num_committed,
                use_qk_l2norm, idx, fold)


def delta_materialize(checkpoint, k_buf, v_buf, g_buf, beta_buf, u_buf, num_committed, out,
                      use_qk_l2norm: bool = True, slots=None, pad_slot_id: int = -1):
    """Full-precision state at the committed position, into out (batch, HV, V, K); cache unchanged.
    The corrected values are recomputed from the checkpoint (exact also when a read copy served them)."""
    idx, valid = _resolve_rows(slots, out.shape[0], checkpoint.shape[0], pad_slot_id, checkpoint.device)
    w = num_committed[idx].long()
    valid = valid & (w >= 0) & (w <= k_buf.shape[2])
    state = _delta_fold_state(checkpoint, k_buf, v_buf, g_buf, beta_buf, u_buf, num_committed, idx,
                              use_qk_l2norm, True, _compute_dtype(checkpoint, out))
    out.copy_(torch.where(valid[:, None, None, None], state, torch.zeros_like(state)))
    return out


# --------------------------------------------------------------------------------------------------
# Every Mamba-2 layer of a model at once (LayerCaches): the per-layer ops, layer by layer
# --------------------------------------------------------------------------------------------------

def _layer(lists, i):
    return lists[i] if len(lists) else None


def mamba2_commit_layers(layer_table, checkpoints, read_copies, read_scales, x_bufs, B_bufs, dt_bufs, num_committed,
                         num_verified, A, rounding_seeds, error_words, num_accepted, max_draft_tokens: int, slots=None,
                         pad_slot_id: int = -1) -> None:
    """mamba2_commit of every layer with the same num_accepted and slots. layer_table is not read here."""
    for i in range(len(checkpoints)):
        mamba2_commit(checkpoints[i], _layer(read_copies, i), _layer(read_scales, i), x_bufs[i], B_bufs[i], dt_bufs[i],
                      num_committed[i], num_verified[i], num_accepted, A[i], max_draft_tokens, slots, pad_slot_id,
                      _layer(rounding_seeds, i), _layer(error_words, i))


def mamba2_flush_layers(layer_table, checkpoints, read_copies, read_scales, x_bufs, B_bufs, dt_bufs, num_committed,
                        num_verified, A, rounding_seeds, error_words, slots=None, pad_slot_id: int = -1) -> None:
    """mamba2_flush of every layer. layer_table is not read here."""
    for i in range(len(checkpoints)):
        mamba2_flush(checkpoints[i], _layer(read_copies, i), _layer(read_scales, i), x_bufs[i], B_bufs[i], dt_bufs[i],
                     num_committed[i], A[i], slots, pad_slot_id, _layer(rounding_seeds, i))


def mamba2_materialize_layers(layer_table, checkpoints, read_copies, read_scales, x_bufs, B_bufs, dt_bufs,
                              num_committed, num_verified, A, rounding_seeds, error_words, out, slots=None,
                              pad_slot_id: int = -1) -> None:
    """mamba2_materialize of every layer into out[layer] (out: (layers, batch, H, P, N) fp32)."""
    for i in range(len(checkpoints)):
        mamba2_materialize(checkpoints[i], x_bufs[i], B_bufs[i], dt_bufs[i], num_committed[i], A[i], out[i], slots,
                           pad_slot_id)


# --------------------------------------------------------------------------------------------------
# Every GDN layer of a model at once (LayerCaches): the per-layer ops, layer by layer
# --------------------------------------------------------------------------------------------------

def gdn_commit_layers(layer_table, checkpoints, read_copies, read_scales, k_bufs, v_bufs, g_bufs, beta_bufs, u_bufs,
                      num_committed, num_verified, error_words, num_accepted, max_draft_tokens: int,
                      use_qk_l2norm: bool = True, slots=None, pad_slot_id: int = -1) -> None:
    """gdn_commit of every layer with the same num_accepted and slots. layer_table is not read here."""
    for i in range(len(checkpoints)):
        delta_commit(checkpoints[i], _layer(read_copies, i), _layer(read_scales, i), k_bufs[i], v_bufs[i], g_bufs[i],
                     beta_bufs[i], u_bufs[i], num_committed[i], num_verified[i], num_accepted, max_draft_tokens,
                     use_qk_l2norm, slots, pad_slot_id, _layer(error_words, i))


def gdn_flush_layers(layer_table, checkpoints, read_copies, read_scales, k_bufs, v_bufs, g_bufs, beta_bufs, u_bufs,
                     num_committed, num_verified, error_words, use_qk_l2norm: bool = True, slots=None,
                     pad_slot_id: int = -1) -> None:
    """gdn_flush of every layer. layer_table is not read here."""
    for i in range(len(checkpoints)):
        delta_flush(checkpoints[i], _layer(read_copies, i), _layer(read_scales, i), k_bufs[i], v_bufs[i], g_bufs[i],
                    beta_bufs[i], u_bufs[i], num_committed[i], use_qk_l2norm, slots, pad_slot_id)


def gdn_materialize_layers(layer_table, checkpoints, read_copies, read_scales, k_bufs, v_bufs, g_bufs, beta_bufs,
                           u_bufs, num_committed, num_verified, error_words, out, use_qk_l2norm: bool = True,
                           slots=None, pad_slot_id: int = -1) -> None:
    """gdn_materialize of every layer into out[layer] (out: (layers, batch, HV, V, K) fp32)."""
    for i in range(len(checkpoints)):
        delta_materialize(checkpoints[i], k_bufs[i], v_bufs[i], g_bufs[i], beta_bufs[i], u_bufs[i], num_committed[i],
                          out[i], use_qk_l2norm, slots, pad_slot_id)
