// Point-to-point (send, recv, recv from any source) within a server and
// between servers: every byte checked, from empty messages to many mailboxes' worth,
// ranks outnumbering cores; exchanges in the orders that deadlock a single
// queue (a ring of isend/irecv waited send first, a receive started before a
// collective its sender runs first); any source; a length or tag that
// disagrees is found on both sides and the group goes on; a receive with no
// sender ends in the timeout; bad arguments are refused; between servers
// (UCX), every byte, and a length that disagrees fails the group.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <optional>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "core/group_impl.hpp"
#include "fastgather/fastgather.hpp"
#include "harness.hpp"
#include "transport/shm_channel.hpp"

using namespace fastgather;
using namespace std::chrono_literals;

namespace {

// Byte i of message `it` from group rank `from` to group rank `to`.
uint8_t byte_of(int from, int to, size_t i, uint64_t it) {
  uint64_t x = (static_cast<uint64_t>(from + 1) << 48) ^ (static_cast<uint64_t>(to + 1) << 32) ^ i ^ (it << 56);
  x *= 0x9E3779B97F4A7C15ull;
  return static_cast<uint8_t>(x >> 56);
}

std::vector<uint8_t> message(int from, int to, size_t bytes, uint64_t it) {
  std::vector<uint8_t> m(bytes);
  for (size_t i = 0; i < bytes; ++i) m[i] = byte_of(from, to, i, it);
  return m;
}

long long wrong(const std::vector<uint8_t>& got, int from, int to, uint64_t it) {
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != byte_of(from, to, i, it)) return static_cast<long long>(i);
  }
  return -1;
}

TensorView view(std::vector<uint8_t>& v) { return {v.data(), DType::kU8, {static_cast<int64_t>(v.size())}}; }

// FG_SINGLE_COPY=always: ordinary memory counts as readable by a peer, as a
// huge-page buffer does, so a message past the mailbox goes by process_vm_readv.
Config reading_peers(const Config& base) {
  Config c = base;
  Settings s = c.settings.value_or(Settings{});
  s.single_copy = Settings::SingleCopy::kAlways;
  c.settings = s;
  return c;
}

// Empty, one byte, around a chunk (16 KiB), around a whole mailbox (64 KiB:
// larger goes by single copy where members read each other's memory).
// Past ShmMail::kReadInPlaceMax (2 MiB), ordinary memory goes through the mailbox again.
const std::vector<size_t> kSizes = {0, 1, 16383, 16384, 16385, 65536, 65537, 200001, 1 << 20, (3 << 20) + 1};

class Ring : public ::testing::TestWithParam<int> {};

// Each rank sends to the next and receives from the one before, all at
// once, then waits for its send first: a send larger than the mailbox
// completes only while the receive beside it is driven too.
TEST_P(Ring, EveryByteWaitingForTheSendFirst) {
  fgtest::JobOptions o;
  o.timeout = 20s;
  fgtest::expect_all_ok(fgtest::run_job(GetParam(), [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    const int n = g.size(), me = g.rank(), next = (me + 1) % n, prev = (me + n - 1) % n;
    uint64_t it = 0;
    for (int round = 0; round < 2; ++round) {
      for (size_t bytes : kSizes) {
        ++it;
        std::vector<uint8_t> out = message(me, next, bytes, it), in(bytes, 0xEE);
        Request s = start_send(g, view(out), next, 5);
        Request r = start_recv(g, view(in), prev, 5);
        if (round == 0) {
          RANK_OK(s.wait());
          RANK_OK(r.wait());
        } else {
          RANK_OK(r.wait());
          RANK_OK(s.wait());
        }
        const long long bad = wrong(in, prev, me, it);
        RANK_CHECK(bad < 0, "{} bytes from rank {}: byte {} is wrong", bytes, prev, bad);
      }
    }
    return "";
  }, o));
}

// A message of each size around the ring, each past the mailbox's size read
// where it lies: from the sender's region of the group's heap (the receiver
// copies it from there: one copy, no system call), or from its ordinary
// memory by process_vm_readv (FG_SINGLE_COPY=always makes that memory count
// as readable, as a huge-page buffer is). Smaller ones still go through the
// mailbox.
std::string ring_read_where_it_lies(const Config& c, bool from_heap) {
  auto comm = Communicator::create(from_heap ? c : reading_peers(c));
  RANK_OK(comm.status());
  Group& g = (*comm)->world();
  const int n = g.size(), me = g.rank(), next = (me + 1) % n, prev = (me + n - 1) % n;
  const char* where = from_heap ? "heap" : "memory";
  const int64_t tag = from_heap ? 6 : 7;
  uint64_t it = from_heap ? 100 : 200;
  for (size_t bytes : kSizes) {
    ++it;
    std::vector<uint8_t> out = message(me, next, bytes, it), in(bytes, 0xEE);
    TensorView sent_view = view(out);
    std::optional<Tensor> in_heap;  // the message's copy in the heap, alive until the send is done
    if (from_heap) {
      auto t = g.empty(DType::kU8, {static_cast<int64_t>(bytes)});
      RANK_OK(t.status());
      in_heap.emplace(std::move(t).value());
      if (bytes != 0) std::memcpy(in_heap->data(), out.data(), bytes);
      sent_view = in_heap->view();
    }
    Request sent = start_send(g, sent_view, next, tag);
    RANK_OK(recv(g, view(in), prev, tag));
    RANK_OK(sent.wait());
    const long long bad = wrong(in, prev, me, it);
    RANK_CHECK(bad < 0, "{} bytes from rank {}'s {}: byte {} is wrong", bytes, prev, where, bad);
  }
  return "";
}

TEST_P(Ring, EveryByteFromTheHeap) {
  fgtest::JobOptions o;
  o.timeout = 20s;
  fgtest::expect_all_ok(fgtest::run_job(GetParam(), [](const Config& c) { return ring_read_where_it_lies(c, true); }, o));
}

TEST_P(Ring, EveryByteReadFromTheSendersMemory) {
  fgtest::JobOptions o;
  o.timeout = 20s;
  fgtest::expect_all_ok(fgtest::run_job(GetParam(), [](const Config& c) { return ring_read_where_it_lies(c, false); }, o));
}

INSTANTIATE_TEST_SUITE_P(PointToPoint, Ring, ::testing::Values(2, 3, 5));

// A message of ordinary (4 KiB-page) memory past the mailbox and up to
// ShmMail::kReadInPlaceMax is read where it lies by process_vm_readv (the
// mailbox's chunks, each handed over with a wait, cost 2-10x more there);
// a larger one, and one that fits the mailbox, go through the mailbox. The
// receiver's count of bytes read from peers says which way each went.
TEST(PointToPoint, OrdinaryMemoryUpToTheCutoffIsReadWhereItLies) {
  fgtest::expect_all_ok(fgtest::run_job(2, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    const transport::ShmChannel& ch = *impl_of(g)->channel;
    const bool readable = ch.capabilities().reads_peer_memory;  // else every message goes through the mailbox
    const int me = g.rank(), other = 1 - me;
    uint64_t it = 300;
    for (size_t bytes : {size_t{65536}, size_t{98304}, size_t{2} << 20, (size_t{2} << 20) + 4096, size_t{3} << 20}) {
      ++it;
      const bool read = readable && bytes > 65536 && bytes <= (size_t{2} << 20);
      std::vector<uint8_t> out = message(0, 1, bytes, it), in(bytes, 0xEE);
      const uint64_t before = ch.bytes_read_from_peers();
      if (me == 0) {
        RANK_OK(send(g, view(out), other, 9));
      } else {
        RANK_OK(recv(g, view(in), other, 9));
        const long long bad = wrong(in, 0, 1, it);
        RANK_CHECK(bad < 0, "{} bytes: byte {} is wrong", bytes, bad);
        const uint64_t got = ch.bytes_read_from_peers() - before;
        RANK_CHECK(got == (read ? bytes : 0), "{} bytes of ordinary memory: {} read from the sender's memory, want {}",
                   bytes, got, read ? bytes : 0);
      }
    }
    return "";
  }));
}

// Many messages each way between two ranks, in flight together, taken in
// the order they were sent.
TEST(PointToPoint, ManyInFlightBothWaysArriveInOrder) {
  fgtest::expect_all_ok(fgtest::run_job(2, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    const int me = g.rank(), peer = 1 - me;
    constexpr int kMessages = 24;
    std::vector<std::vector<uint8_t>> out, in;
    std::vector<Request> reqs;
    for (int k = 0; k < kMessages; ++k) {
      const size_t bytes = static_cast<size_t>(k) * 7919 % 90001;
      out.push_back(message(me, peer, bytes, static_cast<uint64_t>(k)));
      in.emplace_back(bytes, 0xEE);
    }
    for (int k = 0; k < kMessages; ++k) {
      reqs.push_back(start_send(g, view(out[k]), peer, 0));
      reqs.push_back(start_recv(g, view(in[k]), peer, 0));
    }
    for (auto& r : reqs) RANK_OK(r.wait());
    for (int k = 0; k < kMessages; ++k) {
      const long long bad = wrong(in[k], peer, me, static_cast<uint64_t>(k));
      RANK_CHECK(bad < 0, "message {}: byte {} is wrong", k, bad);
    }
    return "";
  }));
}

// A receive started before a collective that its sender runs first: on the
// collectives' queue it would wait for that collective, which waits for
// this rank; beside it, both complete.
TEST(PointToPoint, AReceiveDoesNotHoldUpTheCollectivesAfterIt) {
  fgtest::JobOptions o;
  o.timeout = 5s;
  fgtest::expect_all_ok(fgtest::run_job(2, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    std::vector<uint8_t> msg(300000), gin(64, static_cast<uint8_t>(g.rank())), gout(128);
    if (g.rank() == 0) {
      Request r = start_recv(g, view(msg), 1, 3);
      RANK_OK(all_gather(g, view(gin), view(gout)));
      RANK_OK(r.wait());
      RANK_CHECK(wrong(msg, 1, 0, 9) < 0, "the message");
    } else {
      RANK_OK(all_gather(g, view(gin), view(gout)));
      msg = message(1, 0, msg.size(), 9);
      RANK_OK(send(g, view(msg), 0, 3));
    }
    RANK_CHECK(gout[0] == 0 && gout[64] == 1, "the all-gather");
    return "";
  }, o));
}

// Three senders, one receiver from any source: each message taken once,
// its source said, its bytes right, although two of the senders have left
// before the third sends.
TEST(PointToPoint, AnySourceTakesEachMessageOnceAndSaysWhoSentIt) {
  fgtest::expect_all_ok(fgtest::run_job(4, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    constexpr size_t kBytes = 40000;
    if (g.rank() != 0) {
      // Rank 3 sends well after ranks 1 and 2 have sent and left: a sender
      // gone is no error while another may still send.
      if (g.rank() == 3) std::this_thread::sleep_for(300ms);
      std::vector<uint8_t> out = message(g.rank(), 0, kBytes, 1);
      RANK_OK(send(g, view(out), 0, 11));
      return "";
    }
    std::vector<int> sources;
    for (int k = 0; k < 3; ++k) {
      std::vector<uint8_t> in(kBytes);
      int source = -7;
      RANK_OK(recv(g, view(in), kAnySource, 11, &source));
      RANK_CHECK(source >= 1 && source <= 3, "source {}", source);
      RANK_CHECK(wrong(in, source, 0, 1) < 0, "the message said to be from rank {}", source);
      sources.push_back(source);
    }
    std::sort(sources.begin(), sources.end());
    RANK_CHECK((sources == std::vector<int>{1, 2, 3}), "sources {}", fmt::join(sources, ","));
    return "";
  }));
}

// A receive of another length, then of another tag: refused on the
// receiving side at once, and the sender's next send that way fails with
// the same words; the collectives go on.
TEST(PointToPoint, ALengthOrTagThatDisagreesIsFoundOnBothSides) {
  fgtest::expect_all_ok(fgtest::run_job(3, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    std::vector<uint8_t> a(100, 1), b(200), one(8), all(24);
    const std::string words = "sent 100 bytes with tag 1 to rank 1, which receives 200 bytes with tag 1";
    const std::string tag_words = "sent 100 bytes with tag 4 to rank 2, which receives 100 bytes with tag 5";
    if (g.rank() == 0) {
      RANK_OK(send(g, view(a), 1, 1));  // out before the receiver looks
      RANK_OK(send(g, view(a), 2, 4));
    } else if (g.rank() == 1) {
      Status s = recv(g, view(b), 0, 1);
      RANK_CHECK(s.kind() == ErrorKind::kMismatch && s.message().find(words) != std::string::npos, "receiver: {}",
                 s.to_string());
    } else {
      std::vector<uint8_t> c100(100);
      Status s = recv(g, view(c100), 0, 5);
      RANK_CHECK(s.kind() == ErrorKind::kMismatch && s.message().find(tag_words) != std::string::npos, "tag: {}",
                 s.to_string());
    }
    RANK_OK(all_gather(g, view(one), view(all)));  // every refusal is made by now
    if (g.rank() == 0) {
      Status s = send(g, view(a), 1, 1);
      RANK_CHECK(s.kind() == ErrorKind::kMismatch && s.message().find(words) != std::string::npos, "sender: {}",
                 s.to_string());
    }
    RANK_OK(all_gather(g, view(one), view(all)));
    return "";
  }));
}

// A message sent by single copy (larger than the mailbox) that the receiver
// cannot take: neither side reads or writes a byte of it, both fail at once
// in the same words (the sender waits for it to be read, so it learns at
// this send), and the group goes on.
TEST(PointToPoint, ASingleCopyMessageThatDisagreesFailsBothSidesAtOnce) {
  fgtest::expect_all_ok(fgtest::run_job(2, [](const Config& c) -> std::string {
    auto comm = Communicator::create(reading_peers(c));
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    std::vector<uint8_t> a(200001, 7), b(300000, 0xEE), one(8), all(16);
    const std::string words = "sent 200001 bytes with tag 3 to rank 1, which receives 300000 bytes with tag 3";
    Status s = g.rank() == 0 ? send(g, view(a), 1, 3) : recv(g, view(b), 0, 3);
    RANK_CHECK(s.kind() == ErrorKind::kMismatch && s.message().find(words) != std::string::npos, "{}", s.to_string());
    RANK_CHECK(g.rank() == 0 || std::all_of(b.begin(), b.end(), [](uint8_t x) { return x == 0xEE; }),
               "the receiver's buffer was written");
    RANK_OK(all_gather(g, view(one), view(all)));
    return "";
  }));
}

// Nobody sends: the receive ends in the communicator's timeout, saying so,
// and the group goes on.
TEST(PointToPoint, AReceiveWithNoSenderTimesOut) {
  fgtest::JobOptions o;
  o.timeout = 1500ms;
  fgtest::expect_all_ok(fgtest::run_job(2, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    std::vector<uint8_t> in(64), one(4), all(8);
    if (g.rank() == 0) std::this_thread::sleep_for(2s);  // its all-gather must not wait out the timeout
    if (g.rank() == 1) {
      const auto t0 = std::chrono::steady_clock::now();
      Status s = recv(g, view(in), 0, 0);
      const auto took = std::chrono::steady_clock::now() - t0;
      RANK_CHECK(s.kind() == ErrorKind::kTimeout && s.message().find("timed out") != std::string::npos &&
                     s.message().find("receiving from rank 0") != std::string::npos,
                 "{}", s.to_string());
      RANK_CHECK(took >= 1400ms && took < 10s, "it took {} ms",
                 std::chrono::duration_cast<std::chrono::milliseconds>(took).count());
    }
    RANK_OK(all_gather(g, view(one), view(all)));
    return "";
  }, o));
}

TEST(PointToPoint, BadArgumentsAreRefused) {
  fgtest::expect_all_ok(fgtest::run_job(2, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    std::vector<uint8_t> buf(16);
    auto refused = [](const Status& s, const char* what) {
      return s.kind() == ErrorKind::kInvalidArgument && s.message().find(what) != std::string::npos;
    };
    RANK_CHECK(refused(send(g, view(buf), 2), "not a rank of the group"), "peer 2 of 2");
    RANK_CHECK(refused(send(g, view(buf), -1), "not a rank of the group"), "peer -1 (a send)");
    RANK_CHECK(refused(recv(g, view(buf), -2), "not a rank of the group"), "peer -2");
    RANK_CHECK(refused(send(g, view(buf), g.rank()), "this rank itself"), "a send to itself");
    RANK_CHECK(refused(recv(g, view(buf), g.rank()), "this rank itself"), "a receive from itself");
    RANK_CHECK(refused(start_send(g, TensorView(nullptr, DType::kU8, {4}), 1 - g.rank()).wait(), "null"),
               "a null tensor holding bytes");
    RANK_CHECK(refused(send(g, TensorView(buf.data(), DType::kU8, {-3}), 1 - g.rank()), "negative"), "a negative shape");
    // Nothing was sent: a pair of good transfers goes through.
    std::vector<uint8_t> out = message(g.rank(), 1 - g.rank(), buf.size(), 3);
    Request r = start_recv(g, view(buf), 1 - g.rank());
    RANK_OK(send(g, view(out), 1 - g.rank()));
    RANK_OK(r.wait());
    RANK_CHECK(wrong(buf, 1 - g.rank(), g.rank(), 3) < 0, "after the refusals");
    return "";
  }));
}

// Between servers, a member whose call is done may go on to wait on
// something that is not the library (another library's collective, a
// sleep): UCX may still owe its peer the end of the exchange (over TCP with
// rendezvous, UCX's choice for large messages on real hosts), which only
// progress sends. The library flushes in the background, so the peer's call
// completes meanwhile. A send, then sixteen all_reduces, of 24 MB, after
// each of which rank 0 leaves the library for 600 ms: rank 1's call ends
// within 400 ms of rank 0's (both read the same monotonic clock, the times
// exchanged afterwards), not when rank 0 comes back. (Without the flush, or
// with UCX's flush alone, which leaves tag sends be, one all_reduce in two to
// ten waited for rank 0 here, and in one run of the mutation checks none of
// the sixteen did: whichever member finishes receiving first decides, so
// this test catches the missing flush most runs, not every run; the flush's
// mechanism has deterministic tests below.)
TEST(PointToPoint, AMemberThatLeavesTheLibraryAfterACallDoesNotHoldItsPeer) {
  const fgtest::JobOptions o = fgtest::two_servers("p2p-leaves", 30s);
  fgtest::expect_all_ok(fgtest::run_job(2, [](const Config& c) -> std::string {
    ::setenv("UCX_RNDV_THRESH", "8k", 1);  // as on real hosts (simulated servers are given "inf")
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    const int me = g.rank();
    const size_t bytes = size_t{24} << 20;
    std::vector<uint8_t> out = message(0, 1, bytes, 77), in(bytes, 0xEE);
    std::vector<float> sum(bytes / 4, 1.0f);
    const TensorView sv(sum.data(), DType::kF32, {static_cast<int64_t>(sum.size())});
    auto now_ms = [] {
      return static_cast<int64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                      std::chrono::steady_clock::now().time_since_epoch())
                                      .count());
    };
    // Each member's end of a call, exchanged once the sender is back: how
    // long after rank 0's end rank 1's came.
    auto later = [&](auto call, int64_t* gap) -> Status {
      if (Status s = call(); !s.ok()) return s;
      int64_t mine = now_ms(), both[2];
      if (me == 0) std::this_thread::sleep_for(600ms);  // away from the library
      Status s = all_gather(g, TensorView(&mine, DType::kI64, {1}), TensorView(both, DType::kI64, {2}));
      *gap = both[1] - both[0];
      return s;
    };
    int64_t gap = 0;
    RANK_OK(later([&] { return me == 0 ? send(g, view(out), 1, 3) : recv(g, view(in), 0, 3); }, &gap));
    RANK_CHECK(me == 0 || wrong(in, 0, 1, 77) < 0, "the message");
    RANK_CHECK(gap < 400, "the receive ended {} ms after the send: it waited for the sender to come back", gap);
    std::fill(sum.begin(), sum.end(), 1.0f);
    for (int round = 1; round <= 16; ++round) {
      RANK_OK(later([&] { return all_reduce(g, sv, sv); }, &gap));
      const float want = static_cast<float>(1 << round);  // exact: 2^16 at most
      RANK_CHECK(sum[0] == want && sum.back() == want, "all_reduce {}: {} ... {}, not {}", round, sum[0], sum.back(),
                 want);
      RANK_CHECK(gap < 400, "all_reduce {}: rank 1's ended {} ms after rank 0's", round, gap);
    }
    return "";
  }, o));
}

// Two servers of one rank, rendezvous forced (UCX's choice for large
// messages on real hosts), for the flush's step-by-step tests, which drive
// the rank's NetChannel by hand with calls no call of the library's comes
// near (`kRawCall`).
constexpr uint32_t kRawCall = 0xffff0;
fgtest::JobOptions rendezvous_job(const char* token) { return fgtest::two_servers(token, 20s); }
// Runs body(group, its NetChannel, group rank) on a rank of a
// rendezvous_job (rendezvous forced), then a barrier; body's "" is success.
template <class Body>
std::string on_raw_net(const Config& c, Body body) {
  ::setenv("UCX_RNDV_THRESH", "8k", 1);
  auto comm = Communicator::create(c);
  RANK_OK(comm.status());
  Group& g = (*comm)->world();
  if (std::string e = body(g, *impl_of(g)->net, g.rank()); !e.empty()) return e;
  std::vector<uint8_t> one(1), both(2);
  RANK_OK(all_gather(g, view(one), view(both)));
  return "";
}
// Whether the flush marked `mark` ends before `until` (asked every 100 us;
// flushed() drives the sends itself).
bool flushed_by(transport::NetChannel& net, uint64_t mark, std::chrono::steady_clock::time_point until) {
  while (!net.flushed(mark)) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(100us);
  }
  return true;
}

// Posts a receive of `iov` from member 0 and drives the channel until a
// receive completes: whether it was this one, whole.
bool receive_raw(transport::NetChannel& net, uint32_t call, const transport::NetIov* iov, int token,
                 std::chrono::steady_clock::time_point until) {
  if (!net.recv(0, 0, call, 0, std::span<const transport::NetIov>(iov, 1), token).ok()) return false;
  std::optional<transport::NetChannel::Completion> got;
  while (!(got = net.poll_receive()) && std::chrono::steady_clock::now() < until) {
    net.progress();
    std::this_thread::sleep_for(100us);
  }
  return got && got->token == token && got->length == iov[0].len;
}

// The mechanism under the test above, step by step: a rendezvous send
// posted and not yet fetched is something to flush (start_flush says so at
// once: its receiver can fetch its bytes only through this member's
// progress), and flushed() says yes only once the receiver has them.
TEST(PointToPoint, ASendItsReceiverHasNotFetchedIsLeftToFlush) {
  fgtest::expect_all_ok(fgtest::run_job(2, [](const Config& c) {
    return on_raw_net(c, [](Group&, transport::NetChannel& net, int me) -> std::string {
      std::vector<uint8_t> out = message(0, 1, size_t{4} << 20, 88), in(out.size(), 0xEE);
      const transport::NetIov iov[1] = {{me == 0 ? out.data() : in.data(), out.size()}};
      const auto until = std::chrono::steady_clock::now() + 10s;
      if (me == 0) {
        RANK_OK(net.send(1, 0, kRawCall, 0, iov));
        const uint64_t mark = net.start_flush();
        RANK_CHECK(mark != 0, "a send its receiver has not fetched counts as nothing left to flush");
        const bool done = flushed_by(net, mark, until);
        RANK_CHECK(done, "the flush never ended");
        RANK_CHECK(net.poll_sends(), "flushed, but the send is not complete");
      } else {
        RANK_CHECK(receive_raw(net, kRawCall, iov, 7, until), "the receive did not complete");
        RANK_CHECK(wrong(in, 0, 1, 88) < 0, "the message");
      }
      return "";
    });
  }, rendezvous_job("p2p-flush")));
}

// A flush waits for the sends posted before it, not for later ones, so that
// while calls keep coming each flush still ends. Rank 0 sends A, marks a
// flush, sends B; rank 1 takes A at once and B only 1 s later: the flush
// ends while B is still in flight.
TEST(PointToPoint, AFlushWaitsForTheSendsBeforeItNotForLaterOnes) {
  fgtest::expect_all_ok(fgtest::run_job(2, [](const Config& c) {
    return on_raw_net(c, [](Group&, transport::NetChannel& net, int me) -> std::string {
      std::vector<uint8_t> a = message(0, 1, size_t{4} << 20, 91), b = message(0, 1, size_t{4} << 20, 92);
      std::vector<uint8_t> a_in(a.size(), 0xEE), b_in(b.size(), 0xEE);
      const transport::NetIov a_iov[1] = {{me == 0 ? a.data() : a_in.data(), a.size()}};
      const transport::NetIov b_iov[1] = {{me == 0 ? b.data() : b_in.data(), b.size()}};
      const auto until = std::chrono::steady_clock::now() + 10s;
      if (me == 0) {
        RANK_OK(net.send(1, 0, kRawCall, 0, a_iov));
        const uint64_t mark = net.start_flush();
        RANK_CHECK(mark != 0, "A, not yet fetched, left nothing to flush");
        RANK_OK(net.send(1, 0, kRawCall + 1, 0, b_iov));
        const bool done = flushed_by(net, mark, until);
        RANK_CHECK(done, "the flush of A never ended");
        RANK_CHECK(!net.poll_sends(), "B completed before its receiver posted it: the flush cannot have ended first");
        while (!net.poll_sends() && std::chrono::steady_clock::now() < until) {
          net.progress();
          std::this_thread::sleep_for(100us);
        }
        RANK_CHECK(net.poll_sends(), "B never left");
      } else {
        RANK_CHECK(receive_raw(net, kRawCall, a_iov, 1, until), "A did not arrive");
        std::this_thread::sleep_for(1s);
        RANK_CHECK(receive_raw(net, kRawCall + 1, b_iov, 2, until), "B did not arrive");
        RANK_CHECK(wrong(a_in, 0, 1, 91) < 0 && wrong(b_in, 0, 1, 92) < 0, "the messages");
      }
      return "";
    });
  }, rendezvous_job("p2p-flush-mark")));
}

// Between servers: one UCX message each, numbered per pair and direction;
// with two ranks a server the ring mixes mailboxes and UCX.
class RingAcrossServers : public ::testing::TestWithParam<int> {};

TEST_P(RingAcrossServers, EveryByteBothWaitingOrders) {
  const fgtest::JobOptions o = fgtest::two_servers("p2p-across", 20s);
  fgtest::expect_all_ok(fgtest::run_job(GetParam(), [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    const int n = g.size(), me = g.rank(), next = (me + 1) % n, prev = (me + n - 1) % n;
    uint64_t it = 0;
    for (int round = 0; round < 2; ++round) {
      for (size_t bytes : {size_t{0}, size_t{1}, size_t{16385}, size_t{200001}, size_t{1} << 20}) {
        ++it;
        std::vector<uint8_t> out = message(me, next, bytes, it), in(bytes, 0xEE);
        Request s = start_send(g, view(out), next, 9);
        Request r = start_recv(g, view(in), prev, 9);
        RANK_OK(round == 0 ? s.wait() : r.wait());
        RANK_OK(round == 0 ? r.wait() : s.wait());
        const long long bad = wrong(in, prev, me, it);
        RANK_CHECK(bad < 0, "{} bytes from rank {}: byte {} is wrong", bytes, prev, bad);
      }
    }
    // Messages arriving while a collective runs are not the collective's
    // (nor do its waits for its own sends wait for theirs).
    for (int k = 0; k < 3; ++k) {
      ++it;
      std::vector<uint8_t> out = message(me, next, 3000, it), in(3000, 0xEE);
      std::vector<uint8_t> one(64, static_cast<uint8_t>(me + k)), all(64 * static_cast<size_t>(n));
      Request r = start_recv(g, view(in), prev, 2);
      Request s = start_send(g, view(out), next, 2);
      RANK_OK(all_gather(g, view(one), view(all)));
      for (int m = 0; m < n; ++m) {
        RANK_CHECK(all[64 * static_cast<size_t>(m) + 63] == static_cast<uint8_t>(m + k), "the all-gather beside, rank {}", m);
      }
      RANK_OK(s.wait());
      RANK_OK(r.wait());
      RANK_CHECK(wrong(in, prev, me, it) < 0, "the message beside the all-gather");
    }
    return "";
  }, o));
}

INSTANTIATE_TEST_SUITE_P(PointToPoint, RingAcrossServers, ::testing::Values(2, 4));

// From any source across servers (ranks on this server and elsewhere):
// each message taken once, its sender said, its bytes right, eager and
// rendezvous sizes; a member elsewhere whose next message has another tag
// is passed over (that message is left for the receive that names it),
// and its message with the tag is taken after that.
class AnySourceAcrossServers : public ::testing::TestWithParam<int> {};

TEST_P(AnySourceAcrossServers, EachMessageOnceItsSenderSaidOtherTagsLeft) {
  const fgtest::JobOptions o = fgtest::two_servers("p2p-any-across", 20s);
  fgtest::expect_all_ok(fgtest::run_job(GetParam(), [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    const int n = g.size(), last = n - 1;
    for (size_t bytes : {size_t{3000}, size_t{1} << 20}) {
      // A tag per round: senders may run a round ahead.
      const int64_t tag = bytes == 3000 ? 11 : 12;
      if (g.rank() == last) {
        // Its first message has another tag: no receive from any source with the round's tag may take it.
        std::vector<uint8_t> other = message(last, 0, 64, 5);
        RANK_OK(send(g, view(other), 0, 5));
      }
      if (g.rank() != 0) {
        std::vector<uint8_t> out = message(g.rank(), 0, bytes, bytes);
        RANK_OK(send(g, view(out), 0, tag));
        continue;
      }
      std::vector<int> sources;
      auto take = [&]() -> std::string {
        std::vector<uint8_t> in(bytes, 0xEE);
        int source = -7;
        RANK_OK(recv(g, view(in), kAnySource, tag, &source));
        RANK_CHECK(source >= 1 && source < n, "source {}", source);
        const long long bad = wrong(in, source, 0, bytes);
        RANK_CHECK(bad < 0, "{} bytes said to be from rank {}: byte {} is wrong", bytes, source, bad);
        sources.push_back(source);
        return "";
      };
      for (int k = 0; k < n - 2; ++k) {
        if (std::string e = take(); !e.empty()) return e;
      }
      std::sort(sources.begin(), sources.end());
      for (int k = 0; k < n - 2; ++k) {
        RANK_CHECK(sources[static_cast<size_t>(k)] == k + 1, "{} bytes: sources {}, rank {} (whose next message has tag 5) "
                                                             "among them", bytes, fmt::join(sources, ","), last);
      }
      std::vector<uint8_t> other(64, 0xEE);
      RANK_OK(recv(g, view(other), last, 5));
      RANK_CHECK(wrong(other, last, 0, 5) < 0, "the message with tag 5");
      if (std::string e = take(); !e.empty()) return e;
      RANK_CHECK(sources.back() == last, "the last message came from rank {}, not {}", sources.back(), last);
    }
    std::vector<uint8_t> one(64, static_cast<uint8_t>(g.rank())), all(64 * static_cast<size_t>(n));
    RANK_OK(all_gather(g, view(one), view(all)));
    RANK_CHECK(all[64 * static_cast<size_t>(last)] == static_cast<uint8_t>(last), "the all-gather after");
    return "";
  }, o));
}

INSTANTIATE_TEST_SUITE_P(PointToPoint, AnySourceAcrossServers, ::testing::Values(2, 4));

// A message of another tag that has already arrived from a member
// elsewhere is passed over, however long the receive from any source looks
// at it: the receive stays pending (and has taken nothing) until the
// receive that names it has taken it, then takes the member's next message,
// which has its tag.
TEST(PointToPoint, AnySourceAcrossServersPassesOverAnotherTagAlreadyThere) {
  const fgtest::JobOptions o = fgtest::two_servers("p2p-any-across-other-tag", 20s);
  fgtest::expect_all_ok(fgtest::run_job(2, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    std::vector<uint8_t> one(64, static_cast<uint8_t>(g.rank())), all(128);
    if (g.rank() == 1) {
      std::vector<uint8_t> other = message(1, 0, 64, 5), mine = message(1, 0, 3000, 11);
      RANK_OK(send(g, view(other), 0, 5));
      RANK_OK(send(g, view(mine), 0, 11));
      // After its sends on the same endpoint: once rank 0 has this all-gather, both messages are there.
      RANK_OK(all_gather(g, view(one), view(all)));
      return "";
    }
    RANK_OK(all_gather(g, view(one), view(all)));
    std::vector<uint8_t> in(3000, 0xEE), other(64, 0xEE);
    int source = -7;
    Request any = start_recv(g, view(in), kAnySource, 11, &source);
    RANK_CHECK(!any.wait_for(std::chrono::microseconds(300000)), "the receive from any source with tag 11 completed "
                                                                 "while rank 1's next message has tag 5: {}",
               any.wait().to_string());
    RANK_OK(recv(g, view(other), 1, 5));
    RANK_CHECK(wrong(other, 1, 0, 5) < 0, "the message with tag 5");
    RANK_OK(any.wait());
    RANK_CHECK(source == 1 && wrong(in, 1, 0, 11) < 0, "the message with tag 11 (source {})", source);
    return "";
  }, o));
}

// Across servers, a receive from any source that nobody sends to ends in
// the timeout, saying so, and the group goes on; one whose message has a
// tag of the same 15-bit fold (1 and 32768) is no wrong byte: a Mismatch
// naming both tags (the group then fails, as after any mismatch between
// servers).
TEST(PointToPoint, AnySourceAcrossServersTimesOutOrFindsTheTagWrong) {
  const fgtest::JobOptions o = fgtest::two_servers("p2p-any-across-timeout", 1500ms);
  fgtest::expect_all_ok(fgtest::run_job(2, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    std::vector<uint8_t> in(64, 0xEE), one(4), all(8);
    if (g.rank() == 0) std::this_thread::sleep_for(2s);  // its all-gather must not wait out the timeout
    if (g.rank() == 1) {
      Status s = recv(g, view(in), kAnySource, 3);
      RANK_CHECK(s.kind() == ErrorKind::kTimeout && s.message().find("receiving from any rank (tag 3)") != std::string::npos,
                 "{}", s.to_string());
    }
    RANK_OK(all_gather(g, view(one), view(all)));
    if (g.rank() == 0) {
      std::vector<uint8_t> out = message(0, 1, 64, 1);
      RANK_OK(send(g, view(out), 1, 32768));
    } else {
      Status s = recv(g, view(in), kAnySource, 1);
      RANK_CHECK(s.kind() == ErrorKind::kMismatch && s.message().find("with tag 32768 to rank 1, which receives 64 bytes "
                                                                      "with tag 1") != std::string::npos,
                 "{}", s.to_string());
    }
    return "";
  }, o));
}

// Sends and receives handed to the library's progress thread while this
// thread runs collectives on the same group between servers: two threads
// drive the group's one UCX worker at once (NetChannel serializes them);
// every byte of both checked.
TEST(PointToPoint, MessagesInTheBackgroundBesideCollectivesAcrossServers) {
  const fgtest::JobOptions o = fgtest::two_servers("p2p-across-background", 20s);
  fgtest::expect_all_ok(fgtest::run_job(2, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    const int me = g.rank(), peer = 1 - me;
    for (uint64_t it = 1; it <= 40; ++it) {
      const size_t bytes = 1000 + (it * 7919) % 150000;
      std::vector<uint8_t> out = message(me, peer, bytes, it), in(bytes, 0xEE);
      Request r = start_recv(g, view(in), peer, 4);
      Request s = start_send(g, view(out), peer, 4);
      r.drive_in_background();
      s.drive_in_background();
      std::vector<uint8_t> one(4096, static_cast<uint8_t>(me + it)), all(8192);
      for (int k = 0; k < 3; ++k) RANK_OK(all_gather(g, view(one), view(all)));
      RANK_CHECK(all[0] == static_cast<uint8_t>(it) && all[4096] == static_cast<uint8_t>(1 + it), "all-gather {}", it);
      RANK_OK(s.wait());
      RANK_OK(r.wait());
      const long long bad = wrong(in, peer, me, it);
      RANK_CHECK(bad < 0, "message {}: byte {} is wrong", it, bad);
    }
    return "";
  }, o));
}

// A receive of another length between servers: kMismatch on the receiver,
// naming both sizes; the group is failed (as after any error between
// servers), and the sender's next call there fails too rather than hang.
TEST(PointToPoint, ALengthThatDisagreesBetweenServersFailsTheGroup) {
  const fgtest::JobOptions o = fgtest::two_servers("p2p-across-mismatch", 5s);
  fgtest::expect_all_ok(fgtest::run_job(2, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    std::vector<uint8_t> a(100, 1), b(200), one(8), all(16);
    if (g.rank() == 0) {
      RANK_OK(send(g, view(a), 1, 1));
    } else {
      Status s = recv(g, view(b), 0, 1);
      RANK_CHECK(s.kind() == ErrorKind::kMismatch && s.message().find("sent 100 bytes with tag 1 to rank 1, which "
                                                                      "receives 200 bytes with tag 1") != std::string::npos,
                 "receiver: {}", s.to_string());
    }
    Status after = all_gather(g, view(one), view(all));
    RANK_CHECK(!after.ok(), "the group went on after a mismatch between servers");
    return "";
  }, o));
}

}  // namespace
