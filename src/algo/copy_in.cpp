#include "algo/copy_in.hpp"

#include "base/caches.hpp"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace fastgather::algo {
namespace {

#if defined(__x86_64__)
// Regular stores up to dst's first cache line, whole lines with streaming
// stores (two 32-byte stores per line, back to back, so the write-combining
// buffer fills a line at once), regular stores for the tail.
__attribute__((target("avx2"))) void stream_copy(std::byte* dst, const std::byte* src, size_t len) {
  size_t i = std::min(len, (64 - reinterpret_cast<uintptr_t>(dst) % 64) % 64);
  if (i != 0) std::memcpy(dst, src, i);
  for (; i + 64 <= len; i += 64) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 32));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 32), b);
  }
  if (i < len) std::memcpy(dst + i, src + i, len - i);
  _mm_sfence();  // streaming stores are weakly ordered: drain them before a post's release store
}
bool have_avx2() {
  static const bool ok = __builtin_cpu_supports("avx2");
  return ok;
}
#endif

constexpr uint32_t kWarmSamples = 8;     // per way, before choosing
constexpr uint64_t kDecideEvery = 32;    // calls between two looks at the medians
constexpr uint64_t kExploreEvery = 256;  // then try the other way ...
constexpr uint64_t kExploreFor = 4;      // ... for this many calls

}  // namespace

void copy_into_ring(CopyIn how, std::byte* dst, const std::byte* src, size_t len) {
  copy_out(dst, src, len, how == CopyIn::kStreaming);
}

void copy_out(std::byte* dst, const std::byte* src, size_t len, bool streaming) {
#if defined(__x86_64__)
  if (streaming && have_avx2()) return stream_copy(dst, src, len);
#endif
  std::memcpy(dst, src, len);
}

bool streams_out(size_t output_bytes, const Settings& settings) {
  return output_bytes >= settings.effective_stream_out_bytes();
}

CopyInChooser::CopyInChooser(Settings::CopyIn forced) {
  if (forced == Settings::CopyIn::kCached) forced_ = static_cast<int>(CopyIn::kCached);
  if (forced == Settings::CopyIn::kStreaming) forced_ = static_cast<int>(CopyIn::kStreaming);
}

size_t CopyInChooser::size_class(size_t bytes) {
  return std::min<size_t>(std::bit_width(bytes), 39);
}

CopyIn CopyInChooser::pick(size_t bytes) {
  if (forced_ >= 0) return static_cast<CopyIn>(forced_);
  if (bytes < kMinLearnedBytes) return CopyIn::kCached;
  SizeClass& c = classes_[size_class(bytes)];
  const uint64_t k = c.calls++;
  // Warm-up: alternate, so both ways are measured under the same conditions.
  if (k < 2 * kWarmSamples) return static_cast<CopyIn>(k % 2);
  if (k % kDecideEvery == 0) c.best = c.arms[0].median() <= c.arms[1].median() ? CopyIn::kCached : CopyIn::kStreaming;
  const CopyIn other = c.best == CopyIn::kCached ? CopyIn::kStreaming : CopyIn::kCached;
  return (k % kExploreEvery) >= kExploreEvery - kExploreFor ? other : c.best;
}

float CopyInChooser::Arm::median() const {
  const size_t n = std::min<size_t>(samples, recent_ns.size());
  if (n == 0) return 0;
  std::array<float, 16> v = recent_ns;
  std::nth_element(v.begin(), v.begin() + n / 2, v.begin() + n);
  return v[n / 2];
}

uint64_t CopyInChooser::recorded(size_t bytes) const {
  const SizeClass& c = classes_[size_class(bytes)];
  return uint64_t{c.arms[0].samples} + c.arms[1].samples;
}

void CopyInChooser::record(size_t bytes, CopyIn how, double call_ns) {
  if (forced_ >= 0 || bytes < kMinLearnedBytes) return;
  Arm& a = classes_[size_class(bytes)].arms[static_cast<size_t>(how)];
  a.recent_ns[a.samples % a.recent_ns.size()] = static_cast<float>(call_ns);
  ++a.samples;
}

}  // namespace fastgather::algo
