// The algorithm layer's decisions: the protocol table, the learned copy-in,
// and across servers the topology, the schedule choice and the piece size.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "algo/allgather.hpp"
#include "algo/across.hpp"
#include "algo/copy_in.hpp"
#include "algo/lockstep.hpp"
#include "algo/plan.hpp"
#include "algo/thresholds.hpp"
#include "transport/net_channel.hpp"
#include "transport/shm_channel.hpp"

#include <fmt/format.h>

#include <fstream>
#include <regex>
#include <iterator>
#include <string>

using namespace fastgather::algo;
using fastgather::Settings;

namespace {

GroupShape shape(std::vector<int> servers, bool single_copy = true, bool heap = false) {
  GroupShape g;
  g.topo = Topology::of(servers, 0);
  g.local = {.inline_bytes = fastgather::transport::kInlineBytes,
             .max_step_bytes = 1 << 20,
             .pipeline_bytes = 64 << 10,
             .reads_peer_memory = single_copy,
             .shared_heap = heap};
  g.net = fastgather::transport::NetChannel::capabilities();
  g.label = "group [test]";
  return g;
}

auto nowhere = [](int) -> std::byte* { return nullptr; };
FunctionRef<std::byte*(int)> keeping(nowhere);

GatherCall call(size_t bytes, fastgather::Schedule asked = fastgather::Schedule::kAuto, bool keeps = true) {
  GatherCall c;
  c.bytes = bytes;
  c.schedule = asked;
  c.landing = keeps ? &keeping : nullptr;
  return c;
}

// A sum of fp32 elements, the schedule left to the plan.
GatherCall sum(OpCode op, size_t bytes) {
  GatherCall c = call(bytes, fastgather::Schedule::kAuto, false);
  c.op = op;
  c.align = 4;
  return c;
}

}  // namespace

using fastgather::Schedule;

TEST(Plan, ProtocolBySizeWithinAServer) {
  const auto one = shape({0, 0, 0});
  EXPECT_EQ(plan_call(one, call(0)).protocol, Protocol::kInline);
  EXPECT_EQ(plan_call(one, call(32)).protocol, Protocol::kInline);
  EXPECT_EQ(plan_call(one, call(32)).piece, 32u);
  EXPECT_EQ(plan_call(one, call(33)).protocol, Protocol::kCopyInOut);
  EXPECT_EQ(plan_call(one, call(33)).piece, size_t{64} << 10);  // the pipeline step
  const size_t min = Settings{}.single_copy_min_bytes;
  EXPECT_EQ(plan_call(one, call(min - 1)).protocol, Protocol::kCopyInOut);
  const CallPlan single = plan_call(one, call(min));
  EXPECT_EQ(single.protocol, Protocol::kSingleCopy);
  EXPECT_EQ(single.read_piece, size_t{1} << 20);  // process_vm_readv: the largest step
  EXPECT_EQ(single.piece, size_t{64} << 10);      // from the heap, and after a fallback
  // Single copy needs members that can read each other, an op that keeps
  // the blocks, the one-shot, and more than one member here.
  EXPECT_EQ(plan_call(shape({0, 0, 0}, false), call(min)).protocol, Protocol::kCopyInOut);
  EXPECT_EQ(plan_call(one, call(min, Schedule::kAuto, false)).protocol, Protocol::kCopyInOut);
  EXPECT_EQ(plan_call(one, call(min, Schedule::kRing)).protocol, Protocol::kCopyInOut);
  EXPECT_EQ(plan_call(shape({0, 1}), call(min)).protocol, Protocol::kCopyInOut);
  GatherCall bcast = call(min);
  bcast.root = 0;
  EXPECT_EQ(plan_call(one, bcast).protocol, Protocol::kCopyInOut);
}

TEST(Plan, TheScheduleThatRunsIsTheOneReported) {
  const auto one = shape({0, 0, 0});
  EXPECT_EQ(plan_call(one, call(4096)).schedule, Schedule::kOneShot);
  EXPECT_EQ(plan_call(one, call(4096, Schedule::kRing)).schedule, Schedule::kRing);
  // A ring of two is the one-shot, and so is one whose op keeps no blocks to forward.
  EXPECT_EQ(plan_call(shape({0, 0}), call(4096, Schedule::kRing)).schedule, Schedule::kOneShot);
  EXPECT_EQ(plan_call(one, call(4096, Schedule::kRing, false)).schedule, Schedule::kOneShot);
  // Direct or hierarchical within one server run the one-shot.
  EXPECT_EQ(plan_call(one, call(4096, Schedule::kHierarchical)).schedule, Schedule::kOneShot);
  // Across servers: by size, or as asked.
  const auto two = shape({0, 0, 1, 1});
  const size_t big = Settings{}.hier_min_bytes;
  EXPECT_EQ(plan_call(two, call(big - 1)).schedule, Schedule::kDirect);
  EXPECT_EQ(plan_call(two, call(big)).schedule, Schedule::kHierarchical);
  EXPECT_EQ(plan_call(two, call(big)).relay_piece, size_t{1} << 20);
  EXPECT_EQ(plan_call(two, call(8, Schedule::kHierarchical)).schedule, Schedule::kHierarchical);
  EXPECT_EQ(plan_call(two, call(big)).net_piece, Settings{}.net_piece_bytes);
  EXPECT_EQ(plan_call(two, call(Settings{}.single_copy_min_bytes)).protocol, Protocol::kCopyInOut);
  // What every member asked for is kept, for the headers to compare.
  EXPECT_EQ(plan_call(shape({0, 0}), call(4096, Schedule::kRing)).asked, Schedule::kRing);
}

TEST(Plan, WhatCannotRunIsRefusedBeforeAnyStep) {
  auto refused = [](const CallPlan& p, const std::string& says) {
    return p.error.kind() == fastgather::ErrorKind::kUnsupported && p.error.message().find(says) != std::string::npos &&
           p.error.message().find("group [test]") != std::string::npos;
  };
  const auto two = shape({0, 0, 1, 1});
  EXPECT_TRUE(refused(plan_call(two, call(4096, Schedule::kRing)), "the ring schedule runs within one server"));
  EXPECT_TRUE(refused(plan_call(two, call(4096, Schedule::kAuto, false)), "keeps no copy"));
  EXPECT_TRUE(plan_call(two, call(0, Schedule::kAuto, false)).error.ok());  // a barrier
  GatherCall wide = call(size_t{4} << 20);
  wide.align = size_t{2} << 20;  // a row larger than a step
  EXPECT_TRUE(refused(plan_call(shape({0, 0}), wide), "row exceeds"));
  EXPECT_TRUE(plan_call(shape({0}), wide).error.ok());  // alone: no steps at all
}

TEST(Plan, InPlaceFrom4KiBWhereTheGroupHasAHeap) {
  EXPECT_FALSE(plan_call(shape({0, 0}, true, true), call(kInPlaceMinBytes - 1)).in_place);
  EXPECT_TRUE(plan_call(shape({0, 0}, true, true), call(kInPlaceMinBytes)).in_place);
  EXPECT_FALSE(plan_call(shape({0, 0}, true, false), call(kInPlaceMinBytes)).in_place);
}

namespace {
std::vector<int> listed(const PeerOrder& o) {
  std::vector<int> v;
  for (int i = 0; i < o.size(); ++i) v.push_back(o[i]);
  return v;
}
}  // namespace

// A member waits first for the peers that last posted from its own CPU
// (they need it to post; their waits yield at once), then for the others.
TEST(PeerOrder, PeersOnThisCpuFirstThenTheOthersEachFromTheNextMember) {
  std::vector<int> cpu = {0, 1, 0, 1};
  auto of = [&](int m) { return cpu[static_cast<size_t>(m)]; };
  EXPECT_EQ(listed(PeerOrder(4, 0, 0, of)), (std::vector<int>{2, 1, 3}));
  EXPECT_EQ(listed(PeerOrder(4, 1, 1, of)), (std::vector<int>{3, 2, 0}));
  EXPECT_EQ(listed(PeerOrder(4, 3, 0, of)), (std::vector<int>{0, 2, 1}));
  // This thread's CPU unknown, or the peers': from the next member on.
  EXPECT_EQ(listed(PeerOrder(4, 2, -1, of)), (std::vector<int>{3, 0, 1}));
  cpu = {-1, -1, -1, -1};
  EXPECT_EQ(listed(PeerOrder(4, 3, 0, of)), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(listed(PeerOrder(1, 0, 0, of)), std::vector<int>{});
  // A peer's CPU read anew may differ (it moved): every peer still once.
  int asked = 0;
  auto moving = [&](int) { return asked++ % 2; };
  std::vector<int> got = listed(PeerOrder(40, 7, 1, moving));
  ASSERT_EQ(got.size(), 39u);
  std::vector<int> sorted = got;
  std::sort(sorted.begin(), sorted.end());
  for (int m = 0, i = 0; m < 40; ++m) {
    if (m != 7) {
      EXPECT_EQ(sorted[static_cast<size_t>(i++)], m);
    }
  }
}

// An all_reduce of 3+ members runs two-shot from kTwoShotMinBytes, and from
// the smaller kTwoShotMinBytesOutnumbered where the job's ranks outnumber
// the host's cores (2 members: Plan.AnAllReduceOfTwoMembersRunsTwoShotFrom128KiB);
// never a reduce-scatter.
TEST(Plan, AllReduceRunsTwoShotSoonerWhereRanksOutnumberCores) {
  const auto ar = OpCode::kAllReduce;
  GroupShape roomy = shape({0, 0, 0, 0});
  GroupShape crowded = roomy;
  crowded.outnumbered = true;
  EXPECT_EQ(plan_call(roomy, sum(ar, kTwoShotMinBytes - 4)).schedule, Schedule::kOneShot);
  EXPECT_EQ(plan_call(roomy, sum(ar, kTwoShotMinBytes)).schedule, Schedule::kTwoShot);
  EXPECT_EQ(plan_call(roomy, sum(ar, kTwoShotMinBytesOutnumbered)).schedule, Schedule::kOneShot);
  EXPECT_EQ(plan_call(crowded, sum(ar, kTwoShotMinBytesOutnumbered - 4)).schedule, Schedule::kOneShot);
  EXPECT_EQ(plan_call(crowded, sum(ar, kTwoShotMinBytesOutnumbered)).schedule, Schedule::kTwoShot);
  EXPECT_EQ(plan_call(crowded, sum(ar, kTwoShotMinBytes)).schedule, Schedule::kTwoShot);
  EXPECT_EQ(plan_call(crowded, sum(OpCode::kReduceScatter, kTwoShotMinBytes)).schedule, Schedule::kOneShot);
  static_assert(kTwoShotMinBytesOutnumbered < kTwoShotMinBytes);
}

// An all_reduce of 2 members runs two-shot from kTwoShotMinBytesTwoMembers,
// whether the ranks outnumber the cores or not; a reduce-scatter never.
TEST(Plan, AnAllReduceOfTwoMembersRunsTwoShotFrom128KiB) {
  const auto ar = OpCode::kAllReduce;
  static_assert(kTwoShotMinBytesTwoMembers == 128 << 10);
  for (bool outnumbered : {false, true}) {
    SCOPED_TRACE(outnumbered);
    GroupShape pair = shape({0, 0}, true, true);
    pair.outnumbered = outnumbered;
    EXPECT_EQ(plan_call(pair, sum(ar, kTwoShotMinBytesOutnumbered)).schedule, Schedule::kOneShot);
    EXPECT_EQ(plan_call(pair, sum(ar, kTwoShotMinBytesTwoMembers - 4)).schedule, Schedule::kOneShot);
    EXPECT_EQ(plan_call(pair, sum(ar, kTwoShotMinBytesTwoMembers)).schedule, Schedule::kTwoShot);
    EXPECT_EQ(plan_call(pair, sum(ar, kTwoShotMinBytes)).schedule, Schedule::kTwoShot);
    EXPECT_EQ(plan_call(pair, sum(OpCode::kReduceScatter, kTwoShotMinBytes)).schedule, Schedule::kOneShot);
  }
}

// There, too, an all_reduce reads its inputs in place only from
// kInPlaceMinBytesAllReduceOutnumbered; a reduce-scatter from kInPlaceMinBytes.
TEST(Plan, AllReduceReadsInPlaceLaterWhereRanksOutnumberCores) {
  const auto ar = OpCode::kAllReduce;
  GroupShape roomy = shape({0, 0, 0, 0}, true, true);
  GroupShape crowded = roomy;
  crowded.outnumbered = true;
  EXPECT_TRUE(plan_call(roomy, sum(ar, kInPlaceMinBytes)).in_place);
  EXPECT_FALSE(plan_call(crowded, sum(ar, kInPlaceMinBytes)).in_place);  // one-shot
  EXPECT_FALSE(plan_call(crowded, sum(ar, kTwoShotMinBytesOutnumbered)).in_place);  // two-shot
  EXPECT_FALSE(plan_call(crowded, sum(ar, kInPlaceMinBytesAllReduceOutnumbered - 4)).in_place);
  EXPECT_TRUE(plan_call(crowded, sum(ar, kInPlaceMinBytesAllReduceOutnumbered)).in_place);
  EXPECT_TRUE(plan_call(crowded, sum(OpCode::kReduceScatter, kInPlaceMinBytes)).in_place);
  // Across servers the local phase keeps reading in place from kInPlaceMinBytes.
  GroupShape across = shape({0, 0, 1, 1}, true, true);
  across.outnumbered = true;
  const CallPlan hier = plan_call(across, sum(ar, kInPlaceMinBytes));
  EXPECT_EQ(hier.schedule, Schedule::kHierarchical);
  EXPECT_TRUE(hier.in_place);
}

// docs/architecture.md's table is plan_table(), row for row, and each row's
// example is decided as the row says.
TEST(Plan, TheArchitectureTableIsThePlansRules) {
  std::ifstream f(std::string(FG_SOURCE_DIR) + "/docs/architecture.md");
  std::string doc((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::string expected;
  // The channels a communicator makes: shared memory within a server (its
  // default ring), UCX between servers.
  const fastgather::transport::Capabilities within = {
      .inline_bytes = fastgather::transport::kInlineBytes,
      .max_step_bytes = fastgather::transport::ShmChannel::max_step_bytes_for(default_settings().ring_bytes),
      .pipeline_bytes = 64 << 10};
  for (const PlanRow& row : plan_table(within, fastgather::transport::NetChannel::capabilities())) {
    expected += fmt::format("| {} | {} | {} |\n", row.when, row.plan, row.cost);
    const CallPlan p = plan_call(row.group, row.example);
    ASSERT_TRUE(p.error.ok()) << row.when << ": " << p.error.to_string();
    std::string decided;
    if (row.plan.rfind("schedule: ", 0) == 0) {
      decided = std::string("schedule: ") + fastgather::to_string(p.schedule);
    } else if (row.plan.rfind("protocol: ", 0) == 0) {
      decided = std::string("protocol: ") + protocol_name(p.protocol);
    } else if (row.plan.rfind("in place", 0) == 0) {
      decided = p.in_place ? "in place" : "not in place";
    } else if (row.plan.rfind("over the steps", 0) == 0) {
      decided = p.over_steps ? "over the steps" : "not over the steps";
    }
    EXPECT_EQ(row.plan.rfind(decided, 0), 0u) << "row '" << row.when << "' says " << row.plan << "; plan_call: " << decided;
  }
  EXPECT_NE(doc.find(expected), std::string::npos) << "docs/architecture.md should hold this table as it is:\n" << expected;
}

namespace {
// Runs `calls` calls of `bytes` where each way costs what `cost` says; returns
// how often each way was picked in the last `tail` calls.
std::vector<int> drive(CopyInChooser& c, size_t bytes, int calls, int tail, double cached_ns, double streaming_ns,
                       int outlier_every = 0) {
  std::vector<int> picked(2, 0);
  for (int i = 0; i < calls; ++i) {
    const CopyIn how = c.pick(bytes);
    double ns = how == CopyIn::kCached ? cached_ns : streaming_ns;
    if (outlier_every != 0 && i % outlier_every == 0) ns *= 100;  // a preempted call
    c.record(bytes, how, ns);
    if (i >= calls - tail) ++picked[static_cast<size_t>(how)];
  }
  return picked;
}
}  // namespace

TEST(CopyInChooser, PicksTheFasterWayAndFollowsTheMachine) {
  ::unsetenv("FG_COPY_IN");
  CopyInChooser c;
  const size_t kb96 = 96 * 1024;
  auto p = drive(c, kb96, 1000, 500, 8000, 17000);  // cached faster, as on a quiet host
  EXPECT_GT(p[0], 480);                              // exploration costs at most ~2%
  EXPECT_GT(p[1], 0);                                // but it does explore
  p = drive(c, kb96, 3000, 500, 45000, 17000);       // the vCPUs moved apart: cached now slow
  EXPECT_GT(p[1], 480);
  p = drive(c, kb96, 3000, 500, 8000, 17000);        // and back
  EXPECT_GT(p[0], 480);
}

TEST(CopyInChooser, AnOutlierDoesNotFlipTheChoiceAndSmallSizesStayCached) {
  ::unsetenv("FG_COPY_IN");
  CopyInChooser c;
  auto p = drive(c, 1 << 20, 2000, 1000, 80000, 170000, 37);
  EXPECT_GT(p[0], 960);
  CopyInChooser small;
  EXPECT_EQ(drive(small, 4096, 100, 100, 50000, 1000)[0], 100);  // below the learned sizes
}

TEST(CopyInChooser, TheSettingsCanForceAWay) {
  CopyInChooser c(Settings::CopyIn::kStreaming);
  EXPECT_EQ(drive(c, 1 << 20, 100, 100, 1000, 9000)[1], 100);
  CopyInChooser cached(Settings::CopyIn::kCached);
  EXPECT_EQ(drive(cached, 1 << 20, 100, 100, 9000, 1000)[0], 100);
}

TEST(CopyIntoRing, BothWaysCopyEveryByte) {
  alignas(64) std::byte dst[4096 + 64];
  std::byte src[4096 + 7];
  for (size_t i = 0; i < sizeof(src); ++i) src[i] = static_cast<std::byte>(i * 7 + 3);
  for (CopyIn how : {CopyIn::kCached, CopyIn::kStreaming}) {
    for (size_t len : {size_t{0}, size_t{1}, size_t{31}, size_t{33}, size_t{4096 + 7}}) {
      std::memset(dst, 0, sizeof(dst));
      copy_into_ring(how, dst, src, len);
      EXPECT_EQ(std::memcmp(dst, src, len), 0) << len;
      EXPECT_EQ(static_cast<int>(dst[len]), 0) << "wrote past the end at " << len;
    }
  }
}

// Streaming copy-out at every alignment of dst and src: the head before the
// first cache line, whole lines, the tail; nothing written outside.
TEST(CopyOut, EveryByteAtEveryAlignmentBothWays) {
  alignas(64) std::byte dst[1024];
  alignas(64) std::byte src[1024];
  for (size_t i = 0; i < sizeof(src); ++i) src[i] = static_cast<std::byte>(i * 13 + 5);
  for (bool streaming : {false, true}) {
    for (size_t d = 0; d < 64; ++d) {
      for (size_t s = 0; s < 64; s += 7) {
        for (size_t len : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{65}, size_t{127}, size_t{128},
                           size_t{129}, size_t{500}, size_t{1024 - 64}}) {
          std::memset(dst, 0xEE, sizeof(dst));
          copy_out(dst + d, src + s, len, streaming);
          ASSERT_EQ(std::memcmp(dst + d, src + s, len), 0) << streaming << " d=" << d << " s=" << s << " len=" << len;
          for (size_t i = 0; i < sizeof(dst); ++i) {
            if (i < d || i >= d + len) {
              ASSERT_EQ(static_cast<int>(dst[i]), 0xEE) << "wrote byte " << i << " d=" << d << " len=" << len;
            }
          }
        }
      }
    }
  }
}

TEST(Topology, ServersAreRunsOfConsecutiveMembers) {
  // Members' servers, e.g. TP=1 DP=4 on 3 servers: ranks 0-1 | 2 | 3.
  Topology t = Topology::of({0, 0, 1, 2}, 1);
  EXPECT_EQ(t.servers(), 3);
  EXPECT_EQ(t.members(), 4);
  EXPECT_EQ(t.mine, 0);
  EXPECT_EQ(t.local_count(), 2);
  EXPECT_TRUE(t.local(0));
  EXPECT_FALSE(t.local(2));
  EXPECT_EQ(t.server_of(3), 2);
  EXPECT_EQ(t.leader(1), 2);
  EXPECT_FALSE(t.one_per_server());
  // A TP group with one member per server: [0,2] over servers 0 and 1.
  Topology u = Topology::of({0, 1}, 1);
  EXPECT_TRUE(u.one_per_server());
  EXPECT_EQ(u.mine, 1);
}

TEST(ScheduleChoice, DirectWhenSmallOrOnePerServerHierarchicalWhenLarge) {
  using fastgather::Schedule;
  Topology two_per_server = Topology::of({0, 0, 1, 1}, 0);
  Topology one_per_server = Topology::of({0, 1}, 0);
  const size_t big = Settings{}.hier_min_bytes;
  EXPECT_EQ(choose_schedule(two_per_server, big - 1, Schedule::kAuto, big), Schedule::kDirect);
  EXPECT_EQ(choose_schedule(two_per_server, big, Schedule::kAuto, big), Schedule::kHierarchical);
  EXPECT_EQ(choose_schedule(one_per_server, big, Schedule::kAuto, big), Schedule::kDirect);
  EXPECT_EQ(choose_schedule(two_per_server, 1000, Schedule::kAuto, 1000), Schedule::kHierarchical);
  // Forced schedules are kept, except that nothing (0 bytes) is never relayed.
  EXPECT_EQ(choose_schedule(two_per_server, 8, Schedule::kHierarchical, big), Schedule::kHierarchical);
  EXPECT_EQ(choose_schedule(two_per_server, big, Schedule::kDirect, big), Schedule::kDirect);
  EXPECT_EQ(choose_schedule(two_per_server, 0, Schedule::kHierarchical, big), Schedule::kDirect);
}

TEST(NetPieces, WholeRowsAndAtMost65536Pieces) {
  const size_t mib = size_t{1} << 20;
  const uint32_t most = fastgather::transport::NetChannel::capabilities().max_pieces;
  EXPECT_EQ(net_piece_bytes(100, 1, mib, most), mib);
  EXPECT_EQ(net_piece_bytes(100, 1, 100, most), 4096u);                           // at least 4 KiB
  EXPECT_EQ(net_piece_bytes(size_t{8} << 20, 3000, mib, most) % 3000, 0u);        // whole rows
  EXPECT_EQ(net_piece_bytes(100, size_t{3} << 20, mib, most), size_t{3} << 20);   // a row larger than a piece
  const size_t huge = size_t{1} << 37;                                             // 128 GiB: pieces grow
  EXPECT_LE((huge + net_piece_bytes(huge, 1, mib, most) - 1) / net_piece_bytes(huge, 1, mib, most), size_t{most});
  EXPECT_EQ(net_piece_bytes(huge, 1, mib, 0), mib);  // a channel that numbers any count: pieces stay as configured
}

// Every threshold a plan reads is cited to a heading of the document that
// measured it (or says it was not measured, and why), and docs/architecture.md holds the table as thresholds() makes it.
TEST(Thresholds, EachIsCitedToItsBenchmarkAndTheArchitectureShowsThem) {
  auto read = [](const std::string& name) {
    std::ifstream f(std::string(FG_SOURCE_DIR) + "/docs/" + name);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  };
  const std::vector<Threshold> all = thresholds();
  EXPECT_GE(all.size(), 11u);
  for (const Threshold& t : all) {
    const std::string cite = t.measured;
    if (cite.rfind("not measured: ", 0) == 0) continue;  // said so, with why
    const size_t colon = cite.find(": ");
    ASSERT_NE(colon, std::string::npos) << t.name << ": " << cite;
    const std::string doc = read(cite.substr(0, colon));
    ASSERT_FALSE(doc.empty()) << t.name << ": no docs/" << cite.substr(0, colon);
    const std::regex heading("(^|\\n)#+ " + std::regex_replace(cite.substr(colon + 2), std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)") + "\\n");
    EXPECT_TRUE(std::regex_search(doc, heading)) << t.name << " cites a heading docs/" << cite.substr(0, colon)
                                                 << " does not have: " << cite.substr(colon + 2);
  }
  // The constants plan_call reads are the table's.
  EXPECT_EQ(kTwoShotMinBytes, kTwoShot.bytes);
  EXPECT_EQ(kSumWholeMaxBytes, kSumWhole.bytes);
  const std::string table = thresholds_table();
  EXPECT_NE(read("architecture.md").find(table), std::string::npos)
      << "docs/architecture.md should hold this table as it is:\n" << table;
}
