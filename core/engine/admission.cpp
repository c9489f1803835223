// DraftVerifyEngine's admission: what a request may hold at most (its page demand), queuing
// requests (add_request, add_prefilled) and admitting them while the pools can hold every admitted
// request's worst case at once, so that no page allocation fails later.
#include <ATen/ATen.h>

#include <algorithm>

#include "engine/draft_verify_engine.h"
#include "engine/engine_request.h"
#include "util/check.h"

namespace vericache {
namespace {

// Scratch positions an offline compressor's own forwards (ModelAccess::run_without_keeping) may
// append past a prompt of n tokens: KVzip re-reads the prompt in chunks after a short header.
int64_t scratch_slots(int64_t n) { return n + 128; }

}  // namespace

DraftVerifyEngine::PageDemand DraftVerifyEngine::pages_for_request(const LlamaModel& model,
                                                                   const EngineOptions& options,
                                                                   int64_t device_page_size, int64_t host_page_size,
                                                                   const GenerationRequest& request) {
  return demand_for(model, options, device_page_size, host_page_size, request, -1);
}

DraftVerifyEngine::PageDemand DraftVerifyEngine::demand_for(const LlamaModel& model, const EngineOptions& options,
                                                            int64_t device_page_size, int64_t host_page_size,
                                                            const GenerationRequest& request, int64_t kept_slots) {
  const int64_t layers = model.config().n_layers, ctx = model.config().context_length;
  const auto n = static_cast<int64_t>(request.prompt.size());
  const int64_t x = max_window(options);
  const int64_t longest = std::min(n + std::max<int64_t>(request.max_new_tokens, 0), ctx);
  auto pages = [](int64_t slots, int64_t page_size) { return (slots + page_size - 1) / page_size; };
  PageDemand d;
  Compressor* c = options.compressor;
  // The kept set's bound: given (a prefilled request's kept set), or the compressor's footprint();
  // every slot without a compressor, for a quantizer (its float slots are packed only after they
  // are written) or when footprint() fails.
  const bool given = kept_slots >= 0;
  if (!given) kept_slots = layers * n;
  if (c != nullptr && n > 0) {
    if (Result<RequestFootprint> f = c->footprint(n, options.ratio, layers); f.ok()) {
      if (!given && c->family() != CompressorFamily::kQuantization) kept_slots = f->max_kept_slots;
      d.state_bytes = std::max<int64_t>(f->state_bytes, 0);
    }
  }
  kept_slots = std::clamp<int64_t>(kept_slots, 0, layers * n);
  d.kept_slots = kept_slots;
  const int64_t growth = longest - n + x;  // tokens still to come, and one window
  // Each layer holds at most every slot; summed over layers, each layer's pages round its slots up
  // (at most page_size - 1 slots each).
  d.device = std::min(layers * pages(longest + x, device_page_size),
                      (kept_slots + layers * (growth + device_page_size - 1)) / device_page_size);
  d.host = layers * pages(longest + x + 1, host_page_size);
  if (options.transfer != nullptr) d.transient = layers * pages(longest + x + 1, device_page_size);
  if (c != nullptr && c->mode() == CompressionMode::kOffline) {
    d.host = std::max(d.host, layers * (pages(n + scratch_slots(n), host_page_size) + 1));
  }
  return d;
}

DraftVerifyEngine::PageDemand DraftVerifyEngine::pages_for_requests(const LlamaModel& model,
                                                                    const EngineOptions& options,
                                                                    int64_t device_page_size, int64_t host_page_size,
                                                                    std::span<const GenerationRequest> requests) {
  PageDemand all;
  for (const GenerationRequest& r : requests) {
    const PageDemand d = pages_for_request(model, options, device_page_size, host_page_size, r);
    all.device += d.device;
    all.host += d.host;
    all.transient += d.transient;
    all.state_bytes += d.state_bytes;
    all.kept_slots += d.kept_slots;
  }
  return all;
}

DraftVerifyEngine::PageDemand DraftVerifyEngine::worst_case(const EngineRequest& r) const {
  if (r.phase == Phase::kPrefill || r.done) return r.demand;
  // Past prefill: what is held, plus room for every token still to come and one window.
  const int64_t growth =
      std::max<int64_t>(r.req.max_new_tokens - static_cast<int64_t>(r.result.generation.tokens.size()), 0) +
      max_window(options_) + 1;
  PageDemand d;
  d.host = r.full.pages_held() + r.full.pages_needed(host_pool_.spec(), growth);
  d.device = r.full_only ? 0 : r.comp.pages_held() + r.comp.pages_needed(device_pool_.spec(), growth);
  // An offline compressor's state is released at its compress(); an online one keeps it.
  const bool online = options_.compressor != nullptr && options_.compressor->mode() == CompressionMode::kOnline;
  d.state_bytes = online && !r.full_only ? r.demand.state_bytes : 0;
  return d;
}

Result<int64_t> DraftVerifyEngine::add_prefilled(GenerationRequest request, const SequenceKv& prompt_kv,
                                                 const PagePool& prompt_pool, std::span<const float> next_logits,
                                                 std::vector<at::Tensor> kept) {
  const auto n = static_cast<int64_t>(request.prompt.size());
  const KvPageSpec& spec = prompt_pool.spec();
  if (prompt_kv.compressed() || prompt_kv.n_layers() != model_.config().n_layers ||
      spec.n_layers != model_.config().n_layers || spec.n_kv_heads != model_.config().n_kv_heads ||
      spec.head_dim != model_.config().head_dim) {
    return Status::invalid_argument("add_prefilled: the prompt's KV must be a full cache of this model");
  }
  if (&prompt_pool == &host_pool_ || &prompt_pool == &device_pool_) {
    return Status::invalid_argument(
        "add_prefilled: the prompt's KV must live in a pool of its own (admission counts the engine's pools as its "
        "own)");
  }
  for (int64_t l = 0; l < prompt_kv.n_layers(); ++l) {
    if (prompt_kv.length(l) != n) {
      return Status::invalid_argument("add_prefilled: the prompt has " + std::to_string(n) +
                                      " tokens but its KV holds " + std::to_string(prompt_kv.length(l)) + " in layer " +
                                      std::to_string(l));
    }
  }
  if (static_cast<int64_t>(next_logits.size()) != model_.config().vocab_size) {
    return Status::invalid_argument("add_prefilled: next_logits must have the vocabulary's " +
                                    std::to_string(model_.config().vocab_size) + " entries");
  }
  if (!kept.empty() && static_cast<int64_t>(kept.size()) != model_.config().n_layers) {
    return Status::invalid_argument("add_prefilled: one kept tensor per layer, or none");
  }
  VC_RETURN_IF_ERROR(validate_options());
  // The kept set is known: admission reserves exactly it (no kept set: the whole prompt).
  int64_t kept_slots = model_.config().n_layers * n;
  if (!kept.empty()) {
    kept_slots = 0;
    for (const at::Tensor& k : kept) kept_slots += k.dim() == 2 ? k.size(1) : 0;
  }
  const PageDemand need = demand_for(model_, options_, device_pool_.spec().page_size, host_pool_.spec().page_size,
                                     request, kept_slots);
  VC_ASSIGN_OR_RETURN(const int64_t id, enqueue(std::move(request), need));
  EngineRequest& r = *queue_.back();
  r.prompt_kv = &prompt_kv;
  r.prompt_pool = &prompt_pool;
  r.next_logits.assign(next_logits.begin(), next_logits.end());
  r.given_kept = std::move(kept);
  r.external_prefill = true;
  return id;
}

void DraftVerifyEngine::start_prefilled(EngineRequest& r) {
  const double start = clock_->now_seconds();
  const auto n = static_cast<int64_t>(r.req.prompt.size());
  const Status s = r.full.append_range(host_pool_, *r.prompt_kv, *r.prompt_pool, 0, n);
  VC_CHECK(s.ok(), "copying a prefilled prompt: the admission reservation did not hold");
  r.prefilled = n;
  r.prompt_kv = nullptr;
  r.result.metrics.prefill_seconds += clock_->now_seconds() - start;
  finish_prefill(r, r.next_logits.data());
  r.next_logits.clear();
}

Result<int64_t> DraftVerifyEngine::add_request(GenerationRequest request) {
  VC_RETURN_IF_ERROR(validate_options());
  const PageDemand need =
      demand_for(model_, options_, device_pool_.spec().page_size, host_pool_.spec().page_size, request, -1);
  return enqueue(std::move(request), need);
}

Result<int64_t> DraftVerifyEngine::enqueue(GenerationRequest request, const PageDemand& need) {
  const auto n = static_cast<int64_t>(request.prompt.size());
  const int64_t ctx = model_.config().context_length;
  if (n == 0) return Status::invalid_argument("request " + std::to_string(next_id_) + ": the prompt is empty");
  if (n >= ctx) {
    return Status::invalid_argument("request " + std::to_string(next_id_) + ": the prompt has " + std::to_string(n) +
                                    " tokens; the model's context is " + std::to_string(ctx));
  }
  const int64_t device_pages = device_pool_.num_pages(PageKind::kResident),
                host_pages = host_pool_.num_pages(PageKind::kResident);
  if (need.device > device_pages || need.host > host_pages) {
    return Status::invalid_argument(
        "request " + std::to_string(next_id_) + " can never fit: it needs up to " + std::to_string(need.device) +
        " resident device pages (pool: " + std::to_string(device_pages) + ") and " + std::to_string(need.host) +
        " host pages (pool: " + std::to_string(host_pages) + ")");
  }
  if (need.transient > device_pool_.num_pages(PageKind::kTransient)) {
    return Status::invalid_argument(
        "request " + std::to_string(next_id_) + " can never be verified: its full cache needs up to " +
        std::to_string(need.transient) +
        " transient device pages (pool: " + std::to_string(device_pool_.num_pages(PageKind::kTransient)) + ")");
  }
  if (options_.state_budget_bytes > 0 && need.state_bytes > options_.state_budget_bytes) {
    return Status::invalid_argument("request " + std::to_string(next_id_) + " can never fit: " +
                                    options_.compressor->name() + " holds " + std::to_string(need.state_bytes) +
                                    " bytes of state for it (budget: " + std::to_string(options_.state_budget_bytes) +
                                    " bytes)");
  }
  auto r = std::make_unique<EngineRequest>(next_id_, std::move(request), model_.config().n_layers);
  r->result.request_id = r->id;
  r->result.metrics.prompt_tokens = n;
  r->demand = need;
  queue_.push_back(std::move(r));
  return next_id_++;
}

void DraftVerifyEngine::admit() {
  PageDemand held;
  for (const auto& r : active_) {
    const PageDemand d = worst_case(*r);
    held.device += d.device;
    held.host += d.host;
    held.state_bytes += d.state_bytes;
  }
  while (!queue_.empty()) {
    EngineRequest& r = *queue_.front();
    const PageDemand d = worst_case(r);
    if (held.device + d.device > device_pool_.num_pages(PageKind::kResident) ||
        held.host + d.host > host_pool_.num_pages(PageKind::kResident) ||
        (options_.state_budget_bytes > 0 && held.state_bytes + d.state_bytes > options_.state_budget_bytes)) {
      return;  // first come, first served: later requests wait behind this one
    }
    active_.push_back(std::move(queue_.front()));
    queue_.erase(queue_.begin());
    EngineRequest& a = *active_.back();
    if (a.req.max_new_tokens <= 0) {
      a.done = true;
    } else if (a.prompt_kv != nullptr) {
      start_prefilled(a);
    }
    if (a.done) {  // finished on admission (no token wanted, or the first token ends it): holds nothing
      finish(a);
      active_.pop_back();
      continue;
    }
    held.device += d.device;
    held.host += d.host;
    held.state_bytes += d.state_bytes;
  }
}

}  // namespace vericache
