#include "engine/draft_verify_engine.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "engine/compressed_kv_check.h"
#include "engine/compression.h"
#include "util/check.h"

namespace vericache {
namespace {

enum class Phase { kPrefill, kDraft, kVerify };

// Scratch positions an offline compressor's own forwards (ModelAccess::run_without_keeping) may
// append past a prompt of n tokens: KVzip re-reads the prompt in chunks after a short header.
int64_t scratch_slots(int64_t n) { return n + 128; }

// The activations of rows [begin, begin + n) of one request, as the contract hands them to update().
struct RequestRows {
  LayerActivations acts;
  int64_t offsets[2];
  int64_t request_id;
  double ratio;
  int64_t cache_length;
};

void narrow_rows(const LayerActivations& all, int64_t begin, int64_t n, RequestRows* out) {
  out->acts.layer = all.layer;
  out->acts.residual = all.residual.narrow(0, begin, n);
  out->acts.hidden = all.hidden.narrow(0, begin, n);
  out->acts.q = all.q.narrow(0, begin, n);
  out->acts.k = all.k.narrow(0, begin, n);
  out->acts.v = all.v.narrow(0, begin, n);
  out->acts.positions = all.positions.narrow(0, begin, n);
  out->offsets[0] = 0;
  out->offsets[1] = n;
  out->acts.row_offsets = std::span<const int64_t>(out->offsets, 2);
  out->acts.request_ids = std::span<const int64_t>(&out->request_id, 1);
  out->acts.ratios = std::span<const double>(&out->ratio, 1);
  out->acts.cache_lengths = std::span<const int64_t>(&out->cache_length, 1);
}

}  // namespace

const char* draft_kv_name(DraftKv mode) { return mode == DraftKv::kDrafted ? "drafted" : "verified"; }

struct DraftVerifyEngine::Request {
  Request(int64_t request_id, GenerationRequest r, int64_t n_layers)
      : id(request_id),
        req(std::move(r)),
        full(n_layers),
        comp(n_layers),
        staged(n_layers, PageKind::kTransient),
        rng(req.sampling.seed),
        draft_rng(req.sampling.seed ^ 0x5851f42d4c957f2dull) {}

  int64_t id;
  GenerationRequest req;
  Phase phase = Phase::kPrefill;
  SequenceKv full;      // in the host pool
  SequenceKv comp;      // in the device pool's resident pages
  SequenceKv staged;    // transfer mode: KV_full's copy in the device pool's transient pages
  uint64_t ticket = 0;  // the transfer filling `staged`; 0: none queued
  Rng rng;              // first token and verification
  Rng draft_rng;        // sampled drafts
  int64_t prefilled = 0;
  int64_t committed = 0;  // positions held by KV_full
  int32_t pending = 0;    // the last committed token, at position `committed`, in no cache yet
  int64_t comp_end = 0;   // KV_comp accounts for every position below this
  int64_t window = 0;     // x of the current window
  std::vector<int32_t> drafts;
  std::vector<std::vector<float>> draft_probs;  // sampled drafts: q of each draft
  bool full_only = false;                       // no KV_comp (no compressor state either)
  bool done = false;
  bool reload_due = false;  // scheduler: its copy of KV_full is to start (retried until it does)
  bool verify_due = false;  // scheduler: its verify forward is due
  Status compressor_status;  // a failure inside this forward's observer
  // Online compressor, prefill: positions each (layer, KV head) dropped, in drop order.
  std::vector<std::vector<std::vector<int64_t>>> dropped;
  // Online compressor, verify: this window's rows of every layer, kept until the verdict.
  struct Rows {
    at::Tensor residual, hidden, q, k, v, positions;
  };
  std::vector<Rows> window_rows;
  std::vector<int32_t> tokens, positions;  // the current forward's input
  EngineResult result;
  // add_prefilled(): the prompt's KV to copy at admission, the logits after it, its kept set.
  const SequenceKv* prompt_kv = nullptr;
  const PagePool* prompt_pool = nullptr;
  std::vector<float> next_logits;
  std::vector<at::Tensor> given_kept;
  bool external_prefill = false;
};

DraftVerifyEngine::DraftVerifyEngine(const LlamaModel& model, PagePool& device_pool, PagePool& host_pool,
                                     EngineOptions options)
    : model_(model),
      device_pool_(device_pool),
      host_pool_(host_pool),
      options_(options),
      clock_(options.clock != nullptr ? options.clock : &steady_clock_) {
  Compressor* c = options_.compressor;
  if (c == nullptr || c->family() != CompressorFamily::kQuantization) return;
  Result<PackedFormat> format = checked_packed_format(*c, device_pool_.spec());
  if (!format.ok()) {
    quantizer_status_ = format.status();
    return;
  }
  packed_format_ = *format;
  const int64_t pages = std::max<int64_t>(device_pool_.num_pages(PageKind::kResident), 1);
  Result<PackedPagePool> pool = PackedPagePool::create(pages, packed_format_.bytes_per_page);
  if (!pool.ok()) {
    quantizer_status_ = pool.status();
    return;
  }
  packed_pool_.emplace(std::move(*pool));
}

DraftVerifyEngine::~DraftVerifyEngine() {
  for (auto& r : active_) {
    if (r->ticket != 0) options_.transfer->wait(r->ticket);
    r->staged.release(device_pool_);
    r->full.release(host_pool_);
    release_comp(*r);
    if (options_.compressor != nullptr) options_.compressor->release(r->id);
  }
}

Status DraftVerifyEngine::validate_options() const {
  VC_RETURN_IF_ERROR(quantizer_status_);
  if (options_.draft_length < 1 || options_.draft_length > 1024) {
    return Status::invalid_argument("draft length must be in [1, 1024], got " + std::to_string(options_.draft_length));
  }
  if (!(options_.ratio > 0 && options_.ratio <= 1)) {
    return Status::invalid_argument("ratio must be in (0, 1], got " + std::to_string(options_.ratio));
  }
  if (options_.prefill_chunk < 1) return Status::invalid_argument("prefill chunk must be >= 1");
  if (options_.scheduler != nullptr && options_.scheduler->options().draft_length != options_.draft_length) {
    return Status::invalid_argument("the reload scheduler plans for draft length " +
                                    std::to_string(options_.scheduler->options().draft_length) +
                                    " but the engine's is " + std::to_string(options_.draft_length));
  }
  if (device_pool_.num_pages(PageKind::kResident) == 0) {
    return Status::invalid_argument("the device pool has no resident pages for compressed caches");
  }
  if (options_.transfer != nullptr && device_pool_.spec().page_size != host_pool_.spec().page_size) {
    return Status::invalid_argument(
        "verification from transient pages needs the same page size in the host and device pools");
  }
  if (model_.forward_path() != ForwardPath::kCpuKernels) {
    // Its forwards mix caches of several pools, which only the CPU kernels read (the GPU path is a later issue).
    return Status::not_supported(
        "the draft-verify engine runs on the CPU kernels' forward; this model uses the torch forward");
  }
  return Status();
}

DraftVerifyEngine::PageDemand DraftVerifyEngine::pages_for_request(const LlamaModel& model,
                                                                   const EngineOptions& options,
                                                                   int64_t device_page_size, int64_t host_page_size,
                                                                   const GenerationRequest& request) {
  const int64_t layers = model.config().n_layers, ctx = model.config().context_length;
  const auto n = static_cast<int64_t>(request.prompt.size());
  const int64_t x = max_window(options);
  const int64_t longest = std::min(n + std::max<int64_t>(request.max_new_tokens, 0), ctx);
  auto pages = [](int64_t slots, int64_t page_size) { return (slots + page_size - 1) / page_size; };
  PageDemand d;
  d.device = layers * pages(longest + x, device_page_size);
  d.host = layers * pages(longest + x + 1, host_page_size);
  if (options.transfer != nullptr) d.transient = layers * pages(longest + x + 1, device_page_size);
  if (options.compressor != nullptr && options.compressor->mode() == CompressionMode::kOffline) {
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
  }
  return all;
}

DraftVerifyEngine::PageDemand DraftVerifyEngine::worst_case(const Request& r) const {
  if (r.phase == Phase::kPrefill || r.done) {
    return pages_for_request(model_, options_, device_pool_.spec().page_size, host_pool_.spec().page_size, r.req);
  }
  // Past prefill: what is held, plus room for every token still to come and one window.
  const int64_t growth =
      std::max<int64_t>(r.req.max_new_tokens - static_cast<int64_t>(r.result.generation.tokens.size()), 0) +
      max_window(options_) + 1;
  PageDemand d;
  d.host = r.full.pages_held() + r.full.pages_needed(host_pool_.spec(), growth);
  d.device = r.full_only ? 0 : r.comp.pages_held() + r.comp.pages_needed(device_pool_.spec(), growth);
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
  VC_ASSIGN_OR_RETURN(const int64_t id, add_request(std::move(request)));
  Request& r = *queue_.back();
  r.prompt_kv = &prompt_kv;
  r.prompt_pool = &prompt_pool;
  r.next_logits.assign(next_logits.begin(), next_logits.end());
  r.given_kept = std::move(kept);
  r.external_prefill = true;
  return id;
}

void DraftVerifyEngine::start_prefilled(Request& r) {
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
  const auto n = static_cast<int64_t>(request.prompt.size());
  const int64_t ctx = model_.config().context_length;
  if (n == 0) return Status::invalid_argument("request " + std::to_string(next_id_) + ": the prompt is empty");
  if (n >= ctx) {
    return Status::invalid_argument("request " + std::to_string(next_id_) + ": the prompt has " + std::to_string(n) +
                                    " tokens; the model's context is " + std::to_string(ctx));
  }
  const PageDemand need =
      pages_for_request(model_, options_, device_pool_.spec().page_size, host_pool_.spec().page_size, request);
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
  auto r = std::make_unique<Request>(next_id_, std::move(request), model_.config().n_layers);
  r->result.request_id = r->id;
  r->result.metrics.prompt_tokens = n;
  queue_.push_back(std::move(r));
  return next_id_++;
}

void DraftVerifyEngine::admit() {
  PageDemand held;
  for (const auto& r : active_) {
    const PageDemand d = worst_case(*r);
    held.device += d.device;
    held.host += d.host;
  }
  while (!queue_.empty()) {
    Request& r = *queue_.front();
    const PageDemand d = worst_case(r);
    if (held.device + d.device > device_pool_.num_pages(PageKind::kResident) ||
        held.host + d.host > host_pool_.num_pages(PageKind::kResident)) {
      return;  // first come, first served: later requests wait behind this one
    }
    active_.push_back(std::move(queue_.front()));
    queue_.erase(queue_.begin());
    Request& a = *active_.back();
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
  }
}

int64_t DraftVerifyEngine::window_for(const Request& r) const {
  if (r.full_only) return 0;
  const int64_t remaining = r.req.max_new_tokens - static_cast<int64_t>(r.result.generation.tokens.size());
  // The verify forward runs positions committed .. committed + x, all inside the context.
  const int64_t room = model_.config().context_length - 1 - r.committed;
  return std::clamp<int64_t>(std::min(remaining - 1, room), 0, max_window(options_));
}

int64_t DraftVerifyEngine::max_window(const EngineOptions& options) {
  return options.scheduler != nullptr ? options.scheduler->options().window - 2 : options.draft_length;
}

void DraftVerifyEngine::schedule(Request& r) {
  if (options_.scheduler == nullptr || r.done) return;
  // What the copy takes: transient pages for KV_full and the window (start_transfer's reservation).
  const int64_t pages = r.full.n_layers() * device_pool_.spec().pages_for(r.committed + window_for(r) + 1);
  const Status s =
      options_.scheduler->admit(r.id, static_cast<double>(pages * device_pool_.page_bytes()), window_for(r));
  if (!s.ok() && scheduler_status_.ok()) scheduler_status_ = s;
}

void DraftVerifyEngine::apply_schedule() {
  const sched::ReloadScheduler::Events events = options_.scheduler->events_now();
  auto request = [&](int64_t id) -> Request& {
    const auto it = std::find_if(active_.begin(), active_.end(), [id](const auto& r) { return r->id == id; });
    VC_CHECK(it != active_.end(), "the scheduler planned a request the engine does not run");
    return **it;
  };
  for (const sched::ReloadPlan& p : events.reloads_starting) request(p.request).reload_due = true;
  for (const sched::ReloadPlan& p : events.verifying) request(p.request).verify_due = true;
}

void DraftVerifyEngine::fall_back_to_full(Request& r, const Status& why) {
  if (r.result.compressor_failure.empty()) r.result.compressor_failure = why.message();
  r.full_only = true;
  release_comp(r);
  r.window_rows.clear();
  r.dropped.clear();
  if (options_.compressor != nullptr) options_.compressor->release(r.id);
  if (r.phase == Phase::kDraft) {
    r.drafts.clear();
    r.draft_probs.clear();
    r.window = 0;
    // With a scheduler it waits for its planned verify, else it verifies its last token now.
    if (options_.scheduler == nullptr) r.phase = Phase::kVerify;
  }
}

void DraftVerifyEngine::start_transfer(Request& r) {
  if (options_.transfer == nullptr || r.ticket != 0) return;
  auto ticket = options_.transfer->submit(r.full, host_pool_, &r.staged, device_pool_, r.window + 1);
  if (!ticket.ok()) return;  // no transient pages free now: tried again next step
  r.ticket = *ticket;
  int64_t pages = 0;  // the pages copied (the window's extra slots are reserved, not copied)
  for (int64_t l = 0; l < r.full.n_layers(); ++l) pages += host_pool_.spec().pages_for(r.full.length(l));
  r.result.metrics.transfer_bytes += pages * host_pool_.page_bytes();
}

void DraftVerifyEngine::finish(Request& r) {
  if (r.ticket != 0) options_.transfer->wait(r.ticket);
  r.ticket = 0;
  r.staged.release(device_pool_);
  const int64_t layers = model_.config().n_layers;
  r.result.metrics.generated_tokens = static_cast<int64_t>(r.result.generation.tokens.size());
  r.result.metrics.full_kv_slots = r.committed * layers;
  r.result.metrics.full_kv_bytes = r.result.metrics.full_kv_slots * (device_pool_.page_bytes() / device_pool_.spec().page_size);
  for (int64_t l = 0; l < layers; ++l) r.result.metrics.resident_kv_slots += r.comp.total_length(l);
  r.result.metrics.resident_kv_bytes = resident_kv_bytes(r.comp, device_pool_, quantizer() ? &packed_format_ : nullptr);
  r.full.release(host_pool_);
  release_comp(r);
  if (options_.compressor != nullptr) options_.compressor->release(r.id);
  totals_.add(r.result.metrics);
  finished_.push_back(std::move(r.result));
}

void DraftVerifyEngine::commit_token(Request& r, int32_t token, int64_t position) {
  if (r.done) return;
  const std::vector<int32_t>& stops =
      r.req.stop_ids.empty() ? model_.tokenizer().end_of_generation_ids() : r.req.stop_ids;
  GenerationResult& g = r.result.generation;
  if (!r.req.ignore_eos && std::find(stops.begin(), stops.end(), token) != stops.end()) {
    g.finish = FinishReason::kEndOfGeneration;
    r.done = true;
    return;
  }
  g.tokens.push_back(token);
  // Generator's rules: the length limit first, then the context (the token would be fed at `position`).
  if (static_cast<int64_t>(g.tokens.size()) >= r.req.max_new_tokens) {
    g.finish = FinishReason::kLength;
    r.done = true;
  } else if (position >= model_.config().context_length) {
    g.finish = FinishReason::kContext;
    r.done = true;
  }
}

Status DraftVerifyEngine::build_compressed(Request& r) {
  const KvPageSpec& spec = device_pool_.spec();
  const auto n = static_cast<int64_t>(r.req.prompt.size());
  std::vector<at::Tensor> kept(spec.n_layers);
  Compressor* c = options_.compressor;
  if (!r.given_kept.empty()) {
    kept = std::move(r.given_kept);
    const KvCacheView view = r.full.view(host_pool_);
    VC_RETURN_IF_ERROR(
        check_compressed_kv(c != nullptr ? c->name() : "kept set", CompressedKV{kept}, view.layout, view.lengths));
  } else if (c == nullptr || r.external_prefill || quantizer()) {  // nothing drops: keep everything
    const at::Tensor all = at::arange(n, at::kLong).unsqueeze(0).expand({spec.n_kv_heads, n}).contiguous();
    for (auto& k : kept) k = all;
  } else if (c->mode() == CompressionMode::kOffline) {
    CompressedKV out;
    const Status s = compute_kept(model_, host_pool_, *c, options_.ratio, r.req.prompt, r.id, r.full, &out);
    c->release(r.id);  // what it recorded for the prompt is spent
    VC_RETURN_IF_ERROR(s);
    kept = std::move(out.kept);
  } else {
    for (int64_t l = 0; l < spec.n_layers; ++l) {
      std::vector<std::vector<int64_t>> heads(spec.n_kv_heads);
      for (int64_t h = 0; h < spec.n_kv_heads; ++h) {
        std::vector<bool> gone(n, false);
        if (!r.dropped.empty()) {
          for (int64_t p : r.dropped[l][h]) gone[p] = true;
        }
        for (int64_t p = 0; p < n; ++p) {
          if (!gone[p]) heads[h].push_back(p);
        }
        if (heads[h].size() != heads[0].size()) {
          return Status::plugin_error(c->name() + ": layer " + std::to_string(l) + ": KV heads kept different counts");
        }
      }
      kept[l] = at::empty({spec.n_kv_heads, static_cast<int64_t>(heads[0].size())}, at::kLong);
      for (int64_t h = 0; h < spec.n_kv_heads; ++h)
        std::copy(heads[h].begin(), heads[h].end(), kept[l][h].data_ptr<int64_t>());
    }
    r.dropped.clear();
  }
  // Admission reserved room for an uncompressed KV_comp, so this cannot run out of pages.
  const Status s = r.comp.assign_kept(device_pool_, r.full, host_pool_, kept);
  VC_CHECK(s.ok(), "building KV_comp: the admission reservation did not hold");
  return quantizer() ? pack_comp(r) : Status();
}

Status DraftVerifyEngine::pack_comp(Request& r) {
  return pack_front(*options_.compressor, packed_format_, device_pool_, *packed_pool_, r.comp, r.id);
}

void DraftVerifyEngine::release_comp(Request& r) {
  if (packed_pool_) r.comp.release_packed(*packed_pool_);
  r.comp.release(device_pool_);
}

void DraftVerifyEngine::finish_prefill(Request& r, const float* logits) {
  const double start = clock_->now_seconds();
  const auto n = static_cast<int64_t>(r.req.prompt.size());
  r.committed = n;
  r.comp_end = n;
  r.pending = select_token(logits, model_.config().vocab_size, r.req.sampling, r.rng);
  if (options_.sink != nullptr) {
    options_.sink->on_token_logits(r.id, n, std::span<const float>(logits, model_.config().vocab_size));
  }
  if (!r.full_only) {
    if (Status s = r.compressor_status.ok() ? build_compressed(r) : r.compressor_status; !s.ok())
      fall_back_to_full(r, s);
  }
  r.phase = Phase::kDraft;
  commit_token(r, r.pending, r.committed);
  schedule(r);
  r.result.metrics.prefill_seconds += clock_->now_seconds() - start;
}

void DraftVerifyEngine::commit_window(Request& r, const float* rows) {
  const int64_t vocab = model_.config().vocab_size;
  const int64_t x = static_cast<int64_t>(r.drafts.size());
  // Row 0 decides the output token after the last committed one (test-only faults, test_faults.h).
  std::vector<float> faulted_rows;
  const int64_t first_output = r.committed + 1 - static_cast<int64_t>(r.req.prompt.size());
  rows = apply_verify_row_fault(options_.test_fault, r.id, first_output, x, vocab, rows, &faulted_rows);
  WindowVerdict v;
  if (r.req.sampling.greedy()) {
    v = verify_greedy(r.drafts, rows, vocab);
  } else {
    std::vector<std::vector<float>> target(x + 1);
    for (int64_t i = 0; i <= x; ++i) target[i] = dense_distribution(rows + i * vocab, vocab, r.req.sampling);
    apply_target_fault(options_.test_fault, &target);
    apply_draft_probs_fault(options_.test_fault, &r.draft_probs);
    v = verify_sampled(r.drafts, r.draft_probs, options_.draft_sampling, target, r.rng);
  }
  RequestMetrics& m = r.result.metrics;
  ++m.verify_windows;
  if (x > 0) {
    ++m.drafts;
    m.draft_tokens += x;
    m.accepted_tokens += v.accepted;
    if (static_cast<int64_t>(m.drafted_per_position.size()) < x) {
      m.drafted_per_position.resize(x, 0);
      m.accepted_per_position.resize(x, 0);
    }
    for (int64_t i = 0; i < x; ++i) ++m.drafted_per_position[i];
    for (int64_t i = 0; i < v.accepted; ++i) ++m.accepted_per_position[i];
  }
  if (options_.sink != nullptr) {
    options_.sink->on_window(WindowRecord{r.id, x, v.accepted});
    for (int64_t i = 0; i <= v.accepted; ++i) {
      options_.sink->on_token_logits(r.id, r.committed + 1 + i, std::span<const float>(rows + i * vocab, vocab));
    }
  }

  // KV_full keeps the last committed token and the accepted drafts: rows 0..accepted.
  const int64_t old = r.committed, end = old + v.accepted + 1;
  if (options_.transfer != nullptr) {
    // The verify forward wrote into the transient copy: carry the committed rows to the host store.
    const Status s = r.full.append_range(host_pool_, r.staged, device_pool_, old, end - old);
    VC_CHECK(s.ok(), "writing back verified K/V: the admission reservation did not hold");
    r.staged.release(device_pool_);
    r.ticket = 0;
  } else {
    r.full.truncate(host_pool_, end);
  }
  if (!r.full_only) {
    // Roll KV_comp back by position, then fill it up to `end` with verified K/V from KV_full.
    r.comp_end = std::min(r.comp_end, options_.draft_kv == DraftKv::kVerified ? old : end);
    r.comp.truncate_positions(device_pool_, r.comp_end);
    const Status s = r.comp.append_range(device_pool_, r.full, host_pool_, r.comp_end, end - r.comp_end);
    VC_CHECK(s.ok(), "refilling KV_comp: the admission reservation did not hold");
    r.comp_end = end;
    // An online compressor sees the committed rows of the verify forward, then its drops apply.
    if (!r.window_rows.empty()) {
      std::vector<LayerDrops> drops;
      Status status;
      for (size_t l = 0; l < r.window_rows.size() && status.ok(); ++l) {
        const Request::Rows& w = r.window_rows[l];
        LayerActivations all;
        all.layer = static_cast<int64_t>(l);
        all.residual = w.residual;
        all.hidden = w.hidden;
        all.q = w.q;
        all.k = w.k;
        all.v = w.v;
        all.positions = w.positions;
        // The committed rows are KV_comp's last end - old slots of this layer.
        RequestRows rows_of_request{{}, {}, r.id, options_.ratio, r.comp.length(static_cast<int64_t>(l)) - (end - old)};
        narrow_rows(all, 0, v.accepted + 1, &rows_of_request);
        const size_t before = drops.size();
        status = options_.compressor->update(rows_of_request.acts, &drops);
        for (size_t i = before; i < drops.size(); ++i) drops[i].layer = static_cast<int64_t>(l);
      }
      for (const LayerDrops& d : drops) {
        if (!status.ok()) break;
        if (d.request_id != r.id) {
          status = Status::plugin_error(options_.compressor->name() + ": drops for unknown request " +
                                        std::to_string(d.request_id));
        } else if (Status s = r.comp.drop(device_pool_, d.layer, d.positions); !s.ok()) {
          status = Status::plugin_error(options_.compressor->name() + ": " + s.message());
        }
      }
      r.window_rows.clear();
      if (!status.ok()) fall_back_to_full(r, status);
    }
    if (quantizer() && !r.full_only) {
      if (Status s = pack_comp(r); !s.ok()) fall_back_to_full(r, s);
    }
  }
  r.committed = end;
  r.pending = v.next;
  const std::vector<int32_t> drafts = std::move(r.drafts);
  r.drafts.clear();
  r.draft_probs.clear();
  r.phase = Phase::kDraft;
  r.verify_due = false;
  for (int64_t i = 0; i < v.accepted; ++i) commit_token(r, drafts[i], old + 1 + i);
  commit_token(r, v.next, end);
  schedule(r);
}

Status DraftVerifyEngine::run_forward(std::vector<Request*>& members, double stall_seconds) {
  std::vector<ForwardItem> batch;
  std::vector<Phase> phases;
  StepRecord record;
  record.stall_seconds = stall_seconds;
  record.start_seconds = clock_->now_seconds();
  for (Request* r : members) {
    phases.push_back(r->phase);
    if (r->phase == Phase::kPrefill) {
      const auto n = static_cast<int64_t>(r->req.prompt.size());
      const int64_t take = std::min(options_.prefill_chunk, n - r->prefilled);
      r->tokens.assign(r->req.prompt.begin() + r->prefilled, r->req.prompt.begin() + r->prefilled + take);
      r->positions.resize(take);
      for (int64_t i = 0; i < take; ++i) r->positions[i] = static_cast<int32_t>(r->prefilled + i);
      batch.push_back({r->tokens, r->positions, &r->full, &host_pool_,
                       r->prefilled + take == n ? LogitRows::kLast : LogitRows::kNone, r->id});
      ++record.prefill_items;
      record.prefill_rows += take;
    } else if (r->phase == Phase::kDraft) {
      r->tokens = {r->drafts.empty() ? r->pending : r->drafts.back()};
      r->positions = {static_cast<int32_t>(r->committed + static_cast<int64_t>(r->drafts.size()))};
      // A failing unpack() fails this request's drafting (it falls back to full KV), not the batch.
      batch.push_back({r->tokens, r->positions, &r->comp, &device_pool_, LogitRows::kLast, r->id,
                       packed_pool_ ? &*packed_pool_ : nullptr, quantizer() ? options_.compressor : nullptr,
                       quantizer() ? &r->compressor_status : nullptr, quantizer() ? &packed_format_ : nullptr});
      ++record.draft_items;
    } else {
      r->tokens.assign(1, r->pending);
      r->tokens.insert(r->tokens.end(), r->drafts.begin(), r->drafts.end());
      r->positions.resize(r->tokens.size());
      for (size_t i = 0; i < r->tokens.size(); ++i)
        r->positions[i] = static_cast<int32_t>(r->committed + static_cast<int64_t>(i));
      if (options_.transfer != nullptr) {
        batch.push_back({r->tokens, r->positions, &r->staged, &device_pool_, LogitRows::kAll, r->id});
      } else {
        batch.push_back({r->tokens, r->positions, &r->full, &host_pool_, LogitRows::kAll, r->id});
      }
      ++record.verify_items;
      if (options_.compressor != nullptr && options_.compressor->mode() == CompressionMode::kOnline && !r->full_only) {
        r->window_rows.assign(model_.config().n_layers, {});
      }
    }
    record.rows += static_cast<int64_t>(r->tokens.size());
    const SequenceKv& kv = *batch.back().kv;
    for (int64_t l = 0; l < kv.n_layers(); ++l) record.kv_slots_read += kv.total_length(l);
    record.kv_slots_read += kv.n_layers() * static_cast<int64_t>(r->tokens.size());
  }

  // The compressor sees prefill rows as they are computed (its drops shape KV_comp), and the
  // verify rows of online-compressed requests are kept until the window's verdict is known.
  Compressor* c = options_.compressor;
  LayerObserver observer;
  if (c != nullptr) {
    observer = [&](const LayerActivations& acts) -> Status {
      for (size_t i = 0; i < members.size(); ++i) {
        Request& r = *members[i];
        const int64_t begin = acts.row_offsets[i], n = acts.row_offsets[i + 1] - begin;
        if (r.full_only || !r.compressor_status.ok() || n == 0) continue;
        if (phases[i] == Phase::kPrefill) {
          RequestRows rows{{}, {}, r.id, options_.ratio, acts.cache_lengths[i]};
          narrow_rows(acts, begin, n, &rows);
          std::vector<LayerDrops> drops;
          r.compressor_status = c->update(rows.acts, &drops);
          const int64_t heads = model_.config().n_kv_heads;
          for (const LayerDrops& d : drops) {
            if (!r.compressor_status.ok()) break;
            if (d.request_id != r.id || !d.positions.defined() || d.positions.dim() != 2 ||
                d.positions.size(0) != heads || d.positions.scalar_type() != at::kLong) {
              r.compressor_status = Status::plugin_error(c->name() + ": layer " + std::to_string(acts.layer) +
                                                         ": drops must be an int64 tensor [" + std::to_string(heads) +
                                                         ", n] for this request");
              break;
            }
            if (r.dropped.empty()) r.dropped.assign(model_.config().n_layers, std::vector<std::vector<int64_t>>(heads));
            const at::Tensor p = d.positions.to(at::kCPU).contiguous();
            const int64_t* data = p.data_ptr<int64_t>();
            for (int64_t h = 0; h < heads; ++h) {
              for (int64_t j = 0; j < p.size(1); ++j) {
                const int64_t position = data[h * p.size(1) + j];
                if (position < 0 || position >= r.prefilled + n) {
                  r.compressor_status =
                      Status::plugin_error(c->name() + ": layer " + std::to_string(acts.layer) + ": dropped position " +
                                           std::to_string(position) + " is not held");
                  break;
                }
                r.dropped[acts.layer][h].push_back(position);
              }
            }
          }
        } else if (phases[i] == Phase::kVerify && !r.window_rows.empty()) {
          r.window_rows[acts.layer] =
              Request::Rows{acts.residual.narrow(0, begin, n).clone(), acts.hidden.narrow(0, begin, n).clone(),
                            acts.q.narrow(0, begin, n).clone(),
                            acts.k.narrow(0, begin, n).clone(), acts.v.narrow(0, begin, n).clone(),
                            acts.positions.narrow(0, begin, n).clone()};
        }
      }
      return Status();
    };
  }
  at::Tensor logits;
  VC_RETURN_IF_ERROR(model_.forward(batch, &logits, observer));
  const double seconds = clock_->now_seconds() - record.start_seconds;
  if (options_.scheduler != nullptr && record.prefill_items == 0) options_.scheduler->observe_iteration(seconds);

  const int64_t vocab = model_.config().vocab_size;
  int64_t row = 0;
  for (size_t i = 0; i < members.size(); ++i) {
    Request& r = *members[i];
    RequestMetrics& m = r.result.metrics;
    if (phases[i] == Phase::kPrefill) {
      m.prefill_seconds += seconds;
      r.prefilled += static_cast<int64_t>(r.tokens.size());
      if (batch[i].logits == LogitRows::kLast) {
        finish_prefill(r, logits[row].data_ptr<float>());
        ++row;
      }
    } else if (phases[i] == Phase::kDraft) {
      m.draft_seconds += seconds;
      ++m.draft_steps;
      const float* lossy = logits[row++].data_ptr<float>();
      if (!r.compressor_status.ok()) {  // unpack() failed: the row read zeros for the packed slots
        fall_back_to_full(r, r.compressor_status);
        continue;
      }
      int32_t draft;
      if (r.req.sampling.greedy() || options_.draft_sampling == DraftSampling::kArgmax) {
        draft = argmax(lossy, vocab);
      } else {
        r.draft_probs.push_back(dense_distribution(lossy, vocab, r.req.sampling));
        draft = sample_dense(r.draft_probs.back(), r.draft_rng);
      }
      r.drafts.push_back(draft);
      r.comp_end = r.committed + static_cast<int64_t>(r.drafts.size());
      if (options_.scheduler == nullptr && static_cast<int64_t>(r.drafts.size()) >= r.window) r.phase = Phase::kVerify;
    } else {
      m.verify_seconds += seconds;
      const int64_t rows = static_cast<int64_t>(r.tokens.size());
      commit_window(r, logits[row].data_ptr<float>());
      row += rows;
    }
    if (!r.compressor_status.ok() && !r.full_only) fall_back_to_full(r, r.compressor_status);
  }
  record.seconds = clock_->now_seconds() - record.start_seconds;  // the forward and what followed it
  if (options_.sink != nullptr) options_.sink->on_step(record);
  return Status();
}

Status DraftVerifyEngine::step() {
  VC_RETURN_IF_ERROR(validate_options());
  admit();
  sched::ReloadScheduler* scheduler = options_.scheduler;
  if (scheduler != nullptr) apply_schedule();
  std::vector<Request*> members;
  std::vector<Request*> waiting;  // verify windows whose KV_full copy is not in yet
  std::vector<Request*> stalled;  // scheduler: verifies due whose copy is in flight
  int64_t running = 0;
  for (auto& r : active_) {
    if (r->done) continue;
    ++running;
    if (r->phase == Phase::kDraft && r->drafts.empty()) {
      // A new window starts: how many tokens to draft (0: verify the last token alone).
      r->window = window_for(*r);
      if (r->window == 0 && scheduler == nullptr) r->phase = Phase::kVerify;
    }
    if (scheduler == nullptr) {
      // The copy of KV_full the window verifies against starts with it, overlapping the drafting
      // (retried every step until transient pages are free).
      if (r->phase != Phase::kPrefill) start_transfer(*r);
    } else {
      if (r->verify_due && r->phase == Phase::kDraft) r->phase = Phase::kVerify;
      if (r->reload_due) {
        start_transfer(*r);
        r->reload_due = options_.transfer != nullptr && r->ticket == 0;
      }
      if (r->phase == Phase::kDraft && static_cast<int64_t>(r->drafts.size()) >= r->window) continue;
    }
    if (r->phase == Phase::kVerify && options_.transfer != nullptr) {
      if (r->ticket == 0 || (scheduler == nullptr && !options_.transfer->done(r->ticket))) {
        waiting.push_back(r.get());
        continue;
      }
      if (!options_.transfer->done(r->ticket)) stalled.push_back(r.get());
    }
    members.push_back(r.get());
  }
  if (members.empty() && !waiting.empty() && scheduler == nullptr) {
    // Nothing else to run: block on the first copy in flight (requests without one wait for the
    // transient pages the others hold; if none holds any, submit cannot have failed).
    const auto it = std::find_if(waiting.begin(), waiting.end(), [](const Request* w) { return w->ticket != 0; });
    VC_CHECK(it != waiting.end(), "verify windows wait for transient pages that no request holds");
    Request& r = **it;
    r.result.metrics.transfer_wait_seconds += options_.transfer->wait(r.ticket);
    members.push_back(&r);
    waiting.erase(it);
  }
  if (running == 0 && !queue_.empty()) {
    return Status::internal("engine: queued requests cannot be admitted although nothing runs");
  }
  if (options_.transfer != nullptr) VC_RETURN_IF_ERROR(options_.transfer->status());
  const double start = clock_->now_seconds();
  for (Request* r : stalled) {
    options_.transfer->wait(r->ticket);
    r->result.metrics.transfer_wait_seconds += clock_->now_seconds() - start;
  }
  const double stall = stalled.empty() ? 0.0 : clock_->now_seconds() - start;
  if (!members.empty()) VC_RETURN_IF_ERROR(run_forward(members, stall));
  for (Request* r : waiting) r->result.metrics.transfer_wait_seconds += clock_->now_seconds() - start;
  for (size_t i = 0; i < active_.size();) {
    if (active_[i]->done) {
      finish(*active_[i]);
      active_.erase(active_.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  if (scheduler != nullptr) {
    scheduler->advance();
    VC_RETURN_IF_ERROR(scheduler_status_);
  }
  return Status();
}

Status DraftVerifyEngine::run() {
  while (!idle()) VC_RETURN_IF_ERROR(step());
  return Status();
}

std::vector<EngineResult> DraftVerifyEngine::take_finished() {
  std::vector<EngineResult> out = std::move(finished_);
  finished_.clear();
  return out;
}

}  // namespace vericache
