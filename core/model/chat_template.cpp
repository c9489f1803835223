#include "model/chat_template.h"

namespace vericache {

Result<ChatTemplate> ChatTemplate::from_gguf(const GgufFile& file) {
  VC_ASSIGN_OR_RETURN(std::string jinja, file.get_string("tokenizer.chat_template"));
  return from_string(jinja, file.path());
}

Result<ChatTemplate> ChatTemplate::from_string(const std::string& jinja, const std::string& origin) {
  // The message line of ChatML templates: SmolLM2 indexes the message, Qwen2.5 uses attributes.
  const bool smollm = jinja.find("'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'") !=
                      std::string::npos;
  // Qwen2.5's template writes the newlines in its string literals as escapes (backslash, n).
  const bool qwen = jinja.find("'<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n'") !=
                    std::string::npos;
  const std::string nl = qwen ? "\\n" : "\n";
  if (!(smollm || qwen) || jinja.find("'<|im_start|>assistant" + nl + "'") == std::string::npos) {
    return Status::not_supported(origin + ": chat template not recognised (ChatML is supported); "
                                          "run without the chat template (--no-chat-template)");
  }
  ChatTemplate t;
  t.format_ = "chatml";
  const std::string opener = "'<|im_start|>system" + nl;
  const Status unreadable = Status::not_supported(
      origin + ": chat template has a default system message VeriCache cannot read; "
               "run without the chat template (--no-chat-template)");
  if (smollm) {
    // "{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n...<|im_end|>\n' }}"
    const size_t g = jinja.find("loop.first and messages[0]['role'] != 'system'");
    if (g == std::string::npos) return t;
    const size_t begin = jinja.find(opener, g);
    const size_t end = begin == std::string::npos ? begin : jinja.find("<|im_end|>", begin);
    if (begin == std::string::npos || end == std::string::npos) return unreadable;
    t.default_system_ = jinja.substr(begin + opener.size(), end - begin - opener.size());
  } else {
    // Qwen2.5: "{%- else %}{{- '<|im_start|>system\nYou are Qwen, ...<|im_end|>\n' }}" when the first
    // message is not a system message: the one system literal that is a whole message.
    for (size_t begin = jinja.find(opener); begin != std::string::npos; begin = jinja.find(opener, begin + 1)) {
      const size_t end = jinja.find("<|im_end|>" + nl + "'", begin);
      const std::string text = jinja.substr(begin + opener.size(), end - begin - opener.size());
      if (end != std::string::npos && !text.empty() && text.find('\'') == std::string::npos) {
        t.default_system_ = text;
        break;
      }
    }
    if (t.default_system_.empty()) return unreadable;
  }
  t.format_ = "chatml+default-system";
  return t;
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  std::string out;
  // The template inserts it inside its message loop, so only when there is a first message.
  if (!default_system_.empty() && !messages.empty() && messages.front().role != "system") {
    out += "<|im_start|>system\n" + default_system_ + "<|im_end|>\n";
  }
  for (const ChatMessage& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace vericache
