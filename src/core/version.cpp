#include "fastgather/version.hpp"

namespace fastgather {
const char* version() { return FASTGATHER_VERSION_STRING; }
}  // namespace fastgather
