// The algorithm layer's decisions: the protocol table and the learned copy-in.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "algo/allgather.hpp"
#include "algo/copy_in.hpp"

using namespace fastgather::algo;

TEST(ProtocolTable, InlineUpTo32BytesThenCopyInOut) {
  EXPECT_EQ(choose_protocol(0).protocol, Protocol::kInline);
  EXPECT_EQ(choose_protocol(32).protocol, Protocol::kInline);
  EXPECT_EQ(choose_protocol(33).protocol, Protocol::kCopyInOut);
  EXPECT_EQ(choose_protocol(size_t{1} << 40).protocol, Protocol::kCopyInOut);
  auto table = protocol_table();
  for (size_t i = 1; i < table.size(); ++i) EXPECT_LT(table[i - 1].max_bytes, table[i].max_bytes);
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

TEST(CopyInChooser, TheEnvironmentCanForceAWay) {
  ::setenv("FG_COPY_IN", "streaming", 1);
  CopyInChooser c;
  EXPECT_EQ(drive(c, 1 << 20, 100, 100, 1000, 9000)[1], 100);
  ::unsetenv("FG_COPY_IN");
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
