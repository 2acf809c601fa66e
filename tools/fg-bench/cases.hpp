// One benchmarked operation at one size on this rank: the timed call, and
// the untimed preparation and check around it.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>

#include "fastgather/fastgather.hpp"

namespace fastgather::bench {

class Case {
 public:
  virtual ~Case() = default;
  virtual Status run(uint64_t iteration) = 0;  // timed
  virtual void prepare(uint64_t /*iteration*/) {}  // check mode: new input data
  virtual std::string verify(uint64_t /*iteration*/) { return {}; }  // "" when every byte is right
  // --rewrite-inputs (sums): store to every cache line of the input the next
  // call reads, values unchanged, as the GEMM before a layer's sum leaves it:
  // written by this rank, not yet read by any other.
  virtual void rewrite(uint64_t /*iteration*/) {}
  // Local compute the op cannot avoid (the fused op's GEMM), for the limit model.
  virtual double compute_floor_us() { return 0; }

  std::string op;    // all_gather, all_gather_list, all_gather_matmul, all_reduce, reduce_scatter
  std::string impl;  // fastgather, ring, staged, unfused, mpi
  int64_t m = 0;
  DType dtype = DType::kF32;
  size_t bytes_per_rank = 0;
  // Time spent in each named step of run(), summed over calls (staged, unfused).
  std::map<std::string, double> phase_us;

 protected:
  using Clock = std::chrono::steady_clock;
  // Across servers: the call's server-local and inter-server shares (with
  // one rank on each server, the schedule of one server between them: all
  // of it inter-server).
  void account(const CallStats& st) {
    if (st.schedule != Schedule::kDirect && st.schedule != Schedule::kHierarchical && st.inter_ns == 0) return;
    const std::string sched = to_string(st.schedule);
    phase_us["intra-server"] += st.intra_ns / 1000.0;
    phase_us["inter-server (" + sched + ")"] += st.inter_ns / 1000.0;
  }
  CallStats stats_;
  CallStats* stats_out_ = nullptr;  // &stats_ when the shares are recorded (CaseShape::shares)
  // Adds the time since *t to phase `name` and moves *t to now.
  void lap(const char* name, Clock::time_point* t) {
    const auto now = Clock::now();
    phase_us[name] += std::chrono::duration<double, std::micro>(now - *t).count();
    *t = now;
  }
};

struct CaseShape {
  int64_t m;
  int64_t hidden;
  DType dtype;
  int64_t n = 16;    // fused op's output columns
  int variants = 1;  // --dv: input/output buffer sets cycled per iteration
  // Across servers: record each call's intra-/inter-server shares (two clock
  // reads per call, so not asked for within one server).
  bool shares = false;
  // Inputs from the group's symmetric heap (Group::empty), read in place by
  // the peers; false: ordinary private memory (Tensor::empty).
  bool symmetric = false;
  // all_reduce and reduce_scatter: which reduction (its values checked as exactly as the sums).
  ReduceOp reduce_op = ReduceOp::kSum;
};

std::unique_ptr<Case> make_all_gather(Group& g, const CaseShape& s);
// The same all-gather with a schedule forced: kRing (n-1 steps, one server),
// kDirect or kHierarchical (across servers); impl names the schedule.
std::unique_ptr<Case> make_all_gather_with(Group& g, const CaseShape& s, Schedule schedule);
std::unique_ptr<Case> make_all_gather_list(Group& g, const CaseShape& s);
// The same all-gather with its input in private memory whatever s.symmetric
// says ("private"): what symmetric inputs save.
std::unique_ptr<Case> make_private_all_gather(Group& g, const CaseShape& s);
// What a framework's list form does: gather into a fresh flat temporary, copy
// each block back into its list buffer, synchronise the group per call.
std::unique_ptr<Case> make_staged_all_gather_list(Group& g, const CaseShape& s);
std::unique_ptr<Case> make_all_gather_matmul(Group& g, const CaseShape& s);
// all_gather into gather_out, then one GEMM over the gathered matrix.
std::unique_ptr<Case> make_unfused_all_gather_matmul(Group& g, const CaseShape& s);

// all_to_all of m x hidden per rank (divisible by the group size), equal
// parts: part j of each rank's input goes to rank j.
std::unique_ptr<Case> make_all_to_all(Group& g, const CaseShape& s);

// Each rank sends its m x hidden to the next group rank and receives the
// previous one's (send and recv; two ranks or more).
std::unique_ptr<Case> make_send_recv(Group& g, const CaseShape& s);

// The first wrong byte of an all_to_all's output (parts from members[m], in
// order, each part_bytes), as "" or the words for it.
std::string check_all_to_all(const void* out, size_t part_bytes, const std::vector<int>& members, int me, uint64_t it,
                             const std::string& what);

// Sums (reduce_cases.cpp): input m x hidden elements per rank; all_reduce's
// output as large, reduce_scatter's a group.size()-th of it (m x hidden must
// divide by the group size). Inputs from the heap when s.symmetric.
// A schedule other than kAuto is asked for and names the row (across
// servers: "one-shot", the inputs gathered, beside the hierarchical sum).
std::unique_ptr<Case> make_all_reduce(Group& g, const CaseShape& s, Schedule schedule = Schedule::kAuto);
std::unique_ptr<Case> make_reduce_scatter(Group& g, const CaseShape& s, Schedule schedule = Schedule::kAuto);
// x1 (m * size, hidden) @ x2 (hidden, n) reduce-scattered into (m, n):
// matmul_reduce_scatter, or the whole product's GEMM then reduce_scatter.
// bytes_per_rank: the fp32 product each rank reduce-scatters.
std::unique_ptr<Case> make_matmul_reduce_scatter(Group& g, const CaseShape& s);
std::unique_ptr<Case> make_unfused_matmul_reduce_scatter(Group& g, const CaseShape& s);

}  // namespace fastgather::bench
