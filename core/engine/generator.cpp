#include "engine/generator.h"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <optional>

#include "engine/compression.h"
#include "engine/compressor_feed.h"
#include "kv/packed_page_pool.h"

namespace vericache {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

struct RequestState {
  RequestState(int64_t n_layers, uint64_t seed) : kv(n_layers), rng(seed) {}
  SequenceKv kv;
  Rng rng;
  int64_t prefilled = 0;
  int64_t next_position = 0;  // the uncompressed length
  std::vector<int32_t> positions;  // scratch for one forward
  std::vector<int32_t> step_token;
  bool done = false;
};

}  // namespace

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kEndOfGeneration: return "eos";
    case FinishReason::kLength: return "length";
    case FinishReason::kContext: return "context";
    case FinishReason::kStopped: return "stop";
  }
  return "unknown";
}

int64_t Generator::pages_needed(const LlamaModel& model, int64_t page_size, std::span<const GenerationRequest> requests,
                                int64_t extra_slots) {
  const KvPageSpec spec = model.kv_page_spec(page_size);
  int64_t pages = 0;
  for (const GenerationRequest& r : requests) {
    const int64_t slots = std::min<int64_t>(static_cast<int64_t>(r.prompt.size()) + r.max_new_tokens,
                                            model.config().context_length);
    pages += spec.n_layers * spec.pages_for(slots);
  }
  // The extra slots start in a request's last, partly used page: at most one page more per layer.
  if (extra_slots > 0) pages += spec.n_layers * (spec.pages_for(extra_slots) + 1);
  return pages;
}

Result<std::vector<GenerationResult>> Generator::generate(std::span<const GenerationRequest> requests,
                                                          const TokenCallback& on_token, GenerationStats* stats) {
  const LlamaConfig& config = model_.config();
  const int64_t vocab = config.vocab_size;
  GenerationStats local_stats;
  GenerationStats& st = stats != nullptr ? *stats : local_stats;
  st = GenerationStats();

  for (size_t i = 0; i < requests.size(); ++i) {
    const auto n = static_cast<int64_t>(requests[i].prompt.size());
    if (n == 0) return Status::invalid_argument("request " + std::to_string(i) + ": the prompt is empty");
    if (n >= config.context_length) {
      return Status::invalid_argument("request " + std::to_string(i) + ": the prompt has " + std::to_string(n) +
                                      " tokens; the model's context is " + std::to_string(config.context_length));
    }
    st.prompt_tokens += n;
  }

  std::vector<RequestState> state;
  state.reserve(requests.size());
  for (const GenerationRequest& r : requests) state.emplace_back(config.n_layers, r.sampling.seed);
  std::vector<GenerationResult> results(requests.size());
  std::vector<SequenceKv*> caches;
  for (RequestState& s : state) caches.push_back(&s.kv);
  Compressor* const compressor = options_.compressor;

  // A quantizer's packed pages: a pool for every request's whole cache, packed as blocks complete.
  std::optional<PackedFormat> format;
  std::optional<PackedPagePool> packed;
  if (compressor != nullptr && compressor->family() == CompressorFamily::kQuantization) {
    VC_ASSIGN_OR_RETURN(format, checked_packed_format(*compressor, pool_.spec()));
    VC_ASSIGN_OR_RETURN(packed, PackedPagePool::create(pages_needed(model_, pool_.spec().page_size, requests),
                                                       format->bytes_per_page));
  }
  const int64_t slot_bytes = pool_.page_bytes() / pool_.spec().page_size;
  auto release_all = [&] {
    for (size_t i = 0; i < state.size(); ++i) {
      st.full_kv_slots += state[i].next_position * config.n_layers;
      st.full_kv_bytes += state[i].next_position * config.n_layers * slot_bytes;
      for (int64_t l = 0; l < config.n_layers; ++l) st.resident_kv_slots += state[i].kv.total_length(l);
      st.resident_kv_bytes += resident_kv_bytes(state[i].kv, pool_, format ? &*format : nullptr);
      if (packed) state[i].kv.release_packed(*packed);
      state[i].kv.release(pool_);
      if (compressor != nullptr) compressor->release(static_cast<int64_t>(i));
    }
  };
  // One forward of `batch` (request ids = indices into `requests`); with a compressor, every layer
  // goes through update() and the drops it returns are applied.
  std::vector<double> ratios;
  at::Tensor logits;
  auto run_forward = [&](std::vector<ForwardItem>& batch, bool observe) -> Status {
    if (packed) {
      for (ForwardItem& item : batch) {
        item.packed_pool = &*packed;
        item.unpacker = compressor;
        item.packed_format = &*format;
      }
      return forward_with_quantizer(model_, batch, pool_, &logits, *compressor, *format, *packed, observe);
    }
    if (compressor == nullptr || !observe) return model_.forward(batch, &logits);
    ratios.assign(batch.size(), options_.ratio);
    return forward_with_compressor(model_, batch, pool_, &logits, *compressor, ratios, caches);
  };

  // Appends `token` to request i and decides whether it continues.
  auto accept = [&](size_t i, int32_t token) {
    const GenerationRequest& r = requests[i];
    RequestState& s = state[i];
    const std::vector<int32_t>& stops = r.stop_ids.empty() ? model_.tokenizer().end_of_generation_ids() : r.stop_ids;
    if (!r.ignore_eos && std::find(stops.begin(), stops.end(), token) != stops.end()) {
      results[i].finish = FinishReason::kEndOfGeneration;
      s.done = true;
      return;
    }
    results[i].tokens.push_back(token);
    ++st.generated_tokens;
    if (on_token && !on_token(i, token)) {
      results[i].finish = FinishReason::kStopped;
      s.done = true;
    } else if (static_cast<int64_t>(results[i].tokens.size()) >= r.max_new_tokens) {
      results[i].finish = FinishReason::kLength;
      s.done = true;
    } else if (s.next_position >= config.context_length) {
      results[i].finish = FinishReason::kContext;
      s.done = true;
    } else {
      s.step_token = {token};
    }
  };

  const auto prefill_start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < requests.size(); ++i) {
    if (requests[i].max_new_tokens <= 0) state[i].done = true;
  }
  for (;;) {
    std::vector<ForwardItem> batch;
    std::vector<size_t> finishing;  // requests whose last prompt chunk is in this batch
    for (size_t i = 0; i < requests.size(); ++i) {
      RequestState& s = state[i];
      const auto n = static_cast<int64_t>(requests[i].prompt.size());
      if (s.done || s.prefilled >= n) continue;
      const int64_t take = std::min(options_.prefill_chunk, n - s.prefilled);
      s.positions.resize(take);
      std::iota(s.positions.begin(), s.positions.end(), static_cast<int32_t>(s.prefilled));
      const bool last = s.prefilled + take == n;
      batch.push_back({std::span<const int32_t>(requests[i].prompt).subspan(s.prefilled, take), s.positions, &s.kv, &pool_,
                       last ? LogitRows::kLast : LogitRows::kNone, static_cast<int64_t>(i)});
      if (last) finishing.push_back(i);
      s.prefilled += take;
      s.next_position = s.prefilled;
    }
    if (batch.empty()) break;
    Status status = run_forward(batch, /*observe=*/true);
    for (size_t j = 0; status.ok() && j < finishing.size(); ++j) {
      const size_t i = finishing[j];
      const int32_t first = select_token(logits[j].data_ptr<float>(), vocab, requests[i].sampling, state[i].rng);
      // Compressed before the first token is handed out: a compressor that refuses the prompt
      // fails the run before any text was streamed.
      if (compressor != nullptr && compressor->mode() == CompressionMode::kOffline) {
        const auto start = std::chrono::steady_clock::now();
        status = compress_offline(model_, pool_, *compressor, options_.ratio, requests[i].prompt,
                                  static_cast<int64_t>(i), state[i].kv);
        compressor->release(static_cast<int64_t>(i));  // what it recorded for the prompt is spent
        st.compress_seconds += seconds_since(start);
      }
      if (status.ok()) accept(i, first);
    }
    if (!status.ok()) {
      release_all();
      return status;
    }
  }
  st.prefill_seconds = seconds_since(prefill_start);

  const auto decode_start = std::chrono::steady_clock::now();
  for (;;) {
    std::vector<ForwardItem> batch;
    std::vector<size_t> active;
    for (size_t i = 0; i < requests.size(); ++i) {
      RequestState& s = state[i];
      if (s.done) continue;
      s.positions = {static_cast<int32_t>(s.next_position++)};
      batch.push_back({s.step_token, s.positions, &s.kv, &pool_, LogitRows::kLast, static_cast<int64_t>(i)});
      active.push_back(i);
    }
    if (batch.empty()) break;
    Status status = run_forward(batch, feeds_decode_rows(compressor));
    if (!status.ok()) {
      release_all();
      return status;
    }
    ++st.decode_steps;
    for (size_t j = 0; j < active.size(); ++j) {
      const size_t i = active[j];
      accept(i, select_token(logits[j].data_ptr<float>(), vocab, requests[i].sampling, state[i].rng));
    }
  }
  st.decode_seconds = seconds_since(decode_start);
  release_all();
  return results;
}

}  // namespace vericache
