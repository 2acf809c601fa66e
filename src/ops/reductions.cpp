// reduce_scatter and all_reduce: the argument checks, the plan and the sums;
// the schedules are algo/reduce.hpp's within a server.
#include <chrono>
#include <cstring>
#include <vector>

#include "algo/reduce.hpp"
#include "algo/across.hpp"
#include "core/group_impl.hpp"
#include "fastgather/ops.hpp"
#include "ops/request.hpp"
#include "ops/run_gather.hpp"
#include "ops/sum.hpp"
#include "ops/validate.hpp"

namespace fastgather {

namespace {

// What both ops check: data where there are bytes, one dtype the reduction serves.
Status check_reduce_args(Group& group, const char* op, const TensorView& input, const TensorView& output,
                         ReduceOp reduction) {
  if (Status s = ops::need_data(group, op, "input", input); !s.ok()) return s;
  if (Status s = ops::need_data(group, op, "output", output); !s.ok()) return s;
  if (output.dtype != input.dtype) {
    return ops::invalid(group, op, fmt::format("output is {}, input is {}", dtype_name(output.dtype), dtype_name(input.dtype)));
  }
  if (static_cast<uint8_t>(reduction) > static_cast<uint8_t>(ReduceOp::kBxor)) {
    return ops::invalid(group, op, fmt::format("reduction {} is none of fastgather::ReduceOp", static_cast<int>(reduction)));
  }
  if (!reducible(reduction, input.dtype)) {
    return {ErrorKind::kUnsupported,
            fmt::format("{}: {} {} of {} is not served (sum, product, min and max take every dtype; avg fp32, fp16, "
                        "bf16 and fp64; band, bor and bxor the integers and bool)",
                        group.describe(), op, to_string(reduction), dtype_name(input.dtype))};
  }
  return Status::Ok();
}

// The reduction a call applies: its header carries it (aux), so members
// that disagree on it get a mismatch.
ops::Reduction reduction_of(const Group& group, const algo::GatherCall& call) {
  return {.op = static_cast<ReduceOp>(call.aux), .dtype = static_cast<DType>(call.dtype), .members = group.size()};
}

// Across servers, one-shot (asked for, or the members are not as many on
// every server): every member's input gathered (the plan's all-gather, its
// header naming the sum), then this member's sums, in member order as
// within a server; n times the bytes of the hierarchical sum moved.
engine::Task<Status> gather_and_sum(Group& group, algo::GatherCall call, std::byte* out, CallStats* stats) {
  const size_t n = static_cast<size_t>(group.size());
  const size_t bytes = call.bytes;
  auto all = Tensor::allocate(DType::kU8, {static_cast<int64_t>(n * bytes)});
  if (!all.ok()) co_return all.status();
  auto* base = static_cast<std::byte*>(all->data());
  auto landing = [&](int member) -> std::byte* { return base + static_cast<size_t>(member) * bytes; };
  algo::FunctionRef<std::byte*(int)> landing_ref(landing);
  call.landing = &landing_ref;
  auto sink = [&](int member, size_t off, const std::byte* src, size_t len) {
    std::byte* dst = landing(member) + off;
    if (dst != src) std::memcpy(dst, src, len);
  };
  // Planned again, now that the call has a landing: the gather's plan
  // depends on one (a relay between servers forwards from where blocks land).
  Status s = co_await ops::run_gather(group, call, ops::plan_for(group, call), sink, stats);
  if (!s.ok()) co_return s;
  const bool scatter = call.op == algo::OpCode::kReduceScatter;
  const size_t first = scatter ? static_cast<size_t>(group.rank()) * (bytes / n) : 0;
  std::vector<const std::byte*> srcs(n);
  for (size_t m = 0; m < n; ++m) srcs[m] = landing(static_cast<int>(m)) + first;
  if (const size_t len = scatter ? bytes / n : bytes; len != 0) {
    reduction_of(group, call).apply(out, srcs.data(), static_cast<int>(n), len);
  }
  co_return Status::Ok();
}

// Across servers, hierarchical (algo/across.hpp): partial sums in fp32
// for fp16/bf16, so that the result is rounded once.
engine::Task<Status> sum_across(Group& group, algo::GatherCall call, const algo::CallPlan& plan, std::byte* out,
                                CallStats* stats) {
  Group::Impl& i = *impl_of(group);
  const ops::Reduction r = reduction_of(group, call);
  auto partial = [&r](std::byte* dst, const std::byte* const* srcs, int n, size_t bytes) {
    r.partial(dst, srcs, n, bytes);
  };
  auto of_partials = [&r, out](size_t offset, const std::byte* const* srcs, int n, size_t bytes) {
    r.of_partials(out + offset, srcs, n, bytes);
  };
  algo::GatherStats st;
  call.stats = &st;
  Status s = co_await ops::explained(i,
                                     algo::sum_across(*i.channel, *i.net, i.shape.topo, call, plan, out,
                                                      {.partial = partial,
                                                       .of_partials = of_partials,
                                                       .widen = r.widening(),
                                                       .work = &i.sum_work}),
                                     st);
  if (stats != nullptr) {
    *stats = {};
    stats->schedule = plan.schedule;
    stats->protocol = algo::protocol_name(plan.protocol);
    stats->piece_bytes = plan.piece;
    stats->intra_ns = st.intra_ns;
    stats->inter_ns = st.inter_ns;
  }
  co_return s;
}

engine::Task<Status> run_reduce(Group& group, algo::GatherCall call, std::byte* out, CallStats* stats) {
  Group::Impl& i = *impl_of(group);
  const algo::CallPlan plan = ops::plan_for(group, call);
  const bool across = i.net != nullptr && !plan.over_steps;
  if (across && plan.gathers_inputs) co_return co_await gather_and_sum(group, call, out, stats);
  if (across) co_return co_await sum_across(group, call, plan, out, stats);
  const ops::Reduction r = reduction_of(group, call);
  auto sum = [&r, out](size_t offset, const std::byte* const* srcs, int n, size_t bytes) {
    r.apply(out + offset, srcs, n, bytes);
  };
  const auto t0 = stats != nullptr ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  Status s;
  if (plan.over_steps) s = co_await ops::over_steps(i, algo::reduce(*i.steps, call, plan, out, sum));
  else s = co_await algo::reduce(*i.channel, call, plan, out, sum);
  if (stats != nullptr) {
    *stats = {};
    stats->schedule = plan.schedule;
    stats->protocol = algo::protocol_name(plan.protocol);
    stats->piece_bytes = plan.piece;
    // Over the steps between servers, all of it is the servers' time.
    const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    (plan.over_steps ? stats->inter_ns : stats->intra_ns) = ns;
  }
  co_return s;
}

algo::GatherCall reduce_call(algo::OpCode op, const TensorView& input, const ReduceOptions& options) {
  algo::GatherCall call;
  call.op = op;
  call.dtype = static_cast<uint32_t>(input.dtype);
  call.input = static_cast<const std::byte*>(input.data);
  call.bytes = input.nbytes();
  call.align = dtype_size(input.dtype);
  call.schedule = options.schedule;
  call.aux = static_cast<uint64_t>(options.op);
  call.aux_name = "reduction";
  return call;
}

engine::Task<Status> reduce_scatter_op(Group& group, const TensorView& input, const TensorView& output,
                                       ReduceOptions options) {
  constexpr const char* kOp = "reduce_scatter";
  if (Status s = check_reduce_args(group, kOp, input, output, options.op); !s.ok()) co_return s;
  const size_t n = static_cast<size_t>(group.size());
  const size_t chunk = output.nbytes();
  if (input.nbytes() != chunk * n) {
    co_return ops::invalid(group, kOp, fmt::format("input {} holds {} bytes; {} ranks x {} output bytes need {}",
                                                   input.describe(), input.nbytes(), n, chunk, chunk * n));
  }
  const auto* own_chunk = static_cast<const std::byte*>(input.data) + static_cast<size_t>(group.rank()) * chunk;
  if (output.data != own_chunk && ops::overlaps(output.data, chunk, input.data, chunk * n)) {
    co_return ops::invalid(group, kOp, "output overlaps input other than as this rank's own chunk");
  }
  co_return co_await run_reduce(group, reduce_call(algo::OpCode::kReduceScatter, input, options),
                                static_cast<std::byte*>(output.data), options.stats);
}

engine::Task<Status> all_reduce_op(Group& group, const TensorView& input, const TensorView& output, ReduceOptions options) {
  constexpr const char* kOp = "all_reduce";
  if (Status s = check_reduce_args(group, kOp, input, output, options.op); !s.ok()) co_return s;
  if (output.nbytes() != input.nbytes()) {
    co_return ops::invalid(group, kOp, fmt::format("output {} holds {} bytes, input {} holds {}", output.describe(),
                                                   output.nbytes(), input.describe(), input.nbytes()));
  }
  if (output.data != input.data && ops::overlaps(output.data, output.nbytes(), input.data, input.nbytes())) {
    co_return ops::invalid(group, kOp, "output overlaps input without being it");
  }
  co_return co_await run_reduce(group, reduce_call(algo::OpCode::kAllReduce, input, options),
                                static_cast<std::byte*>(output.data), options.stats);
}

// The all_reduce, its result kept by the root alone.
engine::Task<Status> reduce_op(Group& group, const TensorView& data, int root, ReduceOptions options) {
  constexpr const char* kOp = "reduce";
  if (Status s = check_reduce_args(group, kOp, data, data, options.op); !s.ok()) co_return s;
  if (root < 0 || root >= group.size()) {
    co_return ops::invalid(group, kOp, fmt::format("root {} is not a member (group rank 0..{})", root, group.size() - 1));
  }
  std::vector<std::byte> discarded(group.rank() == root ? 0 : data.nbytes());
  auto* out = group.rank() == root ? static_cast<std::byte*>(data.data) : discarded.data();
  co_return co_await run_reduce(group, reduce_call(algo::OpCode::kAllReduce, data, options), out, options.stats);
}

}  // namespace

Request start_reduce(Group& group, const TensorView& data, int root, const ReduceOptions& options) {
  return ops::start<reduce_op>(group, data, root, options);
}

Status reduce(Group& group, const TensorView& data, int root, const ReduceOptions& options) {
  return ops::call<reduce_op>(group, data, root, options);
}

Request start_reduce_scatter(Group& group, const TensorView& input, const TensorView& output, const ReduceOptions& options) {
  return ops::start<reduce_scatter_op>(group, input, output, options);
}

Status reduce_scatter(Group& group, const TensorView& input, const TensorView& output, const ReduceOptions& options) {
  return ops::call<reduce_scatter_op>(group, input, output, options);
}

Request start_all_reduce(Group& group, const TensorView& input, const TensorView& output, const ReduceOptions& options) {
  return ops::start<all_reduce_op>(group, input, output, options);
}

Status all_reduce(Group& group, const TensorView& input, const TensorView& output, const ReduceOptions& options) {
  return ops::call<all_reduce_op>(group, input, output, options);
}

}  // namespace fastgather
