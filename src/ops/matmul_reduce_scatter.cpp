// Fused matmul + reduce-scatter (npu_mm_reduce_scatter_base semantics): each
// rank's x1 @ x2 is reduce-scattered along its rows. The rows each peer sums
// are multiplied straight into this rank's shared-memory ring, a step's worth
// at a time, and this rank's own rows after its post, while the peers make
// theirs: the product never exists whole, and is never copied into the ring.
// Where that is slower than one GEMM call (ops::multiply_whole: fp32 with an
// x2 beyond L2, or few rows), the whole product is made first and sent as a
// reduce-scatter's input, in the same steps. Products travel and are summed
// in fp32, rounded once at the end.
#include <cblas.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "algo/reduce.hpp"
#include "algo/across.hpp"
#include "core/group_impl.hpp"
#include "fastgather/ops.hpp"
#include "ops/convert.hpp"
#include "ops/gemm.hpp"
#include "ops/request.hpp"
#include "ops/run_gather.hpp"
#include "ops/sum.hpp"
#include "ops/validate.hpp"

namespace fastgather {
namespace {

constexpr const char* kOp = "matmul_reduce_scatter";

Status check_args(const Group& g, const TensorView& x1, const TensorView& x2, const std::optional<TensorView>& bias,
                  const TensorView& output) {
  if (Status s = ops::check_matmul_operands(g, kOp, x1, x2); !s.ok()) return s;
  const DType dt = x1.dtype;
  const int64_t m = x1.shape[0], n = x2.shape[1], w = g.size();
  if (m % w != 0) return ops::invalid(g, kOp, fmt::format("x1's {} rows do not split over {} ranks", m, w));
  for (const auto* t : {&x1, &x2, &output}) {
    if (Status s = ops::need_data(g, kOp, t == &x1 ? "x1" : t == &x2 ? "x2" : "output", *t); !s.ok()) return s;
  }
  if (output.dtype != dt || output.shape != std::vector<int64_t>{m / w, n}) {
    return ops::invalid(g, kOp, fmt::format("output is {}, expected {}[{}, {}]", output.describe(), dtype_name(dt), m / w, n));
  }
  if (bias) {
    if (Status s = ops::need_data(g, kOp, "bias", *bias); !s.ok()) return s;
    if (bias->dtype != dt || bias->numel() != n || bias->shape.size() != 1) {
      return ops::invalid(g, kOp, fmt::format("bias is {}, expected {}[{}]", bias->describe(), dtype_name(dt), n));
    }
  }
  for (const TensorView* t : {&x1, &x2}) {
    if (ops::overlaps(output.data, output.nbytes(), t->data, t->nbytes())) {
      return ops::invalid(g, kOp, "output overlaps x1 or x2");
    }
  }
  if (bias && ops::overlaps(output.data, output.nbytes(), bias->data, bias->nbytes())) {
    return ops::invalid(g, kOp, "output overlaps bias");
  }
  return Status::Ok();
}

engine::Task<Status> matmul_reduce_scatter_op(Group& group, const TensorView& x1, const TensorView& x2,
                                              const std::optional<TensorView>& bias, const TensorView& output,
                                              MatmulReduceScatterOptions options) {
  if (Status s = check_args(group, x1, x2, bias, output); !s.ok()) co_return s;
  const DType dt = x1.dtype;
  const size_t elt = dtype_size(dt);
  const size_t m = static_cast<size_t>(x1.shape[0]), k = static_cast<size_t>(x1.shape[1]);
  const size_t n = static_cast<size_t>(x2.shape[1]);
  const size_t w = static_cast<size_t>(group.size());
  const size_t row_f32 = n * sizeof(float);  // a row of the product as it travels

  algo::GatherCall call;
  call.op = algo::OpCode::kMatmulReduceScatter;
  call.dtype = static_cast<uint32_t>(dt);
  call.aux = k;
  call.aux_name = "k";
  call.bytes = m * row_f32;
  call.align = row_f32 == 0 ? 1 : row_f32;
  call.schedule = options.schedule;
  const algo::CallPlan plan = ops::plan_for(group, call);
  if (!plan.error.ok()) co_return plan.error;
  // Rows made or summed at once: a ring piece (across servers the sums come
  // a network piece at a time).
  const size_t piece_rows = row_f32 == 0 ? 0 : std::max(plan.piece, plan.net_piece) / row_f32;

  const size_t chunk_rows = m / w;
  const size_t sum_rows = std::max<size_t>(piece_rows, 1);  // rows one sum is given at most
  const bool whole = ops::multiply_whole(dt, m, k, n);  // in one call of OpenBLAS, in fp32
  const size_t gemm_rows = whole ? m : sum_rows;  // rows one call of the GEMM makes
  // The GEMM: the packed kernel (x2 packed once per call), or OpenBLAS on fp32 copies.
  const ops::GemmKernel kernel = ops::gemm_kernel(options.gemm_threads, impl_of(group)->settings);
  const bool packed = !whole && kernel != ops::GemmKernel::kOpenBlas;
  if (!packed) ops::set_blas_threads(options.gemm_threads);
  auto& scratch = impl_of(group)->scratch;
  const size_t gemm_floats = packed ? ops::PackedGemm::scratch_floats(k, n) : (dt == DType::kF32 ? 0 : k * n + gemm_rows * k);
  // After the GEMM's: the product (whole) or this rank's own piece, the sums
  // before rounding, the bias in fp32.
  const size_t need = gemm_floats + gemm_rows * n + sum_rows * n + n;
  if (scratch.size() < need) scratch.resize(need);
  float* own = scratch.data() + gemm_floats;
  float* sums = own + gemm_rows * n;
  float* bias_f = sums + sum_rows * n;
  if (bias) ops::to_float(dt, bias->data, bias_f, n);
  std::optional<ops::PackedGemm> gemm;
  const float* b_f32 = static_cast<const float*>(x2.data);
  float* a_f32 = nullptr;
  if (packed) {
    gemm.emplace(kernel, dt, x2.data, k, n, nullptr, scratch.data());
  } else if (dt != DType::kF32) {
    ops::to_float(dt, x2.data, scratch.data(), k * n);
    b_f32 = scratch.data();
    a_f32 = scratch.data() + k * n;
  }
  const auto* a = static_cast<const std::byte*>(x1.data);

  // Rows [first, first+rows) of x1 @ x2, in fp32, at dst.
  size_t gemm_calls = 0;
  auto multiply = [&](size_t first, size_t rows, float* dst) {
    ++gemm_calls;
    if (gemm) return gemm->multiply(a + first * k * elt, rows, dst, DType::kF32);
    if (k == 0 || n == 0) return void(std::memset(dst, 0, rows * n * sizeof(float)));
    const float* rows_f32 = reinterpret_cast<const float*>(a + first * k * elt);
    if (a_f32 != nullptr) {
      ops::to_float(dt, a + first * k * elt, a_f32, rows * k);
      rows_f32 = a_f32;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows), static_cast<int>(n), static_cast<int>(k),
                1.0f, rows_f32, static_cast<int>(k), b_f32, static_cast<int>(n), 0.0f, dst, static_cast<int>(n));
  };
  // The rows of member's chunk at offset (in product bytes), made at dst, or
  // copied there from the whole product.
  const auto* product = reinterpret_cast<const std::byte*>(own);
  auto produce = [&](int member, size_t offset, size_t len, std::byte* dst) {
    const size_t first = static_cast<size_t>(member) * chunk_rows * row_f32 + offset;
    if (whole) return void(std::memcpy(dst, product + first, len));
    multiply(first / row_f32, len / row_f32, reinterpret_cast<float*>(dst));
  };
  // The rows at offset of this rank's result: the members' products summed
  // in member order, then the bias, rounded once into the output.
  auto* out = static_cast<std::byte*>(output.data);
  auto sum = [&](size_t offset, const std::byte* const* srcs, int members, size_t bytes) {
    const size_t row0 = offset / row_f32, rows = bytes / row_f32;
    float* to = dt == DType::kF32 ? reinterpret_cast<float*>(out) + row0 * n : sums;
    ops::sum(DType::kF32, reinterpret_cast<std::byte*>(to), srcs, members, bytes);
    if (bias) {
      for (size_t r = 0; r < rows; ++r) {
        for (size_t j = 0; j < n; ++j) to[r * n + j] += bias_f[j];
      }
    }
    if (dt != DType::kF32) ops::from_float(dt, sums, out + row0 * n * elt, rows * n);
  };

  const auto t0 = std::chrono::steady_clock::now();
  if (whole && m != 0) multiply(0, m, own);
  Status s;
  if (w == 1) {  // nobody to tell: the product and the bias
    for (size_t r = 0; r < m; r += sum_rows) {
      const size_t rows = std::min(sum_rows, m - r);
      if (!whole) multiply(r, rows, own);
      const std::byte* src = whole ? product + r * row_f32 : product;
      sum(r * row_f32, &src, 1, rows * row_f32);
    }
  } else if (spans_servers(group)) {
    // Across servers: the product rows made into the server's ring as within
    // one, summed within the server, the partial sums exchanged between
    // servers and summed in server order (algo/across.hpp), then the bias.
    Group::Impl& i = *impl_of(group);
    auto partial = [](std::byte* dst, const std::byte* const* srcs, int members, size_t bytes) {
      ops::sum(DType::kF32, dst, srcs, members, bytes);
    };
    algo::Produce produce_ref(produce);
    algo::GatherStats st;
    call.stats = &st;
    s = co_await ops::explained(i,
                                algo::sum_across(*i.channel, *i.net, i.shape.topo, call, plan, nullptr,
                                                 {.partial = partial, .of_partials = sum, .widen = 1,
                                                  .produce = &produce_ref, .work = &i.sum_work}),
                                st);
  } else if (whole) {
    // The product sent as a reduce-scatter's input: this rank's own rows read
    // where they lie. The steps are the produced pieces' (the plan's), so a
    // member that multiplies a piece at a time keeps in step with this one.
    call.input = product;
    s = co_await algo::reduce(channel_of(group), call, plan, nullptr, sum);
  } else {
    s = co_await algo::reduce_scatter_produced(channel_of(group), call, plan, produce, reinterpret_cast<std::byte*>(own), sum);
  }
  if (options.stats != nullptr) {
    *options.stats = {};
    options.stats->schedule = plan.schedule;
    options.stats->protocol = algo::protocol_name(plan.protocol);
    options.stats->piece_bytes = plan.piece;
    options.stats->gemm_calls = gemm_calls;
    options.stats->intra_ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  }
  co_return s;
}

}  // namespace

Request start_matmul_reduce_scatter(Group& group, const TensorView& x1, const TensorView& x2,
                                    const std::optional<TensorView>& bias, const TensorView& output,
                                    const MatmulReduceScatterOptions& options) {
  return ops::start<matmul_reduce_scatter_op>(group, x1, x2, bias, output, options);
}

Status matmul_reduce_scatter(Group& group, const TensorView& x1, const TensorView& x2, const std::optional<TensorView>& bias,
                             const TensorView& output, const MatmulReduceScatterOptions& options) {
  return ops::call<matmul_reduce_scatter_op>(group, x1, x2, bias, output, options);
}

}  // namespace fastgather
