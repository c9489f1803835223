// LlamaModel: loading, weight placement, batch validation and forward dispatch. The forwards
// themselves are in llama_forward_cpu.cpp and llama_forward_torch.cpp.
#include "model/llama_model.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include "model/ggml_dequant.h"
#include "model/model_shapes.h"
#include "model/int8_repack.h"
#include "model/weight_repack.h"
#include "util/check.h"
#include "util/printable.h"
#include "util/system_memory.h"

namespace vericache {
namespace {

std::string shape_string(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// The tensor `name` after checking it has the PyTorch shape (GGUF dims reversed) `torch_shape`.
Result<const GgufTensorInfo*> find_checked(const GgufFile& file, const std::string& name,
                                           const std::vector<int64_t>& torch_shape) {
  const GgufTensorInfo* info = file.find_tensor(name);
  if (info == nullptr) return Status::not_found(file.path() + ": missing tensor " + printable(name));
  const std::vector<int64_t> found(info->dims.rbegin(), info->dims.rend());
  if (found != torch_shape) {
    return Status::corruption(file.path() + ": tensor " + printable(name) + " has shape " + shape_string(found) +
                              ", expected " + shape_string(torch_shape));
  }
  return info;
}

// A 1-D float32 weight (norms).
Result<at::Tensor> load_vector(const GgufFile& file, const std::string& name, int64_t size) {
  VC_ASSIGN_OR_RETURN(const GgufTensorInfo* info, find_checked(file, name, {size}));
  at::Tensor t = at::empty({size}, at::kFloat);
  Status s = dequantize(info->type, info->data, info->n_elements, t.data_ptr<float>());
  if (!s.ok()) return s.with_context(file.path() + ": tensor " + printable(name));
  return t;
}

// The formats the CPU kernels read in place.
std::optional<cpu::WeightFormat> kernel_format(GgmlType type) {
  switch (type) {
    case GgmlType::kF32: return cpu::WeightFormat::kF32;
    case GgmlType::kQ8_0: return cpu::WeightFormat::kQ8_0;
    case GgmlType::kQ4_0: return cpu::WeightFormat::kQ4_0;
    case GgmlType::kQ4_1: return cpu::WeightFormat::kQ4_1;
    case GgmlType::kQ5_0: return cpu::WeightFormat::kQ5_0;
    default: return repacked_format(type);  // K-quants, repacked at load
  }
}

// Row order that turns Q/K rows paired for RoPE as (i, i + head_dim / 2) into adjacent pairs
// (2i, 2i + 1), head by head: new row 2i is old row i, new row 2i + 1 is old row i + head_dim / 2.
// V rows (after the Q and K heads) keep their order. A permutation of whole rows: exact.
at::Tensor adjacent_pair_order(int64_t q_heads_plus_k_heads, int64_t head_dim, int64_t total_rows) {
  at::Tensor order = at::arange(total_rows, at::kLong);
  auto* o = order.data_ptr<int64_t>();
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < q_heads_plus_k_heads; ++h) {
    for (int64_t i = 0; i < half; ++i) {
      o[h * head_dim + 2 * i] = h * head_dim + i;
      o[h * head_dim + 2 * i + 1] = h * head_dim + half + i;
    }
  }
  return order;
}

// libtorch errors carry several lines of advice; a Status message is one line.
std::string first_line(const c10::Error& e) {
  const std::string what = e.what_without_backtrace();
  return what.substr(0, what.find('\n'));
}

}  // namespace

LlamaModel::LlamaModel(std::string file_path, const LoadOptions& options)
    : file_path_(std::move(file_path)),
      options_(options),
      path_(options.device.is_cpu() ? ForwardPath::kCpuKernels : ForwardPath::kTorch),
      kv_dtype_(options.dtype) {}

Result<std::unique_ptr<LlamaModel>> LlamaModel::load(const std::string& path, const LoadOptions& options) {
  if (options.device.is_cpu() && options.dtype != at::kFloat) {
    return Status::not_supported("the CPU forward computes in float32; load CPU models with dtype float32");
  }
  VC_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(path));
  std::unique_ptr<LlamaModel> model(new LlamaModel(path, options));
  VC_ASSIGN_OR_RETURN(model->config_, LlamaConfig::from_gguf(file));
  VC_ASSIGN_OR_RETURN(model->tokenizer_, Tokenizer::from_gguf(file));
  if (model->tokenizer_.vocab_size() != model->config_.vocab_size) {
    return Status::corruption(path + ": tokenizer has " + std::to_string(model->tokenizer_.vocab_size()) +
                              " tokens but the embedding has " + std::to_string(model->config_.vocab_size) + " rows");
  }
  auto chat = ChatTemplate::from_gguf(file);
  if (chat.ok()) {
    model->chat_template_ = std::move(chat).value();
  } else {
    model->chat_template_status_ = chat.status();
  }
  VC_RETURN_IF_ERROR(model->load_weights(file));
  VC_RETURN_IF_ERROR(model->finish_loading());
  return model;
}

Result<std::unique_ptr<LlamaModel>> LlamaModel::with_random_weights(const std::string& shape, uint64_t seed,
                                                                    const LoadOptions& options) {
  if (options.device.is_cpu() && options.dtype != at::kFloat) {
    return Status::not_supported("the CPU forward computes in float32; load CPU models with dtype float32");
  }
  VC_ASSIGN_OR_RETURN(NamedShape named, find_named_shape(shape));
  if (options.device.is_cpu()) {
    // Refused up front: drawing past the machine's memory would end in the kernel's OOM killer.
    const double need = 4.0 * static_cast<double>(named.config.parameter_count(named.tied_embeddings));
    const double have = physical_memory_bytes();
    if (need > 0.8 * have) {
      char message[200];
      std::snprintf(message, sizeof message,
                    "random-weights:%s needs %.1f GB of float32 weights on the CPU, more than 80%% of this machine's "
                    "%.1f GB; run it on a GPU (--device cuda)",
                    named.name.c_str(), need / 1e9, have / 1e9);
      return Status::not_supported(message);
    }
  }
  std::unique_ptr<LlamaModel> model(new LlamaModel("random-weights:" + named.name, options));
  model->config_ = named.config;
  model->tied_embeddings_ = named.tied_embeddings;
  model->weight_type_ = kRandomWeightType;
  model->chat_template_status_ = Status::not_found(model->file_path_ + " has no chat template (random weights)");
  VC_RETURN_IF_ERROR(model->draw_random_weights(seed));
  VC_RETURN_IF_ERROR(model->finish_loading());
  return model;
}

Status LlamaModel::finish_loading() {
  build_rope_table();
  kernels_ = &cpu::best_kernels();
  int_kernels_ = &cpu::best_int_kernels();
  fingerprint_ = compute_fingerprint();
  VC_RETURN_IF_ERROR(place_weights());
  return set_compute(options_.compute);
}

const char* compute_name(Compute compute) { return compute == Compute::kInteger ? "integer" : "float32"; }

int64_t LlamaModel::matrix_bytes(const Weight& w) const {
  if (compute_ != Compute::kInteger || w.int_panels.empty()) return static_cast<int64_t>(w.tensor.nbytes());
  if (w.int_view) return static_cast<int64_t>(w.int_tensor.nbytes());
  int64_t bytes = 0;
  for (const Weight& part : w.parts) bytes += static_cast<int64_t>(part.int_tensor.nbytes());
  return bytes;
}

Status LlamaModel::set_compute(Compute compute) {
  if (compute == Compute::kInteger) {
    if (path_ != ForwardPath::kCpuKernels) return Status::invalid_argument("integer compute needs the CPU kernels");
    bool any = false;
    auto build_one = [&](Weight& w) {
      if (w.int_view || w.view.data == nullptr) return;
      if (!int_weight_format(w.view.format) || w.view.k % cpu::kQuantBlock != 0) return;
      w.int_view = repack_int_panels(w.view, [&w](int64_t bytes) {
        w.int_tensor = at::empty({bytes}, at::kByte);
        return w.int_tensor.data_ptr<uint8_t>();
      });
    };
    auto build = [&](Weight& w) {
      build_one(w);
      for (Weight& part : w.parts) build_one(part);
      w.int_panels.clear();
      // The whole matrix's panels, or every part's; none if a row would be left without.
      std::vector<const cpu::IntWeightView*> views;
      if (w.int_view) {
        views.push_back(&*w.int_view);
      } else {
        for (const Weight& part : w.parts) views.push_back(part.int_view ? &*part.int_view : nullptr);
      }
      if (views.empty() || std::find(views.begin(), views.end(), nullptr) != views.end()) return;
      int64_t first_panel = 0, column0 = 0;
      for (const cpu::IntWeightView* v : views) {
        w.int_panels.push_back(IntPanels{*v, first_panel, column0});
        first_panel += v->panels();
        column0 += v->n;
      }
      any = true;
    };
    for (Layer& L : layers_) {
      build(L.wqkv);
      build(L.wo);
      build(L.w_gate_up);
      build(L.w_down);
    }
    build(output_);
    if (!any) {
      return Status::invalid_argument("integer compute needs quantized weight matrices; this model holds float " +
                                      std::string("ones (a float GGUF, or loaded with quantized_weights = false)"));
    }
  }
  compute_ = compute;
  decode_weight_bytes_ = matrix_bytes(output_);
  for (const Layer& L : layers_) {
    decode_weight_bytes_ += matrix_bytes(L.wqkv) + matrix_bytes(L.wo) + matrix_bytes(L.w_gate_up) + matrix_bytes(L.w_down);
  }
  return Status();
}

// Matrices straight on the model's device in its dtype (an 8B model never passes through host
// float32); norms float32 on the CPU, where place_weights() expects them.
Status LlamaModel::draw_random_weights(uint64_t seed) {
  const LlamaConfig& c = config_;
  const int64_t d = c.d_model, q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim;
  try {
    at::Generator generator = at::globalContext().defaultGenerator(options_.device);
    {
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_current_seed(seed);
    }
    const auto on_device = at::TensorOptions().device(options_.device).dtype(options_.dtype);
    auto matrix = [&](int64_t n, int64_t k) {
      Weight w;
      w.tensor = at::empty({n, k}, on_device).normal_(0.0, 1.0 / std::sqrt(static_cast<double>(k)), generator);
      if (options_.device.is_cpu()) {
        w.view = cpu::WeightView{cpu::WeightFormat::kF32, w.tensor.data_ptr(), n, k,
                                 k * static_cast<int64_t>(sizeof(float))};
      }
      return w;
    };
    token_embedding_ = matrix(c.vocab_size, d);
    output_ = tied_embeddings_ ? token_embedding_ : matrix(c.vocab_size, d);
    output_norm_ = at::ones({d}, at::kFloat);
    layers_.resize(c.n_layers);
    for (Layer& L : layers_) {
      L.attn_norm = at::ones({d}, at::kFloat);
      L.wqkv = matrix(q + 2 * kv, d);
      L.wo = matrix(d, q);
      L.ffn_norm = at::ones({d}, at::kFloat);
      L.w_gate_up = matrix(2 * c.d_ff, d);
      L.w_down = matrix(d, c.d_ff);
    }
  } catch (const c10::Error& e) {
    return Status::internal(file_path_ + ": cannot draw the random weights on " + options_.device.str() + ": " +
                            first_line(e));
  }
  return Status();
}

// Rows of `w` in `order` (row i of the result is row order[i]; the float or block rows move
// whole), and so for its parts: the order must keep each part's rows within the part.
void LlamaModel::reorder_rows(Weight& w, const at::Tensor& order) {
  w.tensor = w.tensor.index_select(0, order);
  w.view.data = w.tensor.data_ptr();
  int64_t first = 0;
  for (Weight& part : w.parts) {
    reorder_rows(part, order.slice(0, first, first + part.view.n) - first);
    first += part.view.n;
  }
}

// Rows of the named matrices stacked in order (each [rows, k]): kept in their ggml blocks (K-quants
// repacked, model/weight_repack.h) when the CPU kernels read that type and all parts share it, else
// dequantized to float32.
Result<LlamaModel::Weight> LlamaModel::load_matrix(const GgufFile& file, const std::vector<std::string>& names,
                                                   const std::vector<int64_t>& rows, int64_t k) const {
  std::vector<const GgufTensorInfo*> parts;
  int64_t n = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    VC_ASSIGN_OR_RETURN(const GgufTensorInfo* info, find_checked(file, names[i], {rows[i], k}));
    parts.push_back(info);
    n += rows[i];
  }
  const auto format = kernel_format(parts[0]->type);
  bool in_place = options_.device.is_cpu() && options_.quantized_weights && format.has_value();
  for (const GgufTensorInfo* p : parts) in_place = in_place && p->type == parts[0]->type;

  Weight w;
  if (!in_place && parts.size() > 1 && options_.device.is_cpu() && options_.quantized_weights) {
    // Parts of different types: float32 below for the float path, and each part in its own blocks
    // for integer mode (Weight::parts).
    for (size_t i = 0; i < names.size(); ++i) {
      if (!kernel_format(parts[i]->type).has_value()) {
        w.parts.clear();
        break;
      }
      VC_ASSIGN_OR_RETURN(Weight part, load_matrix(file, {names[i]}, {rows[i]}, k));
      w.parts.push_back(std::move(part));
    }
  }
  if (in_place) {
    const bool repack = repacked_format(parts[0]->type).has_value();
    const auto row_bytes = repack ? repacked_row_bytes(*format, k)
                                  : static_cast<int64_t>(parts[0]->n_bytes / parts[0]->dims[1]);
    w.tensor = at::empty({n, row_bytes}, at::kByte);
    auto* dst = w.tensor.data_ptr<uint8_t>();
    for (const GgufTensorInfo* p : parts) {
      if (repack) {
        repack_rows(p->type, p->data, p->dims[1], k, dst);
        dst += p->dims[1] * row_bytes;
      } else {
        dst = std::copy_n(p->data, p->n_bytes, dst);
      }
    }
    w.view = cpu::WeightView{*format, w.tensor.data_ptr(), n, k, row_bytes};
    return w;
  }
  w.tensor = at::empty({n, k}, at::kFloat);
  float* dst = w.tensor.data_ptr<float>();
  for (size_t i = 0; i < parts.size(); ++i) {
    Status s = dequantize(parts[i]->type, parts[i]->data, parts[i]->n_elements, dst);
    if (!s.ok()) return s.with_context(file.path() + ": tensor " + printable(names[i]));
    dst += parts[i]->n_elements;
  }
  w.view = cpu::WeightView{cpu::WeightFormat::kF32, w.tensor.data_ptr(), n, k, k * static_cast<int64_t>(sizeof(float))};
  return w;
}

Status LlamaModel::load_weights(const GgufFile& file) {
  const LlamaConfig& c = config_;
  const int64_t d = c.d_model, hd = c.head_dim, kv = c.n_kv_heads * hd;
  std::map<std::string, int> type_counts;
  for (const GgufTensorInfo& t : file.tensors()) {
    if (t.dims.size() == 2) ++type_counts[ggml_type_name(t.type)];
  }
  for (const auto& [name, count] : type_counts) {
    if (weight_type_.empty() || count > type_counts[weight_type_]) weight_type_ = name;
  }

  VC_ASSIGN_OR_RETURN(token_embedding_, load_matrix(file, {"token_embd.weight"}, {c.vocab_size}, d));
  VC_ASSIGN_OR_RETURN(output_norm_, load_vector(file, "output_norm.weight", d));
  tied_embeddings_ = file.find_tensor("output.weight") == nullptr;
  if (tied_embeddings_) {
    output_ = token_embedding_;
  } else {
    VC_ASSIGN_OR_RETURN(output_, load_matrix(file, {"output.weight"}, {c.vocab_size}, d));
  }
  layers_.resize(c.n_layers);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    Layer& L = layers_[l];
    VC_ASSIGN_OR_RETURN(L.attn_norm, load_vector(file, p + "attn_norm.weight", d));
    VC_ASSIGN_OR_RETURN(L.wqkv, load_matrix(file, {p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"},
                                            {c.n_heads * hd, kv, kv}, d));
    if (c.attention_bias) {
      VC_ASSIGN_OR_RETURN(at::Tensor bq, load_vector(file, p + "attn_q.bias", c.n_heads * hd));
      VC_ASSIGN_OR_RETURN(at::Tensor bk, load_vector(file, p + "attn_k.bias", kv));
      VC_ASSIGN_OR_RETURN(at::Tensor bv, load_vector(file, p + "attn_v.bias", kv));
      L.bqkv = at::cat({bq, bk, bv});
    }
    if (c.rope_pairs_halves) {
      const at::Tensor order = adjacent_pair_order(c.n_heads + c.n_kv_heads, hd, c.n_heads * hd + 2 * kv);
      reorder_rows(L.wqkv, order);
      if (L.bqkv.defined()) L.bqkv = L.bqkv.index_select(0, order);
    }
    VC_ASSIGN_OR_RETURN(L.wo, load_matrix(file, {p + "attn_output.weight"}, {d}, c.n_heads * hd));
    VC_ASSIGN_OR_RETURN(L.ffn_norm, load_vector(file, p + "ffn_norm.weight", d));
    VC_ASSIGN_OR_RETURN(L.w_gate_up, load_matrix(file, {p + "ffn_gate.weight", p + "ffn_up.weight"}, {c.d_ff, c.d_ff}, d));
    VC_ASSIGN_OR_RETURN(L.w_down, load_matrix(file, {p + "ffn_down.weight"}, {d}, c.d_ff));
  }
  return Status();
}

// FNV-1a over every layer's normalisation weights and the first row of each of its weight
// matrices (as dequantized), plus the output norm: cheap, and different for any retraining or
// fine-tune that touches those (LoRA on attention or MLP included). Needs kernels_ (CPU weights).
std::string LlamaModel::compute_fingerprint() const {
  uint64_t hash = 1469598103934665603ull;
  auto mix = [&](const at::Tensor& tensor) {
    const at::Tensor t = tensor.to(at::kCPU, at::kFloat).contiguous();
    const auto* bytes = static_cast<const unsigned char*>(t.data_ptr());
    for (int64_t i = 0; i < t.numel() * 4; ++i) hash = (hash ^ bytes[i]) * 1099511628211ull;
  };
  const int64_t q = config_.n_heads * config_.head_dim, kv = config_.n_kv_heads * config_.head_dim;
  for (const Layer& L : layers_) {
    mix(L.attn_norm);
    mix(L.ffn_norm);
    for (int64_t row : {int64_t{0}, q, q + kv}) mix(weight_rows(L.wqkv, row, 1));
    mix(weight_rows(L.wo, 0, 1));
    mix(weight_rows(L.w_gate_up, 0, 1));
    mix(weight_rows(L.w_down, 0, 1));
  }
  mix(output_norm_);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash));
  return hex;
}

// cos/sin of pos * inv_freq[i], computed with the same float32 libtorch operations as the
// Hugging Face Llama rotary embedding, so positions agree with the reference to the last bit.
void LlamaModel::build_rope_table() {
  const int64_t half = config_.head_dim / 2;
  const at::Tensor exponents =
      at::arange(0, config_.head_dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(config_.head_dim);
  const at::Tensor inv_freq = 1.0 / at::pow(config_.rope_freq_base, exponents);
  const at::Tensor positions = at::arange(0, config_.context_length, at::kLong).to(at::kFloat);
  const at::Tensor angles = positions.unsqueeze(1) * inv_freq.unsqueeze(0);  // [context, half]
  rope_cos_ = angles.cos().contiguous();
  rope_sin_ = angles.sin().contiguous();
  VC_CHECK(rope_cos_.size(1) == half, "rope table width");
}

// Moves the float32 CPU weights to the model's device and dtype (norm weights and rope tables
// stay float32: the torch path computes norms and RoPE in float32). The CPU kernels' views do not
// apply there and are cleared.
Status LlamaModel::place_weights() {
  if (options_.device.is_cpu()) return Status();
  try {
    auto place = [&](Weight& w) {
      w.tensor = w.tensor.to(options_.device, options_.dtype).contiguous();
      w.view = cpu::WeightView{};
    };
    auto place_f32 = [&](at::Tensor& t) { t = t.to(options_.device).contiguous(); };
    place(token_embedding_);
    if (tied_embeddings_) {
      output_ = token_embedding_;
    } else {
      place(output_);
    }
    place_f32(output_norm_);
    for (Layer& L : layers_) {
      place_f32(L.attn_norm);
      place(L.wqkv);
      if (L.bqkv.defined()) L.bqkv = L.bqkv.to(options_.device, options_.dtype).contiguous();
      place(L.wo);
      place_f32(L.ffn_norm);
      place(L.w_gate_up);
      place(L.w_down);
    }
    place_f32(rope_cos_);
    place_f32(rope_sin_);
  } catch (const c10::Error& e) {
    return Status::internal(file_path_ + ": cannot place the weights on " + options_.device.str() + ": " +
                            first_line(e));
  }
  return Status();
}

Status LlamaModel::set_forward_path(ForwardPath path) {
  if (path == ForwardPath::kCpuKernels && (!options_.device.is_cpu() || options_.dtype != at::kFloat)) {
    return Status::invalid_argument("the CPU kernels need a float32 CPU model");
  }
  auto in_blocks = [](const Weight& w) { return w.tensor.scalar_type() == at::kByte; };
  bool any_in_blocks = in_blocks(token_embedding_) || in_blocks(output_);
  for (const Layer& L : layers_) {
    any_in_blocks = any_in_blocks || in_blocks(L.wqkv) || in_blocks(L.wo) || in_blocks(L.w_gate_up) || in_blocks(L.w_down);
  }
  if (path == ForwardPath::kTorch && any_in_blocks) {
    return Status::invalid_argument("the torch forward needs float weights: load with quantized_weights = false");
  }
  if (path == ForwardPath::kTorch && kv_dtype_ != options_.dtype) {
    return Status::invalid_argument("the torch forward keeps K/V in the model dtype: set_kv_dtype(" +
                                    std::string(c10::toString(options_.dtype)) + ") first");
  }
  path_ = path;
  return Status();
}

int64_t LlamaModel::kv_bytes_per_slot() const {
  return 2 * config_.n_kv_heads * config_.head_dim * static_cast<int64_t>(c10::elementSize(kv_dtype_));
}

Status LlamaModel::set_kv_dtype(at::ScalarType dtype) {
  if (dtype == options_.dtype || (path_ == ForwardPath::kCpuKernels && dtype == at::kBFloat16)) {
    kv_dtype_ = dtype;
    return Status();
  }
  return Status::invalid_argument(std::string("a KV cache of ") + c10::toString(dtype) +
                                  (path_ == ForwardPath::kCpuKernels
                                       ? ": the CPU kernels keep K/V in float32 or bfloat16"
                                       : ": the torch forward keeps K/V in the model dtype, " +
                                             std::string(c10::toString(options_.dtype))));
}

Result<ChatTemplate> LlamaModel::chat_template() const {
  if (chat_template_) return *chat_template_;
  return chat_template_status_;
}

KvPageSpec LlamaModel::kv_page_spec(int64_t page_size) const {
  return KvPageSpec{config_.n_layers, config_.n_kv_heads, config_.head_dim, page_size};
}

Result<PagePool> LlamaModel::make_page_pool(int64_t page_size, int64_t num_pages) const {
  return PagePool::create(kv_page_spec(page_size), num_pages, kv_dtype_, options_.device);
}

Status LlamaModel::validate_pool(const PagePool& pool) const {
  const KvPageSpec& spec = pool.spec();
  if (spec.n_layers != config_.n_layers || spec.n_kv_heads != config_.n_kv_heads || spec.head_dim != config_.head_dim) {
    return Status::invalid_argument("forward: the KV page pool was made for another model shape");
  }
  const at::Device pool_device = pool.k_pages().device();
  const bool same_device = pool_device.type() == options_.device.type() &&
                           (!options_.device.has_index() || pool_device.index() == options_.device.index());
  if (pool.k_pages().scalar_type() != kv_dtype_ || !same_device) {
    return Status::invalid_argument(std::string("forward: the KV page pool is not on the model's device in its KV dtype (") +
                                    c10::toString(kv_dtype_) + ")");
  }
  return Status();
}

Status LlamaModel::validate(std::span<const ForwardItem> batch) const {
  // Pages each (pool, page kind) must supply, in order of first use.
  struct Demand {
    const PagePool* pool;
    PageKind kind;
    int64_t pages;
  };
  std::vector<Demand> demands;
  for (size_t i = 0; i < batch.size(); ++i) {
    const ForwardItem& item = batch[i];
    const std::string where = "forward: request " + std::to_string(i) + ": ";
    if (item.kv == nullptr || item.kv->n_layers() != config_.n_layers) {
      return Status::invalid_argument(where + "needs a KV cache with " + std::to_string(config_.n_layers) + " layers");
    }
    if (item.pool == nullptr) return Status::invalid_argument(where + "needs the page pool of its KV cache");
    VC_RETURN_IF_ERROR(validate_pool(*item.pool));
    if (item.tokens.size() != item.positions.size()) {
      return Status::invalid_argument(where + std::to_string(item.tokens.size()) + " tokens but " +
                                      std::to_string(item.positions.size()) + " positions");
    }
    for (int32_t t : item.tokens) {
      if (t < 0 || t >= config_.vocab_size) {
        return Status::invalid_argument(where + "token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                                        std::to_string(config_.vocab_size) + ")");
      }
    }
    for (int32_t p : item.positions) {
      if (p < 0 || p >= config_.context_length) {
        return Status::invalid_argument(where + "position " + std::to_string(p) + " is outside the model's context of " +
                                        std::to_string(config_.context_length) + " tokens");
      }
    }
    if (item.kv->packed_pages_held() > 0) {
      if (item.packed_pool == nullptr || item.unpacker == nullptr) {
        return Status::invalid_argument(where + "its KV cache has packed slots: it needs their packed page pool and "
                                        "the compressor that unpacks them");
      }
      if (path_ != ForwardPath::kCpuKernels) {
        return Status::not_supported(where + "a KV cache with packed slots is read by the CPU kernels only");
      }
    }
    for (size_t j = 0; j < i; ++j) {
      if (batch[j].kv == item.kv) return Status::invalid_argument(where + "shares its KV cache with request " + std::to_string(j));
    }
    const int64_t pages = item.kv->pages_needed(item.pool->spec(), static_cast<int64_t>(item.tokens.size()));
    auto it = std::find_if(demands.begin(), demands.end(),
                           [&](const Demand& d) { return d.pool == item.pool && d.kind == item.kv->page_kind(); });
    if (it == demands.end()) {
      demands.push_back({item.pool, item.kv->page_kind(), pages});
    } else {
      it->pages += pages;
    }
  }
  for (const Demand& d : demands) {
    if (d.pages > d.pool->num_free(d.kind)) {
      const std::string what = d.pool->num_pages(PageKind::kTransient) == 0
                                   ? "KV page pool"
                                   : std::string("KV page pool (") + page_kind_name(d.kind) + " pages)";
      return Status::out_of_pages(what + " exhausted: the batch needs " + std::to_string(d.pages) + " pages, " +
                                  std::to_string(d.pool->num_free(d.kind)) + " of " +
                                  std::to_string(d.pool->num_pages(d.kind)) + " free");
    }
  }
  return Status();
}

std::vector<int64_t> LlamaModel::logit_rows(std::span<const ForwardItem> batch, const std::vector<int64_t>& begin) {
  std::vector<int64_t> rows;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (begin[i + 1] == begin[i]) continue;
    if (batch[i].logits == LogitRows::kLast) rows.push_back(begin[i + 1] - 1);
    if (batch[i].logits == LogitRows::kAll)
      for (int64_t r = begin[i]; r < begin[i + 1]; ++r) rows.push_back(r);
  }
  return rows;
}

Status LlamaModel::forward(std::span<const ForwardItem> batch, at::Tensor* logits, const LayerObserver& observer,
                           ForwardTimes* times) const {
  VC_RETURN_IF_ERROR(validate(batch));
  if (path_ == ForwardPath::kTorch) {
    for (const ForwardItem& item : batch) {
      if (item.pool != batch[0].pool) {
        return Status::not_supported("forward: the torch path needs every request's KV cache in one page pool");
      }
    }
  }
  std::vector<int64_t> begin(batch.size() + 1, 0);
  for (size_t i = 0; i < batch.size(); ++i) {
    begin[i + 1] = begin[i] + static_cast<int64_t>(batch[i].tokens.size());
    VC_CHECK(batch[i].kv->reserve(*batch[i].pool, static_cast<int64_t>(batch[i].tokens.size())).ok(),
             "validated reservation");
  }
  Status status;
  if (path_ == ForwardPath::kCpuKernels) {
    status = forward_cpu(batch, begin, logits, observer, times);
  } else if (!batch.empty()) {
    try {
      status = forward_torch(batch, begin, *batch[0].pool, logits, observer);
    } catch (const c10::Error& e) {
      return Status::internal(std::string("forward on ") + options_.device.str() + ": " + first_line(e));
    }
  }
  if (!status.ok()) return status;
  for (const ForwardItem& item : batch) item.kv->advance(item.positions);
  return Status();
}

ModelShape LlamaModel::shape() const {
  ModelShape shape;
  shape.n_layers = config_.n_layers;
  shape.d_model = config_.d_model;
  shape.n_heads = config_.n_heads;
  shape.n_kv_heads = config_.n_kv_heads;
  shape.head_dim = config_.head_dim;
  shape.vocab_size = config_.vocab_size;
  shape.context_length = config_.context_length;
  shape.rope_freq_base = config_.rope_freq_base;
  shape.name = config_.name;
  shape.fingerprint = fingerprint_;
  return shape;
}

void LlamaModel::rope(std::span<const int64_t> positions, at::Tensor* cos, at::Tensor* sin) const {
  // The table's formula at any position (compressors look past the context: future positions).
  const at::Tensor exponents =
      at::arange(0, config_.head_dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(config_.head_dim);
  const at::Tensor inv_freq = 1.0 / at::pow(config_.rope_freq_base, exponents);
  const at::Tensor p = at::tensor(std::vector<int64_t>(positions.begin(), positions.end()), at::kLong).to(at::kFloat);
  const at::Tensor angles = p.unsqueeze(1) * inv_freq.unsqueeze(0);
  *cos = angles.cos().contiguous();
  *sin = angles.sin().contiguous();
}

at::Tensor LlamaModel::weight_rows(const Weight& w, int64_t first, int64_t count) const {
  if (w.tensor.scalar_type() != at::kByte) return w.tensor.narrow(0, first, count).to(at::kCPU, at::kFloat).clone();
  at::Tensor out = at::empty({count, w.view.k}, at::kFloat);
  for (int64_t r = 0; r < count; ++r) kernels_->weight_row(w.view, first + r, out[r].data_ptr<float>());
  return out;
}

Result<at::Tensor> LlamaModel::weight(const std::string& gguf_name) const {
  auto rows = [&](const Weight& w, int64_t first, int64_t count) { return weight_rows(w, first, count); };
  const LlamaConfig& c = config_;
  const int64_t q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim;
  if (gguf_name == "token_embd.weight") return rows(token_embedding_, 0, c.vocab_size);
  if (gguf_name == "output.weight") return rows(output_, 0, c.vocab_size);
  if (gguf_name == "output_norm.weight") return output_norm_.cpu().clone();
  int64_t layer = -1;
  char part[64] = {}, kind[8] = {};
  if (std::sscanf(gguf_name.c_str(), "blk.%ld.%63[a-z_].%7[a-z]", &layer, part, kind) == 3 && layer >= 0 &&
      layer < c.n_layers && gguf_name == "blk." + std::to_string(layer) + "." + part + "." + kind &&
      std::string(kind) == "bias" && layers_[layer].bqkv.defined()) {
    const at::Tensor b = layers_[layer].bqkv.to(at::kCPU, at::kFloat);
    const std::string p = part;
    if (p == "attn_q") return b.narrow(0, 0, q).clone();
    if (p == "attn_k") return b.narrow(0, q, kv).clone();
    if (p == "attn_v") return b.narrow(0, q + kv, kv).clone();
  }
  if (std::string(kind) == "weight" && layer >= 0 && layer < c.n_layers &&
      gguf_name == "blk." + std::to_string(layer) + "." + part + ".weight") {
    const Layer& L = layers_[layer];
    const std::string p = part;
    if (p == "attn_norm") return L.attn_norm.cpu().clone();
    if (p == "ffn_norm") return L.ffn_norm.cpu().clone();
    if (p == "attn_q") return rows(L.wqkv, 0, q);
    if (p == "attn_k") return rows(L.wqkv, q, kv);
    if (p == "attn_v") return rows(L.wqkv, q + kv, kv);
    if (p == "attn_output") return rows(L.wo, 0, c.d_model);
    if (p == "ffn_gate") return rows(L.w_gate_up, 0, c.d_ff);
    if (p == "ffn_up") return rows(L.w_gate_up, c.d_ff, c.d_ff);
    if (p == "ffn_down") return rows(L.w_down, 0, c.d_model);
  }
  return Status::not_found(file_path_ + ": no weight named " + printable(gguf_name));
}

}  // namespace vericache
