// What the network between servers allows: one-way times of single UCX
// messages between world rank 0 and the first rank of server 1, on a UCX
// worker set up exactly as the library's own (same transports, same
// loopback settings when the servers are simulated on one host).
#pragma once

#include <vector>

#include "fastgather/fastgather.hpp"
#include "limits.hpp"

namespace fastgather::bench {

// Collective over the world (every rank helps exchange addresses); rank 0
// gets the points, half the median round trip per size.
Result<std::vector<CopyPoint>> measure_wire(Communicator& comm, const std::vector<size_t>& sizes);

}  // namespace fastgather::bench
