// Counter-based random numbers: a value is a pure function of its key, so results do not
// depend on thread count or scheduling (no shared stream).
#pragma once

#include <cstdint>

namespace distmb {

// splitmix64's golden-ratio increment.
constexpr uint64_t kSplitmixGolden = 0x9E3779B97F4A7C15ull;

// splitmix64's finaliser: a bijection of uint64 with full avalanche.
inline uint64_t finalize64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// One splitmix64 step from state x: finalize64(x + golden).
inline uint64_t mix64(uint64_t x) { return finalize64(x + kSplitmixGolden); }

// Hash of a key tuple (seed first), chained through mix64.
inline uint64_t hash_key(uint64_t seed, uint64_t a, uint64_t b = 0, uint64_t c = 0) {
  return mix64(mix64(mix64(seed ^ mix64(a)) ^ b) ^ c);
}

// Uniform double in [0, 1) from the top 53 bits of a hash.
inline double to_unit(uint64_t h) { return static_cast<double>(h >> 11) * 0x1.0p-53; }

}  // namespace distmb
