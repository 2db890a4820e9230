// SPDX-License-Identifier: Apache-2.0
// checkpoint_worker: one worker process of checkpoint_reshard_test. It
// creates multi_worker_mirrored (one replica per worker) from TF_CONFIG and
// tracks a fixed set of variables (every float and integer dtype ON_WRITE;
// ON_READ with SUM and MEAN) and the step. Then:
//   checkpoint_worker train SAVE_DIR     updates the variables inside run()
//                                        (ON_READ copies differ per replica),
//                                        prints them, saves to SAVE_DIR;
//   checkpoint_worker restore FROM SAVE  restores FROM into freshly created
//                                        variables, prints them, saves to SAVE.
// "Prints" is one JSON line {"worker", "num_workers", "step", "values":
// {name: hex of the cross-replica value's bytes}}; the test compares them
// across hops bit for bit.
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "strata/strata.hpp"

namespace {

using nlohmann::json;
using strata::Aggregation;
using strata::DType;
using strata::Synchronization;
using strata::Tensor;

struct Spec {
  const char* name;
  DType dtype;
  std::vector<std::int64_t> shape;
  Synchronization sync;
  Aggregation agg;
};

// ON_READ values go through a cross-replica sum (SUM: value / n per copy;
// MEAN: n copies of the value) with n = 4, 2 or 1: they are small
// integers times 4, which every one of those sums and divisions keeps exact
// in every dtype. ON_WRITE values are copied, never summed: any bit pattern.
const std::vector<Spec>& specs() {
  static const std::vector<Spec> v{
      {"w_f32", DType::kFloat32, {3, 5}, Synchronization::ON_WRITE, Aggregation::MEAN},
      {"w_f64", DType::kFloat64, {7}, Synchronization::ON_WRITE, Aggregation::SUM},
      {"w_f16", DType::kFloat16, {2, 3}, Synchronization::ON_WRITE, Aggregation::MEAN},
      {"w_bf16", DType::kBFloat16, {9}, Synchronization::ON_WRITE, Aggregation::MEAN},
      {"w_i32", DType::kInt32, {4}, Synchronization::ON_WRITE, Aggregation::ONLY_FIRST_REPLICA},
      {"w_i64", DType::kInt64, {2, 2}, Synchronization::AUTO, Aggregation::NONE},
      {"w_big", DType::kFloat32, {300000}, Synchronization::ON_WRITE, Aggregation::MEAN},  // > 1 MiB
      {"r_sum_f32", DType::kFloat32, {6}, Synchronization::ON_READ, Aggregation::SUM},
      {"r_sum_i64", DType::kInt64, {5}, Synchronization::ON_READ, Aggregation::SUM},
      {"r_mean_f64", DType::kFloat64, {4}, Synchronization::ON_READ, Aggregation::MEAN},
      {"r_mean_i32", DType::kInt32, {3}, Synchronization::ON_READ, Aggregation::MEAN},
      {"r_sum_bf16", DType::kBFloat16, {2}, Synchronization::ON_READ, Aggregation::SUM},
  };
  return v;
}

std::string hex(const Tensor& t) {
  static const char* d = "0123456789abcdef";
  const auto* p = static_cast<const unsigned char*>(t.raw_data());
  std::string s;
  s.reserve(2 * t.nbytes());
  for (std::size_t i = 0; i < t.nbytes(); ++i) {
    s.push_back(d[p[i] >> 4]);
    s.push_back(d[p[i] & 15]);
  }
  return s;
}

// Random bytes (NaN payloads, -0, subnormals included) for ON_WRITE.
Tensor random_bits(const Spec& s, std::uint32_t seed) {
  Tensor t = Tensor::zeros(s.shape, s.dtype);
  std::mt19937 rng(seed);
  auto* p = static_cast<unsigned char*>(t.raw_data());
  for (std::size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<unsigned char>(rng());
  return t;
}

// The per-replica update of an ON_READ variable: 4 * (g + 1 + k) per
// element k for replica g.
Tensor on_read_delta(const Spec& s, int g) {
  std::vector<double> v(static_cast<std::size_t>(strata::shape_numel(s.shape)));
  for (std::size_t k = 0; k < v.size(); ++k) v[k] = 4.0 * static_cast<double>(g + 1 + static_cast<int>(k));
  return Tensor::from_doubles(v, s.shape, s.dtype);
}

int work(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (!(mode == "train" && argc == 3) && !(mode == "restore" && argc == 4)) {
    std::fprintf(stderr, "usage: checkpoint_worker train SAVE_DIR | restore FROM_DIR SAVE_DIR\n");
    return 64;
  }
  strata::Config cfg;
  cfg.apply_env();
  cfg.set("/strategy/name", "\"multi_worker_mirrored\"");
  cfg.set("/strategy/options/devices", R"(["cpu:0"])");
  strata::Strategy s = strata::Strategy::from_config(cfg);
  auto scope = s.scope();
  const int worker = s.extended().worker_index();

  // Every worker starts from other values than the checkpoint's (the chief's
  // initial value wins for ON_WRITE; ON_READ copies start at zero).
  std::vector<std::unique_ptr<strata::Variable>> vars;
  std::int64_t step = mode == "train" ? 0 : -1;
  strata::Checkpoint ckpt;
  for (std::size_t i = 0; i < specs().size(); ++i) {
    const Spec& sp = specs()[i];
    const bool on_read = sp.sync == Synchronization::ON_READ;
    Tensor init = on_read ? Tensor::zeros(sp.shape, sp.dtype)
                          : random_bits(sp, static_cast<std::uint32_t>(1000 * (mode == "train") + 17 * i + 3));
    vars.push_back(std::make_unique<strata::Variable>(init, strata::VariableOptions{sp.name, !on_read, sp.sync, sp.agg}));
    ckpt.track(sp.name, *vars.back());
  }
  ckpt.track("step", &step);

  if (mode == "train") {
    // ON_WRITE: a cross-replica assign of new random bits; ON_READ: every
    // replica adds its own delta, twice.
    for (std::size_t i = 0; i < specs().size(); ++i)
      if (specs()[i].sync != Synchronization::ON_READ)
        vars[i]->assign(random_bits(specs()[i], static_cast<std::uint32_t>(7919 * i + 11)));
    for (int round = 0; round < 2; ++round) {
      s.run([&](strata::ReplicaContext& ctx) {
        const int g = ctx.replica_id_in_sync_group();
        for (std::size_t i = 0; i < specs().size(); ++i)
          if (specs()[i].sync == Synchronization::ON_READ) vars[i]->assign_add(on_read_delta(specs()[i], g + round));
      });
      ++step;
    }
  } else {
    const strata::RestoreStatus st = ckpt.restore(argv[2]);
    st.assert_consumed();
  }

  json out;
  out["worker"] = worker;
  out["num_workers"] = s.extended().num_workers();
  out["step"] = step;
  for (auto& v : vars) out["values"][v->name()] = hex(v->value());
  std::printf("%s\n", out.dump().c_str());
  std::fflush(stdout);
  ckpt.save(argv[argc - 1]);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return work(argc, argv);
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "checkpoint_worker: error: %s (%s)\n", e.what(), e.code_name());
    return 2;
  }
}
