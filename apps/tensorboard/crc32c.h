// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of TFRecord framing, and
// the masked form that TFRecord stores (a CRC of data that itself holds CRCs is weak, so the
// stored value is rotated and offset).
#pragma once

#include <cstdint>
#include <string_view>

namespace mixprec::tensorboard {

// The CRC-32C of `data` (initial value and final xor 0xFFFFFFFF): crc32c("123456789") is
// 0xE3069283.
uint32_t crc32c(std::string_view data);

// ((crc >> 15) | (crc << 17)) + 0xA282EAD8, modulo 2^32.
uint32_t mask_crc(uint32_t crc);

// mask_crc(crc32c(data)), what a TFRecord stores after its length and after its data.
inline uint32_t masked_crc32c(std::string_view data) { return mask_crc(crc32c(data)); }

}  // namespace mixprec::tensorboard
