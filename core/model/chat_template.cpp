#include "model/chat_template.h"

namespace vericache {

Result<ChatTemplate> ChatTemplate::from_gguf(const GgufFile& file) {
  VC_ASSIGN_OR_RETURN(std::string jinja, file.get_string("tokenizer.chat_template"));
  return from_string(jinja, file.path());
}

Result<ChatTemplate> ChatTemplate::from_string(const std::string& jinja, const std::string& origin) {
  const bool chatml = jinja.find("'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'") !=
                          std::string::npos &&
                      jinja.find("'<|im_start|>assistant\n'") != std::string::npos;
  if (!chatml) {
    return Status::not_supported(origin + ": chat template not recognised (ChatML is supported); "
                                          "run without the chat template (--no-chat-template)");
  }
  ChatTemplate t;
  t.format_ = "chatml";
  // SmolLM2: "{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n...<|im_end|>\n' }}"
  const std::string guard = "loop.first and messages[0]['role'] != 'system'";
  const std::string opener = "'<|im_start|>system\n";
  const size_t g = jinja.find(guard);
  if (g != std::string::npos) {
    const size_t begin = jinja.find(opener, g);
    const size_t end = begin == std::string::npos ? begin : jinja.find("<|im_end|>", begin);
    if (begin == std::string::npos || end == std::string::npos) {
      return Status::not_supported(origin + ": chat template has a default system message VeriCache cannot read; "
                                            "run without the chat template (--no-chat-template)");
    }
    t.default_system_ = jinja.substr(begin + opener.size(), end - begin - opener.size());
    t.format_ = "chatml+default-system";
  }
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
