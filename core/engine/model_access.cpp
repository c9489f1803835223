#include "engine/model_access.h"

#include <string>

namespace vericache {

Status LlamaModelAccess::run_without_keeping(std::span<const int32_t> tokens, std::span<const int32_t> positions,
                                             const std::function<Status(const LayerActivations&)>& observe) {
  const std::vector<int64_t> before = kv_.lengths();
  ForwardItem item{tokens, positions, &kv_, &pool_, LogitRows::kNone, request_id_};
  at::Tensor logits;
  // The observer is plugin code: what it throws becomes its error, and the rollback still runs.
  auto guarded = [&](const LayerActivations& acts) -> Status {
    try {
      return observe(acts);
    } catch (const std::exception& e) {
      const std::string what = e.what();
      return Status::plugin_error("run_without_keeping observer: " + what.substr(0, what.find('\n')));
    }
  };
  const Status status = model_.forward(std::span<const ForwardItem>(&item, 1), &logits, guarded);
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
  const size_t at = text.find(marker);
  return at == std::string::npos ? "\n" : text.substr(at + marker.size());
}

}  // namespace vericache
