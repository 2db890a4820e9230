// SPDX-License-Identifier: Apache-2.0
// CRC32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of the
// files of a checkpoint. Table-driven, one byte at a time: checkpoint files
// are checked once per save/restore, next to a disk write or read, so the
// simplest correct form is enough here.
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata::checkpoint {

/// Extend `crc` (the value returned for the bytes before; 0 to start) with
/// `n` bytes at `data`. crc32c_extend(0, "123456789", 9) == 0xE3069283.
std::uint32_t crc32c_extend(std::uint32_t crc, const void* data, std::size_t n);

}  // namespace strata::checkpoint
