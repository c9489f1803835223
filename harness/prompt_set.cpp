#include "prompt_set.h"

#include <nlohmann/json.hpp>

#include <fstream>

namespace vericache::cli {

Result<std::vector<PromptEntry>> read_prompt_set(const std::string& path, int64_t count) {
  std::ifstream in(path);
  if (!in) {
    return Status::not_found(path + ": cannot read the prompt set (the long-code, long-docs, code-task and "
                                    "function-calling sets are made by harness/setup.sh, or python3 "
                                    "datasets/<set>/build_prompts.py)");
  }
  const auto j = nlohmann::json::parse(in, nullptr, false);
  if (!j.is_object() || !j.contains("prompts") || !j["prompts"].is_array()) {
    return Status::invalid_argument(path + ": not a prompt set (a JSON object with a \"prompts\" array)");
  }
  const auto available = static_cast<int64_t>(j["prompts"].size());
  if (count > available) {
    return Status::invalid_argument(path + " has " + std::to_string(available) + " prompts, " + std::to_string(count) +
                                    " asked (--prompts)");
  }
  std::vector<PromptEntry> out;
  for (int64_t i = 0; i < (count < 0 ? available : count); ++i) {
    const auto& p = j["prompts"][i];
    if (!p.is_object() || !p.contains("text") || !p["text"].is_string() || !p.contains("chat") || !p["chat"].is_boolean()) {
      return Status::invalid_argument(path + ": prompt " + std::to_string(i) + " needs \"text\" (string) and \"chat\" (boolean)");
    }
    out.push_back({p.value("name", ""), p["chat"].get<bool>(), p["text"].get<std::string>()});
  }
  return out;
}

}  // namespace vericache::cli
