// gather, scatter, all_to_all (even and uneven) and reduce: every byte
// checked, every root, sizes from nothing to several pipeline steps, ranks
// outnumbering cores, inputs in ordinary memory and in the symmetric heap,
// within a server and across servers; members that disagree on the root get
// a mismatch, all_to_all counts that disagree are refused on every member,
// and the group goes on.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include <fmt/format.h>

#include "core/group_impl.hpp"
#include "fastgather/fastgather.hpp"
#include "harness.hpp"
#include "transport/channel.hpp"
#include "transport/net_channel.hpp"

using namespace fastgather;

namespace {

// Byte i of what group rank `from` sends group rank `to` in iteration it.
uint8_t byte_of(int from, int to, size_t i, uint64_t it) {
  uint64_t x = (static_cast<uint64_t>(from + 1) << 48) ^ (static_cast<uint64_t>(to + 1) << 32) ^ i ^ (it << 56);
  x *= 0x9E3779B97F4A7C15ull;
  return static_cast<uint8_t>(x >> 56);
}

void fill(void* dst, size_t bytes, int from, int to, uint64_t it) {
  auto* p = static_cast<uint8_t*>(dst);
  for (size_t i = 0; i < bytes; ++i) p[i] = byte_of(from, to, i, it);
}

// The first byte that is not what `from` sent `to`, or -1.
long long wrong(const void* src, size_t bytes, int from, int to, uint64_t it) {
  const auto* p = static_cast<const uint8_t*>(src);
  for (size_t i = 0; i < bytes; ++i) {
    if (p[i] != byte_of(from, to, i, it)) return static_cast<long long>(i);
  }
  return -1;
}

// An input of `bytes`: in the group's heap, or ordinary memory.
Result<Tensor> input_of(Group& g, size_t bytes, bool heap) {
  const std::vector<int64_t> shape = {static_cast<int64_t>(bytes)};
  return heap ? g.empty(DType::kU8, shape) : Tensor::allocate(DType::kU8, shape);
}

// Elements member `from` sends member `to` in an uneven all_to_all: zeros
// among them, and one pair much larger than the others.
int64_t count_of(int from, int to, size_t unit) {
  const int64_t k = (from * 7 + to * 3) % 5;
  return from == 0 && to == 1 ? static_cast<int64_t>(unit * 9 + 3) : k * static_cast<int64_t>(unit) + (k == 2 ? 1 : 0);
}

// An all_to_all's input of int32 elements on this member (`me`): send[j] of
// them for each member j, back to back, each part filled as from me to j.
Result<Tensor> split_input(Group& g, const std::vector<int64_t>& send, bool heap, uint64_t it) {
  const int64_t sent = std::accumulate(send.begin(), send.end(), int64_t{0});
  auto in = heap ? g.empty(DType::kI32, {sent}) : Tensor::allocate(DType::kI32, {sent});
  if (!in.ok()) return in;
  size_t at = 0;
  for (size_t j = 0; j < send.size(); ++j) {
    const size_t part = static_cast<size_t>(send[j]) * 4;
    fill(static_cast<std::byte*>(in->data()) + at, part, g.rank(), static_cast<int>(j), it);
    at += part;
  }
  return in;
}

// The first wrong part of an all_to_all's output on this member, which
// received recv[m] int32 elements from each member m: which member, its
// part's bytes, the wrong byte's place in it (member -1: none).
struct WrongSplit {
  int member = -1;
  size_t part = 0;
  long long byte = -1;
};
WrongSplit wrong_split(const Tensor& out, const std::vector<int64_t>& recv, int me, uint64_t it) {
  size_t at = 0;
  for (size_t m = 0; m < recv.size(); ++m) {
    const size_t part = static_cast<size_t>(recv[m]) * 4;
    const long long bad = wrong(static_cast<const std::byte*>(out.data()) + at, part, static_cast<int>(m), me, it);
    if (bad >= 0) return {static_cast<int>(m), part, bad};
    at += part;
  }
  return {};
}

std::string every_exchange(const Config& c, const std::vector<size_t>& sizes, bool heap) {
  auto comm = Communicator::create(c);
  RANK_OK(comm.status());
  Group& g = (*comm)->world();
  const int n = g.size(), me = g.rank();
  const size_t nn = static_cast<size_t>(n);
  uint64_t it = 0;
  for (size_t bytes : sizes) {
    for (int root = 0; root < n; ++root) {
      ++it;
      // gather: block m of the root's output is member m's input.
      auto in = input_of(g, bytes, heap);
      RANK_OK(in.status());
      fill(in->data(), bytes, me, root, it);
      Tensor out = Tensor::empty(DType::kU8, {me == root ? static_cast<int64_t>(bytes * nn) : 0});
      std::memset(out.data(), 0xEE, out.nbytes());
      RANK_OK(gather(g, in->view(), out.view(), root));
      for (int m = 0; me == root && m < n; ++m) {
        const long long bad = wrong(static_cast<std::byte*>(out.data()) + static_cast<size_t>(m) * bytes, bytes, m, root, it);
        RANK_CHECK(bad < 0, "gather of {} bytes to root {}: rank {}'s block wrong at byte {}", bytes, root, m, bad);
      }
      // The list form: each block into an output of its own.
      std::vector<Tensor> blocks;
      std::vector<TensorView> views;
      for (int m = 0; me == root && m < n; ++m) {
        blocks.push_back(Tensor::empty(DType::kU8, {static_cast<int64_t>(bytes)}));
        views.push_back(blocks.back().view());
      }
      RANK_OK(gather(g, in->view(), std::span<const TensorView>(views), root));
      for (int m = 0; me == root && m < n; ++m) {
        const long long bad = wrong(blocks[static_cast<size_t>(m)].data(), bytes, m, root, it);
        RANK_CHECK(bad < 0, "gather of {} bytes into a list, root {}: rank {}'s block wrong at byte {}", bytes, root, m, bad);
      }
      // scatter: chunk j of the root's input goes to member j.
      auto all = input_of(g, me == root ? bytes * nn : 0, heap);
      RANK_OK(all.status());
      for (int j = 0; me == root && j < n; ++j) {
        fill(static_cast<std::byte*>(all->data()) + static_cast<size_t>(j) * bytes, bytes, root, j, it);
      }
      Tensor mine = Tensor::empty(DType::kU8, {static_cast<int64_t>(bytes)});
      std::memset(mine.data(), 0xEE, mine.nbytes());
      RANK_OK(scatter(g, all->view(), mine.view(), root));
      const long long bad = wrong(mine.data(), bytes, root, me, it);
      RANK_CHECK(bad < 0, "scatter of {} bytes from root {}: wrong at byte {}", bytes, root, bad);
      // The list form: each chunk from an input of its own.
      std::vector<Tensor> chunks;
      std::vector<TensorView> chunk_views;
      for (int j = 0; me == root && j < n; ++j) {
        chunks.push_back(Tensor::empty(DType::kU8, {static_cast<int64_t>(bytes)}));
        fill(chunks.back().data(), bytes, root, j, it + 1000);
        chunk_views.push_back(chunks.back().view());
      }
      std::memset(mine.data(), 0xEE, mine.nbytes());
      RANK_OK(scatter(g, std::span<const TensorView>(chunk_views), mine.view(), root));
      const long long bad_list = wrong(mine.data(), bytes, root, me, it + 1000);
      RANK_CHECK(bad_list < 0, "scatter of {} bytes from a list, root {}: wrong at byte {}", bytes, root, bad_list);
    }
    // all_to_all, even: part j of every input goes to member j.
    ++it;
    auto in = input_of(g, bytes * nn, heap);
    RANK_OK(in.status());
    for (int j = 0; j < n; ++j) fill(static_cast<std::byte*>(in->data()) + static_cast<size_t>(j) * bytes, bytes, me, j, it);
    Tensor out = Tensor::empty(DType::kU8, {static_cast<int64_t>(bytes * nn)});
    std::memset(out.data(), 0xEE, out.nbytes());
    RANK_OK(all_to_all(g, in->view(), out.view()));
    for (int m = 0; m < n; ++m) {
      const long long bad = wrong(static_cast<std::byte*>(out.data()) + static_cast<size_t>(m) * bytes, bytes, m, me, it);
      RANK_CHECK(bad < 0, "all_to_all of {} bytes a part: rank {}'s part wrong at byte {}", bytes, m, bad);
    }
    // all_to_all, uneven (int32 elements: the counts are elements).
    ++it;
    std::vector<int64_t> send, recv;
    for (int j = 0; j < n; ++j) send.push_back(count_of(me, j, bytes / 4));
    for (int m = 0; m < n; ++m) recv.push_back(count_of(m, me, bytes / 4));
    const int64_t received = std::accumulate(recv.begin(), recv.end(), int64_t{0});
    auto vin = split_input(g, send, heap, it);
    RANK_OK(vin.status());
    Tensor vout = Tensor::empty(DType::kI32, {received});
    std::memset(vout.data(), 0xEE, vout.nbytes());
    RANK_OK(all_to_all(g, vin->view(), vout.view(), send, recv));
    const WrongSplit bad = wrong_split(vout, recv, me, it);
    RANK_CHECK(bad.member < 0, "uneven all_to_all ({} bytes a unit): rank {}'s {} bytes wrong at byte {}", bytes,
               bad.member, bad.part, bad.byte);
    // reduce: the root gets the sum, everyone else keeps its data.
    const int64_t count = static_cast<int64_t>(bytes / 4);
    for (int root = 0; root < n; ++root) {
      std::vector<int32_t> data(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i) data[static_cast<size_t>(i)] = static_cast<int32_t>(i * (me + 1) + root);
      RANK_OK(reduce(g, TensorView(data.data(), DType::kI32, {count}), root));
      for (int64_t i = 0; i < count; ++i) {
        const int32_t want = me == root ? static_cast<int32_t>(i * (n * (n + 1) / 2) + root * n)
                                        : static_cast<int32_t>(i * (me + 1) + root);
        RANK_CHECK(data[static_cast<size_t>(i)] == want, "reduce to root {} of {} int32: element {} is {}, not {}", root,
                   count, i, data[static_cast<size_t>(i)], want);
      }
    }
  }
  return "";
}

}  // namespace

class Exchanges : public ::testing::TestWithParam<int> {};

TEST_P(Exchanges, EveryByteOrdinaryMemory) {
  fgtest::expect_all_ok(fgtest::run_job(GetParam(), [](const Config& c) {
    return every_exchange(c, {0, 5, 33, 4099, 300000}, false);
  }));
}

TEST_P(Exchanges, EveryByteFromTheHeap) {
  fgtest::expect_all_ok(fgtest::run_job(GetParam(), [](const Config& c) {
    return every_exchange(c, {64, 8192, 300000}, true);
  }));
}

INSTANTIATE_TEST_SUITE_P(Ranks, Exchanges, ::testing::Values(2, 3, 5));

// Within a server, an all_to_all whose blocks reach FG_SINGLE_COPY_MIN_BYTES
// runs by single copy where members read each other's memory: each member
// reads only its split of each peer's block, where it lies, straight into its
// output. From ordinary memory (FG_SINGLE_COPY=always: read by
// process_vm_readv) the bytes a member read from its peers are exactly its
// splits; from the heap, every byte. Even and uneven splits, 3 members.
std::string all_to_all_by_single_copy(const Config& base, bool heap) {
  Config c = base;
  Settings st = c.settings.value_or(Settings{});
  st.single_copy = Settings::SingleCopy::kAlways;
  st.single_copy_min_bytes = 1 << 20;
  c.settings = st;
  auto comm = Communicator::create(c);
  RANK_OK(comm.status());
  Group& g = (*comm)->world();
  const int n = g.size(), me = g.rank();
  const transport::ShmChannel& ch = *impl_of(g)->channel;
  const bool counted = !heap && ch.capabilities().reads_peer_memory;
  uint64_t it = 500;
  for (bool even : {true, false}) {
    ++it;
    // int32 elements: member j gets send[j] of them (even: 100003 each, 1.2 MB a block).
    std::vector<int64_t> send, recv;
    for (int j = 0; j < n; ++j) send.push_back(even ? 100003 : count_of(me, j, 90001));
    for (int m = 0; m < n; ++m) recv.push_back(even ? 100003 : count_of(m, me, 90001));
    const int64_t received = std::accumulate(recv.begin(), recv.end(), int64_t{0});
    auto in = split_input(g, send, heap, it);
    RANK_OK(in.status());
    Tensor out = Tensor::empty(DType::kI32, {received});
    std::memset(out.data(), 0xEE, out.nbytes());
    const uint64_t before = ch.bytes_read_from_peers();
    RANK_OK(even ? all_to_all(g, in->view(), out.view()) : all_to_all(g, in->view(), out.view(), send, recv));
    const uint64_t read = ch.bytes_read_from_peers() - before;
    const WrongSplit bad = wrong_split(out, recv, me, it);
    RANK_CHECK(bad.member < 0, "{} all_to_all by single copy ({}): rank {}'s {} bytes wrong at byte {}",
               even ? "even" : "uneven", heap ? "heap" : "memory", bad.member, bad.part, bad.byte);
    uint64_t from_peers = 0;
    for (int m = 0; m < n; ++m) {
      if (m != me) from_peers += static_cast<uint64_t>(recv[static_cast<size_t>(m)]) * 4;
    }
    RANK_CHECK(!counted || read == from_peers, "{} all_to_all: read {} bytes from peers' memory, its splits are {}",
               even ? "even" : "uneven", read, from_peers);
  }
  return "";
}

TEST(Exchanges, AllToAllBySingleCopyReadsOnlyEachSplit) {
  for (bool heap : {false, true}) {
    fgtest::expect_all_ok(fgtest::run_job(3, [&](const Config& c) { return all_to_all_by_single_copy(c, heap); }));
  }
}

// Two servers of two ranks (the hierarchical all-gather past 64 KiB) and
// two of one rank each.
TEST(Exchanges, AcrossServersEveryByte) {
  for (int world : {4, 2}) {
    const fgtest::JobOptions o = fgtest::two_servers("exchanges-across-servers", std::chrono::milliseconds(20000));
    fgtest::expect_all_ok(fgtest::run_job(world, [](const Config& c) {
      return every_exchange(c, {0, 33, 70001}, false);
    }, o));
  }
}

// Across servers a member is sent only what it keeps: what each member puts
// on the wire for a gather, a scatter (both forms) and an even all_to_all is
// one header to every member on another server, and behind it that member's
// part alone (one piece each at these sizes). Before, every block went to
// every member on another server: n times the bytes.
std::string only_parts_on_the_wire(const Config& c) {
  auto comm = Communicator::create(c);
  RANK_OK(comm.status());
  Group& g = (*comm)->world();
  const int n = g.size(), me = g.rank();
  const size_t nn = static_cast<size_t>(n);
  const algo::Topology& topo = impl_of(g)->shape.topo;
  transport::NetChannel& net = *impl_of(g)->net;
  // The bytes this member puts on the wire for `op`, against one header and
  // part(d) bytes to each member d on another server.
  auto wire = [&](const char* what, auto&& op, auto&& part) -> std::string {
    const uint64_t before = net.bytes_sent();
    if (Status s = op(); !s.ok()) return fmt::format("rank {}: {}: {}", me, what, s.to_string());
    const uint64_t sent = net.bytes_sent() - before;
    uint64_t expected = 0;
    for (int d = 0; d < n; ++d) {
      if (!topo.local(d)) expected += sizeof(transport::PostHeader) + part(d);
    }
    if (sent != expected) return fmt::format("rank {}: {} put {} bytes on the wire, not {}", me, what, sent, expected);
    return "";
  };
  const size_t bytes = 70001;
  for (int root : {0, n - 1}) {
    Tensor in = Tensor::empty(DType::kU8, {static_cast<int64_t>(bytes)});
    fill(in.data(), bytes, me, root, 1);
    Tensor out = Tensor::empty(DType::kU8, {me == root ? static_cast<int64_t>(bytes * nn) : 0});
    std::string bad = wire("gather", [&] { return gather(g, in.view(), out.view(), root); },
                           [&](int d) -> uint64_t { return d == root ? bytes : 0; });
    if (!bad.empty()) return bad;
    for (int m = 0; me == root && m < n; ++m) {
      const long long at = wrong(static_cast<std::byte*>(out.data()) + static_cast<size_t>(m) * bytes, bytes, m, root, 1);
      RANK_CHECK(at < 0, "gather to root {}: rank {}'s block wrong at byte {}", root, m, at);
    }
    Tensor all = Tensor::empty(DType::kU8, {me == root ? static_cast<int64_t>(bytes * nn) : 0});
    for (int j = 0; me == root && j < n; ++j) fill(static_cast<std::byte*>(all.data()) + static_cast<size_t>(j) * bytes, bytes, root, j, 2);
    bad = wire("scatter", [&] { return scatter(g, all.view(), in.view(), root); },
               [&](int) -> uint64_t { return me == root ? bytes : 0; });
    if (!bad.empty()) return bad;
    const long long at = wrong(in.data(), bytes, root, me, 2);
    RANK_CHECK(at < 0, "scatter from root {}: wrong at byte {}", root, at);
    std::vector<TensorView> chunks;
    for (int j = 0; me == root && j < n; ++j) {
      chunks.push_back(TensorView(static_cast<std::byte*>(all.data()) + static_cast<size_t>(j) * bytes, DType::kU8,
                                  {static_cast<int64_t>(bytes)}));
    }
    bad = wire("scatter(list)", [&] { return scatter(g, std::span<const TensorView>(chunks), in.view(), root); },
               [&](int) -> uint64_t { return me == root ? bytes : 0; });
    if (!bad.empty()) return bad;
  }
  const size_t split = 3001;
  Tensor send = Tensor::empty(DType::kU8, {static_cast<int64_t>(split * nn)});
  for (int d = 0; d < n; ++d) fill(static_cast<std::byte*>(send.data()) + static_cast<size_t>(d) * split, split, me, d, 3);
  Tensor recv = Tensor::empty(DType::kU8, {static_cast<int64_t>(split * nn)});
  const std::string bad = wire("all_to_all", [&] { return all_to_all(g, send.view(), recv.view()); },
                               [&](int) -> uint64_t { return split; });
  if (!bad.empty()) return bad;
  for (int m = 0; m < n; ++m) {
    const long long at = wrong(static_cast<std::byte*>(recv.data()) + static_cast<size_t>(m) * split, split, m, me, 3);
    RANK_CHECK(at < 0, "all_to_all: rank {}'s split wrong at byte {}", m, at);
  }
  return "";
}

TEST(Exchanges, AcrossServersEachMemberIsSentOnlyItsPart) {
  for (int world : {4, 2}) {
    const fgtest::JobOptions o = fgtest::two_servers("exchanges-parts", std::chrono::milliseconds(20000));
    fgtest::expect_all_ok(fgtest::run_job(world, only_parts_on_the_wire, o));
  }
}

// Members that disagree on the root get a mismatch naming the op on every
// member; all_to_all counts that do not pair up are refused on every member,
// naming the pair; the group goes on.
TEST(Exchanges, DisagreementsAreFoundOnEveryMemberAndTheGroupGoesOn) {
  fgtest::expect_all_ok(fgtest::run_job(3, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    const int root = g.rank() == 2 ? 1 : 0;
    std::vector<uint8_t> in(40, 1), out(120, 0);
    const TensorView vin(in.data(), DType::kU8, {40}), vout(out.data(), DType::kU8, {120});
    Status s = gather(g, vin, vout, root);
    RANK_CHECK(s.kind() == ErrorKind::kMismatch && s.message().find("gather") != std::string::npos,
               "gather, roots disagree: {}", s.to_string());
    s = scatter(g, vout, vin, root);
    RANK_CHECK(s.kind() == ErrorKind::kMismatch && s.message().find("scatter") != std::string::npos,
               "scatter, roots disagree: {}", s.to_string());
    // Rank 1 expects 5 elements from rank 0, which sends it 4.
    std::vector<int64_t> send = {4, 4, 4}, recv = {4, 4, 4};
    if (g.rank() == 1) recv = {5, 3, 4};
    std::vector<int32_t> a(12, 7), b(12, 0);
    s = all_to_all(g, TensorView(a.data(), DType::kI32, {12}), TensorView(b.data(), DType::kI32, {12}), send, recv);
    RANK_CHECK(s.kind() == ErrorKind::kInvalidArgument &&
                   s.message().find("rank 0 sends 4 elements to rank 1, which expects 5") != std::string::npos,
               "counts that disagree: {}", s.to_string());
    // Agreeing again.
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint8_t>(g.rank() * 50 + i);
    RANK_OK(gather(g, vin, vout, 0));
    for (int m = 0; g.rank() == 0 && m < 3; ++m) {
      RANK_CHECK(out[static_cast<size_t>(m) * 40 + 39] == static_cast<uint8_t>(m * 50 + 39), "after: rank {}'s block", m);
    }
    return "";
  }));
}

// Across servers (two of two ranks each), a scatter whose members disagree on
// the root fails on every member with what it saw, not the group's timeout,
// whichever server each thinks the root is on: rank 2 thinks it is the root
// (its server's scatter has its chunks, its server peer's has none) while the
// others say rank 0 or rank 1.
TEST(Exchanges, AcrossServersAScatterWhoseRootsDisagreeFailsEveryMember) {
  for (int other_root : {0, 1}) {
    const fgtest::JobOptions o = fgtest::two_servers("exchanges-roots", std::chrono::milliseconds(5000));
    fgtest::expect_all_ok(fgtest::run_job(4, [&](const Config& c) -> std::string {
      auto comm = Communicator::create(c);
      RANK_OK(comm.status());
      Group& g = (*comm)->world();
      const int root = g.rank() == 2 ? 2 : other_root;
      std::vector<uint8_t> all(4 * 70001, 3), mine(70001, 0);
      const Status s = scatter(g, TensorView(all.data(), DType::kU8, {4 * 70001}), TensorView(mine.data(), DType::kU8, {70001}), root);
      RANK_CHECK(!s.ok() && s.kind() != ErrorKind::kTimeout, "scatter, roots {} and 2 disagree: {}", other_root, s.to_string());
      return "";
    }, o));
  }
}

// Arguments no member could run with are refused before anything is sent,
// naming what was wrong; a null pointer is never written through.
TEST(Exchanges, BadArgumentsAreRefused) {
  fgtest::expect_all_ok(fgtest::run_job(2, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    std::vector<uint8_t> in(8), out(16);
    const TensorView vin(in.data(), DType::kU8, {8}), vout(out.data(), DType::kU8, {16});
    RANK_CHECK(gather(g, vin, vout, 2).kind() == ErrorKind::kInvalidArgument, "root 2 of 2");
    RANK_CHECK(scatter(g, vout, vin, -1).kind() == ErrorKind::kInvalidArgument, "root -1");
    RANK_CHECK(gather(g, vin, TensorView(out.data(), DType::kU8, {15}), g.rank()).kind() == ErrorKind::kInvalidArgument,
               "a root's output of the wrong size");
    RANK_CHECK(gather(g, vin, TensorView(nullptr, DType::kU8, {16}), g.rank()).kind() == ErrorKind::kInvalidArgument,
               "a null output holding bytes");
    RANK_CHECK(all_to_all(g, TensorView(in.data(), DType::kU8, {7}), TensorView(out.data(), DType::kU8, {7}))
                       .kind() == ErrorKind::kInvalidArgument,
               "7 elements between 2 ranks");
    const std::vector<int64_t> negative = {-1, 9}, fine = {4, 4};
    RANK_CHECK(all_to_all(g, vin, TensorView(out.data(), DType::kU8, {8}), negative, fine).kind() ==
                   ErrorKind::kInvalidArgument,
               "a negative count");
    RANK_CHECK(all_to_all(g, vin, TensorView(in.data() + 4, DType::kU8, {4}), fine, fine).kind() ==
                   ErrorKind::kInvalidArgument,
               "overlapping input and output");
    RANK_CHECK(reduce(g, vin, 5).kind() == ErrorKind::kInvalidArgument, "reduce to root 5");
    // A list whose output for another rank is the input: that block would land on bytes not
    // yet sent (gather and all_gather alike).
    std::vector<uint8_t> other(8);
    const TensorView vother(other.data(), DType::kU8, {8});
    const std::vector<TensorView> aliasing = g.rank() == 0 ? std::vector<TensorView>{vother, vin}
                                                           : std::vector<TensorView>{vin, vother};
    RANK_CHECK(gather(g, vin, std::span<const TensorView>(aliasing), g.rank()).kind() == ErrorKind::kInvalidArgument,
               "gather into a list whose other block is the input");
    RANK_CHECK(all_gather(g, vin, std::span<const TensorView>(aliasing)).kind() == ErrorKind::kInvalidArgument,
               "all_gather into a list whose other block is the input");
    RANK_CHECK(scatter(g, std::span<const TensorView>(aliasing), vin, g.rank()).kind() == ErrorKind::kInvalidArgument,
               "scatter from a list whose other chunk is the output");
    // Still usable.
    in.assign(8, static_cast<uint8_t>(g.rank() + 1));
    RANK_OK(reduce(g, vin, 1));
    RANK_CHECK(g.rank() != 1 || in[7] == 3, "reduce after the refusals: {}", in[7]);
    return "";
  }));
}
