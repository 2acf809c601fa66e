// All-gather over a group's shared-memory channel. An algorithm sees only
// the channel and a sink that receives
// each member's bytes where they can be read; what the op does with them
// (copy into an output, multiply them) is the sink's business.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "algo/call.hpp"
#include "engine/task.hpp"
#include "fastgather/status.hpp"
#include "transport/channel.hpp"

namespace fastgather::algo {

struct CallPlan;  // plan.hpp

// Runs the server-local part of `plan` (plan_call's for this call): the
// one-shot or the ring schedule, by the plan's protocol. A coroutine: run it
// with co_await, or hand it to an engine::Driver. `sink`, `plan` and what
// call points to must outlive it.
engine::Task<Status> gather(transport::Channel& channel, GatherCall call, const CallPlan& plan, PieceSink sink);

}  // namespace fastgather::algo
