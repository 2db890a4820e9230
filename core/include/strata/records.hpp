// SPDX-License-Identifier: Apache-2.0
// strata::RecordWriter and strata::RecordReader: TFRecord-format record
// files for users (the "records" input pipeline reads what these write).
//
// A record is `uint64 length | uint32 masked CRC32C(length) | payload |
// uint32 masked CRC32C(payload)` (TensorFlow's TFRecord format, without
// compression), so files interchange with tf.data.TFRecordDataset.
//
//   strata::RecordWriter w("train.rec");
//   w.write_features({x_view, y_view});  // raw bytes of each tensor, back to back
//   w.close();                            // throws on an I/O error
//
//   strata::RecordReader r("train.rec");
//   while (auto rec = r.next()) use(*rec);
//
// Errors are strata::Error subclasses whose message names the file (and,
// when reading, the byte offset of the bad record): NotFoundError for a file
// that cannot be opened, PermissionDeniedError for a place that may not be
// written, DataLossError for a corrupt or truncated record and for a failed
// write/flush/close. Both classes are move-only and single-threaded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "strata/export.hpp"
#include "strata/tensor.hpp"

namespace strata {

class STRATA_API RecordWriter {
 public:
  /// Create (or truncate) `path`.
  explicit RecordWriter(const std::string& path);
  RecordWriter(RecordWriter&&) noexcept;
  RecordWriter& operator=(RecordWriter&&) noexcept;
  RecordWriter(const RecordWriter&) = delete;
  RecordWriter& operator=(const RecordWriter&) = delete;
  /// Closes the file; an error at this point cannot be reported, so call
  /// close() when the data matters.
  ~RecordWriter();

  /// Append one record of `len` bytes.
  void write(const void* data, std::size_t len);
  /// Append one record holding each tensor's raw bytes (host memory,
  /// compact row-major, native little-endian) back to back: what the
  /// "records" pipeline decodes with RecordOptions::features.
  void write_features(const std::vector<TensorView>& features);
  /// Hand the buffered records to the operating system.
  void flush();
  /// Flush and close; idempotent. Throws DataLossError naming the file.
  void close();

  std::uint64_t records() const;
  const std::string& path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class STRATA_API RecordReader {
 public:
  /// Open `path` (NotFoundError naming it when it cannot be opened). With
  /// `skip_corrupt`, corrupt records are skipped and counted (a corrupt
  /// length or a truncated record skips the rest of the file) instead of
  /// throwing DataLossError.
  explicit RecordReader(const std::string& path, bool skip_corrupt = false);
  RecordReader(RecordReader&&) noexcept;
  RecordReader& operator=(RecordReader&&) noexcept;
  RecordReader(const RecordReader&) = delete;
  RecordReader& operator=(const RecordReader&) = delete;
  ~RecordReader();

  /// The next record's payload, or nullopt at the end of the file.
  std::optional<std::vector<std::uint8_t>> next();
  /// Byte offset of the record last returned.
  std::uint64_t record_offset() const;
  /// Corrupt records skipped so far.
  std::uint64_t skipped() const;
  const std::string& path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
