// Values a rank reads from the store, or from variables a launcher set: all
// untrusted input. A stranger who reached the store (or a bug in another
// rank) may have written anything under a key the ranks read, so each is
// parsed strictly here, and a bad one is an error that names where it came
// from and quotes at most a short, escaped excerpt; never an exception, a
// signal or a value taken on trust. Kept apart from the sockets and the
// communicator so that one fuzz target reaches every parser
// (tests/fuzz/fuzz_store_values.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "fastgather/status.hpp"

namespace fastgather::bootstrap {

// What an error shows of a value: at most 40 characters, non-printable
// bytes escaped, "..." when cut.
std::string excerpt(std::string_view text);

// A whole decimal number in [0, max] read under `source` (a store key or
// a variable's name).
Result<uint64_t> parse_number(std::string_view source, std::string_view text, uint64_t max);

// "rank/world" as a HELLO carries it: 0 <= rank < world <= max_world.
struct RankIdentity {
  int rank = -1;
  int world = 0;
};
Result<RankIdentity> parse_rank_identity(std::string_view text, int max_world);

// A job id (in segment names and the store): 1 to 64 of [0-9A-Za-z_].
Status check_job_id(std::string_view source, std::string_view id);

// A segment name published for this job: `prefix` (the job's, "/fg-<job>-")
// followed by 1 to 64 of [0-9a-z-]. Anything else could name another job's
// segment, or a path.
Status check_segment_name(std::string_view key, std::string_view name, std::string_view prefix);

// A group's heap as its creator publishes it: "-" (none) or
// "<segment name> <region bytes>".
struct HeapValue {
  std::string name;
  uint64_t region = 0;
};
Result<std::optional<HeapValue>> parse_heap_value(std::string_view key, std::string_view text,
                                                  std::string_view prefix, uint64_t max_region);

// An opaque value another library unpacks (a UCX worker address): not
// empty, at most `max` bytes.
constexpr size_t kMaxWorkerAddress = 64 << 10;
Status check_blob(std::string_view key, std::string_view value, size_t max);

// A member that fails while its peers wait for keys it would have written
// writes this under those keys instead: they fail at once with its reason.
std::string failure_value(const Status& why);
// The failure a value carries, if it is one.
std::optional<Status> failure_in(std::string_view value);

}  // namespace fastgather::bootstrap
