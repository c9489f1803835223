// libFuzzer target: any bytes as a model file. GgufFile::open must return a Status (never crash,
// hang or allocate without bound); a file it accepts goes on through what loading reads before any
// tensor is allocated: the Llama configuration, the tokenizer (then encode and decode a fixed text),
// the chat template, and the dequantization of every small tensor.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "model/chat_template.h"
#include "model/ggml_dequant.h"
#include "model/gguf_file.h"
#include "model/llama_config.h"
#include "model/tokenizer.h"

namespace {

// GgufFile reads through a memory mapping of a path, as it does for real files.
const std::string& scratch_path() {
  static const std::string path = "/dev/shm/vc_gguf_fuzz_" + std::to_string(::getpid()) + ".gguf";
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace vericache;
  FILE* f = std::fopen(scratch_path().c_str(), "wb");
  if (f == nullptr) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  auto file = GgufFile::open(scratch_path());
  if (!file.ok()) return 0;
  (void)LlamaConfig::from_gguf(*file);
  if (auto tok = Tokenizer::from_gguf(*file); tok.ok()) {
    const std::vector<int32_t> ids = tok->encode("hello world <|im_start|>hell\xc3\xa9", /*parse_special=*/true);
    (void)tok->decode(ids, /*include_control=*/true);
  }
  if (auto chat = ChatTemplate::from_gguf(*file); chat.ok()) (void)chat->render({{"user", "hi"}}, true);
  std::vector<float> out;
  for (const GgufTensorInfo& t : file->tensors()) {
    if (t.n_elements > (1 << 16)) continue;
    out.resize(static_cast<size_t>(t.n_elements));
    (void)dequantize(t.type, t.data, t.n_elements, out.data());
  }
  return 0;
}
