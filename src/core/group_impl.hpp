// What a Group holds: its members and its shared-memory channel. Shared by
// the core (which builds groups) and the ops (which run collectives on them).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "algo/copy_in.hpp"
#include "fastgather/communicator.hpp"
#include "transport/shm_channel.hpp"

namespace fastgather {

struct Group::Impl {
  std::vector<int> ranks;
  int me = -1;
  std::string label;  // "group [0,2]"
  std::unique_ptr<transport::ShmChannel> channel;
  std::vector<float> scratch;  // fused op: converted rows, fp32 accumulators
  // What this machine has shown to be faster, per size; one per op, since the
  // fused op's call time includes its GEMM.
  algo::CopyInChooser copy_in;
  algo::CopyInChooser copy_in_fused;
};

inline transport::ShmChannel& channel_of(Group& g) { return *g.impl()->channel; }

}  // namespace fastgather
