#include <algorithm>
#include <cstring>
#include <vector>

#include "algo/allgather.hpp"
#include "algo/reduce.hpp"
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
engine::Task<Status> gather_uneven(Group& group, const TensorView& input, std::vector<size_t> sizes,
                                   algo::FunctionRef<std::byte*(int)> landing, size_t total, AllGatherOptions options) {
  const bool stream_out = algo::streams_out(total, impl_of(group)->settings);
  auto sink = [&](int member, size_t off, const std::byte* src, size_t len) {
    std::byte* dst = landing(member) + off;
    if (src != dst) algo::copy_out(dst, src, len, stream_out);
  };
  co_return co_await ops::gather_blocks(group, algo::OpCode::kAllGatherV, static_cast<uint32_t>(input.dtype),
                                        static_cast<const std::byte*>(input.data), std::move(sizes), &landing,
                                        stream_out, sink, options.schedule, options.stats);
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
    // Only this rank's own output may be its input: a peer's block landing there
    // would overwrite bytes not yet sent.
    if (!(own && o.data == input.data) && ops::overlaps(o.data, o.nbytes(), input.data, bytes)) {
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
  // Across servers, an all-gather of every member's tensor, unless one
  // member on each server runs the one-server schedule between them.
  if (impl_of(group)->net != nullptr && impl_of(group)->steps == nullptr) {
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

// The part of a piece [off, off+len) of a block that falls in [lo, hi) of
// it, copied to dst + (where it falls - lo).
void take_range(size_t off, const std::byte* src, size_t len, size_t lo, size_t hi, std::byte* dst, bool stream_out) {
  const size_t from = std::max(off, lo), to = std::min(off + len, hi);
  if (from >= to) return;
  std::byte* d = dst + (from - lo);
  const std::byte* s = src + (from - off);
  if (d != s) algo::copy_out(d, s, to - from, stream_out);
}

// A rooted op's root, and the buffer every member passes (`one`).
Status check_root(Group& group, const char* op, int root, const TensorView& one, const char* one_name) {
  if (Status s = ops::need_data(group, op, one_name, one); !s.ok()) return s;
  if (root >= 0 && root < group.size()) return Status::Ok();
  return ops::invalid(group, op, fmt::format("root {} is not a member (group rank 0..{})", root, group.size() - 1));
}

// The root's whole buffer of a gather (output) or scatter (input):
// group.size() blocks of `one`'s size back to back, of its dtype; `one` may
// be the root's own block of it, and overlap nothing else of it.
Status check_rooted_whole(Group& group, const char* op, const TensorView& whole, const char* whole_name,
                          const TensorView& one, const char* one_name, int root) {
  if (Status s = ops::need_data(group, op, whole_name, whole); !s.ok()) return s;
  const size_t n = static_cast<size_t>(group.size()), bytes = one.nbytes();
  if (whole.dtype != one.dtype) {
    return ops::invalid(group, op, fmt::format("{} is {}, {} is {}", whole_name, dtype_name(whole.dtype), one_name,
                                               dtype_name(one.dtype)));
  }
  if (whole.nbytes() != bytes * n) {
    return ops::invalid(group, op, fmt::format("{} {} holds {} bytes; {} ranks x {} {} bytes need {}", whole_name,
                                               whole.describe(), whole.nbytes(), n, bytes, one_name, bytes * n));
  }
  const auto* own = static_cast<const std::byte*>(whole.data) + static_cast<size_t>(root) * bytes;
  if (one.data != own && ops::overlaps(one.data, bytes, whole.data, bytes * n)) {
    return ops::invalid(group, op, fmt::format("{} overlaps {} other than as the root's own block", one_name, whole_name));
  }
  return Status::Ok();
}

// The root's list of a gather (outputs) or scatter (inputs): group.size()
// buffers of `one`'s dtype and size, none overlapping `one` but the root's own,
// which may be it (another block landing there, or read from there while `one`
// is written, would meet bytes not yet sent or already overwritten).
Status check_rooted_list(Group& group, const char* op, std::span<const TensorView> list, const char* list_name,
                         const TensorView& one, const char* one_name, int root) {
  if (list.size() != static_cast<size_t>(group.size())) {
    return ops::invalid(group, op, fmt::format("{} {} for {} ranks", list.size(), list_name, group.size()));
  }
  for (size_t m = 0; m < list.size(); ++m) {
    const TensorView& t = list[m];
    const std::string what = fmt::format("{}[{}]", list_name, m);
    if (Status s = ops::need_data(group, op, what.c_str(), t); !s.ok()) return s;
    if (t.dtype != one.dtype || t.nbytes() != one.nbytes()) {
      return ops::invalid(group, op, fmt::format("{} is {} ({} bytes); {} is {} ({} bytes)", what, t.describe(),
                                                 t.nbytes(), one_name, one.describe(), one.nbytes()));
    }
    const bool own_in_place = m == static_cast<size_t>(root) && t.data == one.data;
    if (!own_in_place && ops::overlaps(t.data, t.nbytes(), one.data, one.nbytes())) {
      return ops::invalid(group, op, fmt::format("{} overlaps the {}", what, one_name));
    }
  }
  return Status::Ok();
}

// gather and all_to_all are the all-gather's schedule (gather_blocks) with
// sinks that keep only what is theirs: within a server each member copies its
// bytes into shared memory once and each reader copies out only its part (an
// all_to_all from memory peers can read, by single copy: each reads only its
// part, where it lies). A scatter within a server runs the reduce-scatter's
// steps (scatter_from).
// Across servers all three are the all-gather's direct schedule with parts
// (algo::GatherCall::part): a member on another server is sent only what it
// keeps (the root each block of a gather, each member its chunk of a scatter
// and its split of an all_to_all), straight into where it goes.

// The gather itself, its arguments checked: on the root block m lands at
// (*at)(m); elsewhere `at` is null.
engine::Task<Status> gather_to(Group& group, const TensorView& input, int root, algo::FunctionRef<std::byte*(int)>* at) {
  const size_t n = static_cast<size_t>(group.size());
  const size_t bytes = input.nbytes();
  const bool am_root = group.rank() == root;
  Group::Impl& i = *impl_of(group);
  // Across servers each block goes to the root alone, into its output.
  auto landing = [&](int member) -> std::byte* { return am_root ? (*at)(member) : nullptr; };
  algo::FunctionRef<std::byte*(int)> landing_ref(landing);
  auto part = [&](int, int reader, size_t* offset) -> size_t {
    *offset = 0;
    return reader == root ? bytes : 0;
  };
  algo::FunctionRef<size_t(int, int, size_t*)> part_ref(part);
  const bool across = i.net != nullptr;
  const bool stream_out = am_root && algo::streams_out(bytes * n, i.settings);
  auto sink = [&](int member, size_t off, const std::byte* src, size_t len) {
    if (!am_root) return;
    std::byte* dst = landing(member) + off;
    if (dst != src) algo::copy_out(dst, src, len, stream_out);
  };
  co_return co_await ops::gather_blocks(group, algo::OpCode::kGather, static_cast<uint32_t>(input.dtype),
                                        static_cast<const std::byte*>(input.data), std::vector<size_t>(n, bytes),
                                        across ? &landing_ref : nullptr, stream_out, sink, Schedule::kAuto, nullptr,
                                        static_cast<uint64_t>(root), across ? &part_ref : nullptr);
}

engine::Task<Status> gather_op(Group& group, const TensorView& input, const TensorView& output, int root) {
  constexpr const char* kOp = "gather";
  if (Status s = check_root(group, kOp, root, input, "input"); !s.ok()) co_return s;
  const size_t bytes = input.nbytes();
  auto* out = static_cast<std::byte*>(output.data);
  if (group.rank() == root) {
    if (Status s = check_rooted_whole(group, kOp, output, "output", input, "input", root); !s.ok()) co_return s;
  }
  auto at = [&](int member) -> std::byte* { return out + static_cast<size_t>(member) * bytes; };
  algo::FunctionRef<std::byte*(int)> at_ref(at);
  co_return co_await gather_to(group, input, root, group.rank() == root ? &at_ref : nullptr);
}

engine::Task<Status> gather_list_op(Group& group, const TensorView& input, std::span<const TensorView> outputs, int root) {
  constexpr const char* kOp = "gather(list)";
  if (Status s = check_root(group, kOp, root, input, "input"); !s.ok()) co_return s;
  if (group.rank() == root) {
    if (Status s = check_rooted_list(group, kOp, outputs, "outputs", input, "input", root); !s.ok()) co_return s;
  }
  auto at = [&](int member) -> std::byte* { return static_cast<std::byte*>(outputs[static_cast<size_t>(member)].data); };
  algo::FunctionRef<std::byte*(int)> at_ref(at);
  co_return co_await gather_to(group, input, root, group.rank() == root ? &at_ref : nullptr);
}

// The scatter among the members on this server (all of the group's, where
// it is on one server): the reduce-scatter's steps, each holding the root's
// piece for every other member here (no chunk for a member elsewhere enters
// the ring, nor the root's own), and each member copies out its own; the
// others' pieces are left unwritten. Where the root is on another server,
// the members here run the same call with no bytes: their headers still
// compare the op and the root. On the root, chunk d (of output's size)
// starts at (*from)(d); `whole`: all of them back to back, where they lie so.
engine::Task<Status> scatter_on_server(Group& group, TensorView output, int root,
                                       algo::FunctionRef<const std::byte*(int)>* from, const std::byte* whole) {
  Group::Impl& i = *impl_of(group);
  const algo::Topology& topo = i.shape.topo;
  const int first = topo.first[topo.mine], here = topo.local_count(), me = group.rank();
  const bool root_here = topo.local(root), am_root = me == root;
  const size_t bytes = output.nbytes();
  auto* out = static_cast<std::byte*>(output.data);
  if (here == 1) {
    const std::byte* own = am_root ? (*from)(root) : nullptr;
    if (own != nullptr && bytes != 0 && out != own) std::memcpy(out, own, bytes);
    co_return Status::Ok();
  }
  const bool stream_out = algo::streams_out(bytes, i.settings);
  algo::GatherCall call;
  call.op = algo::OpCode::kScatter;
  call.dtype = static_cast<uint32_t>(output.dtype);
  call.input = whole != nullptr ? whole + static_cast<size_t>(first) * bytes : nullptr;
  call.bytes = root_here ? bytes * static_cast<size_t>(here) : 0;
  call.aux = static_cast<uint64_t>(root);
  call.aux_name = "root";
  call.settings = &i.settings;
  // This server's members alone (the group's shape, where it has one server).
  algo::GroupShape shape = i.shape;
  if (topo.servers() > 1) shape.topo = algo::Topology::of(std::vector<int>(static_cast<size_t>(here), 0), me - first);
  const algo::CallPlan plan = algo::plan_call(shape, call);
  std::vector<std::byte> scratch(plan.piece);
  auto produce = [&](int d, size_t off, size_t len, std::byte* dst) {
    if (am_root) std::memcpy(dst, (*from)(first + d) + off, len);
  };
  auto take = [&](size_t offset, const std::byte* const* srcs, int, size_t len) {
    const std::byte* src = srcs[root - first];
    if (out + offset != src) algo::copy_out(out + offset, src, len, stream_out);
  };
  co_return co_await algo::reduce_scatter_produced(*i.channel, call, plan, produce, scratch.data(), take);
}

// The scatter itself, its arguments checked: on the root, chunk d (output's
// size) starts at (*from)(d), and `whole` is all of them back to back where
// they lie so (else null); elsewhere both are null.
engine::Task<Status> scatter_from(Group& group, const TensorView& output, int root,
                                  algo::FunctionRef<const std::byte*(int)>* from, const std::byte* whole) {
  const size_t n = static_cast<size_t>(group.size());
  const size_t bytes = output.nbytes();
  const bool am_root = group.rank() == root;
  Group::Impl& i = *impl_of(group);
  if (i.net == nullptr) co_return co_await scatter_on_server(group, output, root, from, whole);
  // Across servers, the all-gather's direct schedule with parts: the root's
  // block is its n chunks, everyone else's is empty, and each member on
  // another server is sent its chunk, from where it lies, straight into its
  // output; the members on the root's server get theirs by the scatter
  // within it (the call's local phase) instead of the gather's, which would
  // move the root's whole block to each of them.
  auto chunk = [&](int reader) { return (*from)(reader); };
  algo::FunctionRef<const std::byte*(int)> chunk_ref(chunk);
  auto on_server = [&]() { return scatter_on_server(group, output, root, from, whole); };
  algo::FunctionRef<engine::Task<Status>()> on_server_ref(on_server);
  std::vector<size_t> sizes(n, 0);
  sizes[static_cast<size_t>(root)] = bytes * n;
  auto* out = static_cast<std::byte*>(output.data);
  auto landing = [&](int member) -> std::byte* { return member == root ? out : nullptr; };
  algo::FunctionRef<std::byte*(int)> landing_ref(landing);
  auto part = [&](int owner, int reader, size_t* offset) -> size_t {
    *offset = static_cast<size_t>(reader) * bytes;
    return owner == root ? bytes : 0;
  };
  algo::FunctionRef<size_t(int, int, size_t*)> part_ref(part);
  // What arrives lands in the output (landing); nothing to copy.
  auto sink = [](int, size_t, const std::byte*, size_t) {};
  co_return co_await ops::gather_blocks(group, algo::OpCode::kScatter, static_cast<uint32_t>(output.dtype), whole,
                                        std::move(sizes), &landing_ref, algo::streams_out(bytes, i.settings), sink,
                                        Schedule::kAuto, nullptr, static_cast<uint64_t>(root), &part_ref,
                                        am_root ? &chunk_ref : nullptr, &on_server_ref);
}

engine::Task<Status> scatter_op(Group& group, const TensorView& input, const TensorView& output, int root) {
  constexpr const char* kOp = "scatter";
  if (Status s = check_root(group, kOp, root, output, "output"); !s.ok()) co_return s;
  const size_t bytes = output.nbytes();
  const auto* in = static_cast<const std::byte*>(input.data);
  if (group.rank() == root) {
    if (Status s = check_rooted_whole(group, kOp, input, "input", output, "output", root); !s.ok()) co_return s;
  }
  auto from = [&](int d) { return in + static_cast<size_t>(d) * bytes; };
  algo::FunctionRef<const std::byte*(int)> from_ref(from);
  const bool am_root = group.rank() == root;
  co_return co_await scatter_from(group, output, root, am_root ? &from_ref : nullptr, am_root ? in : nullptr);
}

engine::Task<Status> scatter_list_op(Group& group, std::span<const TensorView> inputs, const TensorView& output, int root) {
  constexpr const char* kOp = "scatter(list)";
  if (Status s = check_root(group, kOp, root, output, "output"); !s.ok()) co_return s;
  if (group.rank() == root) {
    if (Status s = check_rooted_list(group, kOp, inputs, "inputs", output, "output", root); !s.ok()) co_return s;
  }
  auto from = [&](int d) { return static_cast<const std::byte*>(inputs[static_cast<size_t>(d)].data); };
  algo::FunctionRef<const std::byte*(int)> from_ref(from);
  co_return co_await scatter_from(group, output, root, group.rank() == root ? &from_ref : nullptr, nullptr);
}

// Counts (elements) each member sends to each and receives from each: every
// member's row of both, gathered, so that every member checks every pair and
// all of them refuse, or none.
struct Splits {
  size_t n;
  std::vector<int64_t> table;  // member m: send[0..n), then recv[0..n)
  int64_t send(size_t m, size_t j) const { return table[m * 2 * n + j]; }
  int64_t recv(size_t m, size_t j) const { return table[m * 2 * n + n + j]; }
};

engine::Task<Status> all_to_all_op(Group& group, const TensorView& input, const TensorView& output,
                                   std::span<const int64_t> send_counts, std::span<const int64_t> recv_counts) {
  constexpr const char* kOp = "all_to_all";
  if (Status s = ops::need_data(group, kOp, "input", input); !s.ok()) co_return s;
  if (Status s = ops::need_data(group, kOp, "output", output); !s.ok()) co_return s;
  const size_t n = static_cast<size_t>(group.size());
  const size_t me = static_cast<size_t>(group.rank());
  if (output.dtype != input.dtype) {
    co_return ops::invalid(group, kOp, fmt::format("output is {}, input is {}", dtype_name(output.dtype),
                                                   dtype_name(input.dtype)));
  }
  if (ops::overlaps(input.data, input.nbytes(), output.data, output.nbytes())) {
    co_return ops::invalid(group, kOp, "input and output overlap");
  }
  const size_t es = dtype_size(input.dtype);
  // Where member m's bytes for this member lie in its block, and where they go.
  std::vector<size_t> sizes(n), lo(n), len(n), at(n);
  Splits splits{n, {}};  // with counts: every member's
  size_t even = 0;       // without: the bytes to each member
  if (send_counts.empty() && recv_counts.empty()) {
    if (input.numel() % static_cast<int64_t>(n) != 0 || output.nbytes() != input.nbytes()) {
      co_return ops::invalid(group, kOp, fmt::format("input {} and output {} must hold the same number of elements, a "
                                                     "multiple of the {} ranks (or pass the counts)",
                                                     input.describe(), output.describe(), n));
    }
    const size_t chunk = input.nbytes() / n;
    even = chunk;
    for (size_t m = 0; m < n; ++m) {
      sizes[m] = input.nbytes();
      lo[m] = me * chunk;
      len[m] = chunk;
      at[m] = m * chunk;
    }
  } else {
    if (send_counts.size() != n || recv_counts.size() != n) {
      co_return ops::invalid(group, kOp, fmt::format("{} send and {} receive counts for {} ranks", send_counts.size(),
                                                     recv_counts.size(), n));
    }
    int64_t sent = 0, received = 0;
    for (size_t j = 0; j < n; ++j) {
      if (send_counts[j] < 0 || send_counts[j] > input.numel() || recv_counts[j] < 0 || recv_counts[j] > output.numel()) {
        co_return ops::invalid(group, kOp, fmt::format("counts for rank {}: send {}, receive {} (input holds {} "
                                                       "elements, output {})", j, send_counts[j], recv_counts[j],
                                                       input.numel(), output.numel()));
      }
      sent += send_counts[j];
      received += recv_counts[j];
    }
    if (sent != input.numel() || received != output.numel()) {
      co_return ops::invalid(group, kOp, fmt::format("the send counts add up to {} (input {}), the receive counts to "
                                                     "{} (output {})", sent, input.describe(), received,
                                                     output.describe()));
    }
    splits.table.assign(2 * n * n, 0);
    std::vector<int64_t> row(send_counts.begin(), send_counts.end());
    row.insert(row.end(), recv_counts.begin(), recv_counts.end());
    const TensorView row_view(row.data(), DType::kI64, {static_cast<int64_t>(2 * n)});
    const TensorView table_view(splits.table.data(), DType::kI64, {static_cast<int64_t>(2 * n * n)});
    if (Status s = co_await all_gather_op(group, row_view, table_view, {}); !s.ok()) co_return s;
    for (size_t m = 0; m < n; ++m) {
      for (size_t j = 0; j < n; ++j) {
        if (splits.send(m, j) != splits.recv(j, m)) {
          co_return ops::invalid(group, kOp, fmt::format("rank {} sends {} elements to rank {}, which expects {}",
                                                         group.ranks()[m], splits.send(m, j), group.ranks()[j],
                                                         splits.recv(j, m)));
        }
      }
    }
    size_t into = 0;
    for (size_t m = 0; m < n; ++m) {
      size_t before = 0, total = 0;
      for (size_t j = 0; j < n; ++j) {
        if (j < me) before += static_cast<size_t>(splits.send(m, j));
        total += static_cast<size_t>(splits.send(m, j));
      }
      sizes[m] = total * es;
      lo[m] = before * es;
      len[m] = static_cast<size_t>(splits.send(m, me)) * es;
      at[m] = into;
      into += len[m];
    }
  }
  Group::Impl& i = *impl_of(group);
  auto* in = static_cast<std::byte*>(const_cast<void*>(input.data));
  auto* out = static_cast<std::byte*>(output.data);
  // Each member's split for this one lands in the output (across servers it
  // is sent alone, straight there; within a server, read there by single copy).
  auto landing = [&](int m) -> std::byte* { return out + at[static_cast<size_t>(m)]; };
  algo::FunctionRef<std::byte*(int)> landing_ref(landing);
  auto part = [&](int owner, int reader, size_t* offset) -> size_t {
    const size_t r = static_cast<size_t>(reader);
    if (splits.table.empty()) {
      *offset = r * even;
      return even;
    }
    const size_t o = static_cast<size_t>(owner);
    size_t before = 0;
    for (size_t j = 0; j < r; ++j) before += static_cast<size_t>(splits.send(o, j));
    *offset = before * es;
    return static_cast<size_t>(splits.send(o, r)) * es;
  };
  algo::FunctionRef<size_t(int, int, size_t*)> part_ref(part);
  const bool stream_out = algo::streams_out(output.nbytes(), i.settings);
  auto sink = [&](int member, size_t off, const std::byte* src, size_t piece) {
    const size_t m = static_cast<size_t>(member);
    take_range(off, src, piece, lo[m], lo[m] + len[m], out + at[m], stream_out);
  };
  // Within a server too: by single copy (where members read each other's
  // memory), each member reads only its split of each peer's block, straight
  // into its output, as MPI's pairwise exchange does.
  co_return co_await ops::gather_blocks(group, algo::OpCode::kAllToAll, static_cast<uint32_t>(input.dtype), in,
                                        std::move(sizes), &landing_ref, stream_out, sink, Schedule::kAuto, nullptr, 0,
                                        &part_ref);
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

Request start_gather(Group& group, const TensorView& input, const TensorView& output, int root) {
  return ops::start<gather_op>(group, input, output, root);
}

Status gather(Group& group, const TensorView& input, const TensorView& output, int root) {
  return ops::call<gather_op>(group, input, output, root);
}

Request start_gather(Group& group, const TensorView& input, std::span<const TensorView> outputs, int root) {
  return ops::start<gather_list_op>(group, input, outputs, root);
}

Status gather(Group& group, const TensorView& input, std::span<const TensorView> outputs, int root) {
  return ops::call<gather_list_op>(group, input, outputs, root);
}

Request start_scatter(Group& group, const TensorView& input, const TensorView& output, int root) {
  return ops::start<scatter_op>(group, input, output, root);
}

Status scatter(Group& group, const TensorView& input, const TensorView& output, int root) {
  return ops::call<scatter_op>(group, input, output, root);
}

Request start_scatter(Group& group, std::span<const TensorView> inputs, const TensorView& output, int root) {
  return ops::start<scatter_list_op>(group, inputs, output, root);
}

Status scatter(Group& group, std::span<const TensorView> inputs, const TensorView& output, int root) {
  return ops::call<scatter_list_op>(group, inputs, output, root);
}

Request start_all_to_all(Group& group, const TensorView& input, const TensorView& output,
                         std::span<const int64_t> send_counts, std::span<const int64_t> recv_counts) {
  return ops::start<all_to_all_op>(group, input, output, send_counts, recv_counts);
}

Status all_to_all(Group& group, const TensorView& input, const TensorView& output, std::span<const int64_t> send_counts,
                  std::span<const int64_t> recv_counts) {
  return ops::call<all_to_all_op>(group, input, output, send_counts, recv_counts);
}

Request start_barrier(Group& group) { return ops::start<barrier_op>(group); }

Status barrier(Group& group) { return ops::call<barrier_op>(group); }

}  // namespace fastgather
