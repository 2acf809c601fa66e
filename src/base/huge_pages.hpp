// Memory this process asked to back with transparent huge pages (Tensor does
// from 1 MiB on, with MADV_HUGEPAGE). Single copy (process_vm_readv) pins
// the owner's pages one by one: measured here, huge-page memory is read 1.9x
// faster than by the ring, 4 KiB-page memory 10-40% slower (docs/benchmarks.md).
// So an owner offers single copy only for memory it knows to be of the first kind.
#pragma once

#include <cstddef>

namespace fastgather::base {

void note_huge_range(const void* begin, size_t bytes);
// The bytes noted for the range that starts at begin (0: none), now forgotten.
size_t forget_huge_range(const void* begin);
// Whether [p, p+bytes) lies within one noted range.
bool in_huge_range(const void* p, size_t bytes);
// Whether an owner offers [p, p+bytes) to be read by process_vm_readv: of
// huge pages, or whatever it is where FG_SINGLE_COPY=always (the all-gather's
// single copy and a send past the mailbox ask the same).
inline bool worth_reading_by_peers(const void* p, size_t bytes, bool always) { return always || in_huge_range(p, bytes); }

}  // namespace fastgather::base
