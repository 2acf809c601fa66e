// libFuzzer target for the rendezvous store's frame parser: whatever bytes a
// stranger sends, parsing must not crash, read out of bounds or accept a
// frame that does not re-encode to itself.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "bootstrap/tcp_store.hpp"

using fastgather::bootstrap::encode_store_request;
using fastgather::bootstrap::parse_store_request;
using fastgather::bootstrap::StoreRequest;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view buf(reinterpret_cast<const char*>(data), size);
  while (!buf.empty()) {
    StoreRequest req;
    const int64_t used = parse_store_request(buf, &req);
    if (used <= 0) break;
    if (static_cast<size_t>(used) > buf.size()) __builtin_trap();
    // An accepted frame re-encodes to exactly the bytes that were accepted.
    if (encode_store_request(req) != buf.substr(0, static_cast<size_t>(used))) __builtin_trap();
    buf.remove_prefix(static_cast<size_t>(used));
  }
  return 0;
}
