// Single copy (CMA): large blocks read straight from the owner's memory.
// Every byte for odd sizes around the threshold, both forms and the fused
// op, ranks outnumbering cores; the fallback to the ring when it is turned
// off and when the kernel refuses it (a seccomp filter makes
// process_vm_readv fail with EPERM, as a container's profile may);
// mismatches on the single-copy path.
#include <gtest/gtest.h>

#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "core/group_impl.hpp"
#include "fastgather/fastgather.hpp"
#include "harness.hpp"
#include "transport/wait_policy.hpp"

using namespace fastgather;
using fgtest::check_pattern;
using fgtest::fill_pattern;

namespace {

constexpr size_t kMin = 1 << 20;  // FG_SINGLE_COPY_MIN_BYTES's default
const std::vector<size_t> kSizes = {4097, kMin - 1, kMin, kMin + 1, (3 << 20) + 5};
// Also either side of where a symmetric input is read in place (4 KiB).
const std::vector<size_t> kSymmetricSizes = {1, 31, 4095, 4096, 4097, 40001, kMin - 1, kMin, kMin + 1, (3 << 20) + 5};

// process_vm_readv fails with EPERM from now on in this process.
void refuse_cma() {
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_process_vm_readv, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog prog{static_cast<unsigned short>(std::size(filter)), filter};
  ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
  ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog);
}

// Where an input lives: a Tensor (huge pages from 1 MiB), a std::vector
// (4 KiB pages, which CMA reads slower than the ring), or the group's
// symmetric heap (Group::empty: peers read it in place).
enum class Input { kTensor, kPlain, kSymmetric };

// Both forms of the all-gather at every size, every byte checked; whether
// single copy was used must match `expect_single` for sizes from kMin. A
// symmetric input is overwritten as soon as each call returns: a peer still
// reading it then would get those bytes.
std::string gather_all_sizes(Group& g, bool expect_single, Input input = Input::kTensor,
                             const std::vector<size_t>& sizes = kSizes) {
  const int n = g.size();
  uint64_t it = 0;
  for (size_t bytes : sizes) {
    ++it;
    const int64_t len = static_cast<int64_t>(bytes);
    Tensor tensor;
    if (input == Input::kSymmetric) {
      auto t = g.empty(DType::kU8, {len});
      RANK_OK(t.status());
      tensor = std::move(t).value();
    } else {
      tensor = Tensor::empty(DType::kU8, {len});
    }
    std::vector<char> plain(input == Input::kPlain ? bytes : 0);
    const TensorView in = input == Input::kPlain ? TensorView(plain.data(), DType::kU8, {len}) : tensor.view();
    auto spoil = [&] {
      if (input == Input::kSymmetric) std::memset(in.data, 0xA5, bytes);
    };
    fill_pattern(in.data, bytes, g.ranks()[g.rank()], it);
    Tensor out = Tensor::empty(DType::kU8, {static_cast<int64_t>(bytes) * n});
    CallStats st;
    RANK_OK(all_gather(g, in, out.view(), {.stats = &st}));
    spoil();
    RANK_CHECK(st.single_copy == (expect_single && bytes >= kMin), "{} bytes: single copy {}", bytes, st.single_copy);
    for (int i = 0; i < n; ++i) {
      const long long bad = check_pattern(out.data_as<char>() + static_cast<size_t>(i) * bytes, bytes, g.ranks()[i], it);
      RANK_CHECK(bad < 0, "contiguous, {} bytes: block of rank {} wrong at byte {}", bytes, g.ranks()[i], bad);
    }
    std::vector<Tensor> outs;
    std::vector<TensorView> views;
    for (int i = 0; i < n; ++i) {
      outs.push_back(Tensor::empty(DType::kU8, {static_cast<int64_t>(bytes)}));
      views.push_back(outs.back().view());
    }
    fill_pattern(in.data, bytes, g.ranks()[g.rank()], it);
    RANK_OK(all_gather(g, in, std::span<const TensorView>(views), {.stats = &st}));
    spoil();
    RANK_CHECK(st.single_copy == (expect_single && bytes >= kMin), "list, {} bytes: single copy {}", bytes, st.single_copy);
    for (int i = 0; i < n; ++i) {
      const long long bad = check_pattern(outs[i].data(), bytes, g.ranks()[i], it);
      RANK_CHECK(bad < 0, "list, {} bytes: buffer of rank {} wrong at byte {}", bytes, g.ranks()[i], bad);
    }
  }
  return "";
}

// The fused op, fp32 with small integers (exact), with and without
// gather_out, against the product computed here.
std::string fused_large(Group& g, bool expect_single, Input input = Input::kTensor) {
  const int w = g.size();
  const int64_t k = 97, n = 5;
  for (int64_t m : {int64_t{700}, int64_t{6001}}) {  // 265 KB and 2.3 MB of x1 per rank (either side of kMin)
    Tensor x1 = Tensor::empty(DType::kF32, {m, k}), x2 = Tensor::empty(DType::kF32, {k, n});
    if (input == Input::kSymmetric) {
      auto t = g.empty(DType::kF32, {m, k});
      RANK_OK(t.status());
      x1 = std::move(t).value();
    }
    auto a = [&](int src, int64_t i, int64_t l) { return static_cast<float>((i * 3 + l * 5 + src * 7) % 9) - 4; };
    auto fill_x1 = [&] {
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t l = 0; l < k; ++l) x1.data_as<float>()[i * k + l] = a(g.ranks()[g.rank()], i, l);
      }
    };
    for (int64_t l = 0; l < k * n; ++l) x2.data_as<float>()[l] = static_cast<float>(l % 5) - 2;
    for (bool gather_output : {true, false}) {
      Tensor out = Tensor::empty(DType::kF32, {m * w, n});
      Tensor go = gather_output ? Tensor::empty(DType::kF32, {m * w, k}) : Tensor();
      CallStats st;
      fill_x1();
      RANK_OK(all_gather_matmul(g, x1.view(), x2.view(), std::nullopt, out.view(), go.view(),
                                {.gather_output = gather_output, .stats = &st}));
      if (input == Input::kSymmetric) std::memset(x1.data(), 0xA5, x1.nbytes());  // a late reader would see this
      const bool big = static_cast<size_t>(m * k) * sizeof(float) >= kMin;
      RANK_CHECK(st.single_copy == (expect_single && big), "m={} gather_output={}: single copy {}", m, gather_output,
                 st.single_copy);
      for (int64_t row = 0; row < m * w; ++row) {
        const int src = g.ranks()[static_cast<size_t>(row / m)];
        const int64_t i = row % m;
        for (int64_t j = 0; j < n; ++j) {
          float want = 0;
          for (int64_t l = 0; l < k; ++l) want += a(src, i, l) * (static_cast<float>((l * n + j) % 5) - 2);
          const float got = out.data_as<float>()[row * n + j];
          RANK_CHECK(got == want, "m={} gather_output={}: output[{}][{}] = {}, want {}", m, gather_output, row, j, got, want);
          if (gather_output && j == 0) {
            for (int64_t l = 0; l < k; ++l) {
              RANK_CHECK(go.data_as<float>()[row * k + l] == a(src, i, l), "gather_out[{}][{}]", row, l);
            }
          }
        }
      }
    }
  }
  return "";
}

// A communicator, and gather_all_sizes() on its world group.
std::string world_gathers(const Config& c, bool expect_single, Input input, const std::vector<size_t>& sizes = kSizes) {
  auto comm = Communicator::create(c);
  RANK_OK(comm.status());
  return gather_all_sizes((*comm)->world(), expect_single, input, sizes);
}

std::string body(const Config& c, bool expect_single, bool refuse_here, Input input = Input::kTensor) {
  if (refuse_here) refuse_cma();
  auto comm = Communicator::create(c);
  RANK_OK(comm.status());
  if (input == Input::kSymmetric) RANK_CHECK((*comm)->world().has_symmetric_heap(), "no symmetric heap");
  if (auto e = gather_all_sizes((*comm)->world(), expect_single, input, kSymmetricSizes); !e.empty()) return e;
  return fused_large((*comm)->world(), expect_single, input);
}

}  // namespace

class SingleCopy : public ::testing::TestWithParam<int> {};

TEST_P(SingleCopy, EveryByteBothFormsAndTheFusedOp) {
  fgtest::expect_all_ok(fgtest::run_job(GetParam(), [](const Config& c) { return body(c, true, false); }));
}

// 2 ranks, and 3 and 5 on 2 cores.
INSTANTIATE_TEST_SUITE_P(WorldSizes, SingleCopy, ::testing::Values(2, 3, 5));

TEST(SingleCopyFallback, TurnedOffEveryByteGoesThroughTheRing) {
  fgtest::ScopedEnv env({std::pair<const char*, const char*>{"FG_SINGLE_COPY", "off"}});
  fgtest::expect_all_ok(fgtest::run_job(3, [](const Config& c) { return body(c, false, false); }));
}

// The kernel refuses process_vm_readv on every rank: no error, the ring.
TEST(SingleCopyFallback, RefusedByTheKernelEverywhere) {
  fgtest::expect_all_ok(fgtest::run_job(3, [](const Config& c) { return body(c, false, true); }));
}

// Refused on one rank only: the members agree on the ring, all of them.
TEST(SingleCopyFallback, RefusedOnOneRankTheWholeGroupUsesTheRing) {
  fgtest::expect_all_ok(fgtest::run_job(3, [](const Config& c) { return body(c, false, c.rank == 1); }));
}

// While the test runs, the host counts as crowded (or not) whatever it is:
// a crowded host makes owners offer ordinary memory (below).
struct PretendCrowd {
  explicit PretendCrowd(bool crowded) { transport::pretend_host_oversubscribed(crowded ? 1 : 0); }
  ~PretendCrowd() { transport::pretend_host_oversubscribed(-1); }
};

// Memory of 4 KiB pages (a std::vector, as PyTorch's tensors): on a quiet
// host the ring, decided by all from every owner's offer; FG_SINGLE_COPY=always
// reads it by single copy anyway; one rank's plain memory sends all to the ring.
TEST(SingleCopyPages, PlainMemoryGoesThroughTheRing) {
  PretendCrowd quiet(false);
  fgtest::expect_all_ok(fgtest::run_job(3, [](const Config& c) { return world_gathers(c, false, Input::kPlain); }));
}

// On a crowded host (more tasks runnable than cores beyond the job's ranks)
// each ring step waits a time slice for every member: owners offer ordinary
// memory for single copy too, up to 2 MiB a block; larger blocks take the ring.
TEST(SingleCopyPages, OnACrowdedHostPlainMemoryUpTo2MiBBySingleCopy) {
  PretendCrowd crowded(true);
  fgtest::expect_all_ok(fgtest::run_job(3, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    if (auto e = gather_all_sizes(g, true, Input::kPlain, {kMin - 1, kMin, kMin + 1, size_t{2} << 20}); !e.empty()) {
      return e;
    }
    return gather_all_sizes(g, false, Input::kPlain, {(size_t{2} << 20) + 1, (size_t{3} << 20) + 5});
  }));
}

TEST(SingleCopyPages, AlwaysReadsPlainMemoryBySingleCopy) {
  fgtest::ScopedEnv env({std::pair<const char*, const char*>{"FG_SINGLE_COPY", "always"}});
  fgtest::expect_all_ok(fgtest::run_job(3, [](const Config& c) { return world_gathers(c, true, Input::kPlain); }));
}

TEST(SingleCopyPages, OneRanksPlainMemorySendsEveryoneToTheRing) {
  PretendCrowd quiet(false);
  fgtest::expect_all_ok(fgtest::run_job(
      3, [](const Config& c) { return world_gathers(c, false, c.rank == 1 ? Input::kPlain : Input::kTensor); }));
}

// Different sizes above the threshold: a mismatch on every member, nobody
// reads a block whose owner is leaving, and the group stays usable.
TEST(SingleCopyFallback, MismatchOnTheSingleCopyPathLeavesTheGroupUsable) {
  fgtest::expect_all_ok(fgtest::run_job(3, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    const size_t bytes = c.rank == 2 ? (4 << 20) : (3 << 20);
    Tensor in = Tensor::empty(DType::kU8, {static_cast<int64_t>(bytes)});
    Tensor out = Tensor::empty(DType::kU8, {static_cast<int64_t>(bytes) * 3});
    Status s = all_gather(g, in.view(), out.view());
    RANK_CHECK(s.kind() == ErrorKind::kMismatch, "{}", s.to_string());
    return gather_all_sizes(g, true);
  }));
}

// Settings may differ between ranks: one rank planning single copy (its
// FG_SINGLE_COPY_MIN_BYTES lower) while the others plan copy-in/copy-out
// would read offers as ring bytes. The plan travels in the step headers: a
// mismatch on every member, naming single copy, and the group stays usable.
TEST(SingleCopyFallback, RanksWhoseSettingsPlanDifferentProtocolsDisagree) {
  fgtest::expect_all_ok(fgtest::run_job(3, [](const Config& c) -> std::string {
    Config mine = c;
    Settings s;
    if (c.rank == 1) s.single_copy_min_bytes = 64 << 10;
    mine.settings = s;
    auto comm = Communicator::create(mine);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    const size_t bytes = 256 << 10;
    Tensor in = Tensor::empty(DType::kU8, {static_cast<int64_t>(bytes)});
    Tensor out = Tensor::empty(DType::kU8, {static_cast<int64_t>(bytes) * 3});
    fill_pattern(in.data(), bytes, c.rank, 7);
    Status st = all_gather(g, in.view(), out.view());
    RANK_CHECK(st.kind() == ErrorKind::kMismatch && st.message().find("single copy") != std::string::npos,
               "planned differently, the call returned {}", st.to_string());
    // Below both thresholds the plans agree again.
    const size_t small = 32 << 10;
    Tensor in2 = Tensor::empty(DType::kU8, {static_cast<int64_t>(small)});
    Tensor out2 = Tensor::empty(DType::kU8, {static_cast<int64_t>(small) * 3});
    fill_pattern(in2.data(), small, c.rank, 8);
    RANK_OK(all_gather(g, in2.view(), out2.view()));
    for (int r = 0; r < 3; ++r) {
      RANK_CHECK(check_pattern(out2.data_as<char>() + r * small, small, r, 8) < 0, "block {}", r);
    }
    return "";
  }));
}

// Symmetric inputs (Group::empty): read in place by the peers, below kMin
// through the ring path's posts, from kMin through single copy's offers (or
// the ring path when single copy is off or refused); every byte, both forms
// and the fused op, each input overwritten as soon as its call returns.
class Symmetric : public ::testing::TestWithParam<int> {};

TEST_P(Symmetric, EveryByteBothFormsAndTheFusedOp) {
  fgtest::expect_all_ok(fgtest::run_job(GetParam(), [](const Config& c) { return body(c, true, false, Input::kSymmetric); }));
}

// 2 ranks, and 3 and 5 on 2 cores.
INSTANTIATE_TEST_SUITE_P(WorldSizes, Symmetric, ::testing::Values(2, 3, 5));

TEST(SymmetricFallback, SingleCopyOffReadsInPlaceThroughTheRingPath) {
  fgtest::ScopedEnv env({std::pair<const char*, const char*>{"FG_SINGLE_COPY", "off"}});
  fgtest::expect_all_ok(fgtest::run_job(3, [](const Config& c) { return body(c, false, false, Input::kSymmetric); }));
}

TEST(SymmetricFallback, CmaRefusedReadsInPlaceThroughTheRingPath) {
  fgtest::expect_all_ok(fgtest::run_job(3, [](const Config& c) { return body(c, false, true, Input::kSymmetric); }));
}

// Steps of 16 KiB: a block in place spans many steps, each posting where its piece is.
TEST(SymmetricFallback, SmallRingManyStepsInPlace) {
  fgtest::ScopedEnv env({std::pair<const char*, const char*>{"FG_RING_BYTES", "65536"},
                         std::pair<const char*, const char*>{"FG_SINGLE_COPY", "off"}});
  fgtest::expect_all_ok(fgtest::run_job(3, [](const Config& c) { return body(c, false, false, Input::kSymmetric); }));
}

// Pipeline steps of 65 cache lines (FG_PIPELINE_BYTES=4160): every block of
// the ring path spans many steps that end mid-row and mid-page, with the own
// block placed a step at a time, and single copy reads a heap block in such
// pieces; plain memory, symmetric inputs (single copy on, then off) and
// huge-page tensors with single copy off.
TEST(Pipeline, OddStepsEveryByte) {
  PretendCrowd quiet(false);  // plain memory through the ring even while the host is busy
  fgtest::ScopedEnv env({std::pair<const char*, const char*>{"FG_PIPELINE_BYTES", "4160"}});
  fgtest::expect_all_ok(fgtest::run_job(3, [](const Config& c) { return world_gathers(c, false, Input::kPlain); }));
  fgtest::expect_all_ok(fgtest::run_job(3, [](const Config& c) { return body(c, true, false, Input::kSymmetric); }));
  fgtest::ScopedEnv off({std::pair<const char*, const char*>{"FG_SINGLE_COPY", "off"}});
  fgtest::expect_all_ok(fgtest::run_job(3, [](const Config& c) { return body(c, false, false, Input::kTensor); }));
  fgtest::expect_all_ok(fgtest::run_job(3, [](const Config& c) { return body(c, false, false, Input::kSymmetric); }));
}

// Ranks that ask for different steps: the group's creator decides for all
// (its choice travels in the segment), so steps line up and every byte arrives.
TEST(Pipeline, RanksAskingForDifferentStepsFollowTheCreator) {
  fgtest::ScopedEnv off({std::pair<const char*, const char*>{"FG_SINGLE_COPY", "off"}});
  fgtest::expect_all_ok(fgtest::run_job(3, [](const Config& c) -> std::string {
    ::setenv("FG_PIPELINE_BYTES", c.rank == 0 ? "4160" : "1048576", 1);
    return body(c, false, false, Input::kTensor);
  }));
}

// One member's input is private, the others' symmetric: each block is read
// where its owner put it, and the owners in place still wait for their readers.
TEST(SymmetricMixed, OnePrivateInputAmongSymmetricOnes) {
  fgtest::expect_all_ok(fgtest::run_job(3, [](const Config& c) {
    return world_gathers(c, true, c.rank == 1 ? Input::kTensor : Input::kSymmetric, kSymmetricSizes);
  }));
}

// A tensor from another group's heap is private memory to this group.
TEST(SymmetricMixed, AnotherGroupsHeapIsPrivateHere) {
  fgtest::expect_all_ok(fgtest::run_job(4, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    auto tp = (*comm)->tp_group_of_dp(2, 2);  // {0,2} and {1,3}
    RANK_OK(tp.status());
    Group& w = (*comm)->world();
    for (size_t bytes : {size_t{40001}, (size_t{1} << 20) + 1}) {
      auto in = (*tp.value()).empty(DType::kU8, {static_cast<int64_t>(bytes)});
      RANK_OK(in.status());
      fill_pattern(in.value().data(), bytes, c.rank, bytes);
      Tensor out = Tensor::empty(DType::kU8, {static_cast<int64_t>(bytes) * 4});
      RANK_OK(all_gather(w, in.value().view(), out.view()));
      for (int i = 0; i < 4; ++i) {
        const long long bad = check_pattern(out.data_as<char>() + static_cast<size_t>(i) * bytes, bytes, i, bytes);
        RANK_CHECK(bad < 0, "{} bytes: block of rank {} wrong at byte {}", bytes, i, bad);
      }
    }
    return "";
  }));
}

// The heap: a clear error when full, room again once tensors are freed,
// tensors that outlive their group and communicator, bad shapes refused.
TEST(SymmetricHeap, FullFreedReusedAndOutlivingTheGroup) {
  fgtest::ScopedEnv env({std::pair<const char*, const char*>{"FG_SYMMETRIC_BYTES", "1048576"}});
  fgtest::expect_all_ok(fgtest::run_job(2, [](const Config& c) -> std::string {
    Tensor kept;
    {
      auto comm = Communicator::create(c);
      RANK_OK(comm.status());
      Group& g = (*comm)->world();
      RANK_CHECK(g.has_symmetric_heap(), "no heap");
      auto a = g.empty(DType::kF32, {128, 1024});  // 512 KiB
      RANK_OK(a.status());
      auto b = g.empty(DType::kU8, {300 << 10});
      RANK_OK(b.status());
      auto c3 = g.empty(DType::kU8, {300 << 10});
      RANK_CHECK(c3.status().kind() == ErrorKind::kResourceExhausted, "third block: {}", c3.status().to_string());
      RANK_CHECK(c3.status().message().find("FG_SYMMETRIC_BYTES") != std::string::npos, "{}", c3.status().message());
      auto big = g.empty(DType::kU8, {2 << 20});
      RANK_CHECK(big.status().kind() == ErrorKind::kResourceExhausted, "{}", big.status().to_string());
      auto neg = g.empty(DType::kU8, {-1});
      RANK_CHECK(neg.status().kind() == ErrorKind::kInvalidArgument, "{}", neg.status().to_string());
      a = Status{ErrorKind::kSystem, "dropped"};  // frees the 512 KiB block
      auto again = g.empty(DType::kU8, {500 << 10});
      RANK_OK(again.status());
      kept = std::move(b).value();
      fill_pattern(kept.data(), kept.nbytes(), c.rank, 7);
      Tensor out = Tensor::empty(DType::kU8, {static_cast<int64_t>(kept.nbytes()) * 2});
      RANK_OK(all_gather(g, kept.view(), out.view()));
      for (int i = 0; i < 2; ++i) {
        const long long bad = check_pattern(out.data_as<char>() + i * kept.nbytes(), kept.nbytes(), i, 7);
        RANK_CHECK(bad < 0, "block of rank {} wrong at byte {}", i, bad);
      }
      RANK_OK((*comm)->finalize());
    }
    // The communicator is gone; the tensor and its memory are not.
    fill_pattern(kept.data(), kept.nbytes(), c.rank, 8);
    RANK_CHECK(check_pattern(kept.data(), kept.nbytes(), c.rank, 8) < 0, "tensor unreadable after the group");
    return "";
  }));
}

TEST(SymmetricHeap, NoneWhenTurnedOffOrAlone) {
  fgtest::ScopedEnv env({std::pair<const char*, const char*>{"FG_SYMMETRIC_BYTES", "0"}});
  fgtest::expect_all_ok(fgtest::run_job(2, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    RANK_CHECK(!g.has_symmetric_heap(), "a heap with FG_SYMMETRIC_BYTES=0");
    auto t = g.empty(DType::kF32, {3, 5});
    RANK_OK(t.status());
    RANK_CHECK(t.value().nbytes() == 60, "{} bytes", t.value().nbytes());
    return gather_all_sizes(g, true, Input::kSymmetric, {1, 40001, kMin + 1});
  }));
}

// Copy-out with streaming stores at every size (FG_STREAM_OUT_BYTES=0): odd
// sizes put every block's start at another alignment; symmetric inputs,
// huge-page tensors (CMA) and the ring, both forms and the fused op.
TEST(StreamingCopyOut, EveryByteWhateverTheInput) {
  fgtest::ScopedEnv env({std::pair<const char*, const char*>{"FG_STREAM_OUT_BYTES", "0"}});
  fgtest::expect_all_ok(fgtest::run_job(3, [](const Config& c) { return body(c, true, false, Input::kSymmetric); }));
  fgtest::expect_all_ok(fgtest::run_job(3, [](const Config& c) { return body(c, true, false, Input::kTensor); }));
  fgtest::expect_all_ok(fgtest::run_job(3, [](const Config& c) { return body(c, false, true, Input::kPlain); }));
}

// The chooser of how to copy into the ring (algo/copy_in.*) learns from the
// calls that copy into it only: a block read where it lies in the heap
// copies nothing, and its calls' times, filed under either way, made the
// two look alike (fg-bench --compare alternates heap and private inputs on
// one group). Below single copy's size, so that both go through the ring.
TEST(CopyIn, OnlyCallsThatCopyIntoTheRingTeachTheChooser) {
  fgtest::expect_all_ok(fgtest::run_job(2, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    RANK_CHECK(g.has_symmetric_heap(), "no symmetric heap");
    constexpr size_t kBytes = 384 << 10;
    constexpr int kCalls = 12;
    const algo::CopyInChooser& chooser = impl_of(g)->copy_in;
    auto heap = g.empty(DType::kU8, {static_cast<int64_t>(kBytes)});
    RANK_OK(heap.status());
    std::vector<char> plain(kBytes);
    Tensor out = Tensor::empty(DType::kU8, {static_cast<int64_t>(kBytes) * 2});
    uint64_t it = 0;
    for (bool from_heap : {true, false}) {
      const uint64_t before = chooser.recorded(kBytes);
      const TensorView in = from_heap ? heap.value().view() : TensorView(plain.data(), DType::kU8, {static_cast<int64_t>(kBytes)});
      for (int k = 0; k < kCalls; ++k) {
        ++it;
        fill_pattern(in.data, kBytes, g.rank(), it);
        CallStats st;
        RANK_OK(all_gather(g, in, out.view(), {.stats = &st}));
        RANK_CHECK(st.in_place == from_heap && !st.single_copy, "heap {}: in place {}, single copy {}", from_heap,
                   st.in_place, st.single_copy);
        for (int r = 0; r < 2; ++r) {
          const long long bad = check_pattern(out.data_as<char>() + static_cast<size_t>(r) * kBytes, kBytes, r, it);
          RANK_CHECK(bad < 0, "heap {}: rank {}'s block wrong at byte {}", from_heap, r, bad);
        }
      }
      const uint64_t learned = chooser.recorded(kBytes) - before;
      RANK_CHECK(learned == (from_heap ? 0 : kCalls), "{} calls from {}: the chooser recorded {}", kCalls,
                 from_heap ? "the heap" : "ordinary memory", learned);
    }
    return "";
  }));
}
