// Values read from the store are untrusted input: a stranger who reaches the
// store may have written anything under a key the ranks read. A bad one
// fails the group with an error naming the key, never an exception or a
// signal (issue 21).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "bootstrap/tcp_store.hpp"
#include "fastgather/fastgather.hpp"
#include "harness.hpp"

using namespace fastgather;

namespace {

using Clock = std::chrono::steady_clock;

bool ends_with(const std::string& s, const std::string& end) {
  return s.size() >= end.size() && s.compare(s.size() - end.size(), end.size(), end) == 0;
}

// The job's store, except that keys ending in `suffix` read as `value`.
class Tampered : public Store {
 public:
  Tampered(std::shared_ptr<Store> inner, std::string suffix, std::string value)
      : inner_(std::move(inner)), suffix_(std::move(suffix)), value_(std::move(value)) {}
  Status set(const std::string& key, const std::string& value) override { return inner_->set(key, value); }
  Result<int64_t> add(const std::string& key, int64_t delta) override { return inner_->add(key, delta); }
  Result<std::string> get(const std::string& key, Clock::time_point deadline) override {
    auto real = inner_->get(key, deadline);  // no earlier than the real value
    if (real.ok() && ends_with(key, suffix_)) return value_;
    return real;
  }

 private:
  std::shared_ptr<Store> inner_;
  std::string suffix_, value_;
};

// Two ranks over one store; rank 1 reads `value` for its group's heap key.
void expect_heap_value_refused(const std::string& value, const std::string& shown) {
  auto server = bootstrap::TcpStoreServer::start("127.0.0.1", 0, "");
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  const int port = server.value()->port();
  fgtest::JobOptions o;
  o.timeout = std::chrono::milliseconds(2000);
  auto results = fgtest::run_job(2, [&](const Config& c) -> std::string {
    auto client = bootstrap::TcpStoreClient::connect("127.0.0.1", port, "", Clock::now() + std::chrono::seconds(10));
    RANK_OK(client.status());
    std::shared_ptr<Store> store = std::move(client).value();
    if (c.rank == 1) store = std::make_shared<Tampered>(store, "/heap", value);
    auto comm = Communicator::create(c, store);
    RANK_CHECK(!comm.ok(), "a group was made although rank 1 read {:?} as its heap", value);
    if (c.rank == 1) {
      const std::string& m = comm.status().message();
      RANK_CHECK(comm.status().kind() == ErrorKind::kInvalidArgument, "{}", comm.status().to_string());
      RANK_CHECK(m.find("/heap") != std::string::npos && m.find("store key") != std::string::npos, "{}", m);
      RANK_CHECK(m.find(shown) != std::string::npos, "the message should show {:?}: {}", shown, m);
      RANK_CHECK(m.size() < 1000, "the message repeats the value in full: {} bytes", m.size());
    }
    return "";
  }, o);
  fgtest::expect_all_ok(results);
}

}  // namespace

TEST(UntrustedStore, AHeapSizeThatIsNotANumberFailsTheGroupNamingTheKey) { expect_heap_value_refused("fg-x zzz", "zzz"); }

TEST(UntrustedStore, AHeapSizeBeyondTheLimitIsRefused) {
  expect_heap_value_refused("fg-x 99999999999999999999", "outside");
}

TEST(UntrustedStore, AHeapValueWithoutASizeIsRefused) { expect_heap_value_refused("fg-x", "not a whole number"); }

TEST(UntrustedStore, AHugeValueIsNotRepeatedInTheError) {
  expect_heap_value_refused("fg-x " + std::string(1 << 20, '7'), "...");
}
