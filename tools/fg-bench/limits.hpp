// The machine's physical limits, measured between the two CPUs the first two
// ranks run on, and the lower-bound model each result row is compared with.
//
// Model (docs/benchmarks.md): an all-gather of S bytes per rank over n ranks
// with private input and output buffers must at least
//   - announce its data to a peer: half a cache-line round trip,
//   - bring (n-1) blocks of S bytes another core just wrote into this core's
//     output: (n-1) * t_peer(S),
//   - place its own block: t_local(S) (a local memcpy),
// so limit(S, n) = rtt/2 + (n-1) * t_peer(S) + t_local(S); with two members
// on the server, rtt/2 + t_both(S), both CPUs copying at once, as they do in
// the all-gather (they share the memory bandwidth). (Across servers, see
// all_gather_limit_us.) This is a
// single-copy bound: our two-copy shared-memory path cannot reach it, and the
// gap is the price of the copy into the ring. The fused op adds the GEMM of
// the gathered matrix at this machine's single-thread OpenBLAS speed.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace fastgather::bench {

struct CopyPoint {
  size_t bytes;
  double us;  // median time of one copy
};

struct Limits {
  double rtt_ns = 0;                // cache-line round trip between the two CPUs
  std::vector<CopyPoint> local;     // memcpy, source and destination private and warm
  std::vector<CopyPoint> peer;      // copy of a buffer the other CPU has just written
  // Both CPUs at once, each copying the other's block and its own into a
  // private output: a 2-rank all-gather's copies, without its steps (the
  // faster of regular and streaming stores).
  std::vector<CopyPoint> both;
  int cpu_a = -1, cpu_b = -1;
  // Several servers: one-way time of one UCX message between two servers
  // (wire.hpp), and what the transport is.
  std::vector<CopyPoint> wire;
  std::string wire_path;
  // Set when the measurement could not finish (its helper process died or
  // stopped answering); what was measured before is kept.
  std::string error;
};

// Forks a helper pinned to cpu_b; this process is pinned to cpu_a meanwhile.
// Neither spins on without the other: the helper dies with this process
// (PR_SET_PDEATHSIG) and gives up when it is gone; this process gives up,
// kills the helper and says so in Limits::error when the helper is gone or
// the measurement outlasts its deadline.
Limits measure_limits(const std::vector<size_t>& sizes, int cpu_a, int cpu_b);

// Time for one copy of `bytes`, interpolated log-log between measured sizes
// (extrapolated linearly in bytes past the largest).
double copy_us(const std::vector<CopyPoint>& points, size_t bytes);
// remote_blocks: blocks a member must receive from other servers. Across
// servers the bound is the larger of the shared-memory part among the
// members on one server and the wire part: one message's one-way time plus
// the other remote blocks at the wire's measured bandwidth.
double all_gather_limit_us(const Limits& l, size_t bytes_per_rank, int ranks, int remote_blocks = 0);

// A sum over `ranks` members of one server, each with `bytes` of input:
// each member reads its 1/n chunk of every peer's input (written by another
// CPU) and its own, and writes the sum of it; an all-reduce then reads every
// peer's summed chunk once more. limit = rtt/2 + (n-1) t_peer(S/n) + t_local(S/n),
// plus rtt/2 + (n-1) t_peer(S/n) for an all-reduce: one CPU's copies, as if
// the others did not share its memory bandwidth (optimistic).
double reduction_limit_us(const Limits& l, size_t bytes_per_rank, int ranks, bool all_reduce);

// One message of `bytes` from a CPU to another: half a round trip and one
// copy of data the sender's CPU has just written (a single copy; "one memcpy
// between two cores"); across servers (the message crosses: `across`), the
// wire's one-way time for it.
double send_recv_limit_us(const Limits& l, size_t bytes, bool across);

std::string format_limits(const Limits& l);

}  // namespace fastgather::bench
