// Packed gate bits of the fused UPDATE kernels (internal to csrc/kernels/update/): uint8
// [n][ceil(k / 8)], column j -> bit j % 8 of byte j / 8, padding bits 0.
#pragma once

#include <cstdint>
#include <cstring>

#include "tiling.h"

namespace distmb {
namespace update_detail {

constexpr int kBitsPerByte = 8;
constexpr int kUnpack = 16;  // gate bits unpacked per step in the backward pass
// Multiplying 8 bytes that are each 0 or 1 by this constant gathers them, in order, into the
// top byte (byte i -> bit i): the gate-bit packing of 8 columns.
constexpr uint64_t kPackBitsMagic = 0x0102040810204080ull;

static_assert(kPad % kUnpack == 0, "padded widths must split into whole gate words");

inline int64_t bytes_per_row(int64_t k) { return (k + kBitsPerByte - 1) / kBitsPerByte; }

// Pack gate[0 .. nbytes * 8) (each 0 or 1) into nbytes bytes, column j -> bit j % 8.
inline void pack_gate_bits(const uint8_t* gate, int nbytes, uint8_t* dst) {
  for (int b = 0; b < nbytes; ++b) {
    uint64_t x;
    std::memcpy(&x, gate + b * kBitsPerByte, sizeof(x));
    dst[b] = static_cast<uint8_t>((x * kPackBitsMagic) >> 56);
  }
}

}  // namespace update_detail
}  // namespace distmb
