// The model's rotary position embedding on one head's channels, for the quantizers that store keys
// before RoPE (RotateKV, KVQuant) and put it back at read. Pairs (2i, 2i + 1) rotate by
// position * inv_freq[i], inv_freq computed in float32 as the model's RoPE table does
// (1 / base^(2i / head_dim)).
// Header-only (compiled into each plugin and the command line). Not part of the installed contract.
#pragma once

#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>
#include <vector>

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

}  // namespace vericache::plugin
