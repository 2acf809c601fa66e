// The layering docs/architecture.md draws, checked on the sources: each
// folder of src/ includes only the folders below it (and its own), public
// headers included; and each public header is implemented in the layer it is
// said to belong to (so that "includes only what is below" also means
// "depends only on what is below": status, dtype, settings and config are
// vocabulary implemented in base, not in core).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>

#include <unistd.h>

namespace fs = std::filesystem;

namespace {

// folder -> the folders of src/ it may include besides itself.
const std::map<std::string, std::set<std::string>> kMayInclude = {
    {"base", {}},
    {"transport", {"base"}},
    {"bootstrap", {"base"}},
    {"engine", {"base", "transport"}},
    {"algo", {"base", "transport", "engine"}},
    {"core", {"base", "bootstrap", "transport", "engine", "algo"}},
    {"ops", {"base", "transport", "engine", "algo", "core"}},
    {"launch", {"base", "bootstrap", "transport"}},
};
// Public header -> the layer that implements it ("" for the umbrella header,
// which only the top may include). Every header in include/fastgather is here.
const std::map<std::string, std::string> kPublicLayer = {
    {"fastgather/status.hpp", "base"},      {"fastgather/dtype.hpp", "base"},
    {"fastgather/settings.hpp", "base"},    {"fastgather/config.hpp", "base"},
    {"fastgather/schedule.hpp", "base"},    {"fastgather/reduce_op.hpp", "base"},
    {"fastgather/store.hpp", "bootstrap"},  {"fastgather/tensor.hpp", "core"},
    {"fastgather/communicator.hpp", "core"}, {"fastgather/version.hpp", "core"},
    {"fastgather/ops.hpp", "ops"},          {"fastgather/launch.hpp", "launch"},
    {"fastgather/fastgather.hpp", ""},
};

// Scans root/src; `where` in each finding is relative to root.
std::vector<std::string> violations(const fs::path& root = FG_SOURCE_DIR) {
  std::vector<std::string> bad;
  const std::regex include(R"re(^\s*#\s*include\s*"([^"/]+/[^"]+)")re");
  for (const auto& entry : fs::recursive_directory_iterator(root / "src")) {
    if (!entry.is_regular_file()) continue;
    const std::string layer = entry.path().parent_path().filename().string();
    auto allowed = kMayInclude.find(layer);
    if (allowed == kMayInclude.end()) {
      bad.push_back("src/" + layer + " is not a known layer (add it to the map and to architecture.md)");
      continue;
    }
    std::ifstream f(entry.path());
    std::string line;
    for (int n = 1; std::getline(f, line); ++n) {
      std::smatch m;
      if (!std::regex_search(line, m, include)) continue;
      const std::string target = m[1];
      const std::string where = fs::relative(entry.path(), root).string() + ":" + std::to_string(n);
      const std::string dir = target.substr(0, target.find('/'));
      if (dir == "fastgather") {
        auto owner = kPublicLayer.find(target);
        if (owner == kPublicLayer.end()) {
          bad.push_back(where + " includes " + target + ", which the layer map does not know (add it)");
        } else if (owner->second != layer && !allowed->second.contains(owner->second)) {
          bad.push_back(where + " (" + layer + ") includes " + target + ", implemented in " +
                        (owner->second.empty() ? std::string("no layer below the top") : owner->second));
        } else if (n == 1 && entry.path().extension() == ".cpp" && owner->second != layer) {
          // A .cpp whose first line includes a public header implements it.
          bad.push_back(where + " (" + layer + ") implements " + target + ", which belongs to " + owner->second);
        }
      } else if (dir != layer && !allowed->second.contains(dir)) {
        bad.push_back(where + " (" + layer + ") includes " + target);
      }
    }
  }
  return bad;
}

// Inside src/algo the same rule, file by file: the call description at the
// bottom, then the plan, the lockstep step, the schedules within a server and
// the compositions across servers. A file (header and .cpp alike, by stem)
// may include algo files of its own level or below. Every file of src/algo
// is here, so none escapes the check.
const std::map<std::string, int> kAlgoLevel = {
    {"function_ref", 0}, {"copy_in", 0},       {"thresholds", 0},   {"call", 1},          {"plan", 2},
    {"lockstep", 3},     {"allgather", 4},     {"reduce", 4},        {"reduce_steps", 4},
    {"across", 5},
};

// What a schedule may know of the transports: the one channel interface
// (and the capabilities and symmetric heap it names). Only the composition
// across servers (across.*) knows a channel of its own, the one between servers.
const std::set<std::string> kScheduleSees = {"channel", "capabilities", "shm_heap"};
const std::set<std::string> kKnowsTransports = {"across"};

std::vector<std::string> algo_violations(const fs::path& root = FG_SOURCE_DIR) {
  std::vector<std::string> bad;
  const std::regex include(R"re(^\s*#\s*include\s*"algo/([^"/]+)\.hpp")re");
  const std::regex transport_include(R"re(^\s*#\s*include\s*"transport/([^"/]+)\.hpp")re");
  for (const auto& entry : fs::directory_iterator(root / "src" / "algo")) {
    const std::string stem = entry.path().stem().string();
    auto level = kAlgoLevel.find(stem);
    if (level == kAlgoLevel.end()) {
      bad.push_back("src/algo/" + entry.path().filename().string() + " has no level (add it to kAlgoLevel)");
      continue;
    }
    std::ifstream f(entry.path());
    std::string line;
    for (int n = 1; std::getline(f, line); ++n) {
      std::smatch m;
      const std::string where = "src/algo/" + entry.path().filename().string() + ":" + std::to_string(n);
      if (std::regex_search(line, m, transport_include)) {
        if (!kScheduleSees.contains(m[1]) && !kKnowsTransports.contains(stem)) {
          bad.push_back(where + " includes transport/" + std::string(m[1]) +
                        ".hpp: only the composition across servers knows a channel by name");
        }
        continue;
      }
      if (!std::regex_search(line, m, include)) continue;
      auto target = kAlgoLevel.find(m[1]);
      if (target == kAlgoLevel.end()) {
        bad.push_back(where + " includes algo/" + std::string(m[1]) + ".hpp, which has no level");
      } else if (target->second > level->second) {
        bad.push_back(where + " (level " + std::to_string(level->second) + ") includes algo/" + target->first +
                      ".hpp (level " + std::to_string(target->second) + ")");
      }
    }
  }
  return bad;
}

// A copy of src/ under a fresh temporary root, for a probe: not the tree
// itself, which another test may be scanning at the same time (ctest -j).
fs::path copy_of_src(const std::string& prefix) {
  const fs::path root = fs::temp_directory_path() / (prefix + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  fs::copy(fs::path(FG_SOURCE_DIR) / "src", root / "src", fs::copy_options::recursive);
  return root;
}

// The findings, one an indented line, for a failure's message.
std::string joined(const std::vector<std::string>& bad) {
  std::string all;
  for (const auto& b : bad) all += "\n  " + b;
  return all;
}

}  // namespace

// Also: no schedule names a transport (only the channel interface).
TEST(Layers, NothingInAlgoIncludesUpward) {
  const auto bad = algo_violations();
  const std::string all = joined(bad);
  EXPECT_TRUE(bad.empty()) << "includes in src/algo that go up:" << all;
}

// The same check fails on a copy where the plan reaches into a schedule
// across servers, on a file it does not know, and on schedules that name a
// transport's own channel.
TEST(Layers, TheAlgoCheckCatchesAnIncludeThatGoesUp) {
  const fs::path root = copy_of_src("fg_algo_layers_");
  { std::ofstream(root / "src" / "algo" / "plan.cpp", std::ios::app) << "#include \"algo/across.hpp\"\n"; }
  { std::ofstream(root / "src" / "algo" / "zz_probe.hpp") << "\n"; }
  // A schedule that names the shared-memory channel, and one that names UCX's.
  { std::ofstream(root / "src" / "algo" / "reduce.cpp", std::ios::app) << "#include \"transport/shm_channel.hpp\"\n"; }
  { std::ofstream(root / "src" / "algo" / "allgather.hpp", std::ios::app) << "#include \"transport/net_channel.hpp\"\n"; }
  const auto bad = algo_violations(root);
  fs::remove_all(root);
  const std::string all = joined(bad);
  ASSERT_EQ(bad.size(), 4u) << all;
  EXPECT_NE(all.find("src/algo/reduce.cpp:"), std::string::npos) << all;
  EXPECT_NE(all.find("includes transport/shm_channel.hpp: only the composition"), std::string::npos) << all;
  EXPECT_NE(all.find("src/algo/allgather.hpp:"), std::string::npos) << all;
  EXPECT_NE(all.find("includes transport/net_channel.hpp: only the composition"), std::string::npos) << all;
  EXPECT_NE(all.find("src/algo/plan.cpp:"), std::string::npos) << all;
  EXPECT_NE(all.find("(level 2) includes algo/across.hpp (level 5)"), std::string::npos) << all;
  EXPECT_NE(all.find("src/algo/zz_probe.hpp has no level"), std::string::npos) << all;
}

TEST(Layers, EachFolderIncludesOnlyWhatIsBelowIt) {
  const auto bad = violations();
  const std::string all = joined(bad);
  EXPECT_TRUE(bad.empty()) << "includes that go up or sideways:" << all;
}

// The check itself must be able to fail: a file that reaches up is caught
// (in a copy of src/).
TEST(Layers, TheCheckCatchesAnIncludeThatGoesUp) {
  const fs::path root = copy_of_src("fg_layers_");
  const fs::path probe = root / "src" / "transport" / "zz_layer_probe.hpp";
  { std::ofstream(probe) << "#include \"core/group_impl.hpp\"\n#include \"fastgather/ops.hpp\"\n"; }
  // And a definition in the wrong layer: core implementing base's status.
  { std::ofstream(root / "src" / "core" / "zz_status_probe.cpp") << "#include \"fastgather/status.hpp\"\n"; }
  const auto bad = violations(root);
  fs::remove_all(root);
  ASSERT_EQ(bad.size(), 3u);
  const std::string all = joined(bad);
  EXPECT_NE(all.find("zz_layer_probe.hpp:1 (transport) includes core/group_impl.hpp"), std::string::npos) << all;
  EXPECT_NE(all.find("zz_layer_probe.hpp:2 (transport) includes fastgather/ops.hpp, implemented in ops"), std::string::npos)
      << all;
  EXPECT_NE(all.find("zz_status_probe.cpp:1 (core) implements fastgather/status.hpp, which belongs to base"),
            std::string::npos) << all;
}

// Every public header has a layer in the map, so none escapes the check.
TEST(Layers, EveryPublicHeaderHasALayer) {
  for (const auto& entry : fs::directory_iterator(fs::path(FG_SOURCE_DIR) / "include" / "fastgather")) {
    const std::string name = "fastgather/" + entry.path().filename().string();
    EXPECT_TRUE(kPublicLayer.contains(name)) << name << " is not in kPublicLayer";
  }
}
