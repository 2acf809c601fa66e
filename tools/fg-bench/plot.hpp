// Plots through gnuplot: latency and bandwidth against bytes per rank, a
// line per op and implementation, with the machine's limit.
#pragma once

#include <string>
#include <vector>

#include "fastgather/status.hpp"
#include "runner.hpp"

namespace fastgather::bench {

// Writes `png` and the same plot as SVG beside it (extension replaced).
Status plot(const std::vector<Row>& rows, const std::string& png, const std::string& title);

}  // namespace fastgather::bench
