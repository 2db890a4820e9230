// SPDX-License-Identifier: Apache-2.0
// The "tcp" transport: point-to-point messages between the ranks of a
// communicator over TCP, on Boost.Asio.
//
// Options (JSON object; unknown keys are rejected):
//   "bind"                 address to listen on. Default: with a TCP rendezvous
//                          store, the local address that routes to the store's
//                          host; without one (every rank in this process),
//                          127.0.0.1 (::1 with ipv6). "0.0.0.0"/"::" listen on
//                          every interface and publish the routing address.
//   "ports"                "0" (ephemeral, default), "29500" or "29500-29600".
//   "connections_per_peer" 1..8 (default 2); messages >= 512 KiB are striped.
//   "ipv6"                 false (default) / true.
//   "socket_buffer_bytes"  SO_SNDBUF/SO_RCVBUF (default 4194304; 0 = kernel).
//   "timeout_s"            deadline for comm_create and wait given a negative
//                          timeout (default /timeouts/collective_s, else 300).
//   "max_unexpected_bytes" bound on bytes buffered for messages that arrive
//                          before their receive is posted (default 1 GiB).
//                          Their buffers are kept for reuse afterwards, up
//                          to 32 buffers and this many bytes or 64 MiB,
//                          whichever is less.
//   "connect"              "lazy" (default): connect to a peer at the first
//                          isend or irecv naming it; "eager": connect to every
//                          peer inside comm_create (a full mesh, N-1 peers
//                          per rank; for latency-critical first steps or to
//                          find unreachable peers up front).
//   "poll"                 "auto" (default): a wait for a message of up to
//                          64 KiB runs the io handlers itself while the
//                          process has free cores (a reply wakes no
//                          thread); "always": also when they are not,
//                          yielding between polls (faster when the
//                          machine is busy with this job alone, much slower
//                          beside other busy processes); "never": the io
//                          thread moves every byte.
//
// Model. comm_create listens, publishes "<name>/addr/<rank>" = "host:port"
// and a nonce in the host store, reads every peer's address in one record
// from rank 0 ("<name>/peers") and starts one io thread per communicator,
// which accepts connections for the communicator's lifetime and moves the
// bytes while no caller waits. A thread in wait() moves them itself: it runs
// the communicator's io handlers while it polls (busy while there are free
// cores, yielding while there are not, for up to 0.4 ms without progress,
// then it sleeps and the io thread takes over again), and the io thread
// stays out of epoll meanwhile, so a reply wakes no thread; test() polls
// once. Handlers never run in two threads at once. Connections (connections_per_peer sockets per pair, each opened with
// a handshake naming communicator, rank, world and connection index, signed
// with the communicator's secret) are made lazily: the first isend or irecv
// naming a peer starts them, and they last until the communicator is
// destroyed, so a rank holds sockets only to the peers it talks to (a ring:
// 2 peers, whatever the world size). A send connects at once; a receive
// from a lower rank first gives that rank 100 ms to connect (its message
// comes after its own send, which connects), then connects itself. When
// both ranks of a pair connect at once, the lower rank's connections win
// and the higher rank's are declined (frame.h). Sends posted before the connections are up wait, in order, and
// go when they are. A peer that does not complete the connection within
// timeout_s fails that peer's requests with DEADLINE_EXCEEDED naming it (a
// wait with a shorter timeout says the connection is not up yet); a peer
// that refuses it (its process is gone) fails them with UNAVAILABLE. The
// acceptor drops unsigned handshakes and keeps at most 64 + one set per
// other rank of them pending. With "connect": "eager" the lower rank of each
// pair connects inside comm_create, which fails naming the ranks that never
// connected by its deadline.
// Sends are matched to receives per (peer, tag) in posting order; a receive
// posted before its message arrives gets the bytes written straight into its
// buffer, otherwise the message is staged and copied once when the receive
// is posted. Caps: P2P | MEM_HOST | THREAD_SAFE (every call may come from any
// thread). A lost peer fails that peer's requests (and later ones) with
// UNAVAILABLE naming its rank and address; malformed data fails them with
// DATA_LOSS; abort fails everything with ABORTED.
#pragma once

#include <memory>
#include <string>

#include "strata/sdk/plugin.hpp"

namespace strata::transport::tcp {

struct Options {
  std::string bind;  // "" = default (see above)
  uint16_t port_lo = 0, port_hi = 0;
  std::string ports_text = "0";
  int connections_per_peer = 2;
  bool ipv6 = false;
  int64_t socket_buffer_bytes = 4 << 20;
  double timeout_s = 300;
  uint64_t max_unexpected_bytes = 1ull << 30;
  bool lazy = true;  // "connect": "lazy" (default) or "eager"
  enum class Poll { kAuto, kAlways, kNever } poll = Poll::kAuto;  // "poll"
};

class TcpComm;

class TcpTransport : public sdk::TransportBase {
 public:
  using Comm = TcpComm;
  static constexpr const char* kSubsystem = "transport.tcp";
  TcpTransport(sdk::Host host, const char* options_json);
  strata_transport_caps caps() override;
  std::unique_ptr<sdk::CommBase> comm_create(const char* name, int32_t rank, int32_t world_size,
                                             int64_t timeout_ms) override;

 private:
  sdk::Host host_;
  Options opts_;
};

}  // namespace strata::transport::tcp
