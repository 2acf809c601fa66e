// Fused all-gather + matmul (npu_all_gather_base_mm semantics). Each
// member's rows are multiplied as they arrive, straight from the peer's
// shared-memory ring: this rank's own rows while peers still copy in, and
// without a copy at all when gather_output is false.
#include <cblas.h>

#include <cstring>

#include "algo/allgather.hpp"
#include "algo/plan.hpp"
#include "core/group_impl.hpp"
#include "ops/run_gather.hpp"
#include "fastgather/ops.hpp"
#include "ops/convert.hpp"
#include "ops/gemm.hpp"
#include "ops/request.hpp"
#include "ops/validate.hpp"

namespace fastgather {
namespace {

constexpr const char* kOp = "all_gather_matmul";

Status check_args(const Group& g, const TensorView& x1, const TensorView& x2, const std::optional<TensorView>& bias,
                  const TensorView& output, const TensorView& gather_out, bool gather_output) {
  if (Status s = ops::check_matmul_operands(g, kOp, x1, x2); !s.ok()) return s;
  const DType dt = x1.dtype;
  const int64_t m = x1.shape[0], k = x1.shape[1], n = x2.shape[1], w = g.size();
  for (const auto* t : {&x1, &x2, &output}) {
    if (Status s = ops::need_data(g, kOp, t == &x1 ? "x1" : t == &x2 ? "x2" : "output", *t); !s.ok()) return s;
  }
  if (output.dtype != dt || output.shape != std::vector<int64_t>{m * w, n}) {
    return ops::invalid(g, kOp, fmt::format("output is {}, expected {}[{}, {}]", output.describe(), dtype_name(dt), m * w, n));
  }
  if (bias) {
    if (Status s = ops::need_data(g, kOp, "bias", *bias); !s.ok()) return s;
    if (bias->dtype != dt || bias->numel() != n || bias->shape.size() != 1) {
      return ops::invalid(g, kOp, fmt::format("bias is {}, expected {}[{}]", bias->describe(), dtype_name(dt), n));
    }
  }
  if (gather_output) {
    if (Status s = ops::need_data(g, kOp, "gather_out", gather_out); !s.ok()) return s;
    if (gather_out.dtype != dt || gather_out.shape != std::vector<int64_t>{m * w, k}) {
      return ops::invalid(g, kOp, fmt::format("gather_out is {}, expected {}[{}, {}]", gather_out.describe(),
                                              dtype_name(dt), m * w, k));
    }
    if (ops::overlaps(gather_out.data, gather_out.nbytes(), x1.data, x1.nbytes()) ||
        ops::overlaps(gather_out.data, gather_out.nbytes(), output.data, output.nbytes())) {
      return ops::invalid(g, kOp, "gather_out overlaps x1 or output");
    }
  }
  if (ops::overlaps(output.data, output.nbytes(), x1.data, x1.nbytes()) ||
      ops::overlaps(output.data, output.nbytes(), x2.data, x2.nbytes())) {
    return ops::invalid(g, kOp, "output overlaps x1 or x2");
  }
  return Status::Ok();
}

engine::Task<Status> all_gather_matmul_op(Group& group, const TensorView& x1, const TensorView& x2,
                                          const std::optional<TensorView>& bias, const TensorView& output,
                                          const TensorView& gather_out, AllGatherMatmulOptions options) {
  if (Status s = check_args(group, x1, x2, bias, output, gather_out, options.gather_output); !s.ok()) co_return s;
  const DType dt = x1.dtype;
  const size_t elt = dtype_size(dt);
  const size_t m = static_cast<size_t>(x1.shape[0]), k = static_cast<size_t>(x1.shape[1]);
  const size_t n = static_cast<size_t>(x2.shape[1]);
  const size_t row_bytes = k * elt;
  auto& ch = channel_of(group);
  const size_t max_rows = row_bytes == 0 ? 0 : algo::max_piece(ch, row_bytes) / row_bytes;
  if (row_bytes != 0 && max_rows == 0) {
    co_return Status{ErrorKind::kUnsupported,
                     fmt::format("{} on {}: a row of x1 ({} bytes) exceeds the {}-byte step; raise FG_RING_BYTES", kOp,
                                 group.describe(), row_bytes, ch.max_step_bytes())};
  }
  // Where pieces lose to one GEMM call (ops::multiply_whole: x2 beyond half
  // of L2, or few fp32 rows), the rows are gathered first and multiplied in
  // one call of OpenBLAS's sgemm, as the unfused op does: there the packed
  // kernel streams x2 past every few rows, or packs it for few. Not where
  // the gathered rows, which the group then keeps for the next call, would
  // pass the bound the product has.
  const size_t rows_all = m * static_cast<size_t>(group.size());
  const bool whole = ops::multiply_whole(dt, rows_all, k, n) && rows_all * row_bytes <= ops::kWholeMaxBytes;
  const ops::GemmKernel kernel = ops::gemm_kernel(options.gemm_threads, impl_of(group)->settings);
  const bool packed = !whole && kernel != ops::GemmKernel::kOpenBlas;
  if (!packed) ops::set_blas_threads(options.gemm_threads);

  // Rows multiplied at once: a step's worth, or all of them (k = 0 moves
  // nothing; any block size serves).
  const size_t block_rows = whole ? std::max<size_t>(rows_all, 1) : max_rows != 0 ? max_rows : std::max<size_t>(m, 1);
  auto& scratch = impl_of(group)->scratch;
  std::optional<ops::PackedGemm> gemm;
  // OpenBLAS path: fp32 views of B and scratch for A rows and C rows when the dtype is half.
  const bool is_f32 = dt == DType::kF32;
  const float* B = static_cast<const float*>(x2.data);
  float* a_buf = nullptr;
  float* c_buf = nullptr;
  float* bias_f = nullptr;
  if (packed) {
    const size_t need = ops::PackedGemm::scratch_floats(k, n);
    if (scratch.size() < need) scratch.resize(need);
    gemm.emplace(kernel, dt, x2.data, k, n, bias ? bias->data : nullptr, scratch.data());
  } else {
    const size_t need = is_f32 ? 0 : k * n + block_rows * k + block_rows * n + n;
    if (scratch.size() < need) scratch.resize(need);
    if (!is_f32) {
      float* b_buf = scratch.data();
      ops::to_float(dt, x2.data, b_buf, k * n);
      B = b_buf;
      a_buf = b_buf + k * n;
      c_buf = a_buf + block_rows * k;
      // Only when there is a bias: the scratch still holds the last call's.
      if (bias) {
        bias_f = c_buf + block_rows * n;
        ops::to_float(dt, bias->data, bias_f, n);
      }
    } else if (bias) {
      bias_f = static_cast<float*>(bias->data);
    }
  }

  auto* out_bytes = static_cast<std::byte*>(output.data);
  auto* gather_bytes = static_cast<std::byte*>(gather_out.data);
  algo::GatherCall call;
  call.op = algo::OpCode::kAllGatherMatmul;
  call.dtype = static_cast<uint32_t>(dt);
  call.aux = k;
  call.aux_name = "k";
  call.input = static_cast<const std::byte*>(x1.data);
  call.bytes = m * row_bytes;
  call.align = row_bytes == 0 ? 1 : row_bytes;
  call.copy_in = &impl_of(group)->copy_in_fused;
  if (options.schedule == Schedule::kRing) {
    co_return ops::invalid(group, kOp, "the ring schedule is offered for all_gather only");
  }
  call.schedule = options.schedule;
  std::byte* kept = gather_bytes;
  auto landing = [&](int member) -> std::byte* { return kept + static_cast<size_t>(member) * call.bytes; };
  algo::FunctionRef<std::byte*(int)> landing_ref(landing);
  call.landing = &landing_ref;
  // Across servers, blocks from other servers are received into memory
  // before they are multiplied: gather_out when asked for, else a buffer
  // the group keeps. So are blocks the plan reads by single copy.
  const algo::CallPlan plan = ops::plan_for(group, call);
  const bool keep =
      whole || options.gather_output || spans_servers(group) || plan.protocol == algo::Protocol::kSingleCopy;
  if (!options.gather_output && keep) {
    auto& landed = impl_of(group)->landed;
    if (landed.size() < call.bytes * static_cast<size_t>(group.size())) landed.resize(call.bytes * group.size());
    kept = landed.data();
  }
  // Keeping nothing changes no plan but single copy's, which keeps.
  if (!keep) call.landing = nullptr;

  // Multiplies rows [row0, row0+rows) of allgather(x1), readable at src.
  auto multiply = [&](size_t row0, size_t rows, const std::byte* src) {
    if (gemm) return gemm->multiply(src, rows, out_bytes + row0 * n * elt);
    const float* A = reinterpret_cast<const float*>(src);
    float* C = is_f32 ? reinterpret_cast<float*>(out_bytes + row0 * n * elt) : c_buf;
    if (!is_f32) {
      ops::to_float(dt, src, a_buf, rows * k);
      A = a_buf;
    }
    float beta = 0.0f;
    if (bias_f != nullptr) {
      for (size_t r = 0; r < rows; ++r) std::memcpy(C + r * n, bias_f, n * sizeof(float));
      beta = 1.0f;
    }
    if (k == 0 && bias_f == nullptr) std::memset(C, 0, rows * n * sizeof(float));
    if (n != 0 && k != 0) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows), static_cast<int>(n),
                  static_cast<int>(k), 1.0f, A, static_cast<int>(k), B, static_cast<int>(n), beta, C, static_cast<int>(n));
    }
    if (!is_f32) ops::from_float(dt, c_buf, out_bytes + row0 * n * elt, rows * n);
  };

  // The engine's sink for each piece that arrives: keep it, multiply it
  // (whole: once every piece is kept).
  size_t gemm_calls = 0;
  auto sink = [&](int member, size_t off, const std::byte* src, size_t len) {
    const size_t first_row = static_cast<size_t>(member) * m + off / row_bytes;
    if (keep) {
      std::byte* dst = kept + first_row * row_bytes;
      if (dst != src) std::memcpy(dst, src, len);
      src = dst;  // now hot in this core's cache
    }
    if (whole) return;
    // This rank's own rows come as one piece; bound the fp32 scratch by slicing.
    const size_t rows = len / row_bytes;
    for (size_t r = 0; r < rows; r += block_rows) {
      ++gemm_calls;
      multiply(first_row + r, std::min(block_rows, rows - r), src + r * row_bytes);
    }
  };
  Status st = co_await ops::run_gather(group, call, plan, sink, options.stats);
  if (st.ok() && (whole || k == 0)) {
    // Every row now kept (or, k = 0, no bytes moved: the output is still
    // bias, or zero, broadcast over m*size rows).
    for (size_t r = 0; r < rows_all; r += block_rows) {
      ++gemm_calls;
      multiply(r, std::min(block_rows, rows_all - r), k == 0 ? nullptr : kept + r * row_bytes);
    }
  }
  if (options.stats != nullptr) options.stats->gemm_calls = gemm_calls;
  co_return st;
}

}  // namespace

Request start_all_gather_matmul(Group& group, const TensorView& x1, const TensorView& x2,
                                const std::optional<TensorView>& bias, const TensorView& output,
                                const TensorView& gather_out, const AllGatherMatmulOptions& options) {
  return ops::start<all_gather_matmul_op>(group, x1, x2, bias, output, gather_out, options);
}

Status all_gather_matmul(Group& group, const TensorView& x1, const TensorView& x2, const std::optional<TensorView>& bias,
                         const TensorView& output, const TensorView& gather_out, const AllGatherMatmulOptions& options) {
  return ops::call<all_gather_matmul_op>(group, x1, x2, bias, output, gather_out, options);
}

}  // namespace fastgather
