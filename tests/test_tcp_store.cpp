// The rendezvous store: its operations, its deadlines, and what it does with
// connections that do not speak its protocol.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <grp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <thread>

#include "bootstrap/tcp_store.hpp"
#include "harness.hpp"

using namespace fastgather;
using namespace fastgather::bootstrap;
using namespace std::chrono_literals;

namespace {

std::unique_ptr<TcpStoreServer> start(const std::string& token = "") {
  auto s = TcpStoreServer::start("127.0.0.1", 0, {.token = token});
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return std::move(s).value();
}

std::unique_ptr<TcpStoreClient> connect(int port, const std::string& token = "") {
  auto c = TcpStoreClient::connect("127.0.0.1", port, token, Clock::now() + 2s);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return c.ok() ? std::move(c).value() : nullptr;
}

int raw_socket(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  return fd;
}

// True if the server closed fd (read returns 0 or an error) within 2 s.
bool closed_by_server(int fd) {
  timeval tv{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char buf[256];
  for (;;) {
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n == 0) return true;
    if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK;
  }
}

}  // namespace

// A deadline that has passed before the first try (FG_TIMEOUT_MS=1) says
// so, not the "(Success)" of an errno nothing set.
TEST(TcpStore, ADeadlineGoneBeforeTheFirstTrySaysSo) {
  auto c = TcpStoreClient::connect("127.0.0.1", fgtest::free_port(), "", Clock::now() - 1ms);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().kind(), ErrorKind::kTimeout);
  EXPECT_NE(c.status().message().find("the start-up deadline passed before the first try"), std::string::npos)
      << c.status().message();
  EXPECT_EQ(c.status().message().find("Success"), std::string::npos) << c.status().message();
}

TEST(TcpStore, SetGetAddAndBlockingGet) {
  auto server = start();
  auto a = connect(server->port());
  auto b = connect(server->port());
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->set("k", "v1").ok());
  auto v = b->get("k", Clock::now() + 1s);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v.value(), "v1");
  EXPECT_EQ(a->add("n", 5).value(), 5);
  EXPECT_EQ(b->add("n", -2).value(), 3);

  std::thread setter([&] {
    std::this_thread::sleep_for(100ms);
    auto c = connect(server->port());
    ASSERT_TRUE(c->set("late", std::string(100000, 'x')).ok());
  });
  auto late = a->get("late", Clock::now() + 5s);  // blocks until the set
  setter.join();
  ASSERT_TRUE(late.ok()) << late.status().to_string();
  EXPECT_EQ(late.value().size(), 100000u);
}

TEST(TcpStore, GetTimesOutWithTheKeyInTheMessageAndTheConnectionStaysUsable) {
  auto server = start();
  auto a = connect(server->port());
  auto t0 = Clock::now();
  auto v = a->get("never", Clock::now() + 200ms);
  EXPECT_FALSE(v.ok());
  EXPECT_EQ(v.status().kind(), ErrorKind::kTimeout);
  EXPECT_NE(v.status().message().find("never"), std::string::npos);
  EXPECT_LT(Clock::now() - t0, 2s);
  // The late answer to the timed-out GET is skipped, not taken for the next reply.
  ASSERT_TRUE(a->set("never", "late").ok());
  ASSERT_TRUE(a->set("k2", "v2").ok());
  auto v2 = a->get("k2", Clock::now() + 1s);
  ASSERT_TRUE(v2.ok()) << v2.status().to_string();
  EXPECT_EQ(v2.value(), "v2");
}

TEST(TcpStore, ARankCanJoinOnlyOnceAndOnlyWithTheJobsWorldSize) {
  auto server = start();
  auto r0 = TcpStoreClient::connect("127.0.0.1", server->port(), "", Clock::now() + 1s, "0/2");
  ASSERT_TRUE(r0.ok());
  auto again = TcpStoreClient::connect("127.0.0.1", server->port(), "", Clock::now() + 1s, "0/2");
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().message().find("rank 0 has already joined"), std::string::npos) << again.status().message();
  auto other = TcpStoreClient::connect("127.0.0.1", server->port(), "", Clock::now() + 1s, "1/4");
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("this job has 2 ranks"), std::string::npos) << other.status().message();
  auto bad = TcpStoreClient::connect("127.0.0.1", server->port(), "", Clock::now() + 1s, "2/2");
  EXPECT_FALSE(bad.ok());
  EXPECT_TRUE(TcpStoreClient::connect("127.0.0.1", server->port(), "", Clock::now() + 1s, "1/2").ok());
}

TEST(TcpStore, BarrierReleasesAllOrTimesOut) {
  auto server = start();
  std::vector<std::thread> ts;
  std::atomic<int> passed{0};
  for (int i = 0; i < 4; ++i) {
    ts.emplace_back([&] {
      auto c = connect(server->port());
      if (c->barrier("b", 4, Clock::now() + 5s).ok()) ++passed;
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(passed.load(), 4);
  auto lone = connect(server->port());
  Status s = lone->barrier("b2", 2, Clock::now() + 200ms);
  EXPECT_EQ(s.kind(), ErrorKind::kTimeout);
  EXPECT_NE(s.message().find("1 of 2"), std::string::npos) << s.message();
}

TEST(TcpStore, WrongTokenIsRefused) {
  auto server = start("secret");
  auto bad = TcpStoreClient::connect("127.0.0.1", server->port(), "guess", Clock::now() + 1s);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("refused"), std::string::npos) << bad.status().message();
  EXPECT_TRUE(connect(server->port(), "secret") != nullptr);
}

TEST(TcpStore, GarbageAndOversizedFramesCloseOnlyThatConnection) {
  auto server = start();
  auto good = connect(server->port());
  ASSERT_TRUE(good->set("x", "1").ok());

  int garbage = raw_socket(server->port());
  const char junk[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_GT(::send(garbage, junk, sizeof(junk), 0), 0);
  EXPECT_TRUE(closed_by_server(garbage));
  ::close(garbage);

  int huge = raw_socket(server->port());
  uint32_t len = kMaxFrame + 1;
  ASSERT_EQ(::send(huge, &len, 4, 0), 4);
  EXPECT_TRUE(closed_by_server(huge));
  ::close(huge);

  // Skipping HELLO is refused too.
  int rude = raw_socket(server->port());
  std::string frame = encode_store_request({.op = StoreOp::kSet, .key = "x", .value = "2"});
  ASSERT_GT(::send(rude, frame.data(), frame.size(), 0), 0);
  EXPECT_TRUE(closed_by_server(rude));
  ::close(rude);

  auto v = good->get("x", Clock::now() + 1s);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v.value(), "1");  // the job's state is untouched
  EXPECT_GE(server->rejected_connections(), 3u);
}

TEST(TcpStoreParser, AcceptsWhatTheEncoderWritesAndNothingLonger) {
  StoreRequest in{.op = StoreOp::kAdd, .id = 9, .key = "key", .delta = -7};
  std::string f = encode_store_request(in);
  StoreRequest out;
  EXPECT_EQ(parse_store_request(f, &out), static_cast<int64_t>(f.size()));
  EXPECT_EQ(out.key, "key");
  EXPECT_EQ(out.delta, -7);
  EXPECT_EQ(out.id, 9u);
  for (size_t cut = 0; cut < f.size(); ++cut) EXPECT_EQ(parse_store_request(f.substr(0, cut), &out), 0) << cut;
  std::string trailing = f;
  trailing[0] = static_cast<char>(trailing[0] + 1);  // length claims one more byte
  trailing.push_back('z');
  EXPECT_EQ(parse_store_request(trailing, &out), -1);
  std::string bad_op = f;
  bad_op[4] = 99;
  EXPECT_EQ(parse_store_request(bad_op, &out), -1);
}

TEST(TcpStore, HalfOpenAndSilentConnectionsNeitherBlockNorStay) {
  auto s = TcpStoreServer::start("127.0.0.1", 0, {.hello_within = 300ms});
  ASSERT_TRUE(s.ok());
  auto& server = s.value();
  // One connection sends half a frame and stalls; another says nothing at all.
  int half = raw_socket(server->port());
  std::string frame = encode_store_request({.op = StoreOp::kHello, .key = "", .value = "0/2"});
  ASSERT_EQ(::send(half, frame.data(), 6, 0), 6);
  int silent = raw_socket(server->port());
  // The job is not disturbed meanwhile.
  auto good = connect(server->port());
  ASSERT_TRUE(good->set("k", "v").ok());
  EXPECT_EQ(good->get("k", Clock::now() + 1s).value(), "v");
  // Both are dropped once they have had their chance to say HELLO.
  auto t0 = Clock::now();
  EXPECT_TRUE(closed_by_server(half));
  EXPECT_TRUE(closed_by_server(silent));
  EXPECT_LT(Clock::now() - t0, 2s);
  ::close(half);
  ::close(silent);
  EXPECT_GE(server->rejected_connections(), 2u);
}

namespace {

// A listening socket on 127.0.0.1 (a port of the kernel's choice, in *port).
int listen_on_loopback(int* port) {
  int l = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  ::inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  socklen_t len = sizeof(sa);
  EXPECT_EQ(::bind(l, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  EXPECT_EQ(::listen(l, 1), 0);
  EXPECT_EQ(::getsockname(l, reinterpret_cast<sockaddr*>(&sa), &len), 0);
  *port = ntohs(sa.sin_port);
  return l;
}

}  // namespace

// The kernel's socket table says who opened a connection on this host.
TEST(TcpStore, KnowsWhichLocalUserOpenedAConnection) {
  int port = 0;
  int l = listen_on_loopback(&port);
  int c = raw_socket(port);
  int a = ::accept(l, nullptr, nullptr);
  ASSERT_GE(a, 0);
  // Our own connection, seen from its accepted end, is ours.
  auto uid = peer_uid_on_this_host(a);
  ASSERT_TRUE(uid.has_value()) << "this kernel's socket table (sock_diag) cannot be read";
  EXPECT_EQ(*uid, ::geteuid());
  for (int x : {l, c, a}) ::close(x);
}

// Another local user who has the job's token (it leaked) is still refused:
// the connection is not this job's user's, and the job's state is untouched.
TEST(TcpStore, AnotherLocalUserIsRefusedEvenWithTheToken) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a client as another uid";
  auto server = start("secret");
  auto good = connect(server->port(), "secret");
  ASSERT_TRUE(good && good->set("x", "1").ok());
  const int port = server->port();
  const int rc = fgtest::as_nobody([port] {
    auto c = TcpStoreClient::connect("127.0.0.1", port, "secret", Clock::now() + 2s);
    if (c.ok()) {
      (void)c.value()->set(kJobAbortKey, "stranger");
      return 1;  // admitted
    }
    return c.status().message().find("uid 65534") != std::string::npos ? 0 : 2;
  });
  EXPECT_EQ(rc, 0) << "1: a client of uid 65534 was admitted; 2: refused without saying why";
  auto v = good->get("x", Clock::now() + 1s);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v.value(), "1");
  EXPECT_FALSE(good->get(kJobAbortKey, Clock::now() + 100ms).ok());
}

// Once every rank of the job has joined, nobody else is let in, whatever
// token or identity they bring.
TEST(TcpStore, NobodyJoinsOnceTheJobIsComplete) {
  auto server = start("secret");
  auto r0 = TcpStoreClient::connect("127.0.0.1", server->port(), "secret", Clock::now() + 1s, "0/2");
  auto r1 = TcpStoreClient::connect("127.0.0.1", server->port(), "secret", Clock::now() + 1s, "1/2");
  ASSERT_TRUE(r0.ok() && r1.ok());
  for (const char* identity : {"", "1/2", "2/3"}) {
    auto late = TcpStoreClient::connect("127.0.0.1", server->port(), "secret", Clock::now() + 1s, identity);
    ASSERT_FALSE(late.ok()) << "'" << identity << "' was admitted";
    EXPECT_NE(late.status().message().find("all 2 ranks of this job have joined"), std::string::npos)
        << late.status().message();
  }
  // A rank that left does not make room for another.
  r1.value().reset();
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(TcpStoreClient::connect("127.0.0.1", server->port(), "secret", Clock::now() + 1s, "1/2").ok());
}

// Connections that never finish their HELLO: whatever their number and
// however much they send, the store holds a few KiB for each (at most
// kMaxStrangers at a time; a frame longer than any HELLO closes its
// connection at once) and drops them at the HELLO deadline; a rank still
// gets in meanwhile. (Before: 600 connections each sending 1 MiB of a HELLO
// grew the store host by 620 MB.)
TEST(TcpStore, HalfSentHellosCostLittleMemory) {
  auto s = TcpStoreServer::start("127.0.0.1", 0, {.token = "secret", .hello_within = 1500ms});
  ASSERT_TRUE(s.ok());
  auto& server = s.value();
  const double rss_before = fgtest::rss_bytes();
  // Half announce a 1 MiB HELLO and send 256 KiB of it; half announce one as
  // long as a HELLO may be and send all but its last byte.
  std::string huge(256 << 10, 'x'), almost(kMaxHello - 1, 'x');
  const uint32_t huge_len = 1u << 20, almost_len = static_cast<uint32_t>(kMaxHello - 4);
  std::memcpy(huge.data(), &huge_len, 4);
  std::memcpy(almost.data(), &almost_len, 4);
  huge[4] = almost[4] = static_cast<char>(StoreOp::kHello);
  std::vector<int> fds;
  size_t most = 0;
  for (int i = 0; i < 600; ++i) {
    int fd = raw_socket(server->port());
    const std::string& what = i % 2 ? huge : almost;
    (void)::send(fd, what.data(), what.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    fds.push_back(fd);
    most = std::max(most, server->stranger_bytes());
  }
  auto rank = TcpStoreClient::connect("127.0.0.1", server->port(), "secret", Clock::now() + 5s, "0/1");
  EXPECT_TRUE(rank.ok()) << rank.status().to_string();
  for (int i = 0; i < 40; ++i) {
    std::this_thread::sleep_for(50ms);
    most = std::max(most, server->stranger_bytes());
  }
  EXPECT_GT(most, kMaxHello) << "the half-sent HELLOs were never held: the test measures nothing";
  EXPECT_LE(most, kMaxStrangers * 2 * kMaxHello) << "bytes held for connections that have not said HELLO";
  const double grew = fgtest::rss_bytes() - rss_before;
  EXPECT_LT(grew, 16 << 20) << "the store's process grew by " << grew / (1 << 20) << " MiB";
  for (int fd : fds) ::close(fd);
}

// A reply that is in the socket when the deadline comes is an answer, not a
// timeout (before: the client tested its deadline before reading, and
// reported a key that was there as missing). A hand-made store that has
// already sent the answer to the next request; the call's deadline has
// passed when it starts.
TEST(TcpStore, AReplyThatArrivedByTheDeadlineIsAnAnswer) {
  int port = 0;
  int l = listen_on_loopback(&port);
  auto reply = [](uint32_t id, const std::string& payload) {
    std::string f(13, '\0');
    const uint32_t n = static_cast<uint32_t>(5 + payload.size());
    std::memcpy(f.data(), &n, 4);
    f[4] = static_cast<char>(StoreReply::kOk);
    std::memcpy(f.data() + 5, &id, 4);
    return f.substr(0, 9) + payload;
  };
  std::atomic<bool> connected{false};
  std::thread store([&] {
    int c = ::accept(l, nullptr, nullptr);
    // HELLO is request 1; the GET below, request 2, is answered before it is asked.
    const std::string hello = reply(1, ""), answer = reply(2, "there");
    (void)::send(c, hello.data(), hello.size(), MSG_NOSIGNAL);
    while (!connected.load()) std::this_thread::sleep_for(1ms);
    (void)::send(c, answer.data(), answer.size(), MSG_NOSIGNAL);
    char buf[4096];
    while (::recv(c, buf, sizeof(buf), 0) > 0) {
    }
    ::close(c);
  });
  auto client = TcpStoreClient::connect("127.0.0.1", port, "", Clock::now() + 2s);
  connected = true;
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  std::this_thread::sleep_for(50ms);  // the answer is in our socket now
  auto v = client.value()->get("k", Clock::now() - 1ms);
  EXPECT_TRUE(v.ok()) << v.status().to_string();
  if (v.ok()) {
    EXPECT_EQ(v.value(), "there");
  }
  client.value().reset();
  store.join();
  ::close(l);
}
