// The layering docs/architecture.md draws, checked on the sources: each
// folder of src/ includes only the folders below it (and its own), and the
// layers below the ops never include the public op or launch headers.
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
    {"launch", {"base", "transport"}},
};
// Public headers that belong to a layer above core.
const std::map<std::string, std::set<std::string>> kPublicAbove = {
    {"fastgather/ops.hpp", {"ops"}},
    {"fastgather/launch.hpp", {"launch"}},
    {"fastgather/fastgather.hpp", {}},
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
        auto above = kPublicAbove.find(target);
        if (above != kPublicAbove.end() && !above->second.contains(layer)) {
          bad.push_back(where + " (" + layer + ") includes " + target + ", a layer above it");
        }
      } else if (dir != layer && !allowed->second.contains(dir)) {
        bad.push_back(where + " (" + layer + ") includes " + target);
      }
    }
  }
  return bad;
}

}  // namespace

TEST(Layers, EachFolderIncludesOnlyWhatIsBelowIt) {
  const auto bad = violations();
  std::string all;
  for (const auto& b : bad) all += "\n  " + b;
  EXPECT_TRUE(bad.empty()) << "includes that go up or sideways:" << all;
}

// The check itself must be able to fail: a file that reaches up is caught.
// The probe goes into a copy of src/, not the tree itself, which the test
// above may be scanning at the same time (ctest -j).
TEST(Layers, TheCheckCatchesAnIncludeThatGoesUp) {
  const fs::path root = fs::temp_directory_path() / ("fg_layers_" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  fs::copy(fs::path(FG_SOURCE_DIR) / "src", root / "src", fs::copy_options::recursive);
  const fs::path probe = root / "src" / "transport" / "zz_layer_probe.hpp";
  { std::ofstream(probe) << "#include \"core/group_impl.hpp\"\n#include \"fastgather/ops.hpp\"\n"; }
  const auto bad = violations(root);
  fs::remove_all(root);
  ASSERT_EQ(bad.size(), 2u);
  EXPECT_NE(bad[0].find("zz_layer_probe.hpp:1 (transport) includes core/group_impl.hpp"), std::string::npos) << bad[0];
}
