#include "kv/transfer_engine.h"

#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <cstring>

#include "util/check.h"

#if VC_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace vericache {
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

TransferEngine::TransferEngine(TransferOptions options) : options_(options), thread_([this] { worker(); }) {}

TransferEngine::~TransferEngine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::string TransferEngine::describe() const {
  if (options_.emulated_link_bytes_per_second <= 0) return "memory copy";
  char text[64];
  std::snprintf(text, sizeof(text), "emulated link at %.2f GB/s", options_.emulated_link_bytes_per_second / 1e9);
  return text;
}

Result<uint64_t> TransferEngine::submit(const SequenceKv& src, const PagePool& src_pool, SequenceKv* dst,
                                        PagePool& dst_pool, int64_t extra_slots) {
  VC_CHECK(dst->pages_held() == 0 && dst->page_kind() == PageKind::kTransient,
           "submit: dst must be an empty transient cache");
  VC_CHECK(src_pool.spec().page_size == dst_pool.spec().page_size, "submit: page sizes differ");
  VC_CHECK(!src.compressed(), "submit: only full caches are transferred");
  const int64_t length = src.length(0);
  VC_RETURN_IF_ERROR(dst->reserve(dst_pool, length + extra_slots));
  dst->advance(length);
  Job job{0, &src_pool, &dst_pool, {}, {}};
  for (int64_t l = 0; l < src.n_layers(); ++l) {
    const std::vector<int32_t>& from = src.block_table(l);
    const std::vector<int32_t>& to = dst->block_table(l);
    const int64_t pages = src_pool.spec().pages_for(src.length(l));
    for (int64_t j = 0; j < pages; ++j) {
      job.src_pages.push_back(from[j]);
      job.dst_pages.push_back(to[j]);
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  job.ticket = next_ticket_++;
  queue_.push_back(std::move(job));
  cv_.notify_all();
  return queue_.back().ticket;
}

bool TransferEngine::done(uint64_t ticket) const {
  std::lock_guard<std::mutex> lock(mu_);
  return ticket <= completed_;
}

double TransferEngine::wait(uint64_t ticket) {
  const double start = now_seconds();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return ticket <= completed_; });
  return now_seconds() - start;
}

Status TransferEngine::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

TransferStats TransferEngine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void TransferEngine::copy(const Job& job) {
  if (job.src_pages.empty()) return;
  const at::Device device = job.dst_pool->k_pages().device();
  const PagePool& src = *job.src_pool;
  PagePool& dst = *job.dst_pool;
  if (device.is_cpu() && src.k_pages().device().is_cpu() &&
      src.k_pages().scalar_type() == dst.k_pages().scalar_type()) {
    // Page by page, one pass and no temporaries: on a CPU the copy shares the cores with the
    // forwards, so it should cost them as little as it can (a DMA engine would cost them nothing).
    const size_t page = static_cast<size_t>(src.page_bytes() / 2);  // keys or values of one page
    for (const bool keys : {true, false}) {
      const auto* from_base = static_cast<const char*>((keys ? src.k_pages() : src.v_pages()).data_ptr());
      auto* to_base = static_cast<char*>((keys ? dst.k_pages() : dst.v_pages()).data_ptr());
      for (size_t i = 0; i < job.src_pages.size(); ++i) {
        std::memcpy(to_base + static_cast<size_t>(job.dst_pages[i]) * page,
                    from_base + static_cast<size_t>(job.src_pages[i]) * page, page);
      }
    }
    return;
  }
  const at::Tensor from = at::tensor(job.src_pages, at::kLong).to(src.k_pages().device());
  const at::ScalarType dtype = dst.k_pages().scalar_type();
#if VC_WITH_CUDA
  if (device.is_cuda() && src.k_pages().device().is_cpu()) {
    // A copy stream of its own, so copies overlap the forwards on the default stream. The pages
    // are gathered into page-locked staging memory, then copied without blocking; the worker (not
    // the engine) waits for the event that marks the copy done.
    const c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
    const c10::cuda::CUDAStreamGuard guard(stream);
    const at::Tensor to = at::tensor(job.dst_pages, at::kLong).to(device, /*non_blocking=*/false);
    for (const bool keys : {true, false}) {
      const at::Tensor& pages = keys ? src.k_pages() : src.v_pages();
      std::vector<int64_t> shape = pages.sizes().vec();
      shape[0] = from.size(0);
      at::Tensor staging = at::empty(shape, pages.options().pinned_memory(true));
      at::index_select_out(staging, pages, 0, from);
      (keys ? dst.k_pages() : dst.v_pages()).index_copy_(0, to, staging.to(device, dtype, /*non_blocking=*/true));
    }
    at::cuda::CUDAEvent copied;
    copied.record(stream);
    copied.synchronize();
    return;
  }
#endif
  const at::Tensor to = at::tensor(job.dst_pages, at::kLong).to(device);
  dst.k_pages().index_copy_(0, to, src.k_pages().index_select(0, from).to(device, dtype));
  dst.v_pages().index_copy_(0, to, src.v_pages().index_select(0, from).to(device, dtype));
}

void TransferEngine::worker() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    const double start = now_seconds();
    Status failed;
    try {
      copy(job);
    } catch (const std::exception& e) {
      const std::string what = e.what();
      failed = Status::internal("KV transfer " + std::to_string(job.ticket) + ": " + what.substr(0, what.find('\n')));
    }
    const int64_t bytes = static_cast<int64_t>(job.src_pages.size()) * job.src_pool->page_bytes();
    if (options_.emulated_link_bytes_per_second > 0) {
      // The link is serial: this transfer's bytes pass after the previous transfer's.
      const double finish =
          std::max(start, link_free_at_) + static_cast<double>(bytes) / options_.emulated_link_bytes_per_second;
      link_free_at_ = finish;
      const double left = finish - now_seconds();
      if (left > 0) std::this_thread::sleep_for(std::chrono::duration<double>(left));
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed.ok() && error_.ok()) error_ = failed;
    ++stats_.transfers;
    stats_.bytes += bytes;
    stats_.busy_seconds += now_seconds() - start;
    completed_ = job.ticket;
    cv_.notify_all();
  }
}

}  // namespace vericache
