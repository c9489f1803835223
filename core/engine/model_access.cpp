#include "engine/model_access.h"

#include <string>

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

std::vector<int32_t> LlamaModelAccess::tokenize(const std::string& text) const {
  return model_.tokenizer().encode(text, /*parse_special=*/true);
}

std::string LlamaModelAccess::assistant_header() const {
  auto chat = model_.chat_template();
  if (!chat.ok()) return "\n";
  // The text the template puts after a user message's content, up to the assistant's turn.
  const std::string marker = "\x01vericache-marker\x01";
  const std::string text = chat->render({{"user", marker}}, /*add_generation_prompt=*/true);
  return text.substr(text.find(marker) + marker.size());
}

}  // namespace vericache
