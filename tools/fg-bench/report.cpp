#include "report.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include <fmt/format.h>

namespace fastgather::bench {

std::string human_bytes(double b) {
  const char* units[] = {"B", "KB", "MB", "GB"};
  int u = 0;
  while (b >= 1024 && u < 3) {
    b /= 1024;
    ++u;
  }
  return b == static_cast<int64_t>(b) ? fmt::format("{} {}", static_cast<int64_t>(b), units[u])
                                      : fmt::format("{:.1f} {}", b, units[u]);
}

std::string format_table(const std::string& title, const std::vector<Row>& rows) {
  std::string s = fmt::format("### {}\n\n", title);
  s += "| m | per-rank data | avg latency (ms) | effective bandwidth GB/s | median (ms) | p99 (ms) | algbw GB/s | busbw GB/s | iters | check |\n";
  s += "|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---|\n";
  for (const Row& r : rows) {
    s += fmt::format("| {} | {} | {:.4f} | {:.2f} | {:.4f} | {:.4f} | {:.2f} | {:.2f} | {} | {} |\n", r.m,
                     human_bytes(static_cast<double>(r.bytes_per_rank)), r.lat.avg / 1e3, r.effective_gbs,
                     r.lat.median / 1e3, r.lat.p99 / 1e3, r.algbw_gbs, r.busbw_gbs, r.iters, r.check);
  }
  return s;
}

std::vector<Verdict> verdicts(const std::vector<Row>& ag, const std::vector<Row>& fused) {
  std::vector<Verdict> out;
  for (const Row& a : ag) {
    Verdict v;
    v.bytes_per_rank = a.bytes_per_rank;
    v.standalone = &a;
    for (const Row& f : fused) {
      if (f.bytes_per_rank == a.bytes_per_rank) v.fused = &f;
    }
    out.push_back(v);
  }
  return out;
}

std::string format_verdicts(const std::vector<Verdict>& vs) {
  std::string s = "### Is the standalone all-gather at least as fast as the fused op moving the same bytes? (median)\n\n";
  for (const Verdict& v : vs) {
    if (v.fused == nullptr) {
      s += fmt::format("- {:>7} per rank: no fused row with these bytes\n", human_bytes(static_cast<double>(v.bytes_per_rank)));
      continue;
    }
    s += fmt::format("- {:>7} per rank: all_gather {:.1f} us vs all_gather_matmul {:.1f} us -> {}\n",
                     human_bytes(static_cast<double>(v.bytes_per_rank)), v.standalone->lat.median, v.fused->lat.median,
                     v.at_least_as_fast() ? "yes" : "NO");
  }
  return s;
}

std::string format_speedups(const std::string& op, const std::string& other, double target, const std::vector<Row>& rows) {
  std::map<size_t, std::pair<const Row*, const Row*>> by_size;
  for (const Row& r : rows) {
    if (r.op != op) continue;
    if (r.impl == "fastgather") by_size[r.bytes_per_rank].first = &r;
    if (r.impl == other) by_size[r.bytes_per_rank].second = &r;
  }
  std::string s;
  for (const auto& [bytes, pair] : by_size) {
    const auto [fg, alt] = pair;
    if (fg == nullptr || alt == nullptr) continue;
    const double x = fg->lat.median > 0 ? alt->lat.median / fg->lat.median : 0;
    s += fmt::format("- {:>7}: {} {:.1f} us vs {} {:.1f} us: {:.2f}x -> {}\n", human_bytes(static_cast<double>(bytes)), op,
                     fg->lat.median, other, alt->lat.median, x, x >= target ? "yes" : "NO");
  }
  if (s.empty()) return s;
  return fmt::format("### Is {} at least {:.1f}x faster than {}? (median)\n\n", op, target, other) + s;
}

std::string format_compare(const std::string& op, const std::vector<Row>& rows) {
  std::vector<std::string> impls;
  std::map<size_t, std::map<std::string, const Row*>> by_size;
  for (const Row& r : rows) {
    if (r.op != op) continue;
    if (std::find(impls.begin(), impls.end(), r.impl) == impls.end()) impls.push_back(r.impl);
    by_size[r.bytes_per_rank][r.impl] = &r;
  }
  if (impls.empty()) return {};
  std::string s = fmt::format("### {}: median latency (us) by implementation\n\n| per-rank data |", op);
  for (const auto& i : impls) s += fmt::format(" {} |", i);
  for (const auto& i : impls) s += fmt::format(" {}/best |", i);
  s += " limit (us) | fastgather % of limit |\n|---:|";
  for (size_t i = 0; i < impls.size() * 2 + 2; ++i) s += "---:|";
  s += "\n";
  for (const auto& [bytes, row] : by_size) {
    double best = 1e300;
    for (const auto& [impl, r] : row) best = std::min(best, r->lat.median);
    s += fmt::format("| {} |", human_bytes(static_cast<double>(bytes)));
    for (const auto& i : impls) s += row.count(i) ? fmt::format(" {:.1f} |", row.at(i)->lat.median) : std::string(" - |");
    for (const auto& i : impls) s += row.count(i) ? fmt::format(" {:.2f} |", row.at(i)->lat.median / best) : std::string(" - |");
    const Row* fg = row.count("fastgather") ? row.at("fastgather") : nullptr;
    if (fg != nullptr && fg->limit_us > 0) {
      s += fmt::format(" {:.1f} | {:.0f}% |\n", fg->limit_us, fg->pct_of_limit);
    } else {
      s += " - | - |\n";
    }
  }
  return s;
}

std::string format_phases(const std::vector<Row>& rows) {
  std::string s;
  for (const Row& r : rows) {
    if (r.phases_us.empty()) continue;
    if (s.empty()) s = "### Where the time goes (per call, slowest rank, us)\n\n| op | impl | per-rank data | median | phases |\n|---|---|---:|---:|---|\n";
    double total = 0;
    for (const auto& [name, us] : r.phases_us) total += us;
    std::string ph;
    for (const auto& [name, us] : r.phases_us) {
      ph += fmt::format("{}{} {:.1f} ({:.0f}%)", ph.empty() ? "" : ", ", name, us, total > 0 ? 100.0 * us / total : 0.0);
    }
    s += fmt::format("| {} | {} | {} | {:.1f} | {} |\n", r.op, r.impl, human_bytes(static_cast<double>(r.bytes_per_rank)),
                     r.lat.median, ph);
  }
  return s;
}

std::string format_placement(const std::vector<Row>& rows) {
  std::string s;
  for (const Row& r : rows) {
    if (r.uneven_pct <= 0) continue;
    if (s.empty()) {
      s = "### Placement: rows with iterations whose ranks were unevenly placed\n\n"
          "| op | impl | per-rank data | median | unevenly placed | median there | median evenly placed |\n"
          "|---|---|---:|---:|---:|---:|---:|\n";
    }
    auto us = [](double v) { return v > 0 ? fmt::format("{:.1f}", v) : std::string("-"); };
    s += fmt::format("| {} | {} | {} | {:.1f} | {:.1f}% | {} | {} |\n", r.op, r.impl,
                     human_bytes(static_cast<double>(r.bytes_per_rank)), r.lat.median, r.uneven_pct,
                     us(r.median_uneven_us), us(r.median_even_us));
  }
  if (!s.empty()) {
    s += "\nUnevenly placed: when the call ended, some CPU held more of its host's ranks than ceil(ranks on the host / "
         "cores) (sched_getcpu).\n";
  }
  return s;
}

nlohmann::json row_json(const Row& r) {
  return {
      {"op", r.op},
      {"impl", r.impl},
      {"m", r.m},
      {"dtype", dtype_name(r.dtype)},
      {"bytes_per_rank", r.bytes_per_rank},
      {"world", r.world},
      {"group_size", r.group_size},
      {"iters", r.iters},
      {"avg_us", r.lat.avg},
      {"median_us", r.lat.median},
      {"p99_us", r.lat.p99},
      {"min_us", r.lat.min},
      {"max_us", r.lat.max},
      {"effective_gbs", r.effective_gbs},
      {"algbw_gbs", r.algbw_gbs},
      {"busbw_gbs", r.busbw_gbs},
      {"check", r.check},
      {"trials", r.trials},
      {"trial_median_min_us", r.trial_median_min},
      {"trial_median_max_us", r.trial_median_max},
      {"skew_us", r.skew_us},
      {"limit_us", r.limit_us},
      {"pct_of_limit", r.pct_of_limit},
      {"phases_us", r.phases_us},
      {"uneven_placement_pct", r.uneven_pct},
      {"median_even_us", r.median_even_us},
      {"median_uneven_us", r.median_uneven_us},
      {"settle_ms", r.settle_ms},
  };
}

nlohmann::json report_json(const nlohmann::json& config, const std::vector<Row>& rows) {
  nlohmann::json j = {{"schema", "fastgather-bench/1"}, {"config", config}, {"rows", nlohmann::json::array()}};
  for (const Row& r : rows) j["rows"].push_back(row_json(r));
  return j;
}

std::string validate_report_json(const nlohmann::json& j) {
  // Every row name a case gives itself (a schedule forced names its row).
  static const std::set<std::string> kImpls = {"fastgather", "private", "ring", "staged", "unfused", "mpi",
                                               "direct", "hierarchical", "one-shot", "two-shot"};
  if (!j.is_object() || j.value("schema", "") != "fastgather-bench/1") return "schema is not fastgather-bench/1";
  if (!j.contains("config") || !j["config"].is_object()) return "config missing";
  if (!j.contains("rows") || !j["rows"].is_array()) return "rows missing";
  static const char* kNumbers[] = {"m", "bytes_per_rank", "world", "group_size", "iters", "avg_us", "median_us",
                                   "p99_us", "min_us", "effective_gbs", "algbw_gbs", "busbw_gbs"};
  for (size_t i = 0; i < j["rows"].size(); ++i) {
    const auto& r = j["rows"][i];
    for (const char* f : {"op", "impl", "dtype", "check"}) {
      if (!r.contains(f) || !r[f].is_string()) return fmt::format("row {}: string field '{}' missing", i, f);
    }
    for (const char* f : kNumbers) {
      if (!r.contains(f) || !r[f].is_number()) return fmt::format("row {}: number field '{}' missing", i, f);
    }
    for (const char* f : {"limit_us", "pct_of_limit", "skew_us", "uneven_placement_pct"}) {
      if (!r.contains(f) || !r[f].is_number()) return fmt::format("row {}: number field '{}' missing", i, f);
    }
    const std::string impl = r["impl"];
    if (!kImpls.contains(impl)) return fmt::format("row {}: unknown impl '{}'", i, impl);
    const std::string op = r["op"];
    if (std::find(kOpNames.begin(), kOpNames.end(), op) == kOpNames.end()) {
      return fmt::format("row {}: unknown op '{}'", i, op);
    }
    const std::string check = r["check"];
    if (check != "ok" && check != "off" && check != "failed") return fmt::format("row {}: check '{}'", i, check);
  }
  return {};
}

}  // namespace fastgather::bench
