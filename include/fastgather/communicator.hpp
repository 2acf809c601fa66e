// The communicator: one per process, started without a launcher from rank,
// world size and the master's ip:port. Groups are subsets of its ranks.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fastgather/config.hpp"
#include "fastgather/status.hpp"
#include "fastgather/store.hpp"
#include "fastgather/tensor.hpp"

namespace fastgather {

class Group;

class Communicator {
 public:
  // Collective over all world ranks: connects to (rank 0: hosts) the
  // rendezvous store and builds the world group.
  static Result<std::unique_ptr<Communicator>> create(const Config& config);
  // The same over the caller's store (PyTorch's, say): nothing is listened
  // on, master_addr/master_port are unused. With config.servers == 0 the
  // ranks that share a host are found from their host identities (host
  // name, boot id, network namespace, /dev/shm): shared memory among them,
  // UCX between hosts. Never forks.
  static Result<std::unique_ptr<Communicator>> create(const Config& config, std::shared_ptr<Store> store);
  // Calls finalize() unless it was called.
  ~Communicator();

  // Orderly end, collective like the destructor: requests still in flight
  // complete (or fail on their deadline), UCX endpoints are flushed, the
  // store host waits for every rank's goodbye. Every group, the world
  // included, is gone afterwards. Ok when every group was healthy; else the
  // first error a group had (the job was told: the others' waits end).
  Status finalize();
  // Immediate, from any thread and from a signal handler (it only stores
  // atomics and wakes futexes): every call in flight on this rank ends
  // within ~10 ms with ErrorKind::kAborted, later calls fail at once, and
  // peers waiting on this rank see it gone (kPeerLost). finalize() or the
  // destructor must still be called; they then skip the goodbyes.
  void abort() noexcept;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const;
  int size() const;
  const Config& config() const;
  // What this communicator and its groups follow (Config::settings, or the environment's).
  const Settings& settings() const;
  // How bytes move: "shared memory" on one server; with several, also the
  // UCX transports in use between servers (and whether they are simulated).
  std::string transport() const;
  // Servers that turned out to be this very host (simulated servers): UCX
  // between them is kept to TCP on loopback.
  bool simulated_servers() const;
  Group& world();

  // Collective over the members of `ranks` only (not over the world). The
  // returned group lives as long as the communicator.
  Result<Group*> new_group(std::vector<int> ranks);
  // The original script's layout: tp groups of dp ranks, group k holding
  // ranks k, k+tp, k+2tp, ...; returns the one holding this rank.
  Result<Group*> tp_group_of_dp(int tp, int dp);
  // Frees this rank's side of a group made by new_group/tp_group_of_dp (its
  // shared-memory mapping; across servers, after flushing its UCX
  // endpoints). Not collective; the group must not be used afterwards. The
  // world group lives as long as the communicator.
  Status destroy_group(Group* group);

  struct Impl;

 private:
  explicit Communicator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Members run collectives in the same order. Not thread-safe: one thread
// drives a group (its calls and requests) at a time; different groups may
// run concurrently. Communicator::abort() may come from any thread.
class Group {
 public:
  int rank() const;  // position of this process in ranks()
  int size() const;
  const std::vector<int>& ranks() const;  // world ranks, ascending
  std::string describe() const;           // "group [0,2,4]"

  // A tensor in this group's symmetric heap (this rank's region of it):
  // the group's collectives read it where it is, so a gather from it copies
  // each byte once instead of twice (docs/architecture.md, "Symmetric
  // inputs"). Not collective; freed like any Tensor, and it may outlive the
  // group. kResourceExhausted when this rank's region (FG_SYMMETRIC_BYTES)
  // or /dev/shm is full; kInvalidArgument for a negative or overflowing
  // shape. A group with no heap (one member on this server, or
  // FG_SYMMETRIC_BYTES=0) returns an ordinary Tensor::empty.
  Result<Tensor> empty(DType dtype, std::vector<int64_t> shape);
  // Whether empty() allocates from a symmetric heap.
  bool has_symmetric_heap() const;

  ~Group();
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  struct Impl;  // the library's own

 private:
  friend struct GroupAccess;  // the library's own code, not a user's
  explicit Group(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fastgather
