// What fg-bench checks of the machine before it allocates or writes
// anything: memory for the largest case, the files it will write, the CPU.
#pragma once

#include <string>

#include "fastgather/fastgather.hpp"
#include "options.hpp"

namespace fastgather::bench {

// Memory available to new allocations on this machine (MemAvailable), 0 if unknown.
double available_bytes();
// The largest case's buffers on one rank times the ranks on this host,
// against what the machine has available.
Status check_memory(const Options& o, const LaunchPlan& plan, int ranks_here);
std::string cpu_model();
// A file the run will write at its end: its folder must exist and take it,
// and the file, if there, must be writable. Nothing is created here.
Status check_writable(const char* flag, const std::string& path);

}  // namespace fastgather::bench
