// SPDX-License-Identifier: Apache-2.0
// The "generator" input pipeline: elements come from a user callback
// (tf.data.Dataset.from_generator). Options: {"generator": "0x7f..."}, the
// address of a strata_input_generator the caller keeps alive while any
// pipeline opened from it lives (the C++ Dataset API does).
//
// open() starts a pass (start(user, ctx)), next() pulls one element
// (next(pass)), close() ends the pass (finish(pass)). Sharding is by data
// only: shard(DATA, n, i) keeps elements i, i+n, ... and drops the others
// (their tensors are freed here). The callback runs on the caller's
// thread; the next() timeout cannot interrupt user code, so a callback that
// blocks is the user's to bound.
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>

#include "strata/sdk/options.hpp"
#include "strata/sdk/plugin.hpp"

namespace strata::plugins {
namespace {

constexpr const char* kComp = "generator input pipeline";

const strata_input_generator& parse_generator(const nlohmann::json& o) {
  auto it = o.find("generator");
  if (it == o.end())
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, kComp,
                 " needs option \"generator\": the hex address of a strata_input_generator, e.g. "
                 "{\"generator\": \"0x7f12ab\"}; use strata::Dataset::from_generator from C++");
  if (!it->is_string())
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'generator' of ", kComp,
                 " must be a hex address string such as \"0x7f12ab\", got ", it->dump());
  const std::string s = it->get<std::string>();
  if (s.size() < 3 || s[0] != '0' || (s[1] != 'x' && s[1] != 'X'))
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'generator' of ", kComp, " is '", s,
                 "'; pass the address as a hex string starting with 0x");
  char* end = nullptr;
  errno = 0;
  const unsigned long long a = std::strtoull(s.c_str() + 2, &end, 16);
  if (*end != '\0' || errno != 0 || a == 0)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'generator' of ", kComp, " is '", s,
                 "', not a valid non-NULL hex address");
  const auto* g = reinterpret_cast<const strata_input_generator*>(static_cast<uintptr_t>(a));
  if (g->struct_size < STRATA_INPUT_GENERATOR_STRUCT_SIZE)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, kComp, ": the strata_input_generator has struct_size ", g->struct_size,
                 " but ABI ", STRATA_ABI_MAJOR, ".", STRATA_ABI_MINOR, " needs ", STRATA_INPUT_GENERATOR_STRUCT_SIZE,
                 " (ABI mismatch, or not a strata_input_generator); fill it with STRATA_INIT_HEADER");
  if (g->start == nullptr || g->next == nullptr || g->finish == nullptr)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, kComp, ": the strata_input_generator's ",
                 g->start == nullptr  ? "start"
                 : g->next == nullptr ? "next"
                                      : "finish",
                 " is NULL; set start, next and finish");
  return *g;
}

void free_element(strata_element& e) noexcept {
  for (uint32_t i = 0; i < e.num_components && i < STRATA_ELEMENT_MAX_COMPONENTS; ++i) {
    if (e.tensors[i] != nullptr && e.tensors[i]->deleter != nullptr) e.tensors[i]->deleter(e.tensors[i]);
    e.tensors[i] = nullptr;
  }
  e.num_components = 0;
}

class GeneratorPipeline : public sdk::InputPipelineBase {
 public:
  static constexpr const char* kSubsystem = "input.generator";

  GeneratorPipeline(sdk::Host host, const char* options_json, const strata_input_context& ctx)
      : host_(std::move(host)) {
    const nlohmann::json o = sdk::parse_options(options_json, kComp);
    sdk::check_known_keys(o, {"generator"}, kComp);
    gen_ = &parse_generator(o);
    strata_error err;
    strata_error_init(&err);
    const strata_status_t st = gen_->start(gen_->user, &ctx, &pass_, &err);
    if (st != STRATA_OK)
      ::strata::detail::throw_status(
          st, ::strata::detail::str_cat("generator start failed: ",
                                        err.message[0] ? err.message : strata_status_string(st)));
  }

  ~GeneratorPipeline() override { gen_->finish(pass_); }

  std::string shard_info(uint32_t* flags) override {
    *flags = STRATA_INPUT_CAN_SHARD_BY_DATA;
    return "";
  }

  void shard(strata_shard_policy policy, int32_t num_shards, int32_t index) override {
    shard_.apply(kComp, "it is not file-based", policy, num_shards, index, started_);
  }

  void next(int64_t, strata_element& out) override {
    started_ = true;
    if (ended_) STRATA_THROW(STRATA_ERR_OUT_OF_RANGE, "end of data");
    for (;;) {
      strata_element e{};
      STRATA_INIT_HEADER(&e, strata_element);
      strata_error err;
      strata_error_init(&err);
      const strata_status_t st = gen_->next(pass_, &e, &err);
      if (st == STRATA_ERR_OUT_OF_RANGE) {
        ended_ = true;
        free_element(e);
        STRATA_THROW(STRATA_ERR_OUT_OF_RANGE, "end of data");
      }
      if (st != STRATA_OK) {
        free_element(e);
        ::strata::detail::throw_status(st, err.message[0] ? err.message : strata_status_string(st));
      }
      if (e.num_components > STRATA_ELEMENT_MAX_COMPONENTS) {
        e.num_components = STRATA_ELEMENT_MAX_COMPONENTS;
        free_element(e);
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, kComp, ": the generator returned more than ",
                     STRATA_ELEMENT_MAX_COMPONENTS, " components");
      }
      const int64_t index = produced_++;
      if (!shard_.keeps(index)) {
        free_element(e);  // another shard's element
        continue;
      }
      out.num_components = e.num_components;
      for (uint32_t i = 0; i < e.num_components; ++i) {
        out.names[i] = e.names[i];
        out.tensors[i] = e.tensors[i];
      }
      return;
    }
  }

  int64_t cardinality() { return -1; }

 private:
  sdk::Host host_;
  const strata_input_generator* gen_ = nullptr;
  void* pass_ = nullptr;
  sdk::DataShard shard_;
  int64_t produced_ = 0;
  bool started_ = false, ended_ = false;
};

}  // namespace
}  // namespace strata::plugins

STRATA_PLUGIN("strata generator input pipeline", "0.1.0",
              STRATA_INPUT_PIPELINE_COMPONENT(strata::plugins::GeneratorPipeline, "generator", "0.1.0"))
