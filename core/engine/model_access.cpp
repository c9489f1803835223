#include "engine/model_access.h"

namespace vericache {

Status LlamaModelAccess::run_without_keeping(std::span<const int32_t> tokens, std::span<const int32_t> positions,
                                             const std::function<Status(const LayerActivations&)>& observe) {
  const int64_t before = kv_.length(0);
  ForwardItem item{tokens, positions, &kv_, LogitRows::kNone, request_id_};
  at::Tensor logits;
  const Status status = model_.forward(std::span<const ForwardItem>(&item, 1), pool_, &logits, observe);
  kv_.truncate(pool_, before);  // the rollback: the extra tokens' K/V and pages are gone
  return status;
}

}  // namespace vericache
