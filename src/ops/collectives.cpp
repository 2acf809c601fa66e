#include <algorithm>
#include <cstring>
#include <vector>

#include "algo/allgather.hpp"
#include "core/group_impl.hpp"
#include "ops/run_gather.hpp"
#include "fastgather/ops.hpp"
#include "ops/request.hpp"
#include "ops/validate.hpp"

namespace fastgather {

namespace {

algo::GatherCall gather_call(const TensorView& input, const AllGatherOptions& options) {
  algo::GatherCall call;
  call.op = algo::OpCode::kAllGather;
  call.dtype = static_cast<uint32_t>(input.dtype);
  call.input = static_cast<const std::byte*>(input.data);
  call.bytes = input.nbytes();
  call.schedule = options.schedule;
  return call;
}

// An uneven all-gather: block m of sizes[m] bytes lands at landing(m).
// The list of sizes is in the header (its hash), so members that disagree
// on it get a mismatch.
engine::Task<Status> gather_uneven(Group& group, const TensorView& input, std::vector<size_t> sizes,
                                   algo::FunctionRef<std::byte*(int)> landing, size_t total, AllGatherOptions options) {
  uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a over the sizes
  for (size_t b : sizes) {
    for (int i = 0; i < 8; ++i) hash = (hash ^ ((b >> (8 * i)) & 0xff)) * 0x100000001b3ull;
  }
  algo::GatherCall call = gather_call(input, options);
  call.op = algo::OpCode::kAllGatherV;
  call.bytes = *std::max_element(sizes.begin(), sizes.end());
  call.sizes = sizes.data();
  call.aux = hash;
  call.landing = &landing;
  call.copy_in = &impl_of(group)->copy_in;
  call.stream_out = algo::streams_out(total, impl_of(group)->settings);
  auto sink = [&](int member, size_t off, const std::byte* src, size_t len) {
    std::byte* dst = landing(member) + off;
    if (src != dst) algo::copy_out(dst, src, len, call.stream_out);
  };
  co_return co_await ops::run_gather(group, call, ops::plan_for(group, call), sink, options.stats);
}

// The ops as coroutines over references to their arguments: the blocking
// calls' own, or a request's copies (ops::call and ops::start, request.hpp).
engine::Task<Status> all_gather_op(Group& group, const TensorView& input, const TensorView& output,
                                   AllGatherOptions options) {
  constexpr const char* kOp = "all_gather";
  if (Status s = ops::need_data(group, kOp, "input", input); !s.ok()) co_return s;
  if (Status s = ops::need_data(group, kOp, "output", output); !s.ok()) co_return s;
  const size_t bytes = input.nbytes();
  const size_t n = static_cast<size_t>(group.size());
  if (output.dtype != input.dtype) {
    co_return ops::invalid(group, kOp, fmt::format("output is {}, input is {}", dtype_name(output.dtype),
                                                   dtype_name(input.dtype)));
  }
  if (output.nbytes() != bytes * n) {
    co_return ops::invalid(group, kOp, fmt::format("output {} holds {} bytes; {} ranks x {} input bytes need {}",
                                                   output.describe(), output.nbytes(), n, bytes, bytes * n));
  }
  auto* out = static_cast<std::byte*>(output.data);
  const auto* own_slot = out + static_cast<size_t>(group.rank()) * bytes;
  // In place (input is this rank's block of output) is fine; any other overlap is not.
  if (input.data != own_slot && ops::overlaps(input.data, bytes, out, bytes * n)) {
    co_return ops::invalid(group, kOp, "input overlaps output other than as this rank's own block");
  }
  auto landing = [&](int member) -> std::byte* { return out + static_cast<size_t>(member) * bytes; };
  algo::FunctionRef<std::byte*(int)> landing_ref(landing);
  algo::GatherCall call = gather_call(input, options);
  call.landing = &landing_ref;
  call.copy_in = &impl_of(group)->copy_in;
  call.stream_out = algo::streams_out(bytes * n, impl_of(group)->settings);
  auto sink = [&](int member, size_t off, const std::byte* src, size_t len) {
    std::byte* dst = out + static_cast<size_t>(member) * bytes + off;
    if (dst != src) algo::copy_out(dst, src, len, call.stream_out);
  };
  co_return co_await ops::run_gather(group, call, ops::plan_for(group, call), sink, options.stats);
}

engine::Task<Status> all_gather_list_op(Group& group, const TensorView& input, std::span<const TensorView> outputs,
                                        AllGatherOptions options) {
  constexpr const char* kOp = "all_gather(list)";
  if (Status s = ops::need_data(group, kOp, "input", input); !s.ok()) co_return s;
  const size_t bytes = input.nbytes();
  if (outputs.size() != static_cast<size_t>(group.size())) {
    co_return ops::invalid(group, kOp, fmt::format("{} output buffers for {} ranks", outputs.size(), group.size()));
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    const TensorView& o = outputs[i];
    const std::string what = fmt::format("outputs[{}]", i);
    if (Status s = ops::need_data(group, kOp, what.c_str(), o); !s.ok()) co_return s;
    const bool own = i == static_cast<size_t>(group.rank());
    if (o.dtype != input.dtype || (own && o.nbytes() != bytes)) {
      co_return ops::invalid(group, kOp, fmt::format("{} is {} ({} bytes); input is {} ({} bytes){}", what, o.describe(),
                                                     o.nbytes(), input.describe(), bytes, own ? ", and it is this rank's" : ""));
    }
    if (o.data != input.data && ops::overlaps(o.data, o.nbytes(), input.data, bytes)) {
      co_return ops::invalid(group, kOp, fmt::format("{} overlaps the input", what));
    }
  }
  std::vector<size_t> sizes;
  for (const TensorView& o : outputs) sizes.push_back(o.nbytes());
  if (std::any_of(sizes.begin(), sizes.end(), [&](size_t b) { return b != bytes; })) {
    auto at = [&](int member) -> std::byte* { return static_cast<std::byte*>(outputs[static_cast<size_t>(member)].data); };
    size_t total = 0;
    for (size_t b : sizes) total += b;
    co_return co_await gather_uneven(group, input, std::move(sizes), at, total, options);
  }
  auto landing = [&](int member) -> std::byte* { return static_cast<std::byte*>(outputs[static_cast<size_t>(member)].data); };
  algo::FunctionRef<std::byte*(int)> landing_ref(landing);
  algo::GatherCall call = gather_call(input, options);
  call.landing = &landing_ref;
  call.copy_in = &impl_of(group)->copy_in;
  call.stream_out = algo::streams_out(bytes * outputs.size(), impl_of(group)->settings);
  auto sink = [&](int member, size_t off, const std::byte* src, size_t len) {
    std::byte* dst = static_cast<std::byte*>(outputs[static_cast<size_t>(member)].data) + off;
    if (dst != src) algo::copy_out(dst, src, len, call.stream_out);
  };
  co_return co_await ops::run_gather(group, call, ops::plan_for(group, call), sink, options.stats);
}

engine::Task<Status> all_gather_v_op(Group& group, const TensorView& input, const TensorView& output,
                                     std::span<const int64_t> counts, AllGatherOptions options) {
  constexpr const char* kOp = "all_gather_v";
  if (Status s = ops::need_data(group, kOp, "input", input); !s.ok()) co_return s;
  if (Status s = ops::need_data(group, kOp, "output", output); !s.ok()) co_return s;
  if (counts.size() != static_cast<size_t>(group.size())) {
    co_return ops::invalid(group, kOp, fmt::format("{} counts for {} ranks", counts.size(), group.size()));
  }
  if (output.dtype != input.dtype) {
    co_return ops::invalid(group, kOp, fmt::format("output is {}, input is {}", dtype_name(output.dtype), dtype_name(input.dtype)));
  }
  const size_t es = dtype_size(input.dtype);
  std::vector<size_t> sizes, offsets;
  size_t total = 0;
  for (size_t m = 0; m < counts.size(); ++m) {
    // Each count within what the output could hold: no product overflows.
    if (counts[m] < 0 || static_cast<uint64_t>(counts[m]) > output.nbytes() / std::max<size_t>(es, 1)) {
      co_return ops::invalid(group, kOp, fmt::format("counts[{}] = {} (the output holds {} elements)", m, counts[m],
                                                     output.numel()));
    }
    offsets.push_back(total);
    sizes.push_back(static_cast<size_t>(counts[m]) * es);
    total += sizes.back();
  }
  if (total != output.nbytes()) {
    co_return ops::invalid(group, kOp, fmt::format("output {} holds {} bytes; the counts add up to {}", output.describe(),
                                                   output.nbytes(), total));
  }
  if (input.nbytes() != sizes[static_cast<size_t>(group.rank())]) {
    co_return ops::invalid(group, kOp, fmt::format("input {} holds {} elements; counts[{}] = {}", input.describe(),
                                                   input.numel(), group.rank(), counts[static_cast<size_t>(group.rank())]));
  }
  auto* out = static_cast<std::byte*>(output.data);
  const auto* own_slot = out + offsets[static_cast<size_t>(group.rank())];
  if (input.data != own_slot && ops::overlaps(input.data, input.nbytes(), out, total)) {
    co_return ops::invalid(group, kOp, "input overlaps output other than as this rank's own block");
  }
  auto at = [&](int member) -> std::byte* { return out + offsets[static_cast<size_t>(member)]; };
  co_return co_await gather_uneven(group, input, std::move(sizes), at, total, options);
}

// Within a server the root's bytes are written once (into its ring, or read
// where they lie in its symmetric heap) and every other member copies them
// out; nobody else posts data. Across servers the schedules know only the
// all-gather, so the root's block is picked out of one.
engine::Task<Status> broadcast_op(Group& group, const TensorView& data, int root) {
  constexpr const char* kOp = "broadcast";
  if (Status s = ops::need_data(group, kOp, "tensor", data); !s.ok()) co_return s;
  if (root < 0 || root >= group.size()) {
    co_return ops::invalid(group, kOp, fmt::format("root {} is not a member (group rank 0..{})", root, group.size() - 1));
  }
  const size_t bytes = data.nbytes();
  auto* mine = static_cast<std::byte*>(data.data);
  if (impl_of(group)->net != nullptr) {
    std::vector<std::byte> all(bytes * static_cast<size_t>(group.size()));
    const TensorView out(all.data(), data.dtype, {data.numel() * group.size()});
    if (Status s = co_await all_gather_op(group, data, out, {}); !s.ok()) co_return s;
    if (group.rank() != root && bytes != 0) std::memcpy(mine, all.data() + static_cast<size_t>(root) * bytes, bytes);
    co_return Status::Ok();
  }
  algo::GatherCall call;
  call.op = algo::OpCode::kBroadcast;
  call.dtype = static_cast<uint32_t>(data.dtype);
  call.input = mine;
  call.bytes = bytes;
  call.aux = static_cast<uint64_t>(root);
  call.aux_name = "root";
  call.root = root;
  call.stream_out = algo::streams_out(bytes, impl_of(group)->settings);
  auto sink = [&](int member, size_t off, const std::byte* src, size_t len) {
    if (member == root && mine + off != src) algo::copy_out(mine + off, src, len, call.stream_out);
  };
  co_return co_await ops::run_gather(group, call, ops::plan_for(group, call), sink);
}

engine::Task<Status> barrier_op(Group& group) {
  algo::GatherCall call;
  call.op = algo::OpCode::kBarrier;
  auto sink = [](int, size_t, const std::byte*, size_t) {};
  co_return co_await ops::run_gather(group, call, ops::plan_for(group, call), sink);
}

}  // namespace

Request start_all_gather(Group& group, const TensorView& input, const TensorView& output, const AllGatherOptions& options) {
  return ops::start<all_gather_op>(group, input, output, options);
}

Status all_gather(Group& group, const TensorView& input, const TensorView& output, const AllGatherOptions& options) {
  return ops::call<all_gather_op>(group, input, output, options);
}

Request start_all_gather(Group& group, const TensorView& input, std::span<const TensorView> outputs,
                         const AllGatherOptions& options) {
  return ops::start<all_gather_list_op>(group, input, outputs, options);
}

Status all_gather(Group& group, const TensorView& input, std::span<const TensorView> outputs,
                  const AllGatherOptions& options) {
  return ops::call<all_gather_list_op>(group, input, outputs, options);
}

Request start_all_gather_v(Group& group, const TensorView& input, const TensorView& output,
                           std::span<const int64_t> counts, const AllGatherOptions& options) {
  return ops::start<all_gather_v_op>(group, input, output, counts, options);
}

Status all_gather_v(Group& group, const TensorView& input, const TensorView& output, std::span<const int64_t> counts,
                    const AllGatherOptions& options) {
  return ops::call<all_gather_v_op>(group, input, output, counts, options);
}

Request start_broadcast(Group& group, const TensorView& data, int root) {
  return ops::start<broadcast_op>(group, data, root);
}

Status broadcast(Group& group, const TensorView& data, int root) { return ops::call<broadcast_op>(group, data, root); }

Request start_barrier(Group& group) { return ops::start<barrier_op>(group); }

Status barrier(Group& group) { return ops::call<barrier_op>(group); }

}  // namespace fastgather
