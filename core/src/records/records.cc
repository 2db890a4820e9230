// SPDX-License-Identifier: Apache-2.0
// The public record file classes forward to the SDK's reader and writer
// (core links the SDK privately), so the plugin and user code share one
// implementation of the format.
#include "strata/records.hpp"

#include <utility>

#include "log.h"
#include "strata/sdk/records.hpp"

namespace strata {

struct RecordWriter::Impl {
  explicit Impl(const std::string& path) : w(path) {}
  sdk::RecordWriter w;
};

RecordWriter::RecordWriter(const std::string& path) : impl_(std::make_unique<Impl>(path)) {}
RecordWriter::RecordWriter(RecordWriter&&) noexcept = default;
RecordWriter& RecordWriter::operator=(RecordWriter&&) noexcept = default;
RecordWriter::~RecordWriter() = default;

namespace {
void require_open(const void* impl) {
  if (impl == nullptr)
    STRATA_THROW(STRATA_ERR_FAILED_PRECONDITION, "record file object was moved from; use the object it was moved to");
}
}  // namespace

void RecordWriter::write(const void* data, std::size_t len) {
  require_open(impl_.get());
  impl_->w.write(data, len);
}

void RecordWriter::write_features(const std::vector<TensorView>& features) {
  require_open(impl_.get());
  std::vector<std::pair<const void*, std::size_t>> parts;
  parts.reserve(features.size());
  for (std::size_t i = 0; i < features.size(); ++i) {
    const TensorView& t = features[i];
    if (!t.is_contiguous())
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "write_features to '", impl_->w.path(), "': feature ", i,
                   " is not compact row-major; pass a contiguous tensor (e.g. Tensor::copy_of(view))");
    const std::size_t n = t.nbytes();
    parts.emplace_back(n > 0 ? t.raw_data() : nullptr, n);
  }
  impl_->w.write_parts(parts);
}

void RecordWriter::flush() {
  require_open(impl_.get());
  impl_->w.flush();
}

void RecordWriter::close() {
  if (impl_) impl_->w.close();
}

std::uint64_t RecordWriter::records() const {
  require_open(impl_.get());
  return impl_->w.records();
}

const std::string& RecordWriter::path() const {
  require_open(impl_.get());
  return impl_->w.path();
}

struct RecordReader::Impl {
  Impl(const std::string& path, bool skip_corrupt) : r(path, options(skip_corrupt)) {}
  static sdk::RecordReaderOptions options(bool skip_corrupt) {
    sdk::RecordReaderOptions o;
    o.skip_corrupt = skip_corrupt;
    o.buffer_bytes = 1 << 20;
    o.warn = [](const std::string& m) { detail::logger("data")->warn("{}", m); };
    return o;
  }
  sdk::RecordReader r;
};

RecordReader::RecordReader(const std::string& path, bool skip_corrupt)
    : impl_(std::make_unique<Impl>(path, skip_corrupt)) {}
RecordReader::RecordReader(RecordReader&&) noexcept = default;
RecordReader& RecordReader::operator=(RecordReader&&) noexcept = default;
RecordReader::~RecordReader() = default;

std::optional<std::vector<std::uint8_t>> RecordReader::next() {
  require_open(impl_.get());
  std::vector<std::uint8_t> out;
  if (!impl_->r.next(out)) return std::nullopt;
  return out;
}

std::uint64_t RecordReader::record_offset() const {
  require_open(impl_.get());
  return impl_->r.record_offset();
}

std::uint64_t RecordReader::skipped() const {
  require_open(impl_.get());
  return impl_->r.skipped();
}

const std::string& RecordReader::path() const {
  require_open(impl_.get());
  return impl_->r.path();
}

}  // namespace strata
