// vericache checklist, step 1: KL growth on the compressed cache alone (checklist_steps.h).
#include <ATen/ATen.h>

#include <numeric>
#include <optional>

#include "checklist_steps.h"
#include "engine/compression.h"
#include "engine/compression_divergence.h"
#include "kv/packed_page_pool.h"

namespace vericache::cli {
namespace {

struct LineFit {
  double intercept = 0, slope = 0, r2 = 0;
};
// Least squares y = a + b t over t = 1..n.
LineFit linear_fit(const std::vector<double>& y) {
  const auto n = static_cast<double>(y.size());
  double st = 0, sy = 0, stt = 0, sty = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    const double t = static_cast<double>(i + 1);
    st += t, sy += y[i], stt += t * t, sty += t * y[i];
  }
  const double b = (n * sty - st * sy) / (n * stt - st * st), a = (sy - b * st) / n;
  double sse = 0, sst = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    const double fit = a + b * static_cast<double>(i + 1);
    sse += (y[i] - fit) * (y[i] - fit);
    sst += (y[i] - sy / n) * (y[i] - sy / n);
  }
  return {a, b, sst > 0 ? 1.0 - sse / sst : 0.0};
}

// The compressed cache of one prompt, as the engine holds it: a token dropper's kept slots, or a
// quantizer's slots packed in whole blocks (into `packed`, made here) and its float tail.
Status compress_prompt(const Setup& s, PagePool& pool, std::span<const int32_t> ids, SequenceKv& compressed,
                       std::optional<PackedPagePool>& packed, std::optional<Packing>& packing) {
  const LlamaModel& m = *s.model;
  if (!s.quantizer()) return prefill_and_compress(m, pool, *s.compressor, s.ratio, ids, 0, compressed);
  VC_ASSIGN_OR_RETURN(const PackedFormat format, checked_packed_format(*s.compressor, pool.spec()));
  VC_ASSIGN_OR_RETURN(packed, PackedPagePool::create(pool.num_pages(), format.bytes_per_page));
  packing = Packing{s.compressor, format, &*packed, /*request_id=*/0};
  std::vector<int32_t> positions(ids.size());
  std::iota(positions.begin(), positions.end(), 0);
  const ForwardItem item{ids, positions, &compressed, &pool, LogitRows::kLast, 0};
  at::Tensor logits;
  return forward_with_quantizer(m, std::span(&item, 1), pool, &logits, *s.compressor, format, *packed, /*observe=*/true);
}

}  // namespace

Result<Verdict> kl_growth(const Setup& s, int64_t steps, Trace& trace) {
  const LlamaModel& m = *s.model;
  const int64_t layers = m.config().n_layers;
  std::vector<double> mean_cumulative(steps, 0.0);
  double kl_sum = 0, agree = 0;
  const auto start = std::chrono::steady_clock::now();
  for (size_t p = 0; p < s.prompts.size(); ++p) {
    const std::vector<int32_t>& ids = s.prompts[p];
    const auto n = static_cast<int64_t>(ids.size());
    VC_ASSIGN_OR_RETURN(PagePool pool, m.make_page_pool(16, 2 * layers * ((3 * n + steps + 2200) / 16 + 2)));
    SequenceKv full(layers), compressed(layers);
    std::vector<int32_t> positions(n);
    std::iota(positions.begin(), positions.end(), 0);
    const ForwardItem item{ids, positions, &full, &pool, LogitRows::kLast, 0};
    at::Tensor logits;
    VC_RETURN_IF_ERROR(m.forward(std::span(&item, 1), &logits));
    const auto first = static_cast<int32_t>(logits[0].argmax().item<int64_t>());
    std::optional<PackedPagePool> packed;
    std::optional<Packing> packing;
    Status compressing = compress_prompt(s, pool, ids, compressed, packed, packing);
    Compressor* online = s.compressor->mode() == CompressionMode::kOnline && !s.quantizer() ? s.compressor : nullptr;
    auto divergence = compressing.ok() ? divergence_along_full_kv_greedy(m, pool, full, pool, compressed, first, n, steps,
                                                                         online, s.ratio, packing ? &*packing : nullptr)
                                       : Result<std::vector<DivergenceStep>>(compressing);
    s.compressor->release(0);
    full.release(pool);
    if (packed) compressed.release_packed(*packed);
    compressed.release(pool);
    VC_RETURN_IF_ERROR(divergence.status());
    double cumulative = 0;
    for (int64_t t = 0; t < steps; ++t) {
      const DivergenceStep& d = (*divergence)[t];
      cumulative += d.kl;
      trace["kl_growth/prompt"].push_back(static_cast<double>(p));
      trace["kl_growth/step"].push_back(static_cast<double>(t + 1));
      trace["kl_growth/kl"].push_back(d.kl);
      trace["kl_growth/same_argmax"].push_back(d.same_argmax ? 1.0 : 0.0);
      trace["kl_growth/cumulative_kl"].push_back(cumulative);
      mean_cumulative[t] += cumulative / static_cast<double>(s.prompts.size());
      kl_sum += d.kl;
      agree += d.same_argmax;
    }
    progress("1. KL growth", static_cast<int64_t>(p + 1), static_cast<int64_t>(s.prompts.size()), start);
  }
  const auto [intercept, slope, r2] = linear_fit(mean_cumulative);
  for (int64_t t = 0; t < steps; ++t) {
    trace["kl_growth_mean/step"].push_back(static_cast<double>(t + 1));
    trace["kl_growth_mean/mean_cumulative_kl"].push_back(mean_cumulative[t]);
    trace["kl_growth_mean/fit"].push_back(intercept + slope * static_cast<double>(t + 1));
  }
  const double samples = static_cast<double>(steps * s.prompts.size());
  Verdict v{1, "KL growth", slope > 0 && r2 >= 0.9 ? 1 : 0,
            "mean KL " + fmt("%.4f", kl_sum / samples) + " nats/step, argmax agreement " + fmt("%.3f", agree / samples) +
                "; cumulative KL after " + std::to_string(steps) + " steps " + fmt("%.3f", mean_cumulative.back()) +
                " nats, linear fit slope " + fmt("%.4f", slope) + "/step, R^2 " + fmt("%.3f", r2) +
                " (holds: slope > 0 and R^2 >= 0.9)"};
  return v;
}

}  // namespace vericache::cli
