#include "runner.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include <fmt/format.h>

#include "host.hpp"

namespace fastgather::bench {
namespace {
using Clock = std::chrono::steady_clock;
double us_since(Clock::time_point t0) { return std::chrono::duration<double, std::micro>(Clock::now() - t0).count(); }
// CLOCK_MONOTONIC: one clock for every process of this host, so ranks' end
// times can be compared.
double now_us() { return std::chrono::duration<double, std::micro>(Clock::now().time_since_epoch()).count(); }

// How long a case waits, after its warm-up and before each trial, for its
// ranks to be evenly placed (evenly_placed), in measured times (--time-ms),
// and at most: a new job's processes may start three on one core and one on
// the other, at half speed, until the kernel moves one, and a woken rank may
// be placed beside its waker later (docs/benchmarks.md); where they stay
// unevenly placed, the rows say how often.
constexpr double kSettleBudgets = 3;
constexpr double kSettleMaxUs = 1e6;

// Per iteration (of every rank's places, encoded): whether the ranks were evenly placed.
std::vector<bool> evenly_placed_per_iteration(const std::vector<std::vector<double>>& per_rank) {
  std::vector<bool> even(per_rank.empty() ? 0 : per_rank[0].size());
  std::vector<Place> at(per_rank.size());
  for (size_t i = 0; i < even.size(); ++i) {
    for (size_t r = 0; r < per_rank.size(); ++r) at[r] = decode(per_rank[r][i]);
    even[i] = evenly_placed(at);
  }
  return even;
}
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

// Timed runs only: calls (untimed, iteration `it`) in rounds while the
// ranks are unevenly placed, for at most kSettleBudgets measured times; one
// round when they are not. Every rank decides alike, from everyone's
// places. Returns how long it took (us).
Result<double> Runner::settle(Case& c, uint64_t it) {
  auto t0 = Clock::now();
  if (opt_.iters != 0) return 0.0;
  const double most_us = std::min(kSettleMaxUs, kSettleBudgets * opt_.time_ms * 1e3);
  std::vector<double> places(static_cast<size_t>(std::max(opt_.warmup, 1)));
  for (;;) {
    for (double& at : places) {
      if (Status s = c.run(it); !s.ok()) return s;
      at = encode(place_now());
    }
    auto all = gather_world(places);
    if (!all.ok()) return all.status();
    const std::vector<bool> even = evenly_placed_per_iteration(all.value());
    const bool more = std::find(even.begin(), even.end(), false) != even.end() && us_since(t0) < most_us;
    auto go_on = gather_world(more ? 1 : 0);  // rank 0's clock decides
    if (!go_on.ok()) return go_on.status();
    if (go_on.value()[0] == 0) return us_since(t0);
  }
}

// Warm-up in rounds until rank 0 has spent a tenth of the budget, so the
// ring has gone round and caches are settled, and until the ranks are
// evenly placed (settle); then an iteration count from a short probe, rank
// 0's for everyone. Collectives must match, so rank 0 decides for everyone
// after each round.
Result<int64_t> Runner::warm_and_count(Case& c, double* settle_us) {
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
  auto settled = settle(c, 0);
  if (!settled.ok()) return settled.status();
  *settle_us = settled.value();
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
  c.phase_us.clear();
  return agreed.value()[0];
}

Status Runner::run_trial(Measuring& p) {
  Group& world = comm_.world();
  Case& c = *p.c;
  std::vector<double> lat(static_cast<size_t>(p.iters)), done(static_cast<size_t>(p.iters)), places(static_cast<size_t>(p.iters));
  // The kernel may have moved ranks since (a wake-up placed on the waker's
  // CPU, say): each trial starts evenly placed where it can.
  const auto phases = c.phase_us;
  auto settled = settle(c, p.it);
  if (!settled.ok()) return settled.status();
  p.settle_us += settled.value();
  c.phase_us = phases;
  if (Status s = barrier(world); !s.ok()) return s;
  for (int64_t i = 0; i < p.iters; ++i) {
    ++p.it;
    if (opt_.check) {
      c.prepare(p.it);
      if (Status s = barrier(group_); !s.ok()) return s;  // ranks start together
    }
    if (opt_.rewrite_inputs) c.rewrite(p.it);
    auto start = Clock::now();
    Status s = c.run(p.it);
    lat[static_cast<size_t>(i)] = us_since(start);
    done[static_cast<size_t>(i)] = now_us();
    places[static_cast<size_t>(i)] = encode(place_now());
    if (!s.ok()) return s;
    if (opt_.check && p.check_error.empty()) p.check_error = c.verify(p.it);
  }
  // Slowest rank per iteration, and how far apart the ranks finished.
  auto per_rank = gather_world(lat);
  if (!per_rank.ok()) return per_rank.status();
  auto ends = gather_world(done);
  if (!ends.ok()) return ends.status();
  auto where = gather_world(places);
  if (!where.ok()) return where.status();
  std::vector<double> slowest = slowest_per_iteration(per_rank.value());
  const std::vector<bool> even = evenly_placed_per_iteration(where.value());
  for (size_t i = 0; i < slowest.size(); ++i) (even[i] ? p.evenly : p.unevenly).push_back(slowest[i]);
  p.trial_medians.push_back(summarize(slowest).median);
  p.pooled.insert(p.pooled.end(), slowest.begin(), slowest.end());
  for (size_t i = 0; i < static_cast<size_t>(p.iters); ++i) {
    double lo = 1e300, hi = -1e300;
    for (const auto& r : ends.value()) {
      lo = std::min(lo, r[i]);
      hi = std::max(hi, r[i]);
    }
    p.skews.push_back(hi - lo);
  }
  return Status::Ok();
}

Result<Row> Runner::finish(Measuring& p) {
  Case& c = *p.c;
  Row row;
  row.op = c.op;
  row.impl = c.impl;
  row.m = c.m;
  row.dtype = c.dtype;
  row.bytes_per_rank = c.bytes_per_rank;
  row.world = comm_.world().size();
  row.group_size = group_.size();
  row.iters = p.pooled.size();
  row.trials = static_cast<int>(p.trial_medians.size());
  row.lat = summarize(p.pooled);
  row.trial_median_min = *std::min_element(p.trial_medians.begin(), p.trial_medians.end());
  row.trial_median_max = *std::max_element(p.trial_medians.begin(), p.trial_medians.end());
  row.skew_us = summarize(p.skews).avg;
  row.settle_ms = p.settle_us / 1e3;
  row.uneven_pct = p.pooled.empty() ? 0 : 100.0 * static_cast<double>(p.unevenly.size()) / static_cast<double>(p.pooled.size());
  if (!p.evenly.empty()) row.median_even_us = summarize(p.evenly).median;
  if (!p.unevenly.empty()) row.median_uneven_us = summarize(p.unevenly).median;
  row.effective_gbs = effective_gbs(static_cast<double>(row.bytes_per_rank), row.lat.avg);
  if (row.op == "send_recv") {
    // As nccl-tests counts sendrecv: the message over the time, both ways.
    row.algbw_gbs = row.busbw_gbs = effective_gbs(static_cast<double>(row.bytes_per_rank), row.lat.avg);
  } else if (row.op == "all_reduce" || row.op == "reduce_scatter" || row.op == "all_to_all") {
    // As nccl-tests counts sums and all-to-all: the per-rank input over the
    // time, and the bytes each rank must move of it.
    const double n = row.group_size;
    row.algbw_gbs = effective_gbs(static_cast<double>(row.bytes_per_rank), row.lat.avg);
    row.busbw_gbs = row.algbw_gbs * (row.op == "all_reduce" ? 2 : 1) * (n - 1) / n;
  } else {
    row.algbw_gbs = algbw_gbs(static_cast<double>(row.bytes_per_rank), row.group_size, row.lat.avg);
    row.busbw_gbs = busbw_gbs(static_cast<double>(row.bytes_per_rank), row.group_size, row.lat.avg);
  }

  // Phases: per call, the slowest rank's average. Every rank takes part.
  std::vector<double> phase_values;
  for (auto& [name, total] : c.phase_us) phase_values.push_back(total / static_cast<double>(p.pooled.size()));
  auto phases = gather_world(phase_values);
  if (!phases.ok()) return phases.status();
  size_t k = 0;
  for (auto& [name, total] : c.phase_us) {
    double worst = 0;
    for (const auto& r : phases.value()) worst = std::max(worst, k < r.size() ? r[k] : 0.0);
    row.phases_us[name] = worst;
    ++k;
  }

  auto failed = gather_world(p.check_error.empty() ? 0 : 1);
  if (!failed.ok()) return failed.status();
  if (!p.check_error.empty()) std::fprintf(stderr, "fg-bench: rank %d: %s\n", comm_.rank(), p.check_error.c_str());
  if (opt_.check) {
    row.check = "ok";
    for (int64_t f : failed.value()) {
      if (f != 0) row.check = "failed";
    }
  }
  return row;
}

std::vector<Result<Row>> Runner::measure_together(const std::vector<Case*>& cases) {
  std::vector<Result<Row>> rows(cases.size(), Status{ErrorKind::kSystem, "not measured"});
  // An error that ends the measurement is every case's outcome.
  auto ended = [&](const Status& s) { return std::vector<Result<Row>>(cases.size(), s); };
  std::vector<Measuring> live;
  std::vector<size_t> index;  // live[j] is cases[index[j]]
  for (size_t i = 0; i < cases.size(); ++i) {
    double settle_us = 0;
    auto iters = warm_and_count(*cases[i], &settle_us);
    if (!iters.ok()) {
      // Refused on every rank before any byte moved (kUnsupported): the group
      // is intact and the others go on. Anything else ends the measurement.
      if (iters.status().kind() != ErrorKind::kUnsupported) return ended(iters.status());
      rows[i] = iters.status();
      continue;
    }
    live.push_back(Measuring{.c = cases[i], .iters = iters.value(), .settle_us = settle_us});
    index.push_back(i);
  }
  for (int trial = 0; trial < std::max(opt_.trials, 1); ++trial) {
    for (size_t j = 0; j < live.size(); ++j) {
      Measuring& p = live[j];
      if (live.size() > 1) {
        // The others ran meanwhile: a few calls to bring this one's buffers
        // back into the caches, as its warm-up did (not counted, nor phased).
        const auto phases = p.c->phase_us;
        for (int i = 0; i < std::max(opt_.warmup, 1); ++i) {
          if (Status s = p.c->run(p.it); !s.ok()) return ended(s);
        }
        p.c->phase_us = phases;
      }
      if (Status s = run_trial(p); !s.ok()) return ended(s);
    }
  }
  for (size_t j = 0; j < live.size(); ++j) rows[index[j]] = finish(live[j]);
  return rows;
}

}  // namespace fastgather::bench
