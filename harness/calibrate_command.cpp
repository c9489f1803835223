// vericache calibrate: makes the per-model file a calibrated quantizer reads, from passages of the
// calibration corpus run through the model.
//   RotateKV: its outlier-aware key-channel order (ZunhaiSu/RotateKV k_reordering_calibration.py):
//     every layer's keys with RoPE undone and Walsh-Hadamard rotated over groups of KV heads
//     (rotatekv_calibration.h); channels sorted by their signed sum over every token, ascending.
//   KVQuant: every layer's keys (RoPE undone) and values, kept whole, then fitted (kvquant_fit.h):
//     percentile key ranges and the non-uniform datatypes (SqueezeAILab/KVQuant llama_simquant.py).
#include <ATen/ATen.h>
#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>

#include "cli_common.h"
#include "commands.h"
#include "kvquant_fit.h"
#include "rotatekv/rotatekv_calibration.h"
#include "util/output_file.h"

namespace po = boost::program_options;

namespace vericache::cli {

int run_calibrate(int argc, char** argv) {
  ComputeArgs compute_arg;
  std::string compressor, model_arg, corpus = VC_DEFAULT_BENCH_TEXT, out_path;
  int64_t passages = 16, passage_tokens = 512, head_group = 0;
  double outlier_fraction = 0.01;
  int threads = 0;
  po::options_description desc(
      "vericache calibrate: make the calibration file a quantizer needs for one model (RotateKV: the key-channel "
      "order; KVQuant: key ranges and non-uniform datatypes)\n\nOptions");
  // clang-format off
  desc.add_options()
    ("help,h", "print this help and exit")
    ("compressor", po::value(&compressor), "the quantizer to calibrate: kvquant or rotatekv (required)")
    ("model", po::value(&model_arg), kModelOptionHelp)
    ("corpus", po::value(&corpus)->default_value(corpus), "calibration text file")
    ("passages", po::value(&passages)->default_value(16), "passages taken evenly across the corpus")
    ("passage-tokens", po::value(&passage_tokens)->default_value(512), "tokens per passage (raw text, no chat template)")
    ("head-group", po::value(&head_group)->default_value(0),
     "rotatekv: KV heads rotated together by one Walsh-Hadamard transform; 0: the largest of 4, 2, 1 dividing the KV "
     "heads")
    ("outlier-fraction", po::value(&outlier_fraction)->default_value(0.01, "0.01"),
     "kvquant: share of key and value entries kept aside as float16 outliers (key ranges at its half-tail "
     "percentiles); 0 keeps none")
    ("out,o", po::value(&out_path), "write the calibration here (JSON; required)")
    ("threads", po::value(&threads)->default_value(0), "CPU threads; 0 uses all cores");
  // clang-format on
  add_compute_options(desc, compute_arg);
  po::variables_map vm;
  const std::string example =
      "Example:\n  vericache calibrate --compressor rotatekv --out rotatekv.json\n"
      "  vericache run --compressor rotatekv --params '{\"calibration\": \"rotatekv.json\", \"bits\": 2}' --check\n"
      "  vericache calibrate --compressor kvquant --out kvquant.json\n";
  if (auto done = parse_command_line("calibrate", desc, example, argc, argv, &vm,
                                     {{"passages", 1, 1 << 20}, {"passage-tokens", 16, 1 << 20}, {"head-group", 0, 1024}, {"outlier-fraction", 0, 0.2},
                                      kThreadsRange}))
    return *done;
  if (compressor.empty()) return report_usage_error("calibrate", "give --compressor kvquant or --compressor rotatekv");
  if (compressor != "rotatekv" && compressor != "kvquant") {
    return report_usage_error("calibrate", "--compressor must be kvquant or rotatekv (the calibrated quantizers), got '" +
                                               compressor + "'");
  }
  if (out_path.empty()) return report_usage_error("calibrate", "give --out FILE for the calibration");
  if (Status s = check_output_path(out_path); !s.ok()) return report_usage_error("calibrate", "--out " + s.message());
  set_threads(threads);

  auto model = load_model(model_arg, compute_arg);
  if (!model.ok()) return report_error(model.status());
  const LlamaModel& m = **model;
  const ModelShape shape = m.shape();
  const bool rotate = compressor == "rotatekv";
  if (head_group == 0) head_group = rotatekv::default_head_group(shape.n_kv_heads);
  const int64_t width = head_group * shape.head_dim;
  if (rotate && (shape.n_kv_heads % head_group != 0 || (width & (width - 1)) != 0)) {
    return report_usage_error("calibrate", "--head-group " + std::to_string(head_group) + " must divide the model's " +
                                               std::to_string(shape.n_kv_heads) + " KV heads, and head_group * head_dim (" +
                                               std::to_string(width) + ") must be a power of two");
  }
  auto corpus_ids = corpus_tokens(m, corpus, passages, passage_tokens);
  if (!corpus_ids.ok()) return report_error(corpus_ids.status());
  const std::vector<int32_t>& ids = *corpus_ids;

  const int64_t channels = shape.n_kv_heads * shape.head_dim;
  const plugin::Rope rope(shape.rope_freq_base, shape.head_dim);
  std::vector<at::Tensor> sums;  // rotatekv: one accumulator per layer (not copies of one tensor: they would share storage)
  std::vector<std::vector<at::Tensor>> keys(shape.n_layers), values(shape.n_layers);  // kvquant: [rows, N] per forward
  for (int64_t l = 0; l < shape.n_layers; ++l) sums.push_back(at::zeros({channels}, at::kDouble));
  const auto start_time = std::chrono::steady_clock::now();
  const int64_t stride = static_cast<int64_t>(ids.size()) / passages;
  for (int64_t p = 0; p < passages; ++p) {
    const std::span<const int32_t> passage(ids.data() + p * stride, passage_tokens);
    auto pool = m.make_page_pool(16, shape.n_layers * (passage_tokens / 16 + 2));
    if (!pool.ok()) return report_error(pool.status());
    SequenceKv kv(shape.n_layers);
    std::vector<int32_t> positions(passage_tokens);
    for (int64_t i = 0; i < passage_tokens; ++i) positions[i] = static_cast<int32_t>(i);
    ForwardItem item{passage, positions, &kv, &*pool, LogitRows::kNone};
    at::Tensor logits;
    const Status s = m.forward(std::span(&item, 1), &logits, [&](const LayerActivations& acts) {
      at::Tensor k = acts.k.to(at::kCPU, at::kFloat).contiguous().clone();
      const at::Tensor pos = acts.positions.to(at::kCPU).contiguous();
      const int64_t rows = k.size(0);
      if (rotate) {
        rotatekv::rotate_keys_before_rope(k.data_ptr<float>(), pos.data_ptr<int64_t>(), rows, shape.n_kv_heads,
                                          shape.head_dim, head_group, rope);
        sums[acts.layer] += k.reshape({rows, channels}).to(at::kDouble).sum(0);
        return Status();
      }
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t h = 0; h < shape.n_kv_heads; ++h) {
          rope.rotate(k.data_ptr<float>() + (r * shape.n_kv_heads + h) * shape.head_dim, pos.data_ptr<int64_t>()[r],
                      /*inverse=*/true);
        }
      }
      keys[acts.layer].push_back(k.reshape({rows, channels}));
      values[acts.layer].push_back(acts.v.to(at::kCPU, at::kFloat).reshape({rows, channels}).clone());
      return Status();
    });
    kv.release(*pool);
    if (!s.ok()) return report_error(s);
    std::fprintf(stderr, "\r[calibrate] passage %lld/%lld %.0f s", static_cast<long long>(p + 1),
                 static_cast<long long>(passages),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time).count());
  }
  std::fprintf(stderr, "\n");

  nlohmann::json record{{"corpus", corpus}, {"passages", passages}, {"passage_tokens", passage_tokens}};
  nlohmann::json file;
  std::string summary;
  if (rotate) {
    rotatekv::Calibration calibration;
    calibration.head_group = head_group;
    for (const at::Tensor& sum : sums) {
      const at::Tensor order = std::get<1>(at::sort(sum, /*stable=*/true, /*dim=*/0, /*descending=*/false)).to(at::kInt);
      calibration.key_order.emplace_back(order.data_ptr<int32_t>(), order.data_ptr<int32_t>() + channels);
    }
    record["statistic"] =
        "signed sum over calibration tokens of each key channel, RoPE undone and Walsh-Hadamard rotated; ascending";
    file = rotatekv::to_json(calibration, shape, record);
    summary = "head group " + std::to_string(head_group);
  } else {
    kvquant::Calibration calibration;
    calibration.outlier_fraction = outlier_fraction;
    for (int64_t l = 0; l < shape.n_layers; ++l) {
      calibration.layers.push_back(fit_kvquant_layer(at::cat(keys[l]), at::cat(values[l]), outlier_fraction));
      keys[l].clear();
      values[l].clear();
      std::fprintf(stderr, "\r[calibrate] fitted layer %lld/%lld", static_cast<long long>(l + 1),
                   static_cast<long long>(shape.n_layers));
    }
    std::fprintf(stderr, "\n");
    record["statistic"] =
        "key ranges: per-channel percentiles (outlier_fraction / 2 each tail) of keys before RoPE; datatypes: unweighted "
        "1-D k-means over the normalized inlier entries (no Fisher weights), Q-Norm terms";
    file = kvquant::to_json(calibration, shape, record);
    summary = "outlier fraction " + nlohmann::json(outlier_fraction).dump();
  }
  if (Status s = write_file_atomically(out_path, file.dump() + "\n"); !s.ok()) {
    return report_error(s.with_context("writing the calibration"));
  }
  std::printf("%s calibration for '%s' (fingerprint %s): %s, %lld tokens -> %s\n", compressor.c_str(), shape.name.c_str(),
              shape.fingerprint.c_str(), summary.c_str(), static_cast<long long>(passages * passage_tokens),
              out_path.c_str());
  return kExitOk;
}

}  // namespace vericache::cli
