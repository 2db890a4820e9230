// SPDX-License-Identifier: Apache-2.0
// The safetensors layout (https://github.com/huggingface/safetensors):
//   8 bytes   N, the header length, little-endian uint64
//   N bytes   JSON: {name: {"dtype": "F32", "shape": [2, 3],
//                           "data_offsets": [begin, end]}, ...,
//                    "__metadata__": {string: string}}
//             (padded with spaces so that the data starts 8-byte aligned)
//   rest      the tensors' bytes, row-major, little-endian; offsets are
//             relative to the start of this buffer and tile it exactly.
// Internal to core's checkpoint code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "strata/tensor.hpp"

namespace strata::checkpoint {

/// "F32", "F64", "F16", "BF16", "I32", "I64", "U8".
const char* safetensors_dtype(DType dtype);
/// Inverse of safetensors_dtype; nullopt for names Strata has no DType for.
std::optional<DType> dtype_from_safetensors(const std::string& name);

struct TensorEntry {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  // byte offsets in the data buffer
};

/// The first 8 + N bytes of a file holding `entries` (whose offsets must
/// tile the data buffer) and `metadata`.
std::string encode_header(const std::vector<TensorEntry>& entries,
                          const std::map<std::string, std::string>& metadata);

struct ParsedFile {
  std::vector<TensorEntry> entries;  // in data order
  std::map<std::string, std::string> metadata;
  std::uint64_t data_start = 0;  // file offset of the data buffer
};

/// The largest JSON header accepted (safetensors' own reader refuses more
/// than 100 MB), so that a corrupt length cannot make a reader allocate or
/// scan gigabytes.
constexpr std::uint64_t kMaxHeaderBytes = 100u << 20;

/// Parse and validate the header of a file of `file_size` bytes, given its
/// first `head_size` bytes at `head` (at least 8 + the header length when
/// that length is valid; the tensors' bytes are not needed): header length
/// within the file and at most kMaxHeaderBytes, JSON well formed, every dtype
/// known, shapes non-negative, each tensor's byte count matching its shape,
/// the offsets tiling the data buffer to the end of the file. Throws
/// DataLossError naming `file` otherwise.
ParsedFile parse_header(const unsigned char* head, std::size_t head_size, std::uint64_t file_size,
                        const std::string& file);
/// parse_header of a whole file held in memory (`size` bytes at `data`).
ParsedFile parse_file(const unsigned char* data, std::size_t size, const std::string& file);

}  // namespace strata::checkpoint
