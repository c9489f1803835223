#include "bench_support.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <numeric>
#include <sstream>

#include <ATen/ATen.h>

#include "cli_common.h"
#include "prompt_set.h"
#include "engine/compression.h"
#include "engine/full_kv_comparison.h"
#include "engine/sampler.h"
#include "util/mapped_file.h"

namespace vericache::cli {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Result<std::vector<std::shared_ptr<Compressor>>> load_offline_compressors(const std::string& names,
                                                                          const std::vector<std::string>& params,
                                                                          const LlamaModel& model) {
  const std::vector<std::string> list = split_list(names);
  if (list.empty()) return Status::invalid_argument("--compressors is empty");
  std::map<std::string, std::string> json;
  for (const std::string& p : params) {
    const size_t eq = p.find('=');
    if (eq == std::string::npos || eq == 0) return Status::invalid_argument("--params must be NAME=JSON, got '" + p + "'");
    const std::string name = p.substr(0, eq);
    if (std::find(list.begin(), list.end(), name) == list.end()) {
      return Status::invalid_argument("--params names " + name + ", which is not in --compressors " + names);
    }
    json[name] = p.substr(eq + 1);
  }
  std::vector<std::shared_ptr<Compressor>> out;
  for (const std::string& name : list) {
    VC_ASSIGN_OR_RETURN(std::shared_ptr<Compressor> c,
                        load_compressor_for(name, json.count(name) ? json[name] : "{}", {}, model));
    if (c->mode() != CompressionMode::kOffline && c->family() != CompressorFamily::kQuantization) {
      return Status::invalid_argument(name + " is an online compressor; this benchmark compresses once after prefill");
    }
    out.push_back(std::move(c));
  }
  return out;
}

Status check_contexts_fit(const LlamaModel& model, const std::vector<int64_t>& contexts, int64_t decode_tokens,
                          int64_t window) {
  const int64_t limit = model.config().context_length;
  for (int64_t context : contexts) {
    if (context + decode_tokens + window > limit) {
      return Status::invalid_argument("context " + std::to_string(context) + " + " + std::to_string(decode_tokens) +
                                      " decode tokens + a verify window of " + std::to_string(window) +
                                      " exceeds the model's context of " + std::to_string(limit) + " tokens");
    }
  }
  return Status();
}

Result<std::vector<int32_t>> bench_corpus(const LlamaModel& model, const std::string& text_files, int64_t tokens_needed) {
  std::string text;
  std::stringstream list(text_files);
  for (std::string path; std::getline(list, path, ',');) {
    if (!text.empty()) text += "\n\n";
    if (path.size() > 5 && path.compare(path.size() - 5, 5, ".json") == 0) {
      VC_ASSIGN_OR_RETURN(const std::vector<PromptEntry> prompts, read_prompt_set(path));
      for (size_t i = 0; i < prompts.size(); ++i) text += (i ? "\n\n" : "") + prompts[i].text;
    } else {
      VC_ASSIGN_OR_RETURN(MappedFile file, MappedFile::open(path));
      text.append(reinterpret_cast<const char*>(file.data()), file.size());
    }
  }
  std::vector<int32_t> corpus = model.tokenizer().encode(text, false);
  if (static_cast<int64_t>(corpus.size()) < tokens_needed) {
    return Status::invalid_argument(text_files + " has " + std::to_string(corpus.size()) + " tokens, fewer than the " +
                                    std::to_string(tokens_needed) + " the prompts need");
  }
  return corpus;
}

Result<std::vector<int32_t>> bench_prompt(const LlamaModel& model, const std::vector<int32_t>& corpus, int64_t context,
                                          const std::string& question) {
  if (question.empty()) return std::vector<int32_t>(corpus.begin(), corpus.begin() + context);
  const auto text_of = [&](int64_t n) {
    return question + "\n\n" + model.tokenizer().decode(std::span(corpus).first(n), false);
  };
  VC_ASSIGN_OR_RETURN(std::vector<int32_t> whole, prompt_tokens(model, text_of(context), false, ""));
  const int64_t overhead = static_cast<int64_t>(whole.size()) - context;  // template and question
  if (overhead >= context) {
    return Status::invalid_argument("the question and chat template take " + std::to_string(overhead) +
                                    " tokens, more than the context " + std::to_string(context));
  }
  return prompt_tokens(model, text_of(context - overhead), false, "");
}

Status prefill_observed(const LlamaModel& model, PagePool& pool, SequenceKv& kv, std::span<const int32_t> prompt,
                        int64_t chunk, std::span<const std::shared_ptr<Compressor>> compressors, double ratio,
                        std::vector<float>* next_logits) {
  const auto n = static_cast<int64_t>(prompt.size());
  const std::vector<double> ratios{ratio};
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t count = std::min(chunk, n - begin);
    std::vector<int32_t> positions(count);
    std::iota(positions.begin(), positions.end(), static_cast<int32_t>(begin));
    const ForwardItem item{prompt.subspan(begin, count), positions, &kv, &pool, LogitRows::kLast, 0};
    std::vector<std::vector<LayerDrops>> drops(compressors.size());
    std::vector<LayerObserver> observers;
    for (size_t c = 0; c < compressors.size(); ++c) {
      observers.push_back(compression_observer(*compressors[c], ratios, &drops[c]));
    }
    at::Tensor logits;
    VC_RETURN_IF_ERROR(model.forward(std::span(&item, 1), &logits, [&](const LayerActivations& acts) {
      for (const LayerObserver& o : observers) VC_RETURN_IF_ERROR(o(acts));
      return Status();
    }));
    const float* row = logits[0].data_ptr<float>();
    next_logits->assign(row, row + model.config().vocab_size);
  }
  return Status();
}

int64_t count_mismatches(const std::vector<EngineResult>& results, const std::vector<std::vector<int32_t>>& want) {
  int64_t n = 0;
  for (const EngineResult& r : results)
    n += diff_tokens(r.generation.tokens, want.at(static_cast<size_t>(r.request_id))).mismatched_tokens;
  return n;
}

double FullKvDecode::step_ms() const {
  return !tokens.empty() && tokens[0].size() > 1 ? 1e3 * seconds / static_cast<double>(tokens[0].size() - 1) : 0.0;
}

double FullKvDecode::tok_s() const {
  return seconds > 0 && !tokens.empty()
             ? static_cast<double>(tokens.size()) * static_cast<double>(tokens[0].size() - 1) / seconds
             : 0.0;
}

Result<FullKvDecode> decode_full_kv(const LlamaModel& model, std::span<const PrefilledPrompt> prompts,
                                    const PagePool& base_pool, int64_t decode_tokens, int64_t page_size) {
  const int64_t layers = model.config().n_layers, vocab = model.config().vocab_size;
  const int64_t batch = static_cast<int64_t>(prompts.size());
  int64_t pages = 0;
  for (const PrefilledPrompt& p : prompts) pages += layers * ((p.kv->length(0) + decode_tokens) / page_size + 2);
  VC_ASSIGN_OR_RETURN(PagePool pool, model.make_page_pool(page_size, pages));
  std::vector<SequenceKv> caches(batch, SequenceKv(layers));
  std::vector<std::vector<int32_t>> tokens(batch);
  for (int64_t i = 0; i < batch; ++i) {
    const PrefilledPrompt& p = prompts[i];
    VC_RETURN_IF_ERROR(caches[i].append_range(pool, *p.kv, base_pool, 0, p.kv->length(0)));
    tokens[i].push_back(argmax(p.next_logits.data(), vocab));
  }
  const double start = now_seconds();
  for (int64_t step = 1; step < decode_tokens; ++step) {
    std::vector<ForwardItem> items;
    std::vector<std::vector<int32_t>> positions(batch);
    for (int64_t i = 0; i < batch; ++i) {
      positions[i] = {static_cast<int32_t>(prompts[i].kv->length(0) + step - 1)};
      items.push_back({std::span(tokens[i]).last(1), positions[i], &caches[i], &pool, LogitRows::kLast, i});
    }
    at::Tensor logits;
    VC_RETURN_IF_ERROR(model.forward(items, &logits));
    for (int64_t i = 0; i < batch; ++i) tokens[i].push_back(argmax(logits[i].data_ptr<float>(), vocab));
  }
  FullKvDecode out;
  out.seconds = now_seconds() - start;
  for (int64_t i = 0; i < batch; ++i) {
    for (int64_t j = 0; j < i; ++j) {
      if (prompts[i].kv == prompts[j].kv && tokens[i] != tokens[j])
        return Status::internal("full-KV decoding of identical requests differs across the batch");
    }
  }
  out.tokens = std::move(tokens);
  for (SequenceKv& kv : caches) kv.release(pool);
  return out;
}

}  // namespace vericache::cli
