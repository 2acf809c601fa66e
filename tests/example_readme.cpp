// The README's example, compiled and run as a test so it stays true
// (test_launch checks that the README shows exactly this program).
#include <algorithm>
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
    // x: this rank's 16 rows of 3072, every value rank+1; w: ones. So row block j of
    // out = allgather(x) @ w is 3072 * (j+1) everywhere (exact in fp16).
    Tensor x = Tensor::empty(DType::kF16, {16, 3072}), w = Tensor::empty(DType::kF16, {3072, 16});
    Tensor x32 = Tensor::empty(DType::kF32, {16, 3072}), w32 = Tensor::empty(DType::kF32, {3072, 16});
    std::fill_n(x32.data_as<float>(), x32.numel(), float(g.rank() + 1));
    std::fill_n(w32.data_as<float>(), w32.numel(), 1.0f);
    if (!convert(x32.view(), x.view()).ok() || !convert(w32.view(), w.view()).ok()) return 1;
    Tensor out = Tensor::empty(DType::kF16, {16 * g.size(), 16});
    Tensor gathered = Tensor::empty(DType::kF16, {16 * g.size(), 3072});
    Status s = all_gather_matmul(g, x.view(), w.view(), std::nullopt, out.view(), gathered.view());
    if (!s.ok()) fprintf(stderr, "%s\n", s.to_string().c_str());
    Tensor got = Tensor::empty(DType::kF32, {16 * g.size(), 16});
    if (!s.ok() || !convert(out.view(), got.view()).ok()) return 1;
    for (int64_t i = 0; i < got.numel(); ++i) {
      if (got.data_as<float>()[i] != 3072.0f * float(i / (16 * 16) + 1)) return 3;  // row i/16, block i/256
    }
    return 0;
  });
}
