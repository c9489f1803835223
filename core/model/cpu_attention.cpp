// One layer's attention on the CPU kernels: whole jobs, or the three phases (cpu_attention.h).
#include "model/cpu_attention.h"

#include <algorithm>
#include <atomic>
#include <vector>

#include "util/thread_pool.h"

namespace vericache {
namespace {

std::atomic<AttentionSplit> split_setting{AttentionSplit::kByRule};

constexpr int64_t kLanes = 16;
constexpr int64_t kSlotChunk = 256;  // slots per scores task (a multiple of 16)

int64_t round_up(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

bool use_phases(std::span<const AttentionJob> jobs) {
  const AttentionSplit setting = split_setting.load();
  if (setting == AttentionSplit::kNever) return false;
  for (const AttentionJob& job : jobs) {
    if (job.args.packed_layout != nullptr) return false;
  }
  if (setting == AttentionSplit::kAlways) return true;
  return static_cast<int64_t>(jobs.size()) < 2 * ThreadPool::global().threads();
}

void run_phases(const cpu::KernelTable& k, std::span<const AttentionJob> jobs) {
  // Each job's scores rows: one per query vector, `stride` slots (its longest row, rounded to 16).
  struct Layout {
    int64_t queries, slots, offset;
  };
  std::vector<Layout> layout(jobs.size());
  int64_t total = 0, query_total = 0;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const AttentionJob& job = jobs[j];
    const int64_t group = job.args.n_heads / job.args.n_kv_heads;
    layout[j] = {(job.row1 - job.row0) * group, round_up(job.args.cached_len + job.row1, kLanes), total};
    total += layout[j].queries * layout[j].slots;
    query_total += layout[j].queries;
  }
  thread_local std::vector<float> scores_buffer;
  thread_local std::vector<float> sums_buffer;
  std::vector<float>& scores = scores_buffer;  // the calling thread's: workers must not name the thread_local
  std::vector<float>& sums = sums_buffer;
  scores.resize(total);
  sums.resize(query_total);
  std::vector<int64_t> first_query(jobs.size());
  for (size_t j = 1; j < jobs.size(); ++j) first_query[j] = first_query[j - 1] + layout[j - 1].queries;

  struct Task {
    int64_t job, begin, end;
  };
  std::vector<Task> tasks;
  for (size_t j = 0; j < jobs.size(); ++j) {
    for (int64_t s = 0; s < layout[j].slots; s += kSlotChunk) {
      tasks.push_back({static_cast<int64_t>(j), s, std::min(layout[j].slots, s + kSlotChunk)});
    }
  }
  ThreadPool::global().parallel_for(static_cast<int64_t>(tasks.size()), 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const AttentionJob& job = jobs[tasks[t].job];
      const Layout& l = layout[tasks[t].job];
      k.attention_scores(job.args, job.kv_head, job.row0, job.row1, tasks[t].begin, tasks[t].end,
                         scores.data() + l.offset, l.slots);
    }
  });

  tasks.clear();
  for (size_t j = 0; j < jobs.size(); ++j) {
    for (int64_t q = 0; q < layout[j].queries; ++q) tasks.push_back({static_cast<int64_t>(j), q, q + 1});
  }
  ThreadPool::global().parallel_for(static_cast<int64_t>(tasks.size()), 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const AttentionJob& job = jobs[tasks[t].job];
      const Layout& l = layout[tasks[t].job];
      const int64_t q = tasks[t].begin, group = job.args.n_heads / job.args.n_kv_heads;
      const int64_t len = job.args.cached_len + job.row0 + q / group + 1;
      sums[first_query[tasks[t].job] + q] = k.softmax_numerators(scores.data() + l.offset + q * l.slots, len);
    }
  });

  tasks.clear();
  for (size_t j = 0; j < jobs.size(); ++j) {
    for (int64_t c = 0; c < jobs[j].args.head_dim; c += kLanes) tasks.push_back({static_cast<int64_t>(j), c, c + kLanes});
  }
  ThreadPool::global().parallel_for(static_cast<int64_t>(tasks.size()), 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const AttentionJob& job = jobs[tasks[t].job];
      const Layout& l = layout[tasks[t].job];
      k.attention_values(job.args, job.kv_head, job.row0, job.row1, scores.data() + l.offset, l.slots,
                         sums.data() + first_query[tasks[t].job], tasks[t].begin, tasks[t].end);
    }
  });
}

}  // namespace

void run_attention_jobs(const cpu::KernelTable& kernels, std::span<const AttentionJob> jobs) {
  if (use_phases(jobs)) return run_phases(kernels, jobs);
  ThreadPool::global().parallel_for(static_cast<int64_t>(jobs.size()), 1, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) kernels.attention(jobs[j].args, jobs[j].kv_head, jobs[j].row0, jobs[j].row1);
  });
}

AttentionSplit set_attention_split(AttentionSplit split) { return split_setting.exchange(split); }

}  // namespace vericache
