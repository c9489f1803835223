// TokenScorer's own rules, without a model: offline, each head keeps its protected tokens and then
// its highest scores, floor(c * n) in all (or the layer budgets a scorer sets); online, each head
// keeps max(floor(c * T), min(T, window)) tokens, evicting the lowest scores outside the window.
// The plugins built on it are checked against kvpress in fidelity_test and conformance_test.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <set>
#include <vector>

#include <vericache/token_scorer.h>

namespace vericache {
namespace {

constexpr int64_t kLayers = 3, kHeads = 2, kDim = 4;

// Distinct scores per (layer, head, position), a fixed permutation.
float score_of(int64_t layer, int64_t head, int64_t position) {
  return static_cast<float>((position * 37 + layer * 11 + head * 5) % 101);
}

// The scorer under test: scores from score_of, the first `first` and last `last` protected, and
// optionally per-layer budgets (keep + 1, keep - 1, keep, ...).
class FixedScorer : public TokenScorer<int> {
 public:
  FixedScorer(CompressionMode mode, ProtectedTokens p, bool shift_budgets, int64_t window)
      : TokenScorer("fixed", mode), protected_(p), shift_(shift_budgets), window_(window) {}

  int observed(int64_t request_id) { return state(request_id); }

 protected:
  Status observe(const RequestRows& rows, int& count) override {
    count += static_cast<int>(rows.positions.size(0));
    return Status();
  }
  Status score(const KvCacheView& full_kv, ModelAccess&, int&, std::vector<at::Tensor>* scores) override {
    const int64_t n = full_kv.lengths[0];
    for (int64_t l = 0; l < kLayers; ++l) {
      at::Tensor s = at::empty({kHeads, n});
      for (int64_t h = 0; h < kHeads; ++h)
        for (int64_t p = 0; p < n; ++p) s[h][p] = score_of(l, h, p);
      scores->push_back(s);
    }
    return Status();
  }
  ProtectedTokens protected_tokens(int64_t) const override { return protected_; }
  std::vector<int64_t> layer_budgets(const std::vector<at::Tensor>& scores, int64_t keep, int64_t) const override {
    std::vector<int64_t> b(scores.size(), keep);
    if (shift_) {
      b[0] += 1;
      b[1] -= 1;
    }
    return b;
  }
  Result<at::Tensor> score_rows(const RequestRows& rows, int&) override {
    at::Tensor s = at::empty({rows.positions.size(0), kHeads});
    for (int64_t r = 0; r < rows.positions.size(0); ++r)
      for (int64_t h = 0; h < kHeads; ++h) s[r][h] = score_of(rows.layer, h, rows.positions[r].item<int64_t>());
    return s;
  }
  int64_t recent_window() const override { return window_; }

 private:
  ProtectedTokens protected_;
  bool shift_;
  int64_t window_;
};

// Only request_id() is asked for by the base.
class RequestOnly : public ModelAccess {
 public:
  const ModelShape& shape() const override { return shape_; }
  Result<at::Tensor> weight(const std::string&) const override { return Status::not_found("no weights"); }
  void rope(std::span<const int64_t>, at::Tensor*, at::Tensor*) const override {}
  Status run_without_keeping(std::span<const int32_t>, std::span<const int32_t>,
                             const std::function<Status(const LayerActivations&)>&) override {
    return Status::not_supported("no model");
  }
  std::span<const int32_t> prompt() const override { return {}; }
  std::vector<int32_t> tokenize(const std::string&) const override { return {}; }
  std::string assistant_header() const override { return "\n"; }
  int64_t request_id() const override { return 7; }

 private:
  ModelShape shape_;
};

KvCacheView view_of(int64_t n) {
  KvCacheView v;
  v.layout = KvLayout{kLayers, kHeads, kDim, 16};
  v.lengths.assign(kLayers, n);
  return v;
}

// The activations of one forward of `rows` new tokens of request 7 from position `start`.
struct Forward {
  at::Tensor residual, q, k, v, positions;
  std::vector<int64_t> offsets, ids{7}, lengths{0};
  std::vector<double> ratios;
  LayerActivations acts(int64_t layer) {
    LayerActivations a;
    a.layer = layer;
    a.residual = a.hidden = residual;
    a.q = q;
    a.k = k;
    a.v = v;
    a.positions = positions;
    a.row_offsets = offsets;
    a.request_ids = ids;
    a.ratios = ratios;
    a.cache_lengths = lengths;
    return a;
  }
};
Forward forward_of(int64_t start, int64_t rows, double ratio) {
  Forward f;
  f.residual = at::zeros({rows, 8});
  f.q = at::zeros({rows, kHeads, kDim});
  f.k = at::zeros({rows, kHeads, kDim});
  f.v = at::zeros({rows, kHeads, kDim});
  f.positions = at::arange(start, start + rows, at::kLong);
  f.offsets = {0, rows};
  f.ratios = {ratio};
  return f;
}

// (score_tokens() gives the scores themselves, as a teacher needs them.)
TEST(TokenScorer, OfflineKeepsProtectedTokensThenTheTopScores) {
  const int64_t n = 40;
  RequestOnly model;
  for (const bool shift : {false, true}) {
    FixedScorer scorer(CompressionMode::kOffline, {2, 3}, shift, 0);
    Forward f = forward_of(0, n, 1.0);
    std::vector<LayerDrops> drops;
    for (int64_t l = 0; l < kLayers; ++l) ASSERT_TRUE(scorer.update(f.acts(l), &drops).ok());
    EXPECT_TRUE(drops.empty());
    EXPECT_EQ(scorer.observed(7), kLayers * n);  // observe() saw request 7's rows of every layer
    CompressedKV out;
    ASSERT_TRUE(scorer.compress(view_of(n), 0.25, model, &out).ok());
    ASSERT_EQ(out.kept.size(), static_cast<size_t>(kLayers));
    for (int64_t l = 0; l < kLayers; ++l) {
      const int64_t budget = 10 + (shift ? (l == 0 ? 1 : l == 1 ? -1 : 0) : 0);
      ASSERT_EQ(out.kept[l].sizes(), (std::vector<int64_t>{kHeads, budget}));
      for (int64_t h = 0; h < kHeads; ++h) {
        std::vector<int64_t> want{0, 1, 37, 38, 39};
        std::vector<int64_t> rest;
        for (int64_t p = 2; p < 37; ++p) rest.push_back(p);
        std::sort(rest.begin(), rest.end(), [&](int64_t a, int64_t b) { return score_of(l, h, a) > score_of(l, h, b); });
        want.insert(want.end(), rest.begin(), rest.begin() + (budget - 5));
        std::sort(want.begin(), want.end());
        const at::Tensor row = out.kept[l][h];
        EXPECT_EQ(std::vector<int64_t>(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + budget), want)
            << "layer " << l << " head " << h;
      }
    }
    // score_tokens(): the raw scores compress() ranked by, protected positions untouched.
    std::vector<at::Tensor> scores;
    ASSERT_TRUE(scorer.score_tokens(view_of(n), model, &scores).ok());
    ASSERT_EQ(scores.size(), static_cast<size_t>(kLayers));
    for (int64_t l = 0; l < kLayers; ++l) {
      ASSERT_EQ(scores[l].sizes(), (std::vector<int64_t>{kHeads, n}));
      for (int64_t p : {0L, 5L, 39L}) EXPECT_EQ(scores[l][1][p].item<float>(), score_of(l, 1, p));
    }
    scorer.release(7);
    EXPECT_EQ(scorer.observed(7), 0);  // released state starts over
  }
  // A compressor that does not score tokens says so.
  struct Plain : CompressorBase {
    Plain() : CompressorBase("plain", CompressorFamily::kTokenDropping, CompressionMode::kOffline, 0) {}
  } plain;
  std::vector<at::Tensor> none;
  const Status s = plain.score_tokens(view_of(n), model, &none);
  EXPECT_EQ(s.code(), StatusCode::kNotSupported);
  EXPECT_EQ(s.message(), "plain: does not score tokens (no score_tokens())");
}

TEST(TokenScorer, OnlineEvictsTheLowestScoresOutsideTheWindow) {
  const int64_t window = 6;
  const double ratio = 0.25;
  FixedScorer scorer(CompressionMode::kOnline, {}, false, window);
  std::vector<std::set<int64_t>> held(kLayers * kHeads);
  int64_t seen = 0;
  for (const int64_t rows : {20, 1, 1, 5, 1, 13}) {
    Forward f = forward_of(seen, rows, ratio);
    seen += rows;
    for (int64_t l = 0; l < kLayers; ++l) {
      for (int64_t h = 0; h < kHeads; ++h)
        for (int64_t p = seen - rows; p < seen; ++p) held[l * kHeads + h].insert(p);
      std::vector<LayerDrops> drops;
      ASSERT_TRUE(scorer.update(f.acts(l), &drops).ok());
      const int64_t target = std::max<int64_t>(kept_count(seen, ratio), std::min(seen, window));
      const int64_t before = static_cast<int64_t>(held[l * kHeads].size());
      if (before <= target) {
        EXPECT_TRUE(drops.empty());
        continue;
      }
      ASSERT_EQ(drops.size(), 1u);
      ASSERT_EQ(drops[0].positions.sizes(), (std::vector<int64_t>{kHeads, before - target}));
      for (int64_t h = 0; h < kHeads; ++h) {
        std::set<int64_t>& mine = held[l * kHeads + h];
        // The expected victims: the lowest scores among held tokens outside the window.
        std::vector<int64_t> candidates;
        for (int64_t p : mine)
          if (p < seen - window) candidates.push_back(p);
        std::sort(candidates.begin(), candidates.end(),
                  [&](int64_t a, int64_t b) { return score_of(l, h, a) < score_of(l, h, b); });
        std::set<int64_t> want(candidates.begin(), candidates.begin() + (before - target));
        const at::Tensor got = drops[0].positions[h];
        EXPECT_EQ(std::set<int64_t>(got.data_ptr<int64_t>(), got.data_ptr<int64_t>() + got.size(0)), want)
            << "layer " << l << " head " << h << " after " << seen;
        for (int64_t p : want) mine.erase(p);
      }
    }
  }
}

}  // namespace
}  // namespace vericache
