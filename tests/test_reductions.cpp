// Every reduction (fastgather/reduce_op.hpp) of reduce_scatter and
// all_reduce, for every dtype it serves, within a server and across two
// (simulated) servers: each rank computes every rank's input itself and
// checks every element bit for bit against the reduction in group-rank order
// (across servers: each server's ranks in order, then the servers in order;
// fp16/bf16 sums, averages and products in fp32, rounded once), at sizes on
// both sides of the two-shot and inline boundaries. Then what is refused:
// members that disagree on the reduction (a mismatch naming it, on every
// member; the group goes on), and reductions a dtype does not serve.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "fastgather/fastgather.hpp"
#include "harness.hpp"

using namespace fastgather;

namespace {

constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg,  ReduceOp::kProduct, ReduceOp::kMin,
                             ReduceOp::kMax, ReduceOp::kBand, ReduceOp::kBor,     ReduceOp::kBxor};
constexpr DType kDtypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kF64, DType::kI8,
                             DType::kU8,  DType::kI16, DType::kI32,  DType::kI64, DType::kBool};

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Rank r's element i of call `it`, as raw bits of the dtype: floats in
// [-2, 2] with fractional bits (products of a few stay in range, and
// rounding shows), integers anywhere (sums and products wrap), bool 0 or 1.
uint64_t raw(DType dtype, size_t i, int rank, uint64_t it) {
  const uint64_t h = mix(it * 1000003 + static_cast<uint64_t>(rank) * 7919 + i * 0x100000001b3ull);
  const double v = (static_cast<double>(h % 40001) - 20000.0) / 10007.0;
  switch (dtype) {
    case DType::kF32: return std::bit_cast<uint32_t>(static_cast<float>(v));
    case DType::kF64: return std::bit_cast<uint64_t>(v);
    case DType::kF16: return float_to_half(static_cast<float>(v));
    case DType::kBF16: return float_to_bf16(static_cast<float>(v));
    case DType::kBool: return h & 1;
    default: return h;
  }
}

void fill(DType dtype, std::byte* base, size_t count, int rank, uint64_t it) {
  const size_t es = dtype_size(dtype);
  for (size_t i = 0; i < count; ++i) {
    const uint64_t v = raw(dtype, i, rank, it);
    std::memcpy(base + i * es, &v, es);  // little-endian: the low bytes
  }
}

template <typename T>
T fold(ReduceOp op, T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    switch (op) {
      case ReduceOp::kProduct: return a * b;
      case ReduceOp::kMin: return std::fmin(a, b);  // no NaN among the inputs
      case ReduceOp::kMax: return std::fmax(a, b);
      default: return a + b;
    }
  } else {
    using U = std::make_unsigned_t<T>;
    switch (op) {
      case ReduceOp::kProduct: return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
      case ReduceOp::kMin: return std::min(a, b);
      case ReduceOp::kMax: return std::max(a, b);
      case ReduceOp::kBand: return a & b;
      case ReduceOp::kBor: return a | b;
      case ReduceOp::kBxor: return a ^ b;
      default: return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    }
  }
}

// Element i over `world` ranks in servers of `per_server`, in the domain T
// (float for fp16/bf16), from each rank's value as T.
template <typename T, typename Load>
T reduce_in_order(ReduceOp op, int world, int per_server, Load load) {
  T result{}, server{};
  for (int r = 0; r < world; ++r) {
    const T x = load(r);
    const bool first = r % per_server == 0, last = r % per_server == per_server - 1;
    server = first ? x : fold(op, server, x);
    if (last) result = r < per_server ? server : fold(op, result, server);
  }
  return result;
}

// The bits element i must have.
uint64_t want(ReduceOp op, DType dtype, size_t i, int world, int per_server, uint64_t it) {
  const ReduceOp folded = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  auto of = [&](int r) { return raw(dtype, i, r, it); };
  switch (dtype) {
    case DType::kF32: {
      float f = reduce_in_order<float>(folded, world, per_server, [&](int r) { return std::bit_cast<float>(static_cast<uint32_t>(of(r))); });
      if (op == ReduceOp::kAvg) f /= static_cast<float>(world);
      return std::bit_cast<uint32_t>(f);
    }
    case DType::kF64: {
      double d = reduce_in_order<double>(folded, world, per_server, [&](int r) { return std::bit_cast<double>(of(r)); });
      if (op == ReduceOp::kAvg) d /= world;
      return std::bit_cast<uint64_t>(d);
    }
    case DType::kF16: case DType::kBF16: {
      const bool h = dtype == DType::kF16;
      float f = reduce_in_order<float>(folded, world, per_server, [&](int r) {
        return h ? half_to_float(static_cast<uint16_t>(of(r))) : bf16_to_float(static_cast<uint16_t>(of(r)));
      });
      if (op == ReduceOp::kAvg) f /= static_cast<float>(world);
      return h ? float_to_half(f) : float_to_bf16(f);
    }
    case DType::kI8: return static_cast<uint8_t>(reduce_in_order<int8_t>(op, world, per_server, [&](int r) { return static_cast<int8_t>(of(r)); }));
    case DType::kU8: return reduce_in_order<uint8_t>(op, world, per_server, [&](int r) { return static_cast<uint8_t>(of(r)); });
    case DType::kI16: return static_cast<uint16_t>(reduce_in_order<int16_t>(op, world, per_server, [&](int r) { return static_cast<int16_t>(of(r)); }));
    case DType::kI32: return static_cast<uint32_t>(reduce_in_order<int32_t>(op, world, per_server, [&](int r) { return static_cast<int32_t>(of(r)); }));
    case DType::kI64: return static_cast<uint64_t>(reduce_in_order<int64_t>(op, world, per_server, [&](int r) { return static_cast<int64_t>(of(r)); }));
    case DType::kBool: {
      // or for sum and max, and for product and min.
      const ReduceOp b = op == ReduceOp::kSum || op == ReduceOp::kMax ? ReduceOp::kBor
                         : op == ReduceOp::kProduct || op == ReduceOp::kMin ? ReduceOp::kBand : op;
      return reduce_in_order<uint8_t>(b, world, per_server, [&](int r) { return static_cast<uint8_t>(of(r)); });
    }
  }
  return 0;
}

std::string check(ReduceOp op, DType dtype, const std::byte* got, size_t first, size_t count, int world, int per_server,
                  uint64_t it, const char* what) {
  const size_t es = dtype_size(dtype);
  for (size_t i = 0; i < count; ++i) {
    uint64_t g = 0;
    std::memcpy(&g, got + i * es, es);
    const uint64_t w = want(op, dtype, first + i, world, per_server, it) & (es == 8 ? ~0ull : (1ull << (8 * es)) - 1);
    if (g != w) {
      return fmt::format("{} {} of {} ({} elements): element {} is {:#x}, want {:#x}", what, to_string(op),
                         dtype_name(dtype), count, first + i, g, w);
    }
  }
  return "";
}

// Every reduction and dtype, all_reduce (in place and not) and
// reduce_scatter, at each size, on this rank's world group.
std::string every_reduction(const Config& c, int per_server, const std::vector<size_t>& counts) {
  auto comm = Communicator::create(c);
  RANK_OK(comm.status());
  Group& g = (*comm)->world();
  const int n = g.size();
  uint64_t it = 0;
  for (ReduceOp op : kOps) {
    for (DType dtype : kDtypes) {
      if (!reducible(op, dtype)) continue;
      const size_t es = dtype_size(dtype);
      for (size_t count : counts) {
        ++it;
        // all_reduce into another buffer, then in place.
        std::vector<std::byte> in(count * es), out(count * es);
        fill(dtype, in.data(), count, c.rank, it);
        const TensorView vin(in.data(), dtype, {static_cast<int64_t>(count)});
        const TensorView vout(out.data(), dtype, {static_cast<int64_t>(count)});
        RANK_OK(all_reduce(g, vin, vout, {.op = op}));
        if (auto e = check(op, dtype, out.data(), 0, count, n, per_server, it, "all_reduce"); !e.empty()) return e;
        RANK_OK(all_reduce(g, vin, vin, {.op = op}));
        if (auto e = check(op, dtype, in.data(), 0, count, n, per_server, it, "all_reduce in place"); !e.empty()) return e;
        // reduce_scatter: count elements per rank.
        ++it;
        std::vector<std::byte> whole(count * es * static_cast<size_t>(n)), mine(count * es);
        fill(dtype, whole.data(), count * static_cast<size_t>(n), c.rank, it);
        RANK_OK(reduce_scatter(g, TensorView(whole.data(), dtype, {static_cast<int64_t>(count) * n}),
                               TensorView(mine.data(), dtype, {static_cast<int64_t>(count)}), {.op = op}));
        if (auto e = check(op, dtype, mine.data(), count * static_cast<size_t>(g.rank()), count, n, per_server, it,
                           "reduce_scatter");
            !e.empty()) {
          return e;
        }
      }
    }
  }
  return "";
}

}  // namespace

// 3 ranks (odd: chunks of unequal use) and 4 ranks; 33 elements (inline or
// one step) and 70001 (past the two-shot threshold in every dtype of 4 bytes
// and more, several pipeline steps).
TEST(Reductions, EveryReductionEveryDtypeWithinAServer) {
  for (int world : {3, 4}) {
    fgtest::expect_all_ok(fgtest::run_job(world, [&](const Config& c) {
      return every_reduction(c, world, {33, 70001});
    }));
  }
}

// Two servers of two ranks: the hierarchical reduction (partials within each
// server, exchanged, then reduced in server order) and the small all_reduce
// reduced whole within each server.
TEST(Reductions, EveryReductionEveryDtypeAcrossServers) {
  fgtest::JobOptions o;
  o.servers = 2;
  o.token = "reductions-across-servers";
  o.timeout = std::chrono::milliseconds(20000);
  fgtest::expect_all_ok(fgtest::run_job(4, [&](const Config& c) { return every_reduction(c, 2, {5, 20001}); }, o));
}

// Members that disagree on the reduction: a mismatch on every member that
// names both, and the group goes on. A reduction the dtype does not serve:
// kUnsupported on every member, before anything is posted.
TEST(Reductions, DisagreementIsAMismatchAndUnservedReductionsAreRefused) {
  fgtest::expect_all_ok(fgtest::run_job(3, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    std::vector<float> x(100, 1.0f);
    const TensorView v(x.data(), DType::kF32, {100});
    const ReduceOp op = c.rank == 1 ? ReduceOp::kMax : ReduceOp::kSum;
    Status s = all_reduce(g, v, v, {.op = op});
    RANK_CHECK(s.kind() == ErrorKind::kMismatch, "disagreeing reductions: {}", s.to_string());
    RANK_CHECK(s.message().find("reduction=max") != std::string::npos, "the mismatch does not name max: {}", s.message());
    std::vector<int32_t> ints(64, 3);
    const TensorView vi(ints.data(), DType::kI32, {64});
    for (ReduceOp bad : {ReduceOp::kAvg}) {
      Status u = all_reduce(g, vi, vi, {.op = bad});
      RANK_CHECK(u.kind() == ErrorKind::kUnsupported, "avg of int32: {}", u.to_string());
    }
    Status b = all_reduce(g, v, v, {.op = ReduceOp::kBxor});
    RANK_CHECK(b.kind() == ErrorKind::kUnsupported && b.message().find("bxor of fp32") != std::string::npos,
               "bxor of fp32: {}", b.to_string());
    Status r = all_reduce(g, v, v, {.op = static_cast<ReduceOp>(77)});
    RANK_CHECK(r.kind() == ErrorKind::kInvalidArgument, "reduction 77: {}", r.to_string());
    // Still usable: the max of 1, 2, 3.
    std::vector<float> y(100, static_cast<float>(c.rank + 1));
    RANK_OK(all_reduce(g, TensorView(y.data(), DType::kF32, {100}), TensorView(y.data(), DType::kF32, {100}),
                       {.op = ReduceOp::kMax}));
    RANK_CHECK(y[0] == 3.0f && y[99] == 3.0f, "max after the refusals: {}", y[0]);
    return "";
  }));
}

// Two servers of one rank each that disagree only on the reduction, run
// hierarchical: the messages are as long as expected and nothing within a
// server compares headers, so only the exchange between servers can see it
// (its check of each message's header). A mismatch naming max on both
// members, and the group stays failed (messages of the failed call may
// still be in flight). Run as a schedule of one server over the steps
// between them (the default), the first step's headers say it: a mismatch
// naming max, and the group goes on (every member left at the same step).
TEST(Reductions, DisagreementAcrossServersIsFoundInTheExchange) {
  for (Schedule schedule : {Schedule::kHierarchical, Schedule::kAuto}) {
    for (size_t n : {size_t{8}, size_t{1} << 20}) {  // one network piece, and several
      fgtest::JobOptions o;
      o.servers = 2;
      o.token = "reductions-disagree-across-servers";
      fgtest::expect_all_ok(fgtest::run_job(2, [n, schedule](const Config& c) -> std::string {
        auto comm = Communicator::create(c);
        RANK_OK(comm.status());
        Group& g = (*comm)->world();
        std::vector<float> x(n, 1.0f);
        const TensorView v(x.data(), DType::kF32, {static_cast<int64_t>(n)});
        Status s = all_reduce(g, v, v, {.schedule = schedule, .op = c.rank == 1 ? ReduceOp::kMax : ReduceOp::kSum});
        RANK_CHECK(s.kind() == ErrorKind::kMismatch, "{} floats, disagreeing reductions: {}", n, s.to_string());
        RANK_CHECK(s.message().find("reduction=max") != std::string::npos, "the mismatch does not name max: {}",
                   s.message());
        if (schedule == Schedule::kHierarchical) {
          RANK_CHECK(!all_reduce(g, v, v, {.schedule = schedule}).ok(), "a failed group across servers must stay failed");
          return "";
        }
        RANK_OK(all_reduce(g, v, v));
        RANK_CHECK(x[0] == 2.0f && x[n - 1] == 2.0f, "the sum after the mismatch: {}", x[0]);
        return "";
      }, o));
    }
  }
}
