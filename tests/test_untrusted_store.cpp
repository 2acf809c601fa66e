// Values read from the store are untrusted input: a stranger who reaches the
// store may have written anything under a key the ranks read. A bad one
// fails the group with an error naming the key, never an exception or a
// signal (issue 21).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <functional>

#include "bootstrap/tcp_store.hpp"
#include "fastgather/fastgather.hpp"
#include "harness.hpp"

using namespace fastgather;

namespace {

using Clock = std::chrono::steady_clock;

bool ends_with(const std::string& s, const std::string& end) {
  return s.size() >= end.size() && s.compare(s.size() - end.size(), end.size(), end) == 0;
}

// The job's store, except that keys ending in `suffix` read as
// tamper(what was really there).
class Tampered : public Store {
 public:
  using Tamper = std::function<std::string(const std::string&)>;
  Tampered(std::shared_ptr<Store> inner, std::string suffix, Tamper tamper)
      : inner_(std::move(inner)), suffix_(std::move(suffix)), tamper_(std::move(tamper)) {}
  Status set(const std::string& key, const std::string& value) override { return inner_->set(key, value); }
  Result<int64_t> add(const std::string& key, int64_t delta) override { return inner_->add(key, delta); }
  Result<std::string> get(const std::string& key, Clock::time_point deadline) override {
    auto real = inner_->get(key, deadline);  // no earlier than the real value
    if (real.ok() && ends_with(key, suffix_)) return tamper_(real.value());
    return real;
  }

 private:
  std::shared_ptr<Store> inner_;
  std::string suffix_;
  Tamper tamper_;
};

// The job's store in a process of its own: its thread must not be in this
// process when ranks that start UCX are forked (see run_job).
class StoreProcess {
 public:
  StoreProcess() {
    int up[2], down[2];
    if (::pipe2(up, O_CLOEXEC) != 0 || ::pipe2(down, O_CLOEXEC) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(up[0]);
      ::close(down[1]);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      auto server = bootstrap::TcpStoreServer::start("127.0.0.1", 0, {});
      const int port = server.ok() ? server.value()->port() : 0;
      (void)!::write(up[1], &port, sizeof(port));
      char c;
      (void)!::read(down[0], &c, 1);  // until the test closes its end
      ::_exit(0);
    }
    ::close(up[1]);
    ::close(down[0]);
    hold_ = down[1];
    if (pid_ > 0 && ::read(up[0], &port_, sizeof(port_)) != sizeof(port_)) port_ = 0;
    ::close(up[0]);
  }
  ~StoreProcess() {
    if (hold_ >= 0) ::close(hold_);
    if (pid_ > 0) ::waitpid(pid_, nullptr, 0);
  }
  int port() const { return port_; }

 private:
  pid_t pid_ = -1;
  int hold_ = -1;
  int port_ = 0;
};

// Ranks over one store; rank `victim` reads tamper(value) for keys ending in
// `suffix`, and must fail naming `named` and showing `shown` (and nothing
// long); the others fail too (they cannot complete the group without it),
// with the victim's reason where `others_hear` (they heard it through the store).
void expect_refused(const std::string& suffix, const Tampered::Tamper& tamper, const std::string& named,
                    const std::string& shown, int world = 2, int servers = 1, int victim = 1, bool others_hear = false) {
  StoreProcess server;
  const int port = server.port();
  ASSERT_NE(port, 0) << "the store did not start";
  fgtest::JobOptions o;
  o.timeout = std::chrono::milliseconds(3000);
  o.servers = servers;
  auto results = fgtest::run_job(world, [&](const Config& c) -> std::string {
    auto client = bootstrap::TcpStoreClient::connect("127.0.0.1", port, "", Clock::now() + std::chrono::seconds(10));
    RANK_OK(client.status());
    std::shared_ptr<Store> store = std::move(client).value();
    if (c.rank == victim) store = std::make_shared<Tampered>(store, suffix, tamper);
    auto comm = Communicator::create(c, store);
    RANK_CHECK(!comm.ok(), "a group was made although rank {} read a tampered '{}'", victim, suffix);
    if (c.rank == victim) {
      const std::string& m = comm.status().message();
      RANK_CHECK(comm.status().kind() == ErrorKind::kInvalidArgument, "{}", comm.status().to_string());
      RANK_CHECK(m.find(named) != std::string::npos, "the message should name {:?}: {}", named, m);
      RANK_CHECK(m.find(shown) != std::string::npos, "the message should show {:?}: {}", shown, m);
      RANK_CHECK(m.size() < 1000, "the message repeats the value in full: {} bytes", m.size());
    } else if (others_hear) {
      const std::string& m = comm.status().message();
      RANK_CHECK(m.find(shown) != std::string::npos, "rank {} should have heard the victim's {:?}: {}", c.rank, shown, m);
    }
    return "";
  }, o);
  fgtest::expect_all_ok(results);
}

// The real segment name with `size` as the heap's size.
Tampered::Tamper heap_size(std::string size) {
  return [size](const std::string& real) { return real.substr(0, real.find(' ')) + " " + size; };
}
Tampered::Tamper constant(std::string v) {
  return [v](const std::string&) { return v; };
}

}  // namespace

TEST(UntrustedStore, AHeapSizeThatIsNotANumberFailsTheGroupNamingTheKey) {
  expect_refused("/heap", heap_size("zzz"), "/heap", "zzz");
}

TEST(UntrustedStore, AHeapSizeBeyondTheLimitIsRefused) {
  expect_refused("/heap", heap_size("99999999999999999999"), "/heap", "outside");
}

TEST(UntrustedStore, AHeapValueWithoutASizeIsRefused) {
  expect_refused("/heap", [](const std::string& real) { return real.substr(0, real.find(' ')); }, "/heap",
                 "not '<segment> <bytes>'");
}

TEST(UntrustedStore, AHugeValueIsNotRepeatedInTheError) {
  expect_refused("/heap", heap_size(std::string(1 << 20, '7')), "/heap", "...");
}

// A segment name is opened and mapped: one of another job, or a path, would
// map memory that is not the group's.
TEST(UntrustedStore, ASegmentNameOfAnotherJobOrAPathIsRefused) {
  expect_refused("/name", constant("/fg-0123456789abcdef-1-0r00"), "/name", "not a segment name of this job");
  expect_refused("/name", constant("/../../etc/passwd"), "/name", "/../../etc/passwd");
  expect_refused("/heap", constant("/fg-0123456789abcdef-1-0r00h 1024"), "/heap", "not a segment name of this job");
}

// Non-printable bytes are shown escaped, never written to a terminal as they are.
TEST(UntrustedStore, ControlCharactersAreEscapedInTheError) {
  expect_refused("/heap", heap_size("\x1b[2J7"), "/heap", "\\x1b[2J7");
}

TEST(UntrustedStore, AJobIdThatIsAPathIsRefused) {
  expect_refused("job_id", constant("../../x"), "job_id", "not a job id");
}

// A worker address that is empty or outsized (UCX would unpack it blindly).
// The other rank hears why before it connects: it never connects to a
// process that is leaving (which UCX 1.13 can answer with an abort).
TEST(UntrustedStore, AnEmptyOrOutsizedWorkerAddressIsRefused) {
  expect_refused("/ucx/1", constant(""), "/ucx/1", "holds 0 bytes, not an address", 2, 2, /*victim=*/0,
                 /*others_hear=*/true);
  expect_refused("/ucx/1", constant(std::string(100 << 10, 'a')), "/ucx/1", "holds 102400 bytes", 2, 2, 0, true);
}

// A spanning group's id (two simulated servers, UCX between them).
TEST(UntrustedStore, AGroupIdThatIsNotANumberIsRefused) {
  expect_refused("/id", constant("zzz"), "/id", "zzz", /*world=*/2, /*servers=*/2);
}
