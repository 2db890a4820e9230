// SPDX-License-Identifier: Apache-2.0
// End-to-end tests of strata-train as a user runs it: real processes, real
// plugin files, real weight files. The key property: the training loop is
// written once and every strategy computes the same model as one_device for
// the same global batch.
#include <cstdlib>

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

struct Result {
  int exit_code;
  std::string output;  // stdout and stderr together
};

// Run a shell command with a hard deadline (coreutils timeout), capturing output.
Result run(const std::string& cmd, int deadline_s = 120) {
  const std::string full = "timeout -k 5 " + std::to_string(deadline_s) + " " + cmd + " 2>&1";
  FILE* p = popen(full.c_str(), "r");
  if (!p) return {-1, "popen failed"};
  std::string out;
  char buf[4096];
  while (std::size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out};
}

class TrainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("strata_train_test_" + std::to_string(getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Train for 50 steps with a small model and return the weights file's JSON.
  nlohmann::json train(const std::string& strategy_args, const std::string& tag) {
    const std::string out = (dir_ / (tag + ".json")).string();
    const Result r = run(std::string(STRATA_TRAIN_BIN) + " " + strategy_args +
                         " --steps 50 --global-batch 96 --features 16 --hidden 32 --classes 4 --lr 0.5"
                         " --dataset-size 4096 --quiet --save " + out);
    EXPECT_EQ(r.exit_code, 0) << strategy_args << "\n" << r.output;
    std::ifstream in(out);
    EXPECT_TRUE(in.good()) << "no weights file for " << strategy_args << "\n" << r.output;
    return in.good() ? nlohmann::json::parse(in) : nlohmann::json();
  }

  // Max relative difference per tensor: max|a - b| / max|b| over each
  // weight tensor (the usual "relative to the tensor's scale" measure; an
  // element-wise ratio is meaningless for weights that happen to be near 0).
  // Also checks every element with allclose(rtol 1e-5, atol 1e-7).
  static double max_rel_diff(const nlohmann::json& a, const nlohmann::json& ref) {
    double worst = 0.0;
    for (auto& [name, wa] : a["weights"].items()) {
      const auto& da = wa["data"];
      const auto& db = ref["weights"][name]["data"];
      EXPECT_EQ(da.size(), db.size()) << name;
      double max_diff = 0.0, max_ref = 0.0;
      for (std::size_t i = 0; i < std::min(da.size(), db.size()); ++i) {
        const double x = da[i].get<double>(), y = db[i].get<double>();
        EXPECT_LE(std::fabs(x - y), 1e-5 * std::fabs(y) + 1e-7) << name << "[" << i << "]: " << x << " vs " << y;
        max_diff = std::max(max_diff, std::fabs(x - y));
        max_ref = std::max(max_ref, std::fabs(y));
      }
      worst = std::max(worst, max_diff / std::max(max_ref, 1e-30));
    }
    return worst;
  }

  fs::path dir_;
};

TEST_F(TrainTest, EveryStrategyMatchesOneDevice) {
  const nlohmann::json ref = train("--strategy one_device", "one_device");
  ASSERT_TRUE(ref.contains("weights"));
  // The model learned something: the loss fell well below chance (ln 4).
  EXPECT_LT(ref["final_loss"].get<double>(), 0.9 * std::log(4.0));
  const std::pair<const char*, const char*> cases[] = {
      {"--strategy mirrored --devices cpu:0,cpu:1", "mirrored2"},
      {"--strategy mirrored --devices cpu:0,cpu:1,cpu:2,cpu:3", "mirrored4"},
      {"--strategy mirrored --devices cpu:0,cpu:1,cpu:2", "mirrored3_uneven_split"},
      {"--strategy central_storage --devices cpu:0,cpu:1", "central_storage2"},
      {"--strategy central_storage --devices cpu:0,cpu:1,cpu:2,cpu:3", "central_storage4"},
      {"--strategy default", "default"},
  };
  for (const auto& [args, tag] : cases) {
    const nlohmann::json got = train(args, tag);
    ASSERT_TRUE(got.contains("weights")) << args;
    const double diff = max_rel_diff(got, ref);
    EXPECT_LE(diff, 1e-5) << args << ": max relative difference " << diff;
    char text[32];
    std::snprintf(text, sizeof text, "%.3e", diff);
    RecordProperty(tag, text);
  }
}

TEST_F(TrainTest, ConfigFileChoosesTheStrategy) {
  const std::string cfg = (dir_ / "job.json").string();
  std::ofstream(cfg) << R"({"strategy": {"name": "mirrored", "options": {"devices": ["cpu:0", "cpu:1"]}},
                            "cross_device_ops": {"name": "reduction_to_one_device"},
                            "timeouts": {"collective_s": 60}})";
  const Result r = run(std::string(STRATA_TRAIN_BIN) + " --config " + cfg + " --steps 5 --quiet");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("with mirrored on 2 replica(s)"), std::string::npos) << r.output;
}

TEST_F(TrainTest, UnknownStrategyFailsListingTheAvailableOnes) {
  const Result r = run(std::string(STRATA_TRAIN_BIN) + " --strategy no_such_strategy --steps 1 --quiet");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("no_such_strategy"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("mirrored"), std::string::npos) << "should list what exists:\n" << r.output;
}

TEST_F(TrainTest, BrokenPluginNamedInConfigFailsNamingTheFile) {
  const std::string bad = (dir_ / "libstrata-strategy-broken.so").string();
  std::ofstream(bad) << "this is not a shared library\n";
  const std::string cfg = (dir_ / "job.json").string();
  std::ofstream(cfg) << R"({"strategy": {"name": "broken", "path": ")" << bad << R"("}})";
  const Result r = run(std::string(STRATA_TRAIN_BIN) + " --config " + cfg + " --steps 1 --quiet");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(bad), std::string::npos) << "the error must name the file:\n" << r.output;
}

TEST_F(TrainTest, MalformedConfigFailsWithAClearMessage) {
  const std::string cfg = (dir_ / "job.json").string();
  std::ofstream(cfg) << R"({"strategy": {"name": "mirrored",)";
  const Result r = run(std::string(STRATA_TRAIN_BIN) + " --config " + cfg + " --steps 1 --quiet");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("job.json"), std::string::npos) << r.output;
}

TEST_F(TrainTest, BadFlagsAreRejected) {
  Result r = run(std::string(STRATA_TRAIN_BIN) + " --strategy one_device --devices cpu:0,cpu:1 --steps 1 --quiet");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("one_device"), std::string::npos) << r.output;
  r = run(std::string(STRATA_TRAIN_BIN) + " --strategy mirrored --devices cpu:0,cpu:1 --global-batch 1 --steps 1 --quiet");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--global-batch"), std::string::npos) << r.output;
  r = run(std::string(STRATA_TRAIN_BIN) + " --strategy mirrored --devices gpu0 --steps 1 --quiet");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("gpu0"), std::string::npos) << r.output;
}

// A record file with one damaged payload: without --skip-corrupt training
// stops with an error naming the file, the offset and the flag; with it,
// training runs on the other records and the skip is logged.
TEST_F(TrainTest, CorruptRecordFailsNamingTheFlagAndSkipCorruptTrainsOn) {
  const std::string model = " --features 4 --hidden 4 --classes 2";
  const std::string prefix = (dir_ / "d").string();
  Result r = run(std::string(STRATA_TRAIN_BIN) + " --export-data " + prefix + " --export-files 1 --dataset-size 64" +
                 model);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string file = prefix + "-00000-of-00001.rec";
  // Records are 8 (length) + 4 (CRC) + 20 (x: 4 floats, y: 1 int) + 4 (CRC)
  // bytes; flip a payload byte of the second record, at byte offset 36.
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good());
    f.seekg(36 + 12 + 3);
    char c = 0;
    f.get(c);
    f.seekp(36 + 12 + 3);
    f.put(static_cast<char>(c ^ 0x5a));
  }
  const std::string train = "env STRATA_LOG_LEVEL=warn " + std::string(STRATA_TRAIN_BIN) + " --data " + file +
                            " --steps 3 --global-batch 8 --quiet" + model;
  r = run(train);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("corrupt record in '" + file + "' at byte offset 36"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("run again with --skip-corrupt"), std::string::npos) << r.output;

  r = run(train + " --skip-corrupt");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("trained 3 steps"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("skipping corrupt record in '" + file + "' at byte offset 36"), std::string::npos)
      << r.output;

  r = run(std::string(STRATA_TRAIN_BIN) + " --help");
  EXPECT_NE(r.output.find("--skip-corrupt"), std::string::npos) << r.output;
}

// Reads the strace log and returns the lines (any process) in order.
std::vector<std::string> lines_of(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// The weights file is durable: the temp's data is fsync'ed before the rename
// and the directory after it; a temp left by a dead writer is removed at the
// start of the next run, and one of a live process is kept.
TEST_F(TrainTest, WeightsAreFsyncedBeforeTheRenameAndStaleTempsRemoved) {
  if (run("strace -V", 10).exit_code != 0) GTEST_SKIP() << "strace is not installed";
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof host - 1), 0);
  const std::string out = (dir_ / "w.json").string();
  // A pid that surely no longer runs: a child that has been reaped.
  const pid_t dead = fork();
  ASSERT_GE(dead, 0);
  if (dead == 0) _exit(0);
  ASSERT_EQ(waitpid(dead, nullptr, 0), dead);
  const std::string stale = out + ".tmp." + host + "." + std::to_string(dead);
  const std::string live = out + ".tmp." + host + "." + std::to_string(getpid());
  std::ofstream(stale).flush();
  std::ofstream(live).flush();
  const std::string log = (dir_ / "strace.txt").string();
  // LeakSanitizer cannot run under ptrace: a sanitized build's leak check
  // (not what this test is about) is turned off for the traced process.
  const char* asan = std::getenv("ASAN_OPTIONS");
  const std::string no_leak_check =
      "env ASAN_OPTIONS=" + std::string(asan != nullptr && *asan != '\0' ? std::string(asan) + ":" : "") +
      "detect_leaks=0 ";
  const Result r = run(no_leak_check + "strace -f -y -qq -o " + log +
                       " -e trace=openat,fsync,fdatasync,rename,renameat,renameat2 " +
                       std::string(STRATA_TRAIN_BIN) +
                       " --steps 2 --global-batch 8 --features 4 --hidden 4 --classes 2 --dataset-size 64 --quiet"
                       " --save " + out, 60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(fs::exists(stale)) << "a dead writer's temp must be removed:\n" << r.output;
  EXPECT_TRUE(fs::exists(live)) << "a live process's temp must be kept";
  EXPECT_NE(r.output.find("no longer runs"), std::string::npos) << r.output;
  std::ifstream in(out);
  ASSERT_TRUE(in.good());
  EXPECT_EQ(nlohmann::json::parse(in)["format"], "strata-train-weights-v1");

  // Find the fsync of the temp, the rename onto w.json and the directory fsync.
  const std::string tmp_mark = "w.json.tmp.";
  int fsync_tmp = -1, rename_at = -1, fsync_dir = -1;
  const std::vector<std::string> lines = lines_of(log);
  for (int i = 0; i < static_cast<int>(lines.size()); ++i) {
    const std::string& l = lines[size_t(i)];
    if (l.size() < 3 || l.compare(l.size() - 3, 3, "= 0") != 0) continue;  // failed or unfinished calls
    if ((l.find("fsync(") != std::string::npos || l.find("fdatasync(") != std::string::npos) &&
        l.find(tmp_mark) != std::string::npos && fsync_tmp < 0)
      fsync_tmp = i;
    if (l.find("rename") != std::string::npos && l.find(tmp_mark) != std::string::npos &&
        l.find("w.json\"") != std::string::npos)
      rename_at = i;
    if (rename_at >= 0 && i > rename_at && l.find("fsync(") != std::string::npos &&
        l.find("<" + fs::canonical(dir_).string() + ">") != std::string::npos)
      fsync_dir = i;
  }
  std::string all;
  for (const std::string& l : lines)
    if (l.find("w.json") != std::string::npos || l.find("fsync") != std::string::npos) all += l + "\n";
  ASSERT_GE(rename_at, 0) << "no rename of the temp onto w.json:\n" << all;
  ASSERT_GE(fsync_tmp, 0) << "the temp was never fsync'ed:\n" << all;
  EXPECT_LT(fsync_tmp, rename_at) << "fsync must precede the rename:\n" << all;
  EXPECT_GT(fsync_dir, rename_at) << "the directory must be fsync'ed after the rename:\n" << all;
}

}  // namespace
