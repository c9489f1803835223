#include "conformance/conformance.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <set>

#include <vericache/token_scorer.h>

#include "engine/compression.h"
#include "engine/full_kv_comparison.h"
#include "engine/model_access.h"

namespace vericache {
namespace {

constexpr int64_t kOnlineDecodeSteps = 8;

// kept[layer][head] = the positions a head keeps, in slot order.
using KeptSet = std::vector<std::vector<std::vector<int64_t>>>;

std::string where(int64_t layer, int64_t head) { return "layer " + std::to_string(layer) + ", head " + std::to_string(head); }
std::string where(int64_t layer, int64_t head, int64_t position) {
  return where(layer, head) + ", position " + std::to_string(position);
}
std::string ratio_setting(double c) {
  char text[32];
  std::snprintf(text, sizeof(text), "c = %g", c);
  return text;
}

class Recorder {
 public:
  Recorder(ConformanceReport& report, std::string setting) : report_(report), setting_(std::move(setting)) {}
  // Records the rule: failed with `offence` when it is not empty, else passed with `holds`.
  bool check(const std::string& rule, const std::string& offence, const std::string& holds) {
    report_.checks.push_back({rule, setting_, offence.empty(), offence.empty() ? holds : offence});
    return offence.empty();
  }

 private:
  ConformanceReport& report_;
  std::string setting_;
};

KeptSet kept_of_tensors(const std::vector<at::Tensor>& kept) {
  KeptSet out;
  for (const at::Tensor& t : kept) {
    const at::Tensor c = t.cpu().contiguous();
    auto& layer = out.emplace_back();
    for (int64_t h = 0; h < c.size(0); ++h) {
      const int64_t* p = c[h].data_ptr<int64_t>();
      layer.emplace_back(p, p + c.size(1));
    }
  }
  return out;
}

KeptSet kept_of_cache(const SequenceKv& kv, int64_t heads) {
  KeptSet out(kv.n_layers());
  for (int64_t l = 0; l < kv.n_layers(); ++l) {
    for (int64_t h = 0; h < heads; ++h) {
      auto& p = out[l].emplace_back();
      for (int64_t s = 0; s < kv.length(l); ++s) p.push_back(kv.position(l, h, s));
    }
  }
  return out;
}

// The contract's shape of compress()'s output, before anything reads the positions.
std::string kept_set_offence(const CompressedKV& out, int64_t layers, int64_t heads) {
  if (static_cast<int64_t>(out.kept.size()) != layers) {
    return "kept positions for " + std::to_string(out.kept.size()) + " layers, the model has " + std::to_string(layers);
  }
  for (int64_t l = 0; l < layers; ++l) {
    const at::Tensor& t = out.kept[l];
    if (!t.defined() || t.dim() != 2 || t.scalar_type() != at::kLong || t.size(0) != heads) {
      return "layer " + std::to_string(l) + ": kept positions must be an int64 tensor [" + std::to_string(heads) +
             ", n_kept]";
    }
  }
  return "";
}

std::string positions_offence(const KeptSet& kept, int64_t n) {
  for (size_t l = 0; l < kept.size(); ++l) {
    for (size_t h = 0; h < kept[l].size(); ++h) {
      const auto& p = kept[l][h];
      for (size_t j = 0; j < p.size(); ++j) {
        if (p[j] < 0 || p[j] >= n) return where(l, h, p[j]) + ": outside [0, " + std::to_string(n) + ")";
        if (j > 0 && p[j] <= p[j - 1]) {
          return where(l, h, p[j]) + ": after position " + std::to_string(p[j - 1]) +
                 " (kept positions must be unique and increasing)";
        }
      }
    }
  }
  return "";
}

// The budget for a cache of `n` tokens at kept fraction c (and the held count, for `holds`).
std::string budget_offence(const KeptSet& kept, int64_t n, double c, const ConformanceSpec& spec, std::string* holds) {
  const int64_t k = std::max(kept_count(n, c), std::min(n, spec.window));
  int64_t total = 0;
  for (size_t l = 0; l < kept.size(); ++l) {
    const auto count = static_cast<int64_t>(kept[l][0].size());
    for (size_t h = 1; h < kept[l].size(); ++h) {
      if (static_cast<int64_t>(kept[l][h].size()) != count) {
        return where(l, h) + ": keeps " + std::to_string(kept[l][h].size()) + " tokens, head 0 keeps " +
               std::to_string(count) + " (every head of a layer keeps the same count)";
      }
    }
    if (spec.budget == BudgetRule::kPerLayer && count != k) {
      return where(l, 0) + ": keeps " + std::to_string(count) + " of " + std::to_string(n) + " tokens, the budget is " +
             std::to_string(k);
    }
    if (count < 1 || count > n) return where(l, 0) + ": keeps " + std::to_string(count) + " of " + std::to_string(n) + " tokens";
    total += count;
  }
  const auto layers = static_cast<int64_t>(kept.size());
  if (spec.budget == BudgetRule::kAcrossLayers && total != layers * k) {
    return "keeps " + std::to_string(total) + " tokens per head over all layers, the budget is " +
           std::to_string(layers) + " x " + std::to_string(k);
  }
  *holds = spec.budget == BudgetRule::kPerLayer
               ? std::to_string(k) + " of " + std::to_string(n) + " tokens per head in every layer"
               : std::to_string(total) + " tokens per head over " + std::to_string(layers) + " layers (" +
                     std::to_string(layers) + " x " + std::to_string(k) + ")";
  return "";
}

std::string protected_offence(const KeptSet& kept, int64_t n, const ConformanceSpec& spec) {
  std::vector<int64_t> wanted;
  for (int64_t p = 0; p < std::min(n, spec.protect_first); ++p) wanted.push_back(p);
  for (int64_t p = std::max<int64_t>(0, n - spec.protect_last); p < n; ++p) wanted.push_back(p);
  for (size_t l = 0; l < kept.size(); ++l) {
    for (size_t h = 0; h < kept[l].size(); ++h) {
      for (int64_t p : wanted) {
        if (std::find(kept[l][h].begin(), kept[l][h].end(), p) == kept[l][h].end()) {
          return where(l, h, p) + ": a protected token is not kept";
        }
      }
    }
  }
  return "";
}

std::string first_difference(const KeptSet& a, const KeptSet& b, const std::string& what) {
  for (size_t l = 0; l < a.size(); ++l) {
    for (size_t h = 0; h < a[l].size(); ++h) {
      const auto& x = a[l][h];
      const auto& y = b[l][h];
      for (size_t j = 0; j < std::max(x.size(), y.size()); ++j) {
        if (j >= x.size() || j >= y.size() || x[j] != y[j]) {
          const int64_t p = j < x.size() ? x[j] : y[j];
          return where(l, h, p) + ": " + what + " (slot " + std::to_string(j) + ")";
        }
      }
    }
  }
  return "";
}

// The K/V of a cache's float slots, per layer [n_kv_heads, length, head_dim].
struct CacheBits {
  std::vector<at::Tensor> k, v;
  std::vector<int64_t> lengths;
  int64_t pages_held = 0;
};
CacheBits snapshot(const SequenceKv& kv, PagePool& pool) {
  CacheBits out;
  const KvCacheView view = kv.view(pool);
  for (int64_t l = 0; l < kv.n_layers(); ++l) {
    out.k.push_back(layer_keys(view, l));
    out.v.push_back(layer_values(view, l));
  }
  out.lengths = kv.lengths();
  out.pages_held = kv.pages_held();
  return out;
}

std::string rollback_offence(const CacheBits& before, const CacheBits& after) {
  if (before.lengths != after.lengths) return "the full cache's lengths changed";
  if (before.pages_held != after.pages_held) {
    return "the full cache holds " + std::to_string(after.pages_held) + " pages, " + std::to_string(before.pages_held) +
           " before compress()";
  }
  for (size_t l = 0; l < before.k.size(); ++l) {
    for (const bool keys : {true, false}) {
      const at::Tensor changed = keys ? before.k[l].ne(after.k[l]) : before.v[l].ne(after.v[l]);  // [heads, n, hd]
      if (!changed.any().item<bool>()) continue;
      const at::Tensor first = changed.any(2).nonzero()[0];  // (head, position)
      return where(l, first[0].item<int64_t>(), first[1].item<int64_t>()) + ": compress() changed the full cache's " +
             (keys ? "keys" : "values");
    }
  }
  return "";
}

// One token-dropping run on a fresh cache: prefill with every layer reported, then compress() for
// an offline compressor (checked before compaction) or the online drops applied.
struct DroppingRun {
  Status failed;              // a call of the plugin that returned an error
  std::string kept_set;       // malformed output (kept-set)
  std::string rollback;       // offline: the full cache changed under compress()
  KeptSet kept;
  std::string positions;      // positions_offence
  std::string budget_after;   // online: the budget broken during decode steps
};

DroppingRun run_dropping(const LlamaModel& model, Compressor& compressor, const ConformanceSpec& spec,
                                 std::span<const int32_t> prompt, double c, SequenceKv& kv,
                                 PagePool& pool) {
  DroppingRun run;
  const auto n = static_cast<int64_t>(prompt.size());
  const int64_t heads = model.config().n_kv_heads;
  std::vector<int32_t> positions(n);
  std::iota(positions.begin(), positions.end(), 0);
  const ForwardItem item{prompt, positions, &kv, &pool, LogitRows::kLast, 0};
  at::Tensor logits;
  const std::vector<double> ratios{c};
  SequenceKv* caches[] = {&kv};
  std::vector<LayerDrops> drops;
  run.failed = model.forward(std::span(&item, 1), &logits, compression_observer(compressor, ratios, &drops));
  if (!run.failed.ok()) return run;
  if (Status s = apply_drops(compressor.name(), pool, caches, drops); !s.ok()) {
    run.kept_set = s.message();
    return run;
  }
  if (compressor.mode() == CompressionMode::kOnline) {
    run.kept = kept_of_cache(kv, heads);
    run.positions = positions_offence(run.kept, n);
    // Decode steps with the drops applied: the budget holds as the cache grows.
    int32_t token = static_cast<int32_t>(logits[0].argmax().item<int64_t>());
    for (int64_t step = 0; step < kOnlineDecodeSteps && run.budget_after.empty(); ++step) {
      const int32_t position = static_cast<int32_t>(n + step);
      const ForwardItem next{std::span(&token, 1), std::span(&position, 1), &kv, &pool, LogitRows::kLast, 0};
      run.failed = forward_with_compressor(model, std::span(&next, 1), pool, &logits, compressor, ratios, caches);
      if (!run.failed.ok()) return run;
      token = static_cast<int32_t>(logits[0].argmax().item<int64_t>());
      std::string holds;
      const std::string offence = budget_offence(kept_of_cache(kv, heads), n + step + 1, c, spec, &holds);
      if (!offence.empty()) run.budget_after = "after decode step " + std::to_string(step + 1) + ": " + offence;
    }
    return run;
  }
  const CacheBits before = snapshot(kv, pool);
  const int64_t free_before = pool.num_free();
  CompressedKV out;
  {
    LlamaModelAccess access(model, pool, kv, prompt, 0);
    run.failed = compressor.compress(kv.view(pool), c, access, &out);
  }
  if (!run.failed.ok()) return run;
  run.rollback = rollback_offence(before, snapshot(kv, pool));
  if (run.rollback.empty() && pool.num_free() != free_before) {
    run.rollback = "the pool has " + std::to_string(pool.num_free()) + " free pages, " + std::to_string(free_before) +
                   " before compress()";
  }
  run.kept_set = kept_set_offence(out, model.config().n_layers, heads);
  if (!run.kept_set.empty()) return run;
  run.kept = kept_of_tensors(out.kept);
  run.positions = positions_offence(run.kept, n);
  if (run.positions.empty()) kv.compact(pool, out.kept);
  return run;
}

// The kept set's slots (summed over layers, per KV head) against the bound the compressor declared
// for this prompt and c (admission reserves that bound); "" when within it.
std::string footprint_offence(Compressor& compressor, const KeptSet& kept, int64_t n, double c, int64_t layers) {
  Result<RequestFootprint> f = compressor.footprint(n, c, layers);
  if (!f.ok()) return "footprint() failed: " + f.status().message();
  if (f->state_bytes < 0) return "footprint() declared " + std::to_string(f->state_bytes) + " bytes of state";
  int64_t slots = 0;
  for (const auto& layer : kept) slots += layer.empty() ? 0 : static_cast<int64_t>(layer[0].size());
  if (slots <= f->max_kept_slots) return "";
  return "kept " + std::to_string(slots) + " slots (summed over " + std::to_string(layers) +
         " layers), footprint() declared at most " + std::to_string(f->max_kept_slots);
}

int64_t pool_pages_for(const LlamaModel& model, int64_t page_size, int64_t n) {
  // Room for an offline compressor's extra forwards (KVzip repeats the prompt) and decode steps.
  return model.config().n_layers * ((3 * n + 2200) / page_size + 2);
}

Status check_dropping(const LlamaModel& model, const CompressorFactory& make, CompressionMode mode,
                      const ConformanceSpec& spec, const ConformanceOptions& options, ConformanceReport& report) {
  const std::span<const int32_t> prompt = options.prompt;
  const auto n = static_cast<int64_t>(prompt.size());
  const int64_t layers = model.config().n_layers, ps = options.page_size;
  const bool offline_mode = mode == CompressionMode::kOffline;
  for (double c : spec.ratios) {
    Recorder record(report, ratio_setting(c));
    VC_ASSIGN_OR_RETURN(std::shared_ptr<Compressor> a, make());
    VC_ASSIGN_OR_RETURN(PagePool pool, model.make_page_pool(ps, pool_pages_for(model, ps, n)));
    SequenceKv kv(layers);
    DroppingRun run = run_dropping(model, *a, spec, prompt, c, kv, pool);
    auto done = [&] {
      kv.release(pool);
      a->release(0);
    };
    if (!record.check("runs", run.failed.message(), "every call returned OK") ||
        !record.check("kept-set", run.kept_set, offline_mode ? "one int64 [heads, kept] tensor per layer"
                                                             : "every drop names a kept position")) {
      done();
      continue;
    }
    std::string budget_holds;
    std::string budget = budget_offence(run.kept, n, c, spec, &budget_holds);
    if (budget.empty() && !run.budget_after.empty()) budget = run.budget_after;
    if (budget.empty() && !offline_mode) budget_holds += ", and after each of 8 decode steps";
    record.check("positions", run.positions, "unique, increasing, in [0, " + std::to_string(n) + ")");
    record.check("budget", budget, budget_holds);
    record.check("footprint", footprint_offence(*a, run.kept, n, c, layers),
                 "the kept set within the bound footprint() declares before the prefill");
    record.check("protected", protected_offence(run.kept, n, spec),
                 "first " + std::to_string(spec.protect_first) + " and last " + std::to_string(spec.protect_last) +
                     " positions kept by every head");
    if (offline_mode) record.check("rollback", run.rollback, "the full cache is unchanged by compress()");
    if (run.positions.empty() && budget.empty()) {
      int64_t needed = 0;
      for (int64_t l = 0; l < layers; ++l) needed += (kv.length(l) + ps - 1) / ps;
      const int64_t full = layers * ((n + ps - 1) / ps);
      std::string offence;
      if (kv.pages_held() != needed || pool.num_free() != pool.num_pages() - needed) {
        offence = "holds " + std::to_string(kv.pages_held()) + " pages (pool: " +
                  std::to_string(pool.num_pages() - pool.num_free()) + " in use), its slots need " + std::to_string(needed);
      } else if (offline_mode && std::abs(static_cast<double>(needed * ps) - c * n * layers) > ps * layers) {
        offence = std::to_string(needed) + " pages is not c * full (" + std::to_string(full) + ") within page rounding";
      } else if (needed >= full) {
        offence = "holds " + std::to_string(needed) + " pages, as many as the full cache";
      }
      record.check("resident-pages", offence, std::to_string(needed) + " of " + std::to_string(full) + " pages");
    }
    // Determinism and release: the same kept set from a second instance, and from this one again.
    const KeptSet first = run.kept;
    done();
    for (const bool fresh : {true, false}) {
      std::shared_ptr<Compressor> again = a;
      if (fresh) {
        VC_ASSIGN_OR_RETURN(again, make());
      }
      SequenceKv kv2(layers);
      const DroppingRun rerun = run_dropping(model, *again, spec, prompt, c, kv2, pool);
      kv2.release(pool);
      again->release(0);
      std::string offence = rerun.failed.ok() ? rerun.kept_set : rerun.failed.message();
      if (offence.empty()) {
        offence = first_difference(first, rerun.kept, fresh ? "a second instance keeps a different set"
                                                            : "after release(), the same request keeps a different set");
      }
      record.check(fresh ? "determinism" : "release", offence,
                   fresh ? "a second instance keeps the same positions" : "the same positions after release()");
    }
  }
  return Status();
}

// One quantizer run: the prompt prefilled with every layer reported and whole blocks packed.
struct PackedRun {
  Status failed;
  std::vector<at::Tensor> bytes;  // per layer: its packed pages' bytes, uint8 [pages, bytes_per_page]
};

PackedRun run_packing(const LlamaModel& model, Compressor& quantizer, const PackedFormat& format,
                      std::span<const int32_t> prompt, PagePool& pool, PackedPagePool& packed, SequenceKv& kv) {
  PackedRun run;
  std::vector<int32_t> positions(prompt.size());
  std::iota(positions.begin(), positions.end(), 0);
  const ForwardItem item{prompt, positions, &kv, &pool, LogitRows::kNone, 0, &packed, &quantizer, nullptr, &format};
  at::Tensor logits;
  run.failed = forward_with_quantizer(model, std::span(&item, 1), pool, &logits, quantizer, format, packed, true);
  if (!run.failed.ok()) return run;
  for (int64_t l = 0; l < kv.n_layers(); ++l) {
    const auto& table = kv.packed_table(l);
    run.bytes.push_back(
        packed.storage().index_select(0, at::tensor(std::vector<int64_t>(table.begin(), table.end()), at::kLong)).clone());
  }
  return run;
}

std::string bytes_difference(const PackedRun& a, const PackedRun& b, const std::string& what) {
  for (size_t l = 0; l < a.bytes.size(); ++l) {
    if (a.bytes[l].sizes() != b.bytes[l].sizes()) return "layer " + std::to_string(l) + ": " + what + " (page count)";
    const at::Tensor diff = a.bytes[l].ne(b.bytes[l]).any(1);
    if (diff.any().item<bool>()) {
      return "layer " + std::to_string(l) + ", packed page " + std::to_string(diff.nonzero()[0][0].item<int64_t>()) +
             ": " + what;
    }
  }
  return "";
}

// unpack() of every layer's packed pages against the float K/V the prefill computed.
std::string round_trip_offence(Compressor& quantizer, const PagePool& pool, PackedPagePool& packed, const SequenceKv& kv,
                               const std::vector<at::Tensor>& keys, const std::vector<at::Tensor>& values,
                               double bound, std::string* holds) {
  const int64_t ps = pool.spec().page_size, heads = pool.spec().n_kv_heads, hd = pool.spec().head_dim;
  double worst = 0;
  std::string worst_at;
  for (int64_t l = 0; l < kv.n_layers(); ++l) {
    const int64_t slots = kv.packed_length(l), pages = slots / ps;
    if (slots == 0) continue;
    at::Tensor k = at::empty({pages, heads, hd, ps}, at::kFloat), v = at::empty({pages, heads, ps, hd}, at::kFloat);
    const PackedPages src{packed.storage(), kv.packed_table(l), kv.packed_positions(l), 0};
    if (Status s = quantizer.unpack(l, src, k, v); !s.ok()) return "layer " + std::to_string(l) + ": " + s.message();
    const at::Tensor got[] = {k.permute({1, 0, 3, 2}).reshape({heads, slots, hd}), v.permute({1, 0, 2, 3}).reshape({heads, slots, hd})};
    const at::Tensor want[] = {keys[l].narrow(1, 0, slots), values[l].narrow(1, 0, slots)};
    for (int kind = 0; kind < 2; ++kind) {
      const at::Tensor error = got[kind] - want[kind];
      if (!at::isfinite(got[kind]).all().item<bool>()) return "layer " + std::to_string(l) + ": unpack() gave a non-finite value";
      const at::Tensor relative = error.pow(2).mean({1, 2}).sqrt() / want[kind].pow(2).mean({1, 2}).sqrt().clamp_min(1e-12);
      const int64_t h = relative.argmax().item<int64_t>();
      const double r = relative[h].item<double>();
      const int64_t position = error[h].abs().amax(1).argmax().item<int64_t>();
      const std::string here = where(l, h, position) + " (" + (kind == 0 ? "keys" : "values") + ")";
      if (r > bound) {
        char text[160];
        std::snprintf(text, sizeof(text), ": relative RMS error %.4f > %.4f (largest error at this position)", r, bound);
        return here + text;
      }
      if (r > worst) {
        worst = r;
        worst_at = here;
      }
    }
  }
  char text[200];
  std::snprintf(text, sizeof(text), "relative RMS error at most %.4f (%s), bound %.4f", worst, worst_at.c_str(), bound);
  *holds = text;
  return "";
}

Status check_quantizer(const LlamaModel& model, const CompressorFactory& make, const ConformanceSpec& spec,
                       const ConformanceOptions& options, ConformanceReport& report) {
  const std::span<const int32_t> prompt = options.prompt;
  const auto n = static_cast<int64_t>(prompt.size());
  const int64_t layers = model.config().n_layers, ps = options.page_size;
  Recorder record(report, "");
  VC_ASSIGN_OR_RETURN(std::shared_ptr<Compressor> a, make());
  VC_ASSIGN_OR_RETURN(PagePool pool, model.make_page_pool(ps, 2 * layers * ((n + ps - 1) / ps + 1)));
  auto format = checked_packed_format(*a, pool.spec());
  if (!record.check("packed-format", format.ok() ? "" : format.status().message(),
                    format.ok() ? std::to_string(format->bit_scheme) + " bits, " + std::to_string(format->bytes_per_page) +
                                      " bytes per page of " + std::to_string(ps) + " slots, blocks of " +
                                      std::to_string(format->flush_slots)
                                : "")) {
    return Status();
  }
  VC_ASSIGN_OR_RETURN(PackedPagePool packed, PackedPagePool::create(layers * ((n + ps - 1) / ps), format->bytes_per_page));
  SequenceKv kv(layers);
  const PackedRun first = run_packing(model, *a, *format, prompt, pool, packed, kv);
  if (!record.check("runs", first.failed.message(), "every call returned OK")) {
    kv.release_packed(packed);
    kv.release(pool);
    return Status();
  }
  // resident-pages: whole blocks packed, the rest float.
  const int64_t packed_slots = n / format->flush_slots * format->flush_slots;
  std::string offence;
  for (int64_t l = 0; l < layers && offence.empty(); ++l) {
    if (kv.packed_length(l) != packed_slots || kv.length(l) != n - packed_slots) {
      offence = "layer " + std::to_string(l) + ": " + std::to_string(kv.packed_length(l)) + " packed and " +
                std::to_string(kv.length(l)) + " float slots, expected " + std::to_string(packed_slots) + " and " +
                std::to_string(n - packed_slots);
    }
  }
  const int64_t packed_pages = layers * packed_slots / ps, float_pages = layers * ((n - packed_slots + ps - 1) / ps);
  if (offence.empty() && (kv.packed_pages_held() != packed_pages || kv.pages_held() != float_pages ||
                          packed.num_pages() - packed.num_free() != packed_pages)) {
    offence = "holds " + std::to_string(kv.packed_pages_held()) + " packed and " + std::to_string(kv.pages_held()) +
              " float pages, expected " + std::to_string(packed_pages) + " and " + std::to_string(float_pages);
  }
  record.check("resident-pages", offence,
               std::to_string(packed_pages) + " packed pages and " + std::to_string(float_pages) + " float pages (the residual)");

  // round-trip: against the float K/V of the same prompt.
  {
    SequenceKv full(layers);
    std::vector<int32_t> positions(n);
    std::iota(positions.begin(), positions.end(), 0);
    const ForwardItem item{prompt, positions, &full, &pool, LogitRows::kNone, 0};
    at::Tensor logits;
    VC_RETURN_IF_ERROR(model.forward(std::span(&item, 1), &logits));
    const CacheBits bits = snapshot(full, pool);
    full.release(pool);
    std::string holds;
    const std::string why = round_trip_offence(*a, pool, packed, kv, bits.k, bits.v, spec.max_relative_error, &holds);
    record.check("round-trip", why, holds);
  }
  kv.release_packed(packed);
  kv.release(pool);
  a->release(0);
  for (const bool fresh : {true, false}) {
    std::shared_ptr<Compressor> again = a;
    if (fresh) {  // a new instance, set up as the runtime does: packed_format() first
      VC_ASSIGN_OR_RETURN(again, make());
      if (auto f = checked_packed_format(*again, pool.spec()); !f.ok()) {
        record.check("determinism", f.status().message(), "");
        continue;
      }
    }
    SequenceKv kv2(layers);
    const PackedRun rerun = run_packing(model, *again, *format, prompt, pool, packed, kv2);
    kv2.release_packed(packed);
    kv2.release(pool);
    again->release(0);
    const std::string why = !rerun.failed.ok() ? rerun.failed.message()
                                               : bytes_difference(first, rerun, fresh ? "a second instance packs other bytes"
                                                                                      : "after release(), other bytes");
    record.check(fresh ? "determinism" : "release", why,
                 fresh ? "a second instance packs the same bytes" : "the same bytes after release()");
  }
  return Status();
}

Status check_lossless(const LlamaModel& model, const CompressorFactory& make, const ConformanceSpec& spec,
                      const ConformanceOptions& options, ConformanceReport& report) {
  VC_ASSIGN_OR_RETURN(std::shared_ptr<Compressor> compressor, make());
  const bool quantizer = compressor->family() == CompressorFamily::kQuantization;
  const double c = quantizer ? 1.0 : spec.ratios[spec.ratios.size() / 2];
  Recorder record(report, quantizer ? "x = " + std::to_string(options.draft_length)
                                    : ratio_setting(c) + ", x = " + std::to_string(options.draft_length));
  GenerationRequest request;
  request.prompt = options.prompt;
  request.max_new_tokens = options.new_tokens;
  request.ignore_eos = true;
  const std::span<const GenerationRequest> requests(&request, 1);
  VC_ASSIGN_OR_RETURN(const std::vector<GenerationResult> reference, full_kv_reference(model, requests, options.page_size));
  EngineOptions engine_options;
  engine_options.compressor = compressor.get();
  engine_options.ratio = c;
  engine_options.draft_length = options.draft_length;
  VC_ASSIGN_OR_RETURN(const FullKvComparison run,
                      compare_with_full_kv(model, engine_options, requests, reference, options.page_size));
  std::string offence;
  if (!run.results[0].compressor_failure.empty()) {
    offence = "the compressor failed in the engine (the request fell back to full KV): " + run.results[0].compressor_failure;
  } else if (run.diffs[0].first_mismatch >= 0) {
    offence = "token " + std::to_string(run.diffs[0].first_mismatch) + " differs from full-KV greedy decoding";
  } else if (run.diffs[0].finish_differs) {
    offence = std::string("the output ends with '") + finish_reason_name(run.results[0].generation.finish) +
              "', full-KV greedy decoding with '" + finish_reason_name(reference[0].finish) + "'";
  }
  char holds[160];
  std::snprintf(holds, sizeof(holds), "%zu tokens identical to full-KV greedy decoding, acceptance %.3f",
                reference[0].tokens.size(), run.totals.acceptance_rate());
  record.check("lossless", offence, holds);
  return Status();
}

}  // namespace

bool ConformanceReport::passed() const {
  return std::all_of(checks.begin(), checks.end(), [](const ConformanceCheck& c) { return c.passed; });
}

std::vector<std::string> ConformanceReport::broken_rules() const {
  std::vector<std::string> out;
  for (const ConformanceCheck& c : checks) {
    if (!c.passed && std::find(out.begin(), out.end(), c.rule) == out.end()) out.push_back(c.rule);
  }
  return out;
}

Result<ConformanceSpec> parse_conformance_spec(const std::string& json_text) {
  const auto j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return Status::invalid_argument("conformance spec: not a JSON object");
  ConformanceSpec spec;
  auto bad = [](const std::string& key, const std::string& why) {
    return Status::invalid_argument("conformance spec: \"" + key + "\" " + why);
  };
  auto count = [&](const nlohmann::json& v, const std::string& key, int64_t* out) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0) return bad(key, "must be a non-negative integer");
    *out = v.get<int64_t>();
    return Status();
  };
  for (const auto& [key, v] : j.items()) {
    if (key == "params") {
      if (!v.is_object()) return bad(key, "must be a JSON object");
      spec.params = v.dump();
    } else if (key == "ratios") {
      if (!v.is_array() || v.empty()) return bad(key, "must be a non-empty array of numbers in (0, 1]");
      spec.ratios.clear();
      for (const auto& r : v) {
        if (!r.is_number() || !(r.get<double>() > 0 && r.get<double>() <= 1)) return bad(key, "must hold numbers in (0, 1]");
        spec.ratios.push_back(r.get<double>());
      }
    } else if (key == "budget") {
      if (v == "per-layer") {
        spec.budget = BudgetRule::kPerLayer;
      } else if (v == "across-layers") {
        spec.budget = BudgetRule::kAcrossLayers;
      } else {
        return bad(key, "must be \"per-layer\" or \"across-layers\"");
      }
    } else if (key == "window") {
      VC_RETURN_IF_ERROR(count(v, key, &spec.window));
    } else if (key == "protected") {
      if (!v.is_object()) return bad(key, "must be an object {\"first\": N, \"last\": N}");
      for (const auto& [end, value] : v.items()) {
        if (end != "first" && end != "last") return bad(key, "has an unknown key \"" + end + "\" (first, last)");
        VC_RETURN_IF_ERROR(count(value, key + "." + end, end == "first" ? &spec.protect_first : &spec.protect_last));
      }
    } else if (key == "max_relative_error") {
      if (!v.is_number() || !(v.get<double>() > 0)) return bad(key, "must be a positive number");
      spec.max_relative_error = v.get<double>();
    } else {
      return bad(key, "is not a spec key (params, ratios, budget, window, protected, max_relative_error)");
    }
  }
  return spec;
}

std::string conformance_spec_path(const std::string& plugin_path) {
  const std::string stem = plugin_path.size() > 3 && plugin_path.ends_with(".so")
                               ? plugin_path.substr(0, plugin_path.size() - 3)
                               : plugin_path;
  return stem + ".conformance.json";
}

Result<std::string> conformance_params(const ConformanceSpec& spec, const std::string& user) {
  const auto given = nlohmann::json::parse(user, nullptr, /*allow_exceptions=*/false);
  if (!given.is_object()) return Status::invalid_argument("--params must be a JSON object, got: " + user);
  nlohmann::json merged = nlohmann::json::parse(spec.params);
  for (const auto& [key, v] : given.items()) merged[key] = v;
  return merged.dump();
}

Result<ConformanceReport> run_conformance(const LlamaModel& model, const CompressorFactory& make,
                                          const ConformanceSpec& spec, const ConformanceOptions& options) {
  const auto n = static_cast<int64_t>(options.prompt.size());
  if (n < 2) return Status::invalid_argument("conformance: the prompt needs at least 2 tokens");
  if (n + options.new_tokens + options.draft_length >= model.config().context_length) {
    return Status::invalid_argument("conformance: the prompt (" + std::to_string(n) + " tokens) leaves no room in the " +
                                    std::to_string(model.config().context_length) + "-token context");
  }
  VC_ASSIGN_OR_RETURN(std::shared_ptr<Compressor> probe, make());
  ConformanceReport report;
  report.compressor = probe->name();
  if (probe->family() == CompressorFamily::kTokenDropping) {
    const double smallest = *std::min_element(spec.ratios.begin(), spec.ratios.end());
    if (spec.protect_first + spec.protect_last > kept_count(n, smallest)) {
      return Status::invalid_argument("conformance: at " + ratio_setting(smallest) + " a prompt of " +
                                      std::to_string(n) + " tokens keeps " + std::to_string(kept_count(n, smallest)) +
                                      ", fewer than the spec's " +
                                      std::to_string(spec.protect_first + spec.protect_last) +
                                      " protected tokens: use a longer prompt");
    }
    VC_RETURN_IF_ERROR(check_dropping(model, make, probe->mode(), spec, options, report));
  } else {
    VC_RETURN_IF_ERROR(check_quantizer(model, make, spec, options, report));
  }
  probe.reset();
  if (report.passed()) VC_RETURN_IF_ERROR(check_lossless(model, make, spec, options, report));
  return report;
}

}  // namespace vericache
