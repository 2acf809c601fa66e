// The schedule's names (include/fastgather/schedule.hpp): vocabulary of the
// algorithms, the ops and their reports, so implemented at the bottom.
#include "fastgather/schedule.hpp"

namespace fastgather {

const char* to_string(Schedule s) {
  switch (s) {
    case Schedule::kAuto: return "auto";
    case Schedule::kOneShot: return "one-shot";
    case Schedule::kRing: return "ring";
    case Schedule::kDirect: return "direct";
    case Schedule::kHierarchical: return "hierarchical";
    case Schedule::kTwoShot: return "two-shot";
  }
  return "unknown-schedule";
}

}  // namespace fastgather
