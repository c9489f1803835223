// The compressor contract: what a KV-cache compressor plugin implements and what the runtime hands it.
//
// Families: token dropping (per (layer, KV head) kept positions, the same count for every head of
// a layer, counts free across layers) and quantization (a uniform bit_scheme, packed in pages).
// Modes: offline (compress() once after prefill; may run extra forwards through ModelAccess) and
// online (update() after each layer's forward returns drops to apply).
// Quantizers describe their packed page (packed_format()); the runtime moves committed slots into
// packed pages through pack() in blocks of PackedFormat::flush_slots, and attention reads them
// through unpack(). Slots past the last full block stay in float pages: the full-precision residual,
// which also holds the tokens being drafted, so a rejected draft never touches a packed page.
// The ratio c is always the kept fraction: KV_comp = c * KV_full.
//
// Rules every plugin follows (CompressorBase enforces the first):
//   - no exception leaves a plugin: failures are Status values naming the reason;
//   - tensors handed in are borrowed for the call; tensors handed out are owned by the caller;
//   - a compressor object is used by one thread at a time (the runtime serialises calls).
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <vericache/kv_view.h>
#include <vericache/packed_layout.h>
#include <vericache/status.h>

namespace vericache {

enum class CompressorFamily : uint32_t { kTokenDropping = 0, kQuantization = 1 };
enum class CompressionMode : uint32_t { kOffline = 0, kOnline = 1 };
// Whether an online compressor's update() is handed the rows of decode forwards (every prefill
// forward's rows it always sees; offline compressors see no decode rows whatever they declare). A
// compressor whose update() only reads the prompt (a quantizer: its packing is the runtime's, and a
// rotation calibrated on the prompt) declares kIgnored, and the runtime skips the per-layer calls of
// every decode forward: decoding on the full cache then costs what full-KV decoding does.
enum class DecodeRows : uint32_t { kObserved = 0, kIgnored = 1 };
// Bits of a scenario mask.
enum class Scenario : uint32_t { kLongContext = 1, kRemotePrefix = 2 };

const char* family_name(CompressorFamily family);  // "token-dropping", "quantization"
const char* mode_name(CompressionMode mode);        // "offline", "online"

// The result of compressing one request's cache (token dropping).
struct CompressedKV {
  // [n_layers] int64 [n_kv_heads, n_kept(layer)], each row strictly increasing positions in
  // [0, full length).
  std::vector<at::Tensor> kept;
};

// A quantizer's packed page: `page_size` slots of one layer (every KV head, keys and values) in
// `bytes_per_page` bytes, laid out as the compressor chooses (codes, scales, zero points, kept
// full-precision values). The runtime packs a layer's oldest committed float slots in blocks of
// `flush_slots` (a positive multiple of the page size) as soon as a whole block is committed.
// A page in a standard layout (vericache/packed_layout.h) is read in place by the runtime's fused
// dequantize-attention kernel; kOpaque pages are read through unpack().
struct PackedFormat {
  int bit_scheme = 0;          // bits per stored code, the same everywhere (2, 3, 4 or 8)
  int64_t bytes_per_page = 0;  // > 0
  int64_t flush_slots = 0;
  PackedLayout layout = PackedLayout::kOpaque;
  int64_t key_group = 0;    // kMinMaxGroups: tokens per key group (MinMaxGroupsLayout::key_group)
  int64_t value_group = 0;  // kMinMaxGroups: channels per value group
};

// Packed pages of one layer of one request, in slot order: for pack() the block being packed (it
// starts at a multiple of flush_slots of the layer's packed slots), for unpack() every packed page of
// the layer from its first slot on. `storage` is the packed pool, uint8 [num_packed_pages,
// bytes_per_page]; only the listed pages belong to this call.
struct PackedPages {
  at::Tensor storage;
  std::span<const int32_t> pages;
  at::Tensor positions;    // int64 [n_kv_heads, pages.size() * page_size] the slots' original positions
  int64_t request_id = 0;  // whose slots these are (as in LayerActivations::request_ids)
};

// What one layer's forward exposes, for every request in the batch (rows concatenated; request i
// owns rows [row_offsets[i], row_offsets[i + 1])). `hidden` is float32 everywhere; q, k, v are
// float32 on the CPU and in the model dtype on a GPU, on the model's device. Everything is a view of
// the forward's buffers, valid during the call only: copy what you keep.
struct LayerActivations {
  int64_t layer = 0;
  at::Tensor residual;   // [rows, d_model] the layer's input: the residual stream before that RMSNorm
  at::Tensor hidden;     // [rows, d_model] the attention input (after the pre-attention RMSNorm)
  at::Tensor q;          // [rows, n_heads, head_dim] after RoPE
  at::Tensor k;          // [rows, n_kv_heads, head_dim] after RoPE
  at::Tensor v;          // [rows, n_kv_heads, head_dim]
  at::Tensor positions;  // [rows] int64 RoPE positions
  std::span<const int64_t> row_offsets;  // [requests + 1]
  std::span<const int64_t> request_ids;  // [requests] the runtime's id of each request
  std::span<const double> ratios;        // [requests] the kept fraction c each request runs at
  // [requests] the request's cache length in this layer before this forward: rows of request i sit
  // at slots cache_lengths[i] .. after it (its positions continue from its uncompressed length).
  std::span<const int64_t> cache_lengths;
};

// Online drops for one request in one layer: positions each KV head stops keeping (the same count
// for every head). Positions must be kept once the forward is committed (this forward's own new
// tokens may be dropped). The runtime applies drops after the forward; it sets `layer` itself.
struct LayerDrops {
  int64_t request_id = 0;
  int64_t layer = 0;
  at::Tensor positions;  // int64 [n_kv_heads, n_dropped]
};

// What a compressor may know about the model (ModelAccess::shape(), Compressor::attach()).
struct ModelShape {
  int64_t n_layers = 0;
  int64_t d_model = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab_size = 0;
  int64_t context_length = 0;
  double rope_freq_base = 0;
  std::string name;         // the model's own name (GGUF general.name); may be empty
  std::string fingerprint;  // 16 hex digits identifying these exact weights (for files made for one model)
};

// The model, as an offline compressor may use it. Implemented by the runtime.
class ModelAccess {
 public:
  virtual ~ModelAccess() = default;
  virtual const ModelShape& shape() const = 0;
  // A weight as a float32 CPU tensor in PyTorch order, by GGUF name ("blk.3.attn_q.weight");
  // NotFound names a missing weight. Q/K rows are in the order where RoPE rotates adjacent pairs
  // (llama GGUF order; models stored otherwise are permuted into it at load). Models with attention
  // biases (qwen2) also have "blk.N.attn_q.bias", "attn_k.bias", "attn_v.bias"; others NotFound.
  virtual Result<at::Tensor> weight(const std::string& gguf_name) const = 0;
  // cos and sin [positions, head_dim / 2] float32 CPU of the model's RoPE at `positions` (any
  // non-negative position, also past the context: the forward's own table values where they overlap).
  virtual void rope(std::span<const int64_t> positions, at::Tensor* cos, at::Tensor* sin) const = 0;
  // Runs `tokens` at `positions` (below the context length, after the cache) through the model
  // after the request's full cache, reports every layer's activations to `observe` (ratios empty),
  // then rolls the cache back: no KV of these tokens is kept. The new slots are written past the
  // cache's length (possibly into its last page, never over a cached slot). Errors: OutOfPages
  // when the pool has no room, whatever `observe` returns or throws. Not re-entrant.
  virtual Status run_without_keeping(std::span<const int32_t> tokens, std::span<const int32_t> positions,
                                     const std::function<Status(const LayerActivations&)>& observe) = 0;
  // The request's prompt tokens (the full cache holds their K/V).
  virtual std::span<const int32_t> prompt() const = 0;
  // Tokens of `text`; special tokens written as text ("<|im_end|>") are recognised.
  virtual std::vector<int32_t> tokenize(const std::string& text) const = 0;
  // The chat template's text from the end of a user message to the start of the assistant's reply
  // (ChatML: "<|im_end|>\n<|im_start|>assistant\n"); "\n" when the model has no usable template.
  virtual std::string assistant_header() const = 0;
  // The runtime's id of this request (as in LayerActivations::request_ids).
  virtual int64_t request_id() const = 0;
};

// What one request may hold at most, declared before its prefill so that admission can reserve
// it (DraftVerifyEngine admits requests by these bounds, so no page allocation fails later).
struct RequestFootprint {
  // KV_comp's slots right after compression, summed over layers (every KV head of a layer keeps
  // the same count). The runtime checks the kept set against it: a plugin that keeps more is
  // refused for that request (it decodes on its full cache).
  int64_t max_kept_slots = 0;
  // The plugin's own memory for the request while it runs (statistics, scores, buffers), in bytes.
  int64_t state_bytes = 0;
};

// The interface the runtime calls. Plugins derive from CompressorBase, not from this.
class Compressor {
 public:
  virtual ~Compressor() = default;
  virtual const std::string& name() const = 0;
  virtual CompressorFamily family() const = 0;
  virtual CompressionMode mode() const = 0;
  virtual uint32_t scenarios() const = 0;  // Scenario bits
  virtual DecodeRows decode_rows() const = 0;

  // Called once, before any other call, with the model the compressor will serve: the place to
  // check that parameters or files fit it (NotFound / InvalidArgument / Corruption with the reason).
  virtual Status attach(const ModelShape& model) noexcept = 0;
  // After each layer's forward of a batch holding this compressor's requests: every prefill
  // forward, and for online compressors every decode forward too unless decode_rows() is kIgnored.
  // Offline compressors record what compress() will need; online ones append drops, which the
  // runtime applies after the forward.
  virtual Status update(const LayerActivations& activations, std::vector<LayerDrops>* drops) noexcept = 0;
  // Offline: the kept set for one request's full cache at kept fraction `ratio` in (0, 1]. `out`
  // arrives empty; `kept` tensors may be on any device. The view and `model` are valid for this
  // call only.
  virtual Status compress(const KvCacheView& full_kv, double ratio, ModelAccess& model, CompressedKV* out) noexcept = 0;
  // Offline token droppers that rank tokens by a score (TokenScorer plugins): the scores compress()
  // ranks by, for every position of the request's full cache, before protected tokens and budgets:
  // [n_layers] float32 [n_kv_heads, n], higher kept first. Same inputs and per-request state as
  // compress() (update() has seen the prefill); call release() after. Lets a tool use a compressor
  // as a teacher (`vericache train-kvzap` distils the kvzip plugin's KVzip+ scores). `scores`
  // arrives empty; NotSupported for compressors that do not score tokens.
  virtual Status score_tokens(const KvCacheView& full_kv, ModelAccess& model, std::vector<at::Tensor>* scores) noexcept = 0;
  // Quantization family (the others return NotSupported): the packed page for `layout` (its
  // page_size is the runtime's). Called once after attach(); InvalidArgument when the layout does
  // not fit the parameters (a group that does not divide head_dim or the page).
  virtual Result<PackedFormat> packed_format(const KvLayout& layout) noexcept = 0;
  // Packs slots of `layer` into `dest.pages`: `k` float32 [pages, n_kv_heads, head_dim, page_size]
  // (keys after RoPE at dest.positions) and `v` float32 [pages, n_kv_heads, page_size, head_dim],
  // the float pages' own layout (CPU, contiguous). Pure in the slots' values and positions: the same
  // slots always pack to the same bytes.
  virtual Status pack(int64_t layer, const at::Tensor& k, const at::Tensor& v, PackedPages& dest) noexcept = 0;
  // What attention reads for packed slots: fills `k` and `v` (shapes as in pack(), preallocated)
  // with the dequantized keys (after RoPE at src.positions) and values.
  virtual Status unpack(int64_t layer, const PackedPages& src, at::Tensor& k, at::Tensor& v) noexcept = 0;
  // Forgets per-request state: after an offline compress(), and when the request finishes. Request
  // ids are reused across runs; releasing an id the compressor never saw is a no-op.
  virtual void release(int64_t request_id) noexcept = 0;
  // The most a request of an n-token prompt holds at kept fraction `ratio` on a model of
  // `n_layers` layers (after attach()). Token droppers promise their budget; a compressor that
  // cannot bound its kept set declares every slot (n * n_layers, the default).
  virtual Result<RequestFootprint> footprint(int64_t n, double ratio, int64_t n_layers) noexcept = 0;
};

// Base class for plugins: implement the *_impl hooks; every call is wrapped so that an exception
// becomes a Status naming the compressor (the wrapping is compiled into the plugin).
class CompressorBase : public Compressor {
 public:
  CompressorBase(std::string name, CompressorFamily family, CompressionMode mode, uint32_t scenarios,
                 DecodeRows decode_rows = DecodeRows::kObserved)
      : name_(std::move(name)), family_(family), mode_(mode), scenarios_(scenarios), decode_rows_(decode_rows) {}

  const std::string& name() const final { return name_; }
  CompressorFamily family() const final { return family_; }
  CompressionMode mode() const final { return mode_; }
  uint32_t scenarios() const final { return scenarios_; }
  DecodeRows decode_rows() const final { return decode_rows_; }

  Status attach(const ModelShape& model) noexcept final {
    return guard([&] { return attach_impl(model); });
  }
  Status update(const LayerActivations& activations, std::vector<LayerDrops>* drops) noexcept final {
    return guard([&] { return update_impl(activations, drops); });
  }
  Status compress(const KvCacheView& full_kv, double ratio, ModelAccess& model, CompressedKV* out) noexcept final {
    return guard([&] { return compress_impl(full_kv, ratio, model, out); });
  }
  Status score_tokens(const KvCacheView& full_kv, ModelAccess& model, std::vector<at::Tensor>* scores) noexcept final {
    return guard([&] { return score_tokens_impl(full_kv, model, scores); });
  }
  Result<PackedFormat> packed_format(const KvLayout& layout) noexcept final {
    Result<PackedFormat> out = Status::not_supported(name_ + ": not a quantizer (no packed pages)");
    const Status s = guard([&] {
      out = packed_format_impl(layout);
      return out.status();
    });
    if (!s.ok()) return s;
    return out;
  }
  Status pack(int64_t layer, const at::Tensor& k, const at::Tensor& v, PackedPages& dest) noexcept final {
    return guard([&] { return pack_impl(layer, k, v, dest); });
  }
  Status unpack(int64_t layer, const PackedPages& src, at::Tensor& k, at::Tensor& v) noexcept final {
    return guard([&] { return unpack_impl(layer, src, k, v); });
  }
  void release(int64_t request_id) noexcept final {
    try {
      release_impl(request_id);
    } catch (...) {
    }
  }
  Result<RequestFootprint> footprint(int64_t n, double ratio, int64_t n_layers) noexcept final {
    RequestFootprint out;
    const Status s = guard([&] { return footprint_impl(n, ratio, n_layers, &out); });
    if (!s.ok()) return s;
    return out;
  }

 protected:
  // Defaults: accept any model, observe nothing, compress nothing, score nothing, no packed pages
  // (NotSupported).
  virtual Status attach_impl(const ModelShape&) { return Status(); }
  virtual Status update_impl(const LayerActivations&, std::vector<LayerDrops>*) { return Status(); }
  virtual Status compress_impl(const KvCacheView&, double, ModelAccess&, CompressedKV*) {
    return Status::not_supported(name_ + ": this compressor has no offline compress()");
  }
  virtual Status score_tokens_impl(const KvCacheView&, ModelAccess&, std::vector<at::Tensor>*) {
    return Status::not_supported(name_ + ": does not score tokens (no score_tokens())");
  }
  virtual Result<PackedFormat> packed_format_impl(const KvLayout&) {
    return Status::not_supported(name_ + ": not a quantizer (no packed pages)");
  }
  virtual Status pack_impl(int64_t, const at::Tensor&, const at::Tensor&, PackedPages&) {
    return Status::not_supported(name_ + ": not a quantizer (no packed pages)");
  }
  virtual Status unpack_impl(int64_t, const PackedPages&, at::Tensor&, at::Tensor&) {
    return Status::not_supported(name_ + ": not a quantizer (no packed pages)");
  }
  virtual void release_impl(int64_t) {}
  // Default: every slot kept, no state of its own.
  virtual Status footprint_impl(int64_t n, double /*ratio*/, int64_t n_layers, RequestFootprint* out) {
    out->max_kept_slots = n * n_layers;
    out->state_bytes = 0;
    return Status();
  }

 private:
  // Every failure names the compressor: "snapkv: the prompt ...".
  template <typename F>
  Status guard(F&& f) noexcept {
    try {
      Status s = f();
      if (s.ok() || s.message().rfind(name_ + ": ", 0) == 0) return s;
      return s.with_context(name_);
    } catch (const std::exception& e) {
      const std::string what = e.what();  // libtorch errors append lines of context: keep the first
      return Status::plugin_error(name_ + ": " + what.substr(0, what.find('\n')));
    } catch (...) {
      return Status::plugin_error(name_ + ": unknown exception");
    }
  }

  std::string name_;
  CompressorFamily family_;
  CompressionMode mode_;
  uint32_t scenarios_;
  DecodeRows decode_rows_;
};

}  // namespace vericache
