// Historical Embedding Cache (DistGNN-MB section 3.2: HECSearch, HECLoad, HECStore): one
// cache per GNN layer holding delayed embeddings of remote (halo) vertices, tagged by VID_o.
//
// Layout (all arrays indexed by slot, one entry per cache line):
//   data_        float[capacity * dim], allocated once and never zero-filled (pages are
//                touched on first store, so a 1M-line cache costs memory only as it fills);
//   lines_       32 bytes per line: the VID_o it holds (lines [0, used_) hold a tag, the rest
//                are free); written_at, the clock when it was last stored, so that
//                age = clock_ - written_at and advance() is O(1); prev/next, an intrusive
//                doubly-linked list of the used lines in write order, head_ the least recently
//                written: ages are non-decreasing from tail to head, so the oldest line is
//                head_ and the expired lines form a prefix of the list;
//   table_       open-addressing hash map VID_o -> slot (linear probing, >= 2x capacity,
//                backward-shift deletion, so there are no tombstones and probe sequences stay
//                short however many evictions happen).
// Search and load only read these arrays and run in parallel. Store first probes the hash map
// for every row in parallel (read-only), then decides slots serially in row order (the
// decisions form a chain: a row may evict the line a previous row just wrote), prefetching
// the lines the next rows will touch, and finally copies the rows in parallel, each
// destination line written by exactly one row.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

#include "common.h"
#include "hec.h"
#include "rng.h"

namespace distmb {

namespace {

// Table key of an empty hash-map entry (tags are VID_o >= 0).
constexpr int64_t kEmptyKey = -1;
// End of the write-order list.
constexpr int64_t kNil = -1;
// Alignment of the line buffer (one cache line; rows of dim % 16 == 0 stay aligned).
constexpr size_t kLineAlign = 64;
// Minimum work per OpenMP thread: tags probed by search, floats copied by load/store. Below
// it a loop runs on fewer threads (a fork/join costs microseconds).
constexpr int64_t kGrainTags = 4096;
constexpr int64_t kGrainFloats = 32768;
// How many rows ahead the serial slot-assignment loop of store() prefetches hash entries.
constexpr int64_t kPrefetchDistance = 8;


// Smallest power of two >= max(2 * capacity, 16).
int64_t table_size_for(int64_t capacity) {
  int64_t size = 16;
  while (size < 2 * capacity) size <<= 1;
  return size;
}

// Index of the first negative tag, or n when all are valid VID_o.
int64_t first_negative(const int64_t* tags, int64_t n) {
  int64_t bad = n;
#pragma omp parallel for reduction(min : bad) schedule(static) \
    num_threads(threads_for(n, kGrainTags))
  for (int64_t i = 0; i < n; ++i)
    if (tags[i] < 0) bad = std::min(bad, i);
  return bad;
}

void require_tags(const int64_t* tags, int64_t n) {
  const int64_t bad = first_negative(tags, n);
  if (bad < n)
    throw std::invalid_argument("tags must be VID_o >= 0 (tags[" + std::to_string(bad) +
                                "] = " + std::to_string(tags[bad]) + ")");
}

}  // namespace

void HecCore::FreeFloats::operator()(float* p) const { std::free(p); }

HecCore::HecCore(int64_t capacity, int64_t dim, int64_t lifespan)
    : capacity_(capacity), dim_(dim), lifespan_(lifespan) {
  if (capacity < 1) throw std::invalid_argument("capacity must be >= 1 line");
  if (dim < 1) throw std::invalid_argument("dim must be >= 1");
  if (lifespan < 0 && lifespan != kLifespanUnbounded)
    throw std::invalid_argument("lifespan must be >= 0 or LIFESPAN_UNBOUNDED (-1), got " +
                                std::to_string(lifespan));
  const uint64_t limit = static_cast<uint64_t>(INT64_MAX) / sizeof(float) / 4;
  if (static_cast<uint64_t>(capacity) > limit / static_cast<uint64_t>(dim))
    throw std::invalid_argument("capacity * dim is too large");
  size_t bytes = static_cast<size_t>(capacity) * static_cast<size_t>(dim) * sizeof(float);
  bytes = (bytes + kLineAlign - 1) / kLineAlign * kLineAlign;
  // aligned_alloc leaves the buffer uninitialised: large blocks come from mmap and their
  // pages are only backed when first written.
  data_.reset(static_cast<float*>(std::aligned_alloc(kLineAlign, bytes)));
  if (!data_) throw std::bad_alloc();
  lines_.resize(capacity);
  dest_row_.resize(capacity);
  const int64_t table_size = table_size_for(capacity);
  mask_ = static_cast<uint64_t>(table_size - 1);
  table_.resize(table_size);
  reset_lines();
}

void HecCore::reset_lines() {
  const int64_t table_size = static_cast<int64_t>(table_.size());
#pragma omp parallel for schedule(static) num_threads(threads_for(table_size, 1 << 20))
  for (int64_t i = 0; i < table_size; ++i) table_[i] = Entry{kEmptyKey, kHecMiss};
  used_ = 0;
  head_ = tail_ = kNil;
}

// ---- hash map ------------------------------------------------------------------------------

int64_t HecCore::find(int64_t tag) const {
  uint64_t i = mix64(static_cast<uint64_t>(tag)) & mask_;
  while (true) {
    const Entry& e = table_[i];
    if (e.key == tag) return e.slot;
    if (e.key == kEmptyKey) return kHecMiss;
    i = (i + 1) & mask_;
  }
}

void HecCore::insert(int64_t tag, int64_t slot) {  // tag must be absent
  uint64_t i = mix64(static_cast<uint64_t>(tag)) & mask_;
  while (table_[i].key != kEmptyKey) i = (i + 1) & mask_;
  table_[i] = Entry{tag, slot};
}

void HecCore::erase(int64_t tag) {  // tag must be present
  uint64_t i = mix64(static_cast<uint64_t>(tag)) & mask_;
  while (table_[i].key != tag) i = (i + 1) & mask_;
  // Backward-shift deletion: move later entries of the cluster into the hole unless their
  // home position lies cyclically in (hole, j], where they are still reachable.
  uint64_t j = i;
  while (true) {
    j = (j + 1) & mask_;
    if (table_[j].key == kEmptyKey) break;
    const uint64_t home = mix64(static_cast<uint64_t>(table_[j].key)) & mask_;
    const bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
    if (stays) continue;
    table_[i] = table_[j];
    i = j;
  }
  table_[i] = Entry{kEmptyKey, kHecMiss};
}

// ---- write-order list ----------------------------------------------------------------------

void HecCore::unlink(int64_t s) {
  const int64_t p = lines_[s].prev, n = lines_[s].next;
  (p == kNil ? head_ : lines_[p].next) = n;
  (n == kNil ? tail_ : lines_[n].prev) = p;
}

void HecCore::push_back(int64_t s) {
  lines_[s].prev = tail_;
  lines_[s].next = kNil;
  (tail_ == kNil ? head_ : lines_[tail_].next) = s;
  tail_ = s;
}

// ---- operations ----------------------------------------------------------------------------

int64_t HecCore::search_unlocked(const int64_t* tags, int64_t n, int64_t* slots) const {
  require_tags(tags, n);
  int64_t hits = 0;
#pragma omp parallel for reduction(+ : hits) schedule(static) \
    num_threads(threads_for(n, kGrainTags))
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = find(tags[i]);
    const bool hit = s != kHecMiss && live(s);
    slots[i] = hit ? s : kHecMiss;
    hits += hit ? 1 : 0;
  }
  return hits;
}

int64_t HecCore::search(const int64_t* tags, int64_t n, int64_t* slots) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t hits = search_unlocked(tags, n, slots);
  counters_.lookups += n;
  counters_.hits += hits;
  return hits;
}

void HecCore::gather(const int64_t* slots, int64_t n, float* out) const {
  const size_t row_bytes = static_cast<size_t>(dim_) * sizeof(float);
#pragma omp parallel for schedule(static) num_threads(threads_for(n * dim_, kGrainFloats))
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(out + i * dim_, data_.get() + slots[i] * dim_, row_bytes);
}

void HecCore::load(const int64_t* slots, int64_t n, float* out) const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t bad = n;
#pragma omp parallel for reduction(min : bad) schedule(static) \
    num_threads(threads_for(n, kGrainTags))
  for (int64_t i = 0; i < n; ++i)
    if (slots[i] < 0 || slots[i] >= used_) bad = std::min(bad, i);
  if (bad < n)
    throw std::invalid_argument(
        "load: slots[" + std::to_string(bad) + "] = " + std::to_string(slots[bad]) +
        (slots[bad] == kHecMiss ? " is HEC_MISS" : " is not a line holding a tag") +
        " (load only the hits of search)");
  gather(slots, n, out);
}

std::unique_ptr<float[]> HecCore::lookup(const int64_t* tags, int64_t n, bool* hit,
                                         int64_t& n_hits) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<int64_t> slots(n);
  n_hits = search_unlocked(tags, n, slots.data());
  counters_.lookups += n;
  counters_.hits += n_hits;
#pragma omp parallel for schedule(static) num_threads(threads_for(n, kGrainTags))
  for (int64_t i = 0; i < n; ++i) hit[i] = slots[i] != kHecMiss;
  const std::vector<int64_t> pos = compact_where(n, [&](int64_t i) { return hit[i]; });
  std::vector<int64_t> hit_slots(pos.size());
  for (size_t k = 0; k < pos.size(); ++k) hit_slots[k] = slots[pos[k]];
  std::unique_ptr<float[]> rows(new float[std::max<int64_t>(1, n_hits * dim_)]);
  gather(hit_slots.data(), n_hits, rows.get());
  return rows;
}

int64_t HecCore::lookup_into(const int64_t* tags, int64_t n, bool* hit, float* out) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<int64_t> slots(n);
  const int64_t hits = search_unlocked(tags, n, slots.data());
  counters_.lookups += n;
  counters_.hits += hits;
  const size_t row_bytes = static_cast<size_t>(dim_) * sizeof(float);
#pragma omp parallel for schedule(static) num_threads(threads_for(n * dim_, kGrainFloats))
  for (int64_t i = 0; i < n; ++i) {
    hit[i] = slots[i] != kHecMiss;
    if (hit[i])
      std::memcpy(out + i * dim_, data_.get() + slots[i] * dim_, row_bytes);
    else
      std::memset(out + i * dim_, 0, row_bytes);
  }
  return hits;
}

void HecCore::store(const int64_t* tags, int64_t m, const float* rows) {
  std::lock_guard<std::mutex> lock(mutex_);
  require_tags(tags, m);  // before any change: a rejected store leaves the cache as it was

  // 1. Hash probes of every row in parallel, before anything changes: slot_of[i] first holds
  //    the line that held tags[i] when the call started (or kHecMiss).
  std::vector<int64_t> slot_of(m);
#pragma omp parallel for schedule(static) num_threads(threads_for(m, kGrainTags))
  for (int64_t i = 0; i < m; ++i) slot_of[i] = find(tags[i]);

  // 2. Slot decisions, serially and in row order (the contract is "as if the rows were
  //    stored one at a time"): same tag -> that line; else a free line; else the oldest line
  //    (expired or not). That first probe is still right when its line still holds tags[i]; when it
  //    does not, or when it is a miss, an earlier row of this call may have evicted or
  //    inserted the tag, so the map is probed again (its entry is cached by step 1).
  //    slot_of[i] becomes row i's line; dest_row_[s] ends as the last row of the call
  //    written to line s.
  for (int64_t i = 0; i < m; ++i) {
    if (i + kPrefetchDistance < m) {
      const int64_t ahead = slot_of[i + kPrefetchDistance];
      if (ahead != kHecMiss) {
        __builtin_prefetch(&lines_[ahead]);
        __builtin_prefetch(&dest_row_[ahead]);
      }
    }
    const int64_t tag = tags[i];
    int64_t s = slot_of[i];
    if (s == kHecMiss || lines_[s].tag != tag) s = find(tag);
    if (s != kHecMiss) {
      unlink(s);  // refresh: overwrite in place, even if expired
    } else {
      if (used_ < capacity_) {
        s = used_++;
      } else {
        s = head_;  // oldest line; ties (same iteration) go to the one written first
        if (live(s))
          ++counters_.evictions;
        else
          ++counters_.expired_replacements;
        erase(lines_[s].tag);
        unlink(s);
        if (head_ != kNil) __builtin_prefetch(&lines_[head_]);  // the next victim
      }
      lines_[s].tag = tag;
      insert(tag, s);
    }
    lines_[s].written_at = clock_;
    push_back(s);
    dest_row_[s] = i;
    slot_of[i] = s;
  }
  counters_.stores += m;

  // 3. Row copies in parallel: each line is written by exactly one row, the last one.
  const size_t row_bytes = static_cast<size_t>(dim_) * sizeof(float);
#pragma omp parallel for schedule(static) num_threads(threads_for(m * dim_, kGrainFloats))
  for (int64_t i = 0; i < m; ++i) {
    const int64_t s = slot_of[i];
    if (dest_row_[s] == i) std::memcpy(data_.get() + s * dim_, rows + i * dim_, row_bytes);
  }
}

void HecCore::advance() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++clock_;
}

void HecCore::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  reset_lines();
}

void HecCore::reset_counters() {
  std::lock_guard<std::mutex> lock(mutex_);
  counters_ = HecCounters{};
}

HecCounters HecCore::counters() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counters_;
}

int64_t HecCore::clock() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return clock_;
}

int64_t HecCore::occupied() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return used_;
}

int64_t HecCore::live_lines() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (lifespan_ == kLifespanUnbounded) return used_;
  int64_t live_count = 0;
#pragma omp parallel for reduction(+ : live_count) schedule(static) \
    num_threads(threads_for(used_, kGrainTags * 16))
  for (int64_t s = 0; s < used_; ++s) live_count += live(s) ? 1 : 0;
  return live_count;
}

void HecCore::snapshot(std::vector<int64_t>& tags, std::vector<int64_t>& ages) const {
  std::lock_guard<std::mutex> lock(mutex_);
  tags.resize(used_);
  ages.resize(used_);
  for (int64_t s = 0; s < used_; ++s) {
    tags[s] = lines_[s].tag;
    ages[s] = clock_ - lines_[s].written_at;
  }
}

}  // namespace distmb
