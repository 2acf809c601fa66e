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

#include "fastgather/fastgather.hpp"
#include "harness.hpp"

using namespace fastgather;
using fgtest::check_pattern;
using fgtest::fill_pattern;

namespace {

constexpr size_t kMin = 1 << 20;  // FG_SINGLE_COPY_MIN_BYTES's default
const std::vector<size_t> kSizes = {4097, kMin - 1, kMin, kMin + 1, (3 << 20) + 5};

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

// Both forms of the all-gather at every size, every byte checked; whether
// single copy was used must match `expect_single` for sizes from kMin. The
// input is a Tensor (huge pages from 1 MiB), or with plain_input a
// std::vector (4 KiB pages, which single copy reads slower than the ring).
std::string gather_all_sizes(Group& g, bool expect_single, bool plain_input = false) {
  const int n = g.size();
  uint64_t it = 0;
  for (size_t bytes : kSizes) {
    ++it;
    Tensor tensor = Tensor::empty(DType::kU8, {static_cast<int64_t>(bytes)});
    std::vector<char> plain(plain_input ? bytes : 0);
    const TensorView in = plain_input ? TensorView(plain.data(), DType::kU8, {static_cast<int64_t>(bytes)}) : tensor.view();
    fill_pattern(in.data, bytes, g.ranks()[g.rank()], it);
    Tensor out = Tensor::empty(DType::kU8, {static_cast<int64_t>(bytes) * n});
    CallStats st;
    RANK_OK(all_gather(g, in, out.view(), {.stats = &st}));
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
    RANK_OK(all_gather(g, in, std::span<const TensorView>(views), {.stats = &st}));
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
std::string fused_large(Group& g, bool expect_single) {
  const int w = g.size();
  const int64_t k = 97, n = 5;
  for (int64_t m : {int64_t{700}, int64_t{6001}}) {  // 265 KB and 2.3 MB of x1 per rank (either side of kMin)
    Tensor x1 = Tensor::empty(DType::kF32, {m, k}), x2 = Tensor::empty(DType::kF32, {k, n});
    auto a = [&](int src, int64_t i, int64_t l) { return static_cast<float>((i * 3 + l * 5 + src * 7) % 9) - 4; };
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t l = 0; l < k; ++l) x1.data_as<float>()[i * k + l] = a(g.ranks()[g.rank()], i, l);
    }
    for (int64_t l = 0; l < k * n; ++l) x2.data_as<float>()[l] = static_cast<float>(l % 5) - 2;
    for (bool gather_output : {true, false}) {
      Tensor out = Tensor::empty(DType::kF32, {m * w, n});
      Tensor go = gather_output ? Tensor::empty(DType::kF32, {m * w, k}) : Tensor();
      CallStats st;
      RANK_OK(all_gather_matmul(g, x1.view(), x2.view(), std::nullopt, out.view(), go.view(),
                                {.gather_output = gather_output, .stats = &st}));
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

std::string body(const Config& c, bool expect_single, bool refuse_here) {
  if (refuse_here) refuse_cma();
  auto comm = Communicator::create(c);
  RANK_OK(comm.status());
  if (auto e = gather_all_sizes((*comm)->world(), expect_single); !e.empty()) return e;
  return fused_large((*comm)->world(), expect_single);
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

// Memory of 4 KiB pages (a std::vector, as PyTorch 1.13's tensors): the
// ring, decided by all from every owner's offer; FG_SINGLE_COPY=always reads
// it by single copy anyway; one rank's plain memory sends all to the ring.
TEST(SingleCopyPages, PlainMemoryGoesThroughTheRing) {
  fgtest::expect_all_ok(fgtest::run_job(3, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    return gather_all_sizes((*comm)->world(), false, true);
  }));
}

TEST(SingleCopyPages, AlwaysReadsPlainMemoryBySingleCopy) {
  fgtest::ScopedEnv env({std::pair<const char*, const char*>{"FG_SINGLE_COPY", "always"}});
  fgtest::expect_all_ok(fgtest::run_job(3, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    return gather_all_sizes((*comm)->world(), true, true);
  }));
}

TEST(SingleCopyPages, OneRanksPlainMemorySendsEveryoneToTheRing) {
  fgtest::expect_all_ok(fgtest::run_job(3, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    return gather_all_sizes((*comm)->world(), false, c.rank == 1);
  }));
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
