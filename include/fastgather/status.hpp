// Errors are values: every fallible call returns a Status (or a Result<T>)
// whose message names the rank, the group and the mismatch.
#pragma once

#include <stdexcept>
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
  kAborted,          // this rank's communicator was aborted (Communicator::abort)
};

const char* to_string(ErrorKind kind);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ErrorKind kind, std::string message) : kind_(kind), message_(std::move(message)) {}
  // With the world rank of the peer the error is about (timed out, lost, disagreed).
  Status(ErrorKind kind, std::string message, int peer) : kind_(kind), message_(std::move(message)), peer_(peer) {}

  static Status Ok() { return {}; }
  bool ok() const { return kind_ == ErrorKind::kOk; }
  explicit operator bool() const { return ok(); }
  ErrorKind kind() const { return kind_; }
  const std::string& message() const { return message_; }
  // World rank of the peer that timed out, died or disagreed; -1 when the
  // error is not about one peer.
  int peer() const { return peer_; }
  // "Mismatch: rank 1 sent 98304 bytes, rank 0 expected 49152"
  std::string to_string() const;

 private:
  ErrorKind kind_ = ErrorKind::kOk;
  std::string message_;
  int peer_ = -1;
};

// Thrown by Result::value() and friends when there is no value: a caller
// that did not check ok() gets the reason, not std::bad_variant_access.
class BadResultAccess : public std::logic_error {
 public:
  explicit BadResultAccess(const Status& s) : std::logic_error("Result has no value: " + s.to_string()), status_(s) {}
  const Status& status() const { return status_; }

 private:
  Status status_;
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
  T& value() & { return checked(); }
  T&& value() && { return std::move(checked()); }
  T* operator->() { return &checked(); }
  T& operator*() & { return checked(); }

 private:
  T& checked() {
    if (!ok()) throw BadResultAccess(std::get<Status>(v_));
    return std::get<T>(v_);
  }
  std::variant<T, Status> v_;
};

}  // namespace fastgather
