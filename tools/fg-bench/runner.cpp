#include "runner.hpp"

#include <chrono>
#include <cstdio>

#include <fmt/format.h>

namespace fastgather::bench {
namespace {
using Clock = std::chrono::steady_clock;
double us_since(Clock::time_point t0) { return std::chrono::duration<double, std::micro>(Clock::now() - t0).count(); }
}  // namespace

Result<std::vector<int64_t>> Runner::gather_world(int64_t x) {
  Group& w = comm_.world();
  std::vector<int64_t> all(static_cast<size_t>(w.size()));
  Status s = all_gather(w, TensorView(&x, DType::kI64, {1}), TensorView(all.data(), DType::kI64, {w.size()}));
  if (!s.ok()) return s;
  return all;
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
    if (Status s = c.run(i); !s.ok()) return s;
  }
  const double est_us = std::max(us_since(t0) / probe, 0.05);
  int64_t iters = opt_.iters > 0 ? opt_.iters
                                 : std::clamp<int64_t>(static_cast<int64_t>(opt_.time_ms * 1e3 / est_us), 10, 200000);
  auto agreed = gather_world(iters);  // rank 0's count, so every rank runs the same
  if (!agreed.ok()) return agreed.status();
  iters = agreed.value()[0];

  std::vector<double> lat(static_cast<size_t>(iters));
  std::string check_error;
  if (Status s = barrier(world); !s.ok()) return s;
  for (int64_t i = 0; i < iters; ++i) {
    const uint64_t it = static_cast<uint64_t>(i) + 1;
    if (opt_.check) {
      c.prepare(it);
      if (Status s = barrier(group_); !s.ok()) return s;  // ranks start together
    }
    auto start = Clock::now();
    Status s = c.run(it);
    lat[static_cast<size_t>(i)] = us_since(start);
    if (!s.ok()) return s;
    if (opt_.check && check_error.empty()) check_error = c.verify(it);
  }

  Row row;
  row.op = c.op;
  row.impl = c.impl;
  row.m = c.m;
  row.dtype = c.dtype;
  row.bytes_per_rank = c.bytes_per_rank;
  row.world = world.size();
  row.group_size = group_.size();
  row.iters = static_cast<size_t>(iters);

  // Slowest rank per iteration: every rank's latencies, gathered.
  std::vector<double> all(lat.size() * static_cast<size_t>(world.size()));
  if (Status s = all_gather(world, TensorView(lat.data(), DType::kF64, {iters}),
                            TensorView(all.data(), DType::kF64, {iters * world.size()}));
      !s.ok()) {
    return s;
  }
  std::vector<std::vector<double>> per_rank;
  for (int r = 0; r < world.size(); ++r) per_rank.emplace_back(all.begin() + r * iters, all.begin() + (r + 1) * iters);
  row.lat = summarize(slowest_per_iteration(per_rank));
  row.algbw_gbs = algbw_gbs(static_cast<double>(row.bytes_per_rank), row.group_size, row.lat.avg);
  row.busbw_gbs = busbw_gbs(static_cast<double>(row.bytes_per_rank), row.group_size, row.lat.avg);

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
