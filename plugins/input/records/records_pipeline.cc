// SPDX-License-Identifier: Apache-2.0
// The "records" InputPipeline: TFRecord-format files read in order, every
// record's two CRCs verified (strata/sdk/records.hpp does the reading).
//
// Options:
//   {"files": ["a.rec", ...],            required, non-empty
//    "features": [{"name": "x", "dtype": "float32", "shape": [16]}, ...],
//    "skip_corrupt": false,
//    "buffer_bytes": 4194304}
// Without "features" an element is one uint8 1-D component "record" holding
// the payload. With them the payload must be exactly the features' raw
// little-endian bytes back to back, and an element has one component per
// feature. Files are opened lazily, one at a time, in the given order.
//
// Sharding: FILE keeps files index, index + n, ...; DATA keeps records
// index, index + n, ... of the concatenated stream (every record is still
// read and verified, so that skip_corrupt decisions, and so the numbering,
// agree on every worker). The position (file, byte offset, records seen)
// can be saved and restored.
#include <dlpack/dlpack.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "strata/sdk/options.hpp"
#include "strata/sdk/plugin.hpp"
#include "strata/sdk/records.hpp"
#include "strata/sdk/tensor.hpp"

namespace strata::plugins {
namespace {

constexpr const char* kComp = "records input pipeline";

struct Feature {
  std::string name;
  DLDataType dtype{};
  std::vector<int64_t> shape;
  size_t bytes = 0;
};

DLDataType parse_dtype(const std::string& name, size_t index) {
  if (name == "float32") return {kDLFloat, 32, 1};
  if (name == "float64") return {kDLFloat, 64, 1};
  if (name == "float16") return {kDLFloat, 16, 1};
  if (name == "bfloat16") return {kDLBfloat, 16, 1};
  if (name == "int32") return {kDLInt, 32, 1};
  if (name == "int64") return {kDLInt, 64, 1};
  if (name == "uint8") return {kDLUInt, 8, 1};
  STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'features'[", index, "] of the ", kComp, " has dtype '", name,
               "'; use float32, float64, float16, bfloat16, int32, int64 or uint8");
}

// One host tensor in a single allocation (struct, shape and 64-byte aligned
// data together): the reader's hot path makes one allocation and one copy
// per component.
struct TensorBlock {
  DLManagedTensor managed;
  int64_t shape[8];
};
static_assert(sizeof(TensorBlock) <= 192, "TensorBlock header must fit before the data");
constexpr size_t kDataOffset = 192;

void free_block(DLManagedTensor* t) { std::free(t->manager_ctx); }

DLManagedTensor* new_tensor(DLDataType dtype, const int64_t* shape, int32_t ndim, size_t bytes) {
  // malloc and align by hand: glibc's aligned_alloc costs several times a
  // malloc, and this runs once per record.
  void* mem = std::malloc(kDataOffset + bytes + 64);
  if (mem == nullptr) throw std::bad_alloc();
  auto* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(mem) + 63) & ~uintptr_t{63});
  auto* b = reinterpret_cast<TensorBlock*>(base);
  std::memset(&b->managed, 0, sizeof b->managed);
  for (int32_t i = 0; i < ndim; ++i) b->shape[i] = shape[i];
  DLTensor& t = b->managed.dl_tensor;
  t.data = base + kDataOffset;
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = ndim;
  t.dtype = dtype;
  t.shape = ndim > 0 ? b->shape : nullptr;
  t.strides = nullptr;
  t.byte_offset = 0;
  b->managed.manager_ctx = mem;
  b->managed.deleter = &free_block;
  return &b->managed;
}

class RecordsPipeline : public sdk::InputPipelineBase {
 public:
  static constexpr const char* kSubsystem = "input.records";

  RecordsPipeline(sdk::Host host, const char* options_json, const strata_input_context& /*ctx*/)
      : host_(std::move(host)) {
    const nlohmann::json o = sdk::parse_options(options_json, kComp);
    sdk::check_known_keys(o, {"files", "features", "skip_corrupt", "buffer_bytes"}, kComp);
    auto files = o.find("files");
    if (files == o.end() || !files->is_array() || files->empty())
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'files' of the ", kComp,
                   " must be a non-empty JSON array of record file paths, got ",
                   files == o.end() ? std::string("nothing") : files->dump(), "; e.g. {\"files\": [\"train.rec\"]}");
    for (size_t i = 0; i < files->size(); ++i) {
      const auto& f = (*files)[i];
      if (!f.is_string() || f.get<std::string>().empty())
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'files'[", i, "] of the ", kComp,
                     " must be a non-empty path string, got ", f.dump());
      files_.push_back(f.get<std::string>());
    }
    skip_corrupt_ = sdk::get_option<bool>(o, "skip_corrupt", false, kComp);
    const int64_t buffer = sdk::get_option<int64_t>(o, "buffer_bytes", int64_t{4} << 20, kComp);
    if (buffer < 4096 || buffer > (int64_t{1} << 30))
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'buffer_bytes' of the ", kComp, " is ", buffer,
                   "; use a size between 4096 and 1073741824 (default 4194304)");
    buffer_bytes_ = static_cast<size_t>(buffer);
    parse_features(o);
  }

  std::string shard_info(uint32_t* flags) override {
    *flags = STRATA_INPUT_CAN_SHARD_BY_FILE | STRATA_INPUT_CAN_SHARD_BY_DATA;
    return nlohmann::json(files_).dump();
  }

  void shard(strata_shard_policy policy, int32_t num_shards, int32_t index) override {
    if (started_)
      STRATA_THROW(STRATA_ERR_FAILED_PRECONDITION, "shard() on the ", kComp,
                   " after next() was called; shard right after opening the pipeline");
    if (policy == STRATA_SHARD_OFF) return;
    if (num_shards < 1 || index < 0 || index >= num_shards)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "shard index ", index, " of ", num_shards,
                   " shards is invalid; need num_shards >= 1 and 0 <= index < num_shards");
    if (policy == STRATA_SHARD_FILE) {
      if (files_.size() < static_cast<size_t>(num_shards))
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "FILE sharding needs at least ", num_shards, " files, got ",
                     files_.size(), "; use DATA sharding or more files");
      std::vector<std::string> kept;
      for (size_t i = static_cast<size_t>(index); i < files_.size(); i += static_cast<size_t>(num_shards))
        kept.push_back(files_[i]);
      files_ = std::move(kept);
      return;
    }
    // DATA composes with an earlier DATA shard: keep every n-th of what is kept.
    data_index_ += data_stride_ * static_cast<uint64_t>(index);
    data_stride_ *= static_cast<uint64_t>(num_shards);
  }

  void next(int64_t timeout_ms, strata_element& out) override {
    started_ = true;
    if (failed_code_ != STRATA_OK) detail::throw_status(failed_code_, failed_message_);
    try {
      next_element(timeout_ms, out);
    } catch (const Error& e) {
      // A corrupt or undecodable record stops the pipeline for good (a
      // retry must not step over it); running out of time does not.
      if (e.code() != STRATA_ERR_DEADLINE_EXCEEDED && e.code() != STRATA_ERR_OUT_OF_RANGE) {
        failed_code_ = e.code();
        failed_message_ = e.what();
      }
      throw;
    }
  }

  int64_t cardinality() { return -1; }

  std::string save_state() {
    nlohmann::json s{{"file_index", file_index_},
                     {"offset", reader_ ? reader_->offset() : 0},
                     {"seen", seen_},
                     {"files", files_},
                     {"data_index", data_index_},
                     {"data_stride", data_stride_}};
    return s.dump();
  }

  void restore_state(const void* data, uint64_t len) {
    nlohmann::json s;
    try {
      s = nlohmann::json::parse(static_cast<const char*>(data), static_cast<const char*>(data) + len);
      const auto files = s.at("files").get<std::vector<std::string>>();
      if (files != files_ || s.at("data_index").get<uint64_t>() != data_index_ ||
          s.at("data_stride").get<uint64_t>() != data_stride_)
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "the saved state of the ", kComp,
                     " was taken with other files or sharding (saved files ", s.at("files").dump(),
                     "); restore it into a pipeline opened and sharded the same way");
      file_index_ = s.at("file_index").get<size_t>();
      seen_ = s.at("seen").get<uint64_t>();
      const uint64_t offset = s.at("offset").get<uint64_t>();
      reader_.reset();
      started_ = true;
      if (file_index_ < files_.size() && offset > 0) open_current(offset);
    } catch (const nlohmann::json::exception& e) {
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "the saved state of the ", kComp, " is malformed (", e.what(),
                   "); pass the bytes save_state produced");
    }
  }

 private:
  void next_element(int64_t timeout_ms, strata_element& out) {
    const uint8_t* payload = nullptr;
    size_t len = 0;
    // Raw records are verified while they are copied into their tensor
    // (one pass); features are split from the verified view.
    const bool raw = features_.empty();
    sdk::ManagedTensorPtr tensor;
    for (;;) {
      if (!reader_) {
        if (file_index_ >= files_.size())
          STRATA_THROW(STRATA_ERR_OUT_OF_RANGE, "end of the record files");
        open_current(0);
      }
      // The deadline bounds each wait for the read-ahead thread; a
      // DEADLINE_EXCEEDED leaves the position unchanged, so a retry resumes.
      // Records of other DATA shards are verified but never copied.
      const uint64_t n = seen_;
      const bool mine = n >= data_index_ && (n - data_index_) % data_stride_ == 0;
      const bool more = raw && mine ? reader_->next_into(&alloc_record, &tensor, &len, timeout_ms)
                                    : reader_->next(&payload, &len, timeout_ms);
      if (!more) {
        reader_.reset();
        ++file_index_;
        continue;
      }
      ++seen_;
      if (mine) break;
    }
    if (raw) {
      out.names[0] = kRecordName;
      out.tensors[0] = tensor.release();
      out.num_components = 1;
      return;
    }
    decode(payload, len, out);
  }


  void parse_features(const nlohmann::json& o) {
    auto it = o.find("features");
    if (it == o.end() || it->is_null()) return;
    if (!it->is_array())
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'features' of the ", kComp,
                   " must be an array of {\"name\", \"dtype\", \"shape\"}, got ", it->dump());
    if (it->size() > STRATA_ELEMENT_MAX_COMPONENTS)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'features' of the ", kComp, " lists ", it->size(),
                   " features; an element holds at most ", STRATA_ELEMENT_MAX_COMPONENTS);
    std::set<std::string> names;
    for (size_t i = 0; i < it->size(); ++i) {
      const auto& f = (*it)[i];
      if (!f.is_object())
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'features'[", i, "] of the ", kComp,
                     " must be an object {\"name\", \"dtype\", \"shape\"}, got ", f.dump());
      sdk::check_known_keys(f, {"name", "dtype", "shape"}, detail::str_cat(kComp, " feature ", i));
      Feature feat;
      if (!f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty())
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'features'[", i, "] of the ", kComp,
                     " needs a non-empty string \"name\"");
      feat.name = f["name"].get<std::string>();
      if (!names.insert(feat.name).second)
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'features' of the ", kComp, " names '", feat.name,
                     "' twice; give every feature its own name");
      if (!f.contains("dtype") || !f["dtype"].is_string())
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'features'[", i, "] ('", feat.name, "') of the ",
                     kComp, " needs a string \"dtype\" such as \"float32\"");
      feat.dtype = parse_dtype(f["dtype"].get<std::string>(), i);
      const auto shape = f.find("shape");
      if (shape != f.end() && !shape->is_array())
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'features'[", i, "] ('", feat.name, "') of the ", kComp,
                     " has shape ", shape->dump(), "; pass an array of dimensions such as [16] ([] for a scalar)");
      size_t count = 1;
      if (shape != f.end()) {
        if (shape->size() > 8)
          STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "feature '", feat.name, "' of the ", kComp, " has ",
                       shape->size(), " dimensions; at most 8 are supported");
        for (const auto& d : *shape) {
          if (!d.is_number_integer() || d.get<int64_t>() < 0)
            STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "feature '", feat.name, "' of the ", kComp, " has shape ",
                         shape->dump(), "; dimensions must be non-negative integers");
          feat.shape.push_back(d.get<int64_t>());
          count *= static_cast<size_t>(d.get<int64_t>());
        }
      }
      feat.bytes = count * (feat.dtype.bits / 8);
      record_bytes_ += feat.bytes;
      features_.push_back(std::move(feat));
    }
  }

  void open_current(uint64_t offset) {
    sdk::RecordReaderOptions ro;
    ro.skip_corrupt = skip_corrupt_;
    ro.buffer_bytes = buffer_bytes_;
    sdk::Host log = host_;
    ro.warn = [log](const std::string& m) { log.warn(m); };
    reader_.emplace(files_[file_index_], std::move(ro));
    if (offset > 0) reader_->seek(offset);
  }

  void decode(const uint8_t* payload, size_t len, strata_element& out) {
    out.num_components = 0;
    if (len != record_bytes_)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "record in '", reader_->path(), "' at byte offset ",
                   reader_->record_offset(), " has ", len, " payload bytes, but the features expect ", record_bytes_,
                   " (", features_summary(),
                   "); fix the \"features\" option to match how the file was written, or omit it to get raw "
                   "records");
    sdk::ManagedTensorPtr made[STRATA_ELEMENT_MAX_COMPONENTS];
    size_t pos = 0;
    for (size_t i = 0; i < features_.size(); ++i) {
      const Feature& f = features_[i];
      made[i].reset(new_tensor(f.dtype, f.shape.data(), static_cast<int32_t>(f.shape.size()), f.bytes));
      if (f.bytes > 0) std::memcpy(made[i]->dl_tensor.data, payload + pos, f.bytes);
      pos += f.bytes;
    }
    for (size_t i = 0; i < features_.size(); ++i) {
      out.names[i] = features_[i].name.c_str();
      out.tensors[i] = made[i].release();
    }
    out.num_components = static_cast<uint32_t>(features_.size());
  }

  std::string features_summary() const {
    std::string s;
    for (const Feature& f : features_) s += (s.empty() ? "" : ", ") + f.name + ": " + std::to_string(f.bytes);
    return s;
  }

  // RecordReader::AllocFn: a fresh uint8 tensor of `len` bytes held in
  // the ManagedTensorPtr `user` (replacing, so freeing, an earlier one).
  static uint8_t* alloc_record(void* user, size_t len) {
    auto& slot = *static_cast<sdk::ManagedTensorPtr*>(user);
    const int64_t shape[1] = {static_cast<int64_t>(len)};
    slot.reset(new_tensor(DLDataType{kDLUInt, 8, 1}, shape, 1, len));
    return static_cast<uint8_t*>(slot->dl_tensor.data);
  }

  static constexpr const char* kRecordName = "record";
  sdk::Host host_;
  std::vector<std::string> files_;
  std::vector<Feature> features_;
  size_t record_bytes_ = 0;
  bool skip_corrupt_ = false;
  size_t buffer_bytes_ = 4 << 20;
  uint64_t data_index_ = 0;
  uint64_t data_stride_ = 1;
  bool started_ = false;
  size_t file_index_ = 0;
  uint64_t seen_ = 0;  // verified records of the unsharded stream so far
  std::optional<sdk::RecordReader> reader_;
  strata_status_t failed_code_ = STRATA_OK;
  std::string failed_message_;
};

}  // namespace
}  // namespace strata::plugins

STRATA_PLUGIN("strata records input pipeline", "0.1.0",
              STRATA_INPUT_PIPELINE_COMPONENT(strata::plugins::RecordsPipeline, "records", "0.1.0"))
