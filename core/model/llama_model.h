// LlamaModel: a Llama-family transformer loaded from a GGUF file, with its tokenizer and chat
// template, running batched forwards over paged KV caches.
//
// Architecture: token embedding -> n_layers x [RMSNorm -> Q/K/V projections -> RoPE (adjacent
// channel pairs, as GGUF stores Llama's Q/K weights) -> grouped-query causal attention over the
// paged cache -> output projection -> residual; RMSNorm -> SwiGLU MLP -> residual] -> RMSNorm ->
// output projection (the token embedding when the file has no `output.weight`: tied embeddings).
//
// One forward takes a batch of requests, each with any number of new tokens (a prompt chunk, one
// decode token, or a verify window of x+1 tokens), appends their K/V to the request's cache and
// returns logits for the rows asked for. Two forward paths:
//   kCpuKernels  float32 on the CPU with VeriCache's kernels, every one row-count invariant
//                (kernels/cpu_kernels.h): the logits of a token do not depend on how many tokens of
//                its request the forward computes, nor on the other requests in the batch, nor on
//                the thread count. The default on the CPU.
//   kTorch       libtorch operations on any device and dtype (bf16 on a GPU): cuBLAS GEMMs and
//                attention over K/V gathered from the pages. Not row-count invariant (GEMM
//                kernels change with the row count); the default on a GPU.
//
// Ownership: the model owns its weights, tokenizer and chat template; forward() borrows caches
// and the pool. Thread-safety: const methods may run concurrently; forward() calls sharing a pool
// or a cache must be serialised by the caller.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <vericache/compressor.h>
#include <vericache/status.h>

#include "kernels/cpu_kernels.h"
#include "kernels/int8_linear.h"
#include "kv/page_pool.h"
#include "kv/sequence_kv.h"
#include "model/chat_template.h"
#include "model/llama_config.h"
#include "model/tokenizer.h"

namespace vericache {

enum class LogitRows {
  kNone,  // no logits for this request (e.g. a prompt chunk that is not the last)
  kLast,  // the last new token's row
  kAll,   // every new token's row (verify windows, tests)
};

enum class ForwardPath { kCpuKernels, kTorch };

// The CPU kernels' arithmetic for quantized weight matrices (DESIGN.md, "Arithmetic modes").
//   kFloat32  weights dequantized to float32 in registers, float32 products: matches transformers
//             bit for bit (the reference mode).
//   kInteger  activations quantized per row to 8-bit blocks, integer dot products with the weights'
//             own codes, one fixed float order (kernels/int8_linear.h): faster, not equal to
//             float32, but row-count and batch invariant and bitwise equal across instruction sets.
//             float32 matrices (and float32 models) keep the float32 arithmetic.
// Both are row-count invariant, so VeriCache is lossless in either, provided a run and its full-KV
// reference use the same mode.
enum class Compute { kFloat32, kInteger };
const char* compute_name(Compute compute);  // "float32" or "integer"

struct LoadOptions {
  at::Device device = at::kCPU;
  at::ScalarType dtype = at::kFloat;  // weights and KV; the CPU kernels need float32
  // CPU kernels: keep Q8_0 / Q4_0 / Q4_1 / Q5_0 matrices in their ggml blocks (Q4_K / Q6_K repacked
  // with float32 scales, model/weight_repack.h) and dequantize them on the fly into the very floats a load-time dequantization gives (same logits,
  // a fraction of the bytes per decode step). Q, K and V rows are stacked into one matrix, kept in
  // blocks only when the three share a type. false: dequantize every matrix to float32 at load.
  // Other types are always dequantized at load; other devices always get dequantized weights.
  bool quantized_weights = true;
  // The CPU kernels' arithmetic (see Compute); kInteger needs quantized_weights on the CPU and
  // repacks the quantized matrices once at load into the integer kernels' panels.
  Compute compute = Compute::kFloat32;
};

// One request's part of a forward. Each item names its own cache and the pool holding that
// cache's pages, so one batched forward mixes requests drafting on compressed caches (resident
// pages), verifying on full caches (a host store read in place, or transient pages) and
// prefilling (CPU kernels; the torch path needs every item's cache in one pool).
struct ForwardItem {
  std::span<const int32_t> tokens;     // [n] new tokens
  std::span<const int32_t> positions;  // [n] RoPE positions: the tokens' positions in the uncompressed sequence
  SequenceKv* kv = nullptr;            // receives n slots in every layer
  PagePool* pool = nullptr;            // holds kv's pages (on the model's device and dtype)
  LogitRows logits = LogitRows::kLast;
  int64_t request_id = 0;              // reported to compressors in LayerActivations
  // A quantized cache (kv has packed slots, CPU kernels only): the pool holding its packed pages
  // and the compressor that packed them, whose unpack() gives attention their K/V each layer.
  const PackedPagePool* packed_pool = nullptr;
  Compressor* unpacker = nullptr;
  // Where this item's first unpack() failure goes instead of failing the whole forward (nullptr:
  // it fails the forward). After a failure the item's packed slots read as zeros: its rows and the
  // K/V it wrote are garbage the caller must discard (the engine falls back to full KV).
  Status* unpack_failure = nullptr;
  // The packed pages' format (checked_packed_format). With a standard layout and at most
  // kMaxFusedRows new tokens, attention reads the packed pages in place (the fused kernel, the same
  // bits as unpack()); null or kOpaque: through unpack() (a copy set to kOpaque compares the two).
  const PackedFormat* packed_format = nullptr;
};

// New tokens per item up to which a standard-layout packed cache is read in place: the fused
// kernel dequantizes every value once per row, so many rows amortise one unpack() better.
constexpr int64_t kMaxFusedRows = 16;

// Where a CPU forward's time went (LlamaModel::forward), summed over layers.
struct ForwardTimes {
  double attention_seconds = 0;  // unpacking packed pages + the attention kernels
  double linear_seconds = 0;     // the layers' weight matrices (integer mode: quantizing rows too)
  double logits_seconds = 0;     // the output head (final norm and the vocabulary matrix)
};

// Called after each layer's attention with that layer's activations for the whole batch
// (vericache/compressor.h); a non-OK Status aborts the forward (caches keep their lengths).
using LayerObserver = std::function<Status(const LayerActivations&)>;

class LlamaModel {
 public:
  // Opens, validates and dequantizes the GGUF file at `path`, then places the weights on
  // options.device in options.dtype. Errors name the file and the problem (see GgufFile,
  // LlamaConfig, Tokenizer); NotSupported for a dtype the chosen path cannot run. CPU kernels run
  // on ThreadPool::global().
  static Result<std::unique_ptr<LlamaModel>> load(const std::string& path, const LoadOptions& options = {});

  // A model of a named shape (model/model_shapes.h) whose weights are random, for timing only: its
  // tokens mean nothing. Matrices are N(0, 1/k) for k inputs (so activations keep their scale),
  // norms are ones; drawn on options.device in options.dtype from that device's default generator
  // reseeded with `seed` (same seed, device and dtype: same weights). It has no tokenizer
  // (tokenizer().vocab_size() is 0) and no chat template; path() is "random-weights:<shape>" and
  // weight_type() "random". NotFound for an unknown shape (the message lists the known ones);
  // NotSupported as for load() and for a CPU model whose float32 weights would take more than 80%
  // of the machine's memory; Internal when the device cannot hold the weights.
  static Result<std::unique_ptr<LlamaModel>> with_random_weights(const std::string& shape, uint64_t seed,
                                                                 const LoadOptions& options = {});
  bool random_weights() const { return weight_type_ == kRandomWeightType; }
  static constexpr const char* kRandomWeightType = "random";

  const std::string& path() const { return file_path_; }
  const LlamaConfig& config() const { return config_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }
  bool tied_embeddings() const { return tied_embeddings_; }
  // The file's quantization, e.g. "Q4_1" (most common type among the 2-D weights).
  const std::string& weight_type() const { return weight_type_; }
  // Bytes of the weight matrices one decode step reads in full, as the current compute mode reads
  // them (ggml blocks, integer panels, or floats of the model dtype): every layer's and the output
  // matrix (an untied token embedding is read by row).
  int64_t decode_weight_bytes() const { return decode_weight_bytes_; }
  // The recognised chat template, or the reason there is none.
  Result<ChatTemplate> chat_template() const;

  KvPageSpec kv_page_spec(int64_t page_size) const;
  // A pool for this model's KV, on the model's device in kv_dtype().
  Result<PagePool> make_page_pool(int64_t page_size, int64_t num_pages) const;
  at::Device device() const { return options_.device; }
  at::ScalarType dtype() const { return options_.dtype; }
  // The element type of the KV pages forwards read and write: the model dtype unless set_kv_dtype
  // chose otherwise. Every pool handed to forward() must have it.
  at::ScalarType kv_dtype() const { return kv_dtype_; }
  // Bytes of one token's K and V in one layer, in kv_dtype() (a page holds page_size of them).
  int64_t kv_bytes_per_slot() const;
  // The CPU kernels keep K/V in float32 pages or in bfloat16 pages (half the bytes: K and V are
  // rounded to nearest even as they are written, and attention over them computes in bfloat16
  // products, kernels/cpu_kernels.h; the forward stays row-count invariant and bitwise equal across
  // kernel builds). Other paths keep
  // the model dtype. InvalidArgument for another choice. Pools made before keep their dtype (and
  // forward() refuses them); not while a forward runs.
  Status set_kv_dtype(at::ScalarType dtype);

  // Runs one forward over `batch`. `logits` receives [rows, vocab] float32, the rows of the items
  // in batch order (per item: none, its last token, or all its tokens).
  // InvalidArgument (nothing changed) for a token id outside the vocabulary, a position past the
  // context length, mismatched token/position counts, a missing cache or pool, or a pool of another
  // model, device or dtype; OutOfPages (nothing changed) when a pool cannot hold the new slots of
  // the items it serves.
  // `times` (CPU kernels; may be null) receives where the time went.
  Status forward(std::span<const ForwardItem> batch, at::Tensor* logits, const LayerObserver& observer = {},
                 ForwardTimes* times = nullptr) const;

  // A weight by GGUF name ("blk.3.attn_q.weight", "token_embd.weight", "output_norm.weight", ...)
  // as a float32 CPU tensor in PyTorch order; Q/K rows in adjacent-pair RoPE order (qwen2 files are
  // permuted at load, see LlamaConfig::rope_pairs_halves). "blk.N.attn_{q,k,v}.bias" exist for
  // models with attention biases (qwen2). NotFound for an unknown name.
  Result<at::Tensor> weight(const std::string& gguf_name) const;
  // cos and sin [positions, head_dim / 2] of the model's RoPE (float32, CPU), at any position.
  void rope(std::span<const int64_t> positions, at::Tensor* cos, at::Tensor* sin) const;
  ModelShape shape() const;

  // The CPU kernels in use ("avx512" or "portable"); tests switch them to compare the two builds.
  const cpu::KernelTable& kernels() const { return *kernels_; }
  void set_kernels(const cpu::KernelTable& kernels) { kernels_ = &kernels; }
  // The integer kernels in use ("avx512-vnni" or "portable"); tests switch them as set_kernels.
  const cpu::IntKernelTable& int_kernels() const { return *int_kernels_; }
  void set_int_kernels(const cpu::IntKernelTable& kernels) { int_kernels_ = &kernels; }
  Compute compute() const { return compute_; }
  // Switches the arithmetic of later forwards; kInteger repacks the quantized matrices the first
  // time (memory: about their size again). Not while a forward runs. InvalidArgument for kInteger
  // on the torch path or on a model with no quantized matrix.
  Status set_compute(Compute compute);
  ForwardPath forward_path() const { return path_; }
  // kCpuKernels needs a float32 CPU model; kTorch needs float weights (on the CPU: loaded with
  // quantized_weights = false) and K/V in the model dtype. InvalidArgument otherwise.
  Status set_forward_path(ForwardPath path);

 private:
  // A weight matrix [n, k]: `tensor` is float [n, k] in the model dtype, or (CPU kernels with
  // quantized weights) uint8 [n, row_bytes] ggml blocks; `view` is what the CPU kernels read.
  // `int_tensor` / `int_view`: the integer kernels' panels of a quantized matrix, once
  // set_compute(kInteger) has built them. `parts`: a stack whose parts differ in type (Q4_K Q and
  // K rows with Q6_K V rows, as Q4_K_M files have) is held in float32 for the float path, and each
  // part also in its own blocks, so that integer mode reads every part in its own panels.
  // `int_panels`: what integer mode reads for the whole matrix, in row order (its own view, or its
  // parts' views with their first panel and first output column); empty when some row has none.
  struct IntPanels {
    cpu::IntWeightView view;
    int64_t first_panel = 0;  // of the whole matrix's panel list
    int64_t column0 = 0;      // the output column of the view's first row
  };
  struct Weight {
    at::Tensor tensor;
    cpu::WeightView view;
    at::Tensor int_tensor;
    std::optional<cpu::IntWeightView> int_view;
    std::vector<Weight> parts;
    std::vector<IntPanels> int_panels;
  };
  struct Layer {
    at::Tensor attn_norm;  // [d_model] float32
    Weight wqkv;           // [(n_heads + 2 n_kv_heads) head_dim, d_model]: Q, K, V rows stacked
    at::Tensor bqkv;       // [(n_heads + 2 n_kv_heads) head_dim] float32 Q, K, V biases; undefined without
    Weight wo;             // [d_model, n_heads head_dim]
    at::Tensor ffn_norm;   // [d_model] float32
    Weight w_gate_up;      // [2 d_ff, d_model]: gate rows, then up rows
    Weight w_down;         // [d_model, d_ff]
  };

  // The load paths' common start: the file (or the random weights' name), the options, and what
  // follows from them (the forward path; K/V pages in the model dtype).
  LlamaModel(std::string file_path, const LoadOptions& options);
  Status load_weights(const GgufFile& file);
  Status draw_random_weights(uint64_t seed);
  // What load() and with_random_weights() share once the weights are in place.
  Status finish_loading();
  Result<Weight> load_matrix(const GgufFile& file, const std::vector<std::string>& names,
                             const std::vector<int64_t>& rows, int64_t k) const;
  void build_rope_table();
  std::string compute_fingerprint() const;
  // Rows [first, first + count) of a stored matrix, as float32 on the CPU.
  at::Tensor weight_rows(const Weight& w, int64_t first, int64_t count) const;
  Status place_weights();
  Status validate(std::span<const ForwardItem> batch) const;
  Status validate_pool(const PagePool& pool) const;
  // After validate() and reserving every item's slots; `begin[i]` is item i's first row.
  Status forward_cpu(std::span<const ForwardItem> batch, const std::vector<int64_t>& begin, at::Tensor* logits,
                     const LayerObserver& observer, ForwardTimes* times) const;
  Status forward_torch(std::span<const ForwardItem> batch, const std::vector<int64_t>& begin, PagePool& pool,
                       at::Tensor* logits, const LayerObserver& observer) const;
  // Rows whose logits the batch asks for, in batch order.
  static std::vector<int64_t> logit_rows(std::span<const ForwardItem> batch, const std::vector<int64_t>& begin);

  std::string file_path_;
  LoadOptions options_;
  ForwardPath path_ = ForwardPath::kCpuKernels;
  LlamaConfig config_;
  Tokenizer tokenizer_;
  std::optional<ChatTemplate> chat_template_;
  Status chat_template_status_;
  bool tied_embeddings_ = true;
  std::string weight_type_;
  int64_t decode_weight_bytes_ = 0;
  std::string fingerprint_;  // ModelShape::fingerprint, computed once at load
  Weight token_embedding_;      // [vocab, d_model]
  at::Tensor output_norm_;      // [d_model] float32
  Weight output_;               // [vocab, d_model]; the token embedding when tied
  std::vector<Layer> layers_;
  at::Tensor rope_cos_;         // [context_length, head_dim / 2] float32, on the model's device
  at::Tensor rope_sin_;
  const cpu::KernelTable* kernels_ = nullptr;
  const cpu::IntKernelTable* int_kernels_ = nullptr;
  Compute compute_ = Compute::kFloat32;
  at::ScalarType kv_dtype_ = at::kFloat;
  // y = x w^T for `rows` rows of x (row stride ldx) in the current compute mode, over the thread pool.
  void parallel_linear(const float* x, int64_t ldx, int64_t rows, const Weight& w, float* y, int64_t ldy) const;
  // The bytes a decode step reads of a matrix in the current compute mode.
  int64_t matrix_bytes(const Weight& w) const;
  static void reorder_rows(Weight& w, const at::Tensor& order);
};

}  // namespace vericache
