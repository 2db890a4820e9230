// SPDX-License-Identifier: Apache-2.0
// strata-digits (examples/digits) end to end, as real processes: the libtorch
// MLP trained on scikit-learn's digits under strata-run with 1, 2 and 4
// multi_worker_mirrored workers and under mirrored on 2 devices reaches
// >= 95% held-out accuracy, and every run ends with the 1-worker run's
// weights within kWeightTolerance (same global batch, so the same rows per
// step; only the float32 summation order of the gradients differs). Bad
// data is a clear error naming the file (and line).
//
// The data: $STRATA_DIGITS, else <build>/data/digits.csv.gz, which
// `.ci/get-digits build/data` provides; without it the training tests skip.
// Every child runs with PR_SET_PDEATHSIG and a hard deadline and is reaped on
// every path.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "test_support.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Max |w - w_ref| over every weight (weights are O(0.1..1)). float32 sums in
// another order differ in the last bit (~6e-8 relative); 20 epochs (460
// steps) of SGD with momentum carry that to about 4e-7 here (2 and 4
// workers, mirrored on 2 devices); 1e-5 leaves a 25x margin and still
// catches any real difference (a step more or less, another batch order or
// a wrong gradient scale moves weights by 1e-3 or more).
constexpr double kWeightTolerance = 1e-5;
constexpr double kMinAccuracy = 0.95;
// Epochs and batch: enough for >= 95% with a margin, small enough that the
// four runs take well under a minute on 2 busy cores.
const std::vector<std::string> kTrain = {"--epochs", "20", "--global-batch", "64", "--seed", "1"};

std::string data_path() {
  if (const char* env = std::getenv("STRATA_DIGITS"); env != nullptr && *env != '\0') return env;
  return STRATA_DIGITS_DEFAULT;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Result {
  int status = -1;  // exit code; -1: killed at the deadline
  std::string output;
  double seconds = 0;
};

// Run argv with the extra environment (value "" unsets), stdout+stderr to a
// file, for at most `deadline_s`.
Result run(const std::vector<std::string>& argv, const fs::path& log, int deadline_s,
           const std::map<std::string, std::string>& env = {}) {
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::close(fd);
    }
    for (const auto& [k, v] : env) {
      if (v.empty()) ::unsetenv(k.c_str());
      else ::setenv(k.c_str(), v.c_str(), 1);
    }
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  Result r;
  r.status = strata::test::reap(pid, deadline_s * 1000);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.output = read_file(log);
  return r;
}

// The environment of a job started here: no cluster or config inherited
// from whoever runs the tests.
const std::map<std::string, std::string> kCleanEnv = {
    {"TF_CONFIG", ""}, {"STRATA_AUTH_TOKEN", ""}, {"STRATA_CONFIG", ""}, {"STRATA_STRATEGY", ""}};

// The number after the last "test accuracy: " (the chief's summary line).
double final_accuracy(const std::string& out) {
  const std::string key = "test accuracy: ";
  const size_t at = out.rfind(key);
  if (at == std::string::npos) return -1;
  return std::strtod(out.c_str() + at + key.size(), nullptr);
}

json read_weights(const fs::path& p) {
  std::ifstream in(p);
  if (!in) return json();
  return json::parse(in, nullptr, false);
}

// Max |a - b| over every weight of two saved files; +inf when the names or
// shapes differ.
double max_weight_diff(const json& a, const json& b) {
  if (!a.contains("weights") || !b.contains("weights") || a["weights"].size() != b["weights"].size())
    return INFINITY;
  double worst = 0;
  for (const auto& [name, wa] : a["weights"].items()) {
    if (!b["weights"].contains(name)) return INFINITY;
    const json& wb = b["weights"][name];
    if (wa["shape"] != wb["shape"] || wa["data"].size() != wb["data"].size()) return INFINITY;
    for (size_t i = 0; i < wa["data"].size(); ++i)
      worst = std::max(worst, std::fabs(wa["data"][i].get<double>() - wb["data"][i].get<double>()));
  }
  return worst;
}

class DigitsTest : public ::testing::Test {
 protected:
  strata::test::TempDir dir_;
};

TEST_F(DigitsTest, OneTwoFourWorkersAndMirroredReach95PercentWithTheSameWeights) {
  const std::string data = data_path();
  if (!fs::exists(data))
    GTEST_SKIP() << "no digits data at " << data << ": run .ci/get-digits <build>/data or set STRATA_DIGITS";
  struct Case {
    std::string name;
    std::vector<std::string> argv;
  };
  std::vector<Case> cases;
  for (int n : {1, 2, 4}) {
    std::vector<std::string> argv = {STRATA_RUN_BIN, "-n", std::to_string(n), "--timeout", "240", "--",
                                     STRATA_DIGITS_BIN, "--strategy", "multi_worker_mirrored"};
    cases.push_back({"workers" + std::to_string(n), argv});
  }
  cases.push_back({"mirrored2", {STRATA_DIGITS_BIN, "--strategy", "mirrored", "--devices", "cpu:0,cpu:1"}});

  json reference;
  for (Case& c : cases) {
    const fs::path weights = dir_.path() / (c.name + ".json");
    c.argv.insert(c.argv.end(), kTrain.begin(), kTrain.end());
    for (const char* a : {"--data", data.c_str(), "--save", weights.c_str()}) c.argv.emplace_back(a);
    const Result r = run(c.argv, dir_.path() / (c.name + ".log"), 300, kCleanEnv);
    ASSERT_EQ(r.status, 0) << c.name << " failed or hit the deadline:\n" << r.output;
    const double acc = final_accuracy(r.output);
    std::printf("[ digits   ] %-10s test accuracy %.4f in %.1f s\n", c.name.c_str(), acc, r.seconds);
    EXPECT_GE(acc, kMinAccuracy) << c.name << ":\n" << r.output;
    const json w = read_weights(weights);
    ASSERT_TRUE(w.is_object() && w.contains("weights")) << c.name << " wrote no weights to " << weights;
    EXPECT_NEAR(w["test_accuracy"].get<double>(), acc, 5e-5) << c.name << ": the file and the printed line disagree";
    if (reference.is_null()) {
      reference = w;
      continue;
    }
    const double diff = max_weight_diff(w, reference);
    std::printf("[ digits   ] %-10s max |w - w(1 worker)| = %.3g (tolerance %.0e)\n", c.name.c_str(), diff,
                kWeightTolerance);
    EXPECT_LE(diff, kWeightTolerance) << c.name << " ended with other weights than 1 worker";
  }
}

TEST_F(DigitsTest, AMissingDataFileIsAClearErrorOnEveryWorker) {
  const std::string missing = (dir_.path() / "no-such-dir" / "digits.csv.gz").string();
  const Result one = run({STRATA_DIGITS_BIN, "--data", missing}, dir_.path() / "one.log", 60, kCleanEnv);
  EXPECT_EQ(one.status, 1) << one.output;
  EXPECT_NE(one.output.find("cannot open the digits file '" + missing + "'"), std::string::npos) << one.output;
  EXPECT_NE(one.output.find(".ci/get-digits"), std::string::npos) << one.output;

  // Under strata-run every worker fails at once, before the rendezvous,
  // instead of waiting for peers that will never come.
  const Result two = run({STRATA_RUN_BIN, "-n", "2", "--timeout", "60", "--", STRATA_DIGITS_BIN, "--data", missing},
                         dir_.path() / "two.log", 90, kCleanEnv);
  EXPECT_NE(two.status, 0) << two.output;
  EXPECT_NE(two.status, 124) << "the job should fail by itself, not at strata-run's timeout:\n" << two.output;
  EXPECT_LT(two.seconds, 30) << two.output;
  EXPECT_NE(two.output.find("[0] strata-digits: error: cannot open the digits file"), std::string::npos) << two.output;
  EXPECT_NE(two.output.find("[1] strata-digits: error: cannot open the digits file"), std::string::npos) << two.output;

  // No --data, no $STRATA_DIGITS, and none of the default places exist (the
  // program is a copy in a directory without ../data): the error says what to do.
  const fs::path bin = dir_.path() / "bin" / "strata-digits";
  fs::create_directories(bin.parent_path());
  fs::copy_file(STRATA_DIGITS_BIN, bin);
  fs::permissions(bin, fs::perms::owner_all);
  if (!fs::exists("/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz")) {
    const Result none = run({bin.string()}, dir_.path() / "none.log", 60, {{"STRATA_DIGITS", ""}, {"TF_CONFIG", ""}});
    EXPECT_EQ(none.status, 1) << none.output;
    EXPECT_NE(none.output.find("no digits data"), std::string::npos) << none.output;
    EXPECT_NE(none.output.find("--data DIR/digits.csv.gz"), std::string::npos) << none.output;
  }
}

TEST_F(DigitsTest, AMalformedRowNamesTheFileAndLine) {
  const fs::path csv = dir_.path() / "bad.csv";
  {
    std::ofstream out(csv);
    std::string row;
    for (int i = 0; i < 64; ++i) row += "0,";
    out << row << "3\n" << row << "7\n";
    out << "0,1,2\n";  // line 3: 3 values
    out << row << "1\n";
  }
  Result r = run({STRATA_DIGITS_BIN, "--data", csv.string()}, dir_.path() / "bad.log", 60, kCleanEnv);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find(csv.string() + ":3: only 3 values"), std::string::npos) << r.output;

  {
    std::ofstream out(csv);
    std::string row;
    for (int i = 0; i < 63; ++i) row += "0,";
    out << row << "0,3\n" << row << "x,7\n";  // line 2: pixel 64 is not a number
  }
  r = run({STRATA_DIGITS_BIN, "--data", csv.string()}, dir_.path() / "bad2.log", 60, kCleanEnv);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find(csv.string() + ":2: column 64 is not a number"), std::string::npos) << r.output;

  {
    std::ofstream out(csv);
    std::string row;
    for (int i = 0; i < 64; ++i) row += "0,";
    out << row << "12\n";  // label 12
  }
  r = run({STRATA_DIGITS_BIN, "--data", csv.string()}, dir_.path() / "bad3.log", 60, kCleanEnv);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find(csv.string() + ":1: the label (column 65) is 12"), std::string::npos) << r.output;

  // A truncated download: gzip magic, then the stream stops.
  const std::string data = data_path();
  if (fs::exists(data)) {
    const fs::path gz = dir_.path() / "cut.csv.gz";
    std::string bytes = read_file(data);
    bytes.resize(bytes.size() / 2);
    std::ofstream(gz, std::ios::binary) << bytes;
    r = run({STRATA_DIGITS_BIN, "--data", gz.string()}, dir_.path() / "cut.log", 60, kCleanEnv);
    EXPECT_EQ(r.status, 1) << r.output;
    EXPECT_NE(r.output.find("'" + gz.string() + "' is not a valid gzip file"), std::string::npos) << r.output;
  }
}

}  // namespace
