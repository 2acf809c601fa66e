// A program of another project: 2 spawned ranks gather their rank numbers
// and multiply a gathered matrix, checked against the known answer.
#include <fastgather/fastgather.hpp>

#include <cstdio>
#include <cstring>

using namespace fastgather;

int main() {
  std::printf("fastgather %s (header %s)\n", version(), FASTGATHER_VERSION_STRING);
  if (std::strcmp(version(), FASTGATHER_VERSION_STRING) != 0) return 5;
  auto plan = launch_plan_from_env({.tp = 1, .dp = 2});
  if (!plan.ok()) return 2;
  return run_local_ranks(plan.value(), [](const Config& cfg) {
    auto comm = Communicator::create(cfg);
    if (!comm.ok()) return 1;
    Group& g = (*comm)->world();
    float x[2 * 4], w[4 * 1] = {1, 1, 1, 1}, out[4 * 1], gathered[4 * 4];
    for (int i = 0; i < 8; ++i) x[i] = static_cast<float>(cfg.rank + 1);  // rows of rank+1
    Status s = all_gather_matmul(g, TensorView(x, DType::kF32, {2, 4}), TensorView(w, DType::kF32, {4, 1}), std::nullopt,
                                 TensorView(out, DType::kF32, {4, 1}), TensorView(gathered, DType::kF32, {4, 4}));
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", s.to_string().c_str());
      return 3;
    }
    // Rows 0-1 came from rank 0 (1+1+1+1 = 4), rows 2-3 from rank 1 (8).
    return out[0] == 4 && out[1] == 4 && out[2] == 8 && out[3] == 8 ? 0 : 4;
  });
}
