// All-gather for a group that spans servers: shared memory among the members
// on this server (allgather.hpp), UCX to the others (transport/net_channel).
//
// Members are numbered in ascending world rank and servers hold consecutive
// world ranks, so each server's members are consecutive: a Topology is the
// first member of each server present in the group.
#pragma once

#include <cstddef>
#include <vector>

#include "algo/allgather.hpp"
#include "transport/net_channel.hpp"

namespace fastgather::algo {

struct Topology {
  std::vector<int> first;  // first[s]: first member on the group's s-th server; first.back(): members
  int mine = 0;            // this member's server slot

  int servers() const { return static_cast<int>(first.size()) - 1; }
  int members() const { return first.back(); }
  int server_of(int member) const;
  int leader(int slot) const { return first[slot]; }
  int local_count() const { return first[mine + 1] - first[mine]; }
  bool local(int member) const { return member >= first[mine] && member < first[mine + 1]; }
  bool one_per_server() const { return members() == servers(); }
  // From each member's server index (any increasing labels), and this member's position.
  static Topology of(const std::vector<int>& server_of_member, int me);
};

// Size-based choice across servers (kOneShot = let it choose): direct while a
// message is small, hierarchical once it is large enough that sending each
// block to every member of a server costs more than the relay within it.
// hier_min_bytes (Settings, FG_HIER_MIN_BYTES) is the crossover.
Schedule choose_schedule(const Topology& topo, size_t bytes_per_member, Schedule requested, size_t hier_min_bytes);

// Largest piece a UCX message carries: `configured` (Settings,
// FG_NET_PIECE_BYTES; at least 4 KiB) in whole rows of `align`, larger where
// the tag's 16 piece bits would not number the pieces.
size_t net_piece_bytes(size_t bytes, size_t align, size_t configured);

// call.landing must be set unless call.bytes is 0. call.schedule: kOneShot
// (choose), kDirect or kHierarchical. On failure both channels are broken,
// so every later call on the group fails at once.
// A coroutine, like gather().
engine::Task<Status> gather_across(transport::ShmChannel& local, transport::NetChannel& net, const Topology& topo,
                                   GatherCall call, PieceSink sink);

}  // namespace fastgather::algo
