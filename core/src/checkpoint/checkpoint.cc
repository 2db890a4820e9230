// SPDX-License-Identifier: Apache-2.0
// Checkpoint and CheckpointManager (see strata/checkpoint.hpp for the
// contract). Durability follows the usual POSIX recipe: write into a
// temporary directory, fsync each file, fsync the directory, rename it into
// place, fsync the parent; rename(2) of a directory is atomic, so a reader
// sees either nothing or a complete checkpoint.
#include "strata/checkpoint.hpp"

#include <dirent.h>
#include <signal.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <system_error>

#include "api/kernels.h"
#include "checkpoint/safetensors.h"
#include "log.h"
#include "strata/distribute.hpp"
#include "strata/error.hpp"
#include "strata/sdk/records.hpp"

namespace strata {
namespace fs = std::filesystem;
using checkpoint::TensorEntry;

namespace {

constexpr const char* kFormat = "strata.checkpoint";
constexpr const char* kStepName = "step";

// errno -> the Error a caller can act on: a missing path is NotFound, a
// refused one PermissionDenied; anything else (disk full, I/O error) is
// Unavailable, which a caller may retry after freeing space.
[[noreturn]] void throw_errno(int err, const std::string& what, const std::string& path) {
  strata_status_t code = STRATA_ERR_UNAVAILABLE;
  if (err == ENOENT || err == ENOTDIR) code = STRATA_ERR_NOT_FOUND;
  if (err == EACCES || err == EPERM || err == EROFS) code = STRATA_ERR_PERMISSION_DENIED;
  STRATA_THROW(code, "checkpoint: ", what, " ", path, ": ", std::strerror(err));
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // close(2) can report a deferred write error: check it on the success path.
  void close_checked(const std::string& path) {
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) throw_errno(errno, "closing", path);
  }

 private:
  int fd_;
};

void write_all(int fd, const void* data, std::size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw_errno(errno, "writing", path);
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

void fsync_path(const std::string& path, bool directory) {
  Fd fd(::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC));
  if (fd.get() < 0) throw_errno(errno, "opening for fsync", path);
  if (::fsync(fd.get()) != 0) throw_errno(errno, "fsync of", path);
  fd.close_checked(path);
}

// The tensor file moves in pieces of kChunk bytes: one read(2)/write(2)
// each, and the CRC32C of a piece is computed while it is still in the
// CPU's cache (just read by the kernel, or about to be written from it),
// so the CRC costs no second trip through memory.
constexpr std::size_t kChunk = 1u << 20;
// Writeback of the tensor file is started every kWritebackBytes
// (sync_file_range), so that the disk writes while we copy the rest into
// the page cache and the final fsync waits for the tail only.
constexpr std::uint64_t kWritebackBytes = 32u << 20;
// A restore asks the kernel to read this far ahead of it
// (POSIX_FADV_WILLNEED), so that a cold file streams from the disk while
// the CPU copies and checks what has arrived.
constexpr std::uint64_t kPrefetchBytes = 64u << 20;

// Writes a file sequentially and computes the CRC32C of every byte written.
class CrcWriter {
 public:
  CrcWriter(int fd, const std::string& path) : fd_(fd), path_(path) {}
  // Write straight from `data` (no copy into a buffer of ours).
  void write(const void* data, std::size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const std::size_t k = std::min(n, kChunk);
      crc_ = sdk::crc32c_extend(crc_, p, k);
      write_all(fd_, p, k, path_);
      p += k;
      n -= k;
      written_ += k;
      if (written_ - flushed_ >= kWritebackBytes) {
        // Only a hint to start writeback early: its errors, if any, are
        // reported again by the fsync that follows.
        ::sync_file_range(fd_, static_cast<off_t>(flushed_), static_cast<off_t>(written_ - flushed_),
                          SYNC_FILE_RANGE_WRITE);
        flushed_ = written_;
      }
    }
  }
  std::uint32_t crc() const { return crc_; }
  std::uint64_t bytes() const { return written_; }

 private:
  int fd_;
  const std::string& path_;
  std::uint32_t crc_ = 0;
  std::uint64_t written_ = 0, flushed_ = 0;
};

// Reads a file sequentially, computing the CRC32C of every byte read, with
// the kernel prefetching ahead. A file that ends before `size` bytes
// (shrunk since it was opened) is a DataLossError naming it.
class CrcReader {
 public:
  explicit CrcReader(const std::string& path) : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)), path_(path) {
    if (fd_.get() < 0) throw_errno(errno, "opening", path);
    struct stat st {};
    if (::fstat(fd_.get(), &st) != 0) throw_errno(errno, "stat of", path);
    size_ = static_cast<std::uint64_t>(st.st_size);
    ::posix_fadvise(fd_.get(), 0, 0, POSIX_FADV_SEQUENTIAL);  // a hint; nothing depends on it
  }
  std::uint64_t size() const { return size_; }
  std::uint64_t offset() const { return offset_; }
  std::uint32_t crc() const { return crc_; }

  // The next `n` bytes into `dst`, or through a scratch buffer when `dst`
  // is null (bytes that are only checked).
  void read(void* dst, std::uint64_t n) {
    auto* p = static_cast<unsigned char*>(dst);
    if (p == nullptr && scratch_ == nullptr) scratch_ = std::make_unique<unsigned char[]>(kChunk);
    while (n > 0) {
      prefetch();
      const std::size_t k = static_cast<std::size_t>(std::min<std::uint64_t>(n, kChunk));
      unsigned char* to = p != nullptr ? p : scratch_.get();
      read_exact(to, k);
      crc_ = sdk::crc32c_extend(crc_, to, k);
      offset_ += k;
      n -= k;
      if (p != nullptr) p += k;
    }
  }
  // DataLossError unless the file ends exactly here (it may have grown
  // since fstat).
  void expect_end() {
    unsigned char extra;
    for (;;) {
      const ssize_t r = ::read(fd_.get(), &extra, 1);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) throw_errno(errno, "reading", path_);
      STRATA_ENFORCE(r == 0, STRATA_ERR_DATA_LOSS, "checkpoint file ", path_, " grew past ", offset_,
                     " bytes while it was read (replaced or written to)");
      return;
    }
  }

 private:
  void read_exact(unsigned char* to, std::size_t k) {
    std::size_t got = 0;
    while (got < k) {
      const ssize_t r = ::read(fd_.get(), to + got, k - got);
      if (r < 0) {
        if (errno == EINTR) continue;
        throw_errno(errno, "reading", path_);
      }
      STRATA_ENFORCE(r > 0, STRATA_ERR_DATA_LOSS, "checkpoint file ", path_, " ended at byte ", offset_ + got,
                     " of ", size_, " while it was read (truncated)");
      got += static_cast<std::size_t>(r);
    }
  }
  void prefetch() {
    const std::uint64_t want = std::min(size_, offset_ + kPrefetchBytes);
    // In steps of a quarter window, and the rest at the end of the file.
    if (prefetched_ >= want || (want < size_ && want - prefetched_ < kPrefetchBytes / 4)) return;
    ::posix_fadvise(fd_.get(), static_cast<off_t>(prefetched_), static_cast<off_t>(want - prefetched_),
                    POSIX_FADV_WILLNEED);
    prefetched_ = want;
  }

  Fd fd_;
  std::string path_;
  std::uint64_t size_ = 0, offset_ = 0, prefetched_ = 0;
  std::uint32_t crc_ = 0;
  std::unique_ptr<unsigned char[]> scratch_;
};

// Uninitialised 64-byte-aligned memory for a restore's staging copy of one
// tensor (no zero-fill: every byte is read from the file before use).
struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Staging = std::unique_ptr<unsigned char, FreeDeleter>;
Staging allocate_staging(std::uint64_t n) {
  const std::size_t bytes = static_cast<std::size_t>((std::max<std::uint64_t>(n, 1) + 63) / 64 * 64);
  void* p = std::aligned_alloc(64, bytes);
  if (p == nullptr) STRATA_THROW(STRATA_ERR_UNAVAILABLE, "checkpoint restore: cannot allocate ", n,
                                " bytes of memory to stage a tensor");
  return Staging(static_cast<unsigned char*>(p));
}

// Read a whole file; NotFoundError when it does not exist.
std::string read_file(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) throw_errno(errno, "opening", path);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw_errno(errno, "stat of", path);
  std::string out(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t got = 0;
  while (got < out.size()) {
    const ssize_t r = ::read(fd.get(), out.data() + got, out.size() - got);
    if (r < 0) {
      if (errno == EINTR) continue;
      throw_errno(errno, "reading", path);
    }
    if (r == 0) break;  // shrank under us: the size check below reports it
    got += static_cast<std::size_t>(r);
  }
  out.resize(got);
  return out;
}

// "dir/" and "dir" name the same checkpoint.
fs::path normalized(const std::string& dir) {
  STRATA_ENFORCE(!dir.empty(), STRATA_ERR_INVALID_ARGUMENT, "checkpoint directory must not be empty");
  fs::path p = fs::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p;
}

// Every worker's state bytes, gathered to every worker in worker order and
// framed as Checkpoint::kStateMagic says. Local replica 0 carries this
// worker's bytes, the others nothing, so the gather (replica order across
// workers) lists one state per worker.
void put_u32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
void put_u64(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
std::uint64_t get_le(const unsigned char* p, int n) {
  std::uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

Tensor gather_states(Strategy& strategy, const std::string& name, const std::string& mine) {
  const int local = strategy.num_local_replicas();
  const int workers = strategy.extended().num_workers();
  std::vector<std::string> all;
  if (workers <= 1) {
    all.push_back(mine);
  } else {
    // Collectives carry no uint8: the bytes travel as int32 words (zero
    // padded), their exact count alongside.
    std::vector<Tensor> bytes, lens;
    for (int r = 0; r < local; ++r) {
      const std::int64_t n = r == 0 ? static_cast<std::int64_t>(mine.size()) : 0;
      Tensor words = Tensor::zeros({(n + 3) / 4}, DType::kInt32);
      if (n > 0) std::memcpy(words.raw_data(), mine.data(), static_cast<std::size_t>(n));
      bytes.push_back(std::move(words));
      lens.push_back(r == 0 ? Tensor::from_vector(std::vector<std::int64_t>{n}, {1})
                            : Tensor::zeros({0}, DType::kInt64));
    }
    const Tensor sizes = strategy.gather(PerReplica(std::move(lens)), 0);
    const Tensor joined = strategy.gather(PerReplica(std::move(bytes)), 0);
    STRATA_ENFORCE(sizes.numel() == workers, STRATA_ERR_INTERNAL, "checkpoint state '", name, "': gathered ",
                   sizes.numel(), " sizes from ", workers, " workers");
    const char* p = static_cast<const char*>(joined.raw_data());
    std::size_t at = 0;
    for (std::int64_t w = 0; w < workers; ++w) {
      const auto n = static_cast<std::size_t>(sizes.data<std::int64_t>()[w]);
      STRATA_ENFORCE(at + n <= joined.nbytes(), STRATA_ERR_INTERNAL, "checkpoint state '", name,
                     "': gathered sizes exceed the gathered bytes");
      all.emplace_back(p + at, n);
      at += (n + 3) / 4 * 4;
    }
  }
  std::string framed(Checkpoint::kStateMagic, 4);
  put_u32(framed, 1);
  put_u32(framed, static_cast<std::uint32_t>(all.size()));
  for (const std::string& s : all) {
    put_u64(framed, s.size());
    framed += s;
  }
  const auto n = static_cast<std::int64_t>(framed.size());
  return Tensor::from_bytes(framed.data(), framed.size(), {n}, DType::kUInt8);
}

std::vector<std::string> split_states(const unsigned char* p, std::uint64_t n, const std::string& file,
                                      const std::string& name) {
  auto fail = [&](const std::string& why) -> void {
    STRATA_THROW(STRATA_ERR_DATA_LOSS, "checkpoint file ", file, ": state '", name, "' is corrupt: ", why);
  };
  if (n < 12 || std::memcmp(p, Checkpoint::kStateMagic, 4) != 0) fail("it does not start with a state header");
  if (get_le(p + 4, 4) != 1) fail("unknown state layout version " + std::to_string(get_le(p + 4, 4)));
  const std::uint64_t count = get_le(p + 8, 4);
  std::vector<std::string> out;
  std::uint64_t at = 12;
  for (std::uint64_t w = 0; w < count; ++w) {
    if (n - at < 8) fail("worker " + std::to_string(w) + "'s length is cut off");
    const std::uint64_t len = get_le(p + at, 8);
    at += 8;
    if (len > n - at) fail("worker " + std::to_string(w) + "'s state runs past the entry");
    out.emplace_back(reinterpret_cast<const char*>(p + at), static_cast<std::size_t>(len));
    at += len;
  }
  if (at != n) fail(std::to_string(n - at) + " bytes follow the last worker's state");
  if (count == 0) fail("it holds no worker's state");
  return out;
}

void check_cross_replica(const char* what) {
  STRATA_ENFORCE(!has_strategy() || in_cross_replica_context(), STRATA_ERR_FAILED_PRECONDITION,
                 "Checkpoint::", what,
                 " was called inside a replica function; call it in cross-replica context (outside "
                 "run, or inside strategy.scope())");
}

struct Manifest {
  std::string tensor_file;
  std::uint64_t bytes = 0;
  std::uint32_t crc = 0;
  std::optional<std::int64_t> step;
};

// Parse and validate dir/manifest.json. NotFoundError when it is absent,
// DataLossError naming it when it is not a manifest we can trust.
Manifest read_manifest(const fs::path& dir) {
  const std::string path = (dir / Checkpoint::kManifestFile).string();
  const std::string text = read_file(path);
  auto fail = [&](const std::string& why) -> void {
    STRATA_THROW(STRATA_ERR_DATA_LOSS, "checkpoint manifest ", path, " is corrupt: ", why);
  };
  const nlohmann::json m = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!m.is_object()) fail("it is not a JSON object");
  if (!m.contains("format") || m["format"] != kFormat) fail(std::string("its \"format\" is not \"") + kFormat + "\"");
  if (!m.contains("format_version") || !m["format_version"].is_number_integer())
    fail("it has no integer \"format_version\"");
  const int version = m["format_version"].get<int>();
  STRATA_ENFORCE(version <= Checkpoint::kFormatVersion, STRATA_ERR_UNIMPLEMENTED, "checkpoint ", path,
                 " has format version ", version, "; this Strata reads up to ", Checkpoint::kFormatVersion,
                 "; upgrade Strata to restore it");
  Manifest out;
  if (!m.contains("tensor_file") || !m["tensor_file"].is_string()) fail("it has no \"tensor_file\"");
  out.tensor_file = m["tensor_file"].get<std::string>();
  if (out.tensor_file.empty() || out.tensor_file.find('/') != std::string::npos || out.tensor_file[0] == '.')
    fail("its tensor_file '" + out.tensor_file + "' is not a plain file name");
  if (!m.contains("files") || !m["files"].is_object() || !m["files"].contains(out.tensor_file))
    fail("it does not describe " + out.tensor_file);
  const nlohmann::json& f = m["files"][out.tensor_file];
  if (!f.is_object() || !f.contains("bytes") || !f["bytes"].is_number_unsigned() || !f.contains("crc32c") ||
      !f["crc32c"].is_number_unsigned() || f["crc32c"].get<std::uint64_t>() > 0xFFFFFFFFu)
    fail("the entry of " + out.tensor_file + " lacks its bytes or crc32c");
  out.bytes = f["bytes"].get<std::uint64_t>();
  out.crc = static_cast<std::uint32_t>(f["crc32c"].get<std::uint64_t>());
  if (m.contains("step")) {
    if (!m["step"].is_number_integer()) fail("its \"step\" is not an integer");
    out.step = m["step"].get<std::int64_t>();
  }
  return out;
}

std::atomic<unsigned> g_tmp_counter{0};

bool is_temporary_name(const std::string& name) {
  return !name.empty() && name[0] == '.' && name.find(".tmp-") != std::string::npos;
}

// Rename `from` onto `to`, replacing an existing directory `to` atomically
// (RENAME_EXCHANGE, then the old one is deleted from its new name).
void rename_into_place(const fs::path& from, const fs::path& to) {
  if (::rename(from.c_str(), to.c_str()) == 0) return;
  const int err = errno;
  if (err != ENOTEMPTY && err != EEXIST) throw_errno(err, "renaming " + from.string() + " to", to.string());
  std::error_code ec;
  STRATA_ENFORCE(fs::is_directory(to, ec), STRATA_ERR_ALREADY_EXISTS, "checkpoint: ", to.string(),
                 " exists and is not a directory; not replacing it");
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_EXCHANGE) != 0)
    throw_errno(errno, "exchanging " + from.string() + " with", to.string());
  fs::remove_all(from, ec);  // the previous checkpoint, now under the temporary name
}

// The tensor file of a checkpoint, read once and checked in full.
struct CheckedFile {
  checkpoint::ParsedFile parsed;
  std::map<std::string, Staging> staged;  // the bytes of the entries `stage` chose, by name
};

// Read `file` once: the header into memory, each entry for which `stage`
// returns true straight into its own staging buffer, everything else only
// through the CRC. Returns only when the whole file checked out, with the
// errors and their order of reading the whole file first: its size against
// the manifest, then the CRC32C, then the header (DataLossError naming the
// file, NotFoundError when it is missing).
CheckedFile read_tensor_file(const std::string& file, const Manifest& manifest,
                             const std::function<bool(const TensorEntry&)>& stage) {
  CrcReader in(file);
  STRATA_ENFORCE(in.size() == manifest.bytes, STRATA_ERR_DATA_LOSS, "checkpoint file ", file, " has ", in.size(),
                 " bytes but its manifest says ", manifest.bytes, " (truncated or replaced)");
  std::string head(static_cast<std::size_t>(std::min<std::uint64_t>(8, in.size())), '\0');
  in.read(head.data(), head.size());
  std::uint64_t header_bytes = 0;
  if (head.size() == 8) std::memcpy(&header_bytes, head.data(), 8);
  if (head.size() == 8 && header_bytes <= checkpoint::kMaxHeaderBytes && header_bytes <= in.size() - 8) {
    head.resize(8 + static_cast<std::size_t>(header_bytes));
    in.read(head.data() + 8, header_bytes);
  }
  CheckedFile out;
  std::exception_ptr header_error;  // reported after the CRC, which takes precedence
  try {
    out.parsed = checkpoint::parse_header(reinterpret_cast<const unsigned char*>(head.data()), head.size(), in.size(),
                                          file);
  } catch (const Error&) {
    header_error = std::current_exception();
  }
  if (!header_error) {
    for (const TensorEntry& e : out.parsed.entries) {  // in data order, tiling the rest of the file
      STRATA_ENFORCE(in.offset() == out.parsed.data_start + e.begin, STRATA_ERR_INTERNAL, "checkpoint restore: at byte ",
                     in.offset(), " of ", file, " instead of tensor '", e.name, "'");
      if (stage(e)) {
        Staging& buf = out.staged[e.name];
        buf = allocate_staging(e.end - e.begin);
        in.read(buf.get(), e.end - e.begin);
      } else {
        in.read(nullptr, e.end - e.begin);
      }
    }
  }
  in.read(nullptr, in.size() - in.offset());  // what a bad header left unread
  in.expect_end();
  STRATA_ENFORCE(in.crc() == manifest.crc, STRATA_ERR_DATA_LOSS, "checkpoint file ", file,
                 " is corrupt: its CRC32C is ", in.crc(), " but its manifest says ", manifest.crc);
  if (header_error) std::rethrow_exception(header_error);
  return out;
}

}  // namespace

// ---------------------------------------------------------------- RestoreStatus

const RestoreStatus& RestoreStatus::assert_consumed() const {
  if (missing_.empty() && unused_.empty()) return *this;
  auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (const std::string& x : v) s += (s.empty() ? "'" : ", '") + x + "'";
    return s.empty() ? std::string("none") : s;
  };
  STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "checkpoint restore did not match every object: tracked but not in the checkpoint: ",
               join(missing_), "; in the checkpoint but not tracked: ", join(unused_));
}

// ---------------------------------------------------------------- Checkpoint

struct Checkpoint::Impl {
  enum class Kind { kVariable, kInt64, kDouble, kState };
  struct Object {
    Object(std::string n, Kind k) : name(std::move(n)), kind(k) {}
    std::string name;
    Kind kind;
    Variable* variable = nullptr;
    std::int64_t* i64 = nullptr;
    double* f64 = nullptr;
    State state;

    DType dtype() const {
      switch (kind) {
        case Kind::kVariable: return variable->dtype();
        case Kind::kInt64: return DType::kInt64;
        case Kind::kDouble: return DType::kFloat64;
        case Kind::kState: break;
      }
      return DType::kUInt8;
    }
    // A state's length is only known once saved: its shape is not checked.
    std::optional<std::vector<std::int64_t>> shape() const {
      if (kind == Kind::kState) return std::nullopt;
      return kind == Kind::kVariable ? variable->shape() : std::vector<std::int64_t>{};
    }
    // Whether a saved entry can be restored into this object.
    bool matches(const TensorEntry& e) const {
      const std::optional<std::vector<std::int64_t>> s = shape();
      return e.dtype == dtype() && (s ? e.shape == *s : e.shape.size() == 1);
    }
    const char* kind_name() const {
      switch (kind) {
        case Kind::kVariable: return "variable";
        case Kind::kInt64: return "int64";
        case Kind::kDouble: return "double";
        case Kind::kState: break;
      }
      return "state";
    }
    std::string label() const {
      return kind == Kind::kVariable ? "variable '" + name + "' (Variable '" + variable->name() + "')"
                                     : std::string(kind_name()) + " '" + name + "'";
    }
  };
  std::vector<Object> objects;

  void add(Object o) {
    STRATA_ENFORCE(!o.name.empty() && o.name != "__metadata__", STRATA_ERR_INVALID_ARGUMENT,
                   "checkpoint object names must be non-empty and not \"__metadata__\"; got '", o.name, "'");
    for (const Object& x : objects)
      STRATA_ENFORCE(x.name != o.name, STRATA_ERR_INVALID_ARGUMENT, "checkpoint already tracks an object named '",
                     o.name, "'; names must be unique");
    objects.push_back(std::move(o));
  }

  const std::int64_t* step() const {
    for (const Object& o : objects)
      if (o.kind == Kind::kInt64 && o.name == kStepName) return o.i64;
    return nullptr;
  }

  Strategy& strategy() const {
    for (const Object& o : objects)
      if (o.kind == Kind::kVariable) return o.variable->strategy();
    return get_strategy();
  }
};

Checkpoint::Checkpoint() : impl_(std::make_unique<Impl>()) {}
Checkpoint::Checkpoint(Checkpoint&& o) noexcept = default;
Checkpoint& Checkpoint::operator=(Checkpoint&& o) noexcept = default;
Checkpoint::~Checkpoint() = default;

Checkpoint& Checkpoint::track(const std::string& name, Variable& variable) {
  Impl::Object o{name, Impl::Kind::kVariable};
  o.variable = &variable;
  impl_->add(std::move(o));
  return *this;
}

Checkpoint& Checkpoint::track(const std::string& name, std::int64_t* value) {
  STRATA_ENFORCE(value != nullptr, STRATA_ERR_INVALID_ARGUMENT, "checkpoint object '", name, "' is a null pointer");
  Impl::Object o{name, Impl::Kind::kInt64};
  o.i64 = value;
  impl_->add(std::move(o));
  return *this;
}

Checkpoint& Checkpoint::track_state(const std::string& name, State state) {
  STRATA_ENFORCE(state.save && state.restore, STRATA_ERR_INVALID_ARGUMENT, "checkpoint state '", name,
                 "' needs both a save and a restore function");
  Impl::Object o{name, Impl::Kind::kState};
  o.state = std::move(state);
  impl_->add(std::move(o));
  return *this;
}

Checkpoint& Checkpoint::track(const std::string& name, DistributedIterator& iterator) {
  return track_state(name, {[&iterator] { return iterator.save_state(); },
                            [&iterator](const std::vector<std::string>& all) { iterator.restore_state(all); }});
}

Checkpoint& Checkpoint::track(const std::string& name, DatasetIterator& iterator) {
  Impl* impl = impl_.get();
  return track_state(name, {[&iterator] { return iterator.save_state(); },
                            [&iterator, impl, name](const std::vector<std::string>& all) {
                              const StrategyExtended& ext = impl->strategy().extended();
                              STRATA_ENFORCE(static_cast<int>(all.size()) == ext.num_workers(),
                                             STRATA_ERR_INVALID_ARGUMENT, "checkpoint object '", name,
                                             "' holds the input position of ", all.size(),
                                             " worker(s), but this job has ", ext.num_workers(),
                                             "; a DatasetIterator resumes only with the same worker count (a "
                                             "distributed iterator with DATA sharding can change it)");
                              iterator.restore_state(all[static_cast<std::size_t>(ext.worker_index())]);
                            }});
}

Checkpoint& Checkpoint::track(const std::string& name, double* value) {
  STRATA_ENFORCE(value != nullptr, STRATA_ERR_INVALID_ARGUMENT, "checkpoint object '", name, "' is a null pointer");
  Impl::Object o{name, Impl::Kind::kDouble};
  o.f64 = value;
  impl_->add(std::move(o));
  return *this;
}

std::optional<std::int64_t> Checkpoint::step() const {
  if (const std::int64_t* s = impl_->step()) return *s;
  return std::nullopt;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  for (const Impl::Object& o : impl_->objects) out.push_back(o.name);
  return out;
}

bool Checkpoint::save(const std::string& dir) const {
  check_cross_replica("save");
  const fs::path final_path = normalized(dir);
  // Read everything first, on every worker: an ON_READ read may be a
  // collective, and a failed read must not leave a temporary behind.
  std::vector<const Impl::Object*> order;
  for (const Impl::Object& o : impl_->objects) order.push_back(&o);
  std::sort(order.begin(), order.end(), [](const Impl::Object* a, const Impl::Object* b) { return a->name < b->name; });
  // An ON_WRITE variable's cross-replica value is its primary copy: write
  // it from the strategy's memory (read_view) instead of copying it first.
  // ON_READ values are aggregates and need the read.
  std::vector<Tensor> owned;  // copies that `values` points into
  std::vector<TensorView> values;
  std::vector<TensorEntry> entries;
  std::uint64_t at = 0;
  Strategy& strategy = impl_->strategy();
  owned.reserve(order.size());
  values.reserve(order.size());
  for (const Impl::Object* o : order) {
    std::optional<TensorView> view;
    if (o->kind == Impl::Kind::kVariable && o->variable->synchronization() != Synchronization::ON_READ)
      view = o->variable->read_view();
    if (!view || !view->is_contiguous()) {
      Tensor t = o->kind == Impl::Kind::kVariable ? o->variable->value()
                 : o->kind == Impl::Kind::kInt64  ? Tensor::scalar(*o->i64)
                 : o->kind == Impl::Kind::kDouble ? Tensor::scalar(*o->f64)
                                                  : gather_states(strategy, o->name, o->state.save());
      if (!TensorView(t).is_contiguous()) t = Tensor::copy_of(t);
      owned.push_back(std::move(t));
      view.emplace(owned.back());
    }
    TensorEntry e{o->name, view->dtype(), view->shape(), at, at + view->nbytes()};
    at = e.end;
    entries.push_back(std::move(e));
    values.push_back(*view);
  }
  StrategyExtended& ext = strategy.extended();
  if (!ext.is_chief()) return false;

  const fs::path parent = final_path.has_parent_path() ? final_path.parent_path() : fs::path(".");
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) throw_errno(ec.value(), "creating directory", parent.string());
  const fs::path tmp = parent / ("." + final_path.filename().string() + ".tmp-" + std::to_string(::getpid()) + "-" +
                                 std::to_string(g_tmp_counter.fetch_add(1)));
  if (::mkdir(tmp.c_str(), 0755) != 0) throw_errno(errno, "creating directory", tmp.string());
  try {
    std::map<std::string, std::string> metadata{{"format", kFormat},
                                                {"format_version", std::to_string(kFormatVersion)}};
    const std::string header = checkpoint::encode_header(entries, metadata);
    const std::string tensor_path = (tmp / kTensorFile).string();
    std::uint32_t crc = 0;
    {
      Fd fd(::open(tensor_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
      if (fd.get() < 0) throw_errno(errno, "creating", tensor_path);
      CrcWriter out(fd.get(), tensor_path);
      out.write(header.data(), header.size());
      for (const TensorView& v : values) out.write(v.raw_data(), v.nbytes());
      STRATA_ENFORCE(out.bytes() == header.size() + at, STRATA_ERR_INTERNAL, "checkpoint: wrote ", out.bytes(),
                     " bytes to ", tensor_path, " instead of ", header.size() + at);
      crc = out.crc();
      if (::fsync(fd.get()) != 0) throw_errno(errno, "fsync of", tensor_path);
      fd.close_checked(tensor_path);
    }
    nlohmann::json objects = nlohmann::json::object();
    for (const Impl::Object* o : order) {
      nlohmann::json j = {{"kind", o->kind_name()}};
      if (o->kind == Impl::Kind::kVariable) {
        j["variable"] = o->variable->name();
        j["synchronization"] = synchronization_name(o->variable->synchronization());
        j["aggregation"] = aggregation_name(o->variable->aggregation());
      }
      objects[o->name] = std::move(j);
    }
    nlohmann::json manifest = {
        {"format", kFormat},
        {"format_version", kFormatVersion},
        {"tensor_file", kTensorFile},
        {"files", {{kTensorFile, {{"bytes", header.size() + at}, {"crc32c", crc}}}}},
        {"objects", std::move(objects)},
        {"written_by",
         {{"strategy", strategy.name()},
          {"num_replicas_in_sync", strategy.num_replicas_in_sync()},
          {"num_workers", ext.num_workers()},
          {"worker_index", ext.worker_index()}}}};
    if (const std::int64_t* step = impl_->step()) manifest["step"] = *step;
    const std::string text = manifest.dump(2) + "\n";
    const std::string manifest_path = (tmp / kManifestFile).string();
    {
      Fd fd(::open(manifest_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
      if (fd.get() < 0) throw_errno(errno, "creating", manifest_path);
      write_all(fd.get(), text.data(), text.size(), manifest_path);
      if (::fsync(fd.get()) != 0) throw_errno(errno, "fsync of", manifest_path);
      fd.close_checked(manifest_path);
    }
    fsync_path(tmp.string(), /*directory=*/true);
    rename_into_place(tmp, final_path);
    fsync_path(parent.string(), /*directory=*/true);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  return true;
}

RestoreStatus Checkpoint::restore(const std::string& dir, const RestoreOptions& options) const {
  check_cross_replica("restore");
  const fs::path path = normalized(dir);
  std::error_code ec;
  STRATA_ENFORCE(fs::is_directory(path, ec), STRATA_ERR_NOT_FOUND, "checkpoint directory ", path.string(),
                 " does not exist");
  const Manifest manifest = read_manifest(path);
  const std::string file = (path / manifest.tensor_file).string();

  // Read and check the whole file, staging the tensors that tracked objects
  // can take (the others are reported below or ignored), then check the
  // objects, then assign.
  std::map<std::string, const Impl::Object*> tracked;
  for (const Impl::Object& o : impl_->objects) tracked[o.name] = &o;
  const CheckedFile checked = read_tensor_file(file, manifest, [&](const TensorEntry& e) {
    auto it = tracked.find(e.name);
    return it != tracked.end() && it->second->matches(e);
  });
  const checkpoint::ParsedFile& parsed = checked.parsed;
  std::map<std::string, const TensorEntry*> by_name;
  for (const TensorEntry& e : parsed.entries) by_name[e.name] = &e;

  // Check every object before assigning any (never a partial restore).
  RestoreStatus status;
  status.step_ = manifest.step;
  std::vector<std::pair<const Impl::Object*, const TensorEntry*>> plan;
  for (const Impl::Object& o : impl_->objects) {
    auto it = by_name.find(o.name);
    if (it == by_name.end()) {
      STRATA_ENFORCE(options.allow_missing, STRATA_ERR_NOT_FOUND, "checkpoint ", path.string(), " has no ",
                     o.label(), "; restore with RestoreOptions::expect_partial() to keep its current value");
      status.missing_.push_back(o.name);
      continue;
    }
    const TensorEntry& e = *it->second;
    const std::optional<std::vector<std::int64_t>> shape = o.shape();
    STRATA_ENFORCE(o.matches(e), STRATA_ERR_INVALID_ARGUMENT, "checkpoint ", file, " holds ", o.label(), " as ",
                   dtype_name(e.dtype), detail::shape_string(e.shape), " but it is ", dtype_name(o.dtype()),
                   shape ? detail::shape_string(*shape) : std::string("[bytes]"));
    STRATA_ENFORCE(checked.staged.count(e.name) == 1, STRATA_ERR_INTERNAL, "checkpoint restore: ", o.label(),
                   " was not staged");
    plan.emplace_back(&o, &e);
    by_name.erase(it);
  }
  for (const auto& kv : by_name) status.unused_.push_back(kv.first);

  // States first: the objects most likely to refuse (an input saved by
  // another number of workers) refuse before any variable changed. Every
  // state is decoded before the first is handed over.
  std::vector<std::vector<std::string>> states(plan.size());
  for (std::size_t i = 0; i < plan.size(); ++i)
    if (plan[i].first->kind == Impl::Kind::kState)
      states[i] = split_states(checked.staged.at(plan[i].second->name).get(),
                               plan[i].second->end - plan[i].second->begin, file, plan[i].first->name);
  for (std::size_t i = 0; i < plan.size(); ++i)
    if (plan[i].first->kind == Impl::Kind::kState) plan[i].first->state.restore(states[i]);
  for (const auto& [o, e] : plan) {
    unsigned char* src = checked.staged.at(e->name).get();
    switch (o->kind) {
      case Impl::Kind::kState: break;
      case Impl::Kind::kVariable:
        // Staging is 64-byte aligned (the file's offsets promise no alignment).
        o->variable->assign(TensorView(src, e->shape, e->dtype));
        break;
      case Impl::Kind::kInt64: std::memcpy(o->i64, src, sizeof(std::int64_t)); break;
      case Impl::Kind::kDouble: std::memcpy(o->f64, src, sizeof(double)); break;
    }
    status.restored_.push_back(o->name);
  }
  return status;
}

bool is_checkpoint(const std::string& dir) {
  try {
    const fs::path path = normalized(dir);
    const Manifest m = read_manifest(path);
    std::error_code ec;
    const std::uintmax_t size = fs::file_size(path / m.tensor_file, ec);
    return !ec && size == m.bytes;
  } catch (const Error&) {
    return false;
  }
}

// ---------------------------------------------------------------- CheckpointManager

namespace {

// Complete "ckpt-<step>" checkpoints under `directory`, oldest first.
std::vector<std::pair<std::int64_t, std::string>> list_checkpoints(const std::string& directory) {
  static const std::regex kName("ckpt-(0|[1-9][0-9]{0,17})");
  std::vector<std::pair<std::int64_t, std::string>> out;
  std::error_code ec;
  for (fs::directory_iterator it(directory, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::smatch m;
    if (!std::regex_match(name, m, kName)) continue;
    if (!is_checkpoint(it->path().string())) continue;
    out.emplace_back(std::stoll(m[1].str()), it->path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Delete a checkpoint so that no moment of the deletion looks complete:
// first rename it to a temporary name, then remove that.
void delete_checkpoint(const fs::path& path) {
  const fs::path doomed = path.parent_path() / ("." + path.filename().string() + ".tmp-del-" +
                                                std::to_string(::getpid()) + "-" + std::to_string(g_tmp_counter.fetch_add(1)));
  std::error_code ec;
  fs::rename(path, doomed, ec);
  if (ec) throw_errno(ec.value(), "renaming for deletion", path.string());
  fs::remove_all(doomed, ec);
}

}  // namespace

CheckpointManager::CheckpointManager(Checkpoint& checkpoint, std::string directory, int max_to_keep)
    : checkpoint_(&checkpoint), directory_(std::move(directory)), max_to_keep_(max_to_keep) {
  STRATA_ENFORCE(max_to_keep >= 0, STRATA_ERR_INVALID_ARGUMENT, "max_to_keep must be >= 0 (0 keeps every checkpoint); got ",
                 max_to_keep);
  STRATA_ENFORCE(!directory_.empty(), STRATA_ERR_INVALID_ARGUMENT, "checkpoint directory must not be empty");
}

std::string CheckpointManager::save(std::int64_t step) {
  STRATA_ENFORCE(step >= 0, STRATA_ERR_INVALID_ARGUMENT, "checkpoint step must be >= 0; got ", step);
  const std::string path = (fs::path(directory_) / ("ckpt-" + std::to_string(step))).string();
  if (!checkpoint_->save(path)) return path;
  // Temporaries of saves that crashed (this process is the only writer).
  std::error_code ec;
  for (fs::directory_iterator it(directory_, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(".ckpt-", 0) == 0 && is_temporary_name(name)) {
      std::error_code rm;
      fs::remove_all(it->path(), rm);
      if (rm) detail::logger("core")->warn("checkpoint: could not remove temporary {}: {}", it->path().string(), rm.message());
    }
  }
  if (max_to_keep_ > 0) {
    auto all = list_checkpoints(directory_);
    for (std::size_t i = 0; i + static_cast<std::size_t>(max_to_keep_) < all.size(); ++i)
      delete_checkpoint(all[i].second);
  }
  return path;
}

void CheckpointManager::delete_all() {
  for (const std::string& path : checkpoints()) delete_checkpoint(path);
  std::error_code ec;
  fs::remove(directory_, ec);  // only when empty: never the user's other files
}

std::optional<std::string> CheckpointManager::latest_checkpoint() const { return strata::latest_checkpoint(directory_); }

std::vector<std::string> CheckpointManager::checkpoints() const {
  std::vector<std::string> out;
  for (auto& [step, path] : list_checkpoints(directory_)) out.push_back(std::move(path));
  return out;
}

std::optional<RestoreStatus> CheckpointManager::restore_or_initialize(const RestoreOptions& options) {
  const std::optional<std::string> latest = latest_checkpoint();
  if (!latest) return std::nullopt;
  return checkpoint_->restore(*latest, options);
}

std::optional<std::string> latest_checkpoint(const std::string& directory) {
  auto all = list_checkpoints(directory);
  if (all.empty()) return std::nullopt;
  return all.back().second;
}

// ---------------------------------------------------------------- BackupAndRestore

namespace {

// SIGTERM seen since the first BackupAndRestore with save_on_sigterm
// installed the handler; shared by all of them (a process has one).
std::atomic<bool> g_sigterm_seen{false};
std::atomic<int> g_handler_users{0};
struct sigaction g_previous_sigterm {};

extern "C" void strata_backup_on_sigterm(int) { g_sigterm_seen.store(true); }

BackupOptions every_n(std::int64_t n) {
  BackupOptions o;
  o.save_every_steps = n;
  return o;
}

}  // namespace

BackupAndRestore::BackupAndRestore(Checkpoint& checkpoint, std::string directory, std::int64_t save_every_steps)
    : BackupAndRestore(checkpoint, std::move(directory), every_n(save_every_steps)) {}

BackupAndRestore::BackupAndRestore(Checkpoint& checkpoint, std::string directory, const BackupOptions& options)
    : checkpoint_(&checkpoint),
      options_(options),
      manager_(checkpoint, std::move(directory), std::max(options.max_to_keep, 1)) {
  STRATA_ENFORCE(options.save_every_steps > 0, STRATA_ERR_INVALID_ARGUMENT,
                 "BackupAndRestore: save_every_steps must be > 0; got ", options.save_every_steps);
  STRATA_ENFORCE(options.max_to_keep >= 1, STRATA_ERR_INVALID_ARGUMENT,
                 "BackupAndRestore: max_to_keep must be >= 1; got ", options.max_to_keep);
  STRATA_ENFORCE(checkpoint.step().has_value(), STRATA_ERR_INVALID_ARGUMENT,
                 "BackupAndRestore: the checkpoint tracks no int64 named \"step\"; track the training loop's step "
                 "counter with checkpoint.track(\"step\", &step) so that a backup knows where to resume");
  if (options.save_on_sigterm && g_handler_users.fetch_add(1) == 0) {
    struct sigaction sa {};
    sa.sa_handler = strata_backup_on_sigterm;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    ::sigaction(SIGTERM, &sa, &g_previous_sigterm);
  }
  handler_installed_ = options.save_on_sigterm;
}

BackupAndRestore::~BackupAndRestore() {
  if (handler_installed_ && g_handler_users.fetch_sub(1) == 1) ::sigaction(SIGTERM, &g_previous_sigterm, nullptr);
}

std::optional<std::int64_t> BackupAndRestore::restore() {
  const std::optional<std::string> latest = manager_.latest_checkpoint();
  if (!latest) return std::nullopt;
  checkpoint_->restore(*latest);
  last_saved_ = *checkpoint_->step();
  detail::logger("core")->info("BackupAndRestore: resumed from {} (step {})", *latest, last_saved_);
  return last_saved_;
}

bool BackupAndRestore::step_end() {
  const std::int64_t step = *checkpoint_->step();
  bool stop = false;
  if (handler_installed_) {
    // Workers see the signal at different steps: agree on it, so that all
    // of them save the same step (a collective, as the save itself).
    const double mine = g_sigterm_seen.load() ? 1.0 : 0.0;
    Strategy& strategy = checkpoint_->impl_->strategy();
    stop = strategy.reduce(ReduceOp::MEAN, Tensor::scalar(mine)).data<double>()[0] > 0;
  }
  if (!stop && step % options_.save_every_steps != 0) return false;
  if (step == last_saved_) {  // e.g. restored at this very step
    preempted_ = stop;
    return false;
  }
  manager_.save(step);
  last_saved_ = step;
  if (stop) {
    preempted_ = true;
    detail::logger("core")->warn("BackupAndRestore: SIGTERM received; saved a backup at step {} in {}", step,
                                 manager_.directory());
  }
  return true;
}

std::string BackupAndRestore::save() {
  const std::int64_t step = *checkpoint_->step();
  const std::string path = manager_.save(step);
  last_saved_ = step;
  return path;
}

void BackupAndRestore::training_end() {
  if (!options_.delete_on_completion || preempted_) return;
  Strategy& strategy = checkpoint_->impl_->strategy();
  if (!strategy.extended().is_chief()) return;
  manager_.delete_all();
}

}  // namespace strata
