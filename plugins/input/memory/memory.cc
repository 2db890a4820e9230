// SPDX-License-Identifier: Apache-2.0
// The "memory" input pipeline: arrays sliced along their first dimension
// (tf.data.Dataset.from_tensor_slices). Element i holds row i of every
// component, copied into a fresh DLManagedTensor.
//
// Options (exactly one of):
//   {"arrays": "0x7f..."}  the address of a strata_input_arrays (borrowed:
//                          the caller keeps it and its tensors alive while
//                          the pipeline lives; the C++ Dataset API does);
//   {"npy": {"x": "x.npy", "y": "y.npy"}}  one .npy file per component
//                          (format v1/v2/v3, C order, dtypes <f4 <f8 <f2
//                          <i4 <i8 |u1). Headers are read at open, the data
//                          on the first next(), so shard_info and
//                          cardinality stay cheap.
// Sharding: by data only (shard(DATA, n, i) keeps rows i, i+n, ...). next()
// never blocks, so its timeout is irrelevant here. save_state/restore_state
// carry the next row (JSON) into a pipeline opened with the same data and
// shard, so a resumed job neither repeats nor skips rows.
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "strata/sdk/options.hpp"
#include "strata/sdk/plugin.hpp"
#include "strata/sdk/tensor.hpp"

namespace strata::plugins {
namespace {

constexpr const char* kComp = "memory input pipeline";

// ------------------------------------------------------------ tensors ---

// A row tensor we allocate ourselves: the SDK's make_tensor only knows the
// six dtypes its kernels reduce, and rows may also be uint8 or any other
// plain DLPack type.
struct RowHolder {
  DLManagedTensor managed{};
  std::vector<int64_t> shape;
  void* data = nullptr;
  ~RowHolder() { std::free(data); }
};

void delete_row(DLManagedTensor* t) { delete static_cast<RowHolder*>(t->manager_ctx); }

DLManagedTensor* make_row(DLDataType dtype, const std::vector<int64_t>& shape, const void* src, size_t bytes) {
  auto h = std::make_unique<RowHolder>();
  h->shape = shape;
  // aligned_alloc wants a multiple of the alignment; never 0 bytes.
  const size_t rounded = ((bytes + 63) / 64) * 64 + 64;
  h->data = std::aligned_alloc(64, rounded);
  if (h->data == nullptr) throw std::bad_alloc();
  if (bytes != 0) std::memcpy(h->data, src, bytes);
  DLTensor& t = h->managed.dl_tensor;
  t.data = h->data;
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = static_cast<int32_t>(h->shape.size());
  t.dtype = dtype;
  t.shape = h->shape.empty() ? nullptr : h->shape.data();
  t.strides = nullptr;
  t.byte_offset = 0;
  h->managed.manager_ctx = h.get();
  h->managed.deleter = &delete_row;
  return &h.release()->managed;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

/// One component: where its rows live and how big each is.
struct Component {
  std::string name;
  std::string file;  // "" for arrays handed over in memory
  DLDataType dtype{};
  std::vector<int64_t> shape;  // full shape; rows are along shape[0]
  size_t row_bytes = 0;
  const char* base = nullptr;  // first byte of row 0 (arrays or loaded file)
  // .npy: where the data starts and the bytes it holds (loaded lazily).
  uint64_t data_offset = 0;
  std::vector<char> storage;
};

// --------------------------------------------------------------- .npy ---

std::string read_header_value(const std::string& header, const std::string& key, const std::string& file) {
  const std::string pat1 = "'" + key + "'", pat2 = "\"" + key + "\"";
  size_t k = header.find(pat1);
  size_t klen = pat1.size();
  if (k == std::string::npos) {
    k = header.find(pat2);
    klen = pat2.size();
  }
  if (k == std::string::npos)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "npy file '", file, "': header has no '", key,
                 "' entry (header: ", header, "); write the file with numpy.save");
  size_t p = header.find(':', k + klen);
  if (p == std::string::npos)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "npy file '", file, "': malformed header near '", key,
                 "'; write the file with numpy.save");
  ++p;
  while (p < header.size() && header[p] == ' ') ++p;
  if (p >= header.size())
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "npy file '", file, "': header ends after '", key, "'");
  const char c = header[p];
  size_t end;
  if (c == '\'' || c == '"') {
    end = header.find(c, p + 1);
    if (end == std::string::npos)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "npy file '", file, "': unterminated string for '", key, "'");
    return header.substr(p + 1, end - p - 1);
  }
  if (c == '(') {
    end = header.find(')', p);
    if (end == std::string::npos)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "npy file '", file, "': unterminated tuple for '", key, "'");
    return header.substr(p, end - p + 1);
  }
  end = header.find_first_of(",}", p);
  if (end == std::string::npos) end = header.size();
  std::string v = header.substr(p, end - p);
  while (!v.empty() && v.back() == ' ') v.pop_back();
  return v;
}

DLDataType npy_dtype(const std::string& descr, const std::string& file) {
  if (descr == "<f4") return DLDataType{kDLFloat, 32, 1};
  if (descr == "<f8") return DLDataType{kDLFloat, 64, 1};
  if (descr == "<f2") return DLDataType{kDLFloat, 16, 1};
  if (descr == "<i4") return DLDataType{kDLInt, 32, 1};
  if (descr == "<i8") return DLDataType{kDLInt, 64, 1};
  if (descr == "|u1" || descr == "<u1") return DLDataType{kDLUInt, 8, 1};
  STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "npy file '", file, "' has dtype '", descr,
               "', which the memory pipeline does not read; save it as one of <f4 (float32), <f8 (float64), "
               "<f2 (float16), <i4 (int32), <i8 (int64) or |u1 (uint8), little-endian");
}

std::vector<int64_t> parse_shape(const std::string& text, const std::string& file) {
  // "(3, 4)", "(3,)", "()"
  std::vector<int64_t> shape;
  size_t p = 1;
  while (p < text.size()) {
    while (p < text.size() && (text[p] == ' ' || text[p] == ',')) ++p;
    if (p >= text.size() || text[p] == ')') break;
    char* endp = nullptr;
    errno = 0;
    const long long v = std::strtoll(text.c_str() + p, &endp, 10);
    if (endp == text.c_str() + p || errno != 0 || v < 0)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "npy file '", file, "': malformed shape ", text,
                   "; write the file with numpy.save");
    shape.push_back(v);
    p = static_cast<size_t>(endp - text.c_str());
    if (p < text.size() && text[p] == 'L') ++p;  // Python 2 longs
  }
  return shape;
}

/// Read and validate the header of `file`; fill dtype/shape/offset of `c`.
void read_npy_header(Component& c) {
  const std::string& file = c.file;
  std::ifstream in(file, std::ios::binary);
  if (!in)
    STRATA_THROW(STRATA_ERR_NOT_FOUND, "npy file '", file, "' for component '", c.name, "' cannot be opened (",
                 std::strerror(errno), "); check the path in the \"npy\" option");
  in.seekg(0, std::ios::end);
  const uint64_t size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  unsigned char pre[12] = {};
  in.read(reinterpret_cast<char*>(pre), 10);
  if (in.gcount() < 10 || std::memcmp(pre, "\x93NUMPY", 6) != 0)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "'", file, "' is not a .npy file (",
                 size < 10 ? "too short" : "bad magic", "); write it with numpy.save");
  const int major = pre[6];
  uint64_t header_len;
  uint64_t prefix;
  if (major == 1) {
    header_len = pre[8] | (uint64_t(pre[9]) << 8);
    prefix = 10;
  } else if (major == 2 || major == 3) {
    in.read(reinterpret_cast<char*>(pre + 10), 2);
    if (in.gcount() < 2)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "npy file '", file, "' is truncated inside its header");
    header_len = pre[8] | (uint64_t(pre[9]) << 8) | (uint64_t(pre[10]) << 16) | (uint64_t(pre[11]) << 24);
    prefix = 12;
  } else {
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "npy file '", file, "' has format version ", major, ".", int(pre[7]),
                 "; the memory pipeline reads versions 1, 2 and 3");
  }
  if (prefix + header_len > size)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "npy file '", file, "' is truncated: its header claims ", header_len,
                 " bytes but the file has ", size, " bytes in all; re-write the file");
  std::string header(header_len, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_len));
  const std::string descr = read_header_value(header, "descr", file);
  const std::string fortran = read_header_value(header, "fortran_order", file);
  const std::string shape = read_header_value(header, "shape", file);
  if (fortran == "True")
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "npy file '", file,
                 "' is in Fortran order (fortran_order: True); the memory pipeline reads C order only: "
                 "save numpy.ascontiguousarray(a) instead");
  if (fortran != "False")
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "npy file '", file, "': fortran_order is '", fortran,
                 "', expected True or False");
  c.dtype = npy_dtype(descr, file);
  c.shape = parse_shape(shape, file);
  if (c.shape.empty())
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "npy file '", file,
                 "' holds a scalar (shape ()); slicing needs at least one dimension: save a 1-D array");
  c.data_offset = prefix + header_len;
  uint64_t bytes = c.dtype.bits / 8;
  for (int64_t d : c.shape) bytes *= static_cast<uint64_t>(d);
  const uint64_t have = size - c.data_offset;
  if (have < bytes)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "npy file '", file, "' is truncated: its header describes shape ",
                 shape_text(c.shape), " ", descr, " = ", bytes, " bytes of data but only ", have,
                 " bytes follow the header; re-write the file");
  if (have > bytes)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "npy file '", file, "' has ", have - bytes,
                 " bytes after the data its header describes (shape ", shape_text(c.shape), " ", descr,
                 "); the file is corrupt, re-write it");
}

void load_npy_data(Component& c) {
  const uint64_t bytes = c.row_bytes * static_cast<uint64_t>(c.shape[0]);
  std::ifstream in(c.file, std::ios::binary);
  if (!in)
    STRATA_THROW(STRATA_ERR_NOT_FOUND, "npy file '", c.file, "' cannot be opened any more (", std::strerror(errno),
                 "); it was readable when the pipeline opened: do not move it while reading");
  in.seekg(static_cast<std::streamoff>(c.data_offset));
  c.storage.resize(bytes);
  in.read(c.storage.data(), static_cast<std::streamsize>(bytes));
  if (static_cast<uint64_t>(in.gcount()) != bytes)
    STRATA_THROW(STRATA_ERR_DATA_LOSS, "npy file '", c.file, "' became shorter while reading (", in.gcount(), " of ",
                 bytes, " data bytes); do not modify it while reading");
  c.base = c.storage.data();
}

// ------------------------------------------------------------ arrays ---

const void* parse_address(const nlohmann::json& v, const char* key) {
  if (!v.is_string())
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option '", key, "' of ", kComp,
                 " must be a hex address string such as \"0x7f12ab\", got ", v.dump());
  const std::string s = v.get<std::string>();
  if (s.size() < 3 || s[0] != '0' || (s[1] != 'x' && s[1] != 'X'))
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option '", key, "' of ", kComp, " is '", s,
                 "'; pass the address as a hex string starting with 0x");
  char* end = nullptr;
  errno = 0;
  const unsigned long long a = std::strtoull(s.c_str() + 2, &end, 16);
  if (*end != '\0' || errno != 0 || a == 0)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option '", key, "' of ", kComp, " is '", s,
                 "', not a valid non-NULL hex address");
  return reinterpret_cast<const void*>(static_cast<uintptr_t>(a));
}

bool plain_dtype(DLDataType d) {
  return d.lanes == 1 && d.bits % 8 == 0 && d.bits > 0 &&
         (d.code == kDLInt || d.code == kDLUInt || d.code == kDLFloat || d.code == kDLBfloat);
}

class MemoryPipeline : public sdk::InputPipelineBase {
 public:
  static constexpr const char* kSubsystem = "input.memory";

  MemoryPipeline(sdk::Host host, const char* options_json, const strata_input_context&) : host_(std::move(host)) {
    const nlohmann::json o = sdk::parse_options(options_json, kComp);
    sdk::check_known_keys(o, {"arrays", "npy"}, kComp);
    const bool has_arrays = o.contains("arrays"), has_npy = o.contains("npy");
    if (has_arrays == has_npy)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, kComp,
                   " needs exactly one of the options \"arrays\" (address of a strata_input_arrays) or "
                   "\"npy\" ({\"name\": \"file.npy\", ...}); got ",
                   has_arrays ? "both" : "neither");
    if (has_arrays) {
      open_arrays(parse_address(o["arrays"], "arrays"));
    } else {
      // Re-read in document order so that components keep the order the
      // caller listed them in (nlohmann::json sorts object keys).
      open_npy(nlohmann::ordered_json::parse(options_json)["npy"]);
    }
    rows_ = comps_[0].shape[0];
    for (const Component& c : comps_) {
      if (c.shape[0] != rows_)
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, kComp, ": components must share their first dimension, but '",
                     comps_[0].name, "'", where(comps_[0]), " has ", rows_, " rows and '", c.name, "'", where(c),
                     " has ", c.shape[0], "; slice arrays of equal length");
    }
    host_.debug("opened ", comps_.size(), " components of ", rows_, " rows");
  }

  std::string shard_info(uint32_t* flags) override {
    *flags = STRATA_INPUT_CAN_SHARD_BY_DATA;
    return "";
  }

  void shard(strata_shard_policy policy, int32_t num_shards, int32_t index) override {
    shard_.apply(kComp, "it is not file-based (its rows are in memory)", policy, num_shards, index, started_);
  }

  void next(int64_t, strata_element& out) override {
    if (!started_) start();
    if (pos_ >= rows_) STRATA_THROW(STRATA_ERR_OUT_OF_RANGE, "end of data");
    if (out.struct_size != 0 && out.struct_size < STRATA_ELEMENT_STRUCT_SIZE)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, kComp, ": the strata_element passed to next() has struct_size ",
                   out.struct_size, " < ", STRATA_ELEMENT_STRUCT_SIZE, " (ABI mismatch); rebuild the caller");
    const uint32_t n = static_cast<uint32_t>(comps_.size());
    std::vector<sdk::ManagedTensorPtr> made;
    for (const Component& c : comps_) {
      std::vector<int64_t> row_shape(c.shape.begin() + 1, c.shape.end());
      made.emplace_back(make_row(c.dtype, row_shape, c.base + static_cast<size_t>(pos_) * c.row_bytes, c.row_bytes));
    }
    out.num_components = n;
    for (uint32_t i = 0; i < n; ++i) {
      out.names[i] = comps_[i].name.c_str();
      out.tensors[i] = made[i].release();
    }
    pos_ += shard_.stride;
  }

  int64_t cardinality() { return shard_.count(rows_); }

  /// The position as JSON: rows, the shard (first row, stride) and the next
  /// row to hand out. Restoring needs the same data and the same shard.
  std::string save_state() {
    const int64_t next = started_ ? pos_ : shard_.first;
    return nlohmann::json{{"rows", rows_}, {"first", shard_.first}, {"stride", shard_.stride}, {"next", next}}.dump();
  }

  void restore_state(const void* data, uint64_t len) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(std::string(static_cast<const char*>(data), len));
    } catch (const nlohmann::json::exception& e) {
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, kComp, ": saved state is not JSON (", e.what(),
                   "); pass what save_state wrote");
    }
    auto num = [&](const char* k) {
      if (!j.is_object() || !j.contains(k) || !j[k].is_number_integer())
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, kComp, ": saved state lacks integer '", k, "': ", j.dump(),
                     "; pass what save_state wrote");
      return j[k].get<int64_t>();
    };
    const int64_t rows = num("rows"), first = num("first"), stride = num("stride"), next = num("next");
    if (rows != rows_ || first != shard_.first || stride != shard_.stride)
      STRATA_THROW(STRATA_ERR_FAILED_PRECONDITION, kComp, ": saved state is for ", rows, " rows sharded (first ", first,
                   ", stride ", stride, ") but this pipeline has ", rows_, " rows sharded (first ", shard_.first,
                   ", stride ", shard_.stride, "); restore into a pipeline opened with the same data and shard");
    if (!shard_.keeps(next))
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, kComp, ": saved position ", next, " is not a row of this shard");
    if (!started_) start();
    pos_ = next;
  }

 private:
  void start() {
    started_ = true;
    for (Component& c : comps_)
      if (c.base == nullptr && !c.file.empty() && rows_ > 0) load_npy_data(c);
    pos_ = shard_.first;
  }

  static std::string where(const Component& c) { return c.file.empty() ? "" : " (" + c.file + ")"; }

  void open_arrays(const void* addr) {
    const auto* a = static_cast<const strata_input_arrays*>(addr);
    if (a->struct_size < STRATA_INPUT_ARRAYS_STRUCT_SIZE)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, kComp,
                   ": the strata_input_arrays at the \"arrays\" address has struct_size ", a->struct_size, " but ABI ",
                   STRATA_ABI_MAJOR, ".", STRATA_ABI_MINOR, " needs ", STRATA_INPUT_ARRAYS_STRUCT_SIZE,
                   " (ABI mismatch, or not a strata_input_arrays); fill it with STRATA_INIT_HEADER");
    if (a->num_components < 1 || a->num_components > STRATA_ELEMENT_MAX_COMPONENTS)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, kComp, ": strata_input_arrays has ", a->num_components,
                   " components; pass 1 to ", STRATA_ELEMENT_MAX_COMPONENTS);
    for (uint32_t i = 0; i < a->num_components; ++i) {
      Component c;
      if (a->names[i] == nullptr || a->names[i][0] == '\0')
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, kComp, ": component ", i, " has no name; give every component one");
      c.name = a->names[i];
      const DLTensor* t = a->tensors[i];
      if (t == nullptr)
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, kComp, ": tensor of component '", c.name, "' is NULL");
      if (t->device.device_type != kDLCPU && t->device.device_type != kDLCUDAHost)
        STRATA_THROW(STRATA_ERR_UNIMPLEMENTED, kComp, ": component '", c.name,
                     "' is not in host memory; copy it to the CPU first");
      if (!plain_dtype(t->dtype))
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, kComp, ": component '", c.name, "' has DLPack dtype code ",
                     int(t->dtype.code), " bits ", int(t->dtype.bits), " lanes ", t->dtype.lanes,
                     "; use a scalar int, uint, float or bfloat type");
      if (t->ndim < 1)
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, kComp, ": component '", c.name,
                     "' is a scalar; slicing needs at least one dimension");
      c.dtype = t->dtype;
      c.shape.assign(t->shape, t->shape + t->ndim);
      int64_t expect = 1;
      for (int d = t->ndim - 1; d >= 0; --d) {
        if (c.shape[d] < 0)
          STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, kComp, ": component '", c.name, "' has a negative dimension");
        if (t->strides != nullptr && c.shape[d] > 1 && t->strides[d] != expect)
          STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, kComp, ": component '", c.name,
                       "' is not contiguous (row-major); pass a compact copy");
        expect *= c.shape[d];
      }
      c.base = static_cast<const char*>(t->data) + t->byte_offset;
      set_row_bytes(c);
      comps_.push_back(std::move(c));
    }
    check_unique_names();
  }

  void open_npy(const nlohmann::ordered_json& files) {
    if (!files.is_object() || files.empty())
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'npy' of ", kComp,
                   " must be a non-empty object {\"name\": \"file.npy\", ...}, got ", files.dump());
    if (files.size() > STRATA_ELEMENT_MAX_COMPONENTS)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, kComp, ": ", files.size(), " npy files; at most ",
                   STRATA_ELEMENT_MAX_COMPONENTS, " components are allowed");
    for (auto it = files.begin(); it != files.end(); ++it) {
      if (!it.value().is_string())
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option npy.", it.key(), " of ", kComp,
                     " must be a file name string, got ", it.value().dump());
      if (it.key().empty())
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, kComp, ": a component of option 'npy' has an empty name");
      Component c;
      c.name = it.key();
      c.file = it.value().get<std::string>();
      read_npy_header(c);
      set_row_bytes(c);
      comps_.push_back(std::move(c));
    }
  }

  static void set_row_bytes(Component& c) {
    size_t b = c.dtype.bits / 8;
    for (size_t d = 1; d < c.shape.size(); ++d) b *= static_cast<size_t>(c.shape[d]);
    c.row_bytes = b;
  }

  void check_unique_names() {
    for (size_t i = 0; i < comps_.size(); ++i)
      for (size_t j = 0; j < i; ++j)
        if (comps_[i].name == comps_[j].name)
          STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, kComp, ": two components are named '", comps_[i].name,
                       "'; give each a distinct name");
  }

  sdk::Host host_;
  std::vector<Component> comps_;
  int64_t rows_ = 0;
  sdk::DataShard shard_;
  int64_t pos_ = 0;
  bool started_ = false;
};

}  // namespace
}  // namespace strata::plugins

STRATA_PLUGIN("strata memory input pipeline", "0.1.0",
              STRATA_INPUT_PIPELINE_COMPONENT(strata::plugins::MemoryPipeline, "memory", "0.1.0"))
