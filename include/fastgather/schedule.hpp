// How a collective moves its blocks: asked for in the ops' options, and
// reported in CallStats (what a call ran). One enum for both.
#pragma once

#include <cstdint>

namespace fastgather {

enum class Schedule : uint8_t {
  // Asked: choose by size and layout (inline in the synchronisation line up to
  // 32 B, else one-shot; across servers, direct for small messages and
  // hierarchical for large). Reported: no call has filled the stats yet.
  kAuto = 0,
  kOneShot,  // one server: every member's block goes to every peer in the same steps
  kRing,     // one server: the classic ring, n-1 steps each forwarding one block (a comparator)
  // Across servers (within one server both run as the one-shot):
  kDirect,        // every member sends its block to every member on other servers
  kHierarchical,  // gather within servers, leaders exchange, relay within servers
  // (sums: reduce within servers, exchange partial sums, spread within; their
  // one-shot across servers: an all-gather of the inputs, then the sums)
  // all_reduce within a server: reduce-scatter (each member sums one chunk
  // of everyone's input), then all-gather of the sums. Its one-shot: every
  // member sums all of everyone's input.
  kTwoShot,
};
// "auto", "one-shot", "ring", "direct", "hierarchical", "two-shot"
const char* to_string(Schedule schedule);

}  // namespace fastgather
