// A prompt set: the JSON file every datasets/*/build_prompts.py writes and `vericache checklist
// --prompt-set` reads: {"source": ..., "sources_sha256": {...}, "prompts": [{"name", "chat", "text"}]}.
// "chat": true for a user message to wrap in the model's chat template, false for raw text.
//
// Thread-safety: pure function (reads one file). Failure: NotFound when the file cannot be read
// (the message says how the built sets are made); InvalidArgument naming the file for another
// shape, a prompt without "text" (string) and "chat" (boolean), or fewer prompts than asked.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <vericache/status.h>

namespace vericache::cli {

struct PromptEntry {
  std::string name;
  bool chat = true;
  std::string text;
};

// The first `count` prompts of the set at `path` (every prompt when count < 0).
Result<std::vector<PromptEntry>> read_prompt_set(const std::string& path, int64_t count = -1);

}  // namespace vericache::cli
