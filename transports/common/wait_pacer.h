// SPDX-License-Identifier: Apache-2.0
// WaitPacer: how a thread that waits for a transport request spends the time
// between two progress polls, shared by the transports that let the waiting
// thread drive progress itself (libfabric, and tcp's polling wait). The SDK's
// in-process strategies use its load samplers and cpu_relax too
// (sdk/src/local_strategy.cc, poll before sleeping).
//
// Why. A thread that sleeps in the kernel pays a wake-up (about 40 us on a
// loaded 2-core guest, ../shared/bench/README.md) per message, which is what
// made small collectives slow; Open MPI's progress engine and Gloo's pairs
// poll instead. Polling only pays while it does not take the core from the
// process that must answer, so the pacer adapts, as Open MPI does with
// mpi_yield_when_idle under oversubscription:
//   - while runnable threads (/proc/loadavg, sampled at most every 10 ms per
//     process, the smallest of the last 3 samples) fit in the cores this
//     process may use (sched_getaffinity), it busy-polls with a CPU pause
//     between polls, no system call;
//   - when they do not, it yields the core (sched_yield) between polls, so
//     that the peer it waits for can run; a waiter that knows how many of
//     its own job's ranks share this machine (yield_only_for_job) yields
//     only when they outnumber the cores, and spins when other programs are
//     the load, as Open MPI does: yielding then hands the core to a busy
//     program for a whole time slice (libfabric shm pingpong beside two busy
//     loops on 2 cores: 1.7 ms per 64 B message yielding, 3 us spinning);
//   - after the spin budget (kSpinNs busy, kYieldNs yielding) without any
//     progress (the caller reports completions with progressed(), which
//     restarts the budget) it sleeps with a back-off from 20 us to 1 ms, so
//     a long idle wait leaves the cores alone.
// Every pause is bounded by the caller's deadline: pause() never sleeps past
// it, and the caller checks the deadline after every poll.
//
// Threads: one WaitPacer per wait call (not shared); the load sample is a
// process-wide relaxed atomic, safe from any thread.
#pragma once

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace strata::transport {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

/// Cores this process may run on (affinity mask), at least 1.
inline int usable_cores() {
  static const int n = [] {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
    return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  }();
  return n;
}

/// The smallest of the last 3 values added (0 until then): a count that
/// is high in one sample only does not count. Lock-free; concurrent adds
/// may overwrite each other's slot, which only shortens the window.
class SmallestOfLast3 {
 public:
  void add(int v) { slots_[at_.fetch_add(1, std::memory_order_relaxed) % 3].store(v, std::memory_order_relaxed); }
  int smallest() const {
    return std::min({slots_[0].load(std::memory_order_relaxed), slots_[1].load(std::memory_order_relaxed),
                     slots_[2].load(std::memory_order_relaxed)});
  }

 private:
  std::atomic<int> slots_[3] = {{0}, {0}, {0}};
  std::atomic<unsigned> at_{0};
};

/// Runnable threads on this machine now: the first number of /proc/loadavg's
/// 4th field (it counts the reader); 0 when unknown.
inline int loadavg_running() {
  int running = 0;
  if (FILE* f = std::fopen("/proc/loadavg", "re")) {
    double a, b, c;
    int total = 0;
    if (std::fscanf(f, "%lf %lf %lf %d/%d", &a, &b, &c, &running, &total) != 5) running = 0;
    std::fclose(f);
  }
  return running;
}

/// Nanoseconds of a steady-clock time since the clock's epoch (the form the
/// lock-free samplers and the yield probe keep in atomics).
inline int64_t steady_ns(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

/// A value sampled at most every 10 ms (by whichever thread asks first once
/// 10 ms have passed), reported as the smallest of the last 3 samples (0
/// before the first; with first_fills, the first sample fills all three, so
/// that it counts at once instead of after 30 ms).
class ThrottledSample {
 public:
  explicit ThrottledSample(bool first_fills = false) : first_fills_(first_fills) {}

  template <class Sample>
  int get(Sample&& sample) {
    using Clock = std::chrono::steady_clock;
    return get(sample, steady_ns(Clock::now()));
  }
  /// The same at `now` (nanoseconds on the steady clock, > 0).
  template <class Sample>
  int get(Sample&& sample, int64_t now) {
    int64_t next = next_ns_.load(std::memory_order_relaxed);
    if (now >= next && next_ns_.compare_exchange_strong(next, now + 10'000'000, std::memory_order_relaxed)) {
      const int v = sample();
      for (int i = next == 0 && first_fills_ ? 3 : 1; i > 0; --i) samples_.add(v);
    }
    return samples_.smallest();
  }

 private:
  const bool first_fills_;
  std::atomic<int64_t> next_ns_{0};
  SmallestOfLast3 samples_;
};

/// Runnable threads on this machine (loadavg_running()), sampled at most
/// every 10 ms per process: the smallest of the last 3 samples, so that a
/// thread that runs for a moment (an io thread looking at its queue, a
/// kernel worker) does not count as load for the next 10 ms, while load
/// that lasts (another busy process) shows within 30 ms. 0 when unknown.
/// Measured: with the latest sample alone, a 2-rank tcp pingpong on 2 cores
/// flipped between busy-polling and sleeping from one batch to the next
/// (64 B median 11.8 us, batches 5.4-16 us); with the smallest of 3, every
/// batch polls.
inline int runnable_threads() {
  static ThrottledSample load;
  return load.get(loadavg_running);
}

/// True when more threads want to run than this process has cores.
inline bool oversubscribed() { return runnable_threads() > usable_cores(); }

/// Whether a yield hands this process's core back soon, judged from the
/// yields themselves. While the threads that outnumber the cores are pollers
/// that yield too (this job's own ranks, more of them than cores), a
/// sched_yield returns within microseconds and yield-polling answers a
/// message without any wake-up; while a busy program is among them, a yield
/// gives it the core for a time slice (milliseconds), and the waiter had
/// better block until its message wakes it. So a yield that takes longer
/// than kSlowNs turns yield-polling off for this process for a while: 100
/// ms, doubled (up to 2 s) each time a yield is slow again within one such
/// period of the last one ending, back to 100 ms otherwise. Busy programs
/// then cost one time slice of probing every 2 s, once it has settled.
/// Measured on the 2-core VM (2 s of back-to-back yields): 4 processes that
/// only yield, 2-6 yields over 1 ms per process; beside two busy loops, 411
/// of them (3-5 ms each), and 0.5 us for all the others.
/// Lock-free; threads of a process share one probe (yield_probe()).
class YieldProbe {
 public:
  static constexpr int64_t kSlowNs = 1'000'000;
  static constexpr int64_t kFirstOffNs = 100'000'000;
  static constexpr int64_t kMaxOffNs = 2'000'000'000;

  /// True unless a slow yield turned yield-polling off until after `now_ns`
  /// (nanoseconds on the steady clock).
  bool pays(int64_t now_ns) const { return now_ns >= off_until_.load(std::memory_order_relaxed); }
  /// A yield ran from `start_ns` to `end_ns`.
  void yielded(int64_t start_ns, int64_t end_ns) {
    if (end_ns - start_ns < kSlowNs) return;
    const int64_t last_end = off_until_.load(std::memory_order_relaxed);
    int64_t off = off_ns_.load(std::memory_order_relaxed);
    off = end_ns - last_end < off ? std::min(off * 2, kMaxOffNs) : kFirstOffNs;
    off_ns_.store(off, std::memory_order_relaxed);
    off_until_.store(end_ns + off, std::memory_order_relaxed);
  }

 private:
  std::atomic<int64_t> off_until_{0};
  std::atomic<int64_t> off_ns_{kFirstOffNs};
};

inline YieldProbe& yield_probe() {
  static YieldProbe probe;
  return probe;
}

class WaitPacer {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr int64_t kSpinNs = 200'000;   // busy-poll budget while cores are free
  static constexpr int64_t kYieldNs = 200'000;  // yield-poll budget while they are not

  WaitPacer() : start_(Clock::now()) {}
  /// Started at `now`, a time the caller has just read (a clock read costs
  /// about 30 ns in a VM: a latency-bound caller reads it once per round and
  /// passes it to polling() and progressed()).
  explicit WaitPacer(Clock::time_point now) : start_(now) {}

  /// True while busy-polling pays: within kSpinNs and the cores are not
  /// oversubscribed. For a caller whose progress needs another thread of
  /// this process (an io thread), yielding would only compete with that
  /// thread, so it polls only while this holds and then blocks on its
  /// condition. Call pause() between polls as usual.
  bool busy_polling() { return busy_polling(Clock::now()); }
  /// The same at `now`, a time the caller has just read.
  bool busy_polling(Clock::time_point now) {
    return !yield_now() && sleeping_ == std::chrono::microseconds(0) &&
           now - start_ < std::chrono::nanoseconds(kSpinNs);
  }

  /// True while yield-polling pays: the cores are oversubscribed (busy
  /// polling would take the core from the thread waited for), within
  /// kSpinNs + kYieldNs of the start or of the last progressed(), and this
  /// process's yields come back soon (yield_probe()). For a caller that
  /// drives progress itself (tcp): it then polls, yielding between polls
  /// (pause()), instead of blocking.
  bool yield_polling(Clock::time_point now, const YieldProbe& probe = yield_probe()) {
    return yield_now() && polling(now) && probe.pays(steady_ns(now));
  }

  /// True while pause() would still busy-poll or yield rather than sleep
  /// (within kSpinNs + kYieldNs of the start or of the last progressed()).
  /// For a caller that drives progress itself (tcp's waiter runs the io
  /// loop) both phases poll; once this turns false it blocks instead.
  bool polling() const { return polling(Clock::now()); }
  bool polling(Clock::time_point now) const {
    return sleeping_ == std::chrono::microseconds(0) && now - start_ < std::chrono::nanoseconds(kSpinNs + kYieldNs);
  }

  /// The caller saw progress (a completion): the spin budget starts again,
  /// so a wait sleeps only after kSpinNs + kYieldNs without any.
  void progressed() { progressed(Clock::now()); }
  void progressed(Clock::time_point now) {
    start_ = now;
    sleeping_ = std::chrono::microseconds(0);
  }

  /// Yield between polls only when `job_oversubscribed` (the caller's job
  /// has more ranks on this machine than it has cores: the peer waited for
  /// is then likely waiting for a core), whatever else runs here; without
  /// this call, it yields whenever runnable threads outnumber the cores.
  void yield_only_for_job(bool job_oversubscribed) {
    job_only_ = true;
    yield_ = job_oversubscribed;
  }

  enum class Paused { kSpun, kYielded, kSlept };
  /// Between two polls: pause, yield or sleep (never past `deadline`);
  /// returns which.
  Paused pause(Clock::time_point deadline) { return pause(deadline, Clock::now()); }
  /// The same, at `now`, a time the caller read during this poll.
  Paused pause(Clock::time_point deadline, Clock::time_point now) {
    if (sleeping_ == std::chrono::microseconds(0)) {
      const int64_t spent = std::chrono::duration_cast<std::chrono::nanoseconds>(now - start_).count();
      ++polls_;
      // A waiter told that its job fits the cores spins through the yield
      // phase too: yielding would hand the core to another program.
      if (!yield_now() && spent < (job_only_ ? kSpinNs + kYieldNs : kSpinNs)) {
        // A pause takes 10 to 140 cycles depending on the CPU (39 ns on
        // this EPYC VM): 16 of them delayed noticing a message by up to
        // 0.6 us. Two keep the poll loop off the memory bus and cost little.
        cpu_relax();
        cpu_relax();
        return Paused::kSpun;
      }
      if (spent < kSpinNs + kYieldNs) {
        sched_yield();
        yield_probe().yielded(steady_ns(now), steady_ns(Clock::now()));
        return Paused::kYielded;
      }
    }
    sleeping_ = std::min<std::chrono::microseconds>(std::chrono::microseconds(1000),
                                                    sleeping_ + std::chrono::microseconds(20));
    now = Clock::now();
    if (now < deadline) std::this_thread::sleep_for(std::min<Clock::duration>(sleeping_, deadline - now));
    return Paused::kSlept;
  }

 private:
  Clock::time_point start_;
  std::chrono::microseconds sleeping_{0};
  // Whether to yield rather than spin, from the load looked up at most once
  // per 64 polls (busy_polling() and pause() in the same round share it).
  bool yield_now() {
    if (!job_only_ && polls_ >= yield_next_) {
      yield_ = oversubscribed();
      yield_next_ = polls_ + 64;
    }
    return yield_;
  }

  uint32_t polls_ = 0;  // pause() calls
  uint32_t yield_next_ = 0;
  bool yield_ = false;
  bool job_only_ = false;  // yield_ was set by yield_only_for_job
};

}  // namespace strata::transport
