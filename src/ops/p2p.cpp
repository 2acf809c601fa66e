// Point-to-point: send and receive between two members of a group: through
// their mailbox (transport/shm_mail.hpp) when both are on this server, as
// one UCX message (NetChannel::send_message) when not. Each runs on a queue
// of its own (the sends to one member, the receives from one member, the
// receives from any source: Group::Impl), never behind a collective or a
// transfer the other way, so that exchanges in any order (batch_isend_irecv,
// a ring of isend/irecv) complete; messages from one member to another are
// taken in the order they were sent.
//
// Within a server a send is done once every chunk is in the mailbox (its
// buffer may be reused; the receiver may not have taken it yet); a message
// larger than the mailbox goes by single copy where it can be read where it
// lies (in the sender's heap region; in its memory, of huge pages or up to
// ShmMail::kReadInPlaceMax bytes, where the members can read each other's:
// the receiver copies it straight into its output; the send is done once it
// has), else waits for the receiver to empty the mailbox. A receive
// checks each chunk's header (which message, where in it, how long) and
// refuses a message of another length or tag: both sides then fail with the
// same words. Between servers a send is done when UCX says so; a receive
// that disagrees fails the group (a group across servers stays failed after
// an error), its reason published for the sender. A receive from any source
// in a group across servers looks at the mailboxes here and at the next
// message of each member elsewhere (engine::AnySource).
#include <algorithm>
#include <cstring>

#include "base/huge_pages.hpp"
#include "core/group_impl.hpp"
#include "engine/waits.hpp"
#include "fastgather/ops.hpp"
#include "ops/request.hpp"
#include "ops/validate.hpp"

namespace fastgather {

namespace {

using transport::ShmMail;

// Where group rank `peer` is reached: a mailbox on this server (its channel
// member index), or UCX (its group rank, the NetChannel's member index).
struct Peer {
  bool local = false;
  int index = -1;
};

Result<Peer> peer_of(Group& group, const char* op, int peer) {
  const Group::Impl& gi = *impl_of(group);
  const int world = gi.ranks[static_cast<size_t>(peer)];
  for (int m = 0; gi.mail != nullptr && m < gi.channel->members(); ++m) {
    if (gi.channel->world_rank(m) == world) return Peer{true, m};
  }
  if (gi.net != nullptr) return Peer{false, peer};
  return Status{ErrorKind::kSystem, fmt::format("{} on {} (rank {}): rank {} is neither on this server nor reached over UCX",
                                                op, group.describe(), gi.ranks[static_cast<size_t>(gi.me)], world)};
}

// The checks every send and receive makes before it is queued: a peer in
// the group and not this rank (kAnySource for a receive), a buffer.
Status check(Group& group, const char* op, const TensorView& data, int peer, bool any_allowed) {
  if (Status s = ops::need_data(group, op, "tensor", data); !s.ok()) return s;
  if (any_allowed && peer == kAnySource) {
    if (group.size() > 1) return Status::Ok();
    return ops::invalid(group, op, "a receive from any source in a group of one rank: no other rank can send to it");
  }
  if (peer < 0 || peer >= group.size()) {
    return ops::invalid(group, op, fmt::format("peer {} is not a rank of the group (0 to {})", peer, group.size() - 1));
  }
  if (peer == group.rank()) return ops::invalid(group, op, fmt::format("peer {} is this rank itself", peer));
  return peer_of(group, op, peer).status();
}

// What a message between servers carries before its bytes.
struct Wire {
  uint64_t total = 0;
  int64_t tag = 0;
};

Status disagree(Group& group, int sender, uint64_t sent, int64_t sent_tag, int receiver, uint64_t want, int64_t want_tag) {
  const Group::Impl& gi = *impl_of(group);
  return {ErrorKind::kMismatch,
          fmt::format("{}: rank {} sent {} bytes with tag {} to rank {}, which receives {} bytes with tag {} (sizes and "
                      "tags must match)",
                      group.describe(), gi.ranks[static_cast<size_t>(sender)], sent, sent_tag,
                      gi.ranks[static_cast<size_t>(receiver)], want, want_tag),
          gi.ranks[static_cast<size_t>(sender)]};
}

// Over UCX: one message, the Wire then the bytes, numbered per pair and
// direction (the tag's call field). A group across servers stays failed
// after an error (ops.hpp): a receive that disagrees fails it.
engine::Task<Status> send_across(Group& group, const TensorView& data, int peer, int64_t tag) {
  Group::Impl& gi = *impl_of(group);
  Wire w{data.nbytes(), tag};
  const transport::NetIov iov[2] = {{&w, sizeof w}, {data.data, data.nbytes()}};
  auto id = gi.net->send_message(peer, tag, iov);
  if (!id.ok()) co_return id.status();
  Status s = co_await engine::message_sent(*gi.net, id.value());
  RequestAccess::flush_in_background(gi);
  co_return s;
}

// A receive between servers, posted (id) into the Wire w and the data:
// the length and the tag the message carries are what the receiver asks.
engine::Task<Status> received_across(Group& group, const TensorView& data, int peer, int64_t tag, uint64_t id,
                                     const Wire& w) {
  Group::Impl& gi = *impl_of(group);
  const size_t total = data.nbytes();
  auto got = co_await engine::message_received(*gi.net, id);
  Status s = got.ok() ? Status::Ok() : got.status();
  if (s.ok() && (got.value() != sizeof w + total || w.total != total || w.tag != tag)) {
    s = disagree(group, peer, got.value() < sizeof w ? 0 : w.total, w.tag, gi.me, total, tag);
  }
  if (s.kind() == ErrorKind::kMismatch) {
    // The sender learns it when it loses this member (published first, as the collectives do).
    if (gi.publish_failure) gi.publish_failure(s);
    gi.net->fail(s);
  }
  co_return s;
}

engine::Task<Status> recv_across(Group& group, const TensorView& data, int peer, int64_t tag) {
  Group::Impl& gi = *impl_of(group);
  Wire w;
  const transport::NetIov iov[2] = {{&w, sizeof w}, {data.data, data.nbytes()}};
  auto id = gi.net->recv_message(peer, iov);
  if (!id.ok()) co_return id.status();
  co_return co_await received_across(group, data, peer, tag, id.value(), w);
}

engine::Task<Status> send_op(Group& group, const TensorView& data, int peer, int64_t tag) {
  Group::Impl& gi = *impl_of(group);
  const Peer p = peer_of(group, "send", peer).value();
  if (!p.local) co_return co_await send_across(group, data, peer, tag);
  ShmMail& mail = *gi.mail;
  const int to = p.index;
  if (Status r = mail.refused(gi.channel->me(), to); !r.ok()) co_return r;
  const auto* src = static_cast<const std::byte*>(data.data);
  const size_t total = data.nbytes();
  const uint64_t message = mail.next_message(to);
  const transport::ShmHeap* heap = gi.channel->heap();
  const std::optional<uint64_t> in_heap = heap != nullptr ? heap->own_offset(src, total) : std::nullopt;
  // process_vm_readv pays per page it pins: of 4 KiB pages, it is slower than
  // the mailbox's two pipelined copies for large messages (ShmMail::kReadInPlaceMax).
  const bool readable =
      gi.channel->capabilities().reads_peer_memory &&
      (total <= ShmMail::kReadInPlaceMax ||
       base::worth_reading_by_peers(src, total, gi.settings.single_copy == Settings::SingleCopy::kAlways));
  if (total >= ShmMail::kSingleCopyMin && (in_heap || readable)) {
    // Single copy: the receiver reads the bytes where they lie (from the
    // heap, or from this process); the send is done once it has.
    if (Status s = co_await engine::mail_room(mail, to); !s.ok()) co_return s;
    const uint64_t chunk =
        in_heap ? mail.put(to, message, tag, total, 0, nullptr, total, transport::ChunkHeader::kInHeap, *in_heap)
                : mail.put(to, message, tag, total, 0, nullptr, total, transport::ChunkHeader::kInMemory,
                           reinterpret_cast<uint64_t>(src));
    co_return co_await engine::mail_room(mail, to, chunk);
  }
  size_t off = 0;
  do {
    if (Status s = co_await engine::mail_room(mail, to); !s.ok()) co_return s;
    const size_t len = std::min(ShmMail::kChunk, total - off);
    mail.put(to, message, tag, total, off, src + off, len);
    off += len;
  } while (off < total);
  co_return Status::Ok();
}

// Lets go of the mailbox a receive owned, however it ends.
struct Owned {
  ShmMail* mail;
  bool claimed = false;
  int from = -1;
  ~Owned() {
    if (claimed) mail->release(from);
  }
};

// The group ranks a receive from any source listens to over UCX: those not on this server.
std::vector<int> reached_over_net(Group& group) {
  std::vector<int> remote;
  for (int r = 0; r < group.size(); ++r) {
    if (r != group.rank() && !peer_of(group, "recv", r).value().local) remote.push_back(r);
  }
  return remote;
}

engine::Task<Status> recv_op(Group& group, const TensorView& data, int peer, int64_t tag, int* source) {
  Group::Impl& gi = *impl_of(group);
  int named = -1;
  if (peer != kAnySource) {
    const Peer p = peer_of(group, "recv", peer).value();
    if (!p.local) {
      Status s = co_await recv_across(group, data, peer, tag);
      if (s.ok() && source != nullptr) *source = peer;
      co_return s;
    }
    named = p.index;
  }
  Owned own{gi.mail.get()};
  if (named < 0 && gi.net != nullptr) {
    // From any source, in a group across servers: a member here (then its
    // mailbox, below), or a message over UCX.
    const std::vector<int> remote = reached_over_net(group);
    Wire w;
    const transport::NetIov iov[2] = {{&w, sizeof w}, {data.data, data.nbytes()}};
    auto got = co_await engine::any_source(gi.mail.get(), *gi.net, remote, tag, iov, &own.claimed, &own.from);
    if (!got.ok()) co_return got.status();
    if (got.value().has_value()) {
      const int from = got.value()->from;
      Status s = co_await received_across(group, data, from, tag, got.value()->id, w);
      if (s.ok() && source != nullptr) *source = from;
      co_return s;
    }
    named = own.from;
  }
  ShmMail& mail = *gi.mail;
  const int me = gi.channel->me();
  if (named >= 0) {
    if (Status r = mail.refused(named, me); !r.ok()) co_return r;
  }
  auto* dst = static_cast<std::byte*>(data.data);
  const size_t total = data.nbytes();
  uint64_t message = 0;
  size_t off = 0;
  do {
    if (Status s = co_await engine::mail_arrival(mail, off == 0 ? named : own.from, tag, &own.claimed, &own.from);
        !s.ok()) {
      co_return s;
    }
    const transport::ChunkHeader h = *mail.peek(own.from);
    const bool first = off == 0 && message == 0;
    if (first) {
      message = mail.next_received(own.from);
      if (h.message != message || h.offset != 0 || h.tag != tag || h.total != total) {
        co_return mail.refuse(own.from, total, tag);
      }
    } else if (h.message != message || h.offset != off || h.total != total) {
      co_return mail.refuse(own.from, total, tag);
    }
    if (h.where != transport::ChunkHeader::kInSlot) {
      // Single copy: the whole message, read where it lies (the sender's
      // heap region, or its memory).
      const transport::ShmHeap* heap = gi.channel->heap();
      const bool from_heap = h.where == transport::ChunkHeader::kInHeap;
      if (off != 0 || h.len != total || (from_heap && (heap == nullptr || !heap->within(h.remote, total))) ||
          (!from_heap && h.where != transport::ChunkHeader::kInMemory)) {
        co_return mail.refuse(own.from, total, tag);
      }
      if (from_heap) {
        if (total != 0) std::memcpy(dst, heap->member_data(own.from, h.remote), total);
      } else if (Status s = gi.channel->read_peer(own.from, dst, h.remote, total); !s.ok()) {
        co_return s;
      }
    } else if (h.len > total - off || (h.len == 0 && total != 0) || h.len > ShmMail::kChunk) {
      co_return mail.refuse(own.from, total, tag);
    } else if (h.len != 0) {
      std::memcpy(dst + off, mail.chunk(own.from), h.len);
    }
    off += h.len;
    mail.take(own.from);
  } while (off < total);
  if (source != nullptr) {
    const int world = gi.channel->world_rank(own.from);
    *source = static_cast<int>(std::find(gi.ranks.begin(), gi.ranks.end(), world) - gi.ranks.begin());
  }
  co_return Status::Ok();
}

engine::Queue& send_queue(Group& g, int peer) { return *impl_of(g)->sends[static_cast<size_t>(peer)]; }
engine::Queue& recv_queue(Group& g, int peer) {
  return peer == kAnySource ? impl_of(g)->any_receives : *impl_of(g)->receives[static_cast<size_t>(peer)];
}

}  // namespace

Request start_send(Group& group, const TensorView& data, int peer, int64_t tag) {
  if (Status s = check(group, "send", data, peer, false); !s.ok()) return RequestAccess::failed(group, std::move(s));
  return RequestAccess::start(group, ops::owning<send_op>(group, data, peer, tag), &send_queue(group, peer));
}

Status send(Group& group, const TensorView& data, int peer, int64_t tag) {
  if (Status s = check(group, "send", data, peer, false); !s.ok()) return s;
  return RequestAccess::run(group, send_op(group, data, peer, tag), &send_queue(group, peer));
}

Request start_recv(Group& group, const TensorView& data, int peer, int64_t tag, int* source) {
  if (Status s = check(group, "recv", data, peer, true); !s.ok()) return RequestAccess::failed(group, std::move(s));
  return RequestAccess::start(group, ops::owning<recv_op>(group, data, peer, tag, source), &recv_queue(group, peer));
}

Status recv(Group& group, const TensorView& data, int peer, int64_t tag, int* source) {
  if (Status s = check(group, "recv", data, peer, true); !s.ok()) return s;
  return RequestAccess::run(group, recv_op(group, data, peer, tag, source), &recv_queue(group, peer));
}

}  // namespace fastgather
