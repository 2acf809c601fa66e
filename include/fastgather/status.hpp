// Errors are values: every fallible call returns a Status (or a Result<T>)
// whose message names the rank, the group and the mismatch.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace fastgather {

enum class ErrorKind {
  kOk = 0,
  kInvalidArgument,  // caller passed something malformed on this rank
  kMismatch,         // ranks of one group disagree (sizes, dtypes, k, op)
  kTimeout,          // a peer did not arrive within the communicator's timeout
  kPeerLost,         // a peer process died or aborted its communicator
  kSystem,           // an OS call failed (errno in the message)
  kUnsupported,      // valid request this build or transport cannot serve
  kResourceExhausted,  // not enough of something on this machine (memory, /dev/shm)
};

const char* to_string(ErrorKind kind);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ErrorKind kind, std::string message) : kind_(kind), message_(std::move(message)) {}

  static Status Ok() { return {}; }
  bool ok() const { return kind_ == ErrorKind::kOk; }
  explicit operator bool() const { return ok(); }
  ErrorKind kind() const { return kind_; }
  const std::string& message() const { return message_; }
  // "Mismatch: rank 1 sent 98304 bytes, rank 0 expected 49152"
  std::string to_string() const;

 private:
  ErrorKind kind_ = ErrorKind::kOk;
  std::string message_;
};

// A value or the Status that explains its absence.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}             // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {}      // NOLINT(google-explicit-constructor)
  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &std::get<T>(v_); }
  T& operator*() & { return std::get<T>(v_); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace fastgather
