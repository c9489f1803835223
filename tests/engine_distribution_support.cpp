#include "engine_distribution_support.h"

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <optional>

#include "compression_support.h"
#include "engine/engine_pools.h"
#include "test_support.h"

namespace vericache::testing {
namespace {

constexpr int64_t kTokens = 4;         // generated per request: token 1 from the prefill, 2-4 from verify windows
constexpr int64_t kDraftLength = 2;    // tokens 2-3 drafted in the first window
constexpr int64_t kEngineBatch = 250;  // requests per engine (each copies the prompt's K/V)
constexpr int kPromptIndex = 7;        // of datasets/lossless_prompts

std::vector<int32_t> prompt(const LlamaModel& m) {
  const auto j = nlohmann::json::parse(read_file(source_path("datasets/lossless_prompts/prompts.json")));
  const auto& p = j.at("prompts")[kPromptIndex];
  return prompt_ids(m, p.at("text"), p.at("chat"));
}

// The prompt prefilled once: its full cache and next-token logits, shared by every request.
struct PrefilledPrompt {
  std::vector<int32_t> ids;
  std::optional<PagePool> pool;
  SequenceKv kv{0};
  std::vector<float> next_logits;
};

std::unique_ptr<PrefilledPrompt> prefill(const LlamaModel& m, const std::vector<int32_t>& ids) {
  auto p = std::make_unique<PrefilledPrompt>();
  p->ids = ids;
  const int64_t layers = m.config().n_layers;
  auto pool = m.make_page_pool(16, layers * ((static_cast<int64_t>(ids.size()) + 2200) / 16 + 4));
  EXPECT_TRUE(pool.ok());
  p->pool.emplace(std::move(*pool));
  p->kv = SequenceKv(layers);
  std::vector<int32_t> positions(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) positions[i] = static_cast<int32_t>(i);
  ForwardItem item{ids, positions, &p->kv, &*p->pool, LogitRows::kLast, 0};
  at::Tensor logits;
  EXPECT_TRUE(m.forward(std::span(&item, 1), &logits).ok());
  p->next_logits.assign(logits[0].data_ptr<float>(), logits[0].data_ptr<float>() + m.config().vocab_size);
  return p;
}

// Full-KV logits after the prompt and `continuation` (a teacher-forced forward, rolled back after).
std::vector<float> full_kv_logits(const LlamaModel& m, PrefilledPrompt& p, const std::vector<int32_t>& continuation) {
  if (continuation.empty()) return p.next_logits;
  const auto n = static_cast<int32_t>(p.ids.size());
  std::vector<int32_t> positions;
  for (size_t i = 0; i < continuation.size(); ++i) positions.push_back(n + static_cast<int32_t>(i));
  ForwardItem item{continuation, positions, &p.kv, &*p.pool, LogitRows::kLast, 0};
  at::Tensor out;
  EXPECT_TRUE(m.forward(std::span(&item, 1), &out).ok());
  p.kv.truncate_positions(*p.pool, n);
  const float* row = out[0].data_ptr<float>();
  return std::vector<float>(row, row + m.config().vocab_size);
}

// The exact full-KV sampling distribution of the output's first 2, 3 and 4 tokens, as cells: every
// prefix that full-KV sampling produces with probability >= min_p is a cell of its own, all other
// prefixes of that length one more cell (the empty outcome) holding the rest of the mass. Each
// cell's probability is exact (a product of full-KV probabilities), so the cut loses no exactness,
// only the resolution of rare outcomes, which the chi-square test could not use anyway.
struct Expected {
  std::map<Outcome, double> prefix[3];  // [k]: the first k + 2 tokens
};
const Outcome kOther{};  // the cell of every rarer prefix

class ExactDistributions {
 public:
  ExactDistributions(const LlamaModel& m, PrefilledPrompt& p) : m_(m), p_(p) {}

  Expected at(double temperature, double min_p) {
    const SamplingParams params{temperature, 0, 1.0, 0};
    Expected e;
    // Walk the prefixes of probability >= min_p, breadth first; each extension of one is a cell.
    std::vector<std::pair<Outcome, double>> level{{{}, 1.0}};
    for (int depth = 0; depth < 4; ++depth) {
      std::vector<std::pair<Outcome, double>> next;
      for (const auto& [prefix, probability] : level) {
        const SamplingDistribution d = distribution(prefix, params);
        for (size_t i = 0; i < d.ids.size(); ++i) {
          const double q = probability * d.probs[i];
          if (q < min_p) break;  // ids come most likely first
          Outcome longer = prefix;
          longer.push_back(d.ids[i]);
          if (depth >= 1) e.prefix[depth - 1][longer] = q;
          next.push_back({longer, q});
        }
      }
      level = std::move(next);
    }
    for (auto& cells : e.prefix) {
      double listed = 0;
      for (const auto& [outcome, q] : cells) listed += q;
      cells[kOther] = std::max(0.0, 1.0 - listed);
    }
    return e;
  }

 private:
  SamplingDistribution distribution(const Outcome& prefix, const SamplingParams& params) {
    auto it = logits_.find(prefix);
    if (it == logits_.end()) it = logits_.emplace(prefix, full_kv_logits(m_, p_, prefix)).first;
    return make_distribution(it->second.data(), m_.config().vocab_size, params);
  }

  const LlamaModel& m_;
  PrefilledPrompt& p_;
  std::map<Outcome, std::vector<float>> logits_;  // per prefix, shared by every temperature
};

struct Observed {
  std::map<Outcome, int64_t> prefix[3];  // [k]: the first k + 2 tokens, as output
  int64_t drafted = 0, accepted = 0;
};

// Observed prefixes outside the expected cells counted in the "other" cell.
std::map<Outcome, int64_t> into_cells(const std::map<Outcome, int64_t>& observed, const std::map<Outcome, double>& cells) {
  std::map<Outcome, int64_t> out;
  for (const auto& [outcome, n] : observed) out[cells.count(outcome) ? outcome : kOther] += n;
  return out;
}

// The compressor's kept set for the prompt (a token dropper; empty for a quantizer, which keeps
// every token and packs it).
std::vector<at::Tensor> kept_set(const LlamaModel& m, Compressor& c, double ratio) {
  if (c.family() == CompressorFamily::kQuantization) return {};
  auto run = testing::run_compression(m, c, prompt(m), ratio);
  EXPECT_TRUE(run->status.ok()) << run->status.message();
  c.release(0);
  return run->compressed.kept;
}

}  // namespace

int SamplingResult::rejected() const {
  int n = 0;
  for (const StatisticResult& s : statistics) n += s.rejected;
  return n;
}

struct EngineSamplingCheck::State {
  std::unique_ptr<PrefilledPrompt> prompt;
  std::unique_ptr<ExactDistributions> exact;
  std::map<double, Expected> expected;  // per temperature
};

EngineSamplingCheck::EngineSamplingCheck(const LlamaModel& model, int64_t runs, double alpha)
    : model_(model), runs_(runs), alpha_(alpha), state_(std::make_unique<State>()) {
  state_->prompt = prefill(model, prompt(model));
  state_->exact = std::make_unique<ExactDistributions>(model, *state_->prompt);
}

EngineSamplingCheck::~EngineSamplingCheck() = default;

std::vector<SamplingResult> EngineSamplingCheck::run(const SamplingCompressor& c, DraftSampling mode,
                                                     std::span<const double> temperatures, const TestFault& fault,
                                                     const DraftPolicyOptions& policy) {
  const LlamaModel& m = model_;
  const PrefilledPrompt& p = *state_->prompt;
  std::vector<SamplingResult> results;
  auto compressor = bundled_compressor(c.name, c.params, m);
  EXPECT_NE(compressor, nullptr) << c.name;
  if (compressor == nullptr) return results;
  const std::vector<at::Tensor> kept = kept_set(m, *compressor, c.ratio);
  EngineOptions options;
  options.compressor = compressor.get();
  options.ratio = c.ratio;
  options.draft_length = kDraftLength;
  options.draft_sampling = mode;
  options.test_fault = fault;
  options.draft_policy = policy;
  std::vector<GenerationRequest> all;
  for (double t : temperatures) {
    for (int64_t seed = 0; seed < runs_; ++seed) {
      GenerationRequest r;
      r.prompt = p.ids;
      r.max_new_tokens = kTokens;
      r.ignore_eos = true;
      r.sampling = {t, 0, 1.0, static_cast<uint64_t>(seed)};
      all.push_back(std::move(r));
    }
  }
  std::map<double, Observed> observed;
  // Pools for one batch (every request has the same prompt), reused by every batch.
  const size_t largest = std::min(all.size(), static_cast<size_t>(kEngineBatch));
  auto pools = make_engine_pools(m, options, 16, std::span(all).first(largest));
  EXPECT_TRUE(pools.ok()) << pools.status().message();
  if (!pools.ok()) return results;
  for (size_t begin = 0; begin < all.size(); begin += kEngineBatch) {
    const std::vector<GenerationRequest> batch(all.begin() + static_cast<std::ptrdiff_t>(begin),
                                               all.begin() + static_cast<std::ptrdiff_t>(std::min(all.size(), begin + kEngineBatch)));
    DraftVerifyEngine engine(m, pools->device, pools->host, options);
    for (const GenerationRequest& r : batch) EXPECT_TRUE(engine.add_prefilled(r, p.kv, *p.pool, p.next_logits, kept).ok());
    const Status s = engine.run();
    EXPECT_TRUE(s.ok()) << s.message();
    for (const EngineResult& r : engine.take_finished()) {
      EXPECT_EQ(r.compressor_failure, "");
      const std::vector<int32_t>& t = r.generation.tokens;
      EXPECT_EQ(static_cast<int64_t>(t.size()), kTokens);
      if (static_cast<int64_t>(t.size()) != kTokens) continue;
      Observed& o = observed[batch[r.request_id].sampling.temperature];
      for (int k = 0; k < 3; ++k) ++o.prefix[k][Outcome(t.begin(), t.begin() + k + 2)];
      o.drafted += r.metrics.draft_tokens;
      o.accepted += r.metrics.accepted_tokens;
    }
  }
  static const char* names[] = {"tokens 1-2", "tokens 1-3", "tokens 1-4"};
  for (double t : temperatures) {
    auto it = state_->expected.find(t);
    if (it == state_->expected.end())
      it = state_->expected.emplace(t, state_->exact->at(t, 5.0 / static_cast<double>(runs_))).first;
    const Expected& e = it->second;
    const Observed& o = observed[t];
    SamplingResult r;
    char label[160];
    std::snprintf(label, sizeof(label), "%s c=%g T=%.1f %s drafts%s%s", c.name.c_str(), c.ratio, t,
                  draft_sampling_name(mode), fault.kind == TestFaultKind::kNone ? "" : ", fault ",
                  fault.kind == TestFaultKind::kNone ? "" : describe_test_fault(fault).c_str());
    r.label = label;
    r.drafted = o.drafted;
    r.accepted = o.accepted;
    r.acceptance = o.drafted ? static_cast<double>(o.accepted) / static_cast<double>(o.drafted) : 0.0;
    std::printf("%s: acceptance %.3f |", r.label.c_str(), r.acceptance);
    for (int k = 0; k < 3; ++k) {
      StatisticResult st;
      st.name = names[k];
      st.fit = goodness_of_fit(into_cells(o.prefix[k], e.prefix[k]), e.prefix[k], runs_);
      st.rejected = st.fit.p_value < alpha_;
      st.w99 = detectable_effect(runs_, st.fit.dof, alpha_, 0.99);
      std::printf(" %s chi2 %.1f dof %d p %.2g w %.3f (w99 %.3f)%s |", st.name.c_str(), st.fit.chi2, st.fit.dof,
                  st.fit.p_value, st.fit.effect_size, st.w99, st.rejected ? " REJECTED" : "");
      r.statistics.push_back(st);
    }
    std::printf("\n");
    std::fflush(stdout);
    results.push_back(std::move(r));
  }
  return results;
}

void expect_follows_full_kv(const SamplingResult& r, double w) {
  EXPECT_LT(r.accepted, r.drafted) << r.label << ": no draft was rejected, the residual was never drawn from";
  EXPECT_GT(r.accepted, 0) << r.label << ": no draft was accepted";
  for (const StatisticResult& s : r.statistics) {
    EXPECT_FALSE(s.rejected) << r.label << ", " << s.name << ": chi2 " << s.fit.chi2 << " (dof " << s.fit.dof
                             << "), p " << s.fit.p_value;
    EXPECT_LE(s.w99, w) << r.label << ", " << s.name << ": too few runs to find effect size " << w
                        << " with probability 0.99";
  }
}

void expect_every_fault_rejected(EngineSamplingCheck& check, const SamplingCompressor& compressor,
                                 std::span<const double> temperatures) {
  const std::pair<DraftSampling, TestFaultKind> faults[] = {
      {DraftSampling::kSampled, TestFaultKind::kDraftProbsFromNextRow},
      {DraftSampling::kArgmax, TestFaultKind::kTargetFromNextRow}};
  for (const auto& [mode, kind] : faults) {
    TestFault fault;
    fault.kind = kind;
    for (const SamplingResult& r : check.run(compressor, mode, temperatures, fault))
      EXPECT_GT(r.rejected(), 0) << r.label << ": the test did not notice the fault";
  }
}

}  // namespace vericache::testing
