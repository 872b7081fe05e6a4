// The cursor of a slot (num_committed[slot]: committed buffer entries since its checkpoint) and the
// rules every family's ops keep with it.
//
// Flush-early rule: an op that advances a cursor folds the buffer into the checkpoint as soon as the
// next verify of max_draft_tokens entries would not fit (num_committed + max_draft_tokens > L), so
// num_committed + max_draft_tokens <= L holds between ops.
//
// Tickets: the CTAs of a slot (one per block of its heads) all read its cursor, so none may move it
// while another may still read it. Each CTA adds kTicket to num_committed[slot] once all its threads
// have read it; the CTA whose atomic returns the last ticket writes the new cursor, which clears the
// tickets. Nothing survives the launch (at most 32767 CTAs per slot).
#pragma once

#include <cstdint>

namespace replayssm {

// num_committed[slot] during a launch that takes tickets: the cursor in the low 16 bits, tickets above.
constexpr int32_t kTicket = 1 << 16;
constexpr int32_t kCursorMask = kTicket - 1;

// Whether a step whose cursor is w (w < L buffered entries) folds: after appending its token, the
// buffer must keep room for the largest draft a verify may append.
__device__ __forceinline__ bool folds_after_append(int w, int max_draft_tokens, int L) {
  return w + 1 + max_draft_tokens > L;
}

}  // namespace replayssm
