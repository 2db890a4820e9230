// SPDX-License-Identifier: Apache-2.0
// Parameter-server training over real processes: a coordinator (this
// binary with --coordinator SCENARIO), workers (this binary with --serve,
// so they know the functions registered below, as a user's own program
// would) and ps tasks (strata-server). Every process gets its TF_CONFIG;
// the chief's port comes from the OS. The coordinator prints one
// "RESULT {json}" line; the test checks it and how every process ended.
// Every child dies with this process (PR_SET_PDEATHSIG), every wait has a
// deadline, and Children kills and reaps whatever still runs.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/prctl.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "strata/config.hpp"
#include "strata/coordinator.hpp"
#include "strata/plugin_host.hpp"
#include "test_support.h"

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string slurp(const std::string& path);

// Writes `text` to `path` whole: the test polls for the file and reads it at
// once, so it must never see the file created but not yet written.
void announce(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".part";
  std::ofstream(tmp) << text;
  std::filesystem::rename(tmp, path);
}

// ---- the functions the workers run ----

strata::Value square(const strata::Args& a) {
  const std::int64_t x = strata::get_arg<std::int64_t>(a, 0);
  return strata::Value(x * x);
}
STRATA_REGISTER_FUNCTION("square", square);

strata::Value add_one(const strata::Args& a) {
  const auto& v = strata::get_arg<strata::RemoteVariable>(a, 0);
  std::int64_t n = 1;
  for (auto d : v.shape()) n *= d;
  v.assign_add(strata::Tensor::from_vector(std::vector<std::int64_t>(static_cast<std::size_t>(n), 1), v.shape()));
  return strata::Value();
}
STRATA_REGISTER_FUNCTION("add_one", add_one);

// scale(t, k): t * k, a tensor argument and result.
STRATA_REGISTER_FUNCTION("scale", [](const strata::Args& a) -> strata::Value {
  const auto& t = strata::get_arg<strata::Tensor>(a, 0);
  const double k = strata::get_arg<double>(a, 1);
  std::vector<float> v = t.to_vector<float>();
  for (float& x : v) x = static_cast<float>(x * k);
  return strata::Value(strata::Tensor::from_vector(v, t.shape()));
});

// fail(text[, gate]): throws std::invalid_argument; with a gate variable it
// first waits (up to 60 s) until the coordinator set the gate to 1, so the
// error cannot overtake the coordinator's schedule() calls on a slow machine.
STRATA_REGISTER_FUNCTION("fail", [](const strata::Args& a) -> strata::Value {
  if (a.size() > 1) {
    const auto& gate = strata::get_arg<strata::RemoteVariable>(a, 1);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (gate.read().to_vector<std::int64_t>()[0] == 0 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  throw std::invalid_argument("bad input: " + strata::get_arg<std::string>(a, 0));
});

STRATA_REGISTER_FUNCTION("sleepy", [](const strata::Args& a) -> strata::Value {
  std::this_thread::sleep_for(std::chrono::milliseconds(strata::get_arg<std::int64_t>(a, 0)));
  return strata::Value(std::int64_t{1});
});

// slow_add(v, id): add 1 to v and return id; on the worker started with
// PS_TEST_HANG set, announce it in that file and hang (the test kills it).
STRATA_REGISTER_FUNCTION("slow_add", [](const strata::Args& a) -> strata::Value {
  if (const char* hang = std::getenv("PS_TEST_HANG"); hang != nullptr && hang[0] != '\0') {
    announce(hang, "in closure\n");
    std::this_thread::sleep_for(std::chrono::seconds(120));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  add_one(a);
  return strata::Value(strata::get_arg<std::int64_t>(a, 1));
});

// ---- per-worker datasets and values ----

constexpr std::int64_t kInputSize = 12;

// Worker w's input: w * 1000 + [0, kInputSize), so each element names its worker.
STRATA_REGISTER_DATASET_FN("range_input", [](const strata::InputContext& ctx) {
  std::vector<std::int64_t> v;
  for (std::int64_t i = 0; i < kInputSize; ++i) v.push_back(ctx.input_pipeline_id * 1000 + i);
  strata::Element e;
  e.add("x", strata::Tensor::from_vector(v, {kInputSize}));
  return strata::Dataset::from_tensor_slices(std::move(e));
});

// take_one(iterator): [pid, next x or -1 at the end]. On the worker started
// with PS_TEST_HANG_TAKE, announce the first element in that file and hang.
STRATA_REGISTER_FUNCTION("take_one", [](const strata::Args& a) -> strata::Value {
  strata::LocalIterator it = strata::get_iterator(a, 0);
  std::optional<strata::Element> e = it.get_next_as_optional();
  const std::int64_t x = e ? (*e)["x"].to_vector<std::int64_t>()[0] : -1;
  if (const char* hang = std::getenv("PS_TEST_HANG_TAKE"); hang != nullptr && hang[0] != '\0') {
    announce(hang, "took " + std::to_string(x) + "\n");
    std::this_thread::sleep_for(std::chrono::seconds(120));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return strata::Value(strata::Tensor::from_vector(std::vector<std::int64_t>{::getpid(), x}, {2}));
});

// take_strict(iterator): next x; OutOfRangeError at the end (tf's next()).
STRATA_REGISTER_FUNCTION("take_strict", [](const strata::Args& a) -> strata::Value {
  return strata::Value(strata::get_iterator(a, 0).get_next()["x"].to_vector<std::int64_t>()[0]);
});

STRATA_REGISTER_FUNCTION("my_pid", [](const strata::Args&) -> strata::Value {
  return strata::Value(static_cast<std::int64_t>(::getpid()));
});

// echo_local(per-worker value): this worker's value of it.
STRATA_REGISTER_FUNCTION("echo_local", [](const strata::Args& a) -> strata::Value {
  return strata::Value(std::get<std::int64_t>(strata::get_per_worker_value(a, 0)));
});

// ---- scatter updates ----

// scatter_step(v [7, 2] int64, j): scatter_add rows {0, 3, 6, 6, j % 7} by
// [1, 2] each, then scatter_sub row 5 by [1, 1].
std::vector<std::int64_t> scatter_step_rows(std::int64_t j) { return {0, 3, 6, 6, j % 7}; }
STRATA_REGISTER_FUNCTION("scatter_step", [](const strata::Args& a) -> strata::Value {
  const auto& v = strata::get_arg<strata::RemoteVariable>(a, 0);
  const std::int64_t j = strata::get_arg<std::int64_t>(a, 1);
  strata::IndexedSlices add;
  add.indices = strata::Tensor::from_vector(scatter_step_rows(j), {5});
  add.values = strata::Tensor::from_vector(std::vector<std::int64_t>{1, 2, 1, 2, 1, 2, 1, 2, 1, 2}, {5, 2});
  v.scatter_add(add);
  strata::IndexedSlices sub;
  sub.indices = strata::Tensor::from_vector(std::vector<std::int64_t>{5}, {1});
  sub.values = strata::Tensor::from_vector(std::vector<std::int64_t>{1, 1}, {1, 2});
  v.scatter_sub(sub);
  return strata::Value();
});

// scatter_bad(v, index): scatter_add one row at `index` (from a worker).
STRATA_REGISTER_FUNCTION("scatter_bad", [](const strata::Args& a) -> strata::Value {
  const auto& v = strata::get_arg<strata::RemoteVariable>(a, 0);
  strata::IndexedSlices s;
  s.indices = strata::Tensor::from_vector(std::vector<std::int64_t>{strata::get_arg<std::int64_t>(a, 1)}, {1});
  s.values = strata::Tensor::from_vector(std::vector<std::int64_t>{1, 1}, {1, 2});
  v.scatter_add(s);
  return strata::Value();
});

// blip_step(v [6, 3] int64): add 1 everywhere and 1 more to row 0.
strata::Value blip_step(const strata::Args& a) {
  const auto& v = strata::get_arg<strata::RemoteVariable>(a, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  v.assign_add(strata::Tensor::from_vector(std::vector<std::int64_t>(18, 1), {6, 3}));
  strata::IndexedSlices s;
  s.indices = strata::Tensor::from_vector(std::vector<std::int64_t>{0}, {1});
  s.values = strata::Tensor::from_vector(std::vector<std::int64_t>{1, 1, 1}, {1, 3});
  v.scatter_add(s);
  return strata::Value();
}
STRATA_REGISTER_FUNCTION("blip_step", blip_step);

// die_once_add(v, marker): the first worker to run it writes its task index
// to `marker` and exits 3 mid-closure (a crash); every other run adds 1 to v.
STRATA_REGISTER_FUNCTION("die_once_add", [](const strata::Args& a) -> strata::Value {
  const std::string marker = strata::get_arg<std::string>(a, 1);
  const int fd = ::open(marker.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (fd >= 0) {
    const json tf = json::parse(std::getenv("TF_CONFIG"));
    const std::string index = std::to_string(tf["task"]["index"].get<int>());
    (void)!::write(fd, index.data(), index.size());
    ::close(fd);
    std::_Exit(3);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  return add_one(a);
});

// bulk_add(v, k): add k to every element of a float32 variable (a large one
// travels as the frame's bulk).
STRATA_REGISTER_FUNCTION("bulk_add", [](const strata::Args& a) -> strata::Value {
  const auto& v = strata::get_arg<strata::RemoteVariable>(a, 0);
  const double k = strata::get_arg<double>(a, 1);
  std::int64_t n = 1;
  for (auto d : v.shape()) n *= d;
  v.assign_add(strata::Tensor::from_vector(std::vector<float>(static_cast<std::size_t>(n), static_cast<float>(k)), v.shape()));
  return strata::Value();
});

// bulk_read(v): read v and return its first element, or -1 when its
// elements differ (a read saw an update half applied).
STRATA_REGISTER_FUNCTION("bulk_read", [](const strata::Args& a) -> strata::Value {
  const auto& v = strata::get_arg<strata::RemoteVariable>(a, 0);
  const std::vector<float> x = v.read().to_vector<float>();
  for (float e : x)
    if (e != x.front()) return strata::Value(-1.0);
  return strata::Value(static_cast<double>(x.front()));
});

void load_config() {
  strata::Config cfg;
  cfg.apply_env();
  strata::PluginHost::global().set_config(cfg.json());
}

int serve() {
  load_config();
  strata::ServerOptions o;
  if (const char* t = std::getenv("PS_TEST_COORDINATOR_TIMEOUT_S")) o.coordinator_timeout_s = std::atof(t);
  try {
    strata::Server s = strata::Server::from_env(o);
    s.join();
    return 0;
  } catch (const strata::UnavailableError& e) {
    std::fprintf(stderr, "serve: %s\n", e.what());
    return 3;
  }
}

json placement(strata::ClusterCoordinator& c) {
  json out;
  std::vector<int> plain;
  std::vector<double> reads;
  for (int i = 0; i < 5; ++i) {
    auto v = c.create_variable("v" + std::to_string(i), strata::Tensor::scalar<float>(static_cast<float>(i)));
    plain.push_back(v.shard_ps_task(0));
    reads.push_back(v.read().to_vector<float>()[0]);  // only the named ps holds the shard's id
  }
  std::vector<float> init(10);
  for (int i = 0; i < 10; ++i) init[static_cast<std::size_t>(i)] = static_cast<float>(i);
  auto sh = c.create_variable("sharded", strata::Tensor::from_vector(init, {5, 2}), strata::FixedShardsPartitioner(3));
  std::vector<int> shards;
  for (std::int64_t i = 0; i < sh.num_shards(); ++i) shards.push_back(sh.shard_ps_task(i));
  out["plain_ps"] = plain;
  out["plain_read"] = reads;
  out["sharded_ps"] = shards;
  out["sharded_read"] = sh.read().to_vector<float>();
  return out;
}

std::string error_type(const strata::Error& e) { return e.code_name(); }

int coordinate(const std::string& scenario) {
  load_config();
  strata::CoordinatorOptions opts;
  opts.join_timeout_s = 120;
  opts.op_timeout_s = 30;
  if (const char* t = std::getenv("PS_TEST_OP_TIMEOUT_S")) opts.op_timeout_s = std::atof(t);
  json out;
  try {
    strata::ClusterCoordinator c(opts);
    out["num_workers"] = c.num_workers();
    out["num_ps"] = c.num_ps();
    if (scenario == "placement") {
      out["placement"] = placement(c);
    } else if (scenario == "basic") {
      out["placement"] = placement(c);
      std::vector<strata::RemoteValue> sq;
      for (int i = 0; i < 20; ++i) sq.push_back(c.schedule_fn("square", i));
      c.join();
      out["done"] = c.done();
      std::vector<std::int64_t> squares;
      std::set<int> workers;
      for (auto& r : sq) {
        squares.push_back(std::get<std::int64_t>(c.fetch(r)));
        out["statuses"].push_back(strata::remote_value_status_name(r.status()));
        workers.insert(r.worker());
      }
      out["squares"] = squares;
      auto scaled = c.schedule_fn("scale", strata::Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3}), 2.5);
      const auto& st = scaled.fetch_as<strata::Tensor>();
      out["scaled"] = st.to_vector<float>();
      out["scaled_shape"] = st.shape();
      out["workers_used"] = std::vector<int>(workers.begin(), workers.end());
      try {
        c.schedule_fn("no_such_fn", 1);
        out["unknown"] = "no error";
      } catch (const strata::NotFoundError& e) {
        out["unknown"] = std::string("NotFoundError: ") + e.what();
      }
      // No lost updates: 2 workers x 40 closures, each adding 1 to every
      // element of a 2-shard variable, while the coordinator adds too.
      auto counter = c.create_variable("counter", strata::Tensor::zeros({6, 3}, strata::DType::kInt64),
                                       strata::FixedShardsPartitioner(2));
      for (int k = 0; k < 40; ++k) c.schedule_fn("add_one", counter);
      strata::Args mine;
      mine.emplace_back(counter);
      for (int k = 0; k < 10; ++k) add_one(mine);
      c.join();
      out["counter"] = counter.read().to_vector<std::int64_t>();
      // A failing closure: its error surfaces at join, the queue is cancelled.
      // (the gate holds the failure back until all 30 are queued behind it)
      auto gate = c.create_variable("gate", strata::Tensor::zeros({1}, strata::DType::kInt64));
      auto bad = c.schedule_fn("fail", std::string("seven"), gate);
      std::vector<strata::RemoteValue> after;
      for (int i = 0; i < 30; ++i) after.push_back(c.schedule_fn("sleepy", 500));
      gate.assign(strata::Tensor::from_vector(std::vector<std::int64_t>{1}, {1}));
      try {
        c.join();
        out["join_error"] = "none";
      } catch (const strata::Error& e) {
        out["join_error"] = e.what();
        out["join_error_type"] = error_type(e);
      }
      try {
        bad.fetch();
      } catch (const strata::InvalidArgumentError& e) {
        out["bad_fetch"] = "InvalidArgumentError";
      }
      out["bad_status"] = strata::remote_value_status_name(bad.status());
      int aborted = 0, ready = 0, other = 0;
      for (auto& r : after) {
        const auto st = r.status();
        if (st == strata::RemoteValueStatus::kAborted) ++aborted;
        else if (st == strata::RemoteValueStatus::kReady || st == strata::RemoteValueStatus::kRunning) ++ready;
        else ++other;
      }
      out["after"] = {{"aborted", aborted}, {"ready_or_running", ready}, {"other", other}};
      try {
        after.back().fetch();
      } catch (const strata::CancelledError&) {
        out["cancelled_fetch"] = "CancelledError";
      } catch (const strata::Error& e) {
        out["cancelled_fetch"] = error_type(e);
      }
      // A wrong argument kind is the function's InvalidArgumentError, naming both kinds.
      auto wrong = c.schedule_fn("square", std::string("seven"));
      try {
        c.join();
      } catch (const strata::InvalidArgumentError& e) {
        out["wrong_arg"] = e.what();
      }
      // Usable again.
      auto again = c.schedule_fn("square", 7);
      c.join();
      out["again"] = std::get<std::int64_t>(c.fetch(again));
    } else if (scenario == "worker_kill") {
      auto counter = c.create_variable("counter", strata::Tensor::zeros({1}, strata::DType::kInt64));
      std::vector<strata::RemoteValue> rv;
      for (int i = 0; i < 20; ++i) rv.push_back(c.schedule_fn("slow_add", counter, i));
      c.join();
      std::vector<std::int64_t> ids;
      std::vector<int> workers;
      for (auto& r : rv) {
        ids.push_back(std::get<std::int64_t>(c.fetch(r)));
        workers.push_back(r.worker());
      }
      out["ids"] = ids;
      out["workers"] = workers;
      out["counter"] = counter.read().to_vector<std::int64_t>();
    } else if (scenario == "rejoin") {
      // Worker 1 hangs in its first closure and is killed; once the test
      // has restarted it (PS_TEST_GO exists) it must get work again.
      auto counter = c.create_variable("counter", strata::Tensor::zeros({1}, strata::DType::kInt64));
      std::vector<strata::RemoteValue> rv;
      for (int i = 0; i < 10; ++i) rv.push_back(c.schedule_fn("slow_add", counter, i));
      c.join();
      const char* go = std::getenv("PS_TEST_GO");
      const auto wait_end = Clock::now() + std::chrono::seconds(90);
      while (go != nullptr && !std::ifstream(go) && Clock::now() < wait_end)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      const auto t0 = Clock::now();
      bool rejoined = false;
      while (!rejoined && Clock::now() < t0 + std::chrono::seconds(60)) {
        std::vector<strata::RemoteValue> more;
        for (int i = 0; i < 4; ++i) more.push_back(c.schedule_fn("slow_add", counter, 100 + i));
        c.join();
        for (auto& r : more) rejoined = rejoined || r.worker() == 1;
      }
      out["rejoined"] = rejoined;
      out["rejoin_s"] = std::chrono::duration<double>(Clock::now() - t0).count();
    } else if (scenario == "ps_kill") {
      auto a = c.create_variable("a", strata::Tensor::zeros({1}, strata::DType::kInt64));
      auto b = c.create_variable("b", strata::Tensor::zeros({1}, strata::DType::kInt64));
      out["b_ps"] = b.shard_ps_task(0);
      for (int i = 0; i < 4; ++i) c.schedule_fn("add_one", b);
      c.join();
      out["b_before"] = b.read().to_vector<std::int64_t>();
      std::printf("READY\n");
      std::fflush(stdout);
      const char* go = std::getenv("PS_TEST_GO");
      const auto wait_end = Clock::now() + std::chrono::seconds(60);
      while (go != nullptr && !std::ifstream(go) && Clock::now() < wait_end)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      const auto t0 = Clock::now();
      const auto end = t0 + std::chrono::seconds(30);
      while (Clock::now() < end) {
        try {
          c.schedule_fn("add_one", b);
          c.join();
        } catch (const strata::Error& e) {
          out["error"] = e.what();
          out["error_type"] = error_type(e);
          break;
        }
      }
      out["elapsed_s"] = std::chrono::duration<double>(Clock::now() - t0).count();
      // The closure's error was raised once; the ps failure itself stays:
      // the coordinator's heartbeat finds it without any closure.
      const auto t1 = Clock::now();
      while (Clock::now() < t1 + std::chrono::seconds(30)) {
        try {
          c.join();
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        } catch (const strata::Error& e) {
          out["join_error"] = e.what();
          out["join_error_type"] = error_type(e);
          break;
        }
      }
      out["join_elapsed_s"] = std::chrono::duration<double>(Clock::now() - t1).count();
    } else if (scenario == "datasets" || scenario == "dataset_restart") {
      auto ds = c.create_per_worker_dataset("range_input");
      auto it = ds.iter();
      // Pull until every worker's (current) process reported its end.
      std::map<std::int64_t, json> by_pid;  // pid -> {worker, values, ended}
      std::set<int> ended;
      const auto end = Clock::now() + std::chrono::seconds(120);
      while (ended.size() < static_cast<size_t>(c.num_workers()) && Clock::now() < end) {
        std::vector<strata::RemoteValue> batch;
        for (int i = 0; i < 8; ++i) batch.push_back(c.schedule_fn("take_one", it));
        c.join();
        for (auto& r : batch) {
          const auto v = r.fetch_as<strata::Tensor>().to_vector<std::int64_t>();
          json& p = by_pid[v[0]];
          p["worker"] = r.worker();
          if (!p.contains("values")) p["values"] = json::array();
          if (v[1] < 0) {
            p["ended"] = true;
            ended.insert(r.worker());
          } else {
            p["values"].push_back(v[1]);
          }
        }
      }
      for (auto& [pid, p] : by_pid) out["by_pid"].push_back(p);
      if (scenario == "datasets") {
        // tf's next() at the end: OutOfRangeError at join; usable after.
        c.schedule_fn("take_strict", it);
        try {
          c.join();
          out["strict"] = "no error";
        } catch (const strata::OutOfRangeError& e) {
          out["strict"] = e.what();
        }
        // A new iterator starts every worker's input again.
        auto it2 = ds.iter();
        auto first = c.schedule_fn("take_strict", it2);
        c.join();
        out["fresh_first"] = std::get<std::int64_t>(c.fetch(first));
        // Per-worker values: each worker's closure sees its own worker's value.
        auto pv = c.create_per_worker_values("my_pid");
        for (const auto& v : c.fetch(pv)) out["pv"].push_back(std::get<std::int64_t>(v.get()));
        std::vector<strata::RemoteValue> echo;
        for (int i = 0; i < 12; ++i) echo.push_back(c.schedule_fn("echo_local", pv));
        c.join();
        for (auto& r : echo) out["echo"].push_back({r.worker(), std::get<std::int64_t>(c.fetch(r))});
        c.schedule_fn("take_one", pv);
        try {
          c.join();
          out["wrong_kind"] = "no error";
        } catch (const strata::InvalidArgumentError& e) {
          out["wrong_kind"] = e.what();
        }
        try {
          c.create_per_worker_dataset("no_such_input");
          out["unknown_ds"] = "no error";
        } catch (const strata::NotFoundError& e) {
          out["unknown_ds"] = e.what();
        }
      }
    } else if (scenario == "scatter") {
      auto v = c.create_variable("emb", strata::Tensor::zeros({7, 2}, strata::DType::kInt64),
                                 strata::FixedShardsPartitioner(3));
      out["shards"] = v.num_shards();
      for (int j = 0; j < 60; ++j) c.schedule_fn("scatter_step", v, j);
      c.join();
      out["value"] = v.read().to_vector<std::int64_t>();
      std::vector<float> init(15);
      for (int i = 0; i < 15; ++i) init[static_cast<size_t>(i)] = static_cast<float>(i);
      auto u = c.create_variable("u", strata::Tensor::from_vector(init, {5, 3}), strata::FixedShardsPartitioner(3));
      strata::IndexedSlices up;
      up.indices = strata::Tensor::from_vector(std::vector<std::int64_t>{4, 0, 1, 1}, {4});
      up.values = strata::Tensor::from_vector(std::vector<float>{10, 11, 12, 20, 21, 22, 30, 31, 32, 40, 41, 42}, {4, 3});
      u.scatter_update(up);
      out["updated"] = u.read().to_vector<float>();
      auto attempt = [&](const char* key, std::vector<std::int64_t> idx, strata::Tensor values,
                         const strata::RemoteVariable& target) {
        strata::IndexedSlices s;
        const auto n = static_cast<std::int64_t>(idx.size());
        s.indices = strata::Tensor::from_vector(idx, {n});
        s.values = std::move(values);
        try {
          target.scatter_add(s);
          out[key] = "no error";
        } catch (const strata::InvalidArgumentError& e) {
          out[key] = e.what();
        }
      };
      attempt("err_range", {0, 7}, strata::Tensor::zeros({2, 2}, strata::DType::kInt64), v);
      attempt("err_negative", {-1}, strata::Tensor::zeros({1, 2}, strata::DType::kInt64), v);
      attempt("err_shape", {0, 1}, strata::Tensor::zeros({2, 3}, strata::DType::kInt64), v);
      attempt("err_dtype", {0}, strata::Tensor::zeros({1, 2}, strata::DType::kFloat32), v);
      auto scalar = c.create_variable("scalar", strata::Tensor::scalar<float>(1.0f));
      attempt("err_scalar", {0}, strata::Tensor::zeros({1}, strata::DType::kFloat32), scalar);
      out["after_errors"] = v.read().to_vector<std::int64_t>();
      c.schedule_fn("scatter_bad", v, 9);
      try {
        c.join();
        out["worker_err"] = "no error";
      } catch (const strata::InvalidArgumentError& e) {
        out["worker_err"] = e.what();
      }
    } else if (scenario == "bulk") {
      // Variables whose shards are >= 64 KiB travel as bulk: 4 MiB
      // unsharded, and 3 shards of ~80 KiB next to 2 shards of 52 KB (inline).
      auto big = c.create_variable("big", strata::Tensor::zeros({1024, 1024}, strata::DType::kFloat32));
      auto sharded = c.create_variable("sharded", strata::Tensor::zeros({300, 68}, strata::DType::kFloat32),
                                       strata::FixedShardsPartitioner(3));
      auto small = c.create_variable("small", strata::Tensor::zeros({130, 100}, strata::DType::kFloat32),
                                     strata::FixedShardsPartitioner(2));
      std::vector<strata::RemoteValue> reads;
      for (int k = 0; k < 40; ++k) {
        c.schedule_fn("bulk_add", big, 1.0);
        c.schedule_fn("bulk_add", sharded, 2.0);
        c.schedule_fn("bulk_add", small, 3.0);
        reads.push_back(c.schedule_fn("bulk_read", big));
      }
      // The coordinator reads while the workers update: never a torn value.
      int torn = 0;
      for (int k = 0; k < 40; ++k) {
        const std::vector<float> x = big.read().to_vector<float>();
        for (float e : x)
          if (e != x.front()) {
            ++torn;
            break;
          }
      }
      c.join();
      for (auto& r : reads)
        if (std::get<double>(c.fetch(r)) < 0) ++torn;
      out["torn"] = torn;
      auto all_equal = [](const std::vector<float>& x) -> json {
        for (float e : x)
          if (e != x.front()) return "differ";
        return x.front();
      };
      out["big"] = all_equal(big.read().to_vector<float>());
      out["sharded"] = all_equal(sharded.read().to_vector<float>());
      out["small"] = all_equal(small.read().to_vector<float>());
      // assign of a pattern comes back exactly, on every shard.
      std::vector<float> pattern(300 * 68);
      for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<float>(i % 1000) - 500.0f;
      sharded.assign(strata::Tensor::from_vector(pattern, {300, 68}));
      out["pattern_ok"] = sharded.read().to_vector<float>() == pattern;
      std::vector<float> big_pattern(1024 * 1024);
      for (std::size_t i = 0; i < big_pattern.size(); ++i) big_pattern[i] = static_cast<float>(i % 4093);
      big.assign(strata::Tensor::from_vector(big_pattern, {1024, 1024}));
      out["big_pattern_ok"] = big.read().to_vector<float>() == big_pattern;
      // A wrong shape is refused before anything is sent.
      try {
        big.assign(strata::Tensor::zeros({1024, 512}, strata::DType::kFloat32));
        out["wrong_shape"] = "no error";
      } catch (const strata::InvalidArgumentError& e) {
        out["wrong_shape"] = e.what();
      }
      out["big_after_error_ok"] = big.read().to_vector<float>() == big_pattern;
    } else if (scenario == "ps_blip") {
      auto v = c.create_variable("blip", strata::Tensor::zeros({6, 3}, strata::DType::kInt64),
                                 strata::FixedShardsPartitioner(3));
      for (std::int64_t i = 0; i < v.num_shards(); ++i) out["shard_ps"].push_back(v.shard_ps_task(i));
      for (int i = 0; i < 200; ++i) c.schedule_fn("blip_step", v);
      std::printf("READY\n");
      std::fflush(stdout);
      // The coordinator updates during the blip too.
      strata::Args mine;
      mine.emplace_back(v);
      for (int k = 0; k < 10; ++k) {
        blip_step(mine);
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      c.join();
      out["value"] = v.read().to_vector<std::int64_t>();
    } else if (scenario == "die_once") {
      // Under strata-run --restart-workers: a worker crashes in a closure,
      // the closure runs elsewhere, the worker is started again and rejoins.
      const std::string marker = std::getenv("PS_TEST_DIE_MARKER");
      auto counter = c.create_variable("counter", strata::Tensor::zeros({1}, strata::DType::kInt64));
      for (int i = 0; i < 10; ++i) c.schedule_fn("die_once_add", counter, marker);
      c.join();
      out["counter"] = counter.read().to_vector<std::int64_t>();
      const int died = std::atoi(slurp(marker).c_str());
      out["died"] = died;
      const auto t0 = Clock::now();
      bool rejoined = false;
      while (!rejoined && Clock::now() < t0 + std::chrono::seconds(60)) {
        std::vector<strata::RemoteValue> more;
        for (int i = 0; i < 4; ++i) more.push_back(c.schedule_fn("square", i));
        c.join();
        for (auto& r : more) rejoined = rejoined || r.worker() == died;
      }
      out["rejoined"] = rejoined;
    } else if (scenario == "lib") {
      std::vector<strata::RemoteValue> cubes;
      for (int i = 0; i < 6; ++i) cubes.push_back(c.schedule_fn("lib_cube", i));
      c.join();
      for (auto& r : cubes) out["cubes"].push_back(std::get<std::int64_t>(c.fetch(r)));
      try {
        c.schedule_fn("square", 3);  // only the test binary registers it
        out["square"] = "scheduled";
      } catch (const strata::Error& e) {
        out["square"] = e.what();
      }
    } else if (scenario == "coordinator_kill") {
      auto a = c.create_variable("a", strata::Tensor::zeros({1}, strata::DType::kInt64));
      c.schedule_fn("add_one", a);
      c.join();
      std::printf("READY\n");
      std::fflush(stdout);
      std::this_thread::sleep_for(std::chrono::seconds(120));  // the test kills us
    } else {
      std::fprintf(stderr, "unknown scenario %s\n", scenario.c_str());
      return 2;
    }
  } catch (const strata::Error& e) {
    out["fatal"] = e.what();
    out["fatal_type"] = error_type(e);
  }
  std::printf("RESULT %s\n", out.dump().c_str());
  std::fflush(stdout);
  return 0;
}

// ---- the test side ----

std::string self_path() { return strata::test::self_exe(); }

std::string slurp(const std::string& path) { return strata::test::read_text(path); }

struct Proc {
  pid_t pid = -1;
  std::string log;
  int status = -2;  // exit code, 128+signal; -2 while running
};

class PsCluster {
 public:
  // The servers count the coordinator's silence from their own start, so
  // the default leaves room for a coordinator that starts slowly (a
  // sanitizer build on a loaded machine took over 10 s to reach them; a
  // ThreadSanitizer build on a slower 2-core VM, 2026-12-05, took 43 s).
  // Tests of the silence itself pass their own (2 s).
  PsCluster(int workers, int ps, double coordinator_timeout_s = 120)
      : workers_(workers), ps_(ps), timeout_s_(coordinator_timeout_s) {
    auto port = [] { return "127.0.0.1:" + std::to_string(strata::test::unused_port()); };
    spec_["chief"] = {port()};
    for (int i = 0; i < workers; ++i) spec_["worker"].push_back(port());
    for (int i = 0; i < ps; ++i) spec_["ps"].push_back(port());
  }
  ~PsCluster() {
    // A failed test shows every process's log, whichever check failed (a
    // fault seen once in a loaded CI run must be diagnosable from its output).
    if (::testing::Test::HasFailure()) std::fprintf(stderr, "PsCluster logs of the failed test:\n%s", logs().c_str());
    for (auto& p : procs_) {
      if (p.status != -2) continue;
      ::kill(p.pid, SIGKILL);
      int st;
      ::waitpid(p.pid, &st, 0);
    }
  }

  std::string dir() const { return dir_.str(); }
  // The command of every worker task (default: this binary with --serve).
  std::vector<std::string> worker_cmd;

  std::map<std::string, std::string> env(const std::string& type, int index) const {
    json tf{{"cluster", spec_}, {"task", {{"type", type}, {"index", index}}}};
    return {{"TF_CONFIG", tf.dump()},
            {"STRATA_PLUGIN_PATH", STRATA_PS_PLUGIN_DIR},
            {"STRATA_RENDEZVOUS_TIMEOUT_S", "60"},
            {"STRATA_LOG_LEVEL", "info"},
            {"PS_TEST_COORDINATOR_TIMEOUT_S", std::to_string(timeout_s_)}};
  }

  // Start every server; `extra` adds environment per "worker1"/"ps0".
  void start_servers(const std::map<std::string, std::map<std::string, std::string>>& extra = {}) {
    for (int i = 0; i < workers_; ++i) {
      auto e = env("worker", i);
      if (auto it = extra.find("worker" + std::to_string(i)); it != extra.end()) e.insert(it->second.begin(), it->second.end());
      worker_.push_back(start(worker_cmd.empty() ? std::vector<std::string>{self_path(), "--serve"} : worker_cmd, e,
                              "worker" + std::to_string(i)));
    }
    for (int i = 0; i < ps_; ++i) {
      // TF_CONFIG names the task; --job/--index say the same explicitly.
      ps_proc_.push_back(start({STRATA_SERVER_BIN, "--job", "ps", "--index", std::to_string(i),
                                "--coordinator-timeout", std::to_string(timeout_s_)},
                               env("ps", i), "ps" + std::to_string(i)));
    }
  }
  size_t start_coordinator(const std::string& scenario, std::map<std::string, std::string> extra = {}) {
    auto e = env("chief", 0);
    e.insert(extra.begin(), extra.end());
    chief_ = start({self_path(), "--coordinator", scenario}, e, "chief");
    return chief_;
  }

  size_t start(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
               const std::string& tag) {
    Proc p;
    p.log = dir_.str() + "/" + tag + ".log";
    const pid_t pid = strata::test::spawn(argv, env, p.log);
    p.pid = pid;
    procs_.push_back(p);
    return procs_.size() - 1;
  }

  // Wait up to `seconds` for process i to exit; true when it did.
  bool wait(size_t i, double seconds) {
    Proc& p = procs_[i];
    const auto end = Clock::now() + std::chrono::milliseconds(static_cast<long>(seconds * 1000));
    while (p.status == -2) {
      int st = 0;
      if (::waitpid(p.pid, &st, WNOHANG) == p.pid) {
        p.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        break;
      }
      if (Clock::now() >= end) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return true;
  }
  bool wait_servers(double seconds) {
    const auto end = Clock::now() + std::chrono::milliseconds(static_cast<long>(seconds * 1000));
    for (size_t i : servers()) {
      const double left = std::chrono::duration<double>(end - Clock::now()).count();
      if (!wait(i, std::max(0.0, left))) return false;
    }
    return true;
  }
  std::vector<size_t> servers() const {
    std::vector<size_t> s = worker_;
    s.insert(s.end(), ps_proc_.begin(), ps_proc_.end());
    return s;
  }
  // Wait for `text` in process i's log.
  bool wait_for_text(size_t i, const std::string& text, double seconds) {
    const auto end = Clock::now() + std::chrono::milliseconds(static_cast<long>(seconds * 1000));
    while (Clock::now() < end) {
      if (slurp(procs_[i].log).find(text) != std::string::npos) return true;
      if (wait(i, 0)) return slurp(procs_[i].log).find(text) != std::string::npos;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  void kill(size_t i) { ::kill(procs_[i].pid, SIGKILL); }
  Proc& proc(size_t i) { return procs_[i]; }
  size_t worker(int i) const { return worker_[static_cast<size_t>(i)]; }
  size_t ps(int i) const { return ps_proc_[static_cast<size_t>(i)]; }
  size_t chief() const { return chief_; }

  // The coordinator's RESULT line (after it exited).
  json result() {
    const std::string log = slurp(procs_[chief_].log);
    const auto p = log.rfind("RESULT ");
    if (p == std::string::npos) return json();
    const auto e = log.find('\n', p);
    return json::parse(log.substr(p + 7, e == std::string::npos ? std::string::npos : e - p - 7), nullptr, false);
  }
  std::string logs() {
    std::string out;
    for (auto& p : procs_) out += "---- " + p.log + "\n" + slurp(p.log);
    return out;
  }

 private:
  strata::test::TempDir dir_;
  int workers_, ps_;
  double timeout_s_;
  json spec_;
  std::vector<Proc> procs_;
  std::vector<size_t> worker_, ps_proc_;
  size_t chief_ = 0;
};

// Runs `scenario` to completion: the coordinator exits 0 with a RESULT and
// stops every server, which exit 0.
json run_scenario(PsCluster& c, const std::string& scenario) {
  c.start_servers();
  const size_t chief = c.start_coordinator(scenario);
  EXPECT_TRUE(c.wait(chief, 240)) << "coordinator did not finish\n" << c.logs();
  EXPECT_EQ(c.proc(chief).status, 0) << c.logs();
  EXPECT_TRUE(c.wait_servers(30)) << "servers did not stop\n" << c.logs();
  for (size_t s : c.servers()) EXPECT_EQ(c.proc(s).status, 0) << c.proc(s).log << "\n" << c.logs();
  json r = c.result();
  std::printf("coordinator result: %s\n", r.dump().c_str());
  EXPECT_TRUE(r.is_object()) << c.logs();
  EXPECT_FALSE(r.contains("fatal")) << r.dump() << "\n" << c.logs();
  return r;
}

void expect_round_robin(const json& placement, int num_ps) {
  // 5 plain variables, then 3 shards: creation index i lands on i % num_ps.
  for (int i = 0; i < 5; ++i) EXPECT_EQ(placement["plain_ps"][i].get<int>(), i % num_ps) << placement.dump();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(placement["sharded_ps"][i].get<int>(), (5 + i) % num_ps) << placement.dump();
  for (int i = 0; i < 5; ++i) EXPECT_EQ(placement["plain_read"][i].get<double>(), i);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(placement["sharded_read"][i].get<double>(), i);
}

TEST(PsTest, ScheduleJoinFetchUpdatesAndErrorsWithTwoWorkersTwoPs) {
  PsCluster c(2, 2);
  const json r = run_scenario(c, "basic");
  ASSERT_TRUE(r.is_object());
  EXPECT_EQ(r["num_workers"], 2);
  EXPECT_EQ(r["num_ps"], 2);
  expect_round_robin(r["placement"], 2);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(r["squares"][i].get<std::int64_t>(), i * i);
  for (const auto& s : r["statuses"]) EXPECT_EQ(s, "ready");
  EXPECT_EQ(r["done"], true);
  EXPECT_EQ(r["scaled"], json({2.5, 5.0, 7.5, 10.0, 12.5, 15.0}));
  EXPECT_EQ(r["scaled_shape"], json({2, 3}));
  EXPECT_NE(r["unknown"].get<std::string>().find("NotFoundError: no worker has a function named 'no_such_fn'"),
            std::string::npos)
      << r["unknown"];
  // No lost updates: 40 closures from 2 workers + 10 coordinator adds.
  ASSERT_EQ(r["counter"].size(), 18u);
  for (const auto& v : r["counter"]) EXPECT_EQ(v.get<std::int64_t>(), 50);
  // The failing closure's error surfaces at join with its type and text.
  EXPECT_EQ(r["join_error_type"], "INVALID_ARGUMENT") << r.dump();
  EXPECT_NE(r["join_error"].get<std::string>().find("std::invalid_argument: bad input: seven"), std::string::npos)
      << r["join_error"];
  EXPECT_EQ(r["bad_fetch"], "InvalidArgumentError");
  EXPECT_EQ(r["bad_status"], "error");
  EXPECT_GE(r["after"]["aborted"].get<int>(), 10) << r.dump();
  EXPECT_EQ(r["after"]["other"].get<int>(), 0) << r.dump();
  EXPECT_EQ(r["cancelled_fetch"], "CancelledError");
  EXPECT_EQ(r["again"], 49);  // usable after the error was raised once
  EXPECT_NE(r.value("wrong_arg", std::string()).find("argument 0 is a string, not a int64"), std::string::npos)
      << r.dump();
  // A clean end: every client says goodbye before it closes a channel, so
  // no process takes the close for a lost peer (the transport warns then).
  EXPECT_EQ(c.logs().find("lost connection"), std::string::npos) << c.logs();
}

TEST(PsTest, RoundRobinPlacementOnOneAndThreePs) {
  for (int ps : {1, 3}) {
    PsCluster c(1, ps);
    const json r = run_scenario(c, "placement");
    ASSERT_TRUE(r.is_object());
    EXPECT_EQ(r["num_ps"], ps);
    expect_round_robin(r["placement"], ps);
  }
}

TEST(PsTest, WorkerKilledMidClosureIsRescheduledAndEveryClosureRunsOnce) {
  PsCluster c(2, 1);
  const std::string marker = c.dir() + "/hang";
  c.start_servers({{"worker1", {{"PS_TEST_HANG", marker}}}});
  const size_t chief = c.start_coordinator("worker_kill");
  const auto end = Clock::now() + std::chrono::seconds(90);
  while (!std::ifstream(marker) && Clock::now() < end && !c.wait(chief, 0))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(std::ifstream(marker).good()) << "worker 1 never entered a closure\n" << c.logs();
  c.kill(c.worker(1));
  ASSERT_TRUE(c.wait(chief, 120)) << c.logs();
  EXPECT_EQ(c.proc(chief).status, 0);
  const json r = c.result();
  std::printf("coordinator result: %s\n", r.dump().c_str());
  ASSERT_TRUE(r.is_object() && !r.contains("fatal")) << r.dump() << c.logs();
  std::vector<std::int64_t> ids = r["ids"].get<std::vector<std::int64_t>>();
  for (std::int64_t i = 0; i < 20; ++i) EXPECT_EQ(ids[static_cast<size_t>(i)], i);
  for (const auto& w : r["workers"]) EXPECT_EQ(w, 0) << r.dump();  // worker 1 completed nothing
  EXPECT_EQ(r["counter"][0], 20) << "a closure ran twice or was lost: " << r.dump();
  EXPECT_TRUE(c.wait(c.worker(0), 30) && c.wait(c.ps(0), 30)) << c.logs();
  EXPECT_EQ(c.proc(c.worker(0)).status, 0);
  EXPECT_EQ(c.proc(c.ps(0)).status, 0);
}

TEST(PsTest, RestartedWorkerRejoinsAndGetsWork) {
  PsCluster c(2, 1);
  const std::string marker = c.dir() + "/hang", go = c.dir() + "/go";
  c.start_servers({{"worker1", {{"PS_TEST_HANG", marker}}}});
  const size_t chief = c.start_coordinator("rejoin", {{"PS_TEST_GO", go}});
  const auto end = Clock::now() + std::chrono::seconds(90);
  while (!std::ifstream(marker) && Clock::now() < end && !c.wait(chief, 0))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(std::ifstream(marker).good()) << "worker 1 never entered a closure\n" << c.logs();
  c.kill(c.worker(1));
  ASSERT_TRUE(c.wait(c.worker(1), 10));
  const size_t again = c.start({self_path(), "--serve"}, c.env("worker", 1), "worker1-restarted");
  std::ofstream(go) << "go\n";
  ASSERT_TRUE(c.wait(chief, 120)) << c.logs();
  const json r = c.result();
  std::printf("coordinator result: %s\n", r.dump().c_str());
  ASSERT_TRUE(r.is_object() && !r.contains("fatal")) << r.dump() << c.logs();
  EXPECT_EQ(r["rejoined"], true) << c.logs();
  EXPECT_TRUE(c.wait(again, 30)) << c.logs();
  EXPECT_EQ(c.proc(again).status, 0);
}

TEST(PsTest, KilledPsIsUnavailableErrorNamingIt) {
  PsCluster c(2, 2);
  const std::string go = c.dir() + "/go";
  c.start_servers();
  const size_t chief = c.start_coordinator("ps_kill", {{"PS_TEST_GO", go}});
  ASSERT_TRUE(c.wait_for_text(chief, "READY", 120)) << c.logs();
  c.kill(c.ps(1));
  ASSERT_TRUE(c.wait(c.ps(1), 10));
  std::ofstream(go) << "go\n";
  ASSERT_TRUE(c.wait(chief, 90)) << c.logs();
  const json r = c.result();
  std::printf("coordinator result: %s\n", r.dump().c_str());
  ASSERT_TRUE(r.is_object() && !r.contains("fatal")) << r.dump() << c.logs();
  EXPECT_EQ(r["b_ps"], 1);
  EXPECT_EQ(r["b_before"][0], 4);
  EXPECT_EQ(r["error_type"], "UNAVAILABLE") << r.dump();
  EXPECT_NE(r.value("error", std::string()).find("ps task 1"), std::string::npos) << r.dump();
  EXPECT_LT(r["elapsed_s"].get<double>(), 15.0) << r.dump();
  EXPECT_EQ(r["join_error_type"], "UNAVAILABLE") << r.dump();
  EXPECT_NE(r.value("join_error", std::string()).find("ps task 1 is unavailable"), std::string::npos) << r.dump();
  EXPECT_LT(r["join_elapsed_s"].get<double>(), 15.0) << r.dump();
  // Gone for good: past the grace period (default 5 s), not a blip.
  EXPECT_NE(r.value("join_error", std::string()).find("past the grace period"), std::string::npos) << r.dump();
  // The rest stop when the coordinator ends.
  for (size_t s : {c.worker(0), c.worker(1), c.ps(0)}) {
    EXPECT_TRUE(c.wait(s, 30)) << c.logs();
    EXPECT_EQ(c.proc(s).status, 0) << c.proc(s).log;
  }
}

TEST(PsTest, PsStoppedPastTheGraceIsUnavailableErrorNamingIt) {
  // A stopped ps keeps its connections open: only the deadlines and the
  // grace period (3 s here) can tell that it is gone.
  PsCluster c(2, 2);
  const std::string go = c.dir() + "/go";
  const std::map<std::string, std::string> quick{{"STRATA_PS_GRACE_S", "3"}, {"STRATA_PS_OP_TIMEOUT_S", "1"}};
  c.start_servers({{"worker0", quick}, {"worker1", quick}});
  auto chief_env = quick;
  chief_env["PS_TEST_OP_TIMEOUT_S"] = "1";
  chief_env["PS_TEST_GO"] = go;
  const size_t chief = c.start_coordinator("ps_kill", chief_env);
  ASSERT_TRUE(c.wait_for_text(chief, "READY", 120)) << c.logs();
  ::kill(c.proc(c.ps(1)).pid, SIGSTOP);  // for good (the cluster's destructor kills it)
  std::ofstream(go) << "go\n";
  ASSERT_TRUE(c.wait(chief, 90)) << c.logs();
  const json r = c.result();
  std::printf("coordinator result: %s\n", r.dump().c_str());
  ASSERT_TRUE(r.is_object() && !r.contains("fatal") && r.contains("error")) << r.dump() << c.logs();
  EXPECT_EQ(r["b_ps"], 1);
  EXPECT_EQ(r["error_type"], "UNAVAILABLE") << r.dump();
  EXPECT_NE(r.value("error", std::string()).find("ps task 1 is unavailable: no answer for"), std::string::npos)
      << r.dump();
  EXPECT_NE(r.value("error", std::string()).find("past the grace period of 3000 ms"), std::string::npos) << r.dump();
  EXPECT_LT(r["elapsed_s"].get<double>(), 3 + 10.0) << r.dump();
  EXPECT_EQ(r["join_error_type"], "UNAVAILABLE") << r.dump();
  for (size_t s : {c.worker(0), c.worker(1), c.ps(0)}) {
    EXPECT_TRUE(c.wait(s, 30)) << c.logs();
    EXPECT_EQ(c.proc(s).status, 0) << c.proc(s).log;
  }
}

// Every worker's input, consumed exactly once by the closures that worker ran.
void expect_whole_input(const json& p, int worker) {
  std::vector<std::int64_t> v = p["values"].get<std::vector<std::int64_t>>();
  std::sort(v.begin(), v.end());
  std::vector<std::int64_t> want;
  for (std::int64_t i = 0; i < kInputSize; ++i) want.push_back(worker * 1000 + i);
  EXPECT_EQ(v, want) << "worker " << worker << ": " << p.dump();
  EXPECT_EQ(p.value("ended", false), true) << p.dump();
}

TEST(PsTest, PerWorkerDatasetsIteratorsAndValuesWithTwoWorkersTwoPs) {
  PsCluster c(2, 2);
  const json r = run_scenario(c, "datasets");
  ASSERT_TRUE(r.is_object() && !r.contains("fatal") && r.contains("by_pid") && r.contains("pv") && r.contains("echo"))
      << r.dump();
  ASSERT_EQ(r["by_pid"].size(), 2u) << r.dump();  // one process per worker, each its own input
  std::set<int> workers;
  for (const auto& p : r["by_pid"]) {
    workers.insert(p["worker"].get<int>());
    expect_whole_input(p, p["worker"].get<int>());
  }
  EXPECT_EQ(workers, (std::set<int>{0, 1}));
  EXPECT_NE(r.value("strict", std::string()).find("End of sequence"), std::string::npos) << r.dump();
  EXPECT_NE(r.value("strict", std::string()).find("OutOfRangeError"), std::string::npos) << r.dump();
  const std::int64_t first = r["fresh_first"].get<std::int64_t>();
  EXPECT_TRUE(first == 0 || first == 1000) << first;
  ASSERT_EQ(r["pv"].size(), 2u);
  EXPECT_NE(r["pv"][0], r["pv"][1]);
  ASSERT_EQ(r["echo"].size(), 12u);
  for (const auto& e : r["echo"]) EXPECT_EQ(e[1], r["pv"][e[0].get<int>()]) << r.dump();
  EXPECT_NE(r.value("wrong_kind", std::string()).find("is a per-worker value, not a per-worker iterator"),
            std::string::npos)
      << r.dump();
  EXPECT_NE(r.value("unknown_ds", std::string()).find("no worker has a dataset function named 'no_such_input'"),
            std::string::npos)
      << r.dump();
}

TEST(PsTest, RestartedWorkerRebuildsItsDataset) {
  PsCluster c(2, 1);
  const std::string marker = c.dir() + "/hang";
  c.start_servers({{"worker1", {{"PS_TEST_HANG_TAKE", marker}}}});
  const size_t chief = c.start_coordinator("dataset_restart");
  const auto end = Clock::now() + std::chrono::seconds(90);
  while (!std::ifstream(marker) && Clock::now() < end && !c.wait(chief, 0))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(std::ifstream(marker).good()) << "worker 1 never took an element\n" << c.logs();
  EXPECT_NE(slurp(marker).find("took 1000"), std::string::npos) << slurp(marker);
  c.kill(c.worker(1));
  ASSERT_TRUE(c.wait(c.worker(1), 10));
  const size_t again = c.start({self_path(), "--serve"}, c.env("worker", 1), "worker1-restarted");
  ASSERT_TRUE(c.wait(chief, 150)) << c.logs();
  const json r = c.result();
  std::printf("coordinator result: %s\n", r.dump().c_str());
  ASSERT_TRUE(r.is_object() && !r.contains("fatal") && r.contains("by_pid")) << r.dump() << c.logs();
  // The killed process completed nothing; the restarted one built its input
  // again and read all of it, from its first element, exactly once.
  ASSERT_EQ(r["by_pid"].size(), 2u) << r.dump();
  for (const auto& p : r["by_pid"]) expect_whole_input(p, p["worker"].get<int>());
  EXPECT_TRUE(c.wait(again, 30)) << c.logs();
  EXPECT_EQ(c.proc(again).status, 0);
}

TEST(PsTest, ScatterUpdatesOnAThreeShardVariableAreExactAndBadIndicesAreClearErrors) {
  PsCluster c(2, 2);
  const json r = run_scenario(c, "scatter");
  ASSERT_TRUE(r.is_object() && !r.contains("fatal") && r.contains("value") && r.contains("after_errors") &&
              r.contains("updated"))
      << r.dump();
  EXPECT_EQ(r["shards"], 3);
  // 60 closures of scatter_step from 2 workers.
  std::vector<std::int64_t> want(14, 0);
  for (std::int64_t j = 0; j < 60; ++j) {
    for (std::int64_t row : scatter_step_rows(j)) {
      want[static_cast<size_t>(row * 2)] += 1;
      want[static_cast<size_t>(row * 2 + 1)] += 2;
    }
    want[10] -= 1;
    want[11] -= 1;
  }
  EXPECT_EQ(r["value"].get<std::vector<std::int64_t>>(), want) << r.dump();
  EXPECT_EQ(r["after_errors"].get<std::vector<std::int64_t>>(), want) << "a rejected scatter changed the variable";
  EXPECT_EQ(r["updated"].get<std::vector<float>>(),
            (std::vector<float>{20, 21, 22, 40, 41, 42, 6, 7, 8, 9, 10, 11, 10, 11, 12}))
      << r.dump();
  auto has = [&](const char* key, const std::string& text) {
    EXPECT_NE(r.value(key, std::string()).find(text), std::string::npos) << key << ": " << r.value(key, std::string());
  };
  has("err_range", "scatter_add of variable 'emb' of shape [7, 2]: indices[1] = 7 is not in [0, 7)");
  has("err_negative", "indices[0] = -1 is not in [0, 7)");
  has("err_shape", "values of shape [2, 3] and dtype int64 do not match [2, 2]");
  has("err_dtype", "dtype float32 do not match");
  has("err_scalar", "it is a scalar");
  has("worker_err", "indices[0] = 9 is not in [0, 7)");
  has("worker_err", "on worker task");
}

// Large shards travel as a frame's bulk straight between the tensors' memory
// (no encoding copies) and a read sends a snapshot of the value while
// updates go on (copy on write): no read may see an update half applied,
// and no update may be lost.
TEST(PsTest, LargeVariablesTravelAsBulkWithExactValuesAndNoTornReads) {
  PsCluster c(2, 2);
  const json r = run_scenario(c, "bulk");
  ASSERT_TRUE(r.is_object() && !r.contains("fatal") && r.contains("big")) << r.dump();
  EXPECT_EQ(r["torn"], 0) << r.dump();
  EXPECT_EQ(r["big"], 40.0) << r.dump();
  EXPECT_EQ(r["sharded"], 80.0) << r.dump();
  EXPECT_EQ(r["small"], 120.0) << r.dump();
  EXPECT_EQ(r["pattern_ok"], true);
  EXPECT_EQ(r["big_pattern_ok"], true);
  EXPECT_NE(r["wrong_shape"].get<std::string>().find("variable 'big' is float32"), std::string::npos) << r.dump();
  EXPECT_EQ(r["big_after_error_ok"], true);
  // The transport the job asked for is the one every process used
  // (PsTest.OverLibfabric would otherwise pass silently over tcp).
  const char* asked = std::getenv("STRATA_TRANSPORT");
  const std::string want = std::string("', transport '") + (asked != nullptr && *asked ? asked : "tcp") + "'";
  const std::string logs = c.logs();
  std::size_t used = 0;
  for (std::size_t at = logs.find(want); at != std::string::npos; at = logs.find(want, at + 1)) ++used;
  EXPECT_EQ(used, 5u) << "the chief, 2 workers and 2 ps tasks should each log the runtime line with " << want << "\n" << logs;
}

TEST(PsTest, PsBlipShorterThanTheGraceIsToleratedWithExactValues) {
  PsCluster c(2, 2);
  // Operations time out after 1 s, so a 3 s stop makes every process resend
  // its requests on new connections; the grace (8 s) outlasts the stop.
  const std::map<std::string, std::string> blip{{"STRATA_PS_GRACE_S", "8"}, {"STRATA_PS_OP_TIMEOUT_S", "1"}};
  c.start_servers({{"worker0", blip}, {"worker1", blip}});
  auto chief_env = blip;
  chief_env["PS_TEST_OP_TIMEOUT_S"] = "1";
  const size_t chief = c.start_coordinator("ps_blip", chief_env);
  ASSERT_TRUE(c.wait_for_text(chief, "READY", 120)) << c.logs();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ::kill(c.proc(c.ps(1)).pid, SIGSTOP);
  std::this_thread::sleep_for(std::chrono::seconds(3));
  ::kill(c.proc(c.ps(1)).pid, SIGCONT);
  ASSERT_TRUE(c.wait(chief, 120)) << c.logs();
  EXPECT_EQ(c.proc(chief).status, 0);
  const json r = c.result();
  std::printf("coordinator result: %s\n", r.dump().c_str());
  ASSERT_TRUE(r.is_object() && !r.contains("fatal") && r.contains("value")) << r.dump() << c.logs();
  EXPECT_EQ(r["shard_ps"], json({0, 1, 0}));
  // 200 closures + 10 coordinator steps: +1 everywhere, +1 more on row 0.
  const auto v = r["value"].get<std::vector<std::int64_t>>();
  ASSERT_EQ(v.size(), 18u);
  for (size_t i = 0; i < 18; ++i) EXPECT_EQ(v[i], i < 3 ? 420 : 210) << "element " << i << ": " << r.dump();
  // The blip was real: someone resent to ps task 1 and got through.
  const std::string logs = c.logs();
  EXPECT_NE(logs.find("ps task 1 answered again"), std::string::npos) << logs;
  EXPECT_TRUE(c.wait_servers(30)) << c.logs();
  for (size_t sv : c.servers()) EXPECT_EQ(c.proc(sv).status, 0) << c.proc(sv).log << "\n" << c.logs();
}

TEST(PsTest, ServersExitWhenTheCoordinatorIsKilled) {
  const double timeout_s = 2;
  PsCluster c(2, 1, timeout_s);
  c.start_servers();
  const size_t chief = c.start_coordinator("coordinator_kill");
  ASSERT_TRUE(c.wait_for_text(chief, "READY", 120)) << c.logs();
  const auto t0 = Clock::now();
  c.kill(chief);
  ASSERT_TRUE(c.wait_servers(timeout_s + 15)) << "servers outlived their coordinator\n" << c.logs();
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  for (size_t s : c.servers()) EXPECT_EQ(c.proc(s).status, 3) << c.proc(s).log << "\n" << c.logs();
  std::printf("servers exited %.2f s after the coordinator was killed (timeout %.1f s)\n", took, timeout_s);
}

// Runs `argv` with `env` (TF_CONFIG only if `env` has it) to its end within
// `deadline_s`; returns {exit code, stdout and stderr}.
std::pair<int, std::string> run_to_end(const std::vector<std::string>& argv,
                                       const std::map<std::string, std::string>& env, int deadline_s = 60) {
  return strata::test::run_to_end(argv, env, deadline_s);
}

TEST(PsTest, StrataServerRejectsBadTasksWithAClearError) {
  PsCluster c(1, 1);
  auto env = c.env("ps", 0);
  {
    const auto [code, out] = run_to_end({STRATA_SERVER_BIN, "--job", "ps"}, env);
    EXPECT_EQ(code, 2) << out;
    EXPECT_NE(out.find("pass --job and --index together"), std::string::npos) << out;
  }
  {
    const auto [code, out] = run_to_end({STRATA_SERVER_BIN, "--job", "ps", "--index", "5"}, env);
    EXPECT_EQ(code, 1) << out;
    EXPECT_NE(out.find("task ps 5 is not in the cluster"), std::string::npos) << out;
  }
  {
    auto chief = c.env("chief", 0);
    const auto [code, out] = run_to_end({STRATA_SERVER_BIN}, chief);
    EXPECT_EQ(code, 1) << out;
    EXPECT_NE(out.find("only worker and ps tasks run a Server"), std::string::npos) << out;
  }
  {
    auto no_chief = env;
    no_chief["TF_CONFIG"] = R"({"cluster": {"worker": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"]},
                                "task": {"type": "ps", "index": 0}})";
    const auto [code, out] = run_to_end({STRATA_SERVER_BIN}, no_chief);
    EXPECT_EQ(code, 1) << out;
    EXPECT_NE(out.find("needs a \"chief\" task"), std::string::npos) << out;
  }
}

// How a user ships steps to workers without writing a serving program:
// strata-server --load a shared library that registers them.
TEST(PsTest, StrataServerLoadsAStepLibrary) {
  PsCluster c(1, 1);
  c.worker_cmd = {STRATA_SERVER_BIN, "--load", PS_STEPS_LIB, "--coordinator-timeout", "10"};
  const json r = run_scenario(c, "lib");
  ASSERT_TRUE(r.is_object());
  EXPECT_EQ(r["cubes"], json({0, 1, 8, 27, 64, 125})) << c.logs();
  EXPECT_NE(r["square"].get<std::string>().find("lib_cube"), std::string::npos)
      << "scheduling a function the worker lacks names what it has: " << r.dump();
  EXPECT_NE(slurp(c.proc(c.worker(0)).log).find("loaded " + std::string(PS_STEPS_LIB) + " (registered: lib_cube"),
            std::string::npos)
      << c.logs();

  auto env = c.env("worker", 0);
  const auto [code, out] = run_to_end({STRATA_SERVER_BIN, "--load", "/nonexistent/libsteps.so"}, env);
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("cannot load --load /nonexistent/libsteps.so"), std::string::npos) << out;
  EXPECT_NE(out.find("add_library(NAME SHARED"), std::string::npos) << out;
}

TEST(PsTest, StrataBenchPsReportsClosuresAndPullPush) {
  PsCluster c(1, 1);  // for the environment: plugin path, log level
  auto env = c.env("chief", 0);
  env.erase("TF_CONFIG");
  env["STRATA_LOG_LEVEL"] = "error";
  const auto [code, out] = run_to_end({STRATA_BENCH_BIN, "ps", "--workers", "2", "--ps", "2", "--sizes", "4K,1M",
                                       "--closures", "200", "--repeats", "2", "--json"},
                                      env);
  ASSERT_EQ(code, 0) << out;
  // stdout and stderr together: the JSON object is from the first '{' to the
  // last '}' (a sanitizer's report may follow it).
  const size_t open = out.find('{'), close = out.rfind('}');
  ASSERT_TRUE(open != std::string::npos && close != std::string::npos && close > open) << out;
  const json r = json::parse(out.substr(open, close - open + 1), nullptr, false);
  ASSERT_TRUE(r.is_object()) << out;
  EXPECT_GT(r["closures"]["closures_per_s"].get<double>(), 0);
  EXPECT_GT(r["closures"]["schedule_call_us"].get<double>(), 0);
  ASSERT_EQ(r["variables"].size(), 2u);
  EXPECT_EQ(r["variables"][1]["bytes"], 1 << 20);
  for (const auto& v : r["variables"]) {
    EXPECT_EQ(v["ps_task"], 0);  // fillers keep every measured variable on ps 0
    EXPECT_GT(v["pull_MBps"].get<double>(), 0);
    EXPECT_GT(v["push_MBps"].get<double>(), 0);
  }
}

TEST(PsTest, StrataRunRestartsAFailedWorkerAndTheJobFinishes) {
  PsCluster none(1, 1);  // only for its environment helpers and directory
  auto env = none.env("chief", 0);
  env.erase("TF_CONFIG");
  env["PS_TEST_DIE_MARKER"] = none.dir() + "/died";
  const auto [code, log] = run_to_end({STRATA_RUN_BIN, "--timeout", "200", "--chief", "1", "--workers", "2", "--ps",
                                       "1", "--restart-workers", "1", "--restart-delay", "0.5", "--", self_path(),
                                       "--auto", "die_once"},
                                      env, 240);
  EXPECT_EQ(code, 0) << log;
  EXPECT_NE(log.find("exited with code 3; the coordinator runs its closures on the other workers; restarting it"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("again (rank"), std::string::npos) << log;
  const auto p = log.find("[chief 0] RESULT ");
  ASSERT_NE(p, std::string::npos) << log;
  const json r = json::parse(log.substr(p + 17, log.find('\n', p) - p - 17), nullptr, false);
  ASSERT_TRUE(r.is_object() && !r.contains("fatal") && r.contains("counter")) << r.dump() << log;
  EXPECT_EQ(r["counter"][0], 10) << "a closure was lost or ran twice: " << r.dump();
  EXPECT_EQ(r["rejoined"], true) << log;
}

TEST(PsTest, StrataRunStartsAChiefWorkersAndPsWithRolePrefixes) {
  PsCluster none(1, 1);  // only for its environment helpers
  auto env = none.env("chief", 0);
  env.erase("TF_CONFIG");  // strata-run sets it
  const auto [code, log] = run_to_end({STRATA_RUN_BIN, "--timeout", "200", "--chief", "1", "--workers", "2", "--ps",
                                       "2", "--", self_path(), "--auto", "basic"},
                                      env, 240);
  EXPECT_EQ(code, 0) << log;
  for (const char* prefix : {"[chief 0] RESULT ", "[worker 0] ", "[worker 1] ", "[ps 0] ", "[ps 1] "})
    EXPECT_NE(log.find(prefix), std::string::npos) << prefix << " missing in\n" << log;
  const auto p = log.find("[chief 0] RESULT ");
  ASSERT_NE(p, std::string::npos);
  const json r = json::parse(log.substr(p + 17, log.find('\n', p) - p - 17), nullptr, false);
  ASSERT_TRUE(r.is_object()) << log;
  EXPECT_FALSE(r.contains("fatal")) << r.dump();
  EXPECT_EQ(r["num_workers"], 2);
  EXPECT_EQ(r["num_ps"], 2);
  for (const auto& v : r["counter"]) EXPECT_EQ(v.get<std::int64_t>(), 50);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "--serve") return serve();
  if (argc >= 3 && std::string(argv[1]) == "--auto") {
    // Under strata-run every role runs this, as a user's program would.
    load_config();
    return strata::current_task_type() == "chief" ? coordinate(argv[2]) : serve();
  }
  if (argc >= 3 && std::string(argv[1]) == "--coordinator") return coordinate(argv[2]);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
