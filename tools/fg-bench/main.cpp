// fg-bench: the AllGather vs AllGather+MatMul experiment, done right.
// With no arguments: 2 local ranks (TP=1 DP=2 SERVER_NUM=1), AllGather fp32
// hidden 3072 over m = 8..8192 and AllGather+MatMul fp16 with the same bytes
// per rank, then one verdict per size.
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <map>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cases.hpp"
#include "fastgather/fastgather.hpp"
#include "report.hpp"
#include "runner.hpp"

using namespace fastgather;
using namespace fastgather::bench;

namespace {

struct Options {
  std::vector<int64_t> ms = {8, 32, 128, 256, 512, 1024, 2048, 4096, 8192};
  int64_t hidden = 3072;
  std::string dtype = "fp32";
  std::string mm_dtype = "fp16";
  int64_t n = 16;
  std::vector<std::string> ops = {"all_gather", "all_gather_list", "all_gather_matmul"};
  RunOptions run;
  std::string json;
  std::string command_line;
};

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
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
          {"iters", o.run.iters},      {"check", o.run.check},  {"ms", o.ms}};
}

int run_rank(const Config& c, const Options& o, const LaunchPlan& plan) {
  auto fail = [&](const Status& s) {
    std::fprintf(stderr, "fg-bench: rank %d: %s\n", c.rank, s.to_string().c_str());
    return 1;
  };
  auto comm = Communicator::create(c);
  if (!comm.ok()) return fail(comm.status());
  auto group = (*comm)->tp_group_of_dp(plan.tp, plan.dp);
  if (!group.ok()) return fail(group.status());
  Group& g = *group.value();
  DType ag_dtype{}, mm_dtype{};
  parse_dtype(o.dtype, &ag_dtype);
  parse_dtype(o.mm_dtype, &mm_dtype);
  Runner runner(**comm, g, o.run);
  const bool lead = c.rank == 0;
  auto wants = [&](const char* op) { return std::find(o.ops.begin(), o.ops.end(), op) != o.ops.end(); };

  std::map<std::string, std::vector<Row>> rows;
  auto measure = [&](std::unique_ptr<Case> cs) -> Status {
    auto r = runner.measure(*cs);
    if (!r.ok()) return r.status();
    rows[r.value().op].push_back(r.value());
    return Status::Ok();
  };
  for (int64_t m : o.ms) {
    const CaseShape s{m, o.hidden, ag_dtype, o.n};
    if (wants("all_gather")) {
      if (Status st = measure(make_all_gather(g, s)); !st.ok()) return fail(st);
    }
    if (wants("all_gather_list")) {
      if (Status st = measure(make_all_gather_list(g, s)); !st.ok()) return fail(st);
    }
    if (wants("all_gather_matmul")) {
      // The fused row moving the same bytes per rank as this AllGather row.
      const size_t bytes = static_cast<size_t>(m * o.hidden) * dtype_size(ag_dtype);
      const size_t row_bytes = static_cast<size_t>(o.hidden) * dtype_size(mm_dtype);
      if (bytes % row_bytes != 0) {
        if (lead) std::fprintf(stderr, "fg-bench: no %s row moves %zu bytes per rank; skipped\n", o.mm_dtype.c_str(), bytes);
        continue;
      }
      const CaseShape f{static_cast<int64_t>(bytes / row_bytes), o.hidden, mm_dtype, o.n};
      if (Status st = measure(make_all_gather_matmul(g, f)); !st.ok()) return fail(st);
    }
  }
  if (!lead) return 0;

  const int world = c.world_size;
  std::string out = fmt::format("fg-bench: {} ranks (TP={} DP={}, groups of {}), {} cores, {}\n\n", world, plan.tp,
                                plan.dp, g.size(), sysconf(_SC_NPROCESSORS_ONLN), cpu_model());
  if (!rows["all_gather"].empty()) {
    out += format_table(fmt::format("AllGather ({}, hidden {})", o.dtype, o.hidden), rows["all_gather"]) + "\n";
  }
  if (!rows["all_gather_list"].empty()) {
    out += format_table(fmt::format("AllGather, list of {} outputs ({}, hidden {})", g.size(), o.dtype, o.hidden),
                        rows["all_gather_list"]) + "\n";
  }
  if (!rows["all_gather_matmul"].empty()) {
    out += format_table(fmt::format("AllGather+MatMul ({}, hidden {}, n={})", o.mm_dtype, o.hidden, o.n),
                        rows["all_gather_matmul"]) + "\n";
  }
  if (!rows["all_gather"].empty() && !rows["all_gather_matmul"].empty()) {
    out += format_verdicts(verdicts(rows["all_gather"], rows["all_gather_matmul"]));
  }
  out += "\nLatency per iteration is the slowest rank's. Effective bandwidth = algbw = total gathered bytes / avg latency; "
         "busbw = algbw x (n-1)/n (nccl-tests).\n";
  std::fputs(out.c_str(), stdout);
  std::fflush(stdout);

  if (!o.json.empty()) {
    std::vector<Row> all;
    for (auto& [op, rs] : rows) all.insert(all.end(), rs.begin(), rs.end());
    std::ofstream f(o.json);
    f << report_json(config_json(o, c, plan), all).dump(2) << "\n";
    if (!f) {
      std::fprintf(stderr, "fg-bench: cannot write %s\n", o.json.c_str());
      return 1;
    }
  }
  bool failed = false;
  for (auto& [op, rs] : rows) {
    for (const Row& r : rs) failed |= r.check == "failed";
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
  app.add_option("--tp", plan.tp, "tensor-parallel size: tp concurrent groups (env TP)");
  app.add_option("--dp", plan.dp, "ranks per group (env DP)");
  app.add_option("--servers", plan.servers, "servers in the job (env SERVER_NUM)");
  app.add_option("--server-index", plan.server_index, "this server (env SERVER_INDEX)");
  app.add_option("--master", plan.master_ip, "rendezvous host (env MASTER_IP)");
  app.add_option("--port", plan.port, "rendezvous port (env PORT)");
  app.add_option("--timeout-ms", plan.timeout_ms, "peer timeout (env FG_TIMEOUT_MS)");
  app.add_option("--m", o.ms, "AllGather rows per rank")->delimiter(',');
  app.add_option("--hidden", o.hidden, "hidden size (columns)");
  app.add_option("--dtype", o.dtype, "AllGather dtype (fp32, fp16, bf16, ...)");
  app.add_option("--mm-dtype", o.mm_dtype, "AllGather+MatMul dtype (fp16, bf16, fp32)");
  app.add_option("--n", o.n, "AllGather+MatMul output columns");
  app.add_option("--ops", o.ops, "ops to run")->delimiter(',')->check(
      CLI::IsMember({"all_gather", "all_gather_list", "all_gather_matmul"}));
  app.add_option("--iters", o.run.iters, "iterations per size (default: from --time-ms)");
  app.add_option("--time-ms", o.run.time_ms, "measured time per size and op");
  app.add_option("--warmup", o.run.warmup, "warm-up iterations");
  app.add_flag("-c,--check", o.run.check, "check every output byte of every iteration");
  app.add_option("--json", o.json, "write the rows as JSON (schema fastgather-bench/1)");
  CLI11_PARSE(app, argc, argv);

  DType d{};
  if (!parse_dtype(o.dtype, &d)) return std::fprintf(stderr, "fg-bench: unknown dtype %s\n", o.dtype.c_str()), 2;
  if (!parse_dtype(o.mm_dtype, &d) || (d != DType::kF16 && d != DType::kBF16 && d != DType::kF32)) {
    return std::fprintf(stderr, "fg-bench: --mm-dtype must be fp16, bf16 or fp32\n"), 2;
  }
  if (Status s = plan.validate(); !s.ok()) return std::fprintf(stderr, "fg-bench: %s\n", s.to_string().c_str()), 2;
  return run_local_ranks(plan, [&](const Config& c) { return run_rank(c, o, plan); });
}
