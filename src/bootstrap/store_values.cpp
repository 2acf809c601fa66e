#include "bootstrap/store_values.hpp"

#include <fmt/format.h>

#include "base/env.hpp"
#include "bootstrap/tcp_store.hpp"

namespace fastgather::bootstrap {
namespace {

constexpr size_t kShown = 40;

bool all_of(std::string_view s, bool (*ok)(char)) {
  for (char c : s) {
    if (!ok(c)) return false;
  }
  return true;
}
bool digit(char c) { return c >= '0' && c <= '9'; }
bool job_char(char c) { return digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool name_char(char c) { return digit(c) || (c >= 'a' && c <= 'z') || c == '-'; }

Status bad(std::string why) { return {ErrorKind::kInvalidArgument, std::move(why)}; }

}  // namespace

std::string excerpt(std::string_view text) {
  std::string out;
  for (char c : text.substr(0, kShown)) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f && c != '\\') {
      out.push_back(c);
    } else {
      out += fmt::format("\\x{:02x}", u);
    }
  }
  if (text.size() > kShown) out += "...";
  return out;
}

Result<uint64_t> parse_number(std::string_view source, std::string_view text, uint64_t max) {
  if (text.empty() || text.size() > 20 || !all_of(text, digit)) {
    return bad(fmt::format("{}='{}' is not a whole number (digits only, 0..{})", source, excerpt(text), max));
  }
  auto v = base::parse_count(std::string(text), 0, max, std::string(source));
  if (!v.ok()) return bad(fmt::format("{}={} is outside 0..{}", source, excerpt(text), max));
  return v.value();
}

Result<RankIdentity> parse_rank_identity(std::string_view text, int max_world) {
  const size_t slash = text.find('/');
  if (slash == std::string_view::npos) return bad(fmt::format("malformed rank identity '{}'", excerpt(text)));
  auto world = parse_number("the caller's world size", text.substr(slash + 1), static_cast<uint64_t>(max_world));
  if (!world.ok()) return bad(fmt::format("malformed rank identity '{}': {}", excerpt(text), world.status().message()));
  auto rank = parse_number("the caller's rank", text.substr(0, slash), static_cast<uint64_t>(max_world));
  if (!rank.ok()) return bad(fmt::format("malformed rank identity '{}': {}", excerpt(text), rank.status().message()));
  if (world.value() == 0 || rank.value() >= world.value()) {
    return bad(fmt::format("malformed rank identity '{}': rank outside the world", excerpt(text)));
  }
  return RankIdentity{static_cast<int>(rank.value()), static_cast<int>(world.value())};
}

Status check_job_id(std::string_view source, std::string_view id) {
  if (id.empty() || id.size() > 64 || !all_of(id, job_char)) {
    return bad(fmt::format("{}='{}' is not a job id (1 to 64 letters, digits or '_')", source, excerpt(id)));
  }
  return Status::Ok();
}

Status check_segment_name(std::string_view key, std::string_view name, std::string_view prefix) {
  const std::string_view rest = name.substr(std::min(name.size(), prefix.size()));
  if (name.substr(0, prefix.size()) != prefix || rest.empty() || rest.size() > 64 || !all_of(rest, name_char)) {
    return bad(fmt::format("store key '{}' holds '{}', not a segment name of this job ({}...)", key, excerpt(name),
                           prefix));
  }
  return Status::Ok();
}

Result<std::optional<HeapValue>> parse_heap_value(std::string_view key, std::string_view text,
                                                  std::string_view prefix, uint64_t max_region) {
  if (text == "-") return std::optional<HeapValue>{};
  const size_t space = text.find(' ');
  if (space == std::string_view::npos) {
    return bad(fmt::format("store key '{}' holds '{}', not '<segment> <bytes>' or '-'", key, excerpt(text)));
  }
  HeapValue h{std::string(text.substr(0, space)), 0};
  if (Status s = check_segment_name(key, h.name, prefix); !s.ok()) return s;
  auto region = parse_number(fmt::format("store key '{}'", key), text.substr(space + 1), max_region);
  if (!region.ok()) return region.status();
  h.region = region.value();
  return std::optional<HeapValue>{std::move(h)};
}

Status check_blob(std::string_view key, std::string_view value, size_t max) {
  if (value.empty() || value.size() > max) {
    return bad(fmt::format("store key '{}' holds {} bytes, not an address (1..{} bytes)", key, value.size(), max));
  }
  return Status::Ok();
}

std::string failure_value(const Status& why) { return "!" + encode_status(why); }

std::optional<Status> failure_in(std::string_view value) {
  if (value.empty() || value[0] != '!') return std::nullopt;
  if (auto s = decode_status(value.substr(1))) return s;
  // Marked as a failure but not in its encoding: still a failure, said as is.
  return Status{ErrorKind::kSystem, fmt::format("a member published an unreadable failure '{}'", excerpt(value))};
}

}  // namespace fastgather::bootstrap
