// Collectives on a Group. Every member calls the same op with matching
// sizes and dtypes; a disagreement is an ErrorKind::kMismatch on every member.
// Each op comes in two forms: start_x(...) returns a Request at once (its
// first bytes already posted to the peers), and x(...) is start_x(...).wait().
// A call must complete within the communicator's timeout (Config::timeout),
// counted from its first wait (engine/driver.hpp).
// Within a server the group stays usable after a mismatch; a group that spans
// servers stays failed after any error (messages may still be in flight).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <span>

#include "fastgather/communicator.hpp"
#include "fastgather/reduce_op.hpp"
#include "fastgather/schedule.hpp"
#include "fastgather/status.hpp"
#include "fastgather/tensor.hpp"

namespace fastgather {

// Where one call's time went, and how it ran, on this rank.
struct CallStats {
  Schedule schedule = Schedule::kAuto;  // what ran (kAuto: no call has filled these yet)
  // Among the members on this server: "inline", "copy-in/copy-out" or
  // "single copy" (where single copy fell back, copy-in/copy-out).
  const char* protocol = "";
  size_t piece_bytes = 0;     // bytes per shared-memory step the call was planned with
  double intra_ns = 0;        // the phase among members on this server (shared memory)
  double inter_ns = 0;        // the rest: waiting for other servers' bytes and relaying them
  bool single_copy = false;   // peers' blocks were read straight from their memory (CMA)
  // This rank's block went into the shared-memory ring with streaming stores
  // (learned per size as the faster way here, or Settings::copy_in).
  bool streamed_in = false;
  bool in_place = false;  // some member's block was read where it lies, in its owner's symmetric heap
  // The fused ops: the calls of the GEMM this rank's product took (1 where
  // the op multiplied all its rows at once: matmul_reduce_scatter before
  // sending any, all_gather_matmul once every row was gathered).
  size_t gemm_calls = 0;
};

struct AllGatherOptions {
  Schedule schedule = Schedule::kAuto;  // every member must pass the same
  CallStats* stats = nullptr;           // filled when set
};

// A collective in flight. On one group, requests run in the order they were
// started (the order every member must agree on): a request makes progress
// only once those started before it have completed, and test()/wait() on a
// later one drive the earlier ones first. The tensors given to start_x must
// stay valid, and its inputs unchanged, until the request is complete.
// Like the group, a request is driven by one thread at a time.
// Progress is communicator-wide, as in MPI: while this rank waits in one
// group, its wait loop also drives the requests started on its other groups
// (those no other thread is driving at that moment), so ranks may block on
// group B before completing a request on group A in different orders.
class Request {
 public:
  Request() = default;  // complete, with an Ok status
  Request(Request&&) noexcept;
  Request& operator=(Request&&) noexcept;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  // An incomplete request is completed first: the members stay in step.
  ~Request();

  // Makes progress without blocking; true once complete. A lost peer, the
  // deadline and Communicator::abort() are noticed here too.
  bool test();
  // Blocks until complete; the call's status (the same on every later call).
  Status wait();
  // Blocks until complete or `timeout` has passed, waiting as wait() does
  // (woken when a peer posts); true once complete. Running out is no error:
  // the request stays in flight (its own deadline, Config::timeout, still
  // ends it with one).
  bool wait_for(std::chrono::microseconds timeout);

  // Progress owned by the library. From now on the communicator's progress
  // thread drives this request (and those started before it on its group)
  // whenever nobody else does, once it has been handed over for half a
  // millisecond: it completes while this thread computes, and a thread that
  // waits for it meanwhile takes over at once. test()/wait() stay as they are.
  void drive_in_background();
  // drive_in_background(), and once the request has completed, done(its
  // status) runs on one of the communicator's completion threads: never on
  // a thread that drives requests, so `done` may start requests and wait for
  // them (on their futures, say), and one `done` that blocks holds up no
  // other. Called again, it adds another. finalize() runs what is still to
  // run before it returns (destroy_group starts those of its group); asked
  // for after finalize(), `done` runs on a thread of its own. Never on the
  // calling thread, so the caller may hold a lock that `done` takes.
  // A Request that is no collective's (default-constructed): at once, here.
  // Like test()/wait(), called by one thread at a time.
  void on_complete(std::function<void(const Status&)> done);

  struct State;  // internal

 private:
  friend struct RequestAccess;
  explicit Request(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;
};

// out holds group.size() inputs back to back, in group-rank order.
Request start_all_gather(Group& group, const TensorView& input, const TensorView& output,
                         const AllGatherOptions& options = {});
Status all_gather(Group& group, const TensorView& input, const TensorView& output, const AllGatherOptions& options = {});

// outputs[i] receives group rank i's input. Each peer's bytes land straight
// in outputs[i]: no staging copy beyond what the contiguous form does.
// (start_all_gather keeps its own copy of the list of views.) The outputs
// may differ in size (an uneven all-gather):
// outputs[group.rank()] is the input's, and every member passes the same sizes.
Request start_all_gather(Group& group, const TensorView& input, std::span<const TensorView> outputs,
                         const AllGatherOptions& options = {});
Status all_gather(Group& group, const TensorView& input, std::span<const TensorView> outputs,
                  const AllGatherOptions& options = {});

// Uneven blocks (MPI_Allgatherv): counts[i] elements of
// group rank i (counts[group.rank()] == input.numel()); output holds them
// back to back in group-rank order. Every member passes the same counts.
Request start_all_gather_v(Group& group, const TensorView& input, const TensorView& output,
                           std::span<const int64_t> counts, const AllGatherOptions& options = {});
Status all_gather_v(Group& group, const TensorView& input, const TensorView& output, std::span<const int64_t> counts,
                    const AllGatherOptions& options = {});

struct AllGatherMatmulOptions {
  bool gather_output = true;  // fill gather_out = allgather(x1)
  // 1: the op's own packed single-thread GEMM (where the CPU has AVX2+FMA+F16C,
  // unless FG_FUSED_GEMM=openblas); more: OpenBLAS sgemm with that many threads.
  int gemm_threads = 1;
  Schedule schedule = Schedule::kAuto;  // every member must pass the same; kRing is not offered here
  CallStats* stats = nullptr;
};

// npu_all_gather_base_mm: x1 (m, k) on each rank, x2 (k, n), bias (n) or none.
// output (m*size, n) = allgather(x1) @ x2 + bias, in x1's dtype;
// gather_out (m*size, k) = allgather(x1) when options.gather_output.
// fp32, fp16 and bf16, accumulating in fp32. Rows are multiplied as they
// arrive: the GEMM is the engine's sink for each piece of the gather.
Request start_all_gather_matmul(Group& group, const TensorView& x1, const TensorView& x2,
                                const std::optional<TensorView>& bias, const TensorView& output,
                                const TensorView& gather_out, const AllGatherMatmulOptions& options = {});
Status all_gather_matmul(Group& group, const TensorView& x1, const TensorView& x2,
                         const std::optional<TensorView>& bias, const TensorView& output,
                         const TensorView& gather_out, const AllGatherMatmulOptions& options = {});

struct MatmulReduceScatterOptions {
  // 1: the packed single-thread GEMM (as all_gather_matmul's); more: OpenBLAS
  // sgemm with that many threads.
  int gemm_threads = 1;
  // One server: kOneShot (the only one); across servers: kHierarchical (the
  // only one, with as many members on every server). Every member must pass the same.
  Schedule schedule = Schedule::kAuto;
  CallStats* stats = nullptr;
};

// npu_mm_reduce_scatter_base: x1 (m, k) and x2 (k, n) on each rank, m a
// multiple of group.size(); output (m / size, n) = rows [rank * m / size,
// ...) of the sum over ranks of x1 @ x2, + bias (n, added once) or none.
// fp32, fp16 and bf16; products travel and are summed in fp32 (in rank
// order; across servers each server's ranks, then the servers in order: the
// same bits on every run), rounded once. The rows each peer on this server
// sums are multiplied straight into shared memory, a step at a time, while
// the peers multiply theirs; across servers the partial sums are then
// exchanged as the all_reduce's (algo/across.hpp).
Request start_matmul_reduce_scatter(Group& group, const TensorView& x1, const TensorView& x2,
                                    const std::optional<TensorView>& bias, const TensorView& output,
                                    const MatmulReduceScatterOptions& options = {});
Status matmul_reduce_scatter(Group& group, const TensorView& x1, const TensorView& x2, const std::optional<TensorView>& bias,
                             const TensorView& output, const MatmulReduceScatterOptions& options = {});

// Element-wise dtype conversion between fp32, fp16 and bf16 (round to nearest
// even), vectorised where the CPU allows; the one the fused op uses.
Status convert(const TensorView& src, const TensorView& dst);

// data (the same size and dtype on every member) takes group rank root's
// values on every member. Within a server the root's bytes are copied into
// shared memory once (or read where they lie, for a tensor from
// Group::empty) and each other member copies them out; across servers the
// root's block is taken from an all-gather.
Request start_broadcast(Group& group, const TensorView& data, int root);
Status broadcast(Group& group, const TensorView& data, int root);

// Rooted and personalised exchanges, on the all-gather's schedule: within a
// server each member copies its bytes into shared memory once and each reader
// copies out only its part; across servers a member on another server is sent
// only its part (the root each block of a gather, each member its chunk of a
// scatter and its split of an all_to_all), straight into its output. Every
// member must pass the same root (else kMismatch).
//
// gather: output (group rank root only; ignored elsewhere) holds group.size()
// blocks of input's size, back to back: block m is group rank m's input.
Request start_gather(Group& group, const TensorView& input, const TensorView& output, int root);
Status gather(Group& group, const TensorView& input, const TensorView& output, int root);
// The same into a list of group.size() outputs of input's size (the root's; others pass none).
Request start_gather(Group& group, const TensorView& input, std::span<const TensorView> outputs, int root);
Status gather(Group& group, const TensorView& input, std::span<const TensorView> outputs, int root);
// scatter: input (group rank root only; ignored elsewhere) holds group.size()
// chunks of output's size; every member's output gets chunk group.rank().
Request start_scatter(Group& group, const TensorView& input, const TensorView& output, int root);
Status scatter(Group& group, const TensorView& input, const TensorView& output, int root);
// The same from a list of group.size() inputs of output's size (the root's; others pass none).
Request start_scatter(Group& group, std::span<const TensorView> inputs, const TensorView& output, int root);
Status scatter(Group& group, std::span<const TensorView> inputs, const TensorView& output, int root);
// all_to_all: input holds this member's parts for every member in group-rank
// order, output receives every member's part for this one in group-rank
// order. Without counts the parts are equal (input and output hold the same
// number of elements, a multiple of group.size()); with them, send_counts[j]
// elements go to member j and recv_counts[m] come from member m (every
// member's counts are gathered first, so that a pair that disagrees is
// kInvalidArgument on every member).
Request start_all_to_all(Group& group, const TensorView& input, const TensorView& output,
                         std::span<const int64_t> send_counts = {}, std::span<const int64_t> recv_counts = {});
Status all_to_all(Group& group, const TensorView& input, const TensorView& output,
                  std::span<const int64_t> send_counts = {}, std::span<const int64_t> recv_counts = {});

// Point-to-point (MPI_Send, MPI_Recv): `data` goes from this member to group
// rank `peer`, whose recv of as many bytes with the same tag takes it.
// Messages from one member to another are taken in the order they were
// sent; sends and receives run beside the group's collectives and beside
// each other (each peer and direction in an order of its own), so exchanges
// in any order complete. A send is complete once its bytes are out of
// `data` (the receiver may not have taken them yet: small messages never
// wait for it). A receive of another length or tag than what was sent is
// kMismatch on both sides, and their later transfers that way fail too;
// between servers (one UCX message each) it fails the group, as any error
// there does.
constexpr int kAnySource = -1;
Request start_send(Group& group, const TensorView& data, int peer, int64_t tag = 0);
Status send(Group& group, const TensorView& data, int peer, int64_t tag = 0);
// peer may be kAnySource (a group of at least two ranks): the first message
// with `tag` from any member, on this server or another; *source (when set)
// then says which group rank sent it, once the receive is complete. Between
// servers the tag is matched by its 15-bit fold before the message is taken
// (tags below 32768 never share one); a message whose whole tag then
// disagrees is kMismatch.
Request start_recv(Group& group, const TensorView& data, int peer, int64_t tag = 0, int* source = nullptr);
Status recv(Group& group, const TensorView& data, int peer, int64_t tag = 0, int* source = nullptr);

struct ReduceOptions {
  // all_reduce: kOneShot or kTwoShot (kAuto: by size and members);
  // reduce_scatter: kOneShot. Every member must pass the same.
  Schedule schedule = Schedule::kAuto;
  CallStats* stats = nullptr;  // filled when set
  // The reduction (fastgather/reduce_op.hpp); every member must pass the
  // same (else kMismatch naming it). One the dtype does not serve: kUnsupported.
  ReduceOp op = ReduceOp::kSum;
};

// Reductions (ReduceOptions::op: sum by default), within a server and across
// servers. fp32, fp16 and bf16 (combined in fp32, rounded once), fp64, and
// the integers (wrapping) and bool: reducible() says which reduction serves
// which dtype. Every element is reduced by one member in group-rank order
// (across servers: each server's members in order, then the servers in
// order), whatever order the peers' bytes arrive in: equal inputs give equal
// bits on every run and every member.

// input holds group.size() chunks of output's size, back to back; output =
// the reduction of every member's chunk group.rank(). output may be this rank's
// own chunk of input.
Request start_reduce_scatter(Group& group, const TensorView& input, const TensorView& output,
                             const ReduceOptions& options = {});
Status reduce_scatter(Group& group, const TensorView& input, const TensorView& output, const ReduceOptions& options = {});

// output = the reduction of every member's input (same size and dtype);
// output may be input (in place). Every member gets the same bits.
Request start_all_reduce(Group& group, const TensorView& input, const TensorView& output,
                         const ReduceOptions& options = {});
Status all_reduce(Group& group, const TensorView& input, const TensorView& output, const ReduceOptions& options = {});

// data on group rank root = the reduction of every member's data (the
// all_reduce's schedule and bits); the others' data is left as it was.
Request start_reduce(Group& group, const TensorView& data, int root, const ReduceOptions& options = {});
Status reduce(Group& group, const TensorView& data, int root, const ReduceOptions& options = {});

// A group barrier through the same channels as the collectives.
Request start_barrier(Group& group);
Status barrier(Group& group);

}  // namespace fastgather
