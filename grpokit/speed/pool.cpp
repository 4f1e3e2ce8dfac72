// grpokit's CPU tensor pool (speed/pool.py): torch's CPU allocator for blocks of at least
// `min_bytes`, carved from one address range reserved for them, best fit with coalescing of
// neighbouring free blocks; smaller blocks go to the allocator it replaces.
//
// Why: with the glibc heap kept (./run's malloc settings) the small long-lived allocations
// of a step (tensor metadata, Python-side results) land between the activations' large
// blocks and split the free space the next forward needs, so the heap grows ~1.2 GB above
// the bytes in use at a training step's peak. Here the large blocks share a range with
// nothing else. Pages once touched stay resident (no page fault when reused), as in ./run's
// heap; `grpokit_pool_release` gives the free blocks' pages back.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <pthread.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <new>
#include <unordered_map>

namespace {

constexpr size_t kPage = 4096;
constexpr size_t kHuge = size_t(2) << 20;
constexpr size_t kCommitStep = size_t(64) << 20;

struct Pool {
  std::mutex mu;
  char* base = nullptr;
  size_t reserved = 0;   // bytes of address range
  size_t top = 0;        // bytes handed out at least once, from base
  size_t committed = 0;  // bytes made readable and writable, from base
  size_t in_use = 0;
  std::multimap<size_t, char*> free_by_size;
  std::map<char*, size_t> free_by_addr;
  std::unordered_map<char*, size_t> used;

  void forget_free(char* a, size_t n) {
    free_by_addr.erase(a);
    auto r = free_by_size.equal_range(n);
    for (auto it = r.first; it != r.second; ++it) {
      if (it->second == a) {
        free_by_size.erase(it);
        return;
      }
    }
  }

  void add_free(char* a, size_t n) {
    free_by_addr.emplace(a, n);
    free_by_size.emplace(n, a);
  }

  // n: a multiple of kPage. nullptr when the range is used up.
  char* take(size_t n) {
    auto fit = free_by_size.lower_bound(n);
    if (fit != free_by_size.end()) {
      size_t have = fit->first;
      char* a = fit->second;
      free_by_size.erase(fit);
      free_by_addr.erase(a);
      if (have > n) add_free(a + n, have - n);
      return a;
    }
    char* start = base + top;  // grow, starting inside a free block that ends at the top
    size_t more = n;
    if (!free_by_addr.empty()) {
      auto last = std::prev(free_by_addr.end());
      if (last->first + last->second == base + top) {
        start = last->first;
        more = n - last->second;
        forget_free(last->first, last->second);
      }
    }
    if (more > reserved - top) {
      if (start != base + top) add_free(start, base + top - start);
      return nullptr;
    }
    size_t new_top = top + more;
    if (new_top > committed) {
      size_t c = (new_top + kCommitStep - 1) / kCommitStep * kCommitStep;
      if (c > reserved) c = reserved;
      if (mprotect(base + committed, c - committed, PROT_READ | PROT_WRITE) != 0) {
        if (start != base + top) add_free(start, base + top - start);
        return nullptr;
      }
      madvise(base + committed, c - committed, MADV_HUGEPAGE);
      committed = c;
    }
    top = new_top;
    return start;
  }

  void give(char* a, size_t n) {
    auto next = free_by_addr.lower_bound(a);
    if (next != free_by_addr.end() && a + n == next->first) {
      char* b = next->first;
      size_t m = next->second;
      forget_free(b, m);
      n += m;
    }
    auto after = free_by_addr.lower_bound(a);
    if (after != free_by_addr.begin()) {
      auto prev = std::prev(after);
      if (prev->first + prev->second == a) {
        char* b = prev->first;
        size_t m = prev->second;
        forget_free(b, m);
        a = b;
        n += m;
      }
    }
    add_free(a, n);
  }
};

Pool* g_pool = nullptr;
c10::Allocator* g_prev = nullptr;
size_t g_min_bytes = size_t(256) << 10;

bool in_pool(const void* p) {
  auto a = static_cast<const char*>(p);
  return a >= g_pool->base && a < g_pool->base + g_pool->reserved;
}

void pool_delete(void* p) {
  if (p == nullptr) return;
  if (!in_pool(p)) {  // a block of the allocator before (raw_deallocate comes here too)
    g_prev->raw_deleter()(p);
    return;
  }
  auto a = static_cast<char*>(p);
  std::lock_guard<std::mutex> lock(g_pool->mu);
  auto it = g_pool->used.find(a);
  if (it == g_pool->used.end()) return;
  size_t n = it->second;
  g_pool->used.erase(it);
  g_pool->in_use -= n;
  g_pool->give(a, n);
}

struct PoolAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    if (nbytes >= g_min_bytes) {
      size_t n = (nbytes + kPage - 1) / kPage * kPage;
      std::lock_guard<std::mutex> lock(g_pool->mu);
      char* a = g_pool->take(n);
      if (a != nullptr) {
        g_pool->used.emplace(a, n);
        g_pool->in_use += n;
        return {a, a, &pool_delete, c10::Device(c10::DeviceType::CPU)};
      }
    }
    return g_prev->allocate(nbytes);  // small, or the range is used up
  }
  c10::DeleterFnPtr raw_deleter() const override { return &pool_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

PoolAllocator g_allocator;

}  // namespace

// 1 installed (or already), 0 the address range could not be reserved.
extern "C" int grpokit_pool_install(size_t reserve_bytes, size_t min_bytes) {
  if (g_pool != nullptr) return 1;
  size_t span = reserve_bytes + kHuge;
  void* p = mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return 0;
  auto raw = reinterpret_cast<uintptr_t>(p);
  auto aligned = (raw + kHuge - 1) / kHuge * kHuge;  // huge pages line up with the range
  auto pool = new Pool();
  pool->base = reinterpret_cast<char*>(aligned);
  pool->reserved = reserve_bytes;
  g_pool = pool;
  g_min_bytes = min_bytes;
  g_prev = c10::GetCPUAllocator();
  pthread_atfork([] { g_pool->mu.lock(); }, [] { g_pool->mu.unlock(); },
                 [] { new (&g_pool->mu) std::mutex(); });
  c10::SetCPUAllocator(&g_allocator, /*priority=*/1);
  return 1;
}

// out: bytes in use, bytes handed out at least once (the range's high-water mark),
// number of free blocks, bytes reserved.
extern "C" void grpokit_pool_stats(size_t* out) {
  std::lock_guard<std::mutex> lock(g_pool->mu);
  out[0] = g_pool->in_use;
  out[1] = g_pool->top;
  out[2] = g_pool->free_by_addr.size();
  out[3] = g_pool->reserved;
}

// The whole pages inside free blocks go back to the system (the next use faults them in
// again). Returns the bytes released.
extern "C" size_t grpokit_pool_release(void) {
  std::lock_guard<std::mutex> lock(g_pool->mu);
  size_t released = 0;
  for (auto& kv : g_pool->free_by_addr) {
    auto lo = reinterpret_cast<uintptr_t>(kv.first);
    auto hi = lo + kv.second;
    if (hi - lo >= kPage && madvise(kv.first, hi - lo, MADV_DONTNEED) == 0) released += hi - lo;
  }
  return released;
}
