// Status and Result: how VeriCache reports expected failures.
//
// Every operation that can fail for a reason a user can act on (a missing or corrupt model file,
// a bad option, an exhausted page pool, a plugin that refuses its parameters) returns a Status or
// a Result<T>. The message is one line, names the thing that failed (a file, a key, a plugin) and
// says what is wrong; it is printed to the user as is. Broken invariants inside VeriCache are bugs
// and abort through VC_CHECK (util/check.h) instead.
//
// Thread-safety: Status and Result are plain values; distinct objects may be used from distinct
// threads. No exception is thrown by anything in this header.
#pragma once

#include <cstdlib>
#include <string>
#include <utility>
#include <variant>

namespace vericache {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // the caller passed something unusable (bad option, bad shape, bad token id)
  kNotFound,         // a file, metadata key, tensor or plugin does not exist
  kCorruption,       // a file exists but its content is malformed or truncated
  kNotSupported,     // well-formed input this build cannot handle (unknown tensor type, architecture)
  kIOError,          // the operating system refused a read or write
  kOutOfPages,       // the KV page pool cannot hold the request; back-pressure, not a crash
  kPluginError,      // a compressor plugin failed; the message names the plugin
  kInternal,         // a failure in a library VeriCache calls (libtorch, HDF5) surfaced as a value
};

// Short lowercase name of a code, e.g. "corruption".
const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK

  static Status ok_status() { return Status(); }
  static Status invalid_argument(std::string message) {
    return Status(StatusCode::kInvalidArgument, std::move(message));
  }
  static Status not_found(std::string message) {
    return Status(StatusCode::kNotFound, std::move(message));
  }
  static Status corruption(std::string message) {
    return Status(StatusCode::kCorruption, std::move(message));
  }
  static Status not_supported(std::string message) {
    return Status(StatusCode::kNotSupported, std::move(message));
  }
  static Status io_error(std::string message) {
    return Status(StatusCode::kIOError, std::move(message));
  }
  static Status out_of_pages(std::string message) {
    return Status(StatusCode::kOutOfPages, std::move(message));
  }
  static Status plugin_error(std::string message) {
    return Status(StatusCode::kPluginError, std::move(message));
  }
  static Status internal(std::string message) {
    return Status(StatusCode::kInternal, std::move(message));
  }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  // The one-line, user-facing message ("" when OK).
  const std::string& message() const { return message_; }
  // "<code name>: <message>", or "ok".
  std::string to_string() const;

  // Returns a copy whose message is "<prefix>: <message>"; OK stays OK.
  Status with_context(const std::string& prefix) const;

 private:
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Either a value or a non-OK Status. Accessing value() of a failed Result is a bug and aborts.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : data_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : data_(std::move(status)) {  // NOLINT: implicit by design
    if (std::get<Status>(data_).ok()) std::abort();  // an OK Status carries no value: a bug
  }

  bool ok() const { return std::holds_alternative<T>(data_); }
  // OK when a value is held.
  Status status() const { return ok() ? Status() : std::get<Status>(data_); }

  T& value() & { return checked(); }
  const T& value() const& { return const_cast<Result*>(this)->checked(); }
  T&& value() && { return std::move(checked()); }
  T& operator*() & { return checked(); }
  const T& operator*() const& { return const_cast<Result*>(this)->checked(); }
  T&& operator*() && { return std::move(checked()); }
  T* operator->() { return &checked(); }
  const T* operator->() const { return &const_cast<Result*>(this)->checked(); }

 private:
  T& checked() {
    if (!ok()) std::abort();
    return std::get<T>(data_);
  }
  std::variant<T, Status> data_;
};

}  // namespace vericache

// Returns the Status of `expr` from the enclosing function when it is not OK.
#define VC_RETURN_IF_ERROR(expr)                    \
  do {                                              \
    ::vericache::Status vc_status_ = (expr);        \
    if (!vc_status_.ok()) return vc_status_;        \
  } while (0)

#define VC_CONCAT_INNER_(a, b) a##b
#define VC_CONCAT_(a, b) VC_CONCAT_INNER_(a, b)
// `VC_ASSIGN_OR_RETURN(auto x, make_x());` declares x from a Result or returns its Status.
#define VC_ASSIGN_OR_RETURN(lhs, expr) VC_ASSIGN_OR_RETURN_IMPL_(VC_CONCAT_(vc_result_, __LINE__), lhs, expr)
#define VC_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()
