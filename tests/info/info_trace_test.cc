// SPDX-License-Identifier: Apache-2.0
// `strata-info trace DIR` on hand-written trace files, as a user runs it
// after a failed job.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "subprocess.h"

namespace {

using json = nlohmann::json;

strata::test::ProcResult run_trace(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {STRATA_INFO_BIN, "trace"};
  argv.insert(argv.end(), args.begin(), args.end());
  return strata::test::run_program(argv, {{"STRATA_LOG_LEVEL", "off"}}, 60);
}

json collective(int seq, const std::string& op, const std::string& state, int64_t start, int64_t end) {
  return {{"seq", seq},   {"op", op},         {"bytes", 4000}, {"state", state},
          {"start_ms", start}, {"end_ms", end}, {"error", state == "failed" ? "lost connection" : ""}};
}

void write_trace(const strata::test::TempDir& dir, int rank, const std::string& verdict, const json& collectives) {
  const json doc = {{"rank", rank},
                    {"world_size", 4},
                    {"communicator", "mwms/0"},
                    {"host", "host" + std::to_string(rank)},
                    {"pid", 4000 + rank},
                    {"verdict", verdict},
                    {"culprits", {2}},
                    {"error", "all_reduce #12 (SUM, float32 x 1000): receiving from rank 2 failed (rank " +
                                  std::to_string(rank) + ")"},
                    {"collectives", collectives},
                    {"a_field_from_a_newer_writer", {{"x", 1}}}};
  std::ofstream(dir.path() / ("rank-" + std::to_string(rank) + ".json")) << doc.dump();
}

const std::string kAllReduce = "all_reduce(SUM, float32 x 1000)";
const std::string kVerdict = "rank 2 of 4 died (its process is gone) during all_reduce #12 (SUM, float32 x 1000)";

/// Ranks 0, 1, 3 of 4 (rank 2 died): seq 11 done everywhere, 12 failed on
/// 0 and 1 but still running on 3, 13 called as a different op by rank 3,
/// and 10 known only to rank 0.
void write_job(const strata::test::TempDir& dir) {
  const int64_t t = 1764043200000;
  write_trace(dir, 0, kVerdict,
              {collective(10, kAllReduce, "completed", t, t + 3), collective(11, kAllReduce, "completed", t + 10, t + 12),
               collective(12, kAllReduce, "failed", t + 20, t + 420)});
  write_trace(dir, 1, kVerdict,
              {collective(11, kAllReduce, "completed", t + 10, t + 13), collective(12, kAllReduce, "failed", t + 20, t + 2520),
               collective(13, kAllReduce, "started", t + 2600, 0)});
  write_trace(dir, 3, kVerdict,
              {collective(11, kAllReduce, "completed", t + 10, t + 12), collective(12, kAllReduce, "started", t + 20, 0),
               collective(13, "broadcast(float32 x 10, root 0)", "started", t + 30, 0)});
}

/// The table row of `seq` (the line starting with it after the indent).
std::string row_of(const std::string& out, int seq) {
  std::istringstream in(out);
  std::string line;
  bool in_table = false;
  while (std::getline(in, line)) {
    if (line.find("seq") != std::string::npos && line.find("rank 0") != std::string::npos) in_table = true;
    if (!in_table) continue;
    std::istringstream fields(line);
    std::string first;
    if (fields >> first && first == std::to_string(seq)) return line;
  }
  return "";
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + what.size())) ++n;
  return n;
}

TEST(InfoTraceTest, TableShowsEveryRanksStatePerSequenceAndTheVerdict) {
  strata::test::TempDir dir;
  write_job(dir);
  const auto r = run_trace({dir.str()});
  ASSERT_FALSE(r.timed_out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("Verdict (ranks 0, 1, 3 agree): " + kVerdict + "\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("No trace from rank 2"), std::string::npos) << r.out;
  for (int rank : {0, 1, 3}) {
    EXPECT_NE(r.out.find("host" + std::to_string(rank) + ", pid " + std::to_string(4000 + rank) + ": all_reduce #12"),
              std::string::npos)
        << r.out;
  }
  const std::string r10 = row_of(r.out, 10), r11 = row_of(r.out, 11), r12 = row_of(r.out, 12), r13 = row_of(r.out, 13);
  ASSERT_FALSE(r11.empty()) << r.out;
  EXPECT_EQ(count(r10, "done 3 ms"), 1u) << r10;
  EXPECT_EQ(count(r10, " - "), 2u) << "ranks 1 and 3 have no record of seq 10: " << r10;
  EXPECT_EQ(count(r11, "done 2 ms"), 2u) << r11;
  EXPECT_EQ(count(r11, "done 3 ms"), 1u) << r11;
  EXPECT_NE(r11.find(kAllReduce), std::string::npos) << r11;
  EXPECT_EQ(count(r11, kAllReduce), 1u) << "an op every rank agrees on is printed once: " << r11;
  EXPECT_EQ(r11.find("differs"), std::string::npos) << r11;
  EXPECT_NE(r12.find("FAILED 400 ms"), std::string::npos) << r12;
  EXPECT_NE(r12.find("FAILED 2.5 s"), std::string::npos) << r12;
  EXPECT_NE(r12.find("started"), std::string::npos) << r12;
  EXPECT_EQ(r12.find("differs"), std::string::npos) << r12;
  EXPECT_NE(r13.find("<-- differs"), std::string::npos) << r13;
  EXPECT_NE(r13.find("rank 1: " + kAllReduce), std::string::npos) << r13;
  EXPECT_NE(r13.find("rank 3: broadcast(float32 x 10, root 0)"), std::string::npos) << r13;
  EXPECT_NE(r13.find(" - "), std::string::npos) << "rank 0 has no seq 13: " << r13;
  // Rows in ascending sequence order.
  EXPECT_LT(r.out.find(r10), r.out.find(r11));
  EXPECT_LT(r.out.find(r11), r.out.find(r12));
  EXPECT_LT(r.out.find(r12), r.out.find(r13));
}

TEST(InfoTraceTest, EightRanksFitInAbout160Columns) {
  strata::test::TempDir dir;
  const int64_t t = 1764043200000;
  for (int rank = 0; rank < 8; ++rank)
    write_trace(dir, rank, kVerdict,
                {collective(1, kAllReduce, "completed", t, t + 12345), collective(2, kAllReduce, "failed", t, t + 99000)});
  const auto r = run_trace({dir.str()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string row = row_of(r.out, 2);
  EXPECT_EQ(count(row, "FAILED 99.0 s"), 8u) << row;
  EXPECT_LE(row.size(), 160u) << row;
}

TEST(InfoTraceTest, DifferingVerdictsAreEachShownWithTheirRanks) {
  strata::test::TempDir dir;
  write_trace(dir, 0, "rank 2 of 4 is frozen (no heartbeat for 30 s)", json::array());
  write_trace(dir, 1, "rank 2 of 4 is frozen (no heartbeat for 30 s)", json::array());
  write_trace(dir, 3, "rank 1 of 4 is stuck at all_reduce #3", json::array());
  write_trace(dir, 2, "", json::array());
  const auto r = run_trace({dir.str()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("Verdict (ranks 0, 1 agree): rank 2 of 4 is frozen (no heartbeat for 30 s)\n"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("Verdict (rank 3): rank 1 of 4 is stuck at all_reduce #3\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("pid 4002, no verdict: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(no rank recorded any)"), std::string::npos) << r.out;
}

TEST(InfoTraceTest, CorruptFilesAreSkippedWithAWarning) {
  strata::test::TempDir dir;
  write_job(dir);
  std::ofstream(dir.path() / "rank-2.json") << "{\"rank\": 2, \"verdict\": \"cut sh";
  std::ofstream(dir.path() / "rank-5.json") << R"({"verdict": "no rank field"})";
  std::ofstream(dir.path() / "rank-6.json.tmp") << "not a trace file name";
  const auto r = run_trace({dir.str()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(count(r.err, "skipping trace file"), 2u) << r.err;
  EXPECT_NE(r.err.find("rank-2.json: not valid JSON"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank-5.json: no non-negative integer \"rank\""), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("rank-6"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("Verdict (ranks 0, 1, 3 agree)"), std::string::npos) << r.out;
  EXPECT_FALSE(row_of(r.out, 12).empty()) << r.out;
}

TEST(InfoTraceTest, JsonMergesTheRanks) {
  strata::test::TempDir dir;
  write_job(dir);
  const auto r = run_trace({dir.str(), "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json doc = json::parse(r.out);
  EXPECT_EQ(doc["world_size"], 4);
  EXPECT_EQ(doc["communicators"], json({"mwms/0"}));
  EXPECT_EQ(doc["missing_ranks"], json({2}));
  ASSERT_EQ(doc["verdicts"].size(), 1u);
  EXPECT_EQ(doc["verdicts"][0]["ranks"], json({0, 1, 3}));
  EXPECT_EQ(doc["verdicts"][0]["verdict"], kVerdict);
  ASSERT_EQ(doc["ranks"].size(), 3u);
  EXPECT_EQ(doc["ranks"][2]["rank"], 3);
  EXPECT_EQ(doc["ranks"][2]["host"], "host3");
  EXPECT_EQ(doc["ranks"][2]["culprits"], json({2}));
  std::vector<int> seqs;
  for (const auto& c : doc["collectives"]) seqs.push_back(c["seq"].get<int>());
  EXPECT_EQ(seqs, (std::vector<int>{10, 11, 12, 13}));
  const json& c12 = doc["collectives"][2];
  EXPECT_EQ(c12["op"], kAllReduce);
  EXPECT_EQ(c12["differs"], false);
  ASSERT_EQ(c12["ranks"].size(), 3u);
  EXPECT_EQ(c12["ranks"][1]["rank"], 1);
  EXPECT_EQ(c12["ranks"][1]["state"], "failed");
  EXPECT_EQ(c12["ranks"][2]["state"], "started");
  const json& c13 = doc["collectives"][3];
  EXPECT_TRUE(c13["op"].is_null());
  EXPECT_EQ(c13["differs"], true);
}

TEST(InfoTraceTest, AnEmptyOrMissingDirectoryIsAnErrorSayingWhereFilesComeFrom) {
  strata::test::TempDir dir;
  std::ofstream(dir.path() / "notes.txt") << "unrelated";
  for (const std::string& d : {dir.str(), dir.str() + "/missing"}) {
    const auto r = run_trace({d});
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("'" + d + "'"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("only when a collective fails while STRATA_TRACE_DIR is set"), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  std::ofstream(dir.path() / "rank-0.json") << "garbage";
  const auto r = run_trace({dir.str()});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("none of the 1 rank-*.json file(s)"), std::string::npos) << r.err;
}

}  // namespace
