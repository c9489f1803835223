#include "engine/compression_divergence.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "engine/compression.h"
#include "engine/sampler.h"

namespace vericache {
namespace {

double log_sum_exp(const float* logits, int64_t vocab) {
  const double max = *std::max_element(logits, logits + vocab);
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - max);
  return max + std::log(sum);
}

// One token through one cache; the row of next-token logits. A quantizer's cache reads its packed
// slots and packs every block the step completes.
Status step(const LlamaModel& model, PagePool& pool, SequenceKv& kv, int32_t token, int64_t position,
            Compressor* online, double ratio, const Packing* packing, at::Tensor* logits) {
  const int32_t tokens[] = {token};
  const int32_t positions[] = {static_cast<int32_t>(position)};
  if (packing != nullptr) {
    const ForwardItem item{tokens,        positions,          &kv,     &pool, LogitRows::kLast, packing->request_id,
                           packing->pool, packing->quantizer, nullptr, &packing->format};
    return forward_with_quantizer(model, std::span(&item, 1), pool, logits, *packing->quantizer, packing->format,
                                  *packing->pool, /*observe=*/false);
  }
  const ForwardItem item{tokens, positions, &kv, &pool, LogitRows::kLast, 0};
  if (online == nullptr) return model.forward(std::span(&item, 1), logits);
  const double ratios[] = {ratio};
  SequenceKv* caches[] = {&kv};
  return forward_with_compressor(model, std::span(&item, 1), pool, logits, *online, ratios, caches);
}

}  // namespace

double kl_divergence_of_logits(const float* p_logits, const float* q_logits, int64_t vocab) {
  const double p_norm = log_sum_exp(p_logits, vocab), q_norm = log_sum_exp(q_logits, vocab);
  double kl = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    const double lp = p_logits[i] - p_norm, lq = q_logits[i] - q_norm;
    kl += std::exp(lp) * (lp - lq);
  }
  return std::max(kl, 0.0);  // rounding can leave -1e-17 when the two rows are equal
}

Result<GreedyReference> full_kv_greedy_reference(const LlamaModel& model, PagePool& full_pool, SequenceKv& full,
                                                 int32_t first_token, int64_t start, int64_t steps) {
  const int64_t vocab = model.config().vocab_size;
  GreedyReference out;
  out.logits.reserve(static_cast<size_t>(steps * vocab));
  int32_t token = first_token;
  for (int64_t i = 0; i < steps; ++i) {
    at::Tensor p;
    VC_RETURN_IF_ERROR(step(model, full_pool, full, token, start + i, nullptr, 1.0, nullptr, &p));
    const float* row = p[0].data_ptr<float>();
    out.tokens.push_back(token);
    out.logits.insert(out.logits.end(), row, row + vocab);
    token = argmax(row, vocab);
  }
  return out;
}

Result<std::vector<DivergenceStep>> divergence_along(const LlamaModel& model, const GreedyReference& reference,
                                                     PagePool& compressed_pool, SequenceKv& compressed, int64_t start,
                                                     Compressor* online, double ratio, const Packing* packing) {
  const int64_t vocab = model.config().vocab_size;
  std::vector<DivergenceStep> out;
  for (size_t i = 0; i < reference.tokens.size(); ++i) {
    at::Tensor q;
    const int32_t token = reference.tokens[i];
    VC_RETURN_IF_ERROR(
        step(model, compressed_pool, compressed, token, start + static_cast<int64_t>(i), online, ratio, packing, &q));
    const float* p_row = reference.logits.data() + i * static_cast<size_t>(vocab);
    const float* q_row = q[0].data_ptr<float>();
    out.push_back({token, kl_divergence_of_logits(p_row, q_row, vocab), argmax(p_row, vocab) == argmax(q_row, vocab)});
  }
  return out;
}

Result<std::vector<DivergenceStep>> divergence_along_full_kv_greedy(const LlamaModel& model, PagePool& full_pool,
                                                                    SequenceKv& full, PagePool& compressed_pool,
                                                                    SequenceKv& compressed, int32_t first_token,
                                                                    int64_t start, int64_t steps, Compressor* online,
                                                                    double ratio, const Packing* packing) {
  auto reference = full_kv_greedy_reference(model, full_pool, full, first_token, start, steps);
  if (!reference.ok()) return reference.status();
  return divergence_along(model, *reference, compressed_pool, compressed, start, online, ratio, packing);
}

}  // namespace vericache
