// Collectives on a Group. Every member calls the same op with matching
// sizes and dtypes; a disagreement is an ErrorKind::kMismatch on every member.
// Within a server the group stays usable after a mismatch; a group that spans
// servers stays failed after any error (messages may still be in flight).
#pragma once

#include <optional>
#include <span>

#include "fastgather/communicator.hpp"
#include "fastgather/status.hpp"
#include "fastgather/tensor.hpp"

namespace fastgather {

enum class AllGatherAlgorithm {
  kAuto,  // by size: inline in the synchronisation line (<= 32 B), else one-shot;
          // across servers, direct for small messages and hierarchical for large
  kRing,  // the classic ring: n-1 steps, each forwarding one block; one server only
  // Across servers (within one server both mean the one-shot):
  kDirect,        // every member sends its block to every member on other servers
  kHierarchical,  // gather within servers, leaders exchange, relay within servers
};
// The schedule a call ran.
enum class CallSchedule { kNone, kOneShot, kRing, kDirect, kHierarchical };
const char* to_string(CallSchedule schedule);  // "one-shot", "ring", "direct", "hierarchical"

// Where one call's time went, on this rank.
struct CallStats {
  CallSchedule schedule = CallSchedule::kNone;
  double intra_ns = 0;        // the phase among members on this server (shared memory)
  double inter_ns = 0;        // the rest: waiting for other servers' bytes and relaying them
};

struct AllGatherOptions {
  AllGatherAlgorithm algorithm = AllGatherAlgorithm::kAuto;  // every member must pass the same
  CallStats* stats = nullptr;                                 // filled when set
};

// out holds group.size() inputs back to back, in group-rank order.
Status all_gather(Group& group, const TensorView& input, const TensorView& output, const AllGatherOptions& options = {});

// outputs[i] receives group rank i's input. Each peer's bytes land straight
// in outputs[i]: no staging copy beyond what the contiguous form does.
Status all_gather(Group& group, const TensorView& input, std::span<const TensorView> outputs,
                  const AllGatherOptions& options = {});

struct AllGatherMatmulOptions {
  bool gather_output = true;  // fill gather_out = allgather(x1)
  int gemm_threads = 1;       // OpenBLAS threads for this call
  AllGatherAlgorithm algorithm = AllGatherAlgorithm::kAuto;  // kRing is not offered here
  CallStats* stats = nullptr;
};

// npu_all_gather_base_mm: x1 (m, k) on each rank, x2 (k, n), bias (n) or none.
// output (m*size, n) = allgather(x1) @ x2 + bias, in x1's dtype;
// gather_out (m*size, k) = allgather(x1) when options.gather_output.
// fp32, fp16 and bf16, accumulating in fp32.
Status all_gather_matmul(Group& group, const TensorView& x1, const TensorView& x2,
                         const std::optional<TensorView>& bias, const TensorView& output,
                         const TensorView& gather_out, const AllGatherMatmulOptions& options = {});

// Element-wise dtype conversion between fp32, fp16 and bf16 (round to nearest
// even), vectorised where the CPU allows; the one the fused op uses.
Status convert(const TensorView& src, const TensorView& dst);

// A group barrier through the same channels as the collectives.
Status barrier(Group& group);

}  // namespace fastgather
