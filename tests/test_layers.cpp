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
    {"fastgather/schedule.hpp", "base"},
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
  // And a definition in the wrong layer: core implementing base's status.
  { std::ofstream(root / "src" / "core" / "zz_status_probe.cpp") << "#include \"fastgather/status.hpp\"\n"; }
  const auto bad = violations(root);
  fs::remove_all(root);
  ASSERT_EQ(bad.size(), 3u);
  std::string all;
  for (const auto& b : bad) all += b + "\n";
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
