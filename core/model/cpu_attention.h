// One layer's attention on the CPU kernels, spread over the thread pool.
#pragma once

#include <cstdint>
#include <span>

#include "kernels/cpu_kernels.h"

namespace vericache {

// One job: rows [row0, row1) of one request (at most cpu::attention_rows_per_tile of them) for
// the query heads of KV head `kv_head`. `args` borrows the forward's buffers and pages.
struct AttentionJob {
  cpu::PagedAttentionArgs args;
  int64_t kv_head = 0, row0 = 0, row1 = 0;
};

// Runs every job, writing each job's rows of args.out. With at least twice as many jobs as threads
// each job runs whole (KernelTable::attention) on one thread. With fewer (a decode step of one
// request has one job per KV head: 3 for SmolLM2, which 2 threads split 2:1), the jobs run in the
// kernels' three phases instead: scores by ranges of slots, the softmax by query vector, the
// values by ranges of channels, each phase over every thread. Both give the same bits (each score,
// exponential, sum and output channel is computed by the same operations in the same order);
// jobs reading packed pages in place always run whole (their values are dequantized per block of
// all channels).
// Thread-safety: runs parallel loops on ThreadPool::global(); call from one thread at a time.
void run_attention_jobs(const cpu::KernelTable& kernels, std::span<const AttentionJob> jobs);

// Which path run_attention_jobs takes: the rule above (the default), always the phases, or always
// whole jobs: for tests and ablations (`vericache bench --attention-split`). Process-wide; returns
// the previous setting.
enum class AttentionSplit { kByRule, kAlways, kNever };
AttentionSplit set_attention_split(AttentionSplit split);

}  // namespace vericache
