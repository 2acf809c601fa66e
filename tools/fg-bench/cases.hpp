// One benchmarked operation at one size on this rank: the timed call, and
// the untimed preparation and check around it.
#pragma once

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

  std::string op;    // all_gather, all_gather_list, all_gather_matmul
  std::string impl;  // fastgather
  int64_t m = 0;
  DType dtype = DType::kF32;
  size_t bytes_per_rank = 0;
};

struct CaseShape {
  int64_t m;
  int64_t hidden;
  DType dtype;
  int64_t n = 16;  // fused op's output columns
};

std::unique_ptr<Case> make_all_gather(Group& g, const CaseShape& s);
std::unique_ptr<Case> make_all_gather_list(Group& g, const CaseShape& s);
std::unique_ptr<Case> make_all_gather_matmul(Group& g, const CaseShape& s);

}  // namespace fastgather::bench
