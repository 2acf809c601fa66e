#include "runner.hpp"

#include <chrono>
#include <cstdio>

#include <fmt/format.h>

namespace fastgather::bench {
namespace {
using Clock = std::chrono::steady_clock;
double us_since(Clock::time_point t0) { return std::chrono::duration<double, std::micro>(Clock::now() - t0).count(); }
// CLOCK_MONOTONIC: one clock for every process of this host, so ranks' end
// times can be compared.
double now_us() { return std::chrono::duration<double, std::micro>(Clock::now().time_since_epoch()).count(); }
}  // namespace

Result<std::vector<int64_t>> Runner::gather_world(int64_t x) {
  Group& w = comm_.world();
  std::vector<int64_t> all(static_cast<size_t>(w.size()));
  Status s = all_gather(w, TensorView(&x, DType::kI64, {1}), TensorView(all.data(), DType::kI64, {w.size()}));
  if (!s.ok()) return s;
  return all;
}

Result<std::vector<std::vector<double>>> Runner::gather_world(const std::vector<double>& v) {
  Group& w = comm_.world();
  const int64_t n = static_cast<int64_t>(v.size());
  std::vector<double> all(v.size() * static_cast<size_t>(w.size()));
  Status s = all_gather(w, TensorView(v.data(), DType::kF64, {n}),
                        TensorView(all.data(), DType::kF64, {n * w.size()}));
  if (!s.ok()) return s;
  std::vector<std::vector<double>> per_rank;
  for (int r = 0; r < w.size(); ++r) per_rank.emplace_back(all.begin() + r * n, all.begin() + (r + 1) * n);
  return per_rank;
}

Result<Row> Runner::measure(Case& c) {
  Group& world = comm_.world();
  // Warm-up in rounds until rank 0 has spent a tenth of the budget, so the
  // ring has gone round and caches are settled. Collectives must match, so
  // rank 0 decides for everyone after each round.
  auto w0 = Clock::now();
  for (int round = 0; round < 64; ++round) {
    for (int i = 0; i < std::max(opt_.warmup, 1); ++i) {
      if (Status s = c.run(static_cast<uint64_t>(i)); !s.ok()) return s;
    }
    const bool more = opt_.iters == 0 && us_since(w0) < opt_.time_ms * 100;
    auto go_on = gather_world(more ? 1 : 0);
    if (!go_on.ok()) return go_on.status();
    if (go_on.value()[0] == 0) break;
  }
  const int probe = 3;
  auto t0 = Clock::now();
  for (int i = 0; i < probe; ++i) {
    // With -c an iteration also prepares, lines up and checks: time all of
    // it, so that --time-ms bounds a checked run too.
    if (opt_.check) {
      c.prepare(static_cast<uint64_t>(i));
      if (Status s = barrier(group_); !s.ok()) return s;
    }
    if (Status s = c.run(static_cast<uint64_t>(i)); !s.ok()) return s;
    if (opt_.check) (void)c.verify(static_cast<uint64_t>(i));
  }
  const double est_us = std::max(us_since(t0) / probe, 0.05);
  int64_t iters = opt_.iters > 0 ? opt_.iters
                                 : std::clamp<int64_t>(static_cast<int64_t>(opt_.time_ms * 1e3 / est_us), 10, 200000);
  auto agreed = gather_world(iters);  // rank 0's count, so every rank runs the same
  if (!agreed.ok()) return agreed.status();
  iters = agreed.value()[0];

  std::vector<double> pooled, trial_medians, skews;
  std::string check_error;
  c.phase_us.clear();
  uint64_t it = 0;
  for (int trial = 0; trial < std::max(opt_.trials, 1); ++trial) {
    std::vector<double> lat(static_cast<size_t>(iters)), done(static_cast<size_t>(iters));
    if (Status s = barrier(world); !s.ok()) return s;
    for (int64_t i = 0; i < iters; ++i) {
      ++it;
      if (opt_.check) {
        c.prepare(it);
        if (Status s = barrier(group_); !s.ok()) return s;  // ranks start together
      }
      auto start = Clock::now();
      Status s = c.run(it);
      lat[static_cast<size_t>(i)] = us_since(start);
      done[static_cast<size_t>(i)] = now_us();
      if (!s.ok()) return s;
      if (opt_.check && check_error.empty()) check_error = c.verify(it);
    }
    // Slowest rank per iteration, and how far apart the ranks finished.
    auto per_rank = gather_world(lat);
    if (!per_rank.ok()) return per_rank.status();
    auto ends = gather_world(done);
    if (!ends.ok()) return ends.status();
    std::vector<double> slowest = slowest_per_iteration(per_rank.value());
    trial_medians.push_back(summarize(slowest).median);
    pooled.insert(pooled.end(), slowest.begin(), slowest.end());
    for (size_t i = 0; i < static_cast<size_t>(iters); ++i) {
      double lo = 1e300, hi = -1e300;
      for (const auto& r : ends.value()) {
        lo = std::min(lo, r[i]);
        hi = std::max(hi, r[i]);
      }
      skews.push_back(hi - lo);
    }
  }

  Row row;
  row.op = c.op;
  row.impl = c.impl;
  row.m = c.m;
  row.dtype = c.dtype;
  row.bytes_per_rank = c.bytes_per_rank;
  row.world = world.size();
  row.group_size = group_.size();
  row.iters = pooled.size();
  row.trials = std::max(opt_.trials, 1);
  row.lat = summarize(pooled);
  row.trial_median_min = *std::min_element(trial_medians.begin(), trial_medians.end());
  row.trial_median_max = *std::max_element(trial_medians.begin(), trial_medians.end());
  row.skew_us = summarize(skews).avg;
  row.effective_gbs = effective_gbs(static_cast<double>(row.bytes_per_rank), row.lat.avg);
  row.algbw_gbs = algbw_gbs(static_cast<double>(row.bytes_per_rank), row.group_size, row.lat.avg);
  row.busbw_gbs = busbw_gbs(static_cast<double>(row.bytes_per_rank), row.group_size, row.lat.avg);

  // Phases: per call, the slowest rank's average. Every rank takes part.
  std::vector<double> phase_values;
  for (auto& [name, total] : c.phase_us) phase_values.push_back(total / static_cast<double>(pooled.size()));
  auto phases = gather_world(phase_values);
  if (!phases.ok()) return phases.status();
  size_t k = 0;
  for (auto& [name, total] : c.phase_us) {
    double worst = 0;
    for (const auto& r : phases.value()) worst = std::max(worst, k < r.size() ? r[k] : 0.0);
    row.phases_us[name] = worst;
    ++k;
  }

  auto failed = gather_world(check_error.empty() ? 0 : 1);
  if (!failed.ok()) return failed.status();
  if (!check_error.empty()) std::fprintf(stderr, "fg-bench: rank %d: %s\n", comm_.rank(), check_error.c_str());
  if (opt_.check) {
    row.check = "ok";
    for (int64_t f : failed.value()) {
      if (f != 0) row.check = "failed";
    }
  }
  return row;
}

}  // namespace fastgather::bench
