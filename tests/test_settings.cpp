// Settings: read from the environment once per communicator, or set in code
// through Config::settings, and then followed by the communicator's groups
// alone (issue 22, item 1).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "base/caches.hpp"
#include "ops/gemm.hpp"
#include "fastgather/fastgather.hpp"
#include "harness.hpp"

using namespace fastgather;

// FG_FUSED_GEMM=avx2 keeps the fused ops on the AVX2 kernel where the CPU
// has AVX-512 (how the tests reach that kernel on such a CPU); unset, the
// CPU decides; openblas, or more than one GEMM thread, is OpenBLAS.
TEST(Settings, FusedGemmAvx2PicksTheAvx2KernelWhateverTheCpu) {
  if (!ops::packed_gemm_supported()) GTEST_SKIP() << "no AVX2/FMA/F16C: every setting is OpenBLAS";
  const bool avx512 = __builtin_cpu_supports("avx512f");
  for (auto [word, want] : std::vector<std::pair<const char*, ops::GemmKernel>>{
           {"avx2", ops::GemmKernel::kAvx2},
           {"packed", avx512 ? ops::GemmKernel::kAvx512 : ops::GemmKernel::kAvx2},
           {"openblas", ops::GemmKernel::kOpenBlas}}) {
    fgtest::ScopedEnv e({std::pair<const char*, const char*>{"FG_FUSED_GEMM", word}});
    auto s = Settings::from_environment();
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    EXPECT_EQ(ops::gemm_kernel(1, s.value()), want) << word;
    EXPECT_EQ(ops::gemm_kernel(2, s.value()), ops::GemmKernel::kOpenBlas) << word;
  }
  fgtest::ScopedEnv e({std::pair<const char*, const char*>{"FG_FUSED_GEMM", "avx2"}});
  auto s = Settings::from_environment();
  ASSERT_TRUE(s.ok());
  EXPECT_NE(s.value().describe().find("FG_FUSED_GEMM=avx2"), std::string::npos) << s.value().describe();
}

TEST(Settings, FromTheEnvironmentWithEveryVariableChecked) {
  {
    fgtest::ScopedEnv e({{"FG_RING_BYTES", "65536"}, {"FG_SINGLE_COPY", "off"}, {"FG_SPIN_US", "7"},
                         {"FG_FUSED_GEMM", "openblas"}, {"FG_COPY_IN", "cached"}});
    auto s = Settings::from_environment();
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    EXPECT_EQ(s.value().ring_bytes, 65536u);
    EXPECT_EQ(s.value().single_copy, Settings::SingleCopy::kOff);
    EXPECT_EQ(s.value().spin, std::chrono::microseconds(7));
    EXPECT_FALSE(s.value().yield.has_value());
    EXPECT_EQ(s.value().fused_gemm, Settings::FusedGemm::kOpenBlas);
    EXPECT_EQ(s.value().copy_in, Settings::CopyIn::kCached);
    EXPECT_NE(s.value().describe().find("FG_RING_BYTES=65536"), std::string::npos) << s.value().describe();
    EXPECT_FALSE(s.value().stream_out_bytes.has_value());  // unset: the machine's default
    EXPECT_GT(s.value().effective_stream_out_bytes(), 0u);
  }
  {
    // 0 is a value (stream always), not "the default".
    fgtest::ScopedEnv e({{"FG_STREAM_OUT_BYTES", "0"}, {"FG_PIPELINE_BYTES", "4160"}});
    auto s = Settings::from_environment();
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(s.value().effective_stream_out_bytes(), 0u);
    EXPECT_EQ(s.value().effective_pipeline_bytes(), 4160u);
  }
  fgtest::ScopedEnv bad({{"FG_NET_PIECE_BYTES", "12k"}, {"FG_LOG_SETTINGS", "1"}});
  auto s = Settings::from_environment();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("FG_NET_PIECE_BYTES"), std::string::npos) << s.status().message();
}

// Where sysfs reports a server's whole last-level cache (480 MiB on a Xeon
// VM), streaming stores start from a quarter of 128 MiB, not of 480: the
// default threshold follows the cache a call can count on.
TEST(Settings, StreamingStoresStartFromAQuarterOfAtMost128MiBOfCache) {
  constexpr size_t kMiB = size_t{1} << 20;
  EXPECT_EQ(base::counted_llc_bytes(480 * kMiB), 128 * kMiB);
  EXPECT_EQ(base::counted_llc_bytes(129 * kMiB), 128 * kMiB);
  EXPECT_EQ(base::counted_llc_bytes(128 * kMiB), 128 * kMiB);
  EXPECT_EQ(base::counted_llc_bytes(32 * kMiB), 32 * kMiB);
  EXPECT_EQ(base::counted_llc_bytes(0), 32 * kMiB);  // unknown: 8 MiB of output, as before
  // This machine's default, from what its sysfs says.
  Settings s;
  EXPECT_EQ(s.effective_stream_out_bytes(), base::counted_llc_bytes(base::cache_bytes(0)) / 4);
  EXPECT_LE(s.effective_stream_out_bytes(), 32 * kMiB);
}

TEST(Settings, ValuesSetInCodeAreCheckedLikeTheEnvironments) {
  Settings s;
  EXPECT_TRUE(s.validate().ok());
  s.ring_bytes = 100;
  Status st = s.validate();
  EXPECT_EQ(st.kind(), ErrorKind::kInvalidArgument);
  EXPECT_NE(st.message().find("FG_RING_BYTES=100 is outside 16384.."), std::string::npos) << st.message();
  Settings t;
  t.spin = std::chrono::microseconds(5'000'000);
  EXPECT_NE(t.validate().message().find("FG_SPIN_US"), std::string::npos);
}

// Config::settings wins over the environment, and two communicators of one
// process follow their own: no heap where the code says 0 although the
// environment asks for one, and a heap in the next communicator, which reads
// the environment.
TEST(Settings, ConfigSettingsWinAndEachCommunicatorFollowsItsOwn) {
  fgtest::ScopedEnv e({{"FG_SYMMETRIC_BYTES", "2097152"}, {"FG_LOG_SETTINGS", "1"}});
  const int second_port = fgtest::free_port();
  auto results = fgtest::run_job(2, [&](const Config& base) -> std::string {
    Config c = base;
    Settings s;
    s.symmetric_bytes = 0;
    s.ring_bytes = 65536;
    c.settings = s;
    {
      auto comm = Communicator::create(c);
      RANK_OK(comm.status());
      RANK_CHECK(!(*comm)->world().has_symmetric_heap(), "Config::settings said no heap; the environment was followed");
      auto g = (*comm)->new_group({0, 1});
      RANK_OK(g.status());
      RANK_CHECK(!g.value()->has_symmetric_heap(), "a later group did not follow the communicator's settings");
      // Every byte right with a 64 KiB ring: 1 MiB per rank moves in many steps.
      for (size_t bytes : {size_t{1} << 20, size_t{3}, size_t{65536}}) {
        Tensor in = Tensor::empty(DType::kU8, {static_cast<int64_t>(bytes)});
        Tensor out = Tensor::empty(DType::kU8, {static_cast<int64_t>(bytes) * 2});
        fgtest::fill_pattern(in.data(), bytes, c.rank, bytes);
        RANK_OK(all_gather(*g.value(), in.view(), out.view()));
        for (int r = 0; r < 2; ++r) {
          const auto* block = static_cast<const std::byte*>(out.data()) + r * bytes;
          RANK_CHECK(fgtest::check_pattern(block, bytes, r, bytes) < 0, "{} bytes: rank {}'s block wrong", bytes, r);
        }
      }
    }
    Config from_env = base;
    from_env.master_port = second_port;
    auto comm = Communicator::create(from_env);
    RANK_OK(comm.status());
    RANK_CHECK((*comm)->world().has_symmetric_heap(), "the environment's FG_SYMMETRIC_BYTES was not followed");
    return "";
  });
  fgtest::expect_all_ok(results);
}

TEST(Settings, ARangeErrorInConfigSettingsIsRefusedByName) {
  auto results = fgtest::run_job(2, [](const Config& base) -> std::string {
    Config c = base;
    Settings s;
    s.net_piece_bytes = 1;
    c.settings = s;
    auto comm = Communicator::create(c);
    RANK_CHECK(!comm.ok(), "a 1-byte net piece was accepted");
    RANK_CHECK(comm.status().message().find("FG_NET_PIECE_BYTES=1") != std::string::npos, "{}", comm.status().message());
    return "";
  }, {.timeout = std::chrono::milliseconds(2000)});
  fgtest::expect_all_ok(results);
}

// The group's copy-in learner is wired into its calls: forced one way by the
// settings, every ring call copies in that way; learning, the first calls at
// a learned size try both ways (CallStats::streamed_in says which).
TEST(CopyIn, TheGroupsLearnerDecidesHowEachCallCopiesIn) {
  const int ports[3] = {fgtest::free_port(), fgtest::free_port(), fgtest::free_port()};
  auto results = fgtest::run_job(2, [&](const Config& base) -> std::string {
    for (auto way : {Settings::CopyIn::kStreaming, Settings::CopyIn::kCached, Settings::CopyIn::kLearned}) {
      Config c = base;
      Settings s;
      s.copy_in = way;
      s.single_copy = Settings::SingleCopy::kOff;  // the ring, where copy-in happens
      c.settings = s;
      c.master_port = ports[static_cast<int>(way)];  // a communicator per way, one after another
      auto comm = Communicator::create(c);
      RANK_OK(comm.status());
      const int64_t bytes = 256 << 10;
      Tensor in = Tensor::zeros(DType::kU8, {bytes}), out = Tensor::zeros(DType::kU8, {2 * bytes});
      int streamed = 0, cached = 0;
      for (int i = 0; i < 8; ++i) {
        CallStats st;
        RANK_OK(all_gather((*comm)->world(), in.view(), out.view(), {.stats = &st}));
        (st.streamed_in ? streamed : cached)++;
      }
      if (way == Settings::CopyIn::kStreaming) RANK_CHECK(streamed == 8, "forced streaming, {} of 8 streamed", streamed);
      if (way == Settings::CopyIn::kCached) RANK_CHECK(cached == 8, "forced cached, {} of 8 cached", cached);
      if (way == Settings::CopyIn::kLearned) {
        RANK_CHECK(streamed > 0 && cached > 0, "learning: {} streamed, {} cached of 8 (both ways are tried first)",
                   streamed, cached);
      }
    }
    return "";
  });
  fgtest::expect_all_ok(results);
}
