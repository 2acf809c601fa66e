// fg-bench's command-line options (main.cpp parses them).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runner.hpp"

namespace fastgather::bench {

struct Options {
  std::vector<int64_t> ms = {8, 32, 128, 256, 512, 1024, 2048, 4096, 8192};
  int64_t hidden = 3072;
  std::string dtype = "fp32";
  std::string mm_dtype = "fp16";
  int64_t n = 16;
  std::vector<std::string> ops = {"all_gather", "all_gather_list", "all_gather_matmul"};
  RunOptions run;
  std::string json;
  std::string plot;
  std::string command_line;
  bool compare = false;     // staged, unfused and MPI beside fastgather
  bool no_compare = false;
  bool limits_only = false;
  bool no_limits = false;
  bool dv = false;          // data-varying buffers
  std::string input = "symmetric";  // where the ops' inputs live: symmetric (Group::empty) or private
  std::string reduce_op = "sum";    // all_reduce and reduce_scatter: sum, avg, min or max
};

}  // namespace fastgather::bench
