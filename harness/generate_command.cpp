// vericache generate: full-KV text generation on a GGUF model.
#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>
#include <memory>

#include "cli_common.h"
#include "commands.h"
#include "decoding_options.h"
#include "engine/generator.h"
#include "model/unicode.h"
#include "util/thread_pool.h"

namespace po = boost::program_options;

namespace vericache::cli {
namespace {

struct GenerateOptions : DecodingOptions {
  std::vector<std::string> stop;
  std::string device = "cpu";
  std::string dtype = "auto";
  std::string compressor;
  std::string params = "{}";
  double ratio = 1.0;
};

po::options_description describe(GenerateOptions& o) {
  po::options_description d("vericache generate: generate text with full-KV decoding\n\nOptions");
  add_decoding_options(d, o);
  // clang-format off
  d.add_options()
    ("stop", po::value(&o.stop)->composing(), "stop when the generated text contains this string (repeatable)")
    ("device", po::value(&o.device)->default_value("cpu"), "cpu, or cuda[:N] for the GPU forward")
    ("dtype", po::value(&o.dtype)->default_value("auto"), "float32, bfloat16 or float16; auto: float32 on cpu, bfloat16 on cuda")
    ("compressor", po::value(&o.compressor), "decode on this compressor's cache alone (lossy; plugin name or path)")
    ("params", po::value(&o.params)->default_value("{}"), "the compressor's parameters as a JSON object")
    ("ratio,c", po::value(&o.ratio)->default_value(1.0), "kept fraction c in (0, 1] for --compressor: KV_comp = c * KV_full");
  // clang-format on
  return d;
}

Status check_options(const GenerateOptions& o) {
  VC_RETURN_IF_ERROR(check_decoding_options(o));
  if (o.compressor.empty() && o.ratio != 1.0) return Status::invalid_argument("--ratio needs --compressor");
  if (o.compressor.empty() && o.params != "{}") return Status::invalid_argument("--params needs --compressor");
  return Status();
}

// Prints generated text of one request as it arrives, holding back an unfinished UTF-8 sequence
// and any tail that could still become a stop string.
class TextStream {
 public:
  TextStream(const Tokenizer& tok, const std::vector<std::string>& stops) : tok_(tok), stops_(stops) {}

  // Returns false once a stop string has appeared (the text is cut before it).
  bool add(int32_t token) {
    const size_t before = text_.size();
    text_ += tok_.token_bytes(token);
    for (const std::string& s : stops_) {
      const size_t at = text_.find(s, before >= s.size() ? before - s.size() + 1 : 0);
      if (at != std::string::npos) {
        text_.resize(at);
        return false;
      }
    }
    return true;
  }
  // The text not printed yet that is safe to print: all of it when final.
  std::string take(bool final) {
    size_t end = text_.size();
    if (!final) {
      size_t hold = 0;
      for (const std::string& s : stops_) hold = std::max(hold, s.size() - 1);
      end = complete_utf8_prefix(std::string_view(text_).substr(0, end > hold ? end - hold : 0));
    }
    if (end <= printed_) return "";
    std::string out = text_.substr(printed_, end - printed_);
    printed_ = end;
    return out;
  }
  const std::string& text() const { return text_; }

 private:
  const Tokenizer& tok_;
  const std::vector<std::string>& stops_;
  std::string text_;
  size_t printed_ = 0;
};

}  // namespace

int run_generate(int argc, char** argv) {
  GenerateOptions o;
  po::options_description desc = describe(o);
  po::variables_map vm;
  const std::string examples =
      "Examples:\n"
      "  vericache generate --prompt \"What is the capital of France?\" --max-tokens 64\n"
      "  vericache generate -f prompt.txt --no-chat-template --temperature 0.7 --seed 1 --json\n";
  std::vector<OptionRange> ranges = decoding_ranges();
  ranges.push_back(kRatioRange);
  if (auto done = parse_command_line("generate", desc, examples, argc, argv, &vm, ranges)) return *done;
  if (Status s = check_options(o); !s.ok()) return report_usage_error("generate", s.message());
  auto load_options = parse_load_options(o.device, o.dtype);
  if (!load_options.ok()) return report_usage_error("generate", load_options.status().message());
  auto prompt_text = read_prompt(o.prompt, o.prompt_file);
  if (!prompt_text.ok()) return report_status("generate", prompt_text.status());
  set_threads(o.threads);

  auto model = load_model(o.model, o.compute, *load_options);
  if (!model.ok()) return report_error(model.status());
  const LlamaModel& m = **model;
  const Tokenizer& tok = m.tokenizer();

  auto prompt_ids = prompt_tokens(m, *prompt_text, o.no_chat_template, o.system);
  if (!prompt_ids.ok()) return report_error(prompt_ids.status());
  const std::vector<int32_t>& prompt = *prompt_ids;

  const std::vector<GenerationRequest> requests = make_requests(o, prompt);
  std::shared_ptr<Compressor> compressor;
  if (!o.compressor.empty()) {
    auto loaded = load_compressor_for(o.compressor, o.params, o.plugin_dirs, m);
    if (!loaded.ok()) return report_status("generate", loaded.status());
    compressor = std::move(*loaded);
    if (compressor->family() == CompressorFamily::kQuantization && !vm["ratio"].defaulted()) {
      return report_usage_error("generate", quantizer_ratio_error(compressor->name()));
    }
  }
  // Offline compressors may run extra forwards over up to the prompt's length again (KVzip).
  const bool offline = compressor && compressor->mode() == CompressionMode::kOffline;
  const int64_t extra_slots = offline ? static_cast<int64_t>(prompt.size()) + 64 : 0;
  auto pool = m.make_page_pool(o.page_size, std::max<int64_t>(1, Generator::pages_needed(m, o.page_size, requests, extra_slots)));
  if (!pool.ok()) return report_error(pool.status());

  std::vector<TextStream> streams;
  for (int64_t i = 0; i < o.batch; ++i) streams.emplace_back(tok, o.stop);
  const bool stream_out = !o.json && o.batch == 1;
  auto on_token = [&](size_t i, int32_t token) {
    const bool go_on = streams[i].add(token);
    if (stream_out) {
      std::fputs(streams[i].take(false).c_str(), stdout);
      std::fflush(stdout);
    }
    return go_on;
  };

  GeneratorOptions options;
  options.prefill_chunk = o.prefill_chunk;
  options.compressor = compressor.get();
  options.ratio = o.ratio;
  Generator generator(m, *pool, options);
  GenerationStats stats;
  auto results = generator.generate(requests, on_token, &stats);
  if (!results.ok()) return report_error(results.status());

  const double prefill_tok_s = stats.prefill_seconds > 0 ? stats.prompt_tokens / stats.prefill_seconds : 0;
  const double decode_tok_s = stats.decode_seconds > 0 ? stats.generated_tokens / stats.decode_seconds : 0;
  if (o.json) {
    nlohmann::json out;
    out["model"] = m.path();
    out["compute"] = compute_name(m.compute());
    out["kv_cache"] = kv_cache_name(m);
    out["prompt_tokens"] = static_cast<int64_t>(prompt.size());
    out["chat_template"] = !o.no_chat_template;
    auto describe_result = [&](size_t i) {
      nlohmann::json r;
      r["tokens"] = (*results)[i].tokens;
      r["text"] = streams[i].text();
      r["finish_reason"] = finish_reason_name((*results)[i].finish);
      return r;
    };
    if (o.batch == 1) {
      out.update(describe_result(0));
    } else {
      out["requests"] = nlohmann::json::array();
      for (size_t i = 0; i < results->size(); ++i) out["requests"].push_back(describe_result(i));
    }
    out["generated_tokens"] = stats.generated_tokens;
    out["prefill_seconds"] = stats.prefill_seconds;
    out["decode_seconds"] = stats.decode_seconds;
    out["prefill_tok_s"] = prefill_tok_s;
    out["decode_tok_s"] = decode_tok_s;
    out["threads"] = ThreadPool::global().threads();
    out["kernels"] = m.forward_path() == ForwardPath::kCpuKernels ? m.kernels().isa : "torch";
    out["device"] = m.device().str();
    if (compressor) {
      out["compressor"] = compressor->name();
      out["params"] = o.params;
      out["ratio"] = o.ratio;
      out["compress_seconds"] = stats.compress_seconds;
      out["full_kv_slots"] = stats.full_kv_slots;
      out["resident_kv_slots"] = stats.resident_kv_slots;
      out["full_kv_bytes"] = stats.full_kv_bytes;
      out["resident_kv_bytes"] = stats.resident_kv_bytes;
    }
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    if (stream_out) {
      std::fputs(streams[0].take(true).c_str(), stdout);
      std::fputs("\n", stdout);
    } else {
      for (size_t i = 0; i < results->size(); ++i) {
        std::printf("=== completion %zu (%s)\n%s\n", i, finish_reason_name((*results)[i].finish), streams[i].text().c_str());
      }
    }
    std::fprintf(stderr,
                 "\n[prompt %lld tokens x %lld: %.1f tok/s prefill | generated %lld tokens: %.1f tok/s decode | %d threads, %s]\n",
                 static_cast<long long>(prompt.size()), static_cast<long long>(o.batch), prefill_tok_s,
                 static_cast<long long>(stats.generated_tokens), decode_tok_s, ThreadPool::global().threads(),
                 m.forward_path() == ForwardPath::kCpuKernels ? m.kernels().isa : m.device().str().c_str());
    if (compressor && compressor->family() == CompressorFamily::kQuantization) {
      std::fprintf(stderr, "[%s (lossy, quantized cache only): %.3f of the full KV bytes resident at the end]\n",
                   compressor->name().c_str(),
                   static_cast<double>(stats.resident_kv_bytes) / static_cast<double>(std::max<int64_t>(1, stats.full_kv_bytes)));
    } else if (compressor) {
      std::fprintf(stderr, "[%s at c = %.3f (lossy, compressed cache only): %lld of %lld KV slots resident at the end]\n",
                   compressor->name().c_str(), o.ratio, static_cast<long long>(stats.resident_kv_slots),
                   static_cast<long long>(stats.full_kv_slots));
    }
  }
  return kExitOk;
}

}  // namespace vericache::cli
