// The transport layer with the engine's wait loop: two members of one
// segment in one process (threads), stepping, waiting, timing out, aborting
// and cleaning up.
#include <gtest/gtest.h>

#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include <fmt/format.h>

#include "harness.hpp"
#include "engine/waits.hpp"
#include "transport/shm_channel.hpp"
#include "transport/shm_segment.hpp"

using namespace fastgather;
using namespace fastgather::transport;
using namespace std::chrono_literals;

namespace {

constexpr size_t kRing = 64 * 1024;

struct Pair {
  std::unique_ptr<ShmChannel> a, b;
  WaitPolicy policy;
};

// One wait, run by the engine as an operation of its own (its deadline is
// the policy's timeout from now).
Result<const PostLine*> wait_on(ShmChannel& ch, const WaitPolicy& p, int member, uint64_t step) {
  const PostLine* got = nullptr;
  auto op = [&]() -> engine::Task<Status> {
    if (Status r = co_await engine::arrival(ch, member, step); !r.ok()) co_return r;
    got = &ch.line(member, step);
    co_return Status::Ok();
  };
  engine::DriveOptions o;
  o.policy = p;
  if (Status s = engine::Driver::run(op(), o); !s.ok()) return s;
  return got;
}

Pair make_pair(std::chrono::milliseconds timeout, std::chrono::milliseconds sleep_slice = std::chrono::milliseconds(10)) {
  static int serial = 0;
  const std::string name = ShmSegment::segment_name("test", ::getpid(), serial++);
  const size_t bytes = ShmChannel::segment_bytes(2, kRing);
  auto created = ShmSegment::create(name, bytes);
  EXPECT_TRUE(created.ok());
  ShmChannel::format(created.value().data(), 2, kRing);
  // Member 1 shares member 0's mapping (alias_of): one address per byte, so
  // ThreadSanitizer sees both members' accesses to it.
  ShmSegment alias = ShmSegment::alias_of(created.value());
  WaitPolicy p;
  p.timeout = timeout;
  p.spin = 1us;
  p.yield = 10us;
  p.sleep_slice = sleep_slice;
  Pair pr;
  pr.policy = p;
  pr.a = std::make_unique<ShmChannel>(std::move(created).value(), std::vector<int>{0, 1}, 0, kRing, "test group");
  pr.b = std::make_unique<ShmChannel>(std::move(alias), std::vector<int>{0, 1}, 1, kRing, "test group");
  for (auto* c : {pr.a.get(), pr.b.get()}) {
    EXPECT_TRUE(c->check_format().ok());
    c->publish_pid();
  }
  EXPECT_TRUE(pr.a->watch_members().ok());
  EXPECT_TRUE(pr.b->watch_members().ok());
  pr.a->unlink_name();
  return pr;
}

}  // namespace

TEST(ShmChannel, StepsCarryHeadersAndInlineBytesInOrder) {
  Pair p = make_pair(5000ms);
  std::thread peer([&] {
    for (uint64_t i = 0; i < 20000; ++i) {
      const uint64_t step = p.b->next_step();
      uint32_t at = 0;
      std::byte* d = p.b->claim(256, &at);
      std::memset(d, static_cast<int>(i & 0xff), 256);  // ring data, published by the post
      PostHeader h{.bytes = i, .aux = i * 3, .op = 1, .dtype = 2, .offset = at};
      p.b->post(step, h, &i, sizeof(i));
      auto line = wait_on(*p.b, p.policy, 0, step);
      ASSERT_TRUE(line.ok());
    }
  });
  for (uint64_t i = 0; i < 20000; ++i) {
    const uint64_t step = p.a->next_step();
    p.a->post(step, PostHeader{});
    auto line = wait_on(*p.a, p.policy, 1, step);
    ASSERT_TRUE(line.ok()) << line.status().to_string();
    ASSERT_EQ(line.value()->header.bytes, i);
    ASSERT_EQ(line.value()->header.aux, i * 3);
    uint64_t inl = 0;
    std::memcpy(&inl, line.value()->inline_data, sizeof(inl));
    ASSERT_EQ(inl, i);
    const std::byte* data = p.a->member_data(1, line.value()->header.offset);
    for (int b = 0; b < 256; ++b) ASSERT_EQ(static_cast<int>(data[b]), static_cast<int>(i & 0xff));
  }
  peer.join();
}

// Each post says which CPU it came from, so that a peer waiting for the
// member's next post on that same CPU yields instead of spinning
// (engine::Waiter::comes_from_cpu).
TEST(ShmChannel, APostSaysWhichCpuItCameFrom) {
  Pair p = make_pair(5000ms);
  EXPECT_EQ(p.b->member_cpu(0), -1);  // nothing posted yet
  cpu_set_t allowed;
  ASSERT_EQ(::sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  int tried = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE && tried < 2; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    ++tried;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    ASSERT_EQ(::sched_setaffinity(0, sizeof(one), &one), 0);  // this thread
    const uint64_t step = p.a->next_step();
    p.a->post(step, PostHeader{});
    EXPECT_EQ(p.b->member_cpu(0), cpu);
    engine::Arrival next(*p.b, 0, step + 1);
    EXPECT_TRUE(next.comes_from_cpu(cpu));
    EXPECT_FALSE(next.comes_from_cpu(cpu + 1));
  }
  ASSERT_EQ(::sched_setaffinity(0, sizeof(allowed), &allowed), 0);
  EXPECT_GE(tried, 1);
}

// Catches: members cutting blocks into steps of different sizes (each its
// own FG_PIPELINE_BYTES): the creator's choice travels in the segment, and a
// value format() would not write is a corrupt segment.
TEST(ShmChannel, PipelineStepIsTheCreatorsAndWholeLines) {
  EXPECT_EQ(ShmChannel::pipeline_bytes_for(kRing, 0), kRing / 4);
  EXPECT_EQ(ShmChannel::pipeline_bytes_for(kRing, 1000), 960u);
  EXPECT_EQ(ShmChannel::pipeline_bytes_for(kRing, 10), 64u);
  EXPECT_EQ(ShmChannel::pipeline_bytes_for(kRing, size_t{1} << 30), kRing / 4);
  Pair p = make_pair(1000ms);
  EXPECT_EQ(p.a->pipeline_bytes(), kRing / 4);  // make_pair formats without one: a step's maximum
  const std::string name = ShmSegment::segment_name("test", ::getpid(), 9999);
  auto seg = ShmSegment::create(name, ShmChannel::segment_bytes(2, kRing));
  ASSERT_TRUE(seg.ok());
  ShmChannel::format(seg.value().data(), 2, kRing, 1000);
  auto opened = ShmSegment::open(name, ShmChannel::segment_bytes(2, kRing));
  ASSERT_TRUE(opened.ok());
  std::byte* header = seg.value().data();
  ShmChannel creator(std::move(seg).value(), {0, 1}, 0, kRing, "test group");
  creator.unlink_name();
  {
    ShmChannel member(ShmSegment::alias_of(opened.value()), {0, 1}, 1, kRing, "test group");
    EXPECT_TRUE(member.check_format().ok());
    EXPECT_EQ(member.pipeline_bytes(), 960u);
  }
  uint32_t bad = 1000;  // not whole lines
  std::memcpy(header + 12, &bad, sizeof(bad));  // SegmentHeader::pipeline_bytes
  ShmChannel member(std::move(opened).value(), {0, 1}, 1, kRing, "test group");
  EXPECT_EQ(member.check_format().kind(), ErrorKind::kSystem);
}

// Catches: claims that overlap the previous step's bytes (claim() pinned to
// 0, or a cursor that does not advance), misaligned claims, claims past the ring.
TEST(ShmChannel, RingClaimsWrapAndStayLineAligned) {
  Pair p = make_pair(1000ms);
  EXPECT_EQ(p.a->max_step_bytes(), kRing / 4);
  uint32_t prev_off = 0, prev_end = 0;
  size_t claimed = 0;
  int wraps = 0;
  for (int i = 0; i < 100; ++i) {
    const size_t len = 1 + static_cast<size_t>(i * 997) % p.a->max_step_bytes();
    uint32_t off = 0;
    std::byte* d = p.a->claim(len, &off);
    EXPECT_EQ(off % 64, 0u);
    EXPECT_LE(off + len, kRing);
    EXPECT_EQ(d, p.a->member_data(0, off));
    // Consecutive claims never overlap (a peer may still read the previous one).
    if (i > 0) {
      EXPECT_FALSE(off < prev_end && prev_off < off + len)
          << "claim " << i << " [" << off << ", " << off + len << ") overlaps [" << prev_off << ", " << prev_end << ")";
      wraps += off < prev_off ? 1 : 0;
    }
    prev_off = off;
    prev_end = off + static_cast<uint32_t>(len);
    claimed += (len + 63) / 64 * 64;
  }
  // Lines are reused only after the ring has gone round: as many wraps as the bytes claimed fill rings.
  EXPECT_LE(wraps, static_cast<int>(claimed / (kRing / 2)));
  EXPECT_GE(wraps, static_cast<int>(claimed / kRing) - 1);
}

TEST(ShmChannel, WaitTimesOutNamingThePeerAndStaysBroken) {
  Pair p = make_pair(300ms);
  const auto t0 = std::chrono::steady_clock::now();
  auto r = wait_on(*p.a, p.policy, 1, p.a->next_step());
  const auto took = std::chrono::steady_clock::now() - t0;
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().kind(), ErrorKind::kTimeout);
  EXPECT_NE(r.status().message().find("rank 1 did not arrive within 300 ms"), std::string::npos) << r.status().message();
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, 2s);
  // Sticky: the next wait fails at once, and the peer sees this member aborted.
  EXPECT_EQ(wait_on(*p.a, p.policy, 1, p.a->next_step()).status().kind(), ErrorKind::kTimeout);
  auto seen = wait_on(*p.b, p.policy, 0, 1000);
  EXPECT_EQ(seen.status().kind(), ErrorKind::kPeerLost);
  EXPECT_NE(seen.status().message().find("rank 0 aborted"), std::string::npos) << seen.status().message();
}

// Catches: a post that does not wake a sleeping waiter (the futex wake
// deleted). The waiter sleeps in 15 s slices here, so without the wake it
// would stay asleep past the bound below.
TEST(ShmChannel, SleepingWaiterIsWokenByPost) {
  Pair p = make_pair(60000ms, 15000ms);
  const uint64_t step = p.a->next_step();
  std::thread late([&] {
    std::this_thread::sleep_for(200ms);  // long past spin and yield: the waiter is on the futex
    p.b->post(p.b->next_step(), PostHeader{.bytes = 7});
  });
  const auto t0 = std::chrono::steady_clock::now();
  auto r = wait_on(*p.a, p.policy, 1, step);
  const auto waited = std::chrono::steady_clock::now() - t0;
  late.join();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r.value()->header.bytes, 7u);
  // 200 ms until the post; a generous bound for a loaded machine under ASan.
  EXPECT_LT(waited, 10s) << "the post did not wake the sleeping waiter";
}

TEST(ShmSegment, NamesAreSweptWhenTheirCreatorIsDead) {
  pid_t child = ::fork();
  if (child == 0) {
    auto s = ShmSegment::create(ShmSegment::segment_name("sweeptest", ::getpid(), 0), 4096);
    if (!s.ok()) ::_exit(1);
    ::raise(SIGKILL);  // dies holding the name
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  const std::string prefix = fmt::format("fg-sweeptest-{}-0r", child);
  auto has = [&] {
    auto v = fgtest::fg_segments();
    return std::any_of(v.begin(), v.end(), [&](const std::string& n) { return n.rfind(prefix, 0) == 0; });
  };
  ASSERT_TRUE(has());
  EXPECT_GE(ShmSegment::sweep_stale(), 1);
  EXPECT_FALSE(has());
}

// A local user can read a job's id and its ranks' pids in /dev/shm; the
// names they would need to create first must not follow from those.
TEST(ShmSegment, NamesCannotBePredictedFromJobPidAndSerial) {
  const std::string a = ShmSegment::segment_name("job", 42, 0), b = ShmSegment::segment_name("job", 42, 0);
  EXPECT_NE(a, b);
  EXPECT_EQ(a.rfind(ShmSegment::job_prefix("job") + "42-0r", 0), 0u) << a;
  EXPECT_GE(a.size(), ShmSegment::job_prefix("job").size() + 4 + 16) << a;
}

TEST(ShmSegment, CreatedPrivateAndGoneAfterDestruction) {
  const std::string name = ShmSegment::segment_name("modetest", ::getpid(), 0);
  {
    auto s = ShmSegment::create(name, 8192);
    ASSERT_TRUE(s.ok());
    struct stat st {};
    ASSERT_EQ(::stat(("/dev/shm" + name).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
  }
  auto v = fgtest::fg_segments();
  EXPECT_EQ(std::find(v.begin(), v.end(), name.substr(1)), v.end());
}

// Assigning one segment over another releases what the target held (its
// name and mapping) and takes the other's, which stays usable.
TEST(ShmSegment, MoveAssignmentReleasesTheTargetAndKeepsTheSource) {
  auto a = ShmSegment::create(ShmSegment::segment_name("movetest", ::getpid(), 1), 8192);
  auto b = ShmSegment::create(ShmSegment::segment_name("movetest", ::getpid(), 2), 4096);
  ASSERT_TRUE(a.ok() && b.ok());
  const std::string a_name = a.value().name(), b_name = b.value().name();
  a.value().data()[8191] = std::byte{7};
  ShmSegment& target = b.value();
  target = std::move(a).value();
  auto v = fgtest::fg_segments();
  EXPECT_EQ(std::find(v.begin(), v.end(), b_name.substr(1)), v.end()) << "the target's segment was not released";
  EXPECT_NE(std::find(v.begin(), v.end(), a_name.substr(1)), v.end());
  EXPECT_EQ(target.name(), a_name);
  EXPECT_EQ(target.size(), 8192u);
  EXPECT_EQ(target.data()[8191], std::byte{7});
}
