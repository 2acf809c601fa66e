// What fg-bench checks of the machine before it allocates or writes
// anything: memory for the largest case, the files it will write, the CPU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fastgather/fastgather.hpp"
#include "options.hpp"

namespace fastgather::bench {

// Memory available to new allocations on this machine (MemAvailable), 0 if unknown.
double available_bytes();
// The largest case's buffers on one rank times the ranks on this host,
// against what the machine has available.
Status check_memory(const Options& o, const LaunchPlan& plan, int ranks_here);
std::string cpu_model();

// Where a rank runs at one moment: its host (the kernel's boot id, which the
// network namespaces of one machine share, with its CPUs), the host's online
// cores, and the CPU the calling thread is on.
struct Place {
  uint32_t host = 0;  // 20 bits of the boot id's hash
  int cores = 1;
  int cpu = -1;  // -1: unknown
};
Place place_now();
// A Place as a double (exact) for gathering with the timings, and back.
double encode(const Place& p);
Place decode(double v);
// Whether the ranks (one Place each, taken at one moment) are spread over
// their hosts' CPUs as evenly as can be: no CPU holds more of a host's ranks
// than ceil(ranks on the host / its cores). A rank whose CPU is unknown
// counts as evenly placed.
bool evenly_placed(const std::vector<Place>& ranks);
// A file the run will write at its end: its folder must exist and take it,
// and the file, if there, must be writable. Nothing is created here.
Status check_writable(const char* flag, const std::string& path);

}  // namespace fastgather::bench
