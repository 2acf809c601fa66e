// Runs a test body in real rank processes: fork per rank, a fresh port per
// job, each rank's failure text sent back over a pipe, and a hard deadline
// after which the whole job is killed and reported as a hang.
#pragma once

#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "fastgather/fastgather.hpp"

namespace fgtest {

struct RankResult {
  int exit_code = -1;  // -1: killed
  int signal = 0;
  std::string error;   // what the rank reported
  int pid = 0;
};

struct JobOptions {
  std::chrono::milliseconds timeout{5000};  // communicator timeout
  std::chrono::seconds hang_limit{120};     // whole job
  std::string token;
  int port = 0;  // 0: a free one
  // Simulated servers: ranks take consecutive blocks (Config::server_of); all
  // run on this host, so what crosses servers goes over UCX on TCP loopback.
  int servers = 1;
};

// body returns "" on success or a description of what went wrong.
using RankBody = std::function<std::string(const fastgather::Config&)>;

int free_port();

// Reaps this process's children until none is left (true) or `within` has
// passed (false), looking every `every`. A subreaper (PR_SET_CHILD_SUBREAPER)
// counts the orphans below it too: "nothing left" of a job it started.
bool reap_all_children(std::chrono::milliseconds within, std::chrono::milliseconds every);
std::vector<RankResult> run_job(int world, const RankBody& body, const JobOptions& options = {});
// A job over two (simulated) servers, with its own token and group timeout.
JobOptions two_servers(std::string token, std::chrono::milliseconds timeout);
// Fails the current test with every rank's error unless all succeeded.
void expect_all_ok(const std::vector<RankResult>& results);

// Deterministic byte pattern of (rank, iteration) used by collectives tests.
void fill_pattern(void* dst, size_t bytes, int rank, uint64_t iteration);
// Returns the first mismatching offset, or -1.
long long check_pattern(const void* src, size_t bytes, int rank, uint64_t iteration);

// A rank body: in this rank's TP x DP group, `iterations` all-gathers cycling
// through `sizes` bytes, every byte checked. "" on success.
std::string gather_mixed_sizes(const fastgather::Config& c, int tp, int dp, std::vector<size_t> sizes,
                               uint64_t iterations);

// One all-gather of `bytes` of zeros per rank into a fresh output; for tests
// that care about the status (errors, timing), not the data.
fastgather::Status gather_bytes(fastgather::Group& g, size_t bytes, fastgather::DType dtype = fastgather::DType::kU8);

// Sets environment variables for as long as it lives.
struct ScopedEnv {
  explicit ScopedEnv(std::vector<std::pair<const char*, const char*>> vars) : vars_(std::move(vars)) {
    for (auto [k, v] : vars_) ::setenv(k, v, 1);
  }
  ~ScopedEnv() {
    for (auto [k, v] : vars_) ::unsetenv(k);
  }
  std::vector<std::pair<const char*, const char*>> vars_;
};

// Runs f in a forked child as uid/gid 65534 (nobody), as `setpriv
// --reuid=65534 --regid=65534 --clear-groups` would; returns its exit status
// (99: the child could not drop to that user, e.g. not root).
int as_nobody(const std::function<int()>& f);

// This process's resident memory, in bytes (/proc/self/statm).
double rss_bytes();

// Names in /dev/shm that fastgather made (fg-*).
std::vector<std::string> fg_segments();
// Segments created by any of these ranks' processes.
std::vector<std::string> segments_of(const std::vector<RankResult>& ranks);

}  // namespace fgtest

// For rank bodies: return the failure text from the body when cond is false.
#define RANK_CHECK(cond, ...)                                                                        \
  do {                                                                                               \
    if (!(cond)) return fmt::format("{}:{}: {} failed: {}", __FILE__, __LINE__, #cond, fmt::format(__VA_ARGS__)); \
  } while (0)

#define RANK_OK(expr)                                                                               \
  do {                                                                                              \
    ::fastgather::Status _s = (expr);                                                               \
    if (!_s.ok()) return fmt::format("{}:{}: {} -> {}", __FILE__, __LINE__, #expr, _s.to_string()); \
  } while (0)
