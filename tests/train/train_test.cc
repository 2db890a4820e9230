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
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

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

// strata-train became a user of Trainer::fit; its results must not have
// moved. tests/train/golden/ holds weight files that the hand-written loop
// it had before (main at 28268f5) wrote for these flags; fit must give the
// same bits, final loss included, for one process (one replica, or three
// with an uneven split), for 2 and 4 worker processes (whose sums differ
// from one_device's by an ulp here and there, so each has its own file),
// with shuffling, and whatever the epochs --steps is cut into. The learning
// rate 0.3 is not a power of two, so the way lr * g is rounded shows. The
// 4-worker file was written again when small all-reduces of 4 or more
// ranks took recursive doubling's order (2026-12-07): 235 of its 676
// values moved, by at most 4.7e-8 * (1 + |value|), the final loss not.
json read_json_file(const fs::path& p) {
  std::ifstream in(p);
  return in.good() ? json::parse(in, nullptr, false) : json();
}

void expect_bitwise(const json& got, const json& want, const std::string& what) {
  ASSERT_TRUE(want.contains("weights")) << what << ": unreadable golden file";
  ASSERT_TRUE(got.contains("weights")) << what << ": no weights written";
  EXPECT_EQ(got["final_loss"], want["final_loss"]) << what;
  EXPECT_EQ(got["steps"], want["steps"]) << what;
  ASSERT_EQ(got["weights"].size(), want["weights"].size()) << what;
  for (auto& [name, w] : want["weights"].items()) {
    const json& g = got["weights"][name];
    ASSERT_EQ(g["shape"], w["shape"]) << what << ": " << name;
    std::size_t differ = 0, first = 0;
    for (std::size_t i = 0; i < w["data"].size(); ++i)
      if (g["data"][i] != w["data"][i] && differ++ == 0) first = i;
    EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << w["data"].size() << " values of " << name
                          << " differ from the hand-written loop's, first at " << first << ": " << g["data"][first]
                          << " vs " << w["data"][first];
  }
}

TEST_F(TrainTest, FitGivesTheHandWrittenLoopsWeightsBitForBit) {
  const std::string model =
      " --steps 40 --global-batch 96 --features 16 --hidden 32 --classes 4 --lr 0.3 --dataset-size 4096 --seed 7";
  const std::string bin = STRATA_TRAIN_BIN;
  struct Case {
    std::string launcher, args, golden;
  };
  std::vector<Case> cases = {
      {"", " --strategy one_device", "lr0.3-one_device"},
      {"", " --strategy one_device --steps-per-epoch 40", "lr0.3-one_device"},
      {"", " --strategy one_device --steps-per-epoch 8 --validation-freq 2", "lr0.3-one_device"},
      {"", " --strategy mirrored --devices cpu:0,cpu:1,cpu:2", "lr0.3-mirrored3"},
  };
#ifdef STRATA_RUN_BIN
  cases.push_back({std::string(STRATA_RUN_BIN) + " -n 2 --timeout 200 -- ", " --strategy multi_worker_mirrored",
                   "lr0.3-mwms2"});
  cases.push_back({std::string(STRATA_RUN_BIN) + " -n 4 --timeout 200 -- ", " --strategy multi_worker_mirrored",
                   "lr0.3-mwms4"});
#endif
  int n = 0;
  for (const Case& c : cases) {
    const fs::path out = dir_ / ("fit" + std::to_string(n++) + ".json");
    const Result r = run(c.launcher + bin + model + c.args + " --save " + out.string(), 240);
    ASSERT_EQ(r.exit_code, 0) << c.args << "\n" << r.output;
    expect_bitwise(read_json_file(out), read_json_file(fs::path(STRATA_TRAIN_GOLDEN_DIR) / (c.golden + ".json")),
                   c.launcher + c.args);
    if (c.launcher.empty()) continue;
    // The progress bar is the chief's: every "Epoch" line comes from rank 0.
    std::size_t epochs = 0;
    std::istringstream lines(r.output);
    for (std::string l; std::getline(lines, l);)
      if (l.find("Epoch ") != std::string::npos) {
        ++epochs;
        EXPECT_EQ(l.rfind("[0] Epoch ", 0), 0u) << l;
      }
    EXPECT_EQ(epochs, 10u) << r.output;
  }
  const fs::path out = dir_ / "shuffled.json";
  const Result r = run(bin +
                       " --strategy one_device --steps 30 --global-batch 96 --features 16 --hidden 32 --classes 4"
                       " --lr 0.3 --dataset-size 2000 --shuffle-buffer 700 --seed 5 --quiet --save " + out.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_bitwise(read_json_file(out), read_json_file(fs::path(STRATA_TRAIN_GOLDEN_DIR) / "lr0.3-shuffle-one_device.json"),
                 "shuffled");
}

// The lines that start with `prefix`.
std::vector<std::string> lines_starting(const std::string& text, const std::string& prefix) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);)
    if (l.rfind(prefix, 0) == 0) out.push_back(l);
  return out;
}

// "name: 0.1234" in a progress line: the number's text ("" when absent).
std::string metric_in(const std::string& line, const std::string& name) {
  const std::size_t at = line.find(" - " + name + ": ");
  if (at == std::string::npos) return "";
  const std::size_t from = at + name.size() + 5;
  return line.substr(from, line.find(' ', from) - from);
}

// --steps N is cut into epochs: by default at most 10 of equal length, each
// ending with one progress line (stdout is a pipe here) holding the
// epoch's training loss and accuracy and those of the held-out set; the
// last validation is over the same held-out examples as the final line.
TEST_F(TrainTest, EpochsReportValidationAccuracyAndStepsStayExact) {
  const std::string base = std::string(STRATA_TRAIN_BIN) +
                           " --strategy one_device --global-batch 96 --features 16 --hidden 32 --classes 4 --lr 0.5"
                           " --dataset-size 4096";
  Result r = run(base + " --steps 40");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("40 steps (10 epoch(s) of 4)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("trained 40 steps"), std::string::npos) << r.output;
  std::vector<std::string> epochs = lines_starting(r.output, "Epoch ");
  ASSERT_EQ(epochs.size(), 10u) << r.output;
  for (std::size_t i = 0; i < epochs.size(); ++i) {
    EXPECT_EQ(epochs[i].rfind("Epoch " + std::to_string(i + 1) + " - 4/4 - ", 0), 0u) << epochs[i];
    for (const char* m : {"loss", "accuracy", "val_loss", "val_accuracy"})
      EXPECT_NE(metric_in(epochs[i], m), "") << m << " missing in: " << epochs[i];
  }
  const std::vector<std::string> held = lines_starting(r.output, "held-out accuracy ");
  ASSERT_EQ(held.size(), 1u) << r.output;
  const std::string final_accuracy = held[0].substr(18, held[0].find(' ', 18) - 18);
  EXPECT_EQ(metric_in(epochs.back(), "val_accuracy"), final_accuracy) << epochs.back() << "\n" << held[0];
  EXPECT_GT(std::stod(final_accuracy), 0.6) << "chance is 0.25:\n" << r.output;

  // A prime number of steps is one epoch; an explicit divisor is obeyed,
  // with validation every second epoch.
  r = run(base + " --steps 37");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("trained 37 steps"), std::string::npos) << r.output;
  epochs = lines_starting(r.output, "Epoch ");
  ASSERT_EQ(epochs.size(), 1u) << r.output;
  EXPECT_EQ(epochs[0].rfind("Epoch 1 - 37/37 - ", 0), 0u) << epochs[0];
  r = run(base + " --steps 40 --steps-per-epoch 10 --validation-freq 2 --log-every 15");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  epochs = lines_starting(r.output, "Epoch ");
  ASSERT_EQ(epochs.size(), 4u) << r.output;
  for (std::size_t i = 0; i < epochs.size(); ++i)
    EXPECT_EQ(metric_in(epochs[i], "val_accuracy").empty(), i % 2 == 0) << epochs[i];
  // --log-every N (not a terminal): the step lines of the loop, every N
  // steps and at the last.
  std::vector<std::string> steps = lines_starting(r.output, "step ");
  ASSERT_EQ(steps.size(), 3u) << r.output;
  EXPECT_EQ(steps[0].rfind("step 15/40  loss ", 0), 0u) << steps[0];
  EXPECT_EQ(steps[1].rfind("step 30/40  loss ", 0), 0u) << steps[1];
  EXPECT_EQ(steps[2].rfind("step 40/40  loss ", 0), 0u) << steps[2];
  // --quiet: no progress at all, the result lines stay.
  r = run(base + " --steps 8 --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(lines_starting(r.output, "Epoch ").empty()) << r.output;
  EXPECT_EQ(lines_starting(r.output, "held-out accuracy ").size(), 1u) << r.output;

  r = run(base + " --steps 40 --steps-per-epoch 7");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--steps-per-epoch 7 does not divide --steps 40"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(e.g. 4)"), std::string::npos) << r.output;
}

// On a terminal (a pseudo-terminal from script(1)) the chief's progress
// is Keras' redrawn bar: "Epoch k" on a line of its own, then "\rS/N ━━..."
// redrawn every 10 steps and finished with the validation metrics; the
// --log-every lines are for logs, not terminals.
TEST_F(TrainTest, ProgressBarIsRedrawnOnATerminal) {
  if (run("script --version", 10).exit_code != 0) GTEST_SKIP() << "script(1) is not installed";
  const Result r = run("script -qec \"" + std::string(STRATA_TRAIN_BIN) +
                       " --strategy one_device --steps 40 --steps-per-epoch 20 --log-every 10 --global-batch 96"
                       " --features 16 --hidden 32 --classes 4 --dataset-size 4096\" /dev/null", 60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("Epoch 1\r\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Epoch 2\r\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\r10/Unknown "), std::string::npos) << "first epoch, length not known yet:\n" << r.output;
  const std::string full_bar = "\r20/20 " + [] {
    std::string bar;
    for (int i = 0; i < 20; ++i) bar += "\u2501";
    return bar;
  }();
  EXPECT_NE(r.output.find(full_bar), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("- val_accuracy: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\x1b[K"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("step 10/40"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("held-out accuracy "), std::string::npos) << r.output;
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

// strata-train's MLP computes on the host: strategies that would take every
// visible GPU get cpu:0 when no device is named (so the same command trains
// on a GPU machine), and a GPU named by flag or config is refused, pointing
// to the GPU example.
TEST_F(TrainTest, RunsOnTheHostByDefaultAndRefusesGpuDevicesByName) {
  for (const char* strategy : {"mirrored", "central_storage", "multi_worker_mirrored"}) {
    const Result r = run(std::string(STRATA_TRAIN_BIN) + " --strategy " + strategy + " --steps 2 --quiet");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(std::string("with ") + strategy + " on 1 replica(s)"), std::string::npos) << r.output;
  }
  const std::string cfg = (dir_ / "job.json").string();
  std::ofstream(cfg) << R"({"strategy": {"name": "one_device", "options": {"device": "cuda:1"}}})";
  for (const std::string& args : {std::string(" --strategy mirrored --devices cpu:0,gpu:0"), " --config " + cfg}) {
    const Result r = run(std::string(STRATA_TRAIN_BIN) + args + " --steps 1 --quiet");
    EXPECT_NE(r.exit_code, 0) << args;
    EXPECT_NE(r.output.find("strata-train's MLP computes on the host"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("examples/gpu"), std::string::npos) << r.output;
  }
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
