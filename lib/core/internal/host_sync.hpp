// Private to core: the counting behind quintet::host_sync_count() (quintet/core/stream.hpp).
#pragma once

namespace quintet::detail {

// Counts one host synchronisation, or none inside a OneHostSync that has counted one already.
void note_host_sync();

// Makes one call count at most once, however many of its steps wait (a stream-less copy to the
// host copies and then synchronises): the notes on this thread while the outermost OneHostSync
// lives count as one.
class OneHostSync {
 public:
  OneHostSync();
  ~OneHostSync();
  OneHostSync(const OneHostSync&) = delete;
  OneHostSync& operator=(const OneHostSync&) = delete;
};

}  // namespace quintet::detail
