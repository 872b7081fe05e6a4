// The per-CTA time line's sink (cta_timeline_api.h), compiled only into a diagnostic build: its host
// state and its two ops, torch.ops.replayssm_diag.set_cta_timeline(buffer) and
// torch.ops.replayssm_diag.cta_timeline_launches(). Calls are made from one Python thread
// (tools/cta_timeline.py); a captured CUDA graph keeps the record set each launch took at capture time,
// so its replays write there again.
#include <optional>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include "diag/cta_timeline.cuh"
#include "diag/cta_timeline_api.h"

namespace replayssm {
namespace {

struct Sink {
  int64_t* base = nullptr;
  int64_t launches = 0, ctas = 0, next = 0;
};
Sink sink;

// Records of the next launches go into buffer (int64 CUDA, [launches, ctas, kCtaTimelineWords]), launch
// k of those that follow into buffer[k]; launches past the last one write nothing. None: no time line.
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

// How many launches have taken a record set since set_cta_timeline.
int64_t cta_timeline_launches() { return sink.next; }

// The next record set into a launch's params (any family's: the same two fields).
template <class Params>
void attach_next(Params& p) {
  p.cta_timeline = nullptr;
  p.cta_timeline_ctas = 0;
  if (sink.base == nullptr || sink.next >= sink.launches) return;
  p.cta_timeline = sink.base + sink.next * sink.ctas * kCtaTimelineWords;
  p.cta_timeline_ctas = sink.ctas;
  ++sink.next;
}

}  // namespace

void attach_cta_timeline(Mamba2Params& p) { attach_next(p); }
void attach_cta_timeline(GdnParams& p) { attach_next(p); }

}  // namespace replayssm

TORCH_LIBRARY(replayssm_diag, m) {
  m.def("set_cta_timeline(Tensor? buffer) -> ()", &replayssm::set_cta_timeline);
  m.def("cta_timeline_launches() -> int", &replayssm::cta_timeline_launches);
}
