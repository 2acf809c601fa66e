// What a Group holds: its members, the shared-memory channel among those on
// this server and, for a group that spans servers, its UCX channel. Shared by
// the core (which builds groups) and the ops (which run collectives on them).
#pragma once

#include <functional>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "algo/across.hpp"
#include "algo/plan.hpp"
#include "algo/copy_in.hpp"
#include "engine/driver.hpp"
#include "engine/progress.hpp"
#include "fastgather/communicator.hpp"
#include "transport/net_channel.hpp"
#include "transport/net_steps.hpp"
#include "transport/shm_channel.hpp"
#include "transport/shm_mail.hpp"

namespace fastgather {

struct Group::Impl {
  std::vector<int> ranks;
  int me = -1;
  Settings settings;  // the communicator's: every call on the group follows them
  std::string label;  // "group [0,2]"
  // Among the members on this server (all of them, unless net is set).
  std::unique_ptr<transport::ShmChannel> channel;
  // Its symmetric heap (null: none), shared with the tensors allocated from
  // it (heap_owner gives their blocks back), so it outlives the group if they do.
  std::shared_ptr<transport::ShmHeap> heap;
  std::shared_ptr<Tensor::Owner> heap_owner;
  // Across servers: null when every member is on this server.
  std::unique_ptr<transport::NetChannel> net;
  // With one member on each server: the steps over net that the schedules
  // written for one server run on (algo::CallPlan::over_steps).
  std::unique_ptr<transport::NetSteps> steps;
  // What plan_call needs to know of the group (shape.topo: its layout);
  // fixed once the group is made.
  algo::GroupShape shape;
  // Across servers, a member that fails a call on a mismatch closes its
  // endpoints; the members that then lose it learn why through the store.
  std::function<void(const Status&)> publish_failure;
  std::function<std::optional<Status>()> published_failure;
  std::vector<float> scratch;     // fused op: converted rows, fp32 accumulators
  // Sums across servers: partial sums and what other servers send, kept
  // between calls (one op of a group runs at a time) so that a large sum
  // does not fault in fresh pages every call.
  std::vector<std::byte> sum_work;
  std::vector<std::byte> landed;  // fused op across servers without gather_out: where blocks land
  // What this machine has shown to be faster, per size; one per op, since the
  // fused op's call time includes its GEMM.
  algo::CopyInChooser copy_in;
  algo::CopyInChooser copy_in_fused;
  // How its operations wait, and what ends them early.
  transport::WaitPolicy policy;
  const std::atomic<int>* aborted = nullptr;  // the communicator's flag
  // Started operations, oldest first (engine/driver.hpp).
  engine::Queue queue;
  // Point-to-point (ops/p2p.cpp): the mailboxes among the members on this
  // server (null: none; members on other servers are sent messages over
  // `net`), and the sends to each member, the receives from
  // each, and the receives from any source, each in an order of their own,
  // beside the collectives: a send waits for no collective, nor for a
  // receive from its own peer (batch_isend_irecv's pairs), nor they for it.
  std::unique_ptr<transport::ShmMail> mail;
  std::vector<std::unique_ptr<engine::Queue>> sends, receives;
  engine::Queue any_receives;
  // After a call between servers, its sends still in flight, driven in the
  // background (ops/request.hpp, flush_in_background).
  engine::Queue flushes;
  // Every queue of the group, the collectives' first (made with the group:
  // the wait loops of other groups walk it).
  std::vector<engine::Queue*> all_queues;
  const std::vector<engine::Queue*>& queues() const { return all_queues; }
  void make_queues(size_t members) {
    all_queues = {&queue, &any_receives, &flushes};
    for (size_t m = 0; m < members; ++m) {
      sends.push_back(std::make_unique<engine::Queue>());
      receives.push_back(std::make_unique<engine::Queue>());
      all_queues.push_back(sends.back().get());
      all_queues.push_back(receives.back().get());
    }
  }
  // The communicator's progress thread and completion threads (engine/progress.hpp).
  std::shared_ptr<engine::Progress> progress;
  // A hand for the communicator's other groups while this one waits.
  std::function<bool()> others;

  engine::DriveOptions drive_options() const {
    engine::DriveOptions o;
    o.policy = policy;
    o.aborted = aborted;
    o.net = net.get();
    o.others = others;
    return o;
  }
};

// How the library's own code reaches a Group's insides (Group keeps them private).
struct GroupAccess {
  static Group::Impl* of(const Group& g) { return g.impl_.get(); }
  static std::unique_ptr<Group> make(std::unique_ptr<Group::Impl> impl) {
    return std::unique_ptr<Group>(new Group(std::move(impl)));
  }
};
inline Group::Impl* impl_of(const Group& g) { return GroupAccess::of(g); }

inline transport::ShmChannel& channel_of(Group& g) { return *impl_of(g)->channel; }
inline bool spans_servers(const Group& g) { return impl_of(g)->net != nullptr; }

}  // namespace fastgather
