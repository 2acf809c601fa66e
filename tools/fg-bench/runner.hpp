// Times a Case (or several side by side) on every rank: warm-up, an
// iteration count agreed across ranks from a time budget, per-iteration
// latencies reduced to the slowest rank's, and the check verdict of every rank.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "cases.hpp"
#include "stats.hpp"

namespace fastgather::bench {

struct RunOptions {
  int iters = 0;         // 0: from the time budget
  double time_ms = 150;  // measured time per case and trial
  int warmup = 5;
  int trials = 1;        // repeated measurements, pooled
  bool check = false;
  bool rewrite_inputs = false;  // Case::rewrite before each timed call (untimed)
};

struct Row {
  std::string op, impl;
  int64_t m = 0;
  DType dtype = DType::kF32;
  size_t bytes_per_rank = 0;
  int world = 0, group_size = 0;
  size_t iters = 0;
  Stats lat;  // microseconds, slowest rank per iteration
  double effective_gbs = 0, algbw_gbs = 0, busbw_gbs = 0;
  std::string check = "off";  // ok, off, failed
  int trials = 1;
  double trial_median_min = 0, trial_median_max = 0;  // spread of the trials' medians
  double skew_us = 0;        // mean over iterations of (last rank done - first rank done)
  double limit_us = 0;       // lower bound from the machine's limits (0: not measured)
  double pct_of_limit = 0;   // 100 * limit / median
  // Iterations whose ranks were unevenly placed when the call ended (some
  // CPU held more of its host's ranks than its share: evenly_placed), in %,
  // and the median latency of each kind (0: none of that kind).
  double uneven_pct = 0, median_even_us = 0, median_uneven_us = 0;
  // Rank 0's time in Runner::settle after the warm-up and before each trial:
  // untimed calls, one round of them where the ranks were evenly placed, more
  // while they were not (at most three measured times each).
  double settle_ms = 0;
  std::map<std::string, double> phases_us;  // per call, slowest rank
};

class Runner {
 public:
  Runner(Communicator& comm, Group& group, RunOptions options) : comm_(comm), group_(group), opt_(options) {}
  // Cases side by side: each warmed up and counted, then their trials
  // in turn (trial 1 of each, trial 2 of each, ...), so that a slow minute of
  // the host falls on all of them, not on one. A row per case, in order; a
  // case refused with kUnsupported before any byte moved is left out (its
  // status in its place), any other error ends the measurement.
  std::vector<Result<Row>> measure_together(const std::vector<Case*>& cases);

 private:
  struct Measuring {
    Case* c;
    int64_t iters;
    double settle_us = 0;  // spent waiting for an even placement (Runner::settle)
    uint64_t it = 0;
    std::vector<double> pooled, trial_medians, skews;
    std::vector<double> evenly, unevenly;  // the pooled latencies by placement
    std::string check_error;
  };
  // *settle_us: how long of it went to waiting for an even placement.
  Result<int64_t> warm_and_count(Case& c, double* settle_us);
  Result<double> settle(Case& c, uint64_t it);
  Status run_trial(Measuring& p);
  Result<Row> finish(Measuring& p);
  // Every world rank's value of x, in rank order.
  Result<std::vector<int64_t>> gather_world(int64_t x);
  // Every world rank's vector (all of the same length), in rank order.
  Result<std::vector<std::vector<double>>> gather_world(const std::vector<double>& v);
  Communicator& comm_;
  Group& group_;
  RunOptions opt_;
};

}  // namespace fastgather::bench
