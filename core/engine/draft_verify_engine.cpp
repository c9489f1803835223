#include "engine/draft_verify_engine.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "engine/compressed_kv_check.h"
#include "engine/compression.h"
#include "engine/compressor_feed.h"
#include "engine/drafting.h"
#include "engine/engine_request.h"
#include "engine/window_verdict.h"
#include "util/check.h"

namespace vericache {

const char* draft_kv_name(DraftKv mode) { return mode == DraftKv::kDrafted ? "drafted" : "verified"; }

DraftVerifyEngine::DraftVerifyEngine(const LlamaModel& model, PagePool& device_pool, PagePool& host_pool,
                                     EngineOptions options)
    : model_(model),
      device_pool_(device_pool),
      host_pool_(host_pool),
      options_(options),
      clock_(options.clock != nullptr ? options.clock : &steady_clock_),
      policy_(options.draft_policy, options.draft_length) {
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
  VC_RETURN_IF_ERROR(check_draft_policy_options(options_.draft_policy));
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

int64_t DraftVerifyEngine::window_for(const EngineRequest& r) const {
  if (r.full_only) return 0;
  const int64_t remaining = r.req.max_new_tokens - static_cast<int64_t>(r.result.generation.tokens.size());
  // The verify forward runs positions committed .. committed + x, all inside the context.
  const int64_t room = model_.config().context_length - 1 - r.committed;
  const int64_t wanted =
      options_.scheduler != nullptr ? max_window(options_) : policy_.next_window(r.policy, reads_of(r));
  return std::clamp<int64_t>(std::min({remaining - 1, room, wanted}), 0, max_window(options_));
}

RequestReads DraftVerifyEngine::reads_of(const EngineRequest& r) const {
  if (options_.draft_policy.kind != DraftPolicyKind::kGoodput) return {};
  // Packed slots count as float slots: a quantizer's drafts read fewer bytes but unpack them.
  RequestReads reads;
  // A KV_comp left behind (defers_comp_refill) is read in full once the request drafts again.
  const int64_t behind = r.committed - r.comp_end;
  for (int64_t l = 0; l < r.full.n_layers(); ++l) {
    reads.full_bytes += slot_bytes() * static_cast<double>(r.full.length(l));
    if (!r.full_only) reads.comp_bytes += slot_bytes() * static_cast<double>(r.comp.total_length(l) + behind);
  }
  reads.transfer = options_.transfer != nullptr;
  return reads;
}

double DraftVerifyEngine::slot_bytes() const {
  return static_cast<double>(device_pool_.page_bytes()) / static_cast<double>(device_pool_.spec().page_size);
}

int64_t DraftVerifyEngine::max_window(const EngineOptions& options) {
  return options.scheduler != nullptr ? options.scheduler->options().window - 2 : options.draft_length;
}

void DraftVerifyEngine::schedule(EngineRequest& r) {
  if (options_.scheduler == nullptr || r.done) return;
  // What the copy takes: transient pages for KV_full and the longest window (start_transfer's
  // reservation). The verify is planned at the draft policy's window for this request.
  const int64_t longest = window_for(r);
  const int64_t pages = r.full.n_layers() * device_pool_.spec().pages_for(r.committed + longest + 1);
  const int64_t planned = std::min(longest, policy_.next_window(r.policy, reads_of(r)));
  const Status s = options_.scheduler->admit(r.id, static_cast<double>(pages * device_pool_.page_bytes()), planned);
  if (!s.ok() && scheduler_status_.ok()) scheduler_status_ = s;
}

void DraftVerifyEngine::apply_schedule() {
  const sched::ReloadScheduler::Events events = options_.scheduler->events_now();
  auto request = [&](int64_t id) -> EngineRequest& {
    const auto it = std::find_if(active_.begin(), active_.end(), [id](const auto& r) { return r->id == id; });
    VC_CHECK(it != active_.end(), "the scheduler planned a request the engine does not run");
    return **it;
  };
  for (const sched::ReloadPlan& p : events.reloads_starting) request(p.request).reload_due = true;
  for (const sched::ReloadPlan& p : events.verifying) request(p.request).verify_due = true;
}

void DraftVerifyEngine::fall_back_to_full(EngineRequest& r, const Status& why) {
  if (r.result.compressor_failure.empty()) r.result.compressor_failure = why.message();
  r.full_only = true;
  release_comp(r);
  r.window_rows.clear();
  r.row_drops.clear();
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

void DraftVerifyEngine::start_transfer(EngineRequest& r) {
  if (options_.transfer == nullptr || r.ticket != 0) return;
  auto ticket = options_.transfer->submit(r.full, host_pool_, &r.staged, device_pool_, r.window + 1);
  if (!ticket.ok()) return;  // no transient pages free now: tried again next step
  r.ticket = *ticket;
  int64_t pages = 0;  // the pages copied (the window's extra slots are reserved, not copied)
  for (int64_t l = 0; l < r.full.n_layers(); ++l) pages += host_pool_.spec().pages_for(r.full.length(l));
  r.result.metrics.transfer_bytes += pages * host_pool_.page_bytes();
}

void DraftVerifyEngine::finish(EngineRequest& r) {
  if (r.ticket != 0) options_.transfer->wait(r.ticket);
  r.ticket = 0;
  r.staged.release(device_pool_);
  // The resident bytes reported are those of a KV_comp holding every committed token.
  if (Status s = catch_up_comp(r); !s.ok() && r.result.compressor_failure.empty()) {
    r.result.compressor_failure = s.message();
  }
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

void DraftVerifyEngine::commit_token(EngineRequest& r, int32_t token, int64_t position) {
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

Status DraftVerifyEngine::build_compressed(EngineRequest& r) {
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
    VC_ASSIGN_OR_RETURN(kept, kept_after_drops(c->name(), r.dropped, n, spec.n_layers, spec.n_kv_heads));
    r.dropped.clear();
  }
  // Admission reserved the kept set's pages by the bound the compressor declared: a kept set over
  // it is the plugin's error (the request then decodes on KV_full), never an allocation failure.
  int64_t slots = 0;
  for (const at::Tensor& k : kept) slots += k.size(1);
  if (slots > r.demand.kept_slots) {
    return Status::plugin_error((c != nullptr ? c->name() : std::string("kept set")) + ": kept " +
                                std::to_string(slots) + " slots (summed over layers), more than the " +
                                std::to_string(r.demand.kept_slots) + " its footprint() declared");
  }
  const Status s = r.comp.assign_kept(device_pool_, r.full, host_pool_, kept);
  VC_CHECK(s.ok(), "building KV_comp: the admission reservation did not hold");
  return quantizer() ? pack_comp(r) : Status();
}

Status DraftVerifyEngine::pack_comp(EngineRequest& r) {
  return pack_front(*options_.compressor, packed_format_, device_pool_, *packed_pool_, r.comp, r.id);
}

bool DraftVerifyEngine::defers_comp_refill(const EngineRequest& r) const {
  const Compressor* c = options_.compressor;
  // An online dropper's drops apply to KV_comp as rows commit, so its KV_comp keeps up; a quantizer
  // never drops (update() still sees every row), so its KV_comp can wait as an offline one's does.
  return r.drafts.empty() && !options_.eager_comp_refill_for_testing &&
         (c == nullptr || c->mode() != CompressionMode::kOnline || quantizer());
}

Status DraftVerifyEngine::catch_up_comp(EngineRequest& r) {
  if (r.full_only || r.comp_end >= r.committed) return Status();
  if (options_.test_fault.kind == TestFaultKind::kSkipCompCatchUp) {
    r.comp_end = r.committed;
    return Status();
  }
  refill_comp(r, device_pool_, host_pool_, r.committed);
  return quantizer() ? pack_comp(r) : Status();
}

void DraftVerifyEngine::release_comp(EngineRequest& r) {
  if (packed_pool_) r.comp.release_packed(*packed_pool_);
  r.comp.release(device_pool_);
}

void DraftVerifyEngine::finish_prefill(EngineRequest& r, const float* logits) {
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

void DraftVerifyEngine::commit_window(EngineRequest& r, const float* rows) {
  const int64_t vocab = model_.config().vocab_size;
  const int64_t x = static_cast<int64_t>(r.drafts.size());
  const WindowVerdict v = judge_window(r, rows, vocab, options_);
  r.result.metrics.add_window(x, v.accepted);
  policy_.observe_window(r.policy, x, v.accepted);
  if (options_.sink != nullptr) {
    options_.sink->on_window(WindowRecord{r.id, x, v.accepted});
    for (int64_t i = 0; i <= v.accepted; ++i) {
      options_.sink->on_token_logits(r.id, r.committed + 1 + i, std::span<const float>(rows + i * vocab, vocab));
    }
  }
  const int64_t old = r.committed, end = old + v.accepted + 1;
  const bool defer = defers_comp_refill(r);
  roll_back(r, v.accepted, device_pool_, host_pool_, options_.transfer != nullptr, options_.draft_kv, defer);
  if (!r.full_only && !r.window_rows.empty()) {
    // An online compressor sees the committed rows of the verify forward, then its drops apply.
    const Status s = feed_committed_rows(*options_.compressor, r.window_rows, end - old, r.id, options_.ratio, r.comp,
                                         device_pool_);
    r.window_rows.clear();
    if (!s.ok()) fall_back_to_full(r, s);
  }
  if (!r.full_only && !r.row_drops.empty() && r.compressor_status.ok()) {
    // A window of no drafts: update() saw its row during the forward; its drops apply now.
    const Status s = apply_request_drops(*options_.compressor, r.row_drops, r.id, r.comp, device_pool_);
    r.row_drops.clear();
    if (!s.ok()) fall_back_to_full(r, s);
  }
  if (quantizer() && !r.full_only && !defer) {
    if (Status s = pack_comp(r); !s.ok()) fall_back_to_full(r, s);
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

Status DraftVerifyEngine::run_forward(std::vector<EngineRequest*>& members, double stall_seconds) {
  std::vector<ForwardItem> batch;
  std::vector<Phase> phases;
  std::vector<bool> feeds_row;  // verify of no drafts, online compressor: update() sees the row in the forward
  StepRecord record;
  record.stall_seconds = stall_seconds;
  record.start_seconds = clock_->now_seconds();
  for (EngineRequest* r : members) {
    phases.push_back(r->phase);
    feeds_row.push_back(false);
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
      if (feeds_decode_rows(options_.compressor) && !r->full_only) {
        // A window of no drafts commits its one row whatever the verdict: no copy of the rows is kept.
        if (r->drafts.empty() && !options_.eager_comp_refill_for_testing) {
          feeds_row.back() = true;
        } else {
          r->window_rows.assign(model_.config().n_layers, {});
        }
      }
    }
    record.rows += static_cast<int64_t>(r->tokens.size());
    const SequenceKv& kv = *batch.back().kv;
    for (int64_t l = 0; l < kv.n_layers(); ++l) record.kv_slots_read += kv.total_length(l);
    record.kv_slots_read += kv.n_layers() * static_cast<int64_t>(r->tokens.size());
  }

  // The compressor sees prefill rows as they are computed (its drops shape KV_comp), and the
  // verify rows of online-compressed requests are kept until the window's verdict is known. A
  // forward with nothing for it (no prefill, no decode rows it takes) runs without an observer.
  Compressor* c = options_.compressor;
  LayerObserver observer;
  const bool observed = record.prefill_items > 0 || (feeds_decode_rows(c) && record.verify_items > 0);
  if (c != nullptr && observed) {
    observer = [&](const LayerActivations& acts) -> Status {
      for (size_t i = 0; i < members.size(); ++i) {
        EngineRequest& r = *members[i];
        const int64_t begin = acts.row_offsets[i], n = acts.row_offsets[i + 1] - begin;
        if (r.full_only || !r.compressor_status.ok() || n == 0) continue;
        if (phases[i] == Phase::kPrefill) {
          std::vector<LayerDrops> drops;
          r.compressor_status =
              update_for_request(*c, acts, begin, n, r.id, options_.ratio, acts.cache_lengths[i], &drops);
          if (r.compressor_status.ok()) {
            r.compressor_status = record_prefill_drops(c->name(), drops, r.id, acts.layer, r.prefilled + n,
                                                       model_.config().n_layers, model_.config().n_kv_heads, &r.dropped);
          }
        } else if (feeds_row[i]) {
          // The cache the row attends to: KV_comp's for a dropper (which keeps up), every
          // committed token for a quantizer (whose KV_comp may be left behind).
          const int64_t cache_length = quantizer() ? r.committed : r.comp.total_length(acts.layer);
          r.compressor_status =
              update_for_request(*c, acts, begin, n, r.id, options_.ratio, cache_length, &r.row_drops);
        } else if (phases[i] == Phase::kVerify && !r.window_rows.empty()) {
          r.window_rows[acts.layer] =
              WindowRows{acts.residual.narrow(0, begin, n).clone(), acts.hidden.narrow(0, begin, n).clone(),
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
  if (record.prefill_items == 0 && options_.draft_policy.kind == DraftPolicyKind::kGoodput) {
    const auto items = static_cast<int64_t>(members.size());
    policy_.observe_forward(items, record.rows - items, slot_bytes() * static_cast<double>(record.kv_slots_read),
                            seconds);
  }

  const int64_t vocab = model_.config().vocab_size;
  int64_t row = 0;
  for (size_t i = 0; i < members.size(); ++i) {
    EngineRequest& r = *members[i];
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
      if (options_.sink != nullptr) {
        const int64_t position = r.committed + 1 + static_cast<int64_t>(r.drafts.size());
        options_.sink->on_draft_logits(r.id, position, std::span<const float>(lossy, vocab));
      }
      r.drafts.push_back(take_draft(lossy, vocab, r.req.sampling, options_.draft_sampling, r.draft_rng, &r.draft_probs));
      r.comp_end = r.committed + static_cast<int64_t>(r.drafts.size());
      const std::vector<float>* q = r.draft_probs.size() == r.drafts.size() ? &r.draft_probs.back() : nullptr;
      if (options_.scheduler == nullptr && options_.draft_policy.kind == DraftPolicyKind::kConfidence &&
          policy_.stops_window(draft_confidence(lossy, vocab, q))) {
        // A low-confidence draft ends the window and is dropped; the K/V this forward wrote is its
        // input's (the previous draft or the pending token), so comp_end stays.
        r.drafts.pop_back();
        if (r.draft_probs.size() > r.drafts.size()) r.draft_probs.pop_back();
        r.phase = Phase::kVerify;
        continue;
      }
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
  std::vector<EngineRequest*> members;
  std::vector<EngineRequest*> waiting;  // verify windows whose KV_full copy is not in yet
  std::vector<EngineRequest*> stalled;  // scheduler: verifies due whose copy is in flight
  int64_t running = 0;
  if (options_.transfer != nullptr && options_.draft_policy.kind == DraftPolicyKind::kGoodput) {
    const TransferStats link = options_.transfer->stats();
    if (link.busy_seconds > 0) policy_.observe_link(static_cast<double>(link.bytes) / link.busy_seconds);
  }
  for (auto& r : active_) {
    if (r->done) continue;
    ++running;
    if (r->phase == Phase::kDraft && r->drafts.empty()) {
      // A new window starts: how many tokens to draft (0: verify the last token alone).
      r->window = window_for(*r);
      if (r->window > 0) {
        if (Status s = catch_up_comp(*r); !s.ok()) fall_back_to_full(*r, s);  // sets the window to 0
      }
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
    const auto it = std::find_if(waiting.begin(), waiting.end(), [](const EngineRequest* w) { return w->ticket != 0; });
    VC_CHECK(it != waiting.end(), "verify windows wait for transient pages that no request holds");
    EngineRequest& r = **it;
    r.result.metrics.transfer_wait_seconds += options_.transfer->wait(r.ticket);
    members.push_back(&r);
    waiting.erase(it);
  }
  if (running == 0 && !queue_.empty()) {
    return Status::internal("engine: queued requests cannot be admitted although nothing runs");
  }
  if (options_.transfer != nullptr) VC_RETURN_IF_ERROR(options_.transfer->status());
  const double start = clock_->now_seconds();
  for (EngineRequest* r : stalled) {
    options_.transfer->wait(r->ticket);
    r->result.metrics.transfer_wait_seconds += clock_->now_seconds() - start;
  }
  const double stall = stalled.empty() ? 0.0 : clock_->now_seconds() - start;
  if (!members.empty()) VC_RETURN_IF_ERROR(run_forward(members, stall));
  for (EngineRequest* r : waiting) r->result.metrics.transfer_wait_seconds += clock_->now_seconds() - start;
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
