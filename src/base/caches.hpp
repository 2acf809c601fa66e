// What the kernel says about cpu0's caches (sysfs), for the sizes that tie a
// protocol to the cache it must fit. Not sysconf(_SC_LEVEL*_CACHE_SIZE):
// under KVM it reports the host's (384 MiB of L3 on the AMD VM of
// docs/benchmarks.md, whose sysfs says 32 MiB). Some guests' sysfs reports
// the host's too (counted_llc_bytes).
#pragma once

#include <cstddef>

namespace fastgather::base {

// Bytes of cpu0's data or unified cache of this level (1, 2, 3, ...), or of
// its largest cache with level 0; 0 when sysfs does not say.
size_t cache_bytes(int level);
// cpu0's L2, or 1 MiB where sysfs does not say.
size_t l2_bytes();
// The part of a last-level cache of `llc` bytes (cache_bytes(0)) that a call
// can count on: at most kMostCountedLlcBytes. A larger one is a server's,
// shared by dozens of cores (and, from a VM, with other guests), yet some
// guests' sysfs reports it whole: 480 MiB on the Xeon VM of
// docs/benchmarks.md, "Streaming stores where the last-level cache is a
// server's". An unknown one (0) counts as kUnknownLlcBytes.
constexpr size_t kMostCountedLlcBytes = size_t{128} << 20;
constexpr size_t kUnknownLlcBytes = size_t{32} << 20;
size_t counted_llc_bytes(size_t llc);

}  // namespace fastgather::base
