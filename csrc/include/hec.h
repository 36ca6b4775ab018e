// Historical embedding cache, DistGNN-MB section 3.2 (csrc/kernels/hec.cpp).
// Kernels work on raw buffers and std::vector outputs and know nothing about Python (the
// bindings in csrc/bindings/ do).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace distmb {

// Slot that HecCore::search returns for an absent or expired tag
// (distmb.halo.hec.host.HEC_MISS).
constexpr int64_t kHecMiss = -1;
// Life-span meaning "lines never expire" (distmb.halo.hec.host.LIFESPAN_UNBOUNDED).
constexpr int64_t kLifespanUnbounded = -1;

struct HecCounters {
  int64_t lookups = 0;               // tags searched (search and lookup)
  int64_t hits = 0;                  // of those, found and unexpired
  int64_t stores = 0;                // rows stored
  int64_t evictions = 0;             // unexpired lines of another tag replaced (capacity)
  int64_t expired_replacements = 0;  // expired lines of another tag replaced
};

// HecCore: capacity lines of dim float32, tagged by VID_o (>= 0), with a clock counting
// training iterations; a line's age is clock - (clock when it was last stored).
// - search(tags[n]) -> slots[n]: the line holding the tag if its age <= lifespan (always when
//   lifespan == kLifespanUnbounded), else kHecMiss. Parallel, read-only on the lines.
// - load(slots[n]) -> out[n, dim]: parallel gather; every slot must hold a tag (a hit of a
//   search since the last store/clear), else std::invalid_argument.
// - lookup(tags[n]) -> hit[n], rows[n_hits, dim] in tag order: search + load under one lock.
// - lookup_into(tags[n], out[n, dim]) -> hit[n]: out[i] = the line of tags[i] on a hit, zeros
//   on a miss (no allocation: out may be the halo rows of a layer's input).
// - store(tags[m], rows[m, dim]): as if the rows were stored one at a time in order: a line
//   with the same tag is overwritten (also when expired); else a free line is taken (lowest
//   slot first); else the oldest line is replaced, ties between lines of equal age going to
//   the one written first. Stored lines get age 0, so a repeated tag keeps its last row.
//   Slot decisions are serial, row copies parallel: the state is independent of the thread
//   count. Throws std::invalid_argument (cache unchanged) for a negative tag.
// - advance(): every age + 1, O(1). clear(): drops every line (clock and counters kept).
// Every public call takes the object's mutex, so calls from several threads are serialised.
class HecCore {
 public:
  HecCore(int64_t capacity, int64_t dim, int64_t lifespan);

  int64_t search(const int64_t* tags, int64_t n, int64_t* slots);  // returns the hits
  void load(const int64_t* slots, int64_t n, float* out) const;
  std::unique_ptr<float[]> lookup(const int64_t* tags, int64_t n, bool* hit, int64_t& n_hits);
  int64_t lookup_into(const int64_t* tags, int64_t n, bool* hit, float* out);  // returns hits
  void store(const int64_t* tags, int64_t m, const float* rows);
  void advance();
  void clear();
  void reset_counters();
  HecCounters counters() const;

  int64_t capacity() const { return capacity_; }
  int64_t dim() const { return dim_; }
  int64_t lifespan() const { return lifespan_; }
  int64_t clock() const;
  int64_t occupied() const;    // lines holding a tag, expired or not
  int64_t live_lines() const;  // lines that would hit now, O(occupied)
  // tags[s] and ages[s] of the lines s in [0, occupied) (for tests and diagnostics).
  void snapshot(std::vector<int64_t>& tags, std::vector<int64_t>& ages) const;

 private:
  struct Entry {
    int64_t key;   // tag, or empty
    int64_t slot;
  };
  // Bookkeeping of one line, 32 bytes so that a line's fields share one cache line.
  struct alignas(32) Line {
    int64_t tag;         // VID_o held (valid for slots < used_)
    int64_t written_at;  // clock when last stored
    int64_t prev, next;  // write-order list
  };
  struct FreeFloats {
    void operator()(float* p) const;
  };

  bool live(int64_t s) const {
    return lifespan_ == kLifespanUnbounded || clock_ - lines_[s].written_at <= lifespan_;
  }
  int64_t find(int64_t tag) const;
  void insert(int64_t tag, int64_t slot);
  void erase(int64_t tag);
  void unlink(int64_t s);
  void push_back(int64_t s);
  void reset_lines();
  int64_t search_unlocked(const int64_t* tags, int64_t n, int64_t* slots) const;
  void gather(const int64_t* slots, int64_t n, float* out) const;

  int64_t capacity_, dim_, lifespan_;
  int64_t clock_ = 0;
  int64_t used_ = 0;                     // lines [0, used_) hold a tag
  int64_t head_ = -1, tail_ = -1;        // oldest / newest used line (write order)
  std::unique_ptr<float, FreeFloats> data_;  // [capacity * dim], uninitialised until stored
  std::vector<Line> lines_;              // [capacity]
  std::vector<int64_t> dest_row_;        // store(): last row of the call written to a line
  std::vector<Entry> table_;             // open addressing, power-of-two size
  uint64_t mask_ = 0;
  HecCounters counters_;
  mutable std::mutex mutex_;
};

}  // namespace distmb
