// SPDX-License-Identifier: Apache-2.0
// Record files in the TFRecord format, and CRC32C (Castagnoli).
//
// A record file is a sequence of records, each
//
//   uint64 length (little-endian) | uint32 masked_crc32c(length bytes)
//   | payload[length] | uint32 masked_crc32c(payload)
//
// with masked_crc(c) = ((c >> 15) | (c << 17)) + 0xa282ead8, exactly as
// TensorFlow writes them, so files interchange with tf.data.TFRecordDataset
// (uncompressed).
//
// RecordWriter buffers records and writes them to one file; RecordReader
// reads one file with large buffered reads and verifies both CRCs of every
// record. RecordWriter is move-only; RecordReader (which may own a thread)
// is pinned in place: hold it in a std::optional or a std::unique_ptr. Both
// are for one thread at a time, and both report
// errors by throwing strata::Error whose message names the file (and, for
// reading, the byte offset of the record at fault):
//   - a file that cannot be opened: NOT_FOUND (PERMISSION_DENIED for writing
//     into a place we may not write); reading a directory, pipe or device:
//     INVALID_ARGUMENT;
//   - a corrupt length CRC, a corrupt payload CRC, a truncated header, a
//     truncated payload, a read error: DATA_LOSS;
//   - a write, flush or close failure: DATA_LOSS (the file is incomplete).
// With read-ahead (the default for files larger than the buffer) a thread
// per reader does the read() calls while next() verifies and copies; next()
// then honours a deadline. Without it, next() blocks in read() for as long as
// the file system takes. Destroying a reader waits for a read() in progress.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace strata::sdk {

// ------------------------------------------------------------------ CRC32C ---

/// CRC32C of `data[0..len)` continuing from `crc` (0 for a fresh CRC):
/// crc32c_extend(crc32c_extend(0, a, n), b, m) == CRC of a followed by b.
/// Uses carry-less multiplication folding (AVX-512 VPCLMULQDQ) for long
/// buffers and the SSE4.2 crc32 instruction (three interleaved streams)
/// for the rest when the CPU has them, otherwise a portable slicing-by-8
/// table.
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t len);
inline uint32_t crc32c(const void* data, size_t len) { return crc32c_extend(0, data, len); }
/// Copy `len` bytes from `src` to `dst` (not overlapping) and return
/// crc32c_extend(crc, src, len), reading the source once where folding is
/// available.
uint32_t crc32c_copy(uint32_t crc, void* dst, const void* src, size_t len);

/// The implementations, for tests and benchmarks: the table, the best
/// hardware one, and the SSE4.2 one without folding. The last two must only
/// be called when crc32c_hw_available().
uint32_t crc32c_extend_sw(uint32_t crc, const void* data, size_t len);
uint32_t crc32c_extend_hw(uint32_t crc, const void* data, size_t len);
uint32_t crc32c_extend_sse42(uint32_t crc, const void* data, size_t len);
bool crc32c_hw_available();
/// "avx512-vpclmulqdq+sse4.2", "sse4.2" or "table": what crc32c_extend uses here.
const char* crc32c_implementation();

/// TFRecord's masking of stored CRCs (a CRC of data that embeds CRCs is
/// otherwise weak).
inline uint32_t mask_crc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }
inline uint32_t unmask_crc(uint32_t masked) {
  const uint32_t rot = masked - 0xa282ead8u;
  return (rot >> 17) | (rot << 15);
}

/// Bytes a record adds around its payload (8 + 4 + 4).
constexpr size_t kRecordOverhead = 16;
constexpr size_t kRecordHeaderBytes = 12;

// ---------------------------------------------------------------- writer ---

class RecordWriter {
 public:
  /// Create (truncate) `path`. Throws NOT_FOUND / PERMISSION_DENIED naming it.
  explicit RecordWriter(std::string path, size_t buffer_bytes = 1 << 20);
  RecordWriter(RecordWriter&& o) noexcept;
  RecordWriter& operator=(RecordWriter&& o) noexcept;
  RecordWriter(const RecordWriter&) = delete;
  RecordWriter& operator=(const RecordWriter&) = delete;
  /// Closes; an error at this point is lost, so call close() to see it.
  ~RecordWriter();

  /// Append one record.
  void write(const void* data, size_t len);
  /// Append one record whose payload is the parts back to back.
  void write_parts(const std::vector<std::pair<const void*, size_t>>& parts);
  /// Hand buffered records to the OS.
  void flush();
  /// Flush and close; throws DATA_LOSS naming the file on any I/O error.
  /// Idempotent.
  void close();

  const std::string& path() const { return path_; }
  uint64_t records() const { return records_; }
  /// Bytes written so far (buffered included).
  uint64_t bytes() const { return bytes_; }

 private:
  void put(const void* data, size_t len);
  void write_fully(const void* data, size_t len);
  std::string path_;
  int fd_ = -1;
  std::vector<uint8_t> buf_;
  size_t used_ = 0;
  uint64_t records_ = 0;
  uint64_t bytes_ = 0;
};

// ---------------------------------------------------------------- reader ---

struct RecordReaderOptions {
  /// Skip corrupt records instead of throwing: a bad payload CRC skips that
  /// record; a bad length CRC or a truncated record skips the rest of the
  /// file (there is no way to find the next record boundary).
  bool skip_corrupt = false;
  /// Bytes read ahead of the consumer, in four read() calls of a quarter
  /// each (the buffer grows for a larger record).
  size_t buffer_bytes = 4 << 20;
  /// Read on a background thread while the caller verifies and copies the
  /// records already read (files larger than buffer_bytes only). Off: every
  /// read() happens inside next().
  bool read_ahead = true;
  /// Receives warnings (skipped records, the per-file skip count); may be empty.
  std::function<void(const std::string&)> warn;
};

class RecordReader {
 public:
  /// Open `path`. Throws NOT_FOUND naming the file when it cannot be opened.
  RecordReader(std::string path, RecordReaderOptions options = {});
  RecordReader(const RecordReader&) = delete;
  RecordReader& operator=(const RecordReader&) = delete;
  /// Stops the read-ahead thread (waits for a read() in progress).
  ~RecordReader();

  /// The next verified record as a view into the reader's buffer, valid
  /// until the next call on this reader; false at the end of the file.
  /// Throws DATA_LOSS (see the file comment) unless skip_corrupt, and
  /// again on every later call until seek(), so nothing after a corrupt
  /// record is returned by accident; throws
  /// DEADLINE_EXCEEDED when the read-ahead thread delivered nothing for
  /// `timeout_ms` (< 0: no deadline); the reader stays usable after a
  /// deadline, and the next call continues where this one stopped.
  bool next(const uint8_t** data, size_t* len, int64_t timeout_ms = -1);
  /// As above, copying the payload into `out`.
  bool next(std::vector<uint8_t>& out, int64_t timeout_ms = -1);
  /// As above, but the payload is copied into `alloc(user, len)` (a
  /// buffer of at least len bytes, or a throw) while its CRC is computed:
  /// one pass over the bytes. alloc is called once per record read, before
  /// the payload CRC is known; every buffer it returns belongs to the
  /// caller, including one for a record that then fails its CRC (in skip
  /// mode alloc is then called again for the next record).
  using AllocFn = uint8_t* (*)(void* user, size_t len);
  bool next_into(AllocFn alloc, void* user, size_t* len, int64_t timeout_ms = -1);

  /// Byte offset of the record last returned by next().
  uint64_t record_offset() const { return record_offset_; }
  /// Byte offset where the next record starts (for save/restore).
  uint64_t offset() const;
  /// Continue reading at byte `offset` (a record boundary that offset()
  /// returned). Throws INVALID_ARGUMENT when it lies beyond the file.
  void seek(uint64_t offset);
  /// Corrupt records skipped so far (skip_corrupt only).
  uint64_t skipped() const { return skipped_; }
  uint64_t file_size() const { return file_size_; }
  const std::string& path() const { return path_; }

 private:
  struct State;
  size_t fill(size_t need, int64_t timeout_ms);
  bool read_record(const uint8_t** data, size_t* len, int64_t timeout_ms, AllocFn alloc, void* user);
  void corrupt(uint64_t at, bool rest_of_file, const std::string& what);
  void finish_file();
  std::string path_;
  RecordReaderOptions options_;
  uint64_t file_size_ = 0;
  uint64_t record_offset_ = 0;
  uint64_t skipped_ = 0;
  bool at_end_ = false;    // no more records (end of file, or rest skipped)
  bool reported_ = false;  // per-file skip summary logged
  std::string failed_;     // the corruption error, repeated by every later next()
  std::unique_ptr<State> st_;
};

}  // namespace strata::sdk
