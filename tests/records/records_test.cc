// SPDX-License-Identifier: Apache-2.0
// Record files: CRC32C, the format, the public reader/writer, the "records"
// input pipeline plugin (loaded through the plugin host) and strata-bench
// input.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "strata/c/input.h"
#include "strata/data.hpp"
#include "strata/error.hpp"
#include "strata/plugin_host.hpp"
#include "strata/records.hpp"
#include "strata/sdk/records.hpp"
#include "test_support.h"

namespace {

using strata::test::TempDir;
using Bytes = std::vector<std::uint8_t>;
namespace sdk = strata::sdk;

// ------------------------------------------------------------------ CRC ---

std::uint32_t crc_of(const std::string& s) { return sdk::crc32c(s.data(), s.size()); }

TEST(Crc32cTest, KnownVectors) {
  EXPECT_EQ(crc_of("123456789"), 0xE3069283u);
  EXPECT_EQ(crc_of(""), 0u);
  EXPECT_EQ(crc_of("a"), 0xC1D04330u);
  // RFC 3720 (iSCSI) B.4.
  Bytes zeros(32, 0), ones(32, 0xff), inc(32), dec(32);
  for (int i = 0; i < 32; ++i) {
    inc[i] = static_cast<std::uint8_t>(i);
    dec[i] = static_cast<std::uint8_t>(31 - i);
  }
  for (auto f : {&sdk::crc32c_extend, &sdk::crc32c_extend_sw}) {
    EXPECT_EQ(f(0, zeros.data(), 32), 0x8A9136AAu);
    EXPECT_EQ(f(0, ones.data(), 32), 0x62A8AB43u);
    EXPECT_EQ(f(0, inc.data(), 32), 0x46DD794Eu);
    EXPECT_EQ(f(0, dec.data(), 32), 0x113FDB5Cu);
    EXPECT_EQ(f(0, "123456789", 9), 0xE3069283u);
  }
  if (sdk::crc32c_hw_available()) {
    EXPECT_EQ(sdk::crc32c_extend_hw(0, zeros.data(), 32), 0x8A9136AAu);
    EXPECT_EQ(sdk::crc32c_extend_hw(0, dec.data(), 32), 0x113FDB5Cu);
  }
}

TEST(Crc32cTest, HardwareMatchesTableForEveryLengthAndAlignment) {
  if (!sdk::crc32c_hw_available()) GTEST_SKIP() << "no SSE4.2 on this CPU";
  std::mt19937 rng(7);
  Bytes buf(80000 + 16);
  for (auto& b : buf) b = static_cast<std::uint8_t>(rng());
  for (std::size_t len = 0; len <= 1000; ++len)
    for (std::size_t off = 0; off < 8; off += (len % 3 == 0 ? 1 : 3)) {
      const std::uint32_t want = sdk::crc32c_extend_sw(0x1234u, buf.data() + off, len);
      ASSERT_EQ(sdk::crc32c_extend_hw(0x1234u, buf.data() + off, len), want) << "len " << len << " offset " << off;
      ASSERT_EQ(sdk::crc32c_extend_sse42(0x1234u, buf.data() + off, len), want) << "len " << len << " offset " << off;
    }
  // Long enough for both interleaved block sizes (3 x 8192 and 3 x 256).
  // (Folding, where the CPU has it, takes 256-byte steps from 512 bytes.)
  for (std::size_t len : {767u, 768u, 769u, 1023u, 1024u, 1279u, 4096u, 24575u, 24576u, 24577u, 49152u + 768u + 13u,
                          80000u})
    for (std::size_t off : {0u, 1u, 5u}) {
      const std::uint32_t want = sdk::crc32c_extend_sw(0, buf.data() + off, len);
      ASSERT_EQ(sdk::crc32c_extend_hw(0, buf.data() + off, len), want) << "len " << len << " offset " << off;
      ASSERT_EQ(sdk::crc32c_extend_sse42(0, buf.data() + off, len), want) << "len " << len << " offset " << off;
    }
  std::printf("crc32c implementation: %s\n", sdk::crc32c_implementation());
}

TEST(Crc32cTest, CopyCopiesAndMatches) {
  std::mt19937 rng(11);
  Bytes src(70000 + 8);
  for (auto& b : src) b = static_cast<std::uint8_t>(rng());
  std::vector<std::size_t> lens;
  for (std::size_t len = 0; len <= 1100; ++len) lens.push_back(len);
  for (std::size_t len : {4096u, 4099u, 65536u, 70000u}) lens.push_back(len);
  for (std::size_t len : lens) {
    const std::size_t off = len % 7;
    Bytes dst(len + 2, 0xee);
    ASSERT_EQ(sdk::crc32c_copy(9, dst.data() + 1, src.data() + off, len), sdk::crc32c_extend_sw(9, src.data() + off, len))
        << len;
    ASSERT_TRUE(std::equal(src.begin() + static_cast<std::ptrdiff_t>(off), src.begin() + static_cast<std::ptrdiff_t>(off + len),
                           dst.begin() + 1))
        << len;
    ASSERT_EQ(dst.front(), 0xee);
    ASSERT_EQ(dst.back(), 0xee);
  }
}

TEST(Crc32cTest, ExtendIsConcatenationAndMaskRoundTrips) {
  const std::string a = "hello, ", b = "records";
  EXPECT_EQ(sdk::crc32c_extend(crc_of(a), b.data(), b.size()), crc_of(a + b));
  for (std::uint32_t c : {0u, 1u, 0xE3069283u, 0xffffffffu}) {
    EXPECT_EQ(sdk::unmask_crc(sdk::mask_crc(c)), c);
    EXPECT_NE(sdk::mask_crc(c), c);
  }
  EXPECT_EQ(sdk::mask_crc(0), 0xa282ead8u);
}

// ------------------------------------------------------------- helpers ---

Bytes payload(std::size_t n, std::uint32_t seed) {
  Bytes p(n);
  std::mt19937 rng(seed);
  for (auto& b : p) b = static_cast<std::uint8_t>(rng());
  return p;
}

Bytes read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}
void write_all(const std::string& path, const Bytes& b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// Writes `records` and returns each record's byte offset.
std::vector<std::uint64_t> write_records(const std::string& path, const std::vector<Bytes>& records) {
  strata::RecordWriter w(path);
  std::vector<std::uint64_t> offsets;
  std::uint64_t off = 0;
  for (const Bytes& r : records) {
    offsets.push_back(off);
    w.write(r.data(), r.size());
    off += r.size() + 16;
  }
  w.close();
  EXPECT_EQ(w.records(), records.size());
  return offsets;
}

std::vector<Bytes> some_records(std::size_t n, std::size_t bytes = 100) {
  std::vector<Bytes> r;
  for (std::size_t i = 0; i < n; ++i) r.push_back(payload(bytes + i, static_cast<std::uint32_t>(i)));
  return r;
}

// One "records" pipeline through the plugin host and its C vtable.
class Pipeline {
 public:
  explicit Pipeline(const nlohmann::json& options) {
    strata_input_context ctx{};
    STRATA_INIT_HEADER(&ctx, strata_input_context);
    ctx.num_input_pipelines = 1;
    ctx.num_replicas_in_sync = 1;
    inst_ = strata::PluginHost::global().create_input_pipeline("records", options.dump(), ctx);
    vt_ = inst_.vtable_as<strata_input_vtable>();
    h_ = static_cast<strata_input_t>(inst_.handle());
  }
  // Status of next(); on OK the element's components in `el`.
  strata_status_t next(std::vector<std::string>& names, std::vector<Bytes>& data, std::vector<std::vector<int64_t>>* shapes = nullptr,
                       std::vector<DLDataType>* dtypes = nullptr) {
    strata_element el{};
    STRATA_INIT_HEADER(&el, strata_element);
    strata_error_init(&err_);
    const strata_status_t s = vt_->next(h_, 10000, &el, &err_);
    names.clear();
    data.clear();
    if (shapes) shapes->clear();
    if (dtypes) dtypes->clear();
    if (s != STRATA_OK) return s;
    for (std::uint32_t i = 0; i < el.num_components; ++i) {
      DLManagedTensor* t = el.tensors[i];
      std::size_t n = t->dl_tensor.dtype.bits / 8;
      for (int d = 0; d < t->dl_tensor.ndim; ++d) n *= static_cast<std::size_t>(t->dl_tensor.shape[d]);
      const auto* p = static_cast<const std::uint8_t*>(t->dl_tensor.data);
      names.push_back(el.names[i]);
      data.emplace_back(p, p + n);
      if (shapes) shapes->emplace_back(t->dl_tensor.shape, t->dl_tensor.shape + t->dl_tensor.ndim);
      if (dtypes) dtypes->push_back(t->dl_tensor.dtype);
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 64, 0u);
      t->deleter(t);
    }
    return s;
  }
  // Every record payload until OUT_OF_RANGE; fails the test on another error.
  std::vector<Bytes> all() {
    std::vector<Bytes> out;
    std::vector<std::string> names;
    std::vector<Bytes> data;
    strata_status_t s;
    while ((s = next(names, data)) == STRATA_OK) {
      EXPECT_EQ(names.size(), 1u);
      out.push_back(data.at(0));
    }
    EXPECT_EQ(s, STRATA_ERR_OUT_OF_RANGE) << err_.message;
    return out;
  }
  // The first error other than OK (its message in message()).
  strata_status_t first_error() {
    std::vector<std::string> names;
    std::vector<Bytes> data;
    strata_status_t s;
    while ((s = next(names, data)) == STRATA_OK) {
    }
    return s;
  }
  strata_status_t shard(strata_shard_policy p, int n, int i) {
    strata_error_init(&err_);
    return vt_->shard(h_, p, n, i, &err_);
  }
  std::string shard_info(std::uint32_t* flags) {
    std::string out;
    strata_error_init(&err_);
    EXPECT_EQ(vt_->shard_info(h_, flags, [](void* u, const char* d, std::uint64_t n) { static_cast<std::string*>(u)->append(d, n); },
                              &out, &err_),
              STRATA_OK);
    return out;
  }
  std::string save() {
    std::string out;
    strata_error_init(&err_);
    EXPECT_NE(vt_->save_state, nullptr);
    EXPECT_EQ(vt_->save_state(h_, [](void* u, const char* d, std::uint64_t n) { static_cast<std::string*>(u)->append(d, n); },
                              &out, &err_),
              STRATA_OK);
    return out;
  }
  strata_status_t restore(const std::string& s) {
    strata_error_init(&err_);
    return vt_->restore_state(h_, s.data(), s.size(), &err_);
  }
  int64_t cardinality() { return vt_->cardinality ? vt_->cardinality(h_) : -3; }
  std::string message() const { return err_.message; }

 private:
  strata::PluginInstance inst_;
  const strata_input_vtable* vt_ = nullptr;
  strata_input_t h_ = nullptr;
  strata_error err_{};
};

nlohmann::json opts(const std::vector<std::string>& files) { return {{"files", files}}; }

// Create a pipeline, expecting its open() to fail; returns the error.
std::pair<int, std::string> open_error(const nlohmann::json& options) {
  try {
    Pipeline p(options);
  } catch (const strata::Error& e) {
    return {e.code(), e.what()};
  }
  return {STRATA_OK, ""};
}

// ----------------------------------------------------- public reader/writer ---

TEST(RecordFileTest, RoundTripEmptyOneByteAndLargePayloads) {
  TempDir dir;
  const std::string path = (dir.path() / "a.rec").string();
  std::vector<Bytes> recs = {Bytes{}, Bytes{0x42}, payload(5 << 20, 1), payload(4096, 2), Bytes{}, payload(9 << 20, 3)};
  const auto offsets = write_records(path, recs);
  std::uint64_t total = 0;
  for (const auto& r : recs) total += r.size() + 16;
  EXPECT_EQ(std::filesystem::file_size(path), total);

  strata::RecordReader r(path);
  for (std::size_t i = 0; i < recs.size(); ++i) {
    auto got = r.next();
    ASSERT_TRUE(got.has_value()) << "record " << i;
    EXPECT_EQ(*got, recs[i]) << "record " << i;
    EXPECT_EQ(r.record_offset(), offsets[i]);
  }
  EXPECT_FALSE(r.next().has_value());
  EXPECT_FALSE(r.next().has_value());
  EXPECT_EQ(r.skipped(), 0u);
}

TEST(RecordFileTest, LayoutIsTfRecord) {
  TempDir dir;
  const std::string path = (dir.path() / "a.rec").string();
  write_records(path, {Bytes{'a', 'b', 'c'}});
  const Bytes f = read_all(path);
  ASSERT_EQ(f.size(), 3u + 16u);
  const Bytes len = {3, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_TRUE(std::equal(len.begin(), len.end(), f.begin()));
  auto u32 = [&](std::size_t at) {
    return std::uint32_t(f[at]) | std::uint32_t(f[at + 1]) << 8 | std::uint32_t(f[at + 2]) << 16 | std::uint32_t(f[at + 3]) << 24;
  };
  // Masked per TFRecord: rotate right by 15, add 0xa282ead8.
  const std::uint32_t c = sdk::crc32c(len.data(), 8);
  EXPECT_EQ(u32(8), ((c >> 15) | (c << 17)) + 0xa282ead8u);
  EXPECT_EQ(f[12], 'a');
  EXPECT_EQ(u32(15), sdk::mask_crc(crc_of("abc")));
}

TEST(RecordFileTest, WriteFeaturesPutsRawBytesBackToBack) {
  TempDir dir;
  const std::string path = (dir.path() / "f.rec").string();
  std::vector<float> x = {1.5f, -2.0f, 3.25f};
  std::vector<std::int64_t> y = {7, -9};
  strata::RecordWriter w(path);
  w.write_features({strata::TensorView(x.data(), {3}, strata::DType::kFloat32),
                    strata::TensorView(y.data(), {2}, strata::DType::kInt64)});
  w.close();
  strata::RecordReader r(path);
  auto rec = r.next();
  ASSERT_TRUE(rec.has_value());
  ASSERT_EQ(rec->size(), 3 * 4u + 2 * 8u);
  EXPECT_EQ(std::memcmp(rec->data(), x.data(), 12), 0);
  EXPECT_EQ(std::memcmp(rec->data() + 12, y.data(), 16), 0);
}

TEST(RecordFileTest, WriterErrorsNameTheFile) {
  TempDir dir;
  const std::string bad = (dir.path() / "no-such-dir" / "x.rec").string();
  try {
    strata::RecordWriter w(bad);
    FAIL() << "expected NotFoundError";
  } catch (const strata::NotFoundError& e) {
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
  }
  if (std::filesystem::exists("/dev/full")) {
    strata::RecordWriter w("/dev/full");
    const Bytes big = payload(3 << 20, 9);
    try {
      w.write(big.data(), big.size());
      w.close();
      FAIL() << "expected DataLossError writing to /dev/full";
    } catch (const strata::DataLossError& e) {
      EXPECT_NE(std::string(e.what()).find("/dev/full"), std::string::npos) << e.what();
    }
  }
}

TEST(RecordFileTest, ReaderMissingAndEmptyFiles) {
  TempDir dir;
  const std::string missing = (dir.path() / "missing.rec").string();
  try {
    strata::RecordReader r(missing);
    FAIL() << "expected NotFoundError";
  } catch (const strata::NotFoundError& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
  const std::string empty = (dir.path() / "empty.rec").string();
  write_all(empty, {});
  strata::RecordReader r(empty);
  EXPECT_FALSE(r.next().has_value());
  try {
    strata::RecordReader d(dir.str());
    FAIL() << "expected InvalidArgumentError for a directory";
  } catch (const strata::InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("is a directory"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------- corruptions ---

struct Corruption {
  const char* name;
  // Damage the file (records of 100.. bytes, record 2 at offsets[2]).
  std::function<void(Bytes&, const std::vector<std::uint64_t>&)> damage;
  const char* what;  // expected text in the message
};

std::vector<Corruption> corruptions() {
  return {
      {"payload byte", [](Bytes& f, const auto& off) { f[off[2] + 12 + 50] ^= 0x01; }, "payload CRC mismatch"},
      {"length byte", [](Bytes& f, const auto& off) { f[off[2] + 1] ^= 0x10; }, "length CRC mismatch"},
      {"length CRC byte", [](Bytes& f, const auto& off) { f[off[2] + 9] ^= 0x80; }, "length CRC mismatch"},
      {"payload CRC byte", [](Bytes& f, const auto& off) { f[off[2] + 12 + 102 + 1] ^= 0x02; }, "payload CRC mismatch"},
      {"truncated header", [](Bytes& f, const auto& off) { f.resize(off[2] + 7); }, "truncated header"},
      {"truncated payload", [](Bytes& f, const auto& off) { f.resize(off[2] + 12 + 40); }, "truncated payload"},
      {"truncated payload CRC", [](Bytes& f, const auto& off) { f.resize(off[2] + 12 + 102 + 2); }, "truncated payload"},
  };
}

TEST(RecordCorruptionTest, EveryCaseNamesFileAndExactOffset) {
  TempDir dir;
  const std::vector<Corruption> cases = corruptions();
  for (std::size_t k = 0; k < cases.size(); ++k) {
    const Corruption& c = cases[k];
    SCOPED_TRACE(c.name);
    const std::string path = (dir.path() / ("c-" + std::to_string(k) + ".rec")).string();
    const auto recs = some_records(5);
    const auto off = write_records(path, recs);
    Bytes f = read_all(path);
    c.damage(f, off);
    write_all(path, f);
    const std::string where = "'" + path + "' at byte offset " + std::to_string(off[2]);

    // The public reader: records 0 and 1 are fine, record 2 throws DataLossError.
    strata::RecordReader r(path);
    EXPECT_EQ(*r.next(), recs[0]);
    EXPECT_EQ(*r.next(), recs[1]);
    try {
      r.next();
      FAIL() << "expected DataLossError";
    } catch (const strata::DataLossError& e) {
      EXPECT_NE(std::string(e.what()).find(where), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(c.what), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("skip_corrupt"), std::string::npos) << e.what();
    }

    // The plugin: two elements, then DATA_LOSS with the same facts.
    Pipeline p(opts({path}));
    std::vector<std::string> names;
    std::vector<Bytes> data;
    ASSERT_EQ(p.next(names, data), STRATA_OK);
    ASSERT_EQ(p.next(names, data), STRATA_OK);
    EXPECT_EQ(data.at(0), recs[1]);
    EXPECT_EQ(p.next(names, data), STRATA_ERR_DATA_LOSS);
    EXPECT_NE(p.message().find(where), std::string::npos) << p.message();
    EXPECT_NE(p.message().find(c.what), std::string::npos) << p.message();
    // Asking again never steps over the bad record.
    EXPECT_EQ(p.next(names, data), STRATA_ERR_DATA_LOSS);
    EXPECT_NE(p.message().find(where), std::string::npos) << p.message();
    EXPECT_THROW(r.next(), strata::DataLossError);
  }
}

TEST(RecordCorruptionTest, AbsurdLengthWithValidCrcIsNeverAllocated) {
  TempDir dir;
  const std::string path = (dir.path() / "huge.rec").string();
  // A header announcing 2^60 bytes with a correct length CRC, and nothing after.
  Bytes f(12);
  const std::uint64_t len = std::uint64_t{1} << 60;
  std::memcpy(f.data(), &len, 8);
  const std::uint32_t m = sdk::mask_crc(sdk::crc32c(f.data(), 8));
  std::memcpy(f.data() + 8, &m, 4);
  write_all(path, f);
  strata::RecordReader r(path);
  try {
    r.next();
    FAIL() << "expected DataLossError";
  } catch (const strata::DataLossError& e) {
    EXPECT_NE(std::string(e.what()).find("byte offset 0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("truncated payload"), std::string::npos) << e.what();
  }
}

TEST(RecordCorruptionTest, MissingFileIsNotFoundAndEmptyFileHasNoRecords) {
  TempDir dir;
  const std::string good = (dir.path() / "good.rec").string();
  const std::string missing = (dir.path() / "missing.rec").string();
  const std::string empty = (dir.path() / "empty.rec").string();
  write_records(good, some_records(2));
  write_all(empty, {});
  {
    Pipeline p(opts({empty}));
    EXPECT_TRUE(p.all().empty());
  }
  {
    Pipeline p(opts({empty, good, empty}));
    EXPECT_EQ(p.all().size(), 2u);
  }
  Pipeline p(opts({good, missing}));
  std::vector<std::string> names;
  std::vector<Bytes> data;
  EXPECT_EQ(p.next(names, data), STRATA_OK);
  EXPECT_EQ(p.next(names, data), STRATA_OK);
  EXPECT_EQ(p.next(names, data), STRATA_ERR_NOT_FOUND);
  EXPECT_NE(p.message().find(missing), std::string::npos) << p.message();
}

TEST(RecordCorruptionTest, SkipModeCountsSkippedRecords) {
  TempDir dir;
  const std::string path = (dir.path() / "s.rec").string();
  const auto recs = some_records(10);
  const auto off = write_records(path, recs);
  Bytes f = read_all(path);
  f[off[1] + 12 + 3] ^= 0xff;  // payload of record 1
  f[off[4] + 12 + 99] ^= 0x01; // payload of record 4
  f[off[7] + 2] ^= 0x01;       // length of record 7: 7, 8, 9 are lost
  write_all(path, f);

  strata::RecordReader r(path, /*skip_corrupt=*/true);
  std::vector<Bytes> got;
  while (auto rec = r.next()) got.push_back(*rec);
  EXPECT_EQ(got, (std::vector<Bytes>{recs[0], recs[2], recs[3], recs[5], recs[6]}));
  EXPECT_EQ(r.skipped(), 3u);  // two payloads and one length (the rest of the file)

  Pipeline p({{"files", {path, path}}, {"skip_corrupt", true}});
  EXPECT_EQ(p.all().size(), 10u);

  // Without skip_corrupt nothing is skipped silently.
  Pipeline strict(opts({path}));
  EXPECT_EQ(strict.first_error(), STRATA_ERR_DATA_LOSS);
  EXPECT_NE(strict.message().find("byte offset " + std::to_string(off[1])), std::string::npos) << strict.message();
}

// ------------------------------------------------ read-ahead vs. in-line ---

// The same file through both reader modes with small buffers: records
// across chunk boundaries, records larger than the headroom and than a
// chunk, seeks, and corruption found on the read-ahead path.
TEST(RecordReaderModesTest, ReadAheadMatchesInlineReads) {
  TempDir dir;
  const std::string path = (dir.path() / "m.rec").string();
  std::vector<Bytes> recs;
  std::mt19937 rng(3);
  for (int i = 0; i < 400; ++i) {
    const std::size_t n = i % 97 == 0 ? 200000 + rng() % 50000 : i % 13 == 0 ? 70000 : rng() % 3000;
    recs.push_back(payload(n, static_cast<std::uint32_t>(i)));
  }
  const auto off = write_records(path, recs);
  for (bool ahead : {false, true}) {
    for (std::size_t buffer : {4096u, 65536u, 1u << 20}) {
      SCOPED_TRACE(std::string(ahead ? "read-ahead" : "inline") + " buffer " + std::to_string(buffer));
      sdk::RecordReaderOptions o;
      o.read_ahead = ahead;
      o.buffer_bytes = buffer;
      sdk::RecordReader r(path, o);
      Bytes got;
      for (std::size_t i = 0; i < recs.size(); ++i) {
        ASSERT_TRUE(r.next(got, 10000)) << i;
        ASSERT_EQ(got, recs[i]) << i;
        ASSERT_EQ(r.record_offset(), off[i]);
        ASSERT_EQ(r.offset(), i + 1 < off.size() ? off[i + 1] : std::filesystem::file_size(path));
      }
      EXPECT_FALSE(r.next(got, 10000));
      // Seek back into the middle (also after the end was reached).
      for (std::size_t i : {250u, 3u, 399u, 0u}) {
        r.seek(off[i]);
        ASSERT_TRUE(r.next(got, 10000));
        EXPECT_EQ(got, recs[i]);
        if (i + 1 < recs.size()) {
          ASSERT_TRUE(r.next(got, 10000));
          EXPECT_EQ(got, recs[i + 1]);
        } else {
          EXPECT_FALSE(r.next(got, 10000));
        }
      }
    }
  }
  // Damage record 300 (deep in the file, on the read-ahead path).
  Bytes f = read_all(path);
  f[off[300] + 12 + recs[300].size() / 2] ^= 0x40;
  write_all(path, f);
  for (bool ahead : {false, true}) {
    sdk::RecordReaderOptions o;
    o.read_ahead = ahead;
    o.buffer_bytes = 8192;
    sdk::RecordReader r(path, o);
    Bytes got;
    std::size_t n = 0;
    try {
      while (r.next(got)) ++n;
      FAIL() << "expected DATA_LOSS";
    } catch (const strata::DataLossError& e) {
      EXPECT_EQ(n, 300u);
      EXPECT_NE(std::string(e.what()).find("'" + path + "' at byte offset " + std::to_string(off[300])), std::string::npos)
          << e.what();
    }
  }
}

// ---------------------------------------------------------------- plugin ---

TEST(RecordsPipelineTest, RoundTripThroughThePluginHost) {
  TempDir dir;
  const std::string a = (dir.path() / "a.rec").string(), b = (dir.path() / "b.rec").string();
  std::vector<Bytes> ra = {Bytes{}, Bytes{0x01}, payload(6 << 20, 5)}, rb = some_records(300, 1000);
  write_records(a, ra);
  write_records(b, rb);
  // A small buffer forces records across buffer refills and a grown buffer.
  Pipeline p({{"files", {a, b}}, {"buffer_bytes", 4096}});
  std::vector<std::string> names;
  std::vector<Bytes> data;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<DLDataType> dtypes;
  std::vector<Bytes> want = ra;
  want.insert(want.end(), rb.begin(), rb.end());
  for (const Bytes& w : want) {
    ASSERT_EQ(p.next(names, data, &shapes, &dtypes), STRATA_OK) << p.message();
    ASSERT_EQ(names, std::vector<std::string>{"record"});
    EXPECT_EQ(dtypes[0].code, kDLUInt);
    EXPECT_EQ(dtypes[0].bits, 8);
    EXPECT_EQ(shapes[0], std::vector<int64_t>{static_cast<int64_t>(w.size())});
    ASSERT_EQ(data[0], w);
  }
  EXPECT_EQ(p.next(names, data), STRATA_ERR_OUT_OF_RANGE);
  EXPECT_EQ(p.next(names, data), STRATA_ERR_OUT_OF_RANGE);
  EXPECT_EQ(p.cardinality(), -1);
}

TEST(RecordsPipelineTest, FileAndDataShardingAreDisjointAndComplete) {
  TempDir dir;
  std::vector<std::string> files;
  std::vector<Bytes> all;
  for (int i = 0; i < 5; ++i) {
    files.push_back((dir.path() / ("s" + std::to_string(i) + ".rec")).string());
    auto recs = some_records(7 + static_cast<std::size_t>(i), 10 + 50 * static_cast<std::size_t>(i));
    write_records(files.back(), recs);
    all.insert(all.end(), recs.begin(), recs.end());
  }
  {
    Pipeline p(opts(files));
    std::uint32_t flags = 0;
    EXPECT_EQ(nlohmann::json::parse(p.shard_info(&flags)), nlohmann::json(files));
    EXPECT_EQ(flags, STRATA_INPUT_CAN_SHARD_BY_FILE | STRATA_INPUT_CAN_SHARD_BY_DATA);
  }
  for (strata_shard_policy policy : {STRATA_SHARD_FILE, STRATA_SHARD_DATA}) {
    for (int n : {1, 2, 3, 5}) {
      std::multiset<Bytes> seen;
      std::vector<Bytes> data_order;
      for (int i = 0; i < n; ++i) {
        Pipeline p(opts(files));
        ASSERT_EQ(p.shard(policy, n, i), STRATA_OK) << p.message();
        for (Bytes& r : p.all()) seen.insert(r);
      }
      EXPECT_EQ(seen, std::multiset<Bytes>(all.begin(), all.end())) << "policy " << policy << " n " << n;
    }
  }
  // DATA keeps records i, i + n, ... of the concatenated stream.
  Pipeline p(opts(files));
  ASSERT_EQ(p.shard(STRATA_SHARD_DATA, 4, 3), STRATA_OK);
  const auto got = p.all();
  std::vector<Bytes> want;
  for (std::size_t k = 3; k < all.size(); k += 4) want.push_back(all[k]);
  EXPECT_EQ(got, want);

  Pipeline few(opts({files[0], files[1]}));
  EXPECT_EQ(few.shard(STRATA_SHARD_FILE, 3, 0), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(few.message().find("FILE sharding needs at least 3 files, got 2; use DATA"), std::string::npos) << few.message();
  Pipeline bad(opts({files[0]}));
  EXPECT_EQ(bad.shard(STRATA_SHARD_DATA, 2, 2), STRATA_ERR_INVALID_ARGUMENT);
}

TEST(RecordsPipelineTest, FeaturesDecodeAndSizeMismatchNamesFileAndOffset) {
  TempDir dir;
  const std::string path = (dir.path() / "f.rec").string();
  std::vector<float> x = {1, 2, 3, 4, 5, 6};
  std::vector<std::int32_t> y = {42};
  std::vector<std::uint16_t> h = {0x3c00, 0xc000};
  {
    strata::RecordWriter w(path);
    for (int i = 0; i < 3; ++i) {
      x[0] = static_cast<float>(i);
      w.write_features({strata::TensorView(x.data(), {2, 3}, strata::DType::kFloat32),
                        strata::TensorView(y.data(), {}, strata::DType::kInt32),
                        strata::TensorView(h.data(), {2}, strata::DType::kFloat16)});
    }
    const Bytes odd(10, 1);
    w.write(odd.data(), odd.size());
    w.close();
  }
  const nlohmann::json features = {{{"name", "x"}, {"dtype", "float32"}, {"shape", {2, 3}}},
                                   {{"name", "y"}, {"dtype", "int32"}, {"shape", nlohmann::json::array()}},
                                   {{"name", "h"}, {"dtype", "float16"}, {"shape", {2}}}};
  Pipeline p({{"files", {path}}, {"features", features}});
  std::vector<std::string> names;
  std::vector<Bytes> data;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<DLDataType> dtypes;
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(p.next(names, data, &shapes, &dtypes), STRATA_OK) << p.message();
    EXPECT_EQ(names, (std::vector<std::string>{"x", "y", "h"}));
    EXPECT_EQ(shapes[0], (std::vector<int64_t>{2, 3}));
    EXPECT_TRUE(shapes[1].empty());
    EXPECT_EQ(dtypes[0].code, kDLFloat);
    EXPECT_EQ(dtypes[1].code, kDLInt);
    EXPECT_EQ(dtypes[2].bits, 16);
    float x0;
    std::memcpy(&x0, data[0].data(), 4);
    EXPECT_EQ(x0, static_cast<float>(i));
    std::int32_t y0;
    std::memcpy(&y0, data[1].data(), 4);
    EXPECT_EQ(y0, 42);
    EXPECT_EQ(std::memcmp(data[2].data(), h.data(), 4), 0);
  }
  const std::uint64_t odd_offset = 3 * (24 + 4 + 4 + 16);
  EXPECT_EQ(p.next(names, data), STRATA_ERR_INVALID_ARGUMENT);
  const std::string want = "'" + path + "' at byte offset " + std::to_string(odd_offset) + " has 10 payload bytes, but the features expect 32";
  EXPECT_NE(p.message().find(want), std::string::npos) << p.message();
}

TEST(RecordsPipelineTest, BadOptionsAreRejectedWithTheFix) {
  TempDir dir;
  const std::string path = (dir.path() / "a.rec").string();
  write_records(path, some_records(1));
  struct Case {
    nlohmann::json options;
    const char* text;
  };
  const std::vector<Case> cases = {
      {nlohmann::json::object(), "option 'files'"},
      {{{"files", nlohmann::json::array()}}, "non-empty JSON array"},
      {{{"files", "a.rec"}}, "non-empty JSON array"},
      {{{"files", {1}}}, "option 'files'[0]"},
      {{{"files", {path}}, {"fiels", 1}}, "unknown option 'fiels'"},
      {{{"files", {path}}, {"skip_corrupt", "yes"}}, "skip_corrupt"},
      {{{"files", {path}}, {"buffer_bytes", 10}}, "buffer_bytes"},
      {{{"files", {path}}, {"features", {{{"name", "x"}, {"dtype", "complex64"}, {"shape", {1}}}}}}, "complex64"},
      {{{"files", {path}}, {"features", {{{"name", "x"}, {"dtype", "float32"}, {"shape", {-1}}}}}}, "non-negative"},
      {{{"files", {path}},
        {"features", {{{"name", "x"}, {"dtype", "float32"}}, {{"name", "x"}, {"dtype", "int64"}}}}},
       "twice"},
      {{{"files", {path}}, {"features", {{{"dtype", "float32"}}}}}, "\"name\""},
  };
  for (const Case& c : cases) {
    const auto [code, msg] = open_error(c.options);
    EXPECT_EQ(code, STRATA_ERR_INVALID_ARGUMENT) << c.options.dump();
    EXPECT_NE(msg.find(c.text), std::string::npos) << c.options.dump() << " -> " << msg;
  }
}

TEST(RecordsPipelineTest, SaveAndRestoreNeitherRepeatsNorSkips) {
  TempDir dir;
  const std::string a = (dir.path() / "a.rec").string(), b = (dir.path() / "b.rec").string();
  auto ra = some_records(5), rb = some_records(6, 300);
  write_records(a, ra);
  write_records(b, rb);
  std::vector<Bytes> all = ra;
  all.insert(all.end(), rb.begin(), rb.end());
  for (std::size_t cut : {0u, 3u, 5u, 7u, 11u}) {
    SCOPED_TRACE(cut);
    Pipeline first(opts({a, b}));
    ASSERT_EQ(first.shard(STRATA_SHARD_DATA, 1, 0), STRATA_OK);
    std::vector<Bytes> got;
    std::vector<std::string> names;
    std::vector<Bytes> data;
    for (std::size_t i = 0; i < cut; ++i) {
      ASSERT_EQ(first.next(names, data), STRATA_OK);
      got.push_back(data[0]);
    }
    const std::string state = first.save();
    Pipeline second(opts({a, b}));
    ASSERT_EQ(second.restore(state), STRATA_OK) << second.message();
    for (Bytes& r : second.all()) got.push_back(r);
    EXPECT_EQ(got, all);
  }
  Pipeline other(opts({b}));
  EXPECT_EQ(other.restore(Pipeline(opts({a, b})).save()), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(other.restore("not json"), STRATA_ERR_INVALID_ARGUMENT);
}

// ------------------------------------------------------------ benchmark ---

TEST(RecordsBenchTest, InputJsonReportsEveryRecord) {
  const std::string cmd = std::string(STRATA_BENCH_BIN) + " input --size-mb 8 --record-bytes 1000 --repeats 1 --json";
  FILE* f = ::popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::string out;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, f)) out.append(buf, n);
  const int status = ::pclose(f);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  const nlohmann::json j = nlohmann::json::parse(out);
  for (const char* k : {"records_per_s", "bytes_per_s", "sequential_read_bytes_per_s", "ratio_vs_sequential_read",
                        "record_bytes", "file_bytes", "records"})
    EXPECT_TRUE(j.contains(k)) << k << " missing in " << out;
  const std::uint64_t records = (8u << 20) / 1016u;
  EXPECT_EQ(j["records"].get<std::uint64_t>(), records);
  EXPECT_EQ(j["records_read"].get<std::uint64_t>(), records);
  EXPECT_EQ(j["file_bytes"].get<std::uint64_t>(), records * 1016u);
  EXPECT_EQ(j["wrong"].get<int>(), 0);
  EXPECT_GT(j["records_per_s"].get<double>(), 0);
  EXPECT_GT(j["ratio_vs_sequential_read"].get<double>(), 0);
}

}  // namespace

// The Dataset API (core/include/strata/data.hpp) builds the pipeline's
// options from RecordOptions: its keys and dtype names must be the ones the
// plugin accepts.
namespace {
TEST(RecordsDatasetTest, FromRecordsWithFeatures) {
  TempDir dir;
  const std::string path = (dir.path() / "d.rec").string();
  {
    strata::RecordWriter w(path);
    for (int i = 0; i < 5; ++i) {
      std::vector<float> x = {static_cast<float>(i), static_cast<float>(2 * i)};
      std::vector<std::int64_t> y = {i};
      w.write_features({strata::TensorView(x.data(), {2}, strata::DType::kFloat32),
                        strata::TensorView(y.data(), {1}, strata::DType::kInt64)});
    }
    w.close();
  }
  strata::RecordOptions ro;
  ro.features = {{"x", strata::DType::kFloat32, {2}}, {"y", strata::DType::kInt64, {1}}};
  ro.buffer_bytes = 1 << 16;
  int n = 0;
  for (strata::Element& e : strata::Dataset::from_records({path}, ro)) {
    EXPECT_EQ(e["x"].to_vector<float>(), (std::vector<float>{static_cast<float>(n), static_cast<float>(2 * n)}));
    EXPECT_EQ(e["y"].to_vector<std::int64_t>(), (std::vector<std::int64_t>{n}));
    ++n;
  }
  EXPECT_EQ(n, 5);
}
}  // namespace

namespace {
TEST(RecordsDatasetTest, FromRecordsRawPayloadsAreUint8) {
  TempDir dir;
  const std::string path = (dir.path() / "raw.rec").string();
  const std::vector<Bytes> recs = {Bytes{1, 2, 3}, Bytes{}, payload(5000, 4)};
  write_records(path, recs);
  std::size_t i = 0;
  for (strata::Element& e : strata::Dataset::from_records({path})) {
    ASSERT_LT(i, recs.size());
    EXPECT_EQ(e["record"].dtype(), strata::DType::kUInt8);
    EXPECT_EQ(e["record"].to_vector<std::uint8_t>(), recs[i]);
    ++i;
  }
  EXPECT_EQ(i, recs.size());
}
}  // namespace
