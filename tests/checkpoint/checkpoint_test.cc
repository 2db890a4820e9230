// SPDX-License-Identifier: Apache-2.0
// strata::Checkpoint: bit-exact round trips of every dtype and variable kind
// under the Default strategy and the in-tree strategy plugins (loaded from
// the build tree), restores under another strategy, an independent reader
// (Python's standard library) of the safetensors file, and corrupt
// checkpoints, each refused with the right error and nothing restored.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <functional>
#include <map>
#include <set>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>

#include "checkpoint_test.h"
#include "strata/strata.hpp"
#include "test_support.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using test::all_dtypes;
using test::bytes_of;
using test::devices_json;
using test::random_tensor;

struct StrategyCase {
  std::string name;
  std::string options;
  int replicas;
};

void PrintTo(const StrategyCase& c, std::ostream* os) { *os << c.name; }

std::string case_name(const ::testing::TestParamInfo<StrategyCase>& info) { return info.param.name; }

class CheckpointRoundTripTest : public ::testing::TestWithParam<StrategyCase> {
 protected:
  void SetUp() override {
    if (GetParam().name != "default") {
      strategy_.emplace(Strategy::create(GetParam().name, GetParam().options));
      scope_.emplace(strategy_->scope());
    }
  }
  void TearDown() override {
    vars_.clear();
    scope_.reset();
  }
  Strategy& s() { return strategy_ ? *strategy_ : get_strategy(); }
  Variable& add(const Tensor& init, VariableOptions o) {
    vars_.push_back(std::make_unique<Variable>(init, std::move(o)));
    return *vars_.back();
  }
  std::optional<Strategy> strategy_;
  std::optional<Scope> scope_;
  std::vector<std::unique_ptr<Variable>> vars_;
};

TEST_P(CheckpointRoundTripTest, EveryDtypeAndVariableKindIsBitExact) {
  ASSERT_EQ(s().num_replicas_in_sync(), GetParam().replicas);
  test::TempDir dir;
  Checkpoint ckpt;
  std::vector<std::pair<Variable*, std::vector<unsigned char>>> want;
  std::uint32_t seed = 1;
  // ON_WRITE (mirrored copies / central storage): random bit patterns.
  for (DType dt : all_dtypes()) {
    // Strategy plugins hold the six collective dtypes only (uint8 variables
    // exist under the Default strategy).
    if (dt == DType::kUInt8 && strategy_) continue;
    for (auto shape : {std::vector<std::int64_t>{3, 5}, std::vector<std::int64_t>{}, std::vector<std::int64_t>{0, 4}}) {
      const std::string name = std::string("w_") + dtype_name(dt) + "_" + std::to_string(shape.size()) +
                               (shape.size() == 2 && shape[0] == 0 ? "e" : "");
      Variable& v = add(random_tensor(dt, shape, seed++), {name, true, Synchronization::ON_WRITE, Aggregation::MEAN});
      ckpt.track(name, v);
      want.emplace_back(&v, bytes_of(v.value()));
    }
  }
  // ON_READ (sync-on-read): each replica writes its own copy; the checkpoint
  // holds the aggregate.
  const int n = s().num_replicas_in_sync();
  std::vector<Variable*> on_read;
  for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16, DType::kInt64, DType::kInt32}) {
    for (Aggregation a : {Aggregation::SUM, Aggregation::MEAN, Aggregation::ONLY_FIRST_REPLICA}) {
      const std::string name = std::string("r_") + dtype_name(dt) + "_" + aggregation_name(a);
      Variable& v = add(Tensor::from_doubles({0, 0, 0}, {3}, dt), {name, false, Synchronization::ON_READ, a});
      ckpt.track(name, v);
      on_read.push_back(&v);
    }
  }
  s().run([&](ReplicaContext& ctx) {
    const double r = ctx.replica_id_in_sync_group();
    // Even per-replica values: an integer SUM restores as total / n per copy.
    for (Variable* v : on_read) v->assign(Tensor::from_doubles({10 + 2 * r, -4 - 2 * r, 2 * r}, {3}, v->dtype()));
  });
  for (Variable* v : on_read) {
    const std::vector<double> got = v->value().to_doubles();
    const double first = 10, sum = 10 * n + n * (n - 1);
    const std::string agg = aggregation_name(v->aggregation());
    EXPECT_EQ(got[0], agg == std::string("SUM") ? sum : agg == std::string("MEAN") ? sum / n : first) << v->name();
    want.emplace_back(v, bytes_of(v->value()));
  }
  std::int64_t step = 1234567890123;
  double epoch = 2.718281828459045;
  ckpt.track("step", &step).track("epoch", &epoch);

  ASSERT_TRUE(ckpt.save(dir.str() + "/ckpt"));
  for (auto& [v, bytes] : want) v->assign(Tensor::zeros(v->shape(), v->dtype()));
  step = -1;
  epoch = 0;
  const RestoreStatus st = ckpt.restore(dir.str() + "/ckpt");
  EXPECT_EQ(st.step(), std::optional<std::int64_t>(1234567890123));
  EXPECT_TRUE(st.missing().empty());
  EXPECT_TRUE(st.unused().empty());
  EXPECT_EQ(st.restored().size(), want.size() + 2);
  st.assert_consumed();
  for (auto& [v, bytes] : want) EXPECT_EQ(bytes_of(v->value()), bytes) << v->name();
  EXPECT_EQ(step, 1234567890123);
  EXPECT_EQ(epoch, 2.718281828459045);
  // Every replica's copy of an ON_WRITE variable was assigned.
  std::atomic<int> bad{0};
  s().run([&](ReplicaContext&) {
    for (auto& [v, bytes] : want)
      if (v->synchronization() != Synchronization::ON_READ && bytes_of(v->value()) != bytes) ++bad;
  });
  EXPECT_EQ(bad.load(), 0);
}

TEST_P(CheckpointRoundTripTest, SaveAndRestoreInsideAReplicaFunctionAreRefused) {
  test::TempDir dir;
  Variable& v = add(Tensor::scalar(1.0f), {"v", true, Synchronization::ON_WRITE, Aggregation::MEAN});
  Checkpoint ckpt;
  ckpt.track("v", v);
  if (!strategy_) {
    // The Default strategy's one replica reads and writes cross-replica
    // (as TF's default replica context): saving there is fine.
    s().run([&](ReplicaContext&) { ckpt.save(dir.str() + "/c"); });
    EXPECT_TRUE(is_checkpoint(dir.str() + "/c"));
    return;
  }
  EXPECT_THROW(s().run([&](ReplicaContext&) { ckpt.save(dir.str() + "/c"); }), FailedPreconditionError);
  EXPECT_FALSE(fs::exists(dir.path() / "c"));
}

TEST_P(CheckpointRoundTripTest, OnReadWithoutAggregationHasNoValueToSave) {
  test::TempDir dir;
  Variable& v = add(Tensor::scalar(1.0f), {"none", false, Synchronization::ON_READ, Aggregation::NONE});
  Checkpoint ckpt;
  ckpt.track("none", v);
  EXPECT_THROW(ckpt.save(dir.str() + "/c"), FailedPreconditionError);
  EXPECT_TRUE(fs::is_empty(dir.path()));  // not even a temporary left behind
}

INSTANTIATE_TEST_SUITE_P(Strategies, CheckpointRoundTripTest,
                         ::testing::Values(StrategyCase{"default", "", 1},
                                           StrategyCase{"one_device", R"({"device": "cpu:0"})", 1},
                                           StrategyCase{"mirrored", devices_json(2), 2},
                                           StrategyCase{"central_storage", devices_json(2), 2}),
                         case_name);

// Save under mirrored (2 replicas), restore under one_device, save there,
// restore under mirrored and central_storage.
TEST(CheckpointTest, RestoresUnderAnotherStrategy) {
  test::TempDir dir;
  const Tensor w0 = random_tensor(DType::kFloat32, {4, 4}, 7), b0 = random_tensor(DType::kBFloat16, {7}, 8);
  const Tensor w1 = random_tensor(DType::kFloat32, {4, 4}, 9), b1 = random_tensor(DType::kBFloat16, {7}, 10);
  auto make = [](Variable*& w, Variable*& b, Variable*& r, std::vector<std::unique_ptr<Variable>>& keep, Checkpoint& c) {
    keep.push_back(std::make_unique<Variable>(Tensor::zeros({4, 4}, DType::kFloat32),
                                              VariableOptions{"w", true, Synchronization::ON_WRITE, Aggregation::MEAN}));
    keep.push_back(std::make_unique<Variable>(Tensor::zeros({7}, DType::kBFloat16),
                                              VariableOptions{"b", true, Synchronization::AUTO, Aggregation::SUM}));
    keep.push_back(std::make_unique<Variable>(Tensor::scalar(0.0),
                                              VariableOptions{"count", false, Synchronization::ON_READ, Aggregation::SUM}));
    w = keep[0].get();
    b = keep[1].get();
    r = keep[2].get();
    c.track("model/w", *w).track("model/b", *b).track("metrics/count", *r);
  };
  {
    Strategy m = Strategy::create("mirrored", devices_json(2));
    Scope scope = m.scope();
    std::vector<std::unique_ptr<Variable>> keep;
    Variable *w, *b, *r;
    Checkpoint c;
    make(w, b, r, keep, c);
    w->assign(w0);
    b->assign(b0);
    m.run([&](ReplicaContext& ctx) { r->assign(Tensor::scalar(1.5 + ctx.replica_id_in_sync_group())); });
    ASSERT_EQ(r->value().to_vector<double>()[0], 4.0);
    c.save(dir.str() + "/a");
  }
  {
    Strategy o = Strategy::create("one_device", R"({"device": "cpu:0"})");
    Scope scope = o.scope();
    std::vector<std::unique_ptr<Variable>> keep;
    Variable *w, *b, *r;
    Checkpoint c;
    make(w, b, r, keep, c);
    c.restore(dir.str() + "/a");
    EXPECT_EQ(bytes_of(w->value()), bytes_of(w0));
    EXPECT_EQ(bytes_of(b->value()), bytes_of(b0));
    EXPECT_EQ(r->value().to_vector<double>()[0], 4.0);
    w->assign(w1);
    b->assign(b1);
    r->assign(Tensor::scalar(6.0));
    c.save(dir.str() + "/b");
  }
  for (const char* name : {"mirrored", "central_storage"}) {
    Strategy m = Strategy::create(name, devices_json(2));
    Scope scope = m.scope();
    std::vector<std::unique_ptr<Variable>> keep;
    Variable *w, *b, *r;
    Checkpoint c;
    make(w, b, r, keep, c);
    c.restore(dir.str() + "/b");
    EXPECT_EQ(bytes_of(w->value()), bytes_of(w1)) << name;
    EXPECT_EQ(bytes_of(b->value()), bytes_of(b1)) << name;
    EXPECT_EQ(r->value().to_vector<double>()[0], 6.0) << name;
    std::atomic<int> bad{0};
    m.run([&](ReplicaContext&) {
      if (bytes_of(w->value()) != bytes_of(w1)) ++bad;
      if (r->value().to_vector<double>()[0] != 3.0) ++bad;  // 6 / 2 per copy
    });
    EXPECT_EQ(bad.load(), 0) << name;
  }
}

// ---------------------------------------------------------------- independent reader

constexpr const char* kReader = R"PY(
import json, struct, sys
data = open(sys.argv[1], 'rb').read()
(n,) = struct.unpack('<Q', data[:8])
header = json.loads(data[8:8 + n])
base = 8 + n
def crc32c(b):
    c = 0xFFFFFFFF
    for x in b:
        c ^= x
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 & -(c & 1))
    return c ^ 0xFFFFFFFF
print('crc|%d' % crc32c(data))
fmt = {'F64': 'd', 'F32': 'f', 'F16': 'e', 'I64': 'q', 'I32': 'i', 'U8': 'B'}
for name in sorted(k for k in header if k != '__metadata__'):
    e = header[name]
    b, en = e['data_offsets']
    raw = data[base + b:base + en]
    count = 1
    for d in e['shape']:
        count *= d
    if e['dtype'] == 'BF16':
        vals = [struct.unpack('<f', struct.pack('<I', h << 16))[0] for h in struct.unpack('<%dH' % count, raw)]
    else:
        vals = struct.unpack('<%d%s' % (count, fmt[e['dtype']]), raw)
    print('|'.join([name, e['dtype'], ','.join(map(str, e['shape'])), ' '.join(repr(v) for v in vals)]))
print('meta|' + json.dumps(header.get('__metadata__', {}), sort_keys=True))
)PY";

std::string run_python(const std::string& script, const std::string& arg) {
  const std::string cmd = "python3 '" + script + "' '" + arg + "' 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return "popen failed";
  std::string out;
  char buf[4096];
  std::size_t got;
  while ((got = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, got);
  const int rc = ::pclose(p);
  return rc == 0 ? out : "python3 failed (" + std::to_string(rc) + "): " + out;
}

TEST(CheckpointTest, PythonStandardLibraryReadsTheTensors) {
  test::TempDir dir;
  std::vector<std::unique_ptr<Variable>> vars;
  Checkpoint ckpt;
  std::map<std::string, std::vector<double>> want;
  std::map<std::string, std::string> want_dtype = {{"a_f32", "F32"}, {"b_f64", "F64"}, {"c_f16", "F16"},
                                                   {"d_bf16", "BF16"}, {"e_i32", "I32"}, {"f_i64", "I64"},
                                                   {"g_u8", "U8"}};
  const std::vector<DType> dts = all_dtypes();
  int k = 0;
  for (const auto& [name, st] : want_dtype) {
    const DType dt = dts[static_cast<std::size_t>(k++)];
    std::vector<double> vals;
    for (int i = 0; i < 6; ++i)
      vals.push_back(dt == DType::kUInt8 ? 250 - i * 7 : is_floating(dt) ? -3.25 + i * 1.5 : -300 + i * 77);
    vars.push_back(std::make_unique<Variable>(Tensor::from_doubles(vals, {2, 3}, dt), VariableOptions{name}));
    ckpt.track(name, *vars.back());
    want[name] = vals;
  }
  // Values that are not exact in the narrow types travel as the stored bits.
  vars.push_back(std::make_unique<Variable>(Tensor::from_vector<float>({0.1f, -1e-30f, 3.4e38f})));
  ckpt.track("h_f32_inexact", *vars.back());
  want_dtype["h_f32_inexact"] = "F32";
  want["h_f32_inexact"] = {static_cast<double>(0.1f), static_cast<double>(-1e-30f), static_cast<double>(3.4e38f)};
  std::int64_t step = -9007199254740993;  // not a double: a JSON/float reader would round it
  double lr = 1e-3;
  ckpt.track("step", &step).track("lr", &lr);
  want_dtype["step"] = "I64";
  want_dtype["lr"] = "F64";
  ASSERT_TRUE(ckpt.save(dir.str() + "/c"));

  const std::string script = dir.str() + "/reader.py";
  std::ofstream(script) << kReader;
  const std::string out = run_python(script, dir.str() + "/c/" + Checkpoint::kTensorFile);
  std::istringstream lines(out);
  std::string line;
  std::set<std::string> seen;
  std::optional<std::uint32_t> crc;
  while (std::getline(lines, line)) {
    std::vector<std::string> f;
    std::istringstream fs_(line);
    for (std::string x; std::getline(fs_, x, '|');) f.push_back(x);
    ASSERT_GE(f.size(), 2u) << out;
    if (f[0] == "crc") {
      crc = static_cast<std::uint32_t>(std::stoul(f[1]));
      continue;
    }
    if (f[0] == "meta") {
      EXPECT_EQ(f[1], R"({"format": "strata.checkpoint", "format_version": "1"})");
      continue;
    }
    ASSERT_EQ(f.size(), 4u) << line;
    seen.insert(f[0]);
    ASSERT_TRUE(want_dtype.count(f[0])) << line;
    EXPECT_EQ(f[1], want_dtype[f[0]]) << line;
    std::vector<std::string> tokens;
    std::istringstream vs(f[3]);
    for (std::string x; vs >> x;) tokens.push_back(x);
    if (f[0] == "step") {
      EXPECT_EQ(f[2], "");
      EXPECT_EQ(tokens, std::vector<std::string>{"-9007199254740993"});
      continue;
    }
    if (f[0] == "lr") {
      EXPECT_EQ(f[2], "");
      ASSERT_EQ(tokens.size(), 1u);
      EXPECT_EQ(std::strtod(tokens[0].c_str(), nullptr), 1e-3);
      continue;
    }
    EXPECT_EQ(f[2], f[0] == "h_f32_inexact" ? "3" : "2,3") << line;
    std::vector<double> got;
    for (const std::string& t : tokens) got.push_back(std::strtod(t.c_str(), nullptr));
    EXPECT_EQ(got, want[f[0]]) << line;
  }
  EXPECT_EQ(seen.size(), want_dtype.size()) << out;
  // The manifest's CRC32C is the one an independent implementation computes.
  std::ifstream mf(dir.str() + "/c/" + Checkpoint::kManifestFile);
  const nlohmann::json manifest = nlohmann::json::parse(mf);
  ASSERT_TRUE(crc.has_value()) << out;
  EXPECT_EQ(manifest["files"][Checkpoint::kTensorFile]["crc32c"].get<std::uint32_t>(), *crc);
  EXPECT_EQ(manifest["format_version"], 1);
  EXPECT_EQ(manifest["step"].get<std::int64_t>(), -9007199254740993);
  EXPECT_EQ(manifest["written_by"]["strategy"], "default");
}

// ---------------------------------------------------------------- corruption

class CheckpointCorruptionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ckpt_.track("b", b_).track("a", a_).track("step", &step_);
    ASSERT_TRUE(ckpt_.save(good()));
    // New values: a failed restore must leave exactly these.
    a_.assign(Tensor::from_vector<float>({9, 9, 9, 9}));
    b_.assign(Tensor::from_vector<std::int64_t>({-9, -9}));
    step_ = 99;
  }
  std::string good() const { return dir_.str() + "/good"; }
  std::string copy(const std::string& name) {
    const std::string to = dir_.str() + "/" + name;
    fs::copy(good(), to, fs::copy_options::recursive);
    return to;
  }
  std::string tensor_file(const std::string& d) const { return d + "/" + Checkpoint::kTensorFile; }
  std::string manifest_file(const std::string& d) const { return d + "/" + Checkpoint::kManifestFile; }
  void expect_unchanged() {
    EXPECT_EQ(a_.value().to_vector<float>(), (std::vector<float>{9, 9, 9, 9}));
    EXPECT_EQ(b_.value().to_vector<std::int64_t>(), (std::vector<std::int64_t>{-9, -9}));
    EXPECT_EQ(step_, 99);
  }
  template <class E>
  void expect_error(const Checkpoint& c, const std::string& d, const std::string& needle,
                    const RestoreOptions& o = {}) {
    try {
      c.restore(d, o);
      ADD_FAILURE() << "restore of " << d << " succeeded; expected an error mentioning " << needle;
    } catch (const E& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    } catch (const Error& e) {
      ADD_FAILURE() << "wrong error kind " << e.code_name() << ": " << e.what();
    }
    expect_unchanged();
  }
  static std::string read(const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  }
  static void write(const std::string& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

  test::TempDir dir_;
  Variable a_{Tensor::from_vector<float>({1, 2, 3, 4}), {"a"}};
  Variable b_{Tensor::from_vector<std::int64_t>({5, 6}), {"b"}};
  std::int64_t step_ = 7;
  Checkpoint ckpt_;
};

TEST_F(CheckpointCorruptionTest, TheGoodCopyRestores) {
  ckpt_.restore(good());
  EXPECT_EQ(a_.value().to_vector<float>(), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(b_.value().to_vector<std::int64_t>(), (std::vector<std::int64_t>{5, 6}));
  EXPECT_EQ(step_, 7);
}

TEST_F(CheckpointCorruptionTest, MissingDirectoryAndFilesAreNotFound) {
  expect_error<NotFoundError>(ckpt_, dir_.str() + "/nothing", "nothing");
  const std::string no_manifest = copy("no_manifest");
  fs::remove(manifest_file(no_manifest));
  expect_error<NotFoundError>(ckpt_, no_manifest, "manifest.json");
  const std::string no_tensors = copy("no_tensors");
  fs::remove(tensor_file(no_tensors));
  expect_error<NotFoundError>(ckpt_, no_tensors, "no_tensors/tensors.safetensors");
}

TEST_F(CheckpointCorruptionTest, TruncatedTensorFileIsDataLoss) {
  for (std::size_t keep : {std::size_t{0}, std::size_t{5}, std::size_t{40}}) {
    const std::string d = copy("trunc" + std::to_string(keep));
    fs::resize_file(tensor_file(d), keep == 40 ? fs::file_size(tensor_file(d)) - 3 : keep);
    expect_error<DataLossError>(ckpt_, d, tensor_file(d));
  }
}

TEST_F(CheckpointCorruptionTest, FlippedByteIsDataLoss) {
  const std::size_t size = fs::file_size(tensor_file(good()));
  for (std::size_t at : {std::size_t{3}, std::size_t{20}, size - 1}) {
    const std::string d = copy("flip" + std::to_string(at));
    std::string s = read(tensor_file(d));
    s[at] = static_cast<char>(s[at] ^ 0x10);
    write(tensor_file(d), s);
    expect_error<DataLossError>(ckpt_, d, "CRC32C");
  }
}

TEST_F(CheckpointCorruptionTest, BrokenManifestIsDataLoss) {
  int i = 0;
  for (const std::string& text : {std::string("{\"format\": \"strata.chec"), std::string("[]"),
                                 std::string(R"({"format": "other", "format_version": 1})"),
                                 std::string(R"({"format": "strata.checkpoint", "format_version": 1,
                                     "tensor_file": "../good/tensors.safetensors"})"),
                                 std::string(R"({"format": "strata.checkpoint", "format_version": 1,
                                     "tensor_file": "tensors.safetensors", "files": {}})")}) {
    const std::string d = copy("manifest" + std::to_string(i++));
    write(manifest_file(d), text);
    expect_error<DataLossError>(ckpt_, d, manifest_file(d));
  }
}

// A header that lies, in a file whose CRC matches (written by a buggy tool).
TEST_F(CheckpointCorruptionTest, InconsistentHeaderWithAValidCrcIsDataLoss) {
  int i = 0;
  for (auto edit : std::vector<std::function<void(std::string&)>>{
           [](std::string& s) { s[1] = static_cast<char>(0x7F); },  // header longer than the file
           [](std::string& s) { s.replace(s.find("\"F32\""), 5, "\"F8X\""); },
           [](std::string& s) { s.replace(s.find("[4]"), 3, "[5]"); },  // bytes do not match the shape
           [](std::string& s) { s.append(8, '\0'); }}) {                 // data after the last tensor
    const std::string d = copy("header" + std::to_string(i++));
    std::string s = read(tensor_file(d));
    edit(s);
    write(tensor_file(d), s);
    nlohmann::json m = nlohmann::json::parse(read(manifest_file(d)));
    m["files"][Checkpoint::kTensorFile] = {{"bytes", s.size()}, {"crc32c", test::crc32c_bitwise(s.data(), s.size())}};
    write(manifest_file(d), m.dump());
    expect_error<DataLossError>(ckpt_, d, tensor_file(d));
  }
}

TEST_F(CheckpointCorruptionTest, ShapeOrDtypeMismatchIsInvalidArgumentNamingTheVariable) {
  Variable wide(Tensor::from_vector<float>({0, 0, 0, 0, 0}), {"wide"});
  Checkpoint shape;
  shape.track("b", b_).track("a", wide);  // b first: it must not be assigned either
  expect_error<InvalidArgumentError>(shape, good(), "'a'");
  EXPECT_EQ(wide.value().to_vector<float>(), std::vector<float>(5, 0.0f));
  Variable f64(Tensor::from_vector<double>({0, 0, 0, 0}), {"f64"});
  Checkpoint dtype;
  dtype.track("b", b_).track("a", f64);
  expect_error<InvalidArgumentError>(dtype, good(), "float64");
  double step_as_double = 0;
  Checkpoint scalar;
  scalar.track("b", b_).track("step", &step_as_double);
  expect_error<InvalidArgumentError>(scalar, good(), "'step'");
  EXPECT_EQ(step_as_double, 0.0);
}

TEST_F(CheckpointCorruptionTest, MissingVariableIsNotFoundUnlessExpectPartial) {
  Variable c(Tensor::scalar(3.0f), {"c"});
  Checkpoint more;
  more.track("b", b_).track("a", a_).track("c", c).track("step", &step_);
  expect_error<NotFoundError>(more, good(), "'c'");
  const RestoreStatus st = more.restore(good(), RestoreOptions::expect_partial());
  EXPECT_EQ(st.missing(), std::vector<std::string>{"c"});
  EXPECT_EQ(c.value().to_vector<float>()[0], 3.0f);
  EXPECT_EQ(a_.value().to_vector<float>(), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_THROW(st.assert_consumed(), InvalidArgumentError);
}

TEST_F(CheckpointCorruptionTest, UntrackedEntriesAreIgnoredAndReportedByAssertConsumed) {
  Checkpoint fewer;
  fewer.track("a", a_);
  const RestoreStatus st = fewer.restore(good());
  EXPECT_EQ(a_.value().to_vector<float>(), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(b_.value().to_vector<std::int64_t>(), (std::vector<std::int64_t>{-9, -9}));
  EXPECT_EQ(st.unused(), (std::vector<std::string>{"b", "step"}));
  try {
    st.assert_consumed();
    ADD_FAILURE() << "assert_consumed passed";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("'b', 'step'"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------- streaming restore

// Restore streams the tensor file in chunks (1 MiB in checkpoint.cc) straight
// into per-tensor staging buffers, with the CRC32C computed chunk by chunk.
// These checkpoints span several chunks with tensors that start and end
// inside chunks, so that damage at a chunk boundary, in the last (partial)
// chunk or in a tensor nothing tracks is caught like anywhere else.
constexpr std::size_t kChunk = 1u << 20;

class CheckpointStreamingTest : public CheckpointCorruptionTest {
 protected:
  void SetUp() override {
    CheckpointCorruptionTest::SetUp();
    // 2.5 MiB + 2 bytes of random bits (float16, an odd element count), a
    // tensor nothing below tracks, and one more after it.
    big_.emplace(random_tensor(DType::kFloat16, {static_cast<std::int64_t>(5 * kChunk / 4 + 1)}, 77), VariableOptions{"big"});
    tail_.emplace(random_tensor(DType::kFloat64, {3, 1000}, 78), VariableOptions{"tail"});
    Variable untracked(random_tensor(DType::kInt32, {300000}, 79), {"untracked"});
    big_bytes_ = bytes_of(big_->value());
    tail_bytes_ = bytes_of(tail_->value());
    Checkpoint writer;
    writer.track("a", a_).track("b", b_).track("big", *big_).track("m_untracked", untracked).track("step", &step_).track("tail", *tail_);
    ASSERT_TRUE(writer.save(big_dir()));
    ckpt_.track("big", *big_).track("tail", *tail_);
    big_->assign(Tensor::zeros(big_->shape(), DType::kFloat16));
    tail_->assign(Tensor::zeros(tail_->shape(), DType::kFloat64));
    // Where each tensor's bytes start in the file (the writer orders by name).
    const std::string s = read(tensor_file(big_dir()));
    std::uint64_t n = 0;
    std::memcpy(&n, s.data(), 8);
    const nlohmann::json h = nlohmann::json::parse(s.substr(8, n));
    for (auto it = h.begin(); it != h.end(); ++it)
      if (it.key() != "__metadata__") start_[it.key()] = 8 + n + it.value()["data_offsets"][0].get<std::size_t>();
    size_ = s.size();
    ASSERT_GT(size_, 3 * kChunk);
  }
  std::string big_dir() const { return dir_.str() + "/big"; }
  std::string copy_big(const std::string& name) {
    const std::string to = dir_.str() + "/" + name;
    fs::copy(big_dir(), to, fs::copy_options::recursive);
    return to;
  }
  void expect_big_unchanged() {
    EXPECT_EQ(bytes_of(big_->value()), std::vector<unsigned char>(big_bytes_.size(), 0));
    EXPECT_EQ(bytes_of(tail_->value()), std::vector<unsigned char>(tail_bytes_.size(), 0));
  }
  // Offsets at and around every chunk boundary of the tensors and of the
  // file, inside the last chunk of each tensor and the file's last byte.
  std::vector<std::size_t> offsets() const {
    std::vector<std::size_t> out{0, 7, 8, 9, start_.at("big") - 1};
    for (const auto& [name, at] : start_) {
      out.push_back(at);
      for (std::size_t c = kChunk; at + c + 1 < size_ && c <= 3 * kChunk; c += kChunk)
        for (std::size_t d : {c - 1, c, c + 1}) out.push_back(at + d);
    }
    for (std::size_t c = kChunk; c < size_; c += kChunk) out.push_back(c);
    out.push_back(start_.at("big") + big_bytes_.size() - 1);  // inside big's last, partial chunk
    out.push_back(size_ - 2);
    out.push_back(size_ - 1);
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }

  std::optional<Variable> big_, tail_;
  std::vector<unsigned char> big_bytes_, tail_bytes_;
  std::map<std::string, std::size_t> start_;
  std::size_t size_ = 0;
};

TEST_F(CheckpointStreamingTest, MultiChunkTensorsRestoreBitExact) {
  const RestoreStatus st = ckpt_.restore(big_dir());
  EXPECT_EQ(bytes_of(big_->value()), big_bytes_);
  EXPECT_EQ(bytes_of(tail_->value()), tail_bytes_);
  EXPECT_EQ(st.restored(), (std::vector<std::string>{"b", "a", "step", "big", "tail"}));
  EXPECT_EQ(st.unused(), (std::vector<std::string>{"m_untracked"}));
}

TEST_F(CheckpointStreamingTest, FlippedByteAtEveryChunkBoundaryIsDataLoss) {
  const std::string good = read(tensor_file(big_dir()));
  const std::string d = copy_big("flip");
  int n = 0;
  for (std::size_t at : offsets()) {
    SCOPED_TRACE("byte " + std::to_string(at) + " of " + std::to_string(size_));
    std::string s = good;
    s[at] = static_cast<char>(s[at] ^ 0x01);
    write(tensor_file(d), s);
    try {
      ckpt_.restore(d);
      ADD_FAILURE() << "restore succeeded";
    } catch (const DataLossError& e) {
      EXPECT_NE(std::string(e.what()).find("CRC32C"), std::string::npos) << e.what();
    }
    expect_big_unchanged();
    ++n;
  }
  EXPECT_GE(n, 20);
}

TEST_F(CheckpointStreamingTest, TruncatedAtEveryChunkBoundaryIsDataLoss) {
  const std::string good = read(tensor_file(big_dir()));
  const std::string d = copy_big("trunc");
  for (std::size_t keep : offsets()) {
    SCOPED_TRACE("kept " + std::to_string(keep) + " of " + std::to_string(size_) + " bytes");
    write(tensor_file(d), good.substr(0, keep));
    try {
      ckpt_.restore(d);
      ADD_FAILURE() << "restore succeeded";
    } catch (const DataLossError& e) {
      EXPECT_NE(std::string(e.what()).find(tensor_file(d)), std::string::npos) << e.what();
    }
    expect_big_unchanged();
  }
}

// The manifest agreeing with a damaged file (a tool rewrote both): the
// header's checks still run, before any assign.
TEST_F(CheckpointStreamingTest, ConsistentManifestButBrokenLayoutIsDataLoss) {
  const std::string good = read(tensor_file(big_dir()));
  int i = 0;
  for (auto edit : std::vector<std::function<void(std::string&)>>{
           [&](std::string& s) { s.resize(s.size() - 1); },                  // last tensor one byte short
           [&](std::string& s) { s.resize(start_.at("big") + kChunk); },    // cut at a chunk boundary
           [&](std::string& s) { s.append(kChunk, 'x'); },                   // a chunk after the last tensor
           [&](std::string& s) { s[0] = static_cast<char>(s[0] + 8); }}) {   // header 8 bytes too long
    const std::string d = copy_big("layout" + std::to_string(i++));
    std::string s = good;
    edit(s);
    write(tensor_file(d), s);
    nlohmann::json m = nlohmann::json::parse(read(manifest_file(d)));
    m["files"][Checkpoint::kTensorFile] = {{"bytes", s.size()}, {"crc32c", test::crc32c_bitwise(s.data(), s.size())}};
    write(manifest_file(d), m.dump());
    expect_error<DataLossError>(ckpt_, d, tensor_file(d));
    expect_big_unchanged();
  }
}

// A file longer than its manifest says is refused before anything is read
// into memory.
TEST_F(CheckpointStreamingTest, FileLongerThanItsManifestIsDataLoss) {
  const std::string d = copy_big("longer");
  std::string s = read(tensor_file(d));
  s.append(3, '\0');
  write(tensor_file(d), s);
  expect_error<DataLossError>(ckpt_, d, "truncated or replaced");
  expect_big_unchanged();
}

// A tracked tensor that fails the shape check is not assigned, and neither
// is anything else, even though its bytes (and the CRC) are fine.
TEST_F(CheckpointStreamingTest, ShapeMismatchOfALargeTensorAssignsNothing) {
  Variable other(Tensor::zeros({3, 999}, DType::kFloat64), {"tail"});
  Checkpoint c;
  c.track("big", *big_).track("tail", other);
  expect_error<InvalidArgumentError>(c, big_dir(), "'tail'");
  expect_big_unchanged();
}

TEST(CheckpointTest, TrackRejectsBadNames) {
  Variable v(Tensor::scalar(1.0f));
  std::int64_t i = 0;
  Checkpoint c;
  c.track("v", v);
  EXPECT_THROW(c.track("v", &i), InvalidArgumentError);
  EXPECT_THROW(c.track("", &i), InvalidArgumentError);
  EXPECT_THROW(c.track("__metadata__", &i), InvalidArgumentError);
  EXPECT_THROW(c.track("n", static_cast<double*>(nullptr)), InvalidArgumentError);
  EXPECT_EQ(c.names(), std::vector<std::string>{"v"});
}

}  // namespace
}  // namespace strata
