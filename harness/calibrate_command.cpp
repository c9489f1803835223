// vericache calibrate: makes the per-model file a calibrated quantizer reads. RotateKV: its
// outlier-aware key-channel order (ZunhaiSu/RotateKV k_reordering_calibration.py) — passages of the
// calibration corpus through the model; every layer's keys with RoPE undone and Walsh-Hadamard
// rotated over groups of KV heads (rotatekv_calibration.h); channels sorted by their signed sum over
// every token, ascending.
#include <ATen/ATen.h>
#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>

#include "cli_common.h"
#include "commands.h"
#include "rotatekv/rotatekv_calibration.h"
#include "util/output_file.h"

namespace po = boost::program_options;

namespace vericache::cli {

int run_calibrate(int argc, char** argv) {
  std::string compressor, model_arg, corpus = VC_DEFAULT_BENCH_TEXT, out_path;
  int64_t passages = 16, passage_tokens = 512, head_group = 0;
  int threads = 0;
  po::options_description desc(
      "vericache calibrate: make the calibration file a quantizer needs for one model (RotateKV: the key-channel "
      "order)\n\nOptions");
  // clang-format off
  desc.add_options()
    ("help,h", "print this help and exit")
    ("compressor", po::value(&compressor), "the quantizer to calibrate: rotatekv (required)")
    ("model", po::value(&model_arg), kModelOptionHelp)
    ("corpus", po::value(&corpus)->default_value(corpus), "calibration text file")
    ("passages", po::value(&passages)->default_value(16), "passages taken evenly across the corpus")
    ("passage-tokens", po::value(&passage_tokens)->default_value(512), "tokens per passage (raw text, no chat template)")
    ("head-group", po::value(&head_group)->default_value(0),
     "KV heads rotated together by one Walsh-Hadamard transform; 0: the largest of 4, 2, 1 dividing the KV heads")
    ("out,o", po::value(&out_path), "write the calibration here (JSON; required)")
    ("threads", po::value(&threads)->default_value(0), "CPU threads; 0 uses all cores");
  // clang-format on
  po::variables_map vm;
  const std::string example =
      "Example:\n  vericache calibrate --compressor rotatekv --out rotatekv.json\n"
      "  vericache run --compressor rotatekv --params '{\"calibration\": \"rotatekv.json\", \"bits\": 2}' --check\n";
  if (auto done = parse_command_line("calibrate", desc, example, argc, argv, &vm,
                                     {{"passages", 1, 1 << 20}, {"passage-tokens", 16, 1 << 20}, {"head-group", 0, 1024},
                                      kThreadsRange}))
    return *done;
  if (compressor.empty()) return report_usage_error("calibrate", "give --compressor rotatekv");
  if (compressor != "rotatekv") {
    return report_usage_error("calibrate", "--compressor must be rotatekv (the one calibrated quantizer so far), got '" +
                                               compressor + "'");
  }
  if (out_path.empty()) return report_usage_error("calibrate", "give --out FILE for the calibration");
  if (Status s = check_output_path(out_path); !s.ok()) return report_usage_error("calibrate", "--out " + s.message());
  set_threads(threads);

  auto model = load_model(model_arg);
  if (!model.ok()) return report_error(model.status());
  const LlamaModel& m = **model;
  const ModelShape shape = m.shape();
  if (head_group == 0) head_group = rotatekv::default_head_group(shape.n_kv_heads);
  const int64_t width = head_group * shape.head_dim;
  if (shape.n_kv_heads % head_group != 0 || (width & (width - 1)) != 0) {
    return report_usage_error("calibrate", "--head-group " + std::to_string(head_group) + " must divide the model's " +
                                               std::to_string(shape.n_kv_heads) + " KV heads, and head_group * head_dim (" +
                                               std::to_string(width) + ") must be a power of two");
  }
  auto corpus_ids = corpus_tokens(m, corpus, passages, passage_tokens);
  if (!corpus_ids.ok()) return report_error(corpus_ids.status());
  const std::vector<int32_t>& ids = *corpus_ids;

  const int64_t channels = shape.n_kv_heads * shape.head_dim;
  const rotatekv::Rope rope(shape.rope_freq_base, shape.head_dim);
  std::vector<at::Tensor> sums;  // one accumulator per layer (not copies of one tensor: they would share storage)
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
      rotatekv::rotate_keys_before_rope(k.data_ptr<float>(), pos.data_ptr<int64_t>(), k.size(0), shape.n_kv_heads,
                                        shape.head_dim, head_group, rope);
      sums[acts.layer] += k.reshape({k.size(0), channels}).to(at::kDouble).sum(0);
      return Status();
    });
    kv.release(*pool);
    if (!s.ok()) return report_error(s);
    std::fprintf(stderr, "\r[calibrate] passage %lld/%lld %.0f s", static_cast<long long>(p + 1),
                 static_cast<long long>(passages),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time).count());
  }
  std::fprintf(stderr, "\n");

  rotatekv::Calibration calibration;
  calibration.head_group = head_group;
  for (const at::Tensor& sum : sums) {
    const at::Tensor order = std::get<1>(at::sort(sum, /*stable=*/true, /*dim=*/0, /*descending=*/false)).to(at::kInt);
    calibration.key_order.emplace_back(order.data_ptr<int32_t>(), order.data_ptr<int32_t>() + channels);
  }
  const nlohmann::json record{
      {"statistic", "signed sum over calibration tokens of each key channel, RoPE undone and Walsh-Hadamard rotated; "
                    "ascending"},
      {"corpus", corpus},
      {"passages", passages},
      {"passage_tokens", passage_tokens}};
  if (Status s = write_file_atomically(out_path, rotatekv::to_json(calibration, shape, record).dump() + "\n"); !s.ok()) {
    return report_error(s.with_context("writing the calibration"));
  }
  std::printf("rotatekv calibration for '%s' (fingerprint %s): head group %lld, %lld tokens -> %s\n", shape.name.c_str(),
              shape.fingerprint.c_str(), static_cast<long long>(head_group), static_cast<long long>(passages * passage_tokens),
              out_path.c_str());
  return kExitOk;
}

}  // namespace vericache::cli
