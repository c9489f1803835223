// StepTimes (harness/step_times.h): the split of a benchmark's decode steps and the steady state of
// a full batch, on step records made up here.
#include <gtest/gtest.h>

#include "step_times.h"

namespace vericache::cli {
namespace {

StepRecord step(double ms, int64_t drafts, int64_t verifies, int64_t rows) {
  StepRecord s;
  s.seconds = ms / 1e3;
  s.draft_items = drafts;
  s.verify_items = verifies;
  s.rows = rows;
  return s;
}

// Batch 2: two draft steps and a verify of both (3 + 1 tokens), a fallback step of both (2 tokens),
// then a tail where one request runs alone (a draft and a verify of 3 tokens). The steady state
// counts the first four steps only, and so do verify-only steps (the tail's verify is not one).
TEST(StepTimes, SplitsStepsAndMeasuresTheFullBatchApartFromTheTail) {
  StepTimes t;
  t.full_batch = 2;
  t.on_step(step(10, 2, 0, 2));
  t.on_step(step(10, 2, 0, 2));
  t.on_window({0, 2, 2});
  t.on_window({1, 2, 0});
  t.on_step(step(30, 0, 2, 6));
  t.on_window({0, 0, 0});
  t.on_window({1, 0, 0});
  t.on_step(step(20, 0, 2, 2));
  t.on_step(step(5, 1, 0, 1));
  t.on_window({1, 2, 2});
  t.on_step(step(15, 0, 1, 3));

  EXPECT_EQ(t.draft_steps, 3);
  EXPECT_EQ(t.verify_steps, 3);
  EXPECT_EQ(t.fallback_steps, 1);
  EXPECT_DOUBLE_EQ(t.fallback_ms(), 20);
  EXPECT_EQ(t.verify_only_steps, 1);
  EXPECT_DOUBLE_EQ(t.verify_only_ms(), 30);
  EXPECT_EQ(t.full_batch_tokens, 6);
  EXPECT_DOUBLE_EQ(t.full_batch_seconds, 0.07);
  EXPECT_DOUBLE_EQ(t.full_batch_tok_s(), 6 / 0.07);
  EXPECT_DOUBLE_EQ(t.decode_seconds(), 0.09);
}

// Without a batch size there is no steady state; tokens of a window are not carried into a later step.
TEST(StepTimes, CountsTheTokensOfEachStepOnlyOnce) {
  StepTimes t;
  t.on_window({0, 4, 4});
  t.on_step(step(30, 0, 1, 5));
  EXPECT_EQ(t.full_batch_tokens, 0);
  EXPECT_EQ(t.verify_only_steps, 1);  // without a batch size every verify-only step counts
  EXPECT_DOUBLE_EQ(t.full_batch_tok_s(), 0);
  t.full_batch = 1;
  t.on_step(step(10, 1, 0, 1));
  EXPECT_EQ(t.full_batch_tokens, 0);  // the earlier window's 5 tokens belong to the earlier step
  t.on_window({0, 1, 0});
  t.on_step(step(10, 0, 1, 2));
  EXPECT_EQ(t.full_batch_tokens, 1);
}

}  // namespace
}  // namespace vericache::cli
