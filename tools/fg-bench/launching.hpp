// How fg-bench starts its ranks beyond the one-server spawner: re-run under
// mpirun (the MPI comparator shares the processes), or every server of a
// multi-server layout simulated on this host.
#pragma once

#include <functional>

#include "fastgather/fastgather.hpp"

namespace fastgather::bench {

// The no-argument and --compare runs put the system MPI beside fastgather:
// re-runs this command under mpirun so both share the same processes
// (returns only where it does not).
void maybe_reexec_under_mpirun(int argc, char** argv, const LaunchPlan& plan, bool simulate);
// Runs every server's ranks on this host, one spawner process per server, as
// if SERVER_INDEX=0..SERVER_NUM-1 had been started by hand.
int simulate_servers(const LaunchPlan& plan, const std::function<int(const Config&)>& body);

}  // namespace fastgather::bench
