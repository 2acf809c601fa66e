// fastgather as a torch.distributed backend (torch 2.x: a c10d::Backend for
// the CPU device). One ProcessGroupFastgather per torch group: a fastgather
// Communicator whose world is the group's members, meeting through the store
// torch hands the backend (a PrefixStore of the group), with the ranks that
// share a host found from host identities. Nothing here forks, waits or
// keeps a thread: each op checks its arguments, starts the library's
// requests and returns a Work (work.hpp); progress and completion are the
// library's.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common.hpp"
#include "work.hpp"

namespace fastgather_torch {

class ProcessGroupFastgather : public c10d::Backend {
 public:
  ProcessGroupFastgather(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                         std::chrono::milliseconds timeout, std::optional<fg::Settings> settings);
  ~ProcessGroupFastgather() override;

  const fg::Settings& settings() const { return live().settings(); }
  std::string transport() const { return live().transport(); }
  fg::Group& group() { return live().world(); }
  const std::string getBackendName() const override { return "fastgather"; }
  void release_resources() override;
  // The name all_gather_base_mm takes; registered on first use (it needs the
  // intrusive pointer, which the constructor does not have yet).
  std::string comm_name();
  // The group's handle for the direct operators (direct_ops.cpp): a small
  // integer, never another group's in this process; registered on first use.
  int64_t handle();

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& output_lists,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits, std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;

  // Point-to-point (fg::send, fg::recv, from any source too).
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;

#define FG_UNSUPPORTED(op, ...) c10::intrusive_ptr<c10d::Work> op(__VA_ARGS__) override;
  FG_UNSUPPORTED(allreduce_sparse, std::vector<at::Tensor>&, const c10d::AllreduceOptions&)
#undef FG_UNSUPPORTED

  // Sequence numbers, as gloo keeps them: from 0 when the group is made, one
  // more for every collective submitted (the same on every member of a group
  // whose members agree on the order of collectives).
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return seq_.load(std::memory_order_relaxed); }

  // destroy_process_group: what was started completes (its callbacks run),
  // then the orderly end.
  void shutdown() override;
  void abort() override;

 private:
  fg::Communicator& live() const;
  c10::intrusive_ptr<FastgatherWork> make_work(c10d::OpType type, std::vector<at::Tensor> result);
  // Every request started. async_op=False (torch waits on the Work at once):
  // the caller's wait drives it, nothing is handed over; else the library's
  // progress thread drives what the caller leaves.
  c10::intrusive_ptr<c10d::Work> submit(const c10::intrusive_ptr<FastgatherWork>& work, bool async_op);

  void check_tensor_gather(const char* op, const at::Tensor& output, const at::Tensor& input) const;
  void add_tensor_gather(FastgatherWork& work, const char* op, const at::Tensor& output, const at::Tensor& input);
  void check_list_gather(const char* op, const std::vector<at::Tensor>& outputs, const at::Tensor& input) const;
  void add_list_gather(FastgatherWork& work, const char* op, const std::vector<at::Tensor>& outputs,
                       const at::Tensor& input);
  // The reduction, once input and output are checked against each other.
  fg::ReduceOp check_reduce_scatter(const char* op, const at::Tensor& output, const at::Tensor& input,
                                    const c10d::ReduceOp& reduce_op) const;
  void add_reduce_scatter(FastgatherWork& work, const at::Tensor& output, const at::Tensor& input, fg::ReduceOp red);
  void check_root(const char* op, int64_t root) const;
  void check_peer(const char* op, int peer) const;
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(at::Tensor& t, const c10d::AllreduceOptions& opts);
  void add_recv(FastgatherWork& work, const at::Tensor& t, int src, int tag);
  // A contiguous buffer for `user` (itself where it is contiguous), copied
  // back into it once the work's requests are done.
  at::Tensor output_buffer(FastgatherWork& work, const at::Tensor& user);

  std::unique_ptr<fg::Communicator> comm_;
  std::string name_;
  int64_t handle_ = -1;
  std::atomic<uint64_t> seq_{0};
};

// The group an hcom name (comm_name) stands for, or a ValueError.
c10::intrusive_ptr<ProcessGroupFastgather> find_group(const std::string& hcom);

// The group a handle (ProcessGroupFastgather::handle) stands for, or a
// ValueError: no such handle, or its group is gone.
c10::intrusive_ptr<ProcessGroupFastgather> group_of_handle(int64_t handle);

}  // namespace fastgather_torch
