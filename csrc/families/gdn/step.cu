// The GDN step's entry point: checks the params against its contract and picks the compiled (K, V)
// instantiation (instantiations/step_k<K>_v<V>.cu). The kernel is step_kernel.cuh.
#include "families/gdn/params.h"
#include "families/gdn/variants.h"

namespace replayssm {
namespace gdn {
template <int kK, int kV>
cudaError_t launch_step_shape(const GdnParams& p, cudaStream_t stream);
}  // namespace gdn

cudaError_t launch_gdn_step(const GdnParams& p, cudaStream_t stream) {
  if (p.batch == 0) return cudaSuccess;
  const GdnCache& c = p.cache;
  // KDA (GdnGate::kVector): g_buf's entries of K channels, 16-byte aligned for the fold's staging.
  if ((p.gate == GdnGate::kVector && (p.kda.gb_entry_stride < p.head_k_dim || p.kda.gb_entry_stride % 4 != 0)) || p.batch < 0 || p.batch > 65535 || p.heads < 1 || p.v_heads < 1 || p.v_heads % p.heads != 0 ||
      p.v_heads > 32767 || p.tokens.num_tokens != 1 || c.buffer_len < 1 || c.buffer_len > kGdnMaxBufferLen ||
      c.max_draft_tokens < 1 || c.max_draft_tokens > c.buffer_len || c.num_committed == nullptr) {
    return cudaErrorInvalidValue;
  }
  return REPLAYSSM_GDN_SHAPE_SWITCH(p.head_k_dim, p.head_v_dim, [&](auto K, auto V) {
    return gdn::launch_step_shape<decltype(K)::value, decltype(V)::value>(p, stream);
  });
}

}  // namespace replayssm
