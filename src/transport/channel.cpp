#include "transport/channel.hpp"

#include <fmt/format.h>

namespace fastgather::transport {

Status Channel::read_peer(int member, std::byte*, uint64_t, size_t) {
  // The planner never asks a channel without the capability (plan_call reads
  // capabilities().reads_peer_memory): reaching here is a bug, said as one.
  return {ErrorKind::kUnsupported, fmt::format("{}: this channel cannot read rank {}'s memory", label(), world_rank(member))};
}

}  // namespace fastgather::transport
