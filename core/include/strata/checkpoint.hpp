// SPDX-License-Identifier: Apache-2.0
// strata::Checkpoint and strata::CheckpointManager (tf.train.Checkpoint and
// tf.train.CheckpointManager).
//
// A Checkpoint tracks named objects: Variables of any kind and strategy
// (mirrored ON_WRITE, ON_READ sync-on-read, central storage, Default) and
// user scalars (int64 / double, e.g. the step and the epoch) held by
// pointer. It does not own them: every tracked object must outlive the
// Checkpoint (or the next save/restore).
//
// save(dir) writes one checkpoint directory:
//   dir/tensors.safetensors  every tracked object as a tensor in the
//                            safetensors layout (8-byte little-endian header
//                            length, JSON header {name: {dtype, shape,
//                            data_offsets}, "__metadata__": {...}}, raw
//                            little-endian data), readable by the
//                            safetensors / NumPy / plain-Python readers;
//   dir/manifest.json        format version, the step (the int64 tracked as
//                            "step", when there is one), who wrote it, and
//                            the byte count and CRC32C of the tensor file.
// A variable is saved as its cross-replica value(): the primary copy of an
// ON_WRITE variable, the aggregate of an ON_READ one (an ON_READ variable
// with aggregation NONE has no cross-replica value and cannot be saved:
// FailedPreconditionError). Scalars are 0-d I64 / F64 tensors.
//
// Who writes: save() is called by every worker at the same point (reading
// an ON_READ variable across workers is a collective); only the chief
// (strategy.extended().is_chief() of the first tracked variable's strategy,
// else of the current strategy) writes, the others return after the reads.
// Atomicity: the chief writes into a temporary sibling directory
// (".<name>.tmp-<pid>-<n>"), fsyncs every file and that directory, renames
// it to `dir` (atomically replacing an existing checkpoint there) and
// fsyncs the parent. The manifest is written last. A crash at any point
// leaves either the previous state or the complete new checkpoint; a
// temporary directory is never taken for a checkpoint (restore needs a
// valid manifest, CheckpointManager ignores names that are not
// "ckpt-<step>").
//
// restore(dir) checks everything before it assigns anything, so an error
// never leaves a partial restore:
//  - `dir`, its manifest or its tensor file missing: NotFoundError;
//  - a truncated or corrupt file, a CRC32C mismatch, a malformed manifest
//    or safetensors header: DataLossError naming the file;
//  - a saved tensor whose dtype or shape differs from the tracked object's:
//    InvalidArgumentError naming it;
//  - a tracked object absent from the checkpoint: NotFoundError naming it,
//    unless RestoreOptions::allow_missing (tf's expect_partial()), which
//    leaves such objects unchanged.
// Saved entries that nothing tracks are ignored (as in TF) and reported by
// the returned RestoreStatus; assert_consumed() turns them into an error.
// Variables are restored with a cross-replica assign(), so they may belong
// to a different strategy or replica count than at save time. For an
// ON_READ SUM variable the strategy stores value / num_replicas per copy so
// that the cross-replica read equals the saved value (exact for floats when
// the replica count is a power of two; integer division for integer
// dtypes, as every cross-replica assign of such a variable).
//
// Threads: save/restore run on the calling thread in cross-replica context
// (inside a replica function: FailedPreconditionError). One Checkpoint must
// not be used from two threads at once, and the tracked objects must not be
// updated while a save or restore runs (the chief writes ON_WRITE variables
// straight from their memory). Errors are recoverable: a failed save leaves
// at most a temporary directory behind (CheckpointManager::save removes
// those), a failed restore changes nothing.
// Memory: save needs no copy of ON_WRITE variables (ON_READ values are
// read into a copy); restore reads the tensor file once, straight into a
// staging copy of the tracked tensors, which it assigns only after the
// whole file checked out: up to the checkpoint's size on top of the
// variables, freed when restore returns.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "strata/data.hpp"
#include "strata/distributed_data.hpp"
#include "strata/export.hpp"
#include "strata/variable.hpp"

namespace strata {

/// Options of Checkpoint::restore.
struct RestoreOptions {
  /// tf's expect_partial(): tracked objects missing from the checkpoint keep
  /// their values instead of failing the restore (NotFoundError).
  bool allow_missing = false;
  static RestoreOptions expect_partial() {
    RestoreOptions o;
    o.allow_missing = true;
    return o;
  }
};

/// What a restore matched (tf's CheckpointLoadStatus).
class STRATA_API RestoreStatus {
 public:
  /// Tracked objects that were assigned.
  const std::vector<std::string>& restored() const { return restored_; }
  /// Tracked objects absent from the checkpoint (only with allow_missing).
  const std::vector<std::string>& missing() const { return missing_; }
  /// Saved entries that nothing tracks.
  const std::vector<std::string>& unused() const { return unused_; }
  /// The manifest's step, when the checkpoint recorded one.
  std::optional<std::int64_t> step() const { return step_; }
  /// Throws InvalidArgumentError listing them when missing() or unused()
  /// is not empty (tf's assert_consumed()).
  const RestoreStatus& assert_consumed() const;

 private:
  friend class Checkpoint;
  std::vector<std::string> restored_, missing_, unused_;
  std::optional<std::int64_t> step_;
};

class STRATA_API Checkpoint {
 public:
  /// File names inside a checkpoint directory, and the format version.
  static constexpr const char* kTensorFile = "tensors.safetensors";
  static constexpr const char* kManifestFile = "manifest.json";
  static constexpr int kFormatVersion = 1;

  Checkpoint();
  Checkpoint(Checkpoint&& o) noexcept;
  Checkpoint& operator=(Checkpoint&& o) noexcept;
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;
  ~Checkpoint();

  /// Track `object` under `name` (not empty, not "__metadata__", unique in
  /// this Checkpoint: InvalidArgumentError otherwise). Returns *this so that
  /// calls chain. The int64 tracked as "step" is also the manifest's step.
  Checkpoint& track(const std::string& name, Variable& variable);
  Checkpoint& track(const std::string& name, std::int64_t* value);
  Checkpoint& track(const std::string& name, double* value);
  /// An object that serialises its own state (an input iterator, a user's
  /// RNG, anything with a position): `save` returns this worker's state as
  /// bytes; `restore` gets the states EVERY worker saved, in worker-index
  /// order (their number is the worker count at save time, which may differ
  /// from today's: the object decides whether it can continue and throws
  /// otherwise). save() gathers the states of all workers to the chief (a
  /// collective), so the checkpoint holds each worker's own position; it is
  /// stored as one uint8 tensor `name` (see kStateMagic for its layout).
  /// Both hooks are required (InvalidArgumentError otherwise). On restore,
  /// state objects are restored before variables and scalars, so an object
  /// that refuses its state fails the restore before any value changed
  /// (state objects restored earlier in the same call keep theirs).
  struct State {
    std::function<std::string()> save;
    std::function<void(const std::vector<std::string>& states_by_worker)> restore;
  };
  Checkpoint& track_state(const std::string& name, State state);
  /// The input position (a state object, see track_state): a distributed
  /// iterator saves every worker's position and restores per
  /// DistributedIterator::restore_state (the same worker count, or another
  /// one for DATA/OFF sharding); a plain DatasetIterator saves each
  /// worker's pass and restores the one of this worker's index (another
  /// worker count: InvalidArgumentError). Restore into a fresh iterator of
  /// the same recipe. The iterator must outlive the Checkpoint.
  Checkpoint& track(const std::string& name, DistributedIterator& iterator);
  Checkpoint& track(const std::string& name, DatasetIterator& iterator);
  /// Layout of a state entry: "STST" magic, u32 version (1), u32 worker
  /// count, then per worker a u64 byte count and the bytes (little endian).
  static constexpr const char* kStateMagic = "STST";
  /// Tracked names, in tracking order.
  std::vector<std::string> names() const;
  /// The current value of the int64 tracked as "step" (nullopt when none is).
  std::optional<std::int64_t> step() const;

  /// Save into directory `dir` (see the file comment). Returns true when
  /// this process wrote it (the chief), false on the other workers.
  bool save(const std::string& dir) const;
  /// Restore from `dir` (see the file comment).
  RestoreStatus restore(const std::string& dir, const RestoreOptions& options = {}) const;

 private:
  friend class BackupAndRestore;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// True when `dir` holds a readable manifest of a complete checkpoint (the
/// tensor file's CRC is checked only by restore).
STRATA_API bool is_checkpoint(const std::string& dir);

/// tf.train.CheckpointManager: numbered checkpoints "<directory>/ckpt-<step>"
/// of one Checkpoint (not owned; it must outlive the manager), keeping the
/// newest max_to_keep (by step; 0 keeps all, negative: InvalidArgumentError).
/// The listing is read from disk on every call, so a restarted program sees
/// what an earlier one saved; entries that are not complete checkpoints
/// (temporaries, directories without a valid manifest, other names) are
/// ignored. The chief is the only writer of `directory`.
class STRATA_API CheckpointManager {
 public:
  CheckpointManager(Checkpoint& checkpoint, std::string directory, int max_to_keep);

  /// Save "<directory>/ckpt-<step>" (creating `directory` when needed;
  /// replacing a checkpoint of the same step), then, on the chief, delete
  /// the oldest beyond max_to_keep and temporaries left by crashed saves.
  /// Every worker calls it (see Checkpoint::save). Returns the path.
  std::string save(std::int64_t step);
  /// Path of the newest complete checkpoint; nullopt when there is none.
  std::optional<std::string> latest_checkpoint() const;
  /// Paths of the complete checkpoints, oldest first.
  std::vector<std::string> checkpoints() const;
  /// Delete every complete checkpoint (each first renamed away, so none is
  /// ever seen half deleted) and then `directory` if that left it empty.
  /// The caller decides who deletes (normally the chief only).
  void delete_all();
  /// Restore the newest checkpoint when there is one (returns its status),
  /// else nullopt and nothing changes (tf's restore_or_initialize).
  std::optional<RestoreStatus> restore_or_initialize(const RestoreOptions& options = {});

  const std::string& directory() const { return directory_; }
  int max_to_keep() const { return max_to_keep_; }

 private:
  Checkpoint* checkpoint_;
  std::string directory_;
  int max_to_keep_;
};

/// Options of BackupAndRestore.
struct BackupOptions {
  /// Save a backup every this many steps (> 0).
  std::int64_t save_every_steps = 0;
  /// Keras' delete_checkpoint: training_end() deletes the backups, so that
  /// the next run of the program starts from scratch. false keeps them (a
  /// rerun then restores the final step and has nothing left to do).
  bool delete_on_completion = true;
  /// Backups kept (the newest ones; >= 1).
  int max_to_keep = 1;
  /// Save when the job is being stopped: after SIGTERM reaches any worker
  /// (what Slurm sends before preempting or cancelling a job, what
  /// strata-run forwards), every worker saves a backup at its next
  /// step_end() and preempted() turns true, so the loop can exit and a
  /// requeued job resumes from that very step (tf's
  /// PreemptionCheckpointHandler). Costs one tiny all-reduce per step across
  /// workers, to agree on the step. Installs a SIGTERM handler for the
  /// helper's lifetime (the previous one is put back by the destructor).
  bool save_on_sigterm = false;
};

/// Keras' BackupAndRestore callback for a custom training loop:
///
///   std::int64_t step = 0;
///   strata::Checkpoint ckpt;
///   ckpt.track("step", &step).track("w", w).track_state("input", ...);
///   strata::BackupAndRestore backup(ckpt, "/shared/backup", 100);
///   backup.restore();                       // resumes where a killed run stopped
///   for (; step < total; ) {
///     train_one_step();
///     ++step;
///     backup.step_end();                    // every 100 steps: a backup
///   }
///   backup.training_end();                  // deletes the backups
///
/// The Checkpoint must track the loop's step counter as the int64 "step"
/// (InvalidArgumentError otherwise): backups are named after it and
/// restore() sets it. Every worker makes the same calls at the same steps
/// (saves are collective; only the chief writes, see Checkpoint::save).
/// Every worker must be able to read `directory` (one machine, or a shared
/// file system, as Keras requires). A restarted job (strata-run
/// --max-restarts, Slurm --requeue) runs the same program, which restores
/// the newest backup and continues as if nothing had happened, provided
/// everything that influences the run (weights, optimizer slots, the input
/// position, RNG state) is tracked by the Checkpoint.
class STRATA_API BackupAndRestore {
 public:
  BackupAndRestore(Checkpoint& checkpoint, std::string directory, std::int64_t save_every_steps);
  BackupAndRestore(Checkpoint& checkpoint, std::string directory, const BackupOptions& options);
  ~BackupAndRestore();
  BackupAndRestore(const BackupAndRestore&) = delete;
  BackupAndRestore& operator=(const BackupAndRestore&) = delete;

  /// Restore the newest backup, if there is one (every worker). Returns the
  /// step it resumes from (the restored "step"), or nullopt when there was
  /// no backup and nothing changed. Errors as Checkpoint::restore.
  std::optional<std::int64_t> restore();
  /// Call after every training step, once the step counter counts it.
  /// Saves when step % save_every_steps == 0 (or SIGTERM was seen, see
  /// BackupOptions::save_on_sigterm). Returns true when it saved.
  bool step_end();
  /// Save a backup of the current step now, whatever the step (every
  /// worker; e.g. the final step when delete_on_completion is false).
  /// Returns the checkpoint's path.
  std::string save();
  /// True once a SIGTERM-triggered backup has been saved: stop training
  /// and exit (the backup is kept for the next run).
  bool preempted() const { return preempted_; }
  /// Training finished: delete the backups (chief) unless
  /// delete_on_completion is false. Not after preempted().
  void training_end();

  const std::string& directory() const { return manager_.directory(); }

 private:
  Checkpoint* checkpoint_;
  BackupOptions options_;
  CheckpointManager manager_;
  std::int64_t last_saved_ = -1;
  bool preempted_ = false;
  bool handler_installed_ = false;
};

/// tf.train.latest_checkpoint: the newest "ckpt-<step>" checkpoint under
/// `directory`, nullopt when there is none (or no such directory).
STRATA_API std::optional<std::string> latest_checkpoint(const std::string& directory);

}  // namespace strata
