#include "algo/call.hpp"
#include "algo/thresholds.hpp"

namespace fastgather::algo {

const char* op_name(OpCode op) {
  switch (op) {
    case OpCode::kAllGather: return "all_gather";
    case OpCode::kAllGatherV: return "all_gather_v";
    case OpCode::kGather: return "gather";
    case OpCode::kScatter: return "scatter";
    case OpCode::kAllToAll: return "all_to_all";
    case OpCode::kAllGatherMatmul: return "all_gather_matmul";
    case OpCode::kBarrier: return "barrier";
    case OpCode::kBroadcast: return "broadcast";
    case OpCode::kReduceScatter: return "reduce_scatter";
    case OpCode::kAllReduce: return "all_reduce";
    case OpCode::kMatmulReduceScatter: return "matmul_reduce_scatter";
  }
  return "unknown-op";
}

const Settings& default_settings() {
  static const Settings defaults;
  return defaults;
}

int Topology::server_of(int member) const {
  return static_cast<int>(std::upper_bound(first.begin(), first.end(), member) - first.begin()) - 1;
}

Topology Topology::of(const std::vector<int>& server_of_member, int me) {
  Topology t;
  for (size_t m = 0; m < server_of_member.size(); ++m) {
    if (m == 0 || server_of_member[m] != server_of_member[m - 1]) t.first.push_back(static_cast<int>(m));
  }
  t.first.push_back(static_cast<int>(server_of_member.size()));
  t.mine = t.server_of(me);
  return t;
}

Chunks::Chunks(size_t total_bytes, int members, size_t align) : total(total_bytes) {
  const size_t n = static_cast<size_t>(std::max(members, 1));
  const size_t unit = 64 % std::max<size_t>(align, 1) == 0 ? 64 : std::max<size_t>(align, 1);
  each = ((total + n - 1) / n + unit - 1) / unit * unit;
}

Chunks Chunks::equal(size_t total_bytes, int members) {
  Chunks c(total_bytes, members, 1);
  c.each = total_bytes / static_cast<size_t>(std::max(members, 1));
  return c;
}

bool scatters(const GatherCall& call) { return call.op != OpCode::kAllReduce; }

SumLayout::SumLayout(const Topology& topo, const GatherCall& call)
    : servers(topo.servers()), locals(topo.local_count()),
      slabs(scatters(call) ? Chunks::equal(call.bytes, locals) : Chunks(call.bytes, locals, call.align)),
      chunk(call.bytes / static_cast<size_t>(servers * locals)), whole(sums_whole(topo, call)) {}

bool sums_whole(const Topology& topo, const GatherCall& call) {
  return call.op == OpCode::kAllReduce && topo.local_count() > 1 && call.bytes <= kSumWholeMaxBytes;
}

size_t exchanged_bytes(const Topology& topo, const GatherCall& call) {
  const SumLayout layout(topo, call);
  return layout.result(scatters(call), 0);
}

}  // namespace fastgather::algo
