#include "model/tokenizer.h"

#include <algorithm>
#include <queue>

#include "model/unicode.h"
#include "util/printable.h"

namespace vericache {
namespace {

// GPT-2's reversible byte <-> printable code point map: printable Latin-1 bytes map to
// themselves, the rest to U+0100 upwards in byte order.
struct ByteLevelMap {
  uint32_t byte_to_cp[256];
  std::unordered_map<uint32_t, uint8_t> cp_to_byte;

  ByteLevelMap() {
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      byte_to_cp[b] = printable ? b : next++;
      cp_to_byte[byte_to_cp[b]] = static_cast<uint8_t>(b);
    }
  }
};

const ByteLevelMap& byte_level_map() {
  static const ByteLevelMap map;
  return map;
}

// Decodes a vocabulary entry from byte-level symbols to bytes; false if a code point is not in
// the byte-level alphabet.
bool byte_level_decode(const std::string& text, std::string* out) {
  const ByteLevelMap& map = byte_level_map();
  out->clear();
  for (const CodePoint& cp : decode_utf8(text)) {
    auto it = map.cp_to_byte.find(cp.value);
    if (it == map.cp_to_byte.end()) return false;
    out->push_back(static_cast<char>(it->second));
  }
  return true;
}

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// Classes the GPT-2 regex distinguishes. An invalid byte is "other".
bool letter(const CodePoint& c) { return c.value != kInvalidCodePoint && is_letter(c.value); }
bool number(const CodePoint& c) { return c.value != kInvalidCodePoint && is_number(c.value); }
bool space(const CodePoint& c) { return c.value != kInvalidCodePoint && is_whitespace(c.value); }
bool other(const CodePoint& c) { return !letter(c) && !number(c) && !space(c); }

// Splits cps[begin, end) with
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// appending [first, last) code point index pairs. Leftmost-first alternation, as the regex engine.
void split_gpt2(const std::vector<CodePoint>& cps, size_t begin, size_t end,
                std::vector<std::pair<size_t, size_t>>* out) {
  size_t pos = begin;
  auto at = [&](size_t i) -> uint32_t { return i < end ? cps[i].value : 0; };
  while (pos < end) {
    const CodePoint& c = cps[pos];
    // Contractions.
    if (c.value == '\'' && pos + 1 < end) {
      const uint32_t c1 = at(pos + 1);
      if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') {
        out->emplace_back(pos, pos + 2);
        pos += 2;
        continue;
      }
      if (pos + 2 < end) {
        const uint32_t c2 = at(pos + 2);
        if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) {
          out->emplace_back(pos, pos + 3);
          pos += 3;
          continue;
        }
      }
    }
    // An optional leading ' ' followed by a run of one class.
    const bool lead_space = c.value == ' ' && pos + 1 < end;
    const CodePoint& head = lead_space ? cps[pos + 1] : c;
    bool (*run_class)(const CodePoint&) = nullptr;
    if (letter(head)) run_class = letter;
    else if (number(head)) run_class = number;
    else if (other(head)) run_class = other;
    if (run_class != nullptr) {
      size_t i = pos + (lead_space ? 1 : 0);
      while (i < end && run_class(cps[i])) ++i;
      out->emplace_back(pos, i);
      pos = i;
      continue;
    }
    // Whitespace: \s+(?!\S) keeps the last space for the next word when a non-space follows;
    // a single space before a non-space falls through to \s+.
    size_t i = pos;
    while (i < end && space(cps[i])) ++i;
    if (i < end && i - pos > 1) --i;
    out->emplace_back(pos, i);
    pos = i;
  }
}

// Splits cps[begin, end) as Qwen2's pre-tokenizer regex (also Llama 3's) does:
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// Leftmost-first alternation, greedy quantifiers with the regex engine's backtracking.
void split_qwen2(const std::vector<CodePoint>& cps, size_t begin, size_t end,
                 std::vector<std::pair<size_t, size_t>>* out) {
  auto lower = [&](size_t i) -> uint32_t {
    const uint32_t v = i < end ? cps[i].value : 0;
    return v >= 'A' && v <= 'Z' ? v + ('a' - 'A') : v;
  };
  auto newline = [&](size_t i) { return cps[i].value == '\r' || cps[i].value == '\n'; };
  size_t pos = begin;
  while (pos < end) {
    const CodePoint& c = cps[pos];
    // Contractions, any case.
    if (c.value == '\'' && pos + 1 < end) {
      const uint32_t c1 = lower(pos + 1), c2 = lower(pos + 2);
      if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') {
        out->emplace_back(pos, pos + 2);
        pos += 2;
        continue;
      }
      if (pos + 2 < end && ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l'))) {
        out->emplace_back(pos, pos + 3);
        pos += 3;
        continue;
      }
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+
    const bool prefix = !letter(c) && !number(c) && !newline(pos) && pos + 1 < end && letter(cps[pos + 1]);
    if (letter(c) || prefix) {
      size_t i = pos + (prefix ? 1 : 0);
      while (i < end && letter(cps[i])) ++i;
      out->emplace_back(pos, i);
      pos = i;
      continue;
    }
    // \p{N}: one digit at a time.
    if (number(c)) {
      out->emplace_back(pos, pos + 1);
      ++pos;
      continue;
    }
    // " ?[^\s\p{L}\p{N}]+[\r\n]*"
    const bool lead_space = c.value == ' ' && pos + 1 < end && other(cps[pos + 1]);
    if (other(c) || lead_space) {
      size_t i = pos + (lead_space ? 1 : 0);
      while (i < end && other(cps[i])) ++i;
      while (i < end && newline(i)) ++i;
      out->emplace_back(pos, i);
      pos = i;
      continue;
    }
    // Whitespace. \s*[\r\n]+ ends after the run's last newline, when it has one.
    size_t run_end = pos;
    while (run_end < end && space(cps[run_end])) ++run_end;
    size_t last_newline = run_end;
    for (size_t i = pos; i < run_end; ++i)
      if (newline(i)) last_newline = i;
    if (last_newline < run_end) {
      out->emplace_back(pos, last_newline + 1);
      pos = last_newline + 1;
      continue;
    }
    // \s+(?!\S) leaves the last space to the next piece when a non-space follows; else \s+.
    size_t i = run_end;
    if (i < end && i - pos > 1) --i;
    out->emplace_back(pos, i);
    pos = i;
  }
}

}  // namespace

Result<Tokenizer> Tokenizer::from_gguf(const GgufFile& file) {
  const std::string& path = file.path();
  VC_ASSIGN_OR_RETURN(std::string model, file.get_string("tokenizer.ggml.model"));
  if (model != "gpt2") {
    return Status::not_supported(path + ": tokenizer model " + printable(model) + " is not supported (byte-level BPE 'gpt2' is)");
  }
  Tokenizer tok;
  auto pre = file.get_string("tokenizer.ggml.pre");
  tok.pre_ = pre.ok() ? *pre : "gpt2";
  if (tok.pre_ == "smollm") {
    tok.isolate_digits_ = true;
  } else if (tok.pre_ == "qwen2") {
    tok.qwen2_split_ = true;
  } else if (tok.pre_ != "gpt2" && tok.pre_ != "gpt-2" && tok.pre_ != "default") {
    return Status::not_supported(path + ": pre-tokenizer " + printable(tok.pre_) +
                                 " is not supported (gpt2, smollm, qwen2 are)");
  }

  VC_ASSIGN_OR_RETURN(tok.tokens_, file.get_string_array("tokenizer.ggml.tokens"));
  const size_t n = tok.tokens_.size();
  if (n == 0 || n > (1u << 30)) return Status::corruption(path + ": tokenizer.ggml.tokens has " + std::to_string(n) + " entries");
  tok.types_.assign(n, TokenType::kNormal);
  if (file.find("tokenizer.ggml.token_type") != nullptr) {
    VC_ASSIGN_OR_RETURN(std::vector<int64_t> types, file.get_int_array("tokenizer.ggml.token_type"));
    if (types.size() != n) {
      return Status::corruption(path + ": tokenizer.ggml.token_type has " + std::to_string(types.size()) +
                                " entries for " + std::to_string(n) + " tokens");
    }
    for (size_t i = 0; i < n; ++i) tok.types_[i] = static_cast<TokenType>(types[i]);
  }

  tok.token_bytes_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    tok.token_index_.emplace(tok.tokens_[i], static_cast<int32_t>(i));
    const bool raw = tok.types_[i] == TokenType::kControl || tok.types_[i] == TokenType::kUserDefined;
    if (raw || !byte_level_decode(tok.tokens_[i], &tok.token_bytes_[i])) tok.token_bytes_[i] = tok.tokens_[i];
  }

  const ByteLevelMap& map = byte_level_map();
  for (int b = 0; b < 256; ++b) {
    std::string symbol;
    append_utf8(map.byte_to_cp[b], &symbol);
    // -1 when the vocabulary lacks it (SmolLM2 has no symbol for some control and non-UTF-8 bytes).
    tok.byte_token_[b] = tok.find_token(symbol);
  }

  VC_ASSIGN_OR_RETURN(std::vector<std::string> merges, file.get_string_array("tokenizer.ggml.merges"));
  tok.merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const std::string& m = merges[rank];
    const size_t space_pos = m.find(' ', 1);
    const int32_t left = space_pos == std::string::npos ? -1 : tok.find_token(m.substr(0, space_pos));
    const int32_t right = space_pos == std::string::npos ? -1 : tok.find_token(m.substr(space_pos + 1));
    const int32_t result = space_pos == std::string::npos ? -1 : tok.find_token(m.substr(0, space_pos) + m.substr(space_pos + 1));
    if (left < 0 || right < 0 || result < 0) {
      return Status::corruption(path + ": merge #" + std::to_string(rank) + " " + printable(m) + " refers to tokens not in the vocabulary");
    }
    tok.merges_.emplace(pair_key(left, right), Merge{static_cast<int32_t>(rank), result});
  }

  auto special_id = [&](const char* key, int32_t* out) -> Status {
    if (file.find(key) == nullptr) return Status();
    VC_ASSIGN_OR_RETURN(int64_t id, file.get_int(key));
    if (id < 0 || id >= static_cast<int64_t>(n)) {
      return Status::corruption(path + ": " + key + " = " + std::to_string(id) + " is outside the vocabulary");
    }
    *out = static_cast<int32_t>(id);
    return Status();
  };
  VC_RETURN_IF_ERROR(special_id("tokenizer.ggml.bos_token_id", &tok.bos_id_));
  VC_RETURN_IF_ERROR(special_id("tokenizer.ggml.eos_token_id", &tok.eos_id_));
  int32_t eot = -1;
  VC_RETURN_IF_ERROR(special_id("tokenizer.ggml.eot_token_id", &eot));
  if (file.find("tokenizer.ggml.add_bos_token") != nullptr) {
    VC_ASSIGN_OR_RETURN(tok.add_bos_, file.get_bool("tokenizer.ggml.add_bos_token"));
  }

  for (int32_t id : {tok.eos_id_, eot, tok.find_token("<|endoftext|>"), tok.find_token("<|im_end|>"),
                     tok.find_token("<|eot_id|>"), tok.find_token("<end_of_turn>")}) {
    if (id >= 0 && std::find(tok.end_of_generation_.begin(), tok.end_of_generation_.end(), id) == tok.end_of_generation_.end()) {
      tok.end_of_generation_.push_back(id);
    }
  }

  for (size_t i = 0; i < n; ++i) {
    if ((tok.types_[i] == TokenType::kControl || tok.types_[i] == TokenType::kUserDefined) && !tok.tokens_[i].empty()) {
      tok.special_ids_.push_back(static_cast<int32_t>(i));
    }
  }
  std::stable_sort(tok.special_ids_.begin(), tok.special_ids_.end(),
                   [&](int32_t a, int32_t b) { return tok.tokens_[a].size() > tok.tokens_[b].size(); });
  for (int32_t id : tok.special_ids_) tok.special_first_byte_[static_cast<uint8_t>(tok.tokens_[id][0])] = true;
  return tok;
}
int32_t Tokenizer::find_token(const std::string& text) const {
  auto it = token_index_.find(text);
  return it == token_index_.end() ? -1 : it->second;
}

std::vector<std::string_view> Tokenizer::pre_tokenize(std::string_view text) const {
  const std::vector<CodePoint> cps = decode_utf8(text);
  std::vector<std::pair<size_t, size_t>> words;
  size_t begin = 0;
  if (qwen2_split_) {
    split_qwen2(cps, 0, cps.size(), &words);
    begin = cps.size();
  }
  while (begin < cps.size()) {
    // The digit pre-split of "smollm": each \p{N} code point is its own piece.
    size_t end = begin;
    if (isolate_digits_) {
      if (number(cps[begin])) {
        words.emplace_back(begin, begin + 1);
        begin = begin + 1;
        continue;
      }
      while (end < cps.size() && !number(cps[end])) ++end;
    } else {
      end = cps.size();
    }
    split_gpt2(cps, begin, end, &words);
    begin = end;
  }
  std::vector<std::string_view> out;
  out.reserve(words.size());
  for (auto [first, last] : words) {
    const size_t from = cps[first].offset;
    const size_t to = cps[last - 1].offset + cps[last - 1].length;
    out.push_back(text.substr(from, to - from));
  }
  return out;
}

void Tokenizer::encode_word(std::string_view word, std::vector<int32_t>* out) const {
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
  };
  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t left;
    int32_t right;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  // Bytes without a vocabulary symbol are dropped, and their neighbours may merge: what Hugging
  // Face's BPE does when the model has no unknown token.
  std::vector<Symbol> sym;
  sym.reserve(word.size());
  for (char ch : word) {
    const int32_t id = byte_token_[static_cast<uint8_t>(ch)];
    if (id >= 0) sym.push_back({id, 0, 0});
  }
  const auto n = static_cast<int32_t>(sym.size());
  for (int32_t i = 0; i < n; ++i) {
    sym[i].prev = i - 1;
    sym[i].next = i + 1 < n ? i + 1 : -1;
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto push = [&](int32_t pos) {
    const int32_t next = sym[pos].next;
    if (pos < 0 || next < 0) return;
    auto it = merges_.find(pair_key(sym[pos].id, sym[next].id));
    if (it != merges_.end()) queue.push({it->second.rank, pos, sym[pos].id, sym[next].id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    // Stale entries: the left symbol was merged away or changed, or its neighbour changed.
    const int32_t next = sym[c.pos].next;
    if (sym[c.pos].id != c.left || next < 0 || sym[next].id != c.right) continue;
    sym[c.pos].id = merges_.at(pair_key(c.left, c.right)).result;
    sym[c.pos].next = sym[next].next;
    if (sym[next].next >= 0) sym[sym[next].next].prev = c.pos;
    sym[next].id = -1;
    if (sym[c.pos].prev >= 0) push(sym[c.pos].prev);
    push(c.pos);
  }
  for (int32_t i = n > 0 ? 0 : -1; i >= 0; i = sym[i].next) out->push_back(sym[i].id);
}

void Tokenizer::encode_ordinary(std::string_view text, std::vector<int32_t>* out) const {
  for (std::string_view word : pre_tokenize(text)) {
    encode_word(word, out);
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  std::vector<int32_t> out;
  size_t start = 0;  // start of the ordinary text not yet encoded
  size_t pos = 0;
  while (pos < text.size()) {
    int32_t match = -1;
    if (special_first_byte_[static_cast<uint8_t>(text[pos])]) {
      for (int32_t id : special_ids_) {
        if (types_[id] == TokenType::kControl && !parse_special) continue;
        const std::string& s = tokens_[id];
        if (text.compare(pos, s.size(), s) == 0) {
          match = id;
          break;
        }
      }
    }
    if (match < 0) {
      ++pos;
      continue;
    }
    encode_ordinary(text.substr(start, pos - start), &out);
    out.push_back(match);
    pos += tokens_[match].size();
    start = pos;
  }
  encode_ordinary(text.substr(start), &out);
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool include_control) const {
  std::string out;
  for (int32_t id : ids) {
    if (!include_control && types_[id] == TokenType::kControl) continue;
    out += token_bytes_[id];
  }
  return out;
}

}  // namespace vericache
