// SPDX-License-Identifier: Apache-2.0
// strata::Trainer and its callbacks: fit/evaluate/predict under every
// single-process strategy against the Default strategy (same global batch),
// History, each callback doing what it says (EarlyStopping's epoch, the
// scheduler's rates in the optimizer, CSV rows and TensorBoard scalars equal
// to History, decoded by protoc-generated Python, the progress bar on a
// pseudo-terminal and in a pipe), checkpoints that resume bit for bit, and
// the errors.
#include <fcntl.h>
#include <pty.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>

#include "layered_model.h"
#include "softmax_model.h"
#include "strata/coordinator.hpp"
#include "strata/strata.hpp"
#include "test_support.h"
#include "trainer_mp_case.h"

namespace strata {
namespace {

using test::SoftmaxModel;

constexpr std::int64_t kFeatures = 4, kClasses = 3;

Dataset train_data(std::int64_t batch = 32) {
  return Dataset::from_tensor_slices(test::clusters(512, kFeatures, kClasses, 7)).batch(batch);
}
Dataset test_data() { return Dataset::from_tensor_slices(test::clusters(256, kFeatures, kClasses, 7 + 100)).batch(64); }

std::string devices(int n) {
  std::string s = R"({"devices": [)";
  for (int i = 0; i < n; ++i) s += (i ? ", " : "") + std::string("\"cpu:") + std::to_string(i) + "\"";
  return s + "]}";
}

struct FitRun {
  History history;
  std::vector<std::vector<float>> weights;
  Logs eval;
};

// Three epochs of SGD with momentum on `strategy` (nullopt: the Default).
FitRun train_on(std::optional<Strategy>& strategy, std::vector<Callback*> callbacks = {}, int epochs = 3) {
  Strategy& s = strategy ? *strategy : get_strategy();
  std::optional<Scope> scope;
  if (strategy) scope.emplace(s.scope());
  SoftmaxModel model(kFeatures, kClasses);
  SGD opt(0.1, 0.9);
  Trainer trainer(s, model, opt, {"accuracy"});
  scope.reset();
  FitOptions o;
  o.epochs = epochs;
  o.validation_data = test_data();
  o.callbacks = std::move(callbacks);
  o.verbose = false;
  FitRun r;
  r.history = trainer.fit(train_data(), o);
  for (Variable* v : model.trainable_variables()) r.weights.push_back(v->value().to_vector<float>());
  r.eval = trainer.evaluate(test_data());
  return r;
}

TEST(TrainerTest, LearnsAndEveryStrategyMatchesTheDefaultStrategy) {
  std::optional<Strategy> none;
  const FitRun ref = train_on(none);
  ASSERT_EQ(ref.history.epochs, (std::vector<int>{0, 1, 2}));
  EXPECT_LT(ref.history.history.at("loss")[2], ref.history.history.at("loss")[0]);
  EXPECT_GT(ref.history.last("val_accuracy"), 0.9);  // chance is 1/3
  EXPECT_EQ(ref.eval.at("accuracy"), ref.history.last("val_accuracy"));
  for (const char* key : {"loss", "accuracy", "val_loss", "val_accuracy", "learning_rate"})
    EXPECT_EQ(ref.history.history.at(key).size(), 3u) << key;
  for (auto [name, opts] : {std::pair<std::string, std::string>{"one_device", R"({"device": "cpu:0"})"},
                            {"mirrored", devices(2)}, {"mirrored", devices(4)}, {"central_storage", devices(2)}}) {
    SCOPED_TRACE(name + " " + opts);
    std::optional<Strategy> s(Strategy::create(name, opts));
    const FitRun got = train_on(s);
    // The replicas' gradient sum is added in another order than one
    // replica's: float32 rounding only (measured differences ~1e-7).
    for (std::size_t v = 0; v < got.weights.size(); ++v)
      for (std::size_t i = 0; i < got.weights[v].size(); ++i)
        EXPECT_NEAR(got.weights[v][i], ref.weights[v][i], 1e-5) << "variable " << v << " element " << i;
    for (const auto& [key, values] : ref.history.history)
      for (std::size_t e = 0; e < values.size(); ++e)
        EXPECT_NEAR(got.history.history.at(key)[e], values[e], 1e-5) << key << " epoch " << e;
  }
}

TEST(TrainerTest, EvaluateAndPredictEqualADirectComputation) {
  SoftmaxModel model(kFeatures, kClasses);
  SGD opt(0.1);
  Trainer trainer(get_strategy(), model, opt, {"accuracy", "sparse_categorical_crossentropy_from_logits"});
  const Element data = test::clusters(100, kFeatures, kClasses, 3);
  const Tensor pred = trainer.predict(Dataset::from_tensor_slices(data.clone()).batch(30));
  ASSERT_EQ(pred.shape(), (std::vector<std::int64_t>{100, kClasses}));
  // The same forward pass over all 100 rows at once.
  const std::vector<std::string> names{"x", "y"};
  const Features all(&names, {&data["x"], &data["y"]});
  const ForwardResult direct = model.forward(all);
  EXPECT_EQ(pred.to_vector<float>(), direct.predictions.to_vector<float>());
  const Logs logs = trainer.evaluate(Dataset::from_tensor_slices(data.clone()).batch(30));
  double loss = 0, hits = 0;
  const float* lp = direct.predictions.data<float>();
  for (std::int64_t r = 0; r < 100; ++r) {
    loss += direct.per_example_loss.data<float>()[r];
    hits += (std::max_element(lp + r * kClasses, lp + (r + 1) * kClasses) - (lp + r * kClasses)) ==
            data["y"].data<std::int32_t>()[r];
  }
  EXPECT_NEAR(logs.at("loss"), loss / 100, 1e-6);
  EXPECT_NEAR(logs.at("sparse_categorical_crossentropy_from_logits"), loss / 100, 1e-6);
  EXPECT_DOUBLE_EQ(logs.at("accuracy"), hits / 100);
}

// Records what each hook saw.
struct Recorder : Callback {
  std::vector<std::string> events;
  std::vector<double> lr_seen;
  std::vector<std::vector<float>> weights_at_epoch_end;
  void on_train_begin(const Logs&) override { events.push_back("train_begin"); }
  void on_train_end(const Logs&) override { events.push_back("train_end"); }
  void on_epoch_begin(int e, const Logs&) override {
    events.push_back("epoch_begin " + std::to_string(e));
    lr_seen.push_back(trainer()->optimizer().learning_rate());
  }
  void on_epoch_end(int e, const Logs&) override {
    events.push_back("epoch_end " + std::to_string(e));
    std::vector<float> w;
    for (Variable* v : trainer()->model().trainable_variables())
      for (float x : v->value().to_vector<float>()) w.push_back(x);
    weights_at_epoch_end.push_back(w);
  }
  void on_test_begin(const Logs&) override { events.push_back("test_begin"); }
};

TEST(TrainerTest, HooksRunInKerasOrderAndTheSchedulerReachesTheOptimizer) {
  const std::vector<double> rates{0.5, 0.4, 0.45, 0.45, 0.45, 0.45};
  LearningRateScheduler sched([&](int epoch, double) { return rates[static_cast<std::size_t>(epoch)]; });
  Recorder rec;
  // Monitor the learning rate: best 0.4 at epoch 1, then no improvement for
  // 2 epochs (patience 2): stops after epoch 3 and puts epoch 1's weights back.
  EarlyStopping stop("learning_rate", 0, 2, "min", std::nullopt, /*restore_best_weights=*/true);
  SoftmaxModel model(kFeatures, kClasses);
  SGD opt(0.01);
  Trainer trainer(get_strategy(), model, opt, {"accuracy"});
  FitOptions o;
  o.epochs = 6;
  o.validation_data = test_data();
  o.validation_freq = 2;
  o.callbacks = {&sched, &rec, &stop};
  o.verbose = false;
  const History h = trainer.fit(train_data(), o);
  EXPECT_EQ(stop.stopped_epoch(), 3);
  EXPECT_EQ(stop.best_epoch(), 1);
  EXPECT_EQ(h.epochs, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(h.history.at("learning_rate"), (std::vector<double>{0.5, 0.4, 0.45, 0.45}));
  EXPECT_EQ(rec.lr_seen, (std::vector<double>{0.5, 0.4, 0.45, 0.45}));
  EXPECT_EQ(h.history.at("val_loss").size(), 2u);  // after epochs 1 and 3
  EXPECT_EQ(rec.events.front(), "train_begin");
  EXPECT_EQ(rec.events.back(), "train_end");
  EXPECT_EQ(rec.events[1], "epoch_begin 0");
  EXPECT_EQ(rec.events[2], "epoch_end 0");
  EXPECT_EQ(rec.events[4], "test_begin");  // epoch 1 validates before its end
  std::vector<float> now;
  for (Variable* v : model.trainable_variables())
    for (float x : v->value().to_vector<float>()) now.push_back(x);
  EXPECT_EQ(now, rec.weights_at_epoch_end[1]);
  EXPECT_NE(now, rec.weights_at_epoch_end[3]);
}

// Keras: stop_training set in on_train_batch_end ends the epoch after that
// batch; the epoch still gets its metrics, validation and on_epoch_end.
TEST(TrainerTest, StopTrainingInABatchEndsTheEpochAfterThatBatch) {
  struct StopAt : Callback {
    int epoch;
    std::int64_t batch;
    StopAt(int e, std::int64_t b) : epoch(e), batch(b) {}
    void on_train_batch_end(std::int64_t b, const Logs&) override {
      if (trainer()->epoch() == epoch && b == batch) trainer()->stop_training = true;
    }
  } stop(1, 3);
  Recorder rec;
  SoftmaxModel model(kFeatures, kClasses);
  SGD opt(0.1);
  Trainer trainer(get_strategy(), model, opt, {"accuracy"});
  FitOptions o;
  o.epochs = 4;
  o.validation_data = test_data();
  o.callbacks = {&rec, &stop};
  o.verbose = false;
  const History h = trainer.fit(train_data(), o);  // 512 / 32 = 16 batches per epoch
  EXPECT_EQ(h.epochs, (std::vector<int>{0, 1}));
  EXPECT_EQ(trainer.global_step(), 16 + 4);
  EXPECT_EQ(h.history.at("val_loss").size(), 2u);
  EXPECT_EQ(rec.events.back(), "train_end");
  EXPECT_EQ(std::count(rec.events.begin(), rec.events.end(), "epoch_end 1"), 1);
  EXPECT_EQ(std::count(rec.events.begin(), rec.events.end(), "epoch_begin 2"), 0);
}

// keras.callbacks.TerminateOnNaN: the first batch whose loss is NaN stops
// training after it, and the chief says which batch.
TEST(TrainerTest, TerminateOnNaNStopsAfterTheFirstBatchWithAnInvalidLoss) {
  Element e = test::clusters(512, kFeatures, kClasses, 7);
  e["x"].data<float>()[(32 * 5 + 7) * kFeatures + 2] = std::nanf("");  // a row of batch 5 (epoch 1)
  const Dataset data = Dataset::from_tensor_slices(std::move(e)).batch(32);
  SoftmaxModel model(kFeatures, kClasses);
  SGD opt(0.1);
  Trainer trainer(get_strategy(), model, opt);
  test::TempDir dir;
  const std::string out_path = (dir.path() / "out.txt").string();
  std::FILE* out = std::fopen(out_path.c_str(), "w");
  ASSERT_NE(out, nullptr);
  TerminateOnNaN nan_stop(out);
  FitOptions o;
  o.epochs = 3;
  o.callbacks = {&nan_stop};
  o.verbose = false;
  const History h = trainer.fit(data, o);
  std::fclose(out);
  EXPECT_EQ(nan_stop.stopped_epoch(), 0);
  EXPECT_EQ(nan_stop.stopped_batch(), 5);
  EXPECT_EQ(h.epochs, (std::vector<int>{0}));
  EXPECT_EQ(trainer.global_step(), 6);
  EXPECT_TRUE(std::isnan(h.history.at("loss").at(0)));
  std::ifstream in(out_path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), "Batch 5: Invalid loss, terminating training\n");

  // Finite losses (a fresh model: this one's weights are NaN now): it never
  // stops anything.
  SoftmaxModel fresh(kFeatures, kClasses);
  SGD opt2(0.1);
  Trainer trainer2(get_strategy(), fresh, opt2);
  TerminateOnNaN quiet;
  o.callbacks = {&quiet};
  const History full = trainer2.fit(train_data(), o);
  EXPECT_EQ(full.epochs, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(quiet.stopped_batch(), -1);
}

TEST(TrainerTest, CsvRowsAndTensorBoardScalarsMatchHistory) {
  test::TempDir dir;
  CSVLogger csv((dir.path() / "log.csv").string());
  TensorBoard tb((dir.path() / "tb").string());
  std::optional<Strategy> none;
  const FitRun r = train_on(none, {&csv, &tb});
  std::ifstream in(dir.path() / "log.csv");
  std::string header;
  std::getline(in, header);
  EXPECT_EQ(header, "epoch,accuracy,learning_rate,loss,val_accuracy,val_loss");
  for (int e = 0; e < 3; ++e) {
    std::string row;
    ASSERT_TRUE(std::getline(in, row));
    std::stringstream ss(row);
    std::string cell;
    std::getline(ss, cell, ',');
    EXPECT_EQ(cell, std::to_string(e));
    for (const char* key : {"accuracy", "learning_rate", "loss", "val_accuracy", "val_loss"}) {
      std::getline(ss, cell, ',');
      EXPECT_EQ(std::stod(cell), r.history.history.at(key)[static_cast<std::size_t>(e)]) << key;
    }
  }
  // Decode the event files with protoc-generated Python (python3-protobuf)
  // against the Event schema, written out in event.proto.
  const std::string script = (dir.path() / "decode.py").string();
  {
    std::ofstream proto(dir.path() / "event.proto");
    proto << "syntax = \"proto3\";\n"
             "message SummaryValue { string tag = 1; float simple_value = 2; }\n"
             "message Summary { repeated SummaryValue value = 1; }\n"
             "message Event { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }\n";
    std::ofstream py(script);
    py << "import glob, os, struct, sys\n"
          "sys.path.insert(0, sys.argv[1])\n"
          "import event_pb2\n"
          "for sub in ('train', 'validation'):\n"
          "    files = glob.glob(os.path.join(sys.argv[2], sub, 'events.out.tfevents.*'))\n"
          "    assert len(files) == 1, files\n"
          "    data = open(files[0], 'rb').read()\n"
          "    at, first = 0, True\n"
          "    while at < len(data):\n"
          "        (n,) = struct.unpack('<Q', data[at:at + 8]); at += 12\n"
          "        e = event_pb2.Event(); e.ParseFromString(data[at:at + n]); at += n + 4\n"
          "        if first:\n"
          "            assert e.file_version == 'brain.Event:2', e; first = False; continue\n"
          "        for v in e.summary.value:\n"
          "            print(sub, e.step, v.tag, repr(v.simple_value))\n";
  }
  const std::string cmd = "cd '" + dir.str() + "' && protoc --python_out=. event.proto && /usr/bin/python3 '" + script +
                          "' . '" + (dir.path() / "tb").string() + "' 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  for (size_t k; (k = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, k);
  ASSERT_EQ(::pclose(p), 0) << out;
  std::map<std::string, float> seen;
  std::stringstream lines(out);
  for (std::string sub, tag, value; lines >> sub;) {
    int step = 0;
    lines >> step >> tag >> value;
    seen[sub + " " + std::to_string(step) + " " + tag] = std::stof(value);
  }
  for (int e = 0; e < 3; ++e) {
    const auto i = static_cast<std::size_t>(e);
    EXPECT_EQ(seen.at("train " + std::to_string(e) + " epoch_loss"), static_cast<float>(r.history.history.at("loss")[i]));
    EXPECT_EQ(seen.at("train " + std::to_string(e) + " epoch_accuracy"),
              static_cast<float>(r.history.history.at("accuracy")[i]));
    EXPECT_EQ(seen.at("validation " + std::to_string(e) + " epoch_loss"),
              static_cast<float>(r.history.history.at("val_loss")[i]));
  }
  EXPECT_EQ(seen.size(), 3u * 5u) << out;
}

TEST(TrainerTest, ProgressBarOnAPseudoTerminalAndInAPipe) {
  int master = -1, slave = -1;
  ASSERT_EQ(::openpty(&master, &slave, nullptr, nullptr, nullptr), 0);
  std::FILE* tty = ::fdopen(slave, "w");
  ProgressBar on_tty(tty, std::nullopt, 4);  // isatty decides: a terminal
  test::TempDir dir;
  std::FILE* pipe_like = std::fopen((dir.path() / "bar.txt").c_str(), "w");
  ProgressBar in_file(pipe_like, std::nullopt, 4);
  std::optional<Strategy> none;
  const FitRun r = train_on(none, {&on_tty, &in_file}, 2);
  std::fclose(tty);
  ::fcntl(master, F_SETFL, O_NONBLOCK);
  std::string term;
  char buf[65536];
  for (ssize_t k; (k = ::read(master, buf, sizeof buf)) > 0;) term.append(buf, static_cast<size_t>(k));
  ::close(master);
  std::fclose(pipe_like);
  EXPECT_NE(term.find("Epoch 1"), std::string::npos) << term;
  EXPECT_NE(term.find("Epoch 2"), std::string::npos) << term;
  EXPECT_NE(term.find("\r4/Unknown"), std::string::npos) << term;  // epoch 1 does not know its length yet
  EXPECT_NE(term.find("\r4/16 "), std::string::npos) << term;      // epoch 2 does (512 / 32 steps)
  EXPECT_NE(term.find("ETA: "), std::string::npos) << term;
  EXPECT_NE(term.find("\u2501"), std::string::npos) << term;
  EXPECT_NE(term.find("val_accuracy: "), std::string::npos) << term;
  std::ifstream in(dir.path() / "bar.txt");
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  ASSERT_EQ(lines.size(), 2u);  // one line per epoch, no carriage returns
  EXPECT_EQ(lines[0].rfind("Epoch 1 - 16/16 - ", 0), 0u) << lines[0];
  EXPECT_EQ(lines[1].find('\r'), std::string::npos);
  char loss[32];
  std::snprintf(loss, sizeof loss, "loss: %.4f", r.history.history.at("loss")[1]);
  EXPECT_NE(lines[1].find(loss), std::string::npos) << lines[1];
}

TEST(TrainerTest, ModelCheckpointResumesBitForBit) {
  test::TempDir dir;
  auto fit = [&](int initial, int epochs, bool restore, std::vector<float>* weights) {
    SoftmaxModel model(kFeatures, kClasses);
    Adam opt(0.05);
    Trainer trainer(get_strategy(), model, opt, {});
    ModelCheckpoint ckpt((dir.path() / "ck").string(), "loss", false, "auto", 2);
    if (restore) {
      EXPECT_EQ(ModelCheckpoint::restore_latest(trainer, (dir.path() / "ck").string()), initial);
    }
    FitOptions o;
    o.epochs = epochs;
    o.initial_epoch = initial;
    o.callbacks = {&ckpt};
    o.verbose = false;
    trainer.fit(train_data(), o);
    weights->clear();
    for (Variable* v : model.trainable_variables())
      for (float x : v->value().to_vector<float>()) weights->push_back(x);
  };
  std::vector<float> straight, first, resumed;
  fit(0, 4, false, &straight);
  std::filesystem::remove_all(dir.path() / "ck");
  fit(0, 2, false, &first);
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "ck" / "ckpt-2"));
  fit(2, 4, true, &resumed);
  EXPECT_EQ(resumed, straight);
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "ck" / "ckpt-2"));  // max_to_keep 2: ckpt-3, ckpt-4
}

// A "crash" at a known global step: an exception out of fit().
struct CrashAt : Callback {
  std::int64_t at;
  explicit CrashAt(std::int64_t step) : at(step) {}
  void on_train_batch_end(std::int64_t, const Logs&) override {
    if (trainer()->global_step() == at) throw std::runtime_error("crash");
  }
};

// Keras' BackupAndRestore: a run that dies mid-epoch and is started again
// with the same callback ends with the uninterrupted run's weights, bit for
// bit, with a reshuffled input (its position and pass are in the backup),
// Adam's slots and the epoch's running metrics restored; backups are
// deleted when training completes.
TEST(TrainerTest, BackupAndRestoreCallbackResumesBitForBit) {
  test::TempDir dir;
  const Element data = test::clusters(200, kFeatures, kClasses, 11);
  auto dataset = [&] { return Dataset::from_tensor_slices(data.clone()).shuffle(64, 3).batch(16); };
  for (std::int64_t every : {std::int64_t{5}, std::int64_t{0}}) {
    SCOPED_TRACE("save_every_steps " + std::to_string(every));
    auto fit = [&](std::optional<std::int64_t> crash, std::vector<float>* weights, History* h) {
      SoftmaxModel model(kFeatures, kClasses);
      Adam opt(0.05);
      Trainer trainer(get_strategy(), model, opt, {"accuracy"});
      BackupAndRestoreCallback backup((dir.path() / "backup").string(), every);
      CrashAt c(crash.value_or(-1));
      FitOptions o;
      o.epochs = 4;
      o.callbacks = {&backup, &c};
      o.verbose = false;
      try {
        *h = trainer.fit(dataset(), o);
      } catch (const std::runtime_error&) {
        return false;
      }
      weights->clear();
      for (Variable* v : model.trainable_variables())
        for (float x : v->value().to_vector<float>()) weights->push_back(x);
      return true;
    };
    std::vector<float> straight, resumed;
    History h1, h2, h3;
    ASSERT_TRUE(fit(std::nullopt, &straight, &h1));
    EXPECT_FALSE(std::filesystem::exists(dir.path() / "backup"));  // deleted at the end
    // 13 steps per epoch (200 / 16): step 32 is in epoch 2 (steps 26..38).
    ASSERT_FALSE(fit(32, &resumed, &h2));
    EXPECT_TRUE(latest_checkpoint((dir.path() / "backup").string()).has_value());
    ASSERT_TRUE(fit(std::nullopt, &resumed, &h3));
    EXPECT_EQ(resumed, straight);
    EXPECT_EQ(h3.epochs, (std::vector<int>{2, 3}));
    // The resumed epoch's logs equal the uninterrupted run's: its running
    // metrics came back with the backup.
    EXPECT_EQ(h3.history.at("loss"), std::vector<double>(h1.history.at("loss").begin() + 2, h1.history.at("loss").end()));
    EXPECT_EQ(h3.history.at("accuracy"),
              std::vector<double>(h1.history.at("accuracy").begin() + 2, h1.history.at("accuracy").end()));
    EXPECT_FALSE(std::filesystem::exists(dir.path() / "backup"));
  }
}

TEST(TrainerTest, BadUseIsAClearError) {
  Strategy s = Strategy::create("mirrored", devices(2));
  SoftmaxModel outside(kFeatures, kClasses);  // made outside the scope
  SGD opt(0.1);
  try {
    Trainer t(s, outside, opt);
    FAIL();
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("create the model's variables inside strategy.scope()"), std::string::npos)
        << e.what();
  }
  SoftmaxModel model(kFeatures, kClasses);
  Trainer t(get_strategy(), model, opt);
  Element no_x;
  no_x.add("features", Tensor::zeros({8, kFeatures}, DType::kFloat32));
  no_x.add("y", Tensor::zeros({8}, DType::kInt32));
  FitOptions o;
  o.verbose = false;
  try {
    t.fit(Dataset::from_tensor_slices(std::move(no_x)).batch(4), o);
    FAIL();
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("no component 'x'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(t.fit(Dataset::from_tensor_slices(test::clusters(8, kFeatures, kClasses, 1)), o), InvalidArgumentError);
  EXPECT_THROW(Trainer(get_strategy(), model, opt, {"auc"}), InvalidArgumentError);
  o.validation_freq = 0;
  EXPECT_THROW(t.fit(train_data(), o), InvalidArgumentError);
}

// A model that reports its gradients layer by layer: the all-reduce of the
// last layer finishes while the first layer's backward pass still runs (the
// model's hook waits for it), and the weights and logs are bit-identical to
// the same buckets reduced after the backward pass and to the default
// one-collective step, on every single-process strategy and bucket size.
TEST(TrainerTest, LayeredGradientsAreReducedDuringTheBackwardPass) {
  for (auto [name, opts] : {std::pair<std::string, std::string>{"default", "{}"},
                            {"one_device", R"({"device": "cpu:0"})"}, {"mirrored", devices(2)},
                            {"mirrored", devices(3)}, {"central_storage", devices(2)}}) {
    for (std::int64_t bucket : {std::int64_t{0}, std::int64_t{1} << 20}) {
      SCOPED_TRACE(name + " " + opts + " bucket_bytes " + std::to_string(bucket));
      Strategy s = Strategy::create(name, opts);
      test::CaseResult plain = test::run_case(s, "plain", bucket), deferred = test::run_case(s, "deferred", bucket),
                       overlap = test::run_case(s, "overlap", bucket);
      const double steps = 32.0 * s.num_local_replicas();  // 2 epochs of 16 steps, every replica
      EXPECT_EQ(overlap.at("backward_steps"), std::vector<double>{steps});
      // One bucket per layer: the hook waited for the last layer's
      // reduction every step. One 1 MiB bucket: it goes out at the end.
      EXPECT_EQ(overlap.at("seen_reduced"), std::vector<double>{bucket == 0 ? steps : 0});
      EXPECT_EQ(deferred.at("seen_reduced"), std::vector<double>{0});
      for (test::CaseResult* r : {&plain, &deferred, &overlap}) {
        r->erase("seen_reduced");
        r->erase("backward_steps");
      }
      EXPECT_EQ(overlap, deferred);
      EXPECT_EQ(overlap, plain);
      EXPECT_GT(overlap.at("hist:accuracy").back(), 0.8);  // it learns
    }
  }
}

// A model whose layer reports are wrong.
struct BadReports : test::LayeredModel {
  int mode = 0;
  BadReports() : LayeredModel(kFeatures, 8, kClasses) {}
  ForwardResult forward_backward_layers(const Features& batch, double scale, std::vector<Tensor>& grads,
                                        GradientSink& sink) override {
    ForwardResult r = forward_backward(batch, scale, grads);
    if (mode == 0) sink.ready(2, 3);  // past the 4 variables
    if (mode == 1) {
      sink.ready(0, 2);
      sink.ready(1, 1);  // twice
    }
    if (mode == 2) sink.ready(0, 3);  // output/bias never
    return r;
  }
};

// A train_step that reads a metric inside the replica function.
struct ReadsMetricInStep : Trainer {
  using Trainer::Trainer;
  void train_step(ReplicaContext& ctx, const Features& batch) override {
    Trainer::train_step(ctx, batch);
    (void)metric_logs();
  }
};

TEST(TrainerTest, BadLayerReportsAndMetricReadsInReplicaContextAreClearErrors) {
  Strategy s = Strategy::create("mirrored", devices(2));
  FitOptions o;
  o.verbose = false;
  const std::vector<std::string> want{"report a non-empty range inside [0, 4)", "'hidden/bias' (index 1) was reported twice",
                                      "did not report the gradient of variable 'output/bias' (index 3)"};
  for (int mode = 0; mode < 3; ++mode) {
    std::optional<Scope> scope(s.scope());
    BadReports model;
    model.mode = mode;
    SGD opt(0.1);
    Trainer t(s, model, opt);
    scope.reset();
    try {
      t.fit(train_data(), o);
      ADD_FAILURE() << "mode " << mode;
    } catch (const InvalidArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find(want[static_cast<std::size_t>(mode)]), std::string::npos) << e.what();
    }
    // The trainer is still usable: the reducers are idle.
    model.mode = 3;
    model.by_layer = false;
    EXPECT_NO_THROW(t.fit(train_data(), o));
  }
  {
    std::optional<Scope> scope(s.scope());
    test::LayeredModel model(kFeatures, 8, kClasses);
    SGD opt(0.1);
    Trainer t(s, model, opt);
    scope.reset();
    t.gradient_reduction.bucket_bytes = -1;
    EXPECT_THROW(t.fit(train_data(), o), InvalidArgumentError);
  }
  std::optional<Scope> scope(s.scope());
  SoftmaxModel model(kFeatures, kClasses);
  SGD opt(0.1);
  ReadsMetricInStep t(s, model, opt, {"accuracy"});
  scope.reset();
  try {
    t.fit(train_data(), o);
    FAIL();
  } catch (const FailedPreconditionError& e) {
    EXPECT_NE(std::string(e.what()).find("metric 'loss'"), std::string::npos) << e.what();
  }
}

}  // namespace
// The model registry: Trainer(strategy, "name") builds the registered
// model and optimizer in the strategy's scope, and trains exactly as the
// model-reference constructor does; fit(DatasetCreator) goes through
// distribute_datasets_from_function and matches fit(Dataset) at the same
// batch (one replica).
STRATA_REGISTER_MODEL("trainer_test_softmax", [] {
  return ModelParts{std::make_unique<SoftmaxModel>(kFeatures, kClasses, 1), std::make_unique<SGD>(0.1, 0.9)};
});
STRATA_REGISTER_DATASET_FN("trainer_test_train", [](const InputContext& ctx) {
  return Dataset::from_tensor_slices(test::clusters(512, kFeatures, kClasses, 7))
      .shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
      .batch(ctx.get_per_replica_batch_size(32));
});

std::vector<float> weights(Trainer& t) {
  std::vector<float> w;
  for (Variable* v : t.model().trainable_variables())
    for (float x : v->value().to_vector<float>()) w.push_back(x);
  return w;
}

TEST(TrainerTest, RegisteredModelByNameTrainsAsTheModelReference) {
  Strategy s = Strategy::create("one_device", R"({"device": "cpu:0"})");
  FitOptions o;
  o.verbose = false;
  o.epochs = 3;
  o.validation_data = test_data();
  std::optional<Scope> scope(s.scope());
  SoftmaxModel model(kFeatures, kClasses, 1);
  SGD opt(0.1, 0.9);
  Trainer ref(s, model, opt, {"accuracy"});
  scope.reset();
  const History want = ref.fit(train_data(), o);
  Trainer named(s, "trainer_test_softmax", {"accuracy"});
  EXPECT_EQ(named.strategy(), s);
  EXPECT_TRUE(named.ps_variables().empty());  // not parameter_server
  const History got = named.fit(train_data(), o);
  EXPECT_EQ(got.history, want.history);
  EXPECT_EQ(weights(named), weights(ref));
  EXPECT_EQ(named.optimizer().iterations(), ref.optimizer().iterations());
  Trainer created(s, "trainer_test_softmax", {"accuracy"});
  const History from_fn = created.fit(DatasetCreator{"trainer_test_train"}, o);
  EXPECT_EQ(from_fn.history, want.history);
  EXPECT_EQ(weights(created), weights(ref));
  EXPECT_GT(from_fn.last("val_accuracy"), 0.9);
  // Two replicas: each takes its own per-replica batch of 16 (global 32).
  Strategy mirrored = Strategy::create("mirrored", devices(2));
  Trainer two(mirrored, "trainer_test_softmax", {"accuracy"});
  const History two_h = two.fit(DatasetCreator{"trainer_test_train"}, o);
  EXPECT_EQ(two_h.history.at("loss").size(), 3u);
  EXPECT_GT(two_h.last("val_accuracy"), 0.9);
  EXPECT_EQ(two.optimizer().iterations(), ref.optimizer().iterations());  // 16 steps of 32 per epoch
  // Registry errors name the problem.
  EXPECT_THROW(register_model("trainer_test_softmax", [] { return ModelParts{}; }), AlreadyExistsError);
  try {
    Trainer t(s, "no_such_model");
    ADD_FAILURE();
  } catch (const NotFoundError& e) {
    EXPECT_NE(std::string(e.what()).find("'no_such_model'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("trainer_test_softmax"), std::string::npos) << e.what();
  }
  register_model("trainer_test_empty", [] { return ModelParts{}; });
  EXPECT_THROW(Trainer(s, "trainer_test_empty"), InvalidArgumentError);
  EXPECT_THROW(created.fit(DatasetCreator{"no_such_fn"}, o), NotFoundError);
}

}  // namespace strata
