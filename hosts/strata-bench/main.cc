// SPDX-License-Identifier: Apache-2.0
// strata-bench: Strata's benchmarks. Speed targets live here, never in
// timed unit tests. Every figure is the median of --repeats runs (these
// machines are shared and noisy).
//
//   strata-bench dispatch   run() overhead per step for each strategy vs a direct call
//                           (mean per batch, and median and p90 of single runs)
//   strata-bench allreduce  in-process all-reduce across CPU replicas vs memcpy bandwidth
//                           (memcpy of the same size sampled alternately with it)
//   strata-bench allreduce|broadcast|allgather --transport tcp -n N
//                           collectives across N processes (see multiproc.h)
//   strata-bench allreduce --device gpu [-n N]
//                           device buffers: the nccl transport vs raw NCCL, one GPU per
//                           process (see gpu_allreduce.h)
//   strata-bench pingpong --transport T -n 2
//                           point-to-point latency and bandwidth of one transport (see multiproc.h)
//   strata-bench input      records read+verified per second vs sequential read (see input.h)
//   strata-bench ps        parameter-server closures/s and variable pull/push (see ps.h)
//   strata-bench checkpoint Checkpoint save/restore vs plain write(2)+fsync / read(2) (see checkpoint.h)
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <utility>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "checkpoint.h"
#include "fit.h"
#include "gpu_allreduce.h"
#include "input.h"
#include "multiproc.h"
#include "ps.h"
#include "sizes.h"
#include "strata/strata.hpp"

namespace {

using strata::bench::median;

using Clock = std::chrono::steady_clock;

// Median over `repeats` of the seconds one call of `body(iters)` takes per iteration.
double time_per_iter(int repeats, std::int64_t iters, const std::function<void(std::int64_t)>& body) {
  std::vector<double> samples;
  body(std::max<std::int64_t>(1, iters / 10));  // warm-up: threads, caches, page faults
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    body(iters);
    samples.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / static_cast<double>(iters));
  }
  return median(samples);
}

struct StrategySpec {
  std::string label, name, options;
};

// "mirrored:4" -> mirrored over cpu:0..cpu:3; "one_device"; "default".
StrategySpec parse_strategy(const std::string& spec) {
  const auto colon = spec.find(':');
  const std::string name = spec.substr(0, colon);
  if (colon == std::string::npos) return {spec, name, "{}"};
  const int n = std::stoi(spec.substr(colon + 1));
  if (n < 1) STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "bad strategy spec '", spec, "': use NAME or NAME:REPLICAS, e.g. mirrored:4");
  nlohmann::json devices = nlohmann::json::array();
  for (int i = 0; i < n; ++i) devices.push_back("cpu:" + std::to_string(i));
  return {spec, name, nlohmann::json{{"devices", devices}}.dump()};
}

strata::Strategy make_strategy(const StrategySpec& s) {
  if (s.name == "default") return strata::Strategy::create("default");
  return strata::Strategy::create(s.name, s.options);
}

// Opaque to the optimiser, so the direct call is a real call.
__attribute__((noinline)) void empty_step(int* counter) { asm volatile("" : : "r"(counter) : "memory"); }

int run_dispatch(const std::vector<std::string>& specs, std::int64_t iters, int repeats, bool json) {
  int counter = 0;
  const double direct = time_per_iter(repeats, iters * 100, [&](std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i) empty_step(&counter);
  });
  nlohmann::json results = nlohmann::json::array();
  if (!json)
    std::printf("%-22s %10s %14s %14s %14s %14s\n", "strategy", "replicas", "run() ns/step", "median ns",
                "p90 ns", "direct ns");
  std::vector<double> each;  // every run() on its own: a loaded machine stretches a few, not the median
  for (const std::string& spec_text : specs) {
    const StrategySpec spec = parse_strategy(spec_text);
    strata::Strategy strategy = make_strategy(spec);
    each.clear();
    each.reserve(static_cast<std::size_t>(iters) * static_cast<std::size_t>(repeats));
    const double per_run = time_per_iter(repeats, iters, [&](std::int64_t n) {
      for (std::int64_t i = 0; i < n; ++i) strategy.run([&](strata::ReplicaContext&) { empty_step(&counter); });
    });
    for (int r = 0; r < repeats; ++r)
      for (std::int64_t i = 0; i < iters; ++i) {
        const auto t0 = Clock::now();
        strategy.run([&](strata::ReplicaContext&) { empty_step(&counter); });
        each.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      }
    std::sort(each.begin(), each.end());
    const double med = median(each);
    const double p90 = each[each.size() * 9 / 10];
    const int replicas = strategy.num_local_replicas();
    if (json) {
      results.push_back({{"op", "dispatch"}, {"strategy", spec.label}, {"replicas", replicas},
                         {"run_ns", per_run * 1e9}, {"median_ns", med * 1e9}, {"p90_ns", p90 * 1e9},
                         {"direct_ns", direct * 1e9}, {"overhead_ns", (per_run - direct) * 1e9}});
    } else {
      std::printf("%-22s %10d %14.1f %14.1f %14.1f %14.2f\n", spec.label.c_str(), replicas, per_run * 1e9,
                  med * 1e9, p90 * 1e9, direct * 1e9);
    }
  }
  if (json) std::printf("%s\n", nlohmann::json{{"results", results}}.dump(2).c_str());
  return 0;
}

// Seconds per iteration of `a` and of `b`, sampled alternately (a, b, a, b,
// ...) so that both see the same machine load; medians of `repeats` each.
std::pair<double, double> alternate_per_iter(int repeats, std::int64_t iters,
                                             const std::function<void(std::int64_t)>& a,
                                             const std::function<void(std::int64_t)>& b) {
  std::vector<double> sa, sb;
  const std::int64_t warm = std::max<std::int64_t>(1, iters / 10);
  a(warm);  // warm-up: threads, caches, page faults
  b(warm);
  auto sample = [&](const std::function<void(std::int64_t)>& body, std::vector<double>& out) {
    const auto t0 = Clock::now();
    body(iters);
    out.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / static_cast<double>(iters));
  };
  for (int r = 0; r < repeats; ++r) {
    sample(a, sa);
    sample(b, sb);
  }
  return {median(sa), median(sb)};
}

int run_allreduce(const std::vector<int>& replica_counts, const std::vector<std::uint64_t>& sizes,
                  const std::string& strategy_name, const std::string& cross_device_ops, int repeats, bool json) {
  nlohmann::json results = nlohmann::json::array();
  if (!json)
    std::printf("%10s %12s %8s %12s %12s %12s %12s %10s %7s\n", "size", "count", "replicas", "time(us)",
                "algbw(GB/s)", "busbw(GB/s)", "memcpy(GB/s)", "vs memcpy", "wrong");
  for (int k : replica_counts) {
    nlohmann::json devices = nlohmann::json::array();
    for (int i = 0; i < k; ++i) devices.push_back("cpu:" + std::to_string(i));
    nlohmann::json options{{"devices", devices}};
    if (!cross_device_ops.empty()) options["cross_device_ops"] = cross_device_ops;
    strata::Strategy strategy = strata::Strategy::create(strategy_name, options.dump());
    for (std::uint64_t bytes : sizes) {
      const std::int64_t count = static_cast<std::int64_t>(bytes / sizeof(float));
      std::vector<strata::Tensor> bufs;
      for (int r = 0; r < k; ++r) bufs.push_back(strata::Tensor::zeros({count}, strata::DType::kFloat32));
      // Correctness first: replica r contributes r + 1 + (j % 5) at element j,
      // so every element must come back as k (k + 1) / 2 + k (j % 5),
      // bit-identical on every replica.
      std::int64_t wrong = 0;
      for (int r = 0; r < k; ++r) {
        float* p = bufs[r].data<float>();
        for (std::int64_t j = 0; j < count; ++j) p[j] = static_cast<float>(r + 1 + j % 5);
      }
      strategy.run([&](strata::ReplicaContext& ctx) {
        ctx.all_reduce_in_place(strata::ReduceOp::SUM, std::vector<strata::TensorView>{bufs[ctx.local_replica_id()]});
      });
      for (int r = 0; r < k; ++r) {
        const float* p = bufs[r].data<float>();
        const float* p0 = bufs[0].data<float>();
        for (std::int64_t j = 0; j < count; ++j)
          wrong += p[j] != static_cast<float>(k * (k + 1) / 2 + k * (j % 5)) ||
                   std::memcmp(&p[j], &p0[j], sizeof(float)) != 0;
      }
      for (auto& b : bufs) std::fill_n(b.data<float>(), count, 0.0f);
      // Enough iterations for ~50 ms per sample.
      const std::int64_t iters = std::max<std::int64_t>(3, std::min<std::int64_t>(2000, (256ll << 20) / std::max<std::uint64_t>(bytes, 1)));
      std::vector<char> src(bytes, 1), dst(bytes, 0);
      // The memcpy reference is sampled between the all-reduce's samples.
      const auto [secs, copy_secs] = alternate_per_iter(
          repeats, iters,
          [&](std::int64_t n) {
            strategy.run([&](strata::ReplicaContext& ctx) {
              std::vector<strata::TensorView> mine{bufs[ctx.local_replica_id()]};
              for (std::int64_t i = 0; i < n; ++i) ctx.all_reduce_in_place(strata::ReduceOp::SUM, mine);
            });
          },
          [&](std::int64_t n) {
            for (std::int64_t i = 0; i < n; ++i) {
              std::memcpy(dst.data(), src.data(), bytes);
              asm volatile("" : : "r"(dst.data()) : "memory");
            }
          });
      const double algbw = static_cast<double>(bytes) / secs / 1e9;
      const double busbw = algbw * 2.0 * (k - 1) / k;
      const double copybw = static_cast<double>(bytes) / copy_secs / 1e9;
      if (json) {
        results.push_back({{"op", "allreduce"}, {"transport", "in-process"}, {"strategy", strategy_name},
                           {"cross_device_ops", cross_device_ops.empty() ? "default" : cross_device_ops},
                           {"ranks", k}, {"bytes", bytes}, {"time_us", secs * 1e6}, {"algbw_gbps", algbw},
                           {"busbw_gbps", busbw}, {"memcpy_gbps", copybw}, {"ratio_vs_memcpy", algbw / copybw},
                           {"wrong", wrong}});
      } else {
        std::printf("%10s %12lld %8d %12.1f %12.2f %12.2f %12.2f %10.2f %7lld\n",
                    strata::bench::format_size(bytes).c_str(), static_cast<long long>(count), k, secs * 1e6, algbw,
                    busbw, copybw, algbw / copybw, static_cast<long long>(wrong));
      }
    }
  }
  if (json) std::printf("%s\n", nlohmann::json{{"results", results}}.dump(2).c_str());
  return 0;
}

std::vector<std::string> split_csv(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"strata-bench: Strata's benchmarks (medians of several runs).\n\n"
               "Examples:\n"
               "  strata-bench dispatch\n"
               "  strata-bench allreduce --replicas 2,4 --sizes 4K:64M\n"
               "  strata-bench allreduce --sizes 4096,16M --json\n"
               "  strata-bench allreduce --transport tcp -n 4 --sizes 4K:64M\n"
               "  strata-bench allgather -n 3 --sizes 4K,1M --json\n"
               "  strata-bench pingpong --transport libfabric --option 'provider=\"shm\"' -n 2 --sizes 64:4M\n"
               "  strata-bench allreduce --transport auto -n 4 --sizes 4K:64M\n"
               "  strata-bench allreduce --device gpu                   (one process per visible GPU, 4K:1G)\n"
               "  strata-bench allreduce --device gpu -n 1 --sizes 4K:64M --blocking\n"
               "  strata-bench rendezvous -n 64\n"
               "  strata-bench input --size-mb 1024 --record-bytes 4096 --json\n"
               "  strata-bench checkpoint --size-mb 1024 --variables 8 --dir /data/tmp\n"};
  app.require_subcommand(1);
  app.fallthrough();  // --json and --repeats may follow the subcommand
  bool json = false;
  int repeats = 5;
  int worker_rank = -1;
  app.add_flag("--json", json, "Print results as one JSON document {\"results\": [...]}");
  auto* repeats_opt = app.add_option("--repeats", repeats,
                                     "Samples per figure (the median is reported; multi-process default 7 batches)")
                          ->capture_default_str()
                          ->check(CLI::Range(1, 1000));
  // Internal: set by the multi-process launcher on the workers it starts.
  app.add_option("--bench-worker-rank", worker_rank)->group("");

  auto* dispatch = app.add_subcommand("dispatch", "run() dispatch overhead per step for each strategy against a direct call");
  std::string strategies = "default,one_device,mirrored:1,mirrored:2,mirrored:4,central_storage:2";
  std::int64_t iters = 20000;
  dispatch->add_option("--strategies", strategies, "Comma list of NAME or NAME:REPLICAS")->capture_default_str();
  dispatch->add_option("--iters", iters, "run() calls per sample")->capture_default_str()->check(CLI::PositiveNumber);

  auto* allreduce = app.add_subcommand(
      "allreduce", "All-reduce (SUM): in-process across CPU replicas vs memcpy bandwidth, or with --transport across "
                   "processes");
  std::string replicas = "2,4", sizes = "4K:64M", strategy = "mirrored";
  allreduce->add_option("--replicas", replicas, "In-process: comma list of replica counts")->capture_default_str();
  allreduce->add_option("--strategy", strategy, "In-process: strategy whose replicas all-reduce")->capture_default_str();
  std::string cross_device_ops;
  allreduce->add_option("--cross-device-ops", cross_device_ops,
                        "In-process: the strategy's cross_device_ops (default: the strategy's own choice), e.g. "
                        "hierarchical_copy");
  std::string device = "cpu";
  bool gpu_blocking = false;
  allreduce
      ->add_option("--device", device,
                   "cpu: host buffers (in-process replicas, or --transport across processes); gpu: device buffers "
                   "through the nccl transport, timed against raw NCCL in the same processes (one process per rank, "
                   "rank r on GPU r % visible GPUs; -n defaults to the visible GPUs; --sizes defaults to 4K:1G; "
                   "columns as nccl-tests: time, algbw, busbw for each, and the time ratio strata/raw)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "gpu"}));
  allreduce->add_flag("--blocking", gpu_blocking,
                      "--device gpu: time blocking all-reduces (Strata with stream NULL, raw NCCL synchronised after "
                      "each) instead of stream-ordered batches synchronised once (nccl-tests' method)");
  auto* broadcast = app.add_subcommand("broadcast", "Broadcast from rank 0 across processes (--transport, default tcp)");
  auto* allgather = app.add_subcommand("allgather", "All-gather across processes (--transport, default tcp)");
  auto* pingpong = app.add_subcommand(
      "pingpong", "Point-to-point latency and bandwidth between 2 processes over one transport (osu_latency and "
                  "fi_pingpong style: one-way time = round trip / 2)");
  std::string pingpong_sizes = "64:4M";
  auto* rendezvous = app.add_subcommand(
      "rendezvous", "What joining a job costs with N processes: the authenticated store handshake and the "
                    "communicator setup (rendezvous gate, signed transport handshakes), slowest rank, median");

  strata::bench::MultiProcOptions mp;
  std::string transport;
  CLI::Option* allreduce_ranks = nullptr;
  CLI::Option* allreduce_sizes = nullptr;
  for (CLI::App* sub : {allreduce, broadcast, allgather, pingpong, rendezvous}) {
    if (sub == rendezvous) {
      sub->add_option("--transport", transport, "Transport of the communicators (tcp by default, shmem, shm, auto, ...)");
      // 4096: kMaxRendezvousRanks in multiproc.cc.
      sub->add_option("-n,--ranks", mp.ranks, "Processes to start (up to 4096; see ulimit -n)")
          ->capture_default_str()
          ->check(CLI::Range(2, 4096));
      sub->add_option("--option", mp.transport_option_pairs, "Transport option KEY=JSON (repeatable)");
      sub->add_option("--timeout", mp.timeout_s, "Deadline in seconds of the rendezvous")->capture_default_str();
      sub->add_option("--ring-options", mp.ring_options,
                      "Extra options of the ring cross_device_ops, JSON (e.g. '{\"direct_max_bytes\": 0}': the "
                      "first all-reduce goes around the ring instead of straight to every rank)")
          ->capture_default_str();
      continue;
    }
    if (sub == pingpong)
      sub->add_option("--sizes", pingpong_sizes, "Message sizes: a doubling range 64:4M or a list 0,64,4K")
          ->capture_default_str();
    else {
      auto* sizes_opt =
          sub->add_option("--sizes", sizes,
                          "Bytes per rank (allgather: of the whole output): a doubling range 4K:64M or a list "
                          "4096,16M (allreduce --device gpu: default 4K:1G)")
              ->capture_default_str();
      if (sub == allreduce) allreduce_sizes = sizes_opt;
    }
    sub->add_option("--transport", transport,
                    sub == allreduce ? "Run across processes over this transport (tcp, shmem, libfabric, shm, auto, ...)"
                                     : "Transport between the processes: tcp (default), shmem, libfabric, shm, auto, ...");
    auto* ranks_opt = sub->add_option("-n,--ranks", mp.ranks,
                                      sub == pingpong ? "Processes to start (pingpong: exactly 2)"
                                      : sub == allreduce
                                          ? "Processes to start (allreduce: implies --transport tcp; with --device "
                                            "gpu: default one per visible GPU, 1 allowed)"
                                          : "Processes to start")
                          ->capture_default_str()
                          ->check(CLI::Range(sub == allreduce ? 1 : 2, 256));
    if (sub == allreduce) allreduce_ranks = ranks_opt;
    sub->add_option("--option", mp.transport_option_pairs,
                    "Transport option KEY=JSON on top of --transport-options (repeatable), e.g. "
                    "--option 'provider=\"tcp;ofi_rxm\"' --option 'iface=\"lo\"'");
    if (sub != pingpong)
      sub->add_option("--dtype", mp.dtype, "float32, float64, int32 or int64")->capture_default_str();
    if (sub == pingpong) {
      auto* noref = sub->add_flag("--no-socket-reference",
                                  "Skip the plain loopback TCP socket references (busy-polling and blocking recv) "
                                  "that are timed beside the transport in the same processes");
      noref->each([&mp](const std::string&) { mp.socket_reference = false; });
    }
    sub->add_option("--iters", mp.iters, "Operations per timed batch (0 = about 256 MiB per batch, 1 GiB with --device gpu; 5..1000)")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    sub->add_option("--warmup", mp.warmup, "Untimed operations per size after the checked one (-1 = iters / 5)")
        ->capture_default_str();
    sub->add_option("--timeout", mp.timeout_s, "Deadline in seconds of every collective and of the rendezvous")
        ->capture_default_str();
    if (sub != pingpong)
      sub->add_option("--ring-options", mp.ring_options,
                      "Extra options of the ring cross_device_ops, JSON (e.g. '{\"chunk_bytes\": 524288}', "
                      "'{\"doubling_max_bytes\": 0, \"direct_doubling\": false}': the direct exchange in one "
                      "round also over tcp (the same bits as tcp's default, recursive doubling up to 64 KiB with "
                      "4+ ranks), '{\"pairwise_max_bytes\": 0}': the ring instead of the pairwise exchange over "
                      "tcp, or '{\"doubling_max_bytes\": 262144, \"halving_max_bytes\": 4194304}': recursive "
                      "doubling and halving with 4+ ranks up to larger sizes, in another order than the ring)")
          ->capture_default_str();
    sub->add_option("--transport-options", mp.transport_options,
                    "Options of the transport, JSON (e.g. '{\"connections_per_peer\": 1}')")
        ->capture_default_str();
  }

  auto* input = app.add_subcommand(
      "input", "Records read and verified per second through the records pipeline vs sequential read of the file");
  strata::bench::InputBenchOptions in;
  input->add_option("--size-mb", in.size_mb, "Size of the record file to write (MiB)")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  input->add_option("--record-bytes", in.record_bytes, "Payload bytes per record")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{256} << 20));
  input->add_option("--file", in.file, "Use this record file (written when missing) and keep it");
  input->add_option("--buffer-bytes", in.buffer_bytes, "The pipeline's buffer_bytes option")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t{4096}, std::int64_t{1} << 30));

  auto* fit = app.add_subcommand(
      "fit", "Trainer::fit step time vs the hand-written training loop on the same model, data and strategy");
  strata::bench::FitBenchOptions fo;
  fit->add_option("--strategy", fo.strategy, "Strategy (one_device, mirrored, central_storage)")->capture_default_str();
  fit->add_option("--devices", fo.devices, "Comma-separated devices")->capture_default_str();
  fit->add_option("--steps", fo.steps, "Timed steps per run")->capture_default_str()->check(CLI::PositiveNumber);
  fit->add_option("--global-batch", fo.global_batch, "Global batch size")->capture_default_str()->check(CLI::PositiveNumber);
  fit->add_option("--features", fo.features, "MLP input features")->capture_default_str()->check(CLI::PositiveNumber);
  fit->add_option("--hidden", fo.hidden, "MLP hidden units")->capture_default_str()->check(CLI::PositiveNumber);
  fit->add_option("--classes", fo.classes, "MLP classes")->capture_default_str()->check(CLI::Range(2, 1000));

  auto* ckpt = app.add_subcommand(
      "checkpoint", "Checkpoint::save and restore (warm and cold page cache) vs plain write(2)+fsync and read(2)");
  strata::bench::CheckpointBenchOptions co;
  ckpt->add_option("--size-mb", co.size_mb, "Total size of the variables (MiB)")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  ckpt->add_option("--variables", co.variables, "Number of float32 variables sharing --size-mb")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  ckpt->add_option("--dir", co.dir, "Directory to write in (a fresh subdirectory, removed afterwards; default $TMPDIR)");

  auto* psb = app.add_subcommand("ps", "Parameter-server closures/s and variable pull/push (see ps.h)");
  strata::bench::PsBenchOptions pso;
  bool ps_serve = false;
  psb->add_option("--workers", pso.workers, "worker tasks")->capture_default_str()->check(CLI::Range(1, 64));
  psb->add_option("--ps", pso.ps, "ps tasks")->capture_default_str()->check(CLI::Range(1, 64));
  psb->add_option("--sizes", pso.sizes, "variable sizes: a doubling range 4K:64M or a list")->capture_default_str();
  psb->add_option("--closures", pso.closures, "closures per repeat")->capture_default_str()->check(CLI::Range(1, 10000000));
  psb->add_flag("--serve", ps_serve, "internal: the server role the benchmark starts")->group("");

  CLI11_PARSE(app, argc, argv);
  try {
    if (psb->parsed()) {
      if (ps_serve) return strata::bench::run_ps_bench_server();
      pso.repeats = repeats_opt->count() > 0 ? repeats : 5;
      pso.json = json;
      return strata::bench::run_ps_bench(pso);
    }
    if (fit->parsed()) {
      fo.repeats = repeats_opt->count() > 0 ? repeats : 5;
      fo.json = json;
      return strata::bench::run_fit_bench(fo);
    }
    if (ckpt->parsed()) {
      co.repeats = repeats_opt->count() > 0 ? repeats : 3;
      co.json = json;
      return strata::bench::run_checkpoint_bench(co);
    }
    if (input->parsed()) {
      in.repeats = repeats_opt->count() > 0 ? repeats : 3;
      in.json = json;
      return strata::bench::run_input_bench(in);
    }
    if (dispatch->parsed()) return run_dispatch(split_csv(strategies), iters, repeats, json);
    if (allreduce->parsed() && device == "gpu") {
      if (!transport.empty() && transport != "nccl")
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "--device gpu runs over the nccl transport; drop --transport ",
                     transport);
      mp.op = "allreduce";
      mp.device = "gpu";
      mp.blocking = gpu_blocking;
      mp.transport = "nccl";
      mp.sizes = strata::bench::parse_sizes(allreduce_sizes->count() > 0 ? sizes : "4K:1G");
      mp.json = json;
      mp.trials = repeats_opt->count() > 0 ? repeats : 7;
      if (worker_rank >= 0) return strata::bench::run_worker(mp, worker_rank);
      const int gpus = strata::bench::gpu_count_or_throw();  // no GPU: fail here, before any worker starts
      if (allreduce_ranks->count() == 0) mp.ranks = gpus;
      if (mp.ranks == 1) return strata::bench::run_gpu_allreduce(mp, 0);  // this process alone, in-process store
      return strata::bench::run_launcher(mp, argc, argv);
    }
    if (gpu_blocking)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "--blocking applies to allreduce --device gpu only");
    if (!allreduce->parsed() || !transport.empty() || allreduce_ranks->count() > 0) {
      mp.op = allreduce->parsed()    ? "allreduce"
              : broadcast->parsed()  ? "broadcast"
              : pingpong->parsed()   ? "pingpong"
              : rendezvous->parsed() ? "rendezvous"
                                     : "allgather";
      mp.transport = transport.empty() ? "tcp" : transport;
      if (!rendezvous->parsed()) mp.sizes = strata::bench::parse_sizes(pingpong->parsed() ? pingpong_sizes : sizes);
      mp.json = json;
      mp.trials = repeats_opt->count() > 0 ? repeats : 7;
      if (worker_rank >= 0) return strata::bench::run_worker(mp, worker_rank);
      return strata::bench::run_launcher(mp, argc, argv);
    }
    std::vector<int> counts;
    for (const std::string& c : split_csv(replicas)) {
      const int k = std::stoi(c);
      if (k < 1) STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "--replicas: counts must be >= 1, got ", c);
      counts.push_back(k);
    }
    return run_allreduce(counts, strata::bench::parse_sizes(sizes), strategy, cross_device_ops, repeats, json);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "strata-bench: error: %s\n", e.what());
    return 2;
  }
}
