// Chat formatting, applied by VeriCache's own code rather than a template engine.
//
// The GGUF `tokenizer.chat_template` (a Jinja template) is recognised, not executed: from_gguf()
// identifies its format and any default it carries, and render() produces the same text the
// template would. Recognised: ChatML ("<|im_start|>{role}\n{content}<|im_end|>\n", generation
// prompt "<|im_start|>assistant\n"), including the SmolLM2 variant that inserts a default system
// message when the conversation does not start with one. Any other template is NotSupported, with
// a hint to run without the chat template.
// Thread-safety: immutable after construction.
#pragma once

#include <string>
#include <vector>

#include <vericache/status.h>

#include "model/gguf_file.h"

namespace vericache {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

class ChatTemplate {
 public:
  static Result<ChatTemplate> from_gguf(const GgufFile& file);
  // Parses a template string directly (what from_gguf reads from the file).
  static Result<ChatTemplate> from_string(const std::string& jinja, const std::string& origin);

  // The prompt text for `messages`, ending with the assistant's turn opener when
  // add_generation_prompt is set. Special tokens appear as text; encode with parse_special.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;

  const std::string& format_name() const { return format_; }
  // "" when the template inserts none.
  const std::string& default_system_message() const { return default_system_; }

 private:
  std::string format_;
  std::string default_system_;
};

}  // namespace vericache
