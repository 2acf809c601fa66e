// The rendezvous store a communicator meets through: a key-value store every
// rank of the job reaches. fastgather brings its own (a TCP store hosted by
// rank 0, used when Communicator::create is given none); a framework that
// already has one (PyTorch's c10d::Store) can hand it in instead. The store
// carries only rendezvous keys (job id, segment names, worker addresses),
// never collective data.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "fastgather/status.hpp"

namespace fastgather {

class Store {
 public:
  using Clock = std::chrono::steady_clock;
  virtual ~Store() = default;
  virtual Status set(const std::string& key, const std::string& value) = 0;
  // Blocks until key exists or the deadline passes (kTimeout).
  virtual Result<std::string> get(const std::string& key, Clock::time_point deadline) = 0;
  // Adds delta to the integer at key (0 if absent) and returns the new value.
  virtual Result<int64_t> add(const std::string& key, int64_t delta) = 0;
  // All `count` participants call with the same name; returns when all have.
  Status barrier(const std::string& name, int count, Clock::time_point deadline);
};

}  // namespace fastgather
