// SPDX-License-Identifier: Apache-2.0
#include "checkpoint/safetensors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <limits>

#include "strata/error.hpp"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "checkpoints are written with host byte order, which must be little-endian (safetensors)"
#endif

namespace strata::checkpoint {
namespace {

struct Name {
  DType dtype;
  const char* name;
};
constexpr Name kNames[] = {{DType::kFloat64, "F64"}, {DType::kFloat32, "F32"}, {DType::kFloat16, "F16"},
                           {DType::kBFloat16, "BF16"}, {DType::kInt64, "I64"}, {DType::kInt32, "I32"},
                           {DType::kUInt8, "U8"}};

}  // namespace

const char* safetensors_dtype(DType dtype) {
  for (const Name& n : kNames)
    if (n.dtype == dtype) return n.name;
  STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "dtype ", dtype_name(dtype), " has no safetensors name");
}

std::optional<DType> dtype_from_safetensors(const std::string& name) {
  for (const Name& n : kNames)
    if (name == n.name) return n.dtype;
  return std::nullopt;
}

std::string encode_header(const std::vector<TensorEntry>& entries,
                          const std::map<std::string, std::string>& metadata) {
  nlohmann::json h = nlohmann::json::object();
  for (const TensorEntry& e : entries)
    h[e.name] = {{"dtype", safetensors_dtype(e.dtype)}, {"shape", e.shape}, {"data_offsets", {e.begin, e.end}}};
  if (!metadata.empty()) h["__metadata__"] = metadata;
  std::string json = h.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const std::uint64_t n = json.size();
  std::memcpy(out.data(), &n, 8);
  return out + json;
}

ParsedFile parse_file(const unsigned char* data, std::size_t size, const std::string& file) {
  return parse_header(data, size, size, file);
}

ParsedFile parse_header(const unsigned char* head, std::size_t head_size, std::uint64_t size, const std::string& file) {
  auto fail = [&](const std::string& why) -> void {
    STRATA_THROW(STRATA_ERR_DATA_LOSS, "checkpoint file ", file, " is corrupt or truncated: ", why);
  };
  if (size < 8) fail("it has " + std::to_string(size) + " bytes, fewer than the 8-byte header length");
  STRATA_ENFORCE(head_size >= 8, STRATA_ERR_INTERNAL, "parse_header needs the first 8 bytes of ", file);
  std::uint64_t n = 0;
  std::memcpy(&n, head, 8);
  if (n > kMaxHeaderBytes || n > size - 8)
    fail("its header length " + std::to_string(n) + " exceeds the file (" + std::to_string(size) + " bytes)");
  STRATA_ENFORCE(head_size - 8 >= n, STRATA_ERR_INTERNAL, "parse_header needs the first ", 8 + n, " bytes of ", file);
  nlohmann::json h = nlohmann::json::parse(head + 8, head + 8 + n, nullptr, /*allow_exceptions=*/false);
  if (!h.is_object()) fail("its header is not a JSON object");
  ParsedFile out;
  out.data_start = 8 + n;
  const std::uint64_t data_size = size - out.data_start;
  for (auto it = h.begin(); it != h.end(); ++it) {
    const nlohmann::json& v = it.value();
    if (it.key() == "__metadata__") {
      if (!v.is_object()) fail("__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) fail("__metadata__ value '" + m.key() + "' is not a string");
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string what = "tensor '" + it.key() + "'";
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets") ||
        !v["dtype"].is_string() || !v["shape"].is_array() || !v["data_offsets"].is_array() ||
        v["data_offsets"].size() != 2)
      fail(what + " lacks a dtype, shape or data_offsets");
    TensorEntry e;
    e.name = it.key();
    const std::optional<DType> dt = dtype_from_safetensors(v["dtype"].get<std::string>());
    if (!dt) fail(what + " has dtype " + v["dtype"].get<std::string>() + ", which Strata does not support");
    e.dtype = *dt;
    std::uint64_t numel = 1;
    for (const nlohmann::json& d : v["shape"]) {
      if (!d.is_number_unsigned()) fail(what + " has a shape that is not a list of non-negative integers");
      const std::uint64_t dim = d.get<std::uint64_t>();
      if (dim > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) ||
          (dim != 0 && numel > data_size / dim))
        fail(what + " has a shape larger than the file");
      numel *= dim;
      e.shape.push_back(static_cast<std::int64_t>(dim));
    }
    for (const nlohmann::json& o : v["data_offsets"])
      if (!o.is_number_unsigned()) fail(what + " has data_offsets that are not non-negative integers");
    e.begin = v["data_offsets"][0].get<std::uint64_t>();
    e.end = v["data_offsets"][1].get<std::uint64_t>();
    if (e.begin > e.end || e.end > data_size)
      fail(what + " has data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
           "] outside the data (" + std::to_string(data_size) + " bytes)");
    if (e.end - e.begin != numel * dtype_size(e.dtype))
      fail(what + " holds " + std::to_string(e.end - e.begin) + " bytes but its shape and dtype need " +
           std::to_string(numel * dtype_size(e.dtype)));
    out.entries.push_back(std::move(e));
  }
  // The offsets must tile the buffer: no gap, no overlap, nothing after.
  std::sort(out.entries.begin(), out.entries.end(),
            [](const TensorEntry& a, const TensorEntry& b) { return a.begin < b.begin || (a.begin == b.begin && a.end < b.end); });
  std::uint64_t at = 0;
  for (const TensorEntry& e : out.entries) {
    if (e.begin != at) fail("tensor '" + e.name + "' does not start where the previous one ends");
    at = e.end;
  }
  if (at != data_size)
    fail("the tensors end at byte " + std::to_string(at) + " of a " + std::to_string(data_size) +
         "-byte data buffer");
  return out;
}

}  // namespace strata::checkpoint
