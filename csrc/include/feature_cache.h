// Replacement policies of an out-of-core feature cache, Ginex
// (csrc/kernels/feature_cache.cpp).
// Kernels work on raw buffers and std::vector outputs and know nothing about Python (the
// bindings in csrc/bindings/ do).
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

namespace distmb {

// The planners hold the *directory* of a cache of `capacity` row slots (which id is in which
// slot), not the rows. An executor applies a plan gather by gather: it copies the hit rows from
// their slots as they are at the start of the gather, reads the missed rows from disk, then
// writes each missed row whose fill slot is not kNoSlot into that slot, in access order. Ids
// are in [0, num_rows) and unique within one gather. Slots are filled lowest first and only
// replaced, never freed (except by reset()), so the occupied slots are [0, cached_count).
// Every public call takes the object's mutex.

// Miss in a hit-slot array, "not inserted" in a fill-slot array, free slot in slot_ids()
// (distmb.pipeline.features.policy.NO_SLOT).
constexpr int64_t kNoSlot = -1;
// Next use of an id that does not occur again in the trace being planned.
constexpr int64_t kNeverUsed = INT64_MAX;

// BeladyPlanner: Ginex's superbatch cache (inspector): Belady's MIN with bypass decided gather
// by gather, optimal in misses for the planned trace among policies that change the cache
// between gathers (the executor copies a gather's hits before it writes any fill).
// - plan(trace[T], batch_ptr[B + 1]) -> hit_slot[T], fill_slot[T]: gather b is
//   trace[batch_ptr[b] .. batch_ptr[b+1]). The next use of access t is the first position
//   > t holding the same id (after t's gather, as ids are unique within one), or kNeverUsed.
//   Per gather, in order: (1) every id cached at its start hits, wherever it is in the
//   gather (hit_slot = its slot, fill_slot = kNoSlot), and takes its access's next use;
//   (2) the misses (hit_slot = kNoSlot), in gather order: a miss takes the lowest free
//   slot; with none free, it replaces the cached id whose next use F is farthest (an id this
//   gather hit or filled earlier included) if its own next use N < F, else it bypasses
//   (fill_slot = kNoSlot). Ties (only among ids never used again): the lowest slot is
//   replaced. A slot may be filled twice in one gather; the later fill holds. The directory
//   carries over to the next plan(), whose trace gives the cached ids their next uses.
//   Throws std::invalid_argument (directory unchanged) for a batch_ptr that does not go
//   from 0 to T without decreasing or for an id repeated within a gather, std::out_of_range
//   for an id outside [0, num_rows). O(T log capacity) time, O(T + capacity) scratch.
class BeladyPlanner {
 public:
  BeladyPlanner(int64_t capacity, int64_t num_rows);

  void plan(const int64_t* trace, int64_t n, const int64_t* batch_ptr, int64_t n_batches,
            int64_t* hit_slot, int64_t* fill_slot);
  void slot_ids(int64_t* out) const;  // out[capacity]: id held by every slot, or kNoSlot
  int64_t cached_count() const;
  void reset();

  int64_t capacity() const { return capacity_; }
  int64_t num_rows() const { return num_rows_; }

 private:
  struct HeapEntry {
    int64_t next_use;
    int64_t slot;
  };
  void rebuild_heap();

  int64_t capacity_, num_rows_;
  int64_t count_ = 0;                // slots [0, count_) hold an id
  std::vector<int32_t> slot_of_;     // [num_rows]: slot holding the id, or kNoSlot
  std::vector<int64_t> id_of_slot_;  // [capacity]: id held, or kNoSlot
  std::vector<int64_t> next_use_;    // [capacity]: next use of the id held (during plan())
  std::vector<int64_t> last_seen_;   // [num_rows]: kNeverUsed outside plan() (scratch)
  std::vector<int64_t> next_;        // [T]: next use of every access (scratch)
  std::vector<HeapEntry> heap_;      // max-heap by (next_use, -slot), lazily invalidated
  mutable std::mutex mutex_;
};

// LruCache: least-recently-used replacement, decided access by access.
// - access(ids[n]) -> hit_slot[n], fill_slot[n]: in order, a cached id hits and becomes the
//   most recently used; a miss takes the lowest free slot, else the slot of the least recently
//   used id, and is inserted as the most recently used (fill_slot = kNoSlot only when
//   capacity is 0). Throws std::out_of_range for an id outside [0, num_rows),
//   std::invalid_argument for an id repeated within the call (cache unchanged). O(1) per
//   access: a doubly-linked list over the slots in recency order.
class LruCache {
 public:
  LruCache(int64_t capacity, int64_t num_rows);

  void access(const int64_t* ids, int64_t n, int64_t* hit_slot, int64_t* fill_slot);
  void slot_ids(int64_t* out) const;  // out[capacity]
  int64_t cached_count() const;
  void reset();

  int64_t capacity() const { return capacity_; }
  int64_t num_rows() const { return num_rows_; }

 private:
  void unlink(int64_t s);
  void push_back(int64_t s);

  int64_t capacity_, num_rows_;
  int64_t count_ = 0;                // slots [0, count_) hold an id
  int64_t head_ = kNoSlot;           // least recently used slot
  int64_t tail_ = kNoSlot;           // most recently used slot
  std::vector<int32_t> slot_of_;     // [num_rows]: slot holding the id, or kNoSlot
  std::vector<int64_t> id_of_slot_;  // [capacity]
  std::vector<int64_t> prev_, next_;  // [capacity]: recency list
  std::vector<uint8_t> seen_;        // [num_rows]: all 0 outside access() (scratch)
  mutable std::mutex mutex_;
};

}  // namespace distmb
