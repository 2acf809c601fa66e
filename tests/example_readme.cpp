// The README's example, compiled and run as a test so it stays true.
#include <cstdio>
#include <fastgather/fastgather.hpp>
using namespace fastgather;

int main() {
  auto plan = launch_plan_from_env({.tp = 1, .dp = 2});  // TP, DP, SERVER_NUM, ... override
  if (!plan.ok()) return 2;
  return run_local_ranks(plan.value(), [&](const Config& cfg) {
    auto comm = Communicator::create(cfg);
    if (!comm.ok()) return 1;
    Group& g = *(*comm)->tp_group_of_dp(plan.value().tp, plan.value().dp).value();
    Tensor x = Tensor::zeros(DType::kF16, {16, 3072}), w = Tensor::zeros(DType::kF16, {3072, 16});
    Tensor out = Tensor::empty(DType::kF16, {16 * g.size(), 16});
    Tensor gathered = Tensor::empty(DType::kF16, {16 * g.size(), 3072});
    Status s = all_gather_matmul(g, x.view(), w.view(), std::nullopt, out.view(), gathered.view());
    if (!s.ok()) fprintf(stderr, "%s\n", s.to_string().c_str());
    return s.ok() ? 0 : 1;
  });
}
