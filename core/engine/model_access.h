// LlamaModelAccess: the runtime's ModelAccess (vericache/compressor.h) for one request, handed to
// an offline compressor's compress(). Borrows the model, the pool and the request's full cache;
// valid for that call only. Not thread-safe.
#pragma once

#include <span>
#include <vector>

#include <vericache/compressor.h>

#include "model/llama_model.h"

namespace vericache {

class LlamaModelAccess : public ModelAccess {
 public:
  LlamaModelAccess(const LlamaModel& model, PagePool& pool, SequenceKv& full_kv, std::span<const int32_t> prompt,
                   int64_t request_id)
      : model_(model), pool_(pool), kv_(full_kv), prompt_(prompt), request_id_(request_id), shape_(model.shape()) {}

  const ModelShape& shape() const override { return shape_; }
  Result<at::Tensor> weight(const std::string& gguf_name) const override { return model_.weight(gguf_name); }
  void rope(std::span<const int64_t> positions, at::Tensor* cos, at::Tensor* sin) const override {
    model_.rope(positions, cos, sin);
  }
  Status run_without_keeping(std::span<const int32_t> tokens, std::span<const int32_t> positions,
                             const std::function<Status(const LayerActivations&)>& observe) override;
  std::span<const int32_t> prompt() const override { return prompt_; }
  std::vector<int32_t> tokenize(const std::string& text) const override;
  std::string assistant_header() const override;
  int64_t request_id() const override { return request_id_; }

 private:
  const LlamaModel& model_;
  PagePool& pool_;
  SequenceKv& kv_;
  std::span<const int32_t> prompt_;
  int64_t request_id_;
  ModelShape shape_;
};

}  // namespace vericache
