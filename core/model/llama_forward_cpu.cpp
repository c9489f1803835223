// The CPU forward on VeriCache's row-count-invariant kernels (kernels/cpu_kernels.h).
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include "kv/packed_page_pool.h"
#include "model/cpu_attention.h"
#include "model/llama_model.h"
#include "util/check.h"
#include "util/half.h"
#include "util/thread_pool.h"

namespace vericache {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Columns are handed to threads in groups of this many, so column tiles stay whole.
constexpr int64_t kColumnGroup = 8;

// Activation rows quantized for the integer kernels; reused across calls on the calling thread.
struct QuantizedBuffers {
  std::vector<int8_t> codes;
  std::vector<float> scales;
  std::vector<int32_t> half_sums;
};

// Work items of a linear layer (panels or column groups) per chunk a thread takes: about 8 chunks
// per thread. With one item per chunk every thread took every other panel through one shared
// counter, and decode ran 15-60% slower (Qwen2.5-Coder 1.5B and SmolLM2, both compute modes, AMD
// EPYC, 2 threads).
int64_t linear_grain(int64_t items) {
  constexpr int64_t kChunksPerThread = 8;
  return std::max<int64_t>(1, items / (ThreadPool::global().threads() * kChunksPerThread));
}

void parallel_rms_norm(const cpu::KernelTable& k, const float* x, int64_t rows, int64_t d, const at::Tensor& w,
                       float eps, float* y) {
  const float* wp = w.data_ptr<float>();
  ThreadPool::global().parallel_for(rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) k.rms_norm(x + r * d, d, wp, eps, y + r * d);
  });
}

}  // namespace

void LlamaModel::parallel_linear(const float* x, int64_t ldx, int64_t rows, const Weight& w, float* y,
                                 int64_t ldy) const {
  if (compute_ == Compute::kInteger && !w.int_panels.empty()) {
    const cpu::IntKernelTable& ik = *int_kernels_;
    const int64_t k = w.int_panels[0].view.k;
    const int64_t panels = w.int_panels.back().first_panel + w.int_panels.back().view.panels();
    thread_local QuantizedBuffers buffers;
    QuantizedBuffers& q = buffers;  // the calling thread's: workers must not name the thread_local
    q.codes.resize(rows * k);
    q.scales.resize(rows * k / cpu::kQuantBlock);
    q.half_sums.resize(rows * k / (cpu::kQuantBlock / 2));
    ThreadPool::global().parallel_for(rows, 16, [&](int64_t r0, int64_t r1) {
      ik.quantize_rows(x + r0 * ldx, ldx, r1 - r0, k, q.codes.data() + r0 * k,
                       q.scales.data() + r0 * (k / cpu::kQuantBlock),
                       q.half_sums.data() + r0 * (k / (cpu::kQuantBlock / 2)));
    });
    const cpu::QuantizedRows xq{q.codes.data(), q.scales.data(), q.half_sums.data(), rows, k};
    ThreadPool::global().parallel_for(panels, linear_grain(panels), [&](int64_t p0, int64_t p1) {
      for (const IntPanels& part : w.int_panels) {  // one view, or the parts of a mixed stack
        const int64_t a = std::max(p0, part.first_panel), b = std::min(p1, part.first_panel + part.view.panels());
        if (a < b) ik.linear(xq, part.view, a - part.first_panel, b - part.first_panel, y + part.column0, ldy);
      }
    });
    return;
  }
  const cpu::KernelTable& k = *kernels_;
  const int64_t n = w.view.n;
  const int64_t groups = (n + kColumnGroup - 1) / kColumnGroup;
  ThreadPool::global().parallel_for(groups, linear_grain(groups), [&](int64_t g0, int64_t g1) {
    k.linear(x, ldx, rows, w.view, g0 * kColumnGroup, std::min(n, g1 * kColumnGroup), y, ldy);
  });
}

Status LlamaModel::forward_cpu(std::span<const ForwardItem> batch, const std::vector<int64_t>& begin,
                               at::Tensor* logits, const LayerObserver& observer, ForwardTimes* times) const {
  const LlamaConfig& c = config_;
  const cpu::KernelTable& k = *kernels_;
  const int64_t d = c.d_model, hd = c.head_dim, nh = c.n_heads, nkv = c.n_kv_heads, dff = c.d_ff;
  const int64_t q_width = nh * hd, qkv_width = (nh + 2 * nkv) * hd;
  const float eps = static_cast<float>(c.rms_norm_eps);

  const int64_t rows = begin.back();  // token rows of all requests, concatenated

  std::vector<float> x(rows * d), h(rows * d), qkv(rows * qkv_width), attn(rows * q_width);
  std::vector<float> gate_up(rows * 2 * dff), act(rows * dff), proj(rows * d);
  std::vector<int32_t> positions(rows);
  for (size_t i = 0; i < batch.size(); ++i) {
    for (size_t t = 0; t < batch[i].tokens.size(); ++t) {
      const int64_t r = begin[i] + static_cast<int64_t>(t);
      k.weight_row(token_embedding_.view, batch[i].tokens[t], x.data() + r * d);
      positions[r] = batch[i].positions[t];
    }
  }

  // Attention work: (request, KV head, tile of new rows). Tiles spread an item's rows over threads
  // (a verify window's 17 rows are 4 jobs per KV head, not a 16-row and a 1-row one); each is the
  // kernel's own tile, so no job re-reads keys another could share, and no result changes.
  struct AttentionWork {
    int64_t item, kv_head, row0, row1;
  };
  const int64_t row_tile = cpu::attention_rows_per_tile(nh, nkv);
  std::vector<AttentionWork> work;
  for (size_t i = 0; i < batch.size(); ++i) {
    const int64_t n = begin[i + 1] - begin[i];
    for (int64_t g = 0; g < nkv; ++g)
      for (int64_t r = 0; r < n; r += row_tile) work.push_back({static_cast<int64_t>(i), g, r, std::min(n, r + row_tile)});
  }
  std::vector<AttentionJob> jobs(work.size());  // refilled per layer

  // What a layer observer sees: views of this forward's buffers, valid during the call.
  std::vector<int64_t> request_ids(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) request_ids[i] = batch[i].request_id;
  LayerActivations acts;
  if (observer) {
    at::Tensor positions_i64 = at::empty({rows}, at::kLong);
    std::copy(positions.begin(), positions.end(), positions_i64.data_ptr<int64_t>());
    const auto f32 = at::TensorOptions().dtype(at::kFloat);
    acts.residual = at::from_blob(x.data(), {rows, d}, f32);  // updated only after the observer returns
    acts.hidden = at::from_blob(h.data(), {rows, d}, f32);
    acts.q = at::from_blob(qkv.data(), {rows, nh, hd}, {qkv_width, hd, 1}, f32);
    acts.k = at::from_blob(qkv.data() + q_width, {rows, nkv, hd}, {qkv_width, hd, 1}, f32);
    acts.v = at::from_blob(qkv.data() + q_width + nkv * hd, {rows, nkv, hd}, {qkv_width, hd, 1}, f32);
    acts.positions = positions_i64;
    acts.row_offsets = begin;
    acts.request_ids = request_ids;
  }

  const float* cos_table = rope_cos_.data_ptr<float>();
  const float* sin_table = rope_sin_.data_ptr<float>();
  // Each item's cache lives in its own pool (compressed, full host store, transient pages).
  std::vector<void*> k_pages(batch.size()), v_pages(batch.size());
  std::vector<cpu::KvElement> kv_element(batch.size());
  std::vector<int64_t> page_size(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    k_pages[i] = batch[i].pool->k_pages().data_ptr();
    v_pages[i] = batch[i].pool->v_pages().data_ptr();
    kv_element[i] = batch[i].pool->k_pages().scalar_type() == at::kBFloat16 ? cpu::KvElement::kBFloat16
                                                                           : cpu::KvElement::kFloat32;
    page_size[i] = batch[i].pool->spec().page_size;
  }

  // Quantized caches: a standard layout read by few rows is read in place by the fused kernel;
  // otherwise each layer's packed slots are unpacked into float pages that attention reads ahead of
  // the cache's float pages (PagedAttentionArgs::prefix_*), one layer at a time.
  std::vector<std::optional<MinMaxGroupsLayout>> in_place(batch.size());
  std::vector<at::Tensor> prefix_k(batch.size()), prefix_v(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    const PackedFormat* f = batch[i].packed_format;
    if (f != nullptr && f->layout == PackedLayout::kMinMaxGroups && batch[i].packed_pool != nullptr &&
        begin[i + 1] - begin[i] <= kMaxFusedRows) {
      in_place[i] = MinMaxGroupsLayout{page_size[i], nkv, hd, f->key_group, f->value_group, f->bit_scheme};
      VC_CHECK(in_place[i]->bytes() == batch[i].packed_pool->bytes_per_page(), "a packed pool of another format");
      continue;
    }
    int64_t most = 0;
    for (int64_t l = 0; l < c.n_layers; ++l) most = std::max(most, batch[i].kv->packed_length(l));
    if (most == 0) continue;
    const int64_t pages = most / page_size[i];
    prefix_k[i] = at::empty({pages, nkv, hd, page_size[i]}, at::kFloat);
    prefix_v[i] = at::empty({pages, nkv, page_size[i], hd}, at::kFloat);
  }

  double attention_seconds = 0, linear_seconds = 0;
  auto timed_linear = [&](const float* in, int64_t ldx, const Weight& w, float* out, int64_t ldy) {
    const auto start = std::chrono::steady_clock::now();
    parallel_linear(in, ldx, rows, w, out, ldy);
    linear_seconds += seconds_since(start);
  };
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const Layer& L = layers_[l];
    auto attention_start = std::chrono::steady_clock::now();
    for (size_t i = 0; i < batch.size(); ++i) {
      const SequenceKv& kv = *batch[i].kv;
      if (kv.packed_length(l) == 0 || in_place[i]) continue;
      const int64_t pages = kv.packed_length(l) / page_size[i];
      const PackedPages src{batch[i].packed_pool->storage(), kv.packed_table(l), kv.packed_positions(l),
                            batch[i].request_id};
      at::Tensor k_out = prefix_k[i].narrow(0, 0, pages), v_out = prefix_v[i].narrow(0, 0, pages);
      Status* failure = batch[i].unpack_failure;
      if (failure == nullptr || failure->ok()) {
        Status s = batch[i].unpacker->unpack(l, src, k_out, v_out);
        if (s.ok()) continue;
        if (failure == nullptr) return s;
        *failure = std::move(s);
      }
      k_out.zero_();  // a failed item reads zeros from here on (ForwardItem::unpack_failure)
      v_out.zero_();
    }
    attention_seconds += seconds_since(attention_start);
    parallel_rms_norm(k, x.data(), rows, d, L.attn_norm, eps, h.data());
    timed_linear(h.data(), d, L.wqkv, qkv.data(), qkv_width);
    if (L.bqkv.defined()) {
      const float* b = L.bqkv.data_ptr<float>();
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < qkv_width; ++j) qkv[r * qkv_width + j] += b[j];
    }

    // RoPE on Q and K heads (pairs of adjacent channels), then K/V into the pages.
    ThreadPool::global().parallel_for(rows, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const float* cs = cos_table + positions[r] * (hd / 2);
        const float* sn = sin_table + positions[r] * (hd / 2);
        float* row = qkv.data() + r * qkv_width;
        for (int64_t head = 0; head < nh + nkv; ++head) {
          float* v = row + head * hd;
          for (int64_t i = 0; i < hd / 2; ++i) {
            const float x0 = v[2 * i], x1 = v[2 * i + 1];
            v[2 * i] = x0 * cs[i] - x1 * sn[i];
            v[2 * i + 1] = x1 * cs[i] + x0 * sn[i];
          }
        }
      }
    });
    for (size_t i = 0; i < batch.size(); ++i) {
      const SequenceKv& kv = *batch[i].kv;
      const std::vector<int32_t>& table = kv.block_table(l);
      const int64_t ps = page_size[i];
      for (int64_t t = 0; t < begin[i + 1] - begin[i]; ++t) {
        const int64_t slot = kv.length(l) + t;
        const int64_t page = table[slot / ps], off = slot % ps;
        const float* row = qkv.data() + (begin[i] + t) * qkv_width;
        for (int64_t g = 0; g < nkv; ++g) {
          const float* kr = row + q_width + g * hd;
          const float* vr = row + q_width + nkv * hd + g * hd;
          const int64_t k_at = ((page * nkv + g) * hd) * ps + off, v_at = ((page * nkv + g) * ps + off) * hd;
          if (kv_element[i] == cpu::KvElement::kBFloat16) {  // rounded to nearest even, as torch's .to(bfloat16)
            auto* kp = static_cast<uint16_t*>(k_pages[i]) + k_at;
            auto* vp = static_cast<uint16_t*>(v_pages[i]) + v_at;
            for (int64_t e = 0; e < hd; ++e) kp[e * ps] = fp32_to_bf16(kr[e]);
            for (int64_t e = 0; e < hd; ++e) vp[e] = fp32_to_bf16(vr[e]);
          } else {
            float* kp = static_cast<float*>(k_pages[i]) + k_at;
            for (int64_t e = 0; e < hd; ++e) kp[e * ps] = kr[e];
            std::copy_n(vr, hd, static_cast<float*>(v_pages[i]) + v_at);
          }
        }
      }
    }

    attention_start = std::chrono::steady_clock::now();
    for (size_t w = 0; w < work.size(); ++w) {
      const AttentionWork& job = work[w];
      const SequenceKv& kv = *batch[job.item].kv;
      cpu::PagedAttentionArgs& a = jobs[w].args;
      a.q = qkv.data() + begin[job.item] * qkv_width;
      a.q_row_stride = qkv_width;
      a.out = attn.data() + begin[job.item] * q_width;
      a.out_row_stride = q_width;
      a.k_pages = k_pages[job.item];
      a.v_pages = v_pages[job.item];
      a.kv_element = kv_element[job.item];
      a.block_table = kv.block_table(l).data();
      a.page_size = page_size[job.item];
      a.n_heads = nh;
      a.n_kv_heads = nkv;
      a.head_dim = hd;
      a.cached_len = kv.total_length(l);
      a.prefix_len = kv.packed_length(l);
      a.packed_layout = nullptr;
      a.prefix_k_pages = a.prefix_v_pages = nullptr;
      if (a.prefix_len > 0 && in_place[job.item]) {
        a.packed_layout = &*in_place[job.item];
        a.packed_storage = batch[job.item].packed_pool->storage().data_ptr<uint8_t>();
        a.packed_pages = kv.packed_table(l).data();
      } else if (a.prefix_len > 0) {
        a.prefix_k_pages = prefix_k[job.item].data_ptr<float>();
        a.prefix_v_pages = prefix_v[job.item].data_ptr<float>();
      }
      a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
      jobs[w].kv_head = job.kv_head;
      jobs[w].row0 = job.row0;
      jobs[w].row1 = job.row1;
    }
    run_attention_jobs(k, jobs);
    attention_seconds += seconds_since(attention_start);

    if (observer) {
      std::vector<int64_t> cache_lengths(batch.size());
      for (size_t i = 0; i < batch.size(); ++i) cache_lengths[i] = batch[i].kv->length(l);
      acts.layer = l;
      acts.cache_lengths = cache_lengths;
      VC_RETURN_IF_ERROR(observer(acts));
    }

    timed_linear(attn.data(), q_width, L.wo, proj.data(), d);
    for (int64_t e = 0; e < rows * d; ++e) x[e] += proj[e];

    parallel_rms_norm(k, x.data(), rows, d, L.ffn_norm, eps, h.data());
    timed_linear(h.data(), d, L.w_gate_up, gate_up.data(), 2 * dff);
    ThreadPool::global().parallel_for(rows, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const float* g = gate_up.data() + r * 2 * dff;
        k.silu_mul(g, g + dff, dff, act.data() + r * dff);
      }
    });
    timed_linear(act.data(), dff, L.w_down, proj.data(), d);
    for (int64_t e = 0; e < rows * d; ++e) x[e] += proj[e];
  }

  const auto logits_start = std::chrono::steady_clock::now();
  const std::vector<int64_t> out_rows = logit_rows(batch, begin);
  const auto n_out = static_cast<int64_t>(out_rows.size());
  std::vector<float> final_h(n_out * d);
  for (int64_t j = 0; j < n_out; ++j) {
    k.rms_norm(x.data() + out_rows[j] * d, d, output_norm_.data_ptr<float>(), eps, final_h.data() + j * d);
  }
  *logits = at::empty({n_out, c.vocab_size}, at::kFloat);
  if (n_out > 0) parallel_linear(final_h.data(), d, n_out, output_, logits->data_ptr<float>(), c.vocab_size);
  if (times != nullptr) {
    times->attention_seconds += attention_seconds;
    times->linear_seconds += linear_seconds;
    times->logits_seconds += seconds_since(logits_start);
  }
  return Status();
}

}  // namespace vericache
