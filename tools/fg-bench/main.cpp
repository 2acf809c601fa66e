// fg-bench: the AllGather vs AllGather+MatMul experiment, done right.
// With no arguments: 2 local ranks (TP=1 DP=2 SERVER_NUM=1), AllGather fp32
// hidden 3072 over m = 8..8192 and AllGather+MatMul fp16 with the same bytes
// per rank, then one verdict per size.
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cases.hpp"
#include "fastgather/fastgather.hpp"
#include "host.hpp"
#include "launching.hpp"
#include "limits.hpp"
#include "mpi_comparator.hpp"
#include "options.hpp"
#include "plot.hpp"
#include "report.hpp"
#include "runner.hpp"
#include "wire.hpp"

using namespace fastgather;
using namespace fastgather::bench;

namespace {

void progress(bool lead, size_t done, size_t total, const Case& c) {
  if (!lead || !::isatty(2)) return;
  std::fprintf(stderr, "\r\033[K[%zu/%zu] %s %s %s", done, total, c.op.c_str(), c.impl.c_str(),
               human_bytes(static_cast<double>(c.bytes_per_rank)).c_str());
  if (done == total) std::fputs("\r\033[K", stderr);
}

nlohmann::json config_json(const Options& o, const Config& c, const LaunchPlan& plan) {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return {{"command", o.command_line}, {"date", date},          {"host", host},
          {"cpu", cpu_model()},        {"cores", sysconf(_SC_NPROCESSORS_ONLN)},
          {"tp", plan.tp},             {"dp", plan.dp},         {"world", c.world_size},
          {"servers", c.servers},      {"hidden", o.hidden},    {"dtype", o.dtype},
          {"mm_dtype", o.mm_dtype},    {"n", o.n},              {"time_ms", o.run.time_ms},
          {"iters", o.run.iters},      {"check", o.run.check},  {"ms", o.ms},
          {"trials", o.run.trials},    {"dv", o.dv},            {"compare", o.compare},
          {"rewrite_inputs", o.run.rewrite_inputs}, {"reduce_op", o.reduce_op}};
}

using CaseFactory = std::function<std::unique_ptr<Case>()>;

// The implementations of one op at one size, measured side by side when
// their buffers fit (run_rank): `bytes` is what one rank holds for each of
// them, about (members + 1) x its block.
struct CaseGroup {
  std::vector<CaseFactory> cases;
  size_t bytes = 0;
};

// The sizes a limits table measures: a few small ones, then each row's
// per-rank bytes (past 16 MiB the copy times are extrapolated).
std::vector<size_t> limit_sizes(const Options& o, DType ag_dtype, std::vector<size_t> small) {
  for (int64_t m : o.ms) small.push_back(std::min<size_t>(static_cast<size_t>(m * o.hidden) * dtype_size(ag_dtype), 16u << 20));
  return small;
}

// Rank 0 measures between the CPUs of its group's first two members while
// everyone else waits at a barrier. Collective over the world.
Result<Limits> measure_machine_limits(Communicator& comm, Group& g, const Options& o, DType ag_dtype) {
  int32_t cpu = ::sched_getcpu();
  std::vector<int32_t> cpus(static_cast<size_t>(comm.size()));
  if (Status s = all_gather(comm.world(), TensorView(&cpu, DType::kI32, {1}), TensorView(cpus.data(), DType::kI32, {comm.size()}));
      !s.ok()) {
    return s;
  }
  Limits limits;
  if (comm.rank() == 0) {
    const std::vector<size_t> sizes = limit_sizes(o, ag_dtype, {64, 4096, 32768});
    int cpu_b = cpus[static_cast<size_t>(g.size() > 1 ? g.ranks()[1] : 0)];
    if (cpu_b == cpus[0]) {
      // Two ranks pinned to one CPU (servers simulated on a small host): a
      // ping-pong there would measure the scheduler. Take the next CPU.
      cpu_b = static_cast<int>((cpus[0] + 1) % std::max<long>(sysconf(_SC_NPROCESSORS_ONLN), 1));
    }
    limits = measure_limits(sizes, cpus[0], cpu_b);
  }
  if (Status s = barrier(comm.world()); !s.ok()) return s;
  if (comm.config().servers > 1) {
    auto wire = measure_wire(comm, limit_sizes(o, ag_dtype, {8, 4096, 32768}));
    if (!wire.ok()) return wire.status();
    limits.wire = wire.value();
    limits.wire_path = comm.transport();
  }
  return limits;
}

// Blocks a member of g must receive from other servers (rank 0's view).
int remote_blocks(const Communicator& comm, const Group& g) {
  int n = 0;
  for (int r : g.ranks()) n += comm.config().server_of(r) != comm.config().server_index ? 1 : 0;
  return n;
}

// For each size, the ops asked for, and with --compare the other
// implementations of each.
std::vector<CaseGroup> plan_cases(const Communicator& comm, Group& g, const Options& o, DType ag_dtype, DType mm_dtype,
                                  bool use_mpi, bool lead) {
  std::set<int> servers;
  for (int r : g.ranks()) servers.insert(comm.config().server_of(r));
  const bool spans = servers.size() > 1;
  const bool one_per_server = servers.size() == g.ranks().size();
  auto wants = [&](const char* op) { return std::find(o.ops.begin(), o.ops.end(), op) != o.ops.end(); };
  std::vector<CaseGroup> groups;
  for (int64_t m : o.ms) {
    const bool symmetric = o.input == "symmetric";
    CaseShape s{m, o.hidden, ag_dtype, o.n, o.dv ? 8 : 1, spans, symmetric};
    s.reduce_op = o.reduce_op == "avg" ? ReduceOp::kAvg : o.reduce_op == "min" ? ReduceOp::kMin
                : o.reduce_op == "max" ? ReduceOp::kMax : ReduceOp::kSum;
    const size_t held = static_cast<size_t>(m * o.hidden) * dtype_size(ag_dtype) * static_cast<size_t>(g.size() + 1) *
                        static_cast<size_t>(s.variants);
    auto next_group = [&] {
      groups.push_back({{}, held});
      return &groups.back().cases;
    };
    if (wants("all_gather")) {
      std::vector<CaseFactory>& cases = *next_group();
      cases.push_back([&g, s] { return make_all_gather(g, s); });
      // On one server: what symmetric inputs save (the same list on every rank,
      // whether or not its group has a heap, or the ranks' calls would differ).
      if (o.compare && symmetric && !spans) cases.push_back([&g, s] { return make_private_all_gather(g, s); });
      if (o.compare && spans) {
        // Across servers: both schedules, whichever the size chose (the same
        // messages when every server holds one member).
        cases.push_back([&g, s] { return make_all_gather_with(g, s, Schedule::kDirect); });
        if (!one_per_server) cases.push_back([&g, s] { return make_all_gather_with(g, s, Schedule::kHierarchical); });
      } else if (o.compare && g.size() > 2) {
        // With 2 ranks a ring is the one-shot schedule; beyond, it shows what extra steps cost.
        cases.push_back([&g, s] { return make_all_gather_with(g, s, Schedule::kRing); });
      }
      if (use_mpi) cases.push_back([s] { return mpi::make_all_gather(s, 0); });
    }
    if (wants("all_gather_list")) {
      std::vector<CaseFactory>& cases = *next_group();
      cases.push_back([&g, s] { return make_all_gather_list(g, s); });
      if (o.compare) cases.push_back([&g, s] { return make_staged_all_gather_list(g, s); });
    }
    if (wants("all_gather_matmul")) {
      // The fused row moving the same bytes per rank as this AllGather row.
      const size_t bytes = static_cast<size_t>(m * o.hidden) * dtype_size(ag_dtype);
      const size_t row_bytes = static_cast<size_t>(o.hidden) * dtype_size(mm_dtype);
      if (bytes % row_bytes != 0) {
        if (lead) std::fprintf(stderr, "fg-bench: no %s row moves %zu bytes per rank; skipped\n", o.mm_dtype.c_str(), bytes);
        continue;
      }
      const CaseShape f{static_cast<int64_t>(bytes / row_bytes), o.hidden, mm_dtype, o.n, o.dv ? 8 : 1, spans, symmetric};
      std::vector<CaseFactory>& cases = *next_group();
      cases.push_back([&g, f] { return make_all_gather_matmul(g, f); });
      if (o.compare) cases.push_back([&g, f] { return make_unfused_all_gather_matmul(g, f); });
    }
    if (wants("matmul_reduce_scatter")) {
      const CaseShape f{m, o.hidden, mm_dtype, o.n, o.dv ? 8 : 1, spans, false};
      std::vector<CaseFactory>& cases = *next_group();
      cases.push_back([&g, f] { return make_matmul_reduce_scatter(g, f); });
      if (o.compare) cases.push_back([&g, f] { return make_unfused_matmul_reduce_scatter(g, f); });
    }
    for (const bool scatter : {false, true}) {
      const char* op = scatter ? "reduce_scatter" : "all_reduce";
      if (!wants(op)) continue;
      if (scatter && (m * o.hidden) % g.size() != 0) {
        if (lead) std::fprintf(stderr, "fg-bench: %s of m x hidden = %lld elements does not divide by %d ranks; skipped\n", op,
                               static_cast<long long>(m * o.hidden), g.size());
        continue;
      }
      auto make = [&g, scatter](const CaseShape& shape, Schedule schedule = Schedule::kAuto) {
        return scatter ? make_reduce_scatter(g, shape, schedule) : make_all_reduce(g, shape, schedule);
      };
      std::vector<CaseFactory>& cases = *next_group();
      cases.push_back([make, s] { return make(s); });
      // Across servers: the inputs gathered, then summed, beside the hierarchical sum.
      if (o.compare && spans) cases.push_back([make, s] { return make(s, Schedule::kOneShot); });
      if (o.compare && symmetric) {
        cases.push_back([make, s] {
          CaseShape p = s;
          p.symmetric = false;
          auto c = make(p);
          c->impl = "private";
          return c;
        });
      }
      // Open MPI's sums beside ours (with another reduction, only ours).
      if (use_mpi && s.reduce_op == ReduceOp::kSum && (s.dtype == DType::kF32 || s.dtype == DType::kF64)) {
        cases.push_back([s, scatter] { return scatter ? mpi::make_reduce_scatter(s) : mpi::make_all_reduce(s); });
      }
    }
    if (wants("all_to_all")) {
      const size_t bytes = static_cast<size_t>(m * o.hidden) * dtype_size(ag_dtype);
      if (bytes % static_cast<size_t>(g.size()) != 0) {
        if (lead) std::fprintf(stderr, "fg-bench: all_to_all of %zu bytes does not divide by %d ranks; skipped\n", bytes, g.size());
        continue;
      }
      std::vector<CaseFactory>& cases = *next_group();
      cases.push_back([&g, s] { return make_all_to_all(g, s); });
      if (use_mpi) cases.push_back([s] { return mpi::make_all_to_all(s); });
    }
    if (wants("send_recv") && g.size() > 1) {
      std::vector<CaseFactory>& cases = *next_group();
      cases.push_back([&g, s] { return make_send_recv(g, s); });
      if (use_mpi) cases.push_back([s] { return mpi::make_send_recv(s); });
    }
  }
  return groups;
}

// Whether a group's cases may be alive at once: their buffers, on every rank
// of this host, within a quarter of its memory. Rank 0 decides for all (the
// hosts of a job may differ), so every rank measures the same way.
Result<bool> side_by_side(Communicator& comm, const CaseGroup& group) {
  int64_t fits = 0;
  if (comm.rank() == 0 && group.cases.size() > 1) {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
    const double memory = pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0;
    const double need = static_cast<double>(group.bytes) * static_cast<double>(group.cases.size()) *
                        static_cast<double>(comm.config().ranks_on(comm.config().server_index));
    fits = need <= memory / 4 ? 1 : 0;
  }
  std::vector<int64_t> all(static_cast<size_t>(comm.size()));
  if (Status s = all_gather(comm.world(), TensorView(&fits, DType::kI64, {1}), TensorView(all.data(), DType::kI64, {comm.size()}));
      !s.ok()) {
    return s;
  }
  return all[0] != 0;
}

std::string mpi_line(bool use_mpi, int servers) {
  if (use_mpi && servers > 1) {
    return fmt::format("MPI comparator: {} - started with --mca pml ob1 --mca btl tcp,self: every byte over TCP, also "
                       "between ranks of one simulated server (MPI cannot be told they share a server)\n",
                       mpi::library_version());
  }
  if (use_mpi) return fmt::format("MPI comparator: {}\n", mpi::library_version());
  if (!mpi::built()) return "MPI comparator: absent - fg-bench was built without MPI (install libopenmpi-dev and rebuild)\n";
  return "MPI comparator: not used - the ranks were not started by mpirun (FG_NO_MPIRUN set, or mpirun missing)\n";
}

// Rank 0's report: the original's tables, the verdicts, the side-by-side tables.
std::string format_report(const Options& o, const LaunchPlan& plan, int world, int group_size, bool use_mpi,
                          const Limits* limits, const std::vector<Row>& rows) {
  auto select = [&](const std::string& op) {
    std::vector<Row> out;
    for (const Row& r : rows) {
      if (r.op == op && r.impl == "fastgather") out.push_back(r);
    }
    return out;
  };
  std::string out = fmt::format("fg-bench: {} ranks (TP={} DP={}, groups of {}), {} cores, {}\n", world, plan.tp,
                                plan.dp, group_size, sysconf(_SC_NPROCESSORS_ONLN), cpu_model());
  if (o.compare) out += mpi_line(use_mpi, plan.servers);
  out += "\n";
  if (limits != nullptr) out += format_limits(*limits) + "\n";
  const auto ag = select("all_gather"), agl = select("all_gather_list"), agm = select("all_gather_matmul");
  if (!ag.empty()) out += format_table(fmt::format("AllGather ({}, hidden {})", o.dtype, o.hidden), ag) + "\n";
  if (!agl.empty()) {
    out += format_table(fmt::format("AllGather, list of {} outputs ({}, hidden {})", group_size, o.dtype, o.hidden), agl) + "\n";
  }
  if (!agm.empty()) out += format_table(fmt::format("AllGather+MatMul ({}, hidden {}, n={})", o.mm_dtype, o.hidden, o.n), agm) + "\n";
  if (!ag.empty() && !agm.empty()) out += format_verdicts(verdicts(ag, agm)) + "\n";
  if (const auto mrs = select("matmul_reduce_scatter"); !mrs.empty()) {
    out += format_table(fmt::format("MatMul+ReduceScatter ({}, x1 m*ranks x hidden {}, n={}; per-rank data: the fp32 "
                                    "product each rank reduce-scatters)", o.mm_dtype, o.hidden, o.n), mrs) + "\n";
    out += format_speedups("matmul_reduce_scatter", "unfused", 1.1, rows) + "\n";
  }
  if (const auto ar = select("all_reduce"); !ar.empty()) {
    out += format_table(fmt::format("AllReduce, {} ({}, hidden {}; per-rank data: each rank's input)", o.reduce_op, o.dtype,
                                    o.hidden), ar) + "\n";
  }
  if (const auto rs = select("reduce_scatter"); !rs.empty()) {
    out += format_table(fmt::format("ReduceScatter, {} ({}, hidden {}; per-rank data: each rank's input)", o.reduce_op, o.dtype,
                                    o.hidden), rs) +
           "\n";
  }
  if (const auto sr = select("send_recv"); !sr.empty()) {
    out += format_table(fmt::format("send/recv ({}, hidden {}; per-rank data: the message each rank sends the next and "
                                    "receives from the one before)", o.dtype, o.hidden), sr) + "\n";
  }
  if (const auto a2a = select("all_to_all"); !a2a.empty()) {
    out += format_table(fmt::format("AllToAll ({}, hidden {}; per-rank data: each rank's input, an equal part to every "
                                    "rank)", o.dtype, o.hidden), a2a) + "\n";
  }
  if (o.compare || limits != nullptr) {
    for (const std::string& op : kOpNames) {
      if (std::string t = format_compare(op, rows); !t.empty()) out += t + "\n";
    }
  }
  if (std::string t = format_phases(rows); !t.empty()) out += t + "\n";
  if (std::string t = format_placement(rows); !t.empty()) out += t + "\n";
  out += "Latency per iteration is the slowest rank's. Effective bandwidth = per-rank bytes / avg latency (the original "
         "script's definition); algbw = total gathered bytes / avg latency; busbw = algbw x (n-1)/n (nccl-tests; for sums and all_to_all as "
         "nccl-tests: algbw = per-rank input / avg latency, busbw = algbw x 2(n-1)/n for all_reduce, x (n-1)/n for reduce_scatter "
         "and all_to_all; send/recv: both the message / avg latency). "
         "limit: docs/benchmarks.md.\n";
  return out;
}

Status write_json(const std::string& path, nlohmann::json config, bool use_mpi, const Limits& limits,
                  const std::vector<Row>& rows) {
  config["mpi"] = use_mpi ? mpi::library_version() : mpi::built() ? "not used" : "absent";
  config["limits"] = {{"rtt_ns", limits.rtt_ns}};
  for (size_t i = 0; i < limits.local.size() && i < limits.peer.size(); ++i) {
    config["limits"]["copy"].push_back(
        {{"bytes", limits.local[i].bytes}, {"local_us", limits.local[i].us}, {"peer_us", limits.peer[i].us},
         {"both_us", i < limits.both.size() ? limits.both[i].us : 0.0}});
  }
  for (const CopyPoint& p : limits.wire) config["limits"]["wire"].push_back({{"bytes", p.bytes}, {"one_way_us", p.us}});
  std::ofstream f(path);
  f << report_json(config, rows).dump(2) << "\n";
  if (!f) return {ErrorKind::kSystem, "cannot write " + path};
  return Status::Ok();
}

int run_rank(const Config& c, const Options& o, const LaunchPlan& plan) {
  auto fail = [&](const Status& s) {
    std::fprintf(stderr, "fg-bench: rank %d: %s\n", c.rank, s.to_string().c_str());
    return 1;
  };
  const bool use_mpi = o.compare && mpi::built() && mpi::launched();
  if (use_mpi) {
    if (Status s = mpi::init(plan.tp); !s.ok()) return fail(s);
  }
  struct MpiGuard {
    bool on;
    ~MpiGuard() {
      if (on) mpi::finalize();
    }
  } mpi_guard{use_mpi};
  auto comm = Communicator::create(c);
  if (!comm.ok()) return fail(comm.status());
  auto group = (*comm)->tp_group_of_dp(plan.tp, plan.dp);
  if (!group.ok()) return fail(group.status());
  Group& g = *group.value();
  DType ag_dtype{}, mm_dtype{};
  parse_dtype(o.dtype, &ag_dtype);
  parse_dtype(o.mm_dtype, &mm_dtype);
  const bool lead = c.rank == 0;

  Limits limits;
  const bool with_limits = !o.no_limits || o.limits_only;
  if (with_limits) {
    auto l = measure_machine_limits(**comm, g, o, ag_dtype);
    if (!l.ok()) return fail(l.status());
    limits = l.value();
    if (o.limits_only) {
      if (lead) std::fputs(format_limits(limits).c_str(), stdout);
      return 0;
    }
  }

  Runner runner(**comm, g, o.run);
  const std::vector<CaseGroup> groups = plan_cases(**comm, g, o, ag_dtype, mm_dtype, use_mpi, lead);
  size_t total = 0, done = 0;
  for (const CaseGroup& grp : groups) total += grp.cases.size();
  std::vector<Row> rows;
  // Measures cases side by side (their trials in turn) and keeps their rows.
  auto measure = [&](std::vector<std::unique_ptr<Case>>& cs) -> Status {
    std::vector<Case*> ptrs;
    for (auto& c : cs) ptrs.push_back(c.get());
    progress(lead, done, total, *cs.front());
    std::vector<Result<Row>> results = runner.measure_together(ptrs);
    for (size_t i = 0; i < cs.size(); ++i) {
      Result<Row>& r = results[i];
      if (!r.ok() && r.status().kind() == ErrorKind::kUnsupported) {
        // Refused on every rank before any byte moved (a row too large for the
        // ring, say): the group is intact; report it and go on with the rest.
        if (lead) std::fprintf(stderr, "fg-bench: %s %s at %s per rank skipped: %s\n", cs[i]->op.c_str(), cs[i]->impl.c_str(),
                               human_bytes(static_cast<double>(cs[i]->bytes_per_rank)).c_str(), r.status().message().c_str());
        continue;
      }
      if (!r.ok()) return r.status();
      Row row = r.value();
      if (with_limits && lead && row.op != "all_to_all") {  // no model for all_to_all: its limit says "-"
        const bool sums = row.op == "all_reduce" || row.op == "reduce_scatter" || row.op == "matmul_reduce_scatter";
        row.limit_us = row.op == "send_recv"
                           ? send_recv_limit_us(limits, row.bytes_per_rank, remote_blocks(**comm, g) > 0)
                       : sums ? reduction_limit_us(limits, row.bytes_per_rank, row.group_size, row.op == "all_reduce")
                              : all_gather_limit_us(limits, row.bytes_per_rank, row.group_size, remote_blocks(**comm, g));
        row.limit_us += cs[i]->compute_floor_us();
        row.pct_of_limit = row.lat.median > 0 ? 100.0 * row.limit_us / row.lat.median : 0;
      }
      rows.push_back(std::move(row));
    }
    done += cs.size();
    progress(lead, done, total, *cs.back());
    return Status::Ok();
  };
  for (const CaseGroup& grp : groups) {
    if (grp.cases.empty()) continue;
    auto together = side_by_side(**comm, grp);
    if (!together.ok()) return fail(together.status());
    // Side by side when the buffers fit, else one case at a time.
    std::vector<std::unique_ptr<Case>> batch;
    for (size_t i = 0; i < grp.cases.size(); ++i) {
      try {
        batch.push_back(grp.cases[i]());
      } catch (const std::exception& e) {  // no memory for its buffers, say
        return fail({ErrorKind::kResourceExhausted, fmt::format("cannot prepare a case: {}", e.what())});
      }
      if (!together.value() || i + 1 == grp.cases.size()) {
        if (Status s = measure(batch); !s.ok()) return fail(s);
        batch.clear();
      }
    }
  }
  bool failed = false;
  for (const Row& r : rows) failed |= r.check == "failed";
  // Every rank's exit status says whether the data was right (the other
  // servers' spawners report it too), not only rank 0's.
  if (!lead) return failed ? 3 : 0;

  std::string head;
  if (c.servers > 1) {
    std::string blocks;
    for (int srv = 0; srv < c.servers; ++srv) {
      blocks += fmt::format("{}{}-{}", srv ? " | " : "", c.first_rank_on(srv), c.first_rank_on(srv + 1) - 1);
    }
    head = fmt::format("fg-bench: {} servers (ranks {}); {}\n", c.servers, blocks, (*comm)->transport());
  }
  std::fputs((head + format_report(o, plan, c.world_size, g.size(), use_mpi, with_limits ? &limits : nullptr, rows)).c_str(),
             stdout);
  std::fflush(stdout);
  if (!o.json.empty()) {
    nlohmann::json config = config_json(o, c, plan);
    config["transport"] = (*comm)->transport();
    if (Status s = write_json(o.json, config, use_mpi, limits, rows); !s.ok()) return fail(s);
  }
  if (!o.plot.empty()) {
    if (Status s = plot(rows, o.plot, fmt::format("fg-bench: {} ranks, {}", c.world_size, cpu_model())); !s.ok()) return fail(s);
    std::printf("plots: %s (and .svg)\n", o.plot.c_str());
  }
  return failed ? 3 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 0; i < argc; ++i) o.command_line += (i ? " " : "") + std::string(argv[i]);
  auto env = launch_plan_from_env(LaunchPlan{});
  if (!env.ok()) {
    std::fprintf(stderr, "fg-bench: %s\n", env.status().to_string().c_str());
    return 2;
  }
  LaunchPlan plan = env.value();

  CLI::App app{"fg-bench: all-gather and fused all-gather + matmul, measured"};
  app.add_option("--tp", plan.tp, "tensor-parallel size: tp concurrent groups (env TP)")->check(CLI::Range(1, kMaxWorldSize));
  app.add_option("--dp", plan.dp, "ranks per group (env DP)")->check(CLI::Range(1, kMaxWorldSize));
  app.add_option("--servers", plan.servers, "servers in the job (env SERVER_NUM)")->check(CLI::Range(1, kMaxWorldSize));
  auto* server_index_opt = app.add_option("--server-index", plan.server_index,
                                          "this server (env SERVER_INDEX; unset with SERVER_NUM > 1: simulate all servers here)");
  app.add_option("--master", plan.master_addr, "rendezvous host (env MASTER_IP)");
  app.add_option("--port", plan.master_port, "rendezvous port (env PORT)")->check(CLI::Range(1, 65535));
  int64_t timeout_ms = plan.timeout.count();
  auto* timeout_opt = app.add_option("--timeout-ms", timeout_ms, "peer timeout (env FG_TIMEOUT_MS)")
                          ->check(CLI::Range(int64_t{0}, int64_t{86'400'000}));
  app.add_option("--m", o.ms, "AllGather rows per rank")->delimiter(',')->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  app.add_option("--hidden", o.hidden, "hidden size (columns)")->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  app.add_option("--dtype", o.dtype, "AllGather dtype (fp32, fp16, bf16, ...)");
  app.add_option("--mm-dtype", o.mm_dtype, "AllGather+MatMul dtype (fp16, bf16, fp32)");
  app.add_option("--n", o.n, "AllGather+MatMul output columns")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--ops", o.ops, "ops to run")->delimiter(',')->check(
      CLI::IsMember(kOpNames));
  app.add_option("--iters", o.run.iters, "iterations per size (default: from --time-ms)")->check(CLI::Range(1, 10'000'000));
  const CLI::Validator positive_ms(
      [](std::string& v) -> std::string {
        char* end = nullptr;
        const double x = std::strtod(v.c_str(), &end);
        if (end == v.c_str() || *end != '\0' || !std::isfinite(x) || x <= 0 || x > 3.6e6) {
          return "must be a number of milliseconds above 0 and at most 3600000";
        }
        return {};
      },
      "MS>0");
  app.add_option("--time-ms", o.run.time_ms, "measured time per size and op (also bounds -c runs)")->check(positive_ms);
  app.add_option("--warmup", o.run.warmup, "warm-up iterations")->check(CLI::Range(0, 100'000));
  app.add_flag("-c,--check", o.run.check, "check every output byte of every iteration");
  app.add_option("--json", o.json, "write the rows as JSON (schema fastgather-bench/1)");
  app.add_option("--plot", o.plot, "write latency and bandwidth plots to this PNG (and .svg)");
  app.add_flag("--compare", o.compare, "also run staged list, unfused matmul and MPI_Allgather (default without arguments)");
  app.add_flag("--no-compare", o.no_compare, "only fastgather");
  app.add_flag("--limits", o.limits_only, "measure and print the machine's limits only");
  app.add_flag("--no-limits", o.no_limits, "skip measuring the machine's limits");
  app.add_option("--trials", o.run.trials, "repeat each measurement and pool the samples")->check(CLI::Range(1, 100));
  app.add_flag("--dv", o.dv, "data-varying: cycle 8 buffer sets so caches are not flattering");
  app.add_flag("--rewrite-inputs", o.run.rewrite_inputs,
               "sums: before each call (untimed) store to every cache line of its input, values kept, as the GEMM "
               "before a layer's sum leaves it");
  app.add_option("--reduce-op", o.reduce_op, "all_reduce and reduce_scatter: the reduction (every value checked with --check)")
      ->check(CLI::IsMember({"sum", "avg", "min", "max"}));
  app.add_option("--input", o.input,
                 "where the ops' inputs live: symmetric (the group's heap, read in place; --compare adds a private row) "
                 "or private (ordinary memory, as a framework's tensors)")
      ->check(CLI::IsMember({"symmetric", "private"}));
  app.add_flag_callback("--help-env", [] {
    std::fputs(environment_help().c_str(), stdout);
    throw CLI::Success();
  }, "print every environment variable fastgather reads, and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help is a success; any flag refused is exit status 2, as every other bad input.
    return app.exit(e) == 0 ? 0 : 2;
  }
  const bool server_index_given = server_index_opt->count() > 0;
  if (timeout_opt->count() > 0) plan.timeout = std::chrono::milliseconds(timeout_ms);
  if (argc == 1) o.compare = true;
  if (o.no_compare) o.compare = false;

  DType d{};
  if (!parse_dtype(o.dtype, &d)) return std::fprintf(stderr, "fg-bench: unknown dtype %s\n", o.dtype.c_str()), 2;
  if (!parse_dtype(o.mm_dtype, &d) || (d != DType::kF16 && d != DType::kBF16 && d != DType::kF32)) {
    return std::fprintf(stderr, "fg-bench: --mm-dtype must be fp16, bf16 or fp32\n"), 2;
  }
  if (Status s = plan.validate(); !s.ok()) return std::fprintf(stderr, "fg-bench: %s\n", s.to_string().c_str()), 2;
  // Where the results go must be writable before minutes of measuring, not after.
  for (auto [flag, path] : {std::pair{"--json", o.json}, {"--plot", o.plot}, {"--plot", o.plot.empty() ? o.plot : o.plot + ".svg"}}) {
    if (Status s = check_writable(flag, path); !s.ok()) return std::fprintf(stderr, "fg-bench: %s\n", s.message().c_str()), 2;
  }
  // SERVER_NUM > 1 with no SERVER_INDEX: every server's ranks on this host
  // (simulated servers, UCX over TCP loopback between them).
  const bool simulate = plan.servers > 1 && std::getenv("SERVER_INDEX") == nullptr && !server_index_given;
  // Before anything is allocated or forked: do the sizes fit this machine?
  if (Status s = check_memory(o, plan, simulate || mpi::launched() ? plan.world_size() : plan.local_ranks()); !s.ok()) {
    return std::fprintf(stderr, "fg-bench: %s\n", s.message().c_str()), 2;
  }
  if (o.compare) maybe_reexec_under_mpirun(argc, argv, plan, simulate);
  if (simulate && !mpi::launched()) {
    return simulate_servers(plan, [&](const Config& c) { return run_rank(c, o, plan); });
  }
  return run_local_ranks(plan, [&](const Config& c) { return run_rank(c, o, plan); });
}
