// The model's rotary position embedding on one head's channels, for the quantizers that store keys
// before RoPE (RotateKV, KVQuant) and put it back at read. Pairs (2i, 2i + 1) rotate by
// position * inv_freq[i], inv_freq computed in float32 as the model's RoPE table does
// (1 / base^(2i / head_dim)). Also the RoPE rotation averaged over future positions
// (ExpectedAttention's model of future queries).
// Header-only (compiled into each plugin and the command line). Not part of the installed contract.
#pragma once

#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include <vericache/compressor.h>

namespace vericache::plugin {

class Rope {
 public:
  Rope(double base, int64_t head_dim) : pairs_(head_dim / 2) {
    const at::Tensor exponents = at::arange(0, head_dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(head_dim);
    const at::Tensor inv = 1.0 / at::pow(base, exponents);
    inv_freq_.assign(inv.data_ptr<float>(), inv.data_ptr<float>() + pairs_);
  }
  int64_t pairs() const { return pairs_; }

  // cos and sin [pairs()] of `position`'s angles: compute once per token, rotate every head with them.
  void angles(int64_t position, float* cos, float* sin) const {
    for (int64_t i = 0; i < pairs_; ++i) {
      const float angle = static_cast<float>(position) * inv_freq_[i];
      cos[i] = std::cos(angle);
      sin[i] = std::sin(angle);
    }
  }
  // One head's x (2 * pairs() floats) after RoPE -> before it (inverse = true), or back.
  void rotate(float* x, const float* cos, const float* sin, bool inverse) const {
    for (int64_t i = 0; i < pairs_; ++i) {
      const float c = cos[i], s = inverse ? -sin[i] : sin[i];
      const float a = x[2 * i], b = x[2 * i + 1];
      x[2 * i] = a * c - b * s;
      x[2 * i + 1] = a * s + b * c;
    }
  }
  void rotate(float* x, int64_t position, bool inverse) const {
    std::vector<float> c(pairs_), s(pairs_);
    angles(position, c.data(), s.data());
    rotate(x, c.data(), s.data(), inverse);
  }

 private:
  int64_t pairs_;
  std::vector<float> inv_freq_;
};

// The mean over positions p in [first, first + count) of the model's RoPE rotation at p, float64
// [head_dim, head_dim]. Rows in GGUF order: pair (2i, 2i + 1) rotates by the angle p * theta_i.
inline at::Tensor mean_rotation(ModelAccess& model, int64_t first, int64_t count, int64_t head_dim) {
  std::vector<int64_t> positions(count);
  for (int64_t p = 0; p < count; ++p) positions[p] = first + p;
  at::Tensor cos, sin;
  model.rope(positions, &cos, &sin);
  const at::Tensor c = cos.to(at::kDouble).mean(0), s = sin.to(at::kDouble).mean(0);  // [head_dim / 2]
  at::Tensor r = at::zeros({head_dim, head_dim}, at::kDouble);
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    const double ci = c[i].item<double>(), si = s[i].item<double>();
    r[2 * i][2 * i] = ci;
    r[2 * i][2 * i + 1] = -si;
    r[2 * i + 1][2 * i] = si;
    r[2 * i + 1][2 * i + 1] = ci;
  }
  return r;
}

}  // namespace vericache::plugin
