// Summary statistics over per-iteration latencies, and the nccl-tests
// bandwidth definitions. Header-only so the tests check the same arithmetic.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace fastgather::bench {

struct Stats {
  size_t n = 0;
  double avg = 0, median = 0, p99 = 0, min = 0, max = 0;  // microseconds
};

// Nearest-rank percentile of a sorted sample: the smallest value with at
// least q of the sample at or below it.
inline double percentile_sorted(const std::vector<double>& s, double q) {
  if (s.empty()) return 0;
  size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(s.size())));
  rank = std::clamp<size_t>(rank, 1, s.size());
  return s[rank - 1];
}

inline Stats summarize(std::vector<double> v) {
  Stats s;
  s.n = v.size();
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  s.avg = sum / static_cast<double>(v.size());
  s.min = v.front();
  s.max = v.back();
  s.median = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  s.p99 = percentile_sorted(v, 0.99);
  return s;
}

// Per iteration, the slowest rank's latency: per_rank[r][i] -> out[i].
inline std::vector<double> slowest_per_iteration(const std::vector<std::vector<double>>& per_rank) {
  std::vector<double> out;
  if (per_rank.empty()) return out;
  out = per_rank.front();
  for (const auto& r : per_rank) {
    for (size_t i = 0; i < out.size() && i < r.size(); ++i) out[i] = std::max(out[i], r[i]);
  }
  return out;
}

// nccl-tests: S = total bytes gathered (bytes_per_rank * ranks), algbw = S/t,
// busbw = algbw * (n-1)/n. GB/s with t in microseconds.
// The original script's "effective bandwidth": the bytes one rank
// contributes over the average latency (96 KB / 0.256 ms = 0.38 GB/s).
inline double effective_gbs(double bytes_per_rank, double t_us) { return t_us > 0 ? bytes_per_rank / t_us / 1e3 : 0; }
inline double algbw_gbs(double bytes_per_rank, int ranks, double t_us) {
  return t_us > 0 ? bytes_per_rank * ranks / (t_us * 1e3) : 0;
}
inline double busbw_gbs(double bytes_per_rank, int ranks, double t_us) {
  return ranks > 0 ? algbw_gbs(bytes_per_rank, ranks, t_us) * (ranks - 1) / ranks : 0;
}

}  // namespace fastgather::bench
