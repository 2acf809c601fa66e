// What a Group holds: its members, the shared-memory channel among those on
// this server and, for a group that spans servers, its UCX channel. Shared by
// the core (which builds groups) and the ops (which run collectives on them).
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "algo/allgather_net.hpp"
#include "algo/copy_in.hpp"
#include "fastgather/communicator.hpp"
#include "fastgather/ops.hpp"
#include "transport/net_channel.hpp"
#include "transport/shm_channel.hpp"

namespace fastgather {

struct Group::Impl {
  std::vector<int> ranks;
  int me = -1;
  std::string label;  // "group [0,2]"
  // Among the members on this server (all of them, unless net is set).
  std::unique_ptr<transport::ShmChannel> channel;
  // Across servers: null when every member is on this server.
  std::unique_ptr<transport::NetChannel> net;
  algo::Topology topo;
  // Across servers, a member that fails a call on a mismatch closes its
  // endpoints; the members that then lose it learn why through the store.
  std::function<void(const Status&)> publish_failure;
  std::function<std::optional<Status>()> published_failure;
  std::vector<float> scratch;     // fused op: converted rows, fp32 accumulators
  std::vector<std::byte> landed;  // fused op across servers without gather_out: where blocks land
  // What this machine has shown to be faster, per size; one per op, since the
  // fused op's call time includes its GEMM.
  algo::CopyInChooser copy_in;
  algo::CopyInChooser copy_in_fused;
};

inline transport::ShmChannel& channel_of(Group& g) { return *g.impl()->channel; }
inline bool spans_servers(const Group& g) { return g.impl()->net != nullptr; }

// Runs an all-gather schedule on the group: within one server, or across.
// stats, when set, says where the time went.
inline Status run_gather(Group& g, algo::GatherCall call, algo::PieceSink sink, CallStats* stats = nullptr) {
  Group::Impl& i = *g.impl();
  algo::GatherStats st;
  call.stats = &st;
  Status s;
  if (i.net == nullptr) {
    if (stats == nullptr) return algo::gather(*i.channel, call, sink);  // the hot path: no clock reads
    const auto t0 = std::chrono::steady_clock::now();
    s = algo::gather(*i.channel, call, sink);
    st.schedule = call.schedule == algo::Schedule::kRingPass ? call.schedule : algo::Schedule::kOneShot;
    st.intra_ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  } else {
    const bool was_broken = !i.net->broken().ok() || !i.channel->broken().ok();
    s = algo::gather_across(*i.channel, *i.net, i.topo, call, sink);
    if (!s.ok() && !was_broken && (s.kind() == ErrorKind::kMismatch || s.kind() == ErrorKind::kPeerLost)) {
      // Say what we saw at once, if it names both calls; otherwise what
      // another member saw may say more (a truncated message has no header).
      const bool told = s.kind() == ErrorKind::kMismatch && st.headers_compared;
      if (told) i.publish_failure(s);
      if (auto why = told ? std::nullopt : i.published_failure(); why && why->message() != s.message()) {
        s = s.kind() == ErrorKind::kPeerLost ? Status{why->kind(), fmt::format("{} (after: {})", why->message(), s.message())}
                                             : Status{s.kind(), fmt::format("{}; {}", s.message(), why->message())};
      }
      if (!told && s.kind() == ErrorKind::kMismatch) i.publish_failure(s);
    }
  }
  if (stats != nullptr) *stats = {algo::schedule_name(st.schedule), st.intra_ns, st.inter_ns};
  return s;
}

}  // namespace fastgather
