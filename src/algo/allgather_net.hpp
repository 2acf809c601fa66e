// All-gather for a group that spans servers: shared memory among the members
// on this server (allgather.hpp), UCX to the others (transport/net_channel).
#pragma once

#include <cstddef>
#include <vector>

#include "algo/allgather.hpp"
#include "algo/plan.hpp"
#include "transport/net_channel.hpp"

namespace fastgather::algo {

// Runs `plan` (plan_call's for this call: direct or hierarchical). On failure both channels are broken, so every later call
// on the group fails at once. A coroutine, like gather().
engine::Task<Status> gather_across(transport::ShmChannel& local, transport::NetChannel& net, const Topology& topo,
                                   GatherCall call, const CallPlan& plan, PieceSink sink);

}  // namespace fastgather::algo
