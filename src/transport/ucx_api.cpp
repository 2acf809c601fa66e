#include "transport/ucx_api.hpp"

#include <dlfcn.h>

#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "base/env.hpp"
#include "transport/net_channel.hpp"

namespace fastgather::transport {
namespace {

UcxApi g_api;
Status g_error;  // why loading failed; meaningful once g_once has run

void load_once() {
  // The one FG_UCX_LIBRARY names; else where the UCX the library was built
  // against lives (a UCX of its own prefix), then wherever the loader looks.
  const std::optional<std::string> chosen = base::env_text("FG_UCX_LIBRARY");
  std::vector<std::string> names;
  if (chosen) {
    names.push_back(*chosen);
  } else {
    names = {FG_UCX_LIBDIR "/libucp.so.0", "libucp.so.0"};
  }
  std::string why;
  void* lib = nullptr;
  for (const std::string& name : names) {
    // Never closed: UCX leaves threads and hooks behind that outlive any unload.
    lib = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib != nullptr) break;
    const char* e = ::dlerror();
    why += fmt::format("{}{}", why.empty() ? "" : "; ", e != nullptr ? e : name);
  }
  if (lib == nullptr) {
    g_error = {ErrorKind::kUnsupported, fmt::format("a job across servers needs UCX, and {} could not be loaded: {}",
                                                    chosen ? "FG_UCX_LIBRARY=" + *chosen : std::string("libucp.so.0"),
                                                    why)};
    return;
  }
  UcxApi api;
  auto find = [&](const char* name) -> void* {
    void* f = ::dlsym(lib, name);
    if (f == nullptr && g_error.ok()) {
      const char* e = ::dlerror();
      g_error = {ErrorKind::kUnsupported, fmt::format("the library loaded as UCX ({}) has no {}: {}",
                                                      chosen.value_or("libucp.so.0"), name, e != nullptr ? e : "null")};
    }
    return f;
  };
#define FG_UCX_FIND(name) api.name = reinterpret_cast<decltype(&::name)>(find(#name));
  FG_UCX_FUNCTIONS(FG_UCX_FIND)
#undef FG_UCX_FIND
  if (g_error.ok()) g_api = api;
}

std::once_flag g_once;

}  // namespace

Result<const UcxApi*> load_ucx() {
  std::call_once(g_once, load_once);
  if (!g_error.ok()) return g_error;
  return &g_api;
}

const UcxApi& ucx() { return g_api; }

bool ucx_mapped() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    for (const char* lib : {"/libucp.so", "/libucs.so", "/libuct.so", "/libucm.so"}) {
      if (line.find(lib) != std::string::npos) return true;
    }
  }
  return false;
}

}  // namespace fastgather::transport
