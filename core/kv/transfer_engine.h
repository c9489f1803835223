// TransferEngine: asynchronous copies of a request's full KV cache (KV_full) from the host store
// into transient pages of the device pool, where a verify forward reads it.
//
//   CPU: a worker thread copies whole pages, queued transfers one after another (a link is
//        serial). With `emulated_link_bytes_per_second` > 0 the worker also paces itself to that
//        bandwidth — an *emulated link* standing in for PCIe or a remote link on a machine without
//        one; the name says so in every output. 0 copies at memory speed.
//   CUDA (a host pool on the CPU, a device pool on a GPU): the copies are issued on a dedicated
//        copy stream (from page-locked staging memory, non-blocking) and the worker waits for an
//        event per transfer. Pacing to an emulated link applies on any device.
// Bytes moved and the time the engine waited for a transfer are reported.
//
// Ownership: borrows the pools and caches named in a transfer until it completes (wait() or done()
// returned true). Thread-safety: submit/done/wait from the engine thread only; the worker writes
// only the transient pages allocated to a transfer and reads only the source pages it names, which
// the engine leaves unchanged until the transfer completes. Failure: submit() returns OutOfPages
// (nothing queued) when the destination lacks transient pages.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <vericache/status.h>

#include "kv/page_pool.h"
#include "kv/sequence_kv.h"

namespace vericache {

struct TransferOptions {
  double emulated_link_bytes_per_second = 0;  // CPU only; 0: no pacing
};

struct TransferStats {
  int64_t transfers = 0;
  int64_t bytes = 0;        // page bytes copied (keys and values)
  double busy_seconds = 0;  // time the link spent copying (including emulated pacing)
};

class TransferEngine {
 public:
  explicit TransferEngine(TransferOptions options = {});
  ~TransferEngine();  // finishes queued transfers first
  TransferEngine(const TransferEngine&) = delete;
  TransferEngine& operator=(const TransferEngine&) = delete;

  // Reserves room in `dst` (an empty cache of transient pages in `dst_pool`) for src's slots plus
  // `extra_slots` more per layer (the verify window's new K/V), and queues the copy of every page
  // src holds. `dst` then has src's lengths; its K/V are valid once the transfer completes.
  // Returns a ticket. OutOfPages when `dst_pool` lacks transient pages (nothing changed).
  Result<uint64_t> submit(const SequenceKv& src, const PagePool& src_pool, SequenceKv* dst, PagePool& dst_pool,
                          int64_t extra_slots);
  // Whether the transfer has completed.
  bool done(uint64_t ticket) const;
  // Blocks until it has; returns the seconds spent waiting.
  double wait(uint64_t ticket);
  TransferStats stats() const;
  // "memory copy" or "emulated link at N GB/s".
  std::string describe() const;
  // The first copy that failed (a libtorch error), else OK. A failed transfer still completes, so
  // nothing waits forever; the engine stops at its next step with this error.
  Status status() const;

 private:
  struct Job {
    uint64_t ticket;
    const PagePool* src_pool;
    PagePool* dst_pool;
    std::vector<int64_t> src_pages, dst_pages;  // page ids, pairwise
  };
  void worker();
  void copy(const Job& job);

  TransferOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  uint64_t next_ticket_ = 1;
  uint64_t completed_ = 0;  // tickets complete in order: every ticket <= completed_ is done
  bool stopping_ = false;
  TransferStats stats_;
  Status error_;
  double link_free_at_ = 0;  // emulated link: when the previous transfer's bytes have passed
  std::thread thread_;
};

}  // namespace vericache
