// The per-CTA time line's sink (cta_timeline_api.h): a diagnostic build's only host state. Calls are
// made from one Python thread in tools/cta_timeline.py; a captured CUDA graph keeps the record set
// each launch took at capture time, so its replays write there again.
#include "api/cta_timeline_api.h"

#if REPLAYSSM_CTA_TIMELINE
#include <c10/util/Exception.h>

#include "kernels/cta_timeline.cuh"

namespace replayssm {
namespace {
struct Sink {
  int64_t* base = nullptr;
  int64_t launches = 0, ctas = 0, next = 0;
};
Sink sink;
}  // namespace

void set_cta_timeline(const std::optional<at::Tensor>& buffer) {
  sink = Sink{};
  if (!buffer.has_value()) return;
  const at::Tensor& b = *buffer;
  TORCH_CHECK(b.is_cuda() && b.scalar_type() == at::kLong && b.dim() == 3 && b.size(2) == kCtaTimelineWords &&
                  b.is_contiguous(),
              "set_cta_timeline: buffer must be a contiguous int64 CUDA tensor [launches, ctas, ", kCtaTimelineWords,
              "], got ", b.scalar_type(), " ", b.sizes(), " on ", b.device());
  sink.base = b.data_ptr<int64_t>();
  sink.launches = b.size(0);
  sink.ctas = b.size(1);
}

int64_t cta_timeline_launches() { return sink.next; }

void attach_cta_timeline(Mamba2Params& p) {
  p.cta_timeline = nullptr;
  p.cta_timeline_ctas = 0;
  if (sink.base == nullptr || sink.next >= sink.launches) return;
  p.cta_timeline = sink.base + sink.next * sink.ctas * kCtaTimelineWords;
  p.cta_timeline_ctas = sink.ctas;
  ++sink.next;
}

}  // namespace replayssm
#endif
