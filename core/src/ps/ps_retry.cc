// SPDX-License-Identifier: Apache-2.0
// Tolerating a parameter-server blip. A ps call that loses its connection
// or runs past the operation deadline reconnects (a new communicator to the
// same ps incarnation) and resends the same request until the grace period
// since the first failure is over; only then is the ps task unavailable.
// Reads and pings may run twice; updates carry a request key (this
// process's random token and a sequence number) that the ps remembers in an
// OnceTable, so an update whose answer was lost is not applied again.
//
// A ps that restarted is not reconnected to: it lost its variables, so its
// new incarnation is reported as UnavailableError at once (the job restarts
// from its last checkpoint, as in tf.distribute).
#include <thread>

#include "log.h"
#include "ps/ps_internal.h"

namespace strata {
namespace ps_detail {
namespace {

// Sentinel: an error that must not be retried (the ps restarted).
struct NoRetry : Error {
  using Error::Error;
};

std::int64_t ms_since(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

constexpr std::size_t kOnceCapacity = 1 << 16;

}  // namespace

void Runtime::write_request_key(Writer& w, const std::pair<std::uint64_t, std::uint64_t>& key) {
  w.u64(key.first);
  w.u64(key.second);
}

Frame Runtime::ps_call(int ps, std::uint32_t kind, const std::string& payload) {
  return ps_call(ps, kind, std::function<std::string()>([&] { return payload; }));
}

std::shared_ptr<Channel> Runtime::reconnect_ps(int ps, const std::shared_ptr<Channel>& broken,
                                               std::int64_t timeout_ms) {
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = ps_.find(ps);
    if (it != ps_.end() && it->second != broken && !it->second->broken()) return it->second;  // another thread did
  }
  json hello;
  std::shared_ptr<Channel> ch = connect("ps", ps, job_, std::max<std::int64_t>(1, timeout_ms), &hello);
  const std::string inc = hello.value("incarnation", std::string());
  std::lock_guard<std::mutex> l(mu_);
  auto known = ps_incarnation_.find(ps);
  if (known != ps_incarnation_.end() && known->second != inc)
    throw NoRetry(STRATA_ERR_UNAVAILABLE,
                  detail::str_cat(task_name("ps", ps), " restarted (incarnation ", known->second, " is now ", inc,
                                  ") and lost its variables; restart the job from its last checkpoint"));
  ps_incarnation_.emplace(ps, inc);
  auto it = ps_.find(ps);
  if (it != ps_.end() && it->second != broken && !it->second->broken()) return it->second;
  ps_[ps] = ch;
  detail::logger("ps")->warn("{} {}: reconnected to {}", job_, index_, task_name("ps", ps));
  return ch;
}

Frame Runtime::ps_call(int ps, std::uint32_t kind, const std::function<std::string()>& make) {
  return ps_call(ps, kind, make, nullptr, 0, BulkSink{});
}

Frame Runtime::ps_call(int ps, std::uint32_t kind, const std::function<std::string()>& make, const void* bulk,
                       std::uint64_t bulk_len, BulkSink sink) {
  STRATA_ENFORCE(ps >= 0 && ps < count("ps"), STRATA_ERR_INVALID_ARGUMENT, "ps task ", ps,
                 " is not in the cluster (", count("ps"), " ps tasks)");
  std::shared_ptr<Channel> ch;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = ps_.find(ps);
    if (it != ps_.end()) ch = it->second;
  }
  if (!ch) ch = ps_channel(ps);  // first contact: the rendezvous deadline, as before
  Clock::time_point first_failure{};
  bool failed = false;
  std::string last;
  for (int attempt = 0;; ++attempt) {
    try {
      if (!ch || ch->broken()) {
        if (!failed) {  // another call saw the connection fail first
          failed = true;
          first_failure = Clock::now();
        }
        const std::int64_t left = ps_grace_ms_ - ms_since(first_failure);
        ch = reconnect_ps(ps, ch, std::min<std::int64_t>(std::max<std::int64_t>(left, 1), op_timeout_ms_));
      }
      Frame r = ch->call(kind, make(), op_timeout_ms_, nullptr, bulk, bulk_len, sink);
      if (failed)
        detail::logger("ps")->warn("{} {}: {} answered again after {} ms and {} retries", job_, index_,
                                   task_name("ps", ps), ms_since(first_failure), attempt);
      return r;
    } catch (const NoRetry& e) {
      detail::throw_status(e.code(), e.what());
    } catch (const Error& e) {
      // An answer with an error status leaves the channel intact: that is the
      // ps's verdict, not a blip. A transport failure or deadline breaks it.
      const bool transient = !ch || ch->broken();
      if (!transient) throw;
      if (!failed) {
        failed = true;
        first_failure = Clock::now();
      }
      last = e.what();
      const std::int64_t away = ms_since(first_failure);
      if (away >= ps_grace_ms_)
        detail::throw_status(STRATA_ERR_UNAVAILABLE,
                             detail::str_cat(task_name("ps", ps), " is unavailable: no answer for ", away,
                                             " ms, past the grace period of ", ps_grace_ms_,
                                             " ms (/timeouts/ps_grace_s); last error: ", last));
      detail::logger("ps")->warn("{} {}: {} (attempt {}): {}; retrying for up to {} ms more", job_, index_,
                                 task_name("ps", ps), attempt + 1, last, ps_grace_ms_ - away);
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min<std::int64_t>(100, ps_grace_ms_ - away)));
    }
  }
}

std::string OnceTable::run(std::uint64_t token, std::uint64_t seq, const std::function<std::string()>& fn) {
  const auto key = std::make_pair(token, seq);
  {
    std::unique_lock<std::mutex> l(mu_);
    auto it = entries_.find(key);
    if (it != entries_.end()) {
      // A retry: wait for the first copy (it may still be applying), then
      // answer as it did. The wait is that one update's (local) work.
      const bool settled = cv_.wait_for(l, std::chrono::seconds(120), [&] {
        return entries_.find(key) == entries_.end() || entries_.at(key).done;
      });
      STRATA_ENFORCE(settled, STRATA_ERR_DEADLINE_EXCEEDED, "request ", seq, " of client ", token,
                     " is still being applied after 120 s; not applying it a second time");
      auto done = entries_.find(key);
      if (done != entries_.end()) {
        if (done->second.code != STRATA_OK) detail::throw_status(done->second.code, done->second.response);
        return done->second.response;
      }
    }
    entries_[key] = Entry{};
    order_.push_back(key);
  }
  Entry result;
  result.done = true;
  try {
    result.response = fn();
  } catch (const Error& e) {
    result.code = e.code();
    result.response = e.what();
  } catch (const std::exception& e) {
    result.code = STRATA_ERR_INTERNAL;
    result.response = demangled_type(e) + ": " + e.what();
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    entries_[key] = result;
    while (order_.size() > kOnceCapacity) {
      auto old = entries_.find(order_.front());
      if (old != entries_.end() && !old->second.done) break;  // still applying: keep it
      if (old != entries_.end()) entries_.erase(old);
      order_.pop_front();
    }
  }
  cv_.notify_all();
  if (result.code != STRATA_OK) detail::throw_status(result.code, result.response);
  return result.response;
}

}  // namespace ps_detail
}  // namespace strata
