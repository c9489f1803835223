// vericache train-kvzap: fits KVzap's linear surrogate (per layer: attention input -> log KVzip+
// score of every KV head) on a calibration corpus, with KVzip+ as the teacher: the kvzip plugin,
// loaded by name like any compressor, whose scores come through the contract
// (Compressor::score_tokens); writes the versioned weights file the kvzap plugin reads
// (plugins/kvzap/kvzap_weights.h).
//
// Recipe (after kvpress's kvzap/): passages of --passage-tokens tokens taken evenly across the
// corpus, each wrapped as a user message in the chat template; the prefill records every layer's
// attention input, then KVzip+ scores the passage tokens by reconstruction; ridge regression
// (sklearn Ridge: centred, intercept not penalised) per layer. Every 8th passage is held out and
// the held-out R^2 is reported per layer.
#include <ATen/ATen.h>
#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>

#include "cli_common.h"
#include "commands.h"
#include "engine/compression.h"
#include "engine/model_access.h"
#include "kvzap/kvzap_weights.h"
#include "util/output_file.h"

namespace po = boost::program_options;

namespace vericache::cli {
namespace {

// Running sums of one layer's regression problem, float64.
struct NormalEquations {
  int64_t rows = 0;
  at::Tensor sx, sxx, sy, sxy;  // [D], [D, D], [H], [D, H]

  void add(const at::Tensor& x, const at::Tensor& y) {
    const at::Tensor xd = x.to(at::kDouble), yd = y.to(at::kDouble);
    if (!sx.defined()) {
      sx = at::zeros({x.size(1)}, at::kDouble);
      sxx = at::zeros({x.size(1), x.size(1)}, at::kDouble);
      sy = at::zeros({y.size(1)}, at::kDouble);
      sxy = at::zeros({x.size(1), y.size(1)}, at::kDouble);
    }
    rows += x.size(0);
    sx += xd.sum(0);
    sxx += at::matmul(xd.t(), xd);
    sy += yd.sum(0);
    sxy += at::matmul(xd.t(), yd);
  }
  // Ridge with penalty `lambda` on the weights only: returns weight [H, D] and bias [H] (float32).
  std::pair<at::Tensor, at::Tensor> solve(double lambda) const {
    const double n = static_cast<double>(rows);
    const at::Tensor mx = sx / n, my = sy / n;
    const at::Tensor a = sxx - n * at::outer(mx, mx) + lambda * at::eye(sx.size(0), at::kDouble);
    const at::Tensor b = sxy - n * at::outer(mx, my);
    const at::Tensor w = at::linalg_solve(a, b);  // [D, H]
    const at::Tensor bias = my - at::matmul(w.t(), mx);
    return {w.t().to(at::kFloat).contiguous(), bias.to(at::kFloat).contiguous()};
  }
};

}  // namespace

int run_train_kvzap(int argc, char** argv) {
  ComputeArgs compute_arg;
  std::string model_arg, corpus = VC_DEFAULT_BENCH_TEXT, out_path;
  int64_t passages = 32, passage_tokens = 512;
  double lambda = 1.0;
  int threads = 0;
  po::options_description desc(
      "vericache train-kvzap: fit the KVzap surrogate (linear, per layer) on a calibration corpus with KVzip+ as the "
      "teacher\n\nOptions");
  // clang-format off
  desc.add_options()
    ("help,h", "print this help and exit")
    ("model", po::value(&model_arg), kModelOptionHelp)
    ("corpus", po::value(&corpus)->default_value(corpus), "calibration text file")
    ("passages", po::value(&passages)->default_value(32), "passages taken evenly across the corpus (every 8th is held out)")
    ("passage-tokens", po::value(&passage_tokens)->default_value(512), "tokens per passage")
    ("ridge", po::value(&lambda)->default_value(1.0), "ridge penalty on the weights, > 0 (sklearn Ridge's alpha)")
    ("out,o", po::value(&out_path), "write the weights here (JSON; required)")
    ("threads", po::value(&threads)->default_value(0), "CPU threads; 0 uses all cores");
  // clang-format on
  add_compute_options(desc, compute_arg);
  po::variables_map vm;
  const std::string example =
      "Example:\n  vericache train-kvzap --out kvzap.json\n"
      "  vericache generate --compressor kvzap --params '{\"weights\": \"kvzap.json\"}' -c 0.25 -f doc.txt\n";
  if (auto done = parse_command_line("train-kvzap", desc, example, argc, argv, &vm,
                                     {{"passages", 2, 1 << 20}, {"passage-tokens", 16, 1 << 20}, {"ridge", 0, 1e9, true},
                                      kThreadsRange}))
    return *done;
  if (out_path.empty()) return report_usage_error("train-kvzap", "give --out FILE for the weights");
  // Checked now, not after minutes of training.
  if (Status s = check_output_path(out_path); !s.ok()) return report_usage_error("train-kvzap", "--out " + s.message());
  set_threads(threads);

  auto model = load_model(model_arg, compute_arg);
  if (!model.ok()) return report_error(model.status());
  const LlamaModel& m = **model;
  const ModelShape shape = m.shape();
  auto read = corpus_tokens(m, corpus, passages, passage_tokens);
  if (!read.ok()) return report_error(read.status());
  const std::vector<int32_t>& corpus_ids = *read;
  // The chat template around a passage: [prefix | passage | suffix].
  auto wrapped = prompt_tokens(m, "\x01", /*raw=*/false, "");
  if (!wrapped.ok()) return report_error(wrapped.status());
  const std::vector<int32_t> marker = m.tokenizer().encode("\x01", false);
  const auto at_marker = std::search(wrapped->begin(), wrapped->end(), marker.begin(), marker.end());
  if (at_marker == wrapped->end()) {
    return report_error(Status::not_supported("cannot find where a user message goes in this model's chat template"));
  }
  const std::vector<int32_t> prefix(wrapped->begin(), at_marker), suffix(at_marker + marker.size(), wrapped->end());
  const auto prefix_len = static_cast<int64_t>(prefix.size());

  // The teacher: KVzip+ (n_sink 4, chunks of 2048) scoring from the passage on.
  const std::string teacher_params = R"({"kvzip_plus": true, "context_start": )" + std::to_string(prefix_len) + "}";
  auto teacher = load_compressor_for("kvzip", teacher_params, {}, m);
  if (!teacher.ok()) return report_error(teacher.status());
  std::vector<NormalEquations> fit(shape.n_layers);
  std::vector<std::vector<at::Tensor>> val_x(shape.n_layers), val_y(shape.n_layers);
  const auto start_time = std::chrono::steady_clock::now();
  const int64_t stride = static_cast<int64_t>(corpus_ids.size()) / passages;
  for (int64_t p = 0; p < passages; ++p) {
    std::vector<int32_t> ids = prefix;
    ids.insert(ids.end(), corpus_ids.begin() + p * stride, corpus_ids.begin() + p * stride + passage_tokens);
    ids.insert(ids.end(), suffix.begin(), suffix.end());
    const auto n = static_cast<int64_t>(ids.size());
    auto pool = m.make_page_pool(16, shape.n_layers * ((2 * n + 128) / 16 + 2));
    if (!pool.ok()) return report_error(pool.status());
    SequenceKv kv(shape.n_layers);
    std::vector<int32_t> positions(n);
    for (int64_t i = 0; i < n; ++i) positions[i] = static_cast<int32_t>(i);
    std::vector<at::Tensor> inputs(shape.n_layers);  // the passage tokens' attention inputs
    ForwardItem item{ids, positions, &kv, &*pool, LogitRows::kNone};
    at::Tensor logits;
    const double ratios[] = {1.0};
    std::vector<LayerDrops> drops;
    const LayerObserver teacher_sees = compression_observer(**teacher, ratios, &drops);
    Status s = m.forward(std::span(&item, 1), &logits, [&](const LayerActivations& acts) {
      inputs[acts.layer] = acts.hidden.narrow(0, prefix_len, passage_tokens).to(at::kCPU, at::kFloat).clone();
      return teacher_sees(acts);
    });
    std::vector<at::Tensor> scores;
    if (s.ok()) {
      LlamaModelAccess access(m, *pool, kv, ids, 0);
      s = (*teacher)->score_tokens(kv.view(*pool), access, &scores);
    }
    (*teacher)->release(0);
    kv.release(*pool);
    if (!s.ok()) return report_error(s);
    const bool held_out = p % 8 == 7 || p == passages - 1;
    for (int64_t l = 0; l < shape.n_layers; ++l) {
      const at::Tensor y = at::log(scores[l].narrow(1, prefix_len, passage_tokens).clamp_min(1e-30)).t().contiguous();
      if (held_out) {
        val_x[l].push_back(inputs[l]);
        val_y[l].push_back(y);
      } else {
        fit[l].add(inputs[l], y);
      }
    }
    std::fprintf(stderr, "\r[train-kvzap] passage %lld/%lld (%s) %.0f s", static_cast<long long>(p + 1),
                 static_cast<long long>(passages), held_out ? "held out" : "fit", std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time).count());
  }
  std::fprintf(stderr, "\n");

  kvzap::SurrogateWeights weights;
  std::vector<double> r2;
  for (int64_t l = 0; l < shape.n_layers; ++l) {
    auto [w, b] = fit[l].solve(lambda);
    weights.weight.push_back(w);
    weights.bias.push_back(b);
    const at::Tensor x = at::cat(val_x[l]), y = at::cat(val_y[l]);
    const at::Tensor pred = at::addmm(b, x, w.t());
    const double sse = (pred - y).pow(2).sum().item<double>(), sst = (y - y.mean(0)).pow(2).sum().item<double>();
    r2.push_back(1.0 - sse / sst);
  }
  double mean_r2 = 0;
  for (double v : r2) mean_r2 += v / static_cast<double>(r2.size());
  const nlohmann::json training{{"teacher", "KVzip+ (the kvzip plugin's score_tokens(), kvzip_plus), n_sink 4, chunk 2048, passage tokens only"},
                                {"corpus", corpus},
                                {"passages", passages},
                                {"passage_tokens", passage_tokens},
                                {"fit_rows", fit[0].rows},
                                {"ridge", lambda},
                                {"held_out_r2_per_layer", r2},
                                {"held_out_r2_mean", mean_r2}};
  if (Status s = write_file_atomically(out_path, kvzap::to_json(weights, shape, training).dump() + "\n"); !s.ok()) {
    return report_error(s.with_context("writing the weights"));
  }
  std::printf("kvzap surrogate for '%s' (fingerprint %s): %lld fit rows per layer, held-out R^2 mean %.3f (min %.3f, max %.3f) -> %s\n",
              shape.name.c_str(), shape.fingerprint.c_str(), static_cast<long long>(fit[0].rows), mean_r2,
              *std::min_element(r2.begin(), r2.end()), *std::max_element(r2.begin(), r2.end()), out_path.c_str());
  return kExitOk;
}

}  // namespace vericache::cli
