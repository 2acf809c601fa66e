#include "fastgather/status.hpp"

namespace fastgather {

const char* to_string(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kOk: return "Ok";
    case ErrorKind::kInvalidArgument: return "InvalidArgument";
    case ErrorKind::kMismatch: return "Mismatch";
    case ErrorKind::kTimeout: return "Timeout";
    case ErrorKind::kPeerLost: return "PeerLost";
    case ErrorKind::kSystem: return "System";
    case ErrorKind::kUnsupported: return "Unsupported";
    case ErrorKind::kResourceExhausted: return "ResourceExhausted";
    case ErrorKind::kAborted: return "Aborted";
  }
  return "Unknown";
}

std::string Status::to_string() const {
  if (ok()) return "Ok";
  return std::string(fastgather::to_string(kind_)) + ": " + message_;
}

}  // namespace fastgather
