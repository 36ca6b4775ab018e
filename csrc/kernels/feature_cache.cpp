// Replacement policies of an out-of-core feature cache (Ginex, "superbatch" inspector/executor):
// BeladyPlanner plans a whole superbatch with Belady's MIN (bypass allowed) decided gather by
// gather, LruCache decides access by access. Both keep only the cache's directory (id <->
// slot); the executor that owns the rows applies their decisions. Contracts: feature_cache.h;
// Python: distmb.pipeline.features.policy.
//
// Layout shared by both (one entry per id or per slot):
//   slot_of_     int32 per id: the slot holding it, or kNoSlot (so capacity < 2^31);
//   id_of_slot_  int64 per slot: the id it holds, or kNoSlot. Slots are filled lowest first
//                and only ever replaced, so the occupied slots are exactly [0, count_).
// BeladyPlanner adds next_use_ per slot and a max-heap of (next use, slot) entries that is
// never updated in place: an entry is valid while its slot's next_use_ still equals its key
// (a finite next use is a trace position, owned by one id, so a stale entry cannot become
// valid again by accident; equal kNeverUsed keys are interchangeable). The heap is rebuilt
// from next_use_ when it holds more than twice the slots, so it stays O(capacity).
// LruCache adds an intrusive doubly-linked list of the occupied slots in recency order.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "feature_cache.h"

namespace distmb {

namespace {

// Largest capacity: slot_of_ stores slots as int32.
constexpr int64_t kMaxCapacity = INT32_MAX;
// Stale heap entries tolerated beyond 2 * capacity before the heap is rebuilt.
constexpr int64_t kHeapSlack = 64;

void check_sizes(int64_t capacity, int64_t num_rows) {
  if (capacity < 0 || capacity > kMaxCapacity)
    throw std::invalid_argument("capacity must be in [0, " + std::to_string(kMaxCapacity) +
                                "] slots, got " + std::to_string(capacity));
  if (num_rows < 0)
    throw std::invalid_argument("num_rows must be >= 0, got " + std::to_string(num_rows));
}

// Throws std::out_of_range naming the first id outside [0, num_rows).
void check_ids(const int64_t* ids, int64_t n, int64_t num_rows, const char* name) {
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= num_rows)
      throw std::out_of_range(std::string(name) + "[" + std::to_string(i) + "] = " +
                              std::to_string(ids[i]) + " is not a row id in [0, " +
                              std::to_string(num_rows) + ")");
}

// Heap order: the top is the farthest next use, ties (only kNeverUsed) to the lowest slot.
struct HeapLess {
  template <class E>
  bool operator()(const E& a, const E& b) const {
    return a.next_use != b.next_use ? a.next_use < b.next_use : a.slot > b.slot;
  }
};

}  // namespace

// ---- BeladyPlanner ---------------------------------------------------------------------------

BeladyPlanner::BeladyPlanner(int64_t capacity, int64_t num_rows)
    : capacity_(capacity), num_rows_(num_rows) {
  check_sizes(capacity, num_rows);
  slot_of_.assign(num_rows, static_cast<int32_t>(kNoSlot));
  id_of_slot_.assign(capacity, kNoSlot);
  next_use_.assign(capacity, kNeverUsed);
  last_seen_.assign(num_rows, kNeverUsed);
}

void BeladyPlanner::rebuild_heap() {
  heap_.clear();
  for (int64_t s = 0; s < count_; ++s) heap_.push_back(HeapEntry{next_use_[s], s});
  std::make_heap(heap_.begin(), heap_.end(), HeapLess());
}

// plan: validate, compute next uses with one reverse scan (last_seen_ maps an id to its
// nearest later position and is restored to kNeverUsed after), then decide gather by gather:
// all hits first, then the misses in order (gather-level MIN with bypass).
void BeladyPlanner::plan(const int64_t* trace, int64_t n, const int64_t* batch_ptr,
                         int64_t n_batches, int64_t* hit_slot, int64_t* fill_slot) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (n_batches < 0)
    throw std::invalid_argument("batch_ptr must hold B + 1 >= 1 entries for B gathers");
  if (batch_ptr[0] != 0 || batch_ptr[n_batches] != n)
    throw std::invalid_argument("batch_ptr must start at 0 and end at the trace length " +
                                std::to_string(n) + ", got [" + std::to_string(batch_ptr[0]) +
                                ", ..., " + std::to_string(batch_ptr[n_batches]) + "]");
  for (int64_t b = 0; b < n_batches; ++b)
    if (batch_ptr[b + 1] < batch_ptr[b])
      throw std::invalid_argument("batch_ptr must not decrease, got batch_ptr[" +
                                  std::to_string(b) + "] = " + std::to_string(batch_ptr[b]) +
                                  " > batch_ptr[" + std::to_string(b + 1) +
                                  "] = " + std::to_string(batch_ptr[b + 1]));
  check_ids(trace, n, num_rows_, "trace");

  next_.resize(n);
  for (int64_t t = n - 1; t >= 0; --t) {
    next_[t] = last_seen_[trace[t]];
    last_seen_[trace[t]] = t;
  }
  // last_seen_ now holds every id's first position in the trace: the cached ids' next uses.
  for (int64_t s = 0; s < count_; ++s) next_use_[s] = last_seen_[id_of_slot_[s]];
  for (int64_t t = 0; t < n; ++t) last_seen_[trace[t]] = kNeverUsed;

  for (int64_t b = 0; b < n_batches; ++b)
    for (int64_t t = batch_ptr[b]; t < batch_ptr[b + 1]; ++t)
      if (next_[t] < batch_ptr[b + 1])
        throw std::invalid_argument("gather " + std::to_string(b) + " of the trace holds id " +
                                    std::to_string(trace[t]) + " more than once (positions " +
                                    std::to_string(t) + " and " + std::to_string(next_[t]) +
                                    "); ids must be unique within a gather");

  rebuild_heap();
  const int64_t heap_limit = 2 * capacity_ + kHeapSlack;
  auto push = [&](int64_t next_use, int64_t s) {
    heap_.push_back(HeapEntry{next_use, s});
    std::push_heap(heap_.begin(), heap_.end(), HeapLess());
    if (static_cast<int64_t>(heap_.size()) > heap_limit) rebuild_heap();
  };
  for (int64_t b = 0; b < n_batches; ++b) {
    const int64_t lo = batch_ptr[b], hi = batch_ptr[b + 1];
    // Pass 1: every id cached at the start of the gather hits (the executor copies all hits
    // before any fill), and its next use becomes its next position after this gather (ids are
    // unique within a gather, so next_[t] >= hi).
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t s = slot_of_[trace[t]];
      hit_slot[t] = s;
      fill_slot[t] = kNoSlot;
      if (s == kNoSlot) continue;
      next_use_[s] = next_[t];
      push(next_[t], s);
    }
    // Pass 2: the misses in gather order. Every cached id (hit by this gather, untouched by it,
    // or filled earlier in it) now has a next use >= hi, so any of them may be replaced.
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t v = trace[t];
      if (hit_slot[t] != kNoSlot) continue;
      const int64_t nu = next_[t];
      int64_t s = kNoSlot;
      if (count_ < capacity_) {  // a free slot, lowest first
        s = count_++;
      } else if (capacity_ > 0) {
        while (next_use_[heap_.front().slot] != heap_.front().next_use) {  // drop stale
          std::pop_heap(heap_.begin(), heap_.end(), HeapLess());
          heap_.pop_back();
        }
        if (nu < heap_.front().next_use) {  // the farthest cached id is needed later: evict it
          s = heap_.front().slot;
          std::pop_heap(heap_.begin(), heap_.end(), HeapLess());
          heap_.pop_back();
          slot_of_[id_of_slot_[s]] = static_cast<int32_t>(kNoSlot);
        }
      }
      fill_slot[t] = s;  // kNoSlot: bypass
      if (s == kNoSlot) continue;
      slot_of_[v] = static_cast<int32_t>(s);
      id_of_slot_[s] = v;
      next_use_[s] = nu;
      push(nu, s);
    }
  }
}

void BeladyPlanner::slot_ids(int64_t* out) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::copy(id_of_slot_.begin(), id_of_slot_.end(), out);
}

int64_t BeladyPlanner::cached_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return count_;
}

void BeladyPlanner::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (int64_t s = 0; s < count_; ++s) {
    slot_of_[id_of_slot_[s]] = static_cast<int32_t>(kNoSlot);
    id_of_slot_[s] = kNoSlot;
    next_use_[s] = kNeverUsed;
  }
  count_ = 0;
  heap_.clear();
}

// ---- LruCache --------------------------------------------------------------------------------

LruCache::LruCache(int64_t capacity, int64_t num_rows)
    : capacity_(capacity), num_rows_(num_rows) {
  check_sizes(capacity, num_rows);
  slot_of_.assign(num_rows, static_cast<int32_t>(kNoSlot));
  id_of_slot_.assign(capacity, kNoSlot);
  prev_.assign(capacity, kNoSlot);
  next_.assign(capacity, kNoSlot);
  seen_.assign(num_rows, 0);
}

void LruCache::unlink(int64_t s) {
  const int64_t p = prev_[s], q = next_[s];
  (p == kNoSlot ? head_ : next_[p]) = q;
  (q == kNoSlot ? tail_ : prev_[q]) = p;
}

void LruCache::push_back(int64_t s) {  // s becomes the most recently used
  prev_[s] = tail_;
  next_[s] = kNoSlot;
  (tail_ == kNoSlot ? head_ : next_[tail_]) = s;
  tail_ = s;
}

// access: validate (range, then uniqueness with the seen_ marks, cleared again), then decide.
void LruCache::access(const int64_t* ids, int64_t n, int64_t* hit_slot, int64_t* fill_slot) {
  std::lock_guard<std::mutex> lock(mutex_);
  check_ids(ids, n, num_rows_, "ids");
  int64_t dup = -1;
  for (int64_t i = 0; i < n && dup < 0; ++i) {
    if (seen_[ids[i]]) dup = i;
    seen_[ids[i]] = 1;
  }
  for (int64_t i = 0; i < n; ++i) seen_[ids[i]] = 0;
  if (dup >= 0)
    throw std::invalid_argument("ids hold " + std::to_string(ids[dup]) +
                                " more than once (again at position " + std::to_string(dup) +
                                "); ids must be unique within one access");

  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = ids[i];
    int64_t s = slot_of_[v];
    if (s != kNoSlot) {
      hit_slot[i] = s;
      fill_slot[i] = kNoSlot;
      unlink(s);
      push_back(s);
      continue;
    }
    hit_slot[i] = kNoSlot;
    if (count_ < capacity_) {
      s = count_++;
    } else if (capacity_ > 0) {
      s = head_;
      unlink(s);
      slot_of_[id_of_slot_[s]] = static_cast<int32_t>(kNoSlot);
    }
    fill_slot[i] = s;
    if (s == kNoSlot) continue;
    slot_of_[v] = static_cast<int32_t>(s);
    id_of_slot_[s] = v;
    push_back(s);
  }
}

void LruCache::slot_ids(int64_t* out) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::copy(id_of_slot_.begin(), id_of_slot_.end(), out);
}

int64_t LruCache::cached_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return count_;
}

void LruCache::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (int64_t s = 0; s < count_; ++s) {
    slot_of_[id_of_slot_[s]] = static_cast<int32_t>(kNoSlot);
    id_of_slot_[s] = kNoSlot;
    prev_[s] = next_[s] = kNoSlot;
  }
  count_ = 0;
  head_ = tail_ = kNoSlot;
}

}  // namespace distmb
