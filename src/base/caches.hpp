// What the kernel says about cpu0's caches (sysfs), for the sizes that tie a
// protocol to the cache it must fit. Not sysconf(_SC_LEVEL*_CACHE_SIZE):
// under KVM it reports the host's (384 MiB of L3 here, where the guest's
// sysfs says 32 MiB).
#pragma once

#include <cstddef>

namespace fastgather::base {

// Bytes of cpu0's data or unified cache of this level (1, 2, 3, ...), or of
// its largest cache with level 0; 0 when sysfs does not say.
size_t cache_bytes(int level);
// cpu0's L2, or 1 MiB where sysfs does not say.
size_t l2_bytes();

}  // namespace fastgather::base
