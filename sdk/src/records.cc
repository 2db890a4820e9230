// SPDX-License-Identifier: Apache-2.0
// CRC32C and TFRecord-format record files (see strata/sdk/records.hpp).
#include "strata/sdk/records.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "strata/error.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#include <nmmintrin.h>
#define STRATA_CRC32C_X86 1
#else
#define STRATA_CRC32C_X86 0
#endif

namespace strata::sdk {
namespace {

// Reflected Castagnoli polynomial.
constexpr uint32_t kPoly = 0x82f63b78u;

inline uint64_t load_le64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap64(v);
#endif
  return v;
}
inline uint32_t load_le32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap32(v);
#endif
  return v;
}
inline void store_le64(uint8_t* p, uint64_t v) {
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap64(v);
#endif
  std::memcpy(p, &v, 8);
}
inline void store_le32(uint8_t* p, uint32_t v) {
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap32(v);
#endif
  std::memcpy(p, &v, 4);
}

// ------------------------------------------------ slicing-by-8 fallback ---

struct SliceTables {
  uint32_t t[8][256];
  SliceTables() {
    for (uint32_t n = 0; n < 256; ++n) {
      uint32_t c = n;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
      t[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; ++n)
      for (int k = 1; k < 8; ++k) t[k][n] = (t[k - 1][n] >> 8) ^ t[0][t[k - 1][n] & 0xff];
  }
};
const SliceTables& slice_tables() {
  static const SliceTables tables;
  return tables;
}

// ----------------------------------------- combining interleaved streams ---
// The hardware path runs three independent CRCs over three adjacent blocks
// (the crc32 instruction has a latency of 3 cycles and a throughput of 1, so
// one stream uses a third of the unit). Joining them needs "this CRC
// followed by N zero bytes", a linear map over GF(2) that we precompute as
// four 256-entry tables per block length.

uint32_t gf2_times(const uint32_t* mat, uint32_t vec) {
  uint32_t sum = 0;
  for (; vec != 0; vec >>= 1, ++mat)
    if (vec & 1) sum ^= *mat;
  return sum;
}
void gf2_square(uint32_t* square, const uint32_t* mat) {
  for (int n = 0; n < 32; ++n) square[n] = gf2_times(mat, mat[n]);
}

struct ZerosTable {
  uint32_t t[4][256];
  // Operator for `len` zero bytes; len must be a power of two.
  explicit ZerosTable(size_t len) {
    uint32_t op[32], sq[32];
    // One zero bit.
    op[0] = kPoly;
    for (int n = 1; n < 32; ++n) op[n] = 1u << (n - 1);
    // Square log2(8 * len) times: 1 bit -> 8 * len bits.
    size_t bits = 1;
    while (bits < 8 * len) {
      gf2_square(sq, op);
      std::memcpy(op, sq, sizeof op);
      bits <<= 1;
    }
    for (uint32_t n = 0; n < 256; ++n)
      for (int k = 0; k < 4; ++k) t[k][n] = gf2_times(op, n << (8 * k));
  }
  uint32_t shift(uint32_t crc) const {
    return t[0][crc & 0xff] ^ t[1][(crc >> 8) & 0xff] ^ t[2][(crc >> 16) & 0xff] ^ t[3][crc >> 24];
  }
};

constexpr size_t kLongBlock = 8192;
constexpr size_t kShortBlock = 256;

const ZerosTable& long_zeros() {
  static const ZerosTable t(kLongBlock);
  return t;
}
const ZerosTable& short_zeros() {
  static const ZerosTable t(kShortBlock);
  return t;
}

#if STRATA_CRC32C_X86
// Three CRCs over the adjacent blocks p, p + block, p + 2 * block for as
// long as 3 * block bytes remain, joined into c0.
__attribute__((target("sse4.2"))) inline void crc32c_triple(uint64_t& c0, const uint8_t*& p, size_t& len,
                                                            size_t block, const ZerosTable& z) {
  while (len >= 3 * block) {
    uint64_t c1 = 0, c2 = 0;
    const uint8_t* end = p + block;
    do {
      uint64_t a, b, c;
      std::memcpy(&a, p, 8);
      std::memcpy(&b, p + block, 8);
      std::memcpy(&c, p + 2 * block, 8);
      c0 = _mm_crc32_u64(c0, a);
      c1 = _mm_crc32_u64(c1, b);
      c2 = _mm_crc32_u64(c2, c);
      p += 8;
    } while (p < end);
    c0 = z.shift(static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c1);
    c0 = z.shift(static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c2);
    p += 2 * block;
    len -= 3 * block;
  }
}

// Carry-less multiplication folding (VPCLMULQDQ on 512-bit registers),
// for CPUs that have it: 256 bytes per step in four accumulators, each
// 128-bit lane folded forward by multiplying its halves with x^(D+63) and
// x^(D-1) mod P (D = the distance in bits; the -1 absorbs the one-bit shift
// of a carry-less product of bit-reflected operands). The 128 bits left at
// the end are congruent to the whole prefix modulo P, so the crc32
// instruction over those 16 bytes (from 0) gives the CRC register.
struct FoldConstants {
  // reflect64(x^n mod P) for the fold distances used below.
  static uint64_t xpow_reflected(uint32_t n) {
    uint64_t r = 1;  // normal representation, bit i = x^i
    for (uint32_t i = 0; i < n; ++i) {
      r <<= 1;
      if (r & (uint64_t{1} << 32)) r ^= 0x11EDC6F41ull;
    }
    uint64_t out = 0;
    for (int i = 0; i < 64; ++i)
      if (r & (uint64_t{1} << i)) out |= uint64_t{1} << (63 - i);
    return out;
  }
  struct Pair {
    uint64_t lo, hi;  // multiplier of the first 8 bytes, of the last 8 bytes
  };
  static Pair for_distance(uint32_t bits) { return {xpow_reflected(bits + 63), xpow_reflected(bits - 1)}; }
  Pair d2048 = for_distance(2048), d1536 = for_distance(1536), d1024 = for_distance(1024), d512 = for_distance(512),
       d384 = for_distance(384), d256 = for_distance(256), d128 = for_distance(128);
};
const FoldConstants& fold_constants() {
  static const FoldConstants k;
  return k;
}

bool detect_fold() {
#if STRATA_CRC32C_X86
  __builtin_cpu_init();
  return __builtin_cpu_supports("sse4.2") && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("vpclmulqdq");
#else
  return false;
#endif
}
bool fold_available() {
  static const bool have = detect_fold();
  return have;
}

#define STRATA_FOLD_TARGET __attribute__((target("sse4.2,avx512f,avx512vl,vpclmulqdq")))

STRATA_FOLD_TARGET inline __m512i fold512(__m512i x, __m512i k) {
  return _mm512_xor_si512(_mm512_clmulepi64_epi128(x, k, 0x00), _mm512_clmulepi64_epi128(x, k, 0x11));
}
STRATA_FOLD_TARGET inline __m512i broadcast_pair(FoldConstants::Pair p) {
  return _mm512_set_epi64(static_cast<long long>(p.hi), static_cast<long long>(p.lo), static_cast<long long>(p.hi),
                          static_cast<long long>(p.lo), static_cast<long long>(p.hi), static_cast<long long>(p.lo),
                          static_cast<long long>(p.hi), static_cast<long long>(p.lo));
}

// CRC register `reg` (not inverted) continued over len bytes, len a
// multiple of 256 and at least 256. With Copy, the bytes are also stored to
// `dst` from the registers they were loaded into (one pass over the data).
template <bool Copy>
STRATA_FOLD_TARGET uint32_t crc32c_fold(uint32_t reg, const uint8_t* p, size_t len, uint8_t* dst) {
  const FoldConstants& k = fold_constants();
  __m512i a0 = _mm512_loadu_si512(p);
  __m512i a1 = _mm512_loadu_si512(p + 64);
  __m512i a2 = _mm512_loadu_si512(p + 128);
  __m512i a3 = _mm512_loadu_si512(p + 192);
  if constexpr (Copy) {
    _mm512_storeu_si512(dst, a0);
    _mm512_storeu_si512(dst + 64, a1);
    _mm512_storeu_si512(dst + 128, a2);
    _mm512_storeu_si512(dst + 192, a3);
    dst += 256;
  }
  // The register so far acts like an XOR into the first four bytes.
  a0 = _mm512_xor_si512(a0, _mm512_castsi128_si512(_mm_cvtsi32_si128(static_cast<int>(reg))));
  p += 256;
  len -= 256;
  const __m512i k2048 = broadcast_pair(k.d2048);
  while (len >= 256) {
    const __m512i b0 = _mm512_loadu_si512(p);
    const __m512i b1 = _mm512_loadu_si512(p + 64);
    const __m512i b2 = _mm512_loadu_si512(p + 128);
    const __m512i b3 = _mm512_loadu_si512(p + 192);
    if constexpr (Copy) {
      _mm512_storeu_si512(dst, b0);
      _mm512_storeu_si512(dst + 64, b1);
      _mm512_storeu_si512(dst + 128, b2);
      _mm512_storeu_si512(dst + 192, b3);
      dst += 256;
    }
    a0 = _mm512_xor_si512(fold512(a0, k2048), b0);
    a1 = _mm512_xor_si512(fold512(a1, k2048), b1);
    a2 = _mm512_xor_si512(fold512(a2, k2048), b2);
    a3 = _mm512_xor_si512(fold512(a3, k2048), b3);
    p += 256;
    len -= 256;
  }
  // Everything onto a3 (the last 64 bytes), then its lanes onto lane 3.
  a3 = _mm512_ternarylogic_epi64(a3, fold512(a0, broadcast_pair(k.d1536)), fold512(a1, broadcast_pair(k.d1024)), 0x96);
  a3 = _mm512_xor_si512(a3, fold512(a2, broadcast_pair(k.d512)));
  const __m512i lanes = _mm512_set_epi64(0, 0, static_cast<long long>(k.d128.hi), static_cast<long long>(k.d128.lo),
                                         static_cast<long long>(k.d256.hi), static_cast<long long>(k.d256.lo),
                                         static_cast<long long>(k.d384.hi), static_cast<long long>(k.d384.lo));
  const __m512i t = fold512(a3, lanes);  // lane 3 of t is 0
  alignas(64) uint64_t tv[8], av[8];
  _mm512_store_si512(tv, t);
  _mm512_store_si512(av, a3);
  const uint64_t lo = tv[0] ^ tv[2] ^ tv[4] ^ av[6];
  const uint64_t hi = tv[1] ^ tv[3] ^ tv[5] ^ av[7];
  uint64_t c = _mm_crc32_u64(0, lo);
  c = _mm_crc32_u64(c, hi);
  return static_cast<uint32_t>(c);
}

__attribute__((target("sse4.2"))) uint32_t crc32c_hw_impl(uint32_t crc, const uint8_t* p, size_t len,
                                                           bool use_fold) {
  uint64_t c0 = ~crc;
  if (use_fold && len >= 512) {
    const size_t n = len / 256 * 256;
    c0 = crc32c_fold<false>(static_cast<uint32_t>(c0), p, n, nullptr);
    p += n;
    len -= n;
  }
  // Align to 8 bytes so the 64-bit loads never straddle a cache line.
  while (len > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    c0 = _mm_crc32_u8(static_cast<uint32_t>(c0), *p++);
    --len;
  }
  if (len >= 3 * kShortBlock) {
    crc32c_triple(c0, p, len, kLongBlock, long_zeros());
    crc32c_triple(c0, p, len, kShortBlock, short_zeros());
  }
  while (len >= 8) {
    uint64_t a;
    std::memcpy(&a, p, 8);
    c0 = _mm_crc32_u64(c0, a);
    p += 8;
    len -= 8;
  }
  while (len > 0) {
    c0 = _mm_crc32_u8(static_cast<uint32_t>(c0), *p++);
    --len;
  }
  return ~static_cast<uint32_t>(c0);
}
#endif

bool detect_hw() {
#if STRATA_CRC32C_X86
  __builtin_cpu_init();
  return __builtin_cpu_supports("sse4.2");
#else
  return false;
#endif
}

}  // namespace

bool crc32c_hw_available() {
  static const bool have = detect_hw();
  return have;
}

const char* crc32c_implementation() {
#if STRATA_CRC32C_X86
  if (!crc32c_hw_available()) return "table";
  return fold_available() ? "avx512-vpclmulqdq+sse4.2" : "sse4.2";
#else
  return "table";
#endif
}

uint32_t crc32c_extend_sw(uint32_t crc, const void* data, size_t len) {
  const auto& t = slice_tables().t;
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  while (len > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    c = (c >> 8) ^ t[0][(c ^ *p++) & 0xff];
    --len;
  }
  while (len >= 8) {
    const uint32_t lo = load_le32(p) ^ c;
    const uint32_t hi = load_le32(p + 4);
    c = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^
        t[3][hi & 0xff] ^ t[2][(hi >> 8) & 0xff] ^ t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
    p += 8;
    len -= 8;
  }
  while (len > 0) {
    c = (c >> 8) ^ t[0][(c ^ *p++) & 0xff];
    --len;
  }
  return ~c;
}

uint32_t crc32c_extend_sse42(uint32_t crc, const void* data, size_t len) {
#if STRATA_CRC32C_X86
  return crc32c_hw_impl(crc, static_cast<const uint8_t*>(data), len, false);
#else
  STRATA_THROW(STRATA_ERR_UNIMPLEMENTED, "crc32c_extend_sse42: this CPU architecture has no SSE4.2; use crc32c_extend");
#endif
}

uint32_t crc32c_extend_hw(uint32_t crc, const void* data, size_t len) {
#if STRATA_CRC32C_X86
  return crc32c_hw_impl(crc, static_cast<const uint8_t*>(data), len, fold_available());
#else
  STRATA_THROW(STRATA_ERR_UNIMPLEMENTED, "crc32c_extend_hw: this CPU architecture has no SSE4.2; use crc32c_extend");
#endif
}

uint32_t crc32c_copy(uint32_t crc, void* dst, const void* src, size_t len) {
  auto* d = static_cast<uint8_t*>(dst);
  const auto* p = static_cast<const uint8_t*>(src);
#if STRATA_CRC32C_X86
  if (len >= 512 && fold_available()) {
    const size_t n = len / 256 * 256;
    const uint32_t reg = crc32c_fold<true>(~crc, p, n, d);
    // The tail (< 256 bytes): copy, then continue the CRC (inverted form).
    if (len > n) std::memcpy(d + n, p + n, len - n);
    return crc32c_hw_impl(~reg, p + n, len - n, false);
  }
#endif
  if (len > 0) std::memcpy(d, p, len);
  return crc32c_extend(crc, d, len);
}

uint32_t crc32c_extend(uint32_t crc, const void* data, size_t len) {
#if STRATA_CRC32C_X86
  if (crc32c_hw_available()) return crc32c_hw_impl(crc, static_cast<const uint8_t*>(data), len, fold_available());
#endif
  return crc32c_extend_sw(crc, data, len);
}

// ---------------------------------------------------------------- writer ---

namespace {
std::string errno_text(int e) { return std::strerror(e); }
}  // namespace

RecordWriter::RecordWriter(std::string path, size_t buffer_bytes) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    const int e = errno;
    const strata_status_t code = (e == EACCES || e == EPERM || e == EROFS) ? STRATA_ERR_PERMISSION_DENIED
                                                                            : STRATA_ERR_NOT_FOUND;
    STRATA_THROW(code, "cannot create record file '", path_, "': ", errno_text(e),
                 "; check that the directory exists and is writable");
  }
  buf_.resize(std::max<size_t>(buffer_bytes, 4096));
}

RecordWriter::RecordWriter(RecordWriter&& o) noexcept
    : path_(std::move(o.path_)), fd_(o.fd_), buf_(std::move(o.buf_)), used_(o.used_), records_(o.records_),
      bytes_(o.bytes_) {
  o.fd_ = -1;
  o.used_ = 0;
}

RecordWriter& RecordWriter::operator=(RecordWriter&& o) noexcept {
  if (this != &o) {
    try {
      close();
    } catch (...) {  // the destructor semantics: a late error is lost
    }
    path_ = std::move(o.path_);
    fd_ = o.fd_;
    buf_ = std::move(o.buf_);
    used_ = o.used_;
    records_ = o.records_;
    bytes_ = o.bytes_;
    o.fd_ = -1;
    o.used_ = 0;
  }
  return *this;
}

RecordWriter::~RecordWriter() {
  try {
    close();
  } catch (...) {  // documented: call close() to see errors
  }
}

void RecordWriter::write_fully(const void* data, size_t len) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (len > 0) {
    const ssize_t n = ::write(fd_, p, std::min<size_t>(len, size_t{1} << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      STRATA_THROW(STRATA_ERR_DATA_LOSS, "writing record file '", path_, "' failed: ", errno_text(e),
                   "; the file is incomplete: free space or choose another path and write it again");
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
}

void RecordWriter::put(const void* data, size_t len) {
  if (len == 0) return;
  if (used_ + len > buf_.size()) flush();
  if (len >= buf_.size()) {
    write_fully(data, len);  // large payloads go straight to the file
  } else {
    std::memcpy(buf_.data() + used_, data, len);
    used_ += len;
  }
}

void RecordWriter::write(const void* data, size_t len) { write_parts({{data, len}}); }

void RecordWriter::write_parts(const std::vector<std::pair<const void*, size_t>>& parts) {
  if (fd_ < 0)
    STRATA_THROW(STRATA_ERR_FAILED_PRECONDITION, "record file '", path_,
                 "' is already closed; create a new writer to write more records");
  uint64_t len = 0;
  uint32_t crc = 0;
  for (const auto& [p, n] : parts) {
    if (p == nullptr && n > 0)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "record for '", path_, "' has a NULL part of ", n, " bytes");
    len += n;
    crc = crc32c_extend(crc, p, n);
  }
  uint8_t header[kRecordHeaderBytes];
  store_le64(header, len);
  store_le32(header + 8, mask_crc(crc32c(header, 8)));
  uint8_t footer[4];
  store_le32(footer, mask_crc(crc));
  put(header, sizeof header);
  for (const auto& [p, n] : parts) put(p, n);
  put(footer, sizeof footer);
  ++records_;
  bytes_ += len + kRecordOverhead;
}

void RecordWriter::flush() {
  if (fd_ < 0 || used_ == 0) return;
  const size_t n = used_;
  used_ = 0;  // on failure the buffered bytes are lost either way
  write_fully(buf_.data(), n);
}

void RecordWriter::close() {
  if (fd_ < 0) return;
  std::string error;
  try {
    flush();
  } catch (const Error& e) {
    error = e.what();
  }
  const int rc = ::close(fd_);
  const int e = errno;
  fd_ = -1;
  if (!error.empty()) throw DataLossError(error);
  if (rc != 0)
    STRATA_THROW(STRATA_ERR_DATA_LOSS, "closing record file '", path_, "' failed: ", errno_text(e),
                 "; the file may be incomplete: write it again");
}

// ---------------------------------------------------------------- reader ---
//
// The consumer sees one window [data + begin, data + end) of unconsumed
// bytes. Without read-ahead the window lives in `own` and fill() read()s
// into it. With read-ahead a thread read()s the file into four chunks in
// turn; fill() takes the next full chunk and, so that a record split across
// two chunks is contiguous, copies the few unconsumed bytes left in the old
// window into the headroom in front of the new chunk's data (a tail longer
// than the headroom, i.e. a large record, is assembled in `own`). The old
// chunk goes back to the thread only at the next fill(), so the view that
// next() returned stays valid until the next call.

struct RecordReader::State {
  static constexpr size_t kHead = 64 << 10;
  static constexpr int kChunks = 4;
  struct Chunk {
    uint8_t* base = nullptr;  // kHead headroom, then chunk_bytes of data
    size_t len = 0;
  };

  int fd = -1;
  uint8_t* data = nullptr;
  size_t begin = 0, end = 0;
  uint64_t file_pos = 0;  // file offset of data[end]
  uint8_t* own = nullptr;
  size_t own_cap = 0;
  int cur = -1;  // chunk that `data` points into; -1: `own`

  bool threaded = false;
  bool running = false;
  size_t chunk_bytes = 0;
  Chunk chunks[kChunks];
  std::mutex mu;
  std::condition_variable cv;
  std::deque<int> free_q, full_q;  // guarded by mu
  bool eof = false, stop = false;  // guarded by mu
  int err = 0;                     // guarded by mu
  uint64_t read_pos = 0;           // the thread's file offset
  std::thread th;

  ~State() {
    halt();
    if (fd >= 0) ::close(fd);
    for (Chunk& c : chunks) std::free(c.base);
    std::free(own);
  }

  void grow_own(size_t need) {
    if (need <= own_cap) return;
    const size_t cap = std::max(need, own_cap * 2);
    auto* nb = static_cast<uint8_t*>(std::aligned_alloc(64, (cap + 63) / 64 * 64));
    if (nb == nullptr) throw std::bad_alloc();
    if (data == own && end > begin) std::memcpy(nb, own + begin, end - begin);
    if (data == own) {
      end -= begin;
      begin = 0;
      data = nb;
    }
    std::free(own);
    own = nb;
    own_cap = cap;
  }

  void release(int idx) {
    if (idx < 0) return;
    {
      std::lock_guard<std::mutex> l(mu);
      free_q.push_back(idx);
    }
    cv.notify_all();
  }

  void start() {
    for (Chunk& c : chunks) {
      if (c.base == nullptr) {
        c.base = static_cast<uint8_t*>(std::aligned_alloc(64, kHead + chunk_bytes));
        if (c.base == nullptr) throw std::bad_alloc();
      }
    }
    free_q.clear();
    full_q.clear();
    for (int i = 0; i < kChunks; ++i) free_q.push_back(i);
    eof = stop = false;
    err = 0;
    read_pos = file_pos;
    th = std::thread([this] { produce(); });
    running = true;
  }

  void halt() {
    if (!running) return;
    {
      std::lock_guard<std::mutex> l(mu);
      stop = true;
    }
    cv.notify_all();
    th.join();
    running = false;
  }

  // The read-ahead thread: fill free chunks in file order until EOF, an
  // error or stop.
  void produce() {
    for (;;) {
      int idx;
      {
        std::unique_lock<std::mutex> l(mu);
        cv.wait(l, [&] { return stop || !free_q.empty(); });
        if (stop) return;
        idx = free_q.front();
        free_q.pop_front();
      }
      uint8_t* dst = chunks[idx].base + kHead;
      size_t got = 0;
      int e = 0;
      while (got < chunk_bytes) {
        const ssize_t n = ::read(fd, dst + got, chunk_bytes - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
          e = errno;
          break;
        }
        if (n == 0) break;
        got += static_cast<size_t>(n);
      }
      {
        std::lock_guard<std::mutex> l(mu);
        chunks[idx].len = got;
        if (got > 0) full_q.push_back(idx);
        else free_q.push_back(idx);
        read_pos += got;
        if (e != 0) err = e;
        if (e != 0 || got < chunk_bytes) eof = true;
      }
      cv.notify_all();
      if (e != 0 || got < chunk_bytes) return;
    }
  }
};

RecordReader::RecordReader(std::string path, RecordReaderOptions options)
    : path_(std::move(path)), options_(std::move(options)), st_(std::make_unique<State>()) {
  State& s = *st_;
  s.fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (s.fd < 0) {
    const int e = errno;
    STRATA_THROW(STRATA_ERR_NOT_FOUND, "cannot open record file '", path_, "': ", errno_text(e),
                 "; check the path (and its permissions) in the list of files");
  }
  struct stat sb{};
  if (::fstat(s.fd, &sb) != 0) {
    const int e = errno;
    STRATA_THROW(STRATA_ERR_NOT_FOUND, "cannot read record file '", path_, "': ", errno_text(e));
  }
  // The size bounds every record's length check, so pipes and devices
  // (whose size is unknown) cannot be read.
  if (!S_ISREG(sb.st_mode))
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "record file '", path_, "' is ",
                 S_ISDIR(sb.st_mode) ? "a directory" : "not a regular file (a pipe or device)",
                 "; pass the path of a regular file");
  file_size_ = static_cast<uint64_t>(sb.st_size);
  ::posix_fadvise(s.fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  if (options_.buffer_bytes < 4096) options_.buffer_bytes = 4096;
  s.threaded = options_.read_ahead && file_size_ > options_.buffer_bytes;
  if (s.threaded) {
    s.chunk_bytes = std::max<size_t>(16 << 10, options_.buffer_bytes / State::kChunks / 64 * 64);
  } else {
    // Never more buffer than the file needs: small files are common.
    s.grow_own(static_cast<size_t>(std::min<uint64_t>(options_.buffer_bytes, std::max<uint64_t>(file_size_, 4096))));
    s.data = s.own;
  }
}

RecordReader::~RecordReader() = default;

uint64_t RecordReader::offset() const { return st_->file_pos - (st_->end - st_->begin); }

// Make at least `need` unconsumed bytes available in the window. Returns
// the bytes available (less than `need` only at the end of the file).
size_t RecordReader::fill(size_t need, int64_t timeout_ms) {
  State& s = *st_;
  if (s.end - s.begin >= need) return s.end - s.begin;
  if (!s.threaded) {
    if (need > s.own_cap - s.begin) {
      if (need > s.own_cap) {
        s.grow_own(need);  // a record larger than the buffer
      } else {
        if (s.end > s.begin) std::memmove(s.own, s.own + s.begin, s.end - s.begin);
        s.end -= s.begin;
        s.begin = 0;
      }
    }
    while (s.end - s.begin < need) {
      // One large read() amortises the syscall over many records.
      const ssize_t n = ::read(s.fd, s.own + s.end, s.own_cap - s.end);
      if (n < 0) {
        if (errno == EINTR) continue;
        const int e = errno;
        STRATA_THROW(STRATA_ERR_DATA_LOSS, "reading record file '", path_, "' failed at byte offset ", s.file_pos,
                     ": ", errno_text(e), "; check the storage device");
      }
      if (n == 0) break;
      s.end += static_cast<size_t>(n);
      s.file_pos += static_cast<uint64_t>(n);
    }
    return s.end - s.begin;
  }

  if (!s.running) s.start();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(std::max<int64_t>(timeout_ms, 0));
  while (s.end - s.begin < need) {
    int idx;
    {
      std::unique_lock<std::mutex> l(s.mu);
      auto ready = [&] { return !s.full_q.empty() || s.eof; };
      if (timeout_ms < 0) {
        s.cv.wait(l, ready);
      } else if (!s.cv.wait_until(l, deadline, ready)) {
        STRATA_THROW(STRATA_ERR_DEADLINE_EXCEEDED, "reading record file '", path_, "' at byte offset ", s.file_pos,
                     ": no data arrived within ", timeout_ms,
                     " ms (the storage is stalled or overloaded); call again to keep waiting, or raise the deadline");
      }
      if (s.full_q.empty()) {
        if (s.err != 0)
          STRATA_THROW(STRATA_ERR_DATA_LOSS, "reading record file '", path_, "' failed at byte offset ", s.file_pos,
                       ": ", errno_text(s.err), "; check the storage device");
        break;  // end of file
      }
      idx = s.full_q.front();
      s.full_q.pop_front();
    }
    State::Chunk& c = s.chunks[idx];
    const size_t len = c.len;  // read before the chunk may go back to the thread
    const size_t tail = s.end - s.begin;
    if (tail <= State::kHead) {
      if (tail > 0) std::memcpy(c.base + State::kHead - tail, s.data + s.begin, tail);
      s.release(s.cur);
      s.data = c.base;
      s.begin = State::kHead - tail;
      s.end = State::kHead + c.len;
      s.cur = idx;
    } else {
      // A large record: assemble it in `own`.
      if (s.data != s.own) {
        const uint8_t* old = s.data + s.begin;
        const int old_idx = s.cur;
        s.data = s.own;  // grow_own must not move the chunk's bytes
        s.begin = s.end = 0;
        s.grow_own(std::max(need, tail + c.len));
        std::memcpy(s.own, old, tail);
        s.end = tail;
        s.release(old_idx);
        s.cur = -1;
      } else {
        if (s.begin > 0) {
          std::memmove(s.own, s.own + s.begin, tail);
          s.begin = 0;
          s.end = tail;
        }
        s.grow_own(std::max(need, tail + c.len));
      }
      std::memcpy(s.own + s.end, c.base + State::kHead, c.len);
      s.end += c.len;
      s.release(idx);
    }
    s.file_pos += len;
  }
  return s.end - s.begin;
}

void RecordReader::corrupt(uint64_t at, bool rest_of_file, const std::string& what) {
  if (!options_.skip_corrupt) {
    // Sticky: a later next() must not quietly continue after the bad record.
    failed_ = strata::detail::str_cat("corrupt record in '", path_, "' at byte offset ", at, ": ", what,
                              "; the file is damaged: write it again, or set skip_corrupt to skip ",
                              rest_of_file ? "the rest of the file" : "such records");
    STRATA_THROW(STRATA_ERR_DATA_LOSS, failed_);
  }
  ++skipped_;
  if (options_.warn && skipped_ <= 10)
    options_.warn(strata::detail::str_cat("skipping corrupt record in '", path_, "' at byte offset ", at, ": ", what,
                                  rest_of_file ? " (and the rest of the file)" : ""));
  if (rest_of_file) {
    at_end_ = true;
    st_->begin = st_->end;
  }
}

void RecordReader::finish_file() {
  at_end_ = true;
  if (!reported_ && skipped_ > 0 && options_.warn)
    options_.warn(strata::detail::str_cat("skipped ", skipped_, " corrupt record(s) in '", path_, "'"));
  reported_ = true;
  st_->halt();  // nothing more to read: give the thread back now
}

bool RecordReader::next(const uint8_t** data, size_t* len, int64_t timeout_ms) {
  return read_record(data, len, timeout_ms, nullptr, nullptr);
}

bool RecordReader::next_into(AllocFn alloc, void* user, size_t* len, int64_t timeout_ms) {
  if (alloc == nullptr)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "next_into on '", path_, "': alloc is NULL; pass an allocator");
  const uint8_t* data = nullptr;
  return read_record(&data, len, timeout_ms, alloc, user);
}

bool RecordReader::read_record(const uint8_t** data, size_t* len, int64_t timeout_ms, AllocFn alloc, void* user) {
  State& s = *st_;
  if (!failed_.empty()) throw DataLossError(failed_);
  while (!at_end_) {
    const uint64_t at = offset();
    const size_t have = fill(kRecordHeaderBytes, timeout_ms);
    if (have == 0) break;
    if (have < kRecordHeaderBytes) {
      corrupt(at, true,
              strata::detail::str_cat("truncated header: the file ends after ", have, " of the 12 header bytes"));
      continue;
    }
    const uint8_t* h = s.data + s.begin;
    const uint64_t length = load_le64(h);
    const uint32_t stored = load_le32(h + 8);
    if (mask_crc(crc32c(h, 8)) != stored) {
      corrupt(at, true, strata::detail::str_cat("length CRC mismatch (length field reads ", length, ")"));
      continue;
    }
    // Check against the file size before allocating anything: a damaged
    // length whose CRC happens to match still never causes a huge buffer.
    const uint64_t remaining = file_size_ > at + kRecordHeaderBytes ? file_size_ - at - kRecordHeaderBytes : 0;
    if (length > remaining || remaining - length < 4) {
      corrupt(at, true,
              strata::detail::str_cat("truncated payload: the record declares ", length, " payload bytes (+4 CRC) but only ",
                              remaining, " bytes remain in the file"));
      continue;
    }
    const size_t total = kRecordHeaderBytes + static_cast<size_t>(length) + 4;
    if (fill(total, timeout_ms) < total) {  // the file shrank while we read it
      corrupt(at, true, strata::detail::str_cat("truncated payload: the file ends inside the record's ", length,
                                        " payload bytes"));
      continue;
    }
    const uint8_t* payload = s.data + s.begin + kRecordHeaderBytes;
    const uint32_t stored_payload = load_le32(payload + length);
    s.begin += total;
    const uint32_t crc = alloc != nullptr
                             ? crc32c_copy(0, alloc(user, static_cast<size_t>(length)), payload, static_cast<size_t>(length))
                             : crc32c(payload, static_cast<size_t>(length));
    if (mask_crc(crc) != stored_payload) {
      corrupt(at, false, strata::detail::str_cat("payload CRC mismatch (", length, " payload bytes)"));
      continue;
    }
    record_offset_ = at;
    *data = payload;
    *len = static_cast<size_t>(length);
    return true;
  }
  finish_file();
  return false;
}

bool RecordReader::next(std::vector<uint8_t>& out, int64_t timeout_ms) {
  const uint8_t* p = nullptr;
  size_t n = 0;
  if (!next(&p, &n, timeout_ms)) return false;
  out.assign(p, p + n);
  return true;
}

void RecordReader::seek(uint64_t off) {
  State& s = *st_;
  if (off > file_size_)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "cannot resume record file '", path_, "' at byte offset ", off,
                 ": the file has only ", file_size_, " bytes; was it rewritten since the state was saved?");
  s.halt();
  if (::lseek(s.fd, static_cast<off_t>(off), SEEK_SET) < 0) {
    const int e = errno;
    STRATA_THROW(STRATA_ERR_DATA_LOSS, "seeking in record file '", path_, "' to byte offset ", off,
                 " failed: ", errno_text(e));
  }
  s.cur = -1;
  s.data = s.own;
  s.begin = s.end = 0;
  s.file_pos = off;
  at_end_ = false;
  failed_.clear();
}

}  // namespace strata::sdk
