// What rank 0 prints and writes: the original's tables, the verdicts, JSON.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runner.hpp"

namespace fastgather::bench {

std::string human_bytes(double bytes);  // 98304 -> "96 KB" (KB = 1024 B, as the original)

// | m | per-rank data | avg latency | effective bandwidth GB/s | median | p99 | busbw |
std::string format_table(const std::string& title, const std::vector<Row>& rows);

struct Verdict {
  size_t bytes_per_rank = 0;
  const Row* standalone = nullptr;
  const Row* fused = nullptr;  // null: no fused row with these bytes
  bool at_least_as_fast() const { return fused != nullptr && standalone->lat.median <= fused->lat.median; }
};
// The verdicts point into both vectors, which must outlive them.
std::vector<Verdict> verdicts(const std::vector<Row>& all_gather_rows, const std::vector<Row>& fused_rows);
std::string format_verdicts(const std::vector<Verdict>& v);

// One table per op: a column per impl (median us), each impl's ratio to the
// best, the limit and fastgather's percentage of it.
// "Is op at least `target`x faster than its `other` implementation?" per
// size, from the medians of the rows of both (empty without an `other` row).
std::string format_speedups(const std::string& op, const std::string& other, double target, const std::vector<Row>& rows);
std::string format_compare(const std::string& op, const std::vector<Row>& rows);
// Where the time of the staged and unfused paths goes, per call.
std::string format_phases(const std::vector<Row>& rows);
// The rows with iterations whose ranks were unevenly placed (Row::uneven_pct),
// with the median of each kind; "" when there are none.
std::string format_placement(const std::vector<Row>& rows);

nlohmann::json row_json(const Row& r);
nlohmann::json report_json(const nlohmann::json& config, const std::vector<Row>& rows);
// Checks the fields every row must carry; returns "" or what is missing.
std::string validate_report_json(const nlohmann::json& j);

// Every --ops name, in the order the tables are printed; the JSON check and
// the option both take them from here.
inline const std::vector<std::string> kOpNames = {"all_gather",     "all_gather_list", "all_gather_matmul",
                                                  "all_reduce",     "reduce_scatter",  "matmul_reduce_scatter",
                                                  "all_to_all",     "send_recv"};

}  // namespace fastgather::bench
