// pairbench-engine native kernels: the CPU decode hot path in plain C++ (AVX2 + FMA + F16C).
//
// Built by engine/native.py with the system compiler into a cache directory keyed by this file's
// hash, and called through ctypes (no torch headers: it compiles in about a second and does not
// depend on torch's C++ ABI). Everything here has a pure-PyTorch reference in engine/kernels.py and
// a unit test against it (tests/engine/test_kernels.py).
//
// What is here, and where the idea comes from:
//  * matrix-vector products over GGUF block-quantized weights, kept exactly as the GGUF stores them
//    (Q4_1: 32 weights = fp16 scale d, fp16 min m, 16 bytes of nibbles; Q8_0: fp16 d, 32 int8).
//    The activation row is quantized to int8 per 32-block (scale dx, plus the exact float sum for
//    Q4_1's min term) and the block dot products run on integer SIMD (maddubs), as llama.cpp's
//    ggml_vec_dot_q4_1_q8_1 / q8_0_q8_0 do. Bytes per weight: 0.625 (Q4_1), 1.0625 (Q8_0), against
//    2 for fp16: decode at batch 1 is a stream over the weights, so fewer bytes is the lever.
//  * dequantization of whole matrices to fp32 (prefill hands the result to MKL sgemm) and of single
//    embedding rows;
//  * single-query attention over the KV cache (f16 or f32), split over positions in blocks whose
//    partial softmax states are merged at the end (flash-decoding, Dao et al. 2023);
//  * a tiny work-sharing pool: the calling thread and (threads - 1) helpers claim fixed-size chunks
//    from one atomic counter. There is no barrier to wait at: a helper that the OS has not scheduled
//    simply claims nothing and the caller does the work. A helper preempted in the middle of a chunk
//    still makes the caller wait until it runs again; the pool then works alone for a while while
//    that keeps costing more than the second core gives (Pool::run). (The OpenMP barriers of
//    multi-threaded ATen GEMVs stalled for whole time slices at every op, docs/perf.md.) Helpers
//    spin for a short while after each job, then sleep.
#include <immintrin.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#define PB_API extern "C" __attribute__((visibility("default")))

namespace {

constexpr int QK = 32;  // weights per block, both formats
// In memory, a weight row of nb = k/32 blocks is "split": every block's quants first, then every
// block's fp16 scale d, then (q4_1) every block's fp16 min m:
//   q4_1: qs[nb][16] (element j in the low nibble of byte j, j + 16 in its high nibble), d[nb], m[nb]
//   q8_0: qs[nb][32] (int8), d[nb]
// The same bytes as GGUF's blocks (d, [m,] qs), regrouped by engine/kernels.py's ``split_rows`` at
// conversion time, so that 8 scales load and convert with one instruction. 20 / 34 bytes per block.
// The activation row is quantized the same way (as llama.cpp's q8_1): XRow below.
struct XRow {
  float* d;    // (nb) scales: x ~= d * (q + r / 254)
  float* s;    // (nb) exact sums of the 32 float inputs of each block (q4_1's min term: m * sum x)
  int8_t* q;   // (nb, 32) x / d rounded: the int8 rounding llama.cpp's q8_1 makes
  int8_t* r;   // (nb, 32) the rounding error x / d - q (within +-1/2) times 254, rounded: a second int8
               // digit, so the pair carries ~15 bits and decode's products stay within ~1e-4 of fp32
};

enum Format : int { F_Q4_1 = 0, F_Q8_0 = 1 };

inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

// ---------------------------------------------------------------------------------------------
// The pool

struct Pool {
  using Fn = void (*)(const void* ctx, int64_t chunk);
  std::vector<std::thread> workers;
  // (generation << 32) | next chunk to claim. A helper claims only chunks of the generation it saw,
  // so it can never run a chunk of a job whose parameters are being rewritten.
  std::atomic<uint64_t> state{0};
  std::atomic<int64_t> done{0};
  std::atomic<int> sleeping{0};
  std::atomic<bool> stop{false};
  Fn fn = nullptr;
  const void* ctx = nullptr;
  int64_t n_chunks = 0;
  uint32_t gen = 0;
  std::mutex mu;
  std::condition_variable cv;
  int64_t spin_us = 2000;

  ~Pool() { resize(0); }

  void resize(int helpers) {
    if ((int)workers.size() == helpers) return;
    stop = true;
    { std::lock_guard<std::mutex> g(mu); }
    cv.notify_all();
    for (auto& t : workers) t.join();
    workers.clear();
    stop = false;
    for (int i = 0; i < helpers; ++i) workers.emplace_back([this] { loop(); });
    reset_policy();
  }

  bool claim(uint32_t g, int64_t* chunk) {
    uint64_t s = state.load(std::memory_order_acquire);
    for (;;) {
      if ((uint32_t)(s >> 32) != g) return false;
      int64_t next = (int64_t)(s & 0xffffffffu);
      if (next >= n_chunks) return false;
      if (state.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel)) { *chunk = next; return true; }
    }
  }

  // Tests only (pb_pool_test_stall): a helper sleeps stall_sleep_us inside its first chunk of every
  // stall_every-th job, as a helper the OS preempted mid-chunk would.
  std::atomic<int64_t> stall_every{0}, stall_sleep_us{0};

  void work(uint32_t g, bool helper) {
    int64_t c;
    bool first = true;
    while (claim(g, &c)) {
      if (helper && first) {
        const int64_t every = stall_every.load(std::memory_order_relaxed);
        if (every > 0 && g % every == 0)
          std::this_thread::sleep_for(std::chrono::microseconds(stall_sleep_us.load(std::memory_order_relaxed)));
        first = false;
      }
      fn(ctx, c);
      done.fetch_add(1, std::memory_order_release);
    }
  }

  void loop() {
    uint32_t seen = (uint32_t)(state.load() >> 32);
    for (;;) {
      auto t0 = std::chrono::steady_clock::now();
      uint32_t g;
      int spins = 0;
      for (;;) {
        if (stop) return;
        g = (uint32_t)(state.load(std::memory_order_acquire) >> 32);
        if (g != seen) break;
        _mm_pause();
        if (++spins % 256 == 0 &&
            std::chrono::steady_clock::now() - t0 > std::chrono::microseconds(spin_us)) {
          std::unique_lock<std::mutex> lk(mu);
          sleeping.fetch_add(1);
          cv.wait(lk, [&] { return stop || (uint32_t)(state.load() >> 32) != seen; });
          sleeping.fetch_sub(1);
          t0 = std::chrono::steady_clock::now();
        }
      }
      seen = g;
      work(g, true);
    }
  }

  // When to work alone. A second thread only pays while both cores are ours:
  //  * a helper that the OS preempted in the middle of a chunk makes the caller wait for the rest
  //    of that chunk, i.e. until the helper runs again (milliseconds when other processes want the
  //    core): a wait over stall_us is a stall. One stall is no reason to work alone: on an idle
  //    machine one job in ~10,000 waits 0.1-1 ms (an interrupt, a kernel thread), and backing off
  //    for it (as this pool once did) ran ~80 % of a quiet machine's jobs alone, losing the 1.4x a
  //    second core is worth. So the caller keeps decayed sums of its jobs' wall time and of their
  //    waits for helpers (about the last WINDOW_NS) and backs off only when the waits
  //    are over STALL_SHARE of the wall time, i.e. when two threads have become slower than one:
  //    two decode threads measured 1.36-1.46x one on an idle AMD EPYC guest (llama.cpp's 1.6x its
  //    one on an Intel one), so the jobs' wall time may grow by a third (waits 25 % of it) before
  //    one thread would have been faster. A disturbed second core (2-thread tokens
  //    at 11 ms instead of 9.6 ms, against 14 ms alone) keeps both threads;
  //  * when other processes want the cores, a spinning helper takes CPU time from the caller
  //    itself: the caller's own run-queue wait (/proc/thread-self/schedstat), checked every
  //    CHECK_JOBS jobs, above 5 % of the wall time in two windows in a row is oversubscription.
  // Either one makes the caller work alone for a backoff period (100 ms, doubling to 2 s while it
  // recurs; the helpers go to sleep after spin_us), so a busy machine degrades to one thread
  // instead of to llama.cpp-style barrier stalls. On a quiet machine neither happens.
  using Clock = std::chrono::steady_clock;
  static double ns(Clock::duration d) { return std::chrono::duration<double, std::nano>(d).count(); }
  Clock::time_point alone_until{};
  std::chrono::microseconds backoff{0};
  int64_t stall_us = 50;
  static constexpr int CHECK_JOBS = 128;
  // The stall share is judged over about the last WINDOW_NS of two-thread jobs (sums decayed by
  // exp(-age / WINDOW_NS)), and only once the current streak of two-thread work (no gap between
  // jobs longer than WINDOW_NS) has lasted MIN_HISTORY_NS: a new helper's first jobs wait
  // milliseconds for it (on a VM, for the idle second vCPU to be scheduled again).
  static constexpr double WINDOW_NS = 100e6, MIN_HISTORY_NS = 50e6, STALL_SHARE = 0.25;
  double ew_wall_ns = 0, ew_wait_ns = 0;
  Clock::time_point last_end{}, streak_start{};

  void reset_policy() {  // a new pool (or a test's new stall pattern) starts with no history
    ew_wall_ns = ew_wait_ns = 0;
    last_end = streak_start = Clock::time_point{};
    backoff = std::chrono::microseconds(0);
    alone_until = Clock::time_point{};
  }
  uint64_t n_jobs = 0, n_stalls = 0, n_alone = 0, n_busy = 0;

  void back_off() {
    backoff = std::min(std::chrono::microseconds(2000000), std::max(std::chrono::microseconds(100000), backoff * 2));
    alone_until = Clock::now() + backoff;
  }

  static int64_t runqueue_wait_ns() {  // this thread's time spent runnable but not running
    FILE* f = std::fopen("/proc/thread-self/schedstat", "r");
    if (!f) return -1;
    long long run = 0, wait = -1;
    if (std::fscanf(f, "%lld %lld", &run, &wait) != 2) wait = -1;
    std::fclose(f);
    return wait;
  }

  // Per calling thread: the window over which its run-queue wait is compared with wall time, and
  // how many windows in a row were oversubscribed. Two in a row are needed: one window (~one
  // decode token) is what torch's OpenMP workers spend spinning after a prefill's last GEMM,
  // a transient that is cheaper to ride out than a 100 ms backoff.
  struct Window { Clock::time_point t0{}, last{}; int64_t wait0 = -1; int jobs = 0; int busy_run = 0; };

  void check_oversubscribed() {
    static thread_local Window w;
    const Clock::time_point now = Clock::now();
    if (w.wait0 < 0 || now - w.last > std::chrono::milliseconds(5)) {  // idle gap: start afresh
      w = Window{now, now, runqueue_wait_ns(), 0, 0};
      return;
    }
    w.last = now;
    if (++w.jobs < CHECK_JOBS) return;
    const int64_t wait = runqueue_wait_ns();
    const double wall_ns = ns(now - w.t0);
    int busy_run = 0;
    if (wait >= 0 && wall_ns > 0 && (double)(wait - w.wait0) > 0.05 * wall_ns) {
      ++n_busy;
      busy_run = w.busy_run + 1;
      if (busy_run >= 2) back_off();
    }
    w = Window{now, now, wait, 0, busy_run};
  }

  // Run fn(ctx, 0..n-1) on the caller plus the helpers; returns when every chunk has finished.
  void run(Fn f, const void* c, int64_t n) {
    ++n_jobs;
    if (workers.empty() || n <= 1) {
      for (int64_t i = 0; i < n; ++i) f(c, i);
      return;
    }
    check_oversubscribed();
    if (backoff.count() && Clock::now() < alone_until) {
      ++n_alone;
      for (int64_t i = 0; i < n; ++i) f(c, i);
      return;
    }
    const Clock::time_point start = Clock::now();
    fn = f; ctx = c; n_chunks = n;
    done.store(0, std::memory_order_relaxed);
    gen += 1;
    state.store((uint64_t)gen << 32, std::memory_order_seq_cst);  // a full barrier before reading `sleeping`
    const bool waking = sleeping.load() > 0;  // a helper woken now takes a while to start: no stall
    if (waking) { std::lock_guard<std::mutex> g(mu); cv.notify_all(); }
    work(gen, false);
    // Wait for the helpers' last chunks: spin, and past stall_us yield the core at every check, in
    // case the helper we wait for is queued behind us on this very core (a helper woken from a
    // preemption may be placed there); spinning on, we held it off for whole time slices: a 1 ms
    // stall became 8-90 ms.
    Clock::time_point t0{};
    int spins = 0;
    bool stalled = false;
    for (; done.load(std::memory_order_acquire) < n; ++spins) {
      _mm_pause();
      if (spins == 0) t0 = Clock::now();
      else if (spins % 64 == 0 && (stalled || Clock::now() - t0 > std::chrono::microseconds(stall_us))) {
        stalled = true;
        std::this_thread::yield();
      }
    }
    // Close the generation: a helper still holding the old state fails its claim, so it can never
    // take a chunk number of this job against the next job's parameters.
    state.store(((uint64_t)gen << 32) | 0xffffffffull, std::memory_order_release);
    const Clock::time_point end = Clock::now();
    const double wait_ns = spins && !waking ? ns(end - t0) : 0.0;
    // (a backoff in force keeps the streak: its history is what the backoff is about)
    if (last_end == Clock::time_point{} || (ns(start - last_end) > WINDOW_NS && !backoff.count())) streak_start = start;
    const double keep = std::exp(-ns(end - last_end) / WINDOW_NS);
    last_end = end;
    ew_wall_ns = ew_wall_ns * keep + ns(end - start);
    ew_wait_ns = ew_wait_ns * keep + wait_ns;
    if (wait_ns > 1e3 * (double)stall_us) ++n_stalls;
    if (wait_ns > 0 && ns(end - streak_start) >= MIN_HISTORY_NS && ew_wait_ns > STALL_SHARE * ew_wall_ns) {
      back_off();
    } else if (backoff.count() && end > alone_until + 4 * backoff) {
      backoff = std::chrono::microseconds(0);  // a quiet spell: forget the history
    }
  }
};

Pool& pool() {
  static Pool p;
  return p;
}

int g_threads = 1;

// ---------------------------------------------------------------------------------------------
// Activation quantization (one row of k floats -> XRow of k/32 blocks)

void quantize_row(const float* x, int64_t k, XRow out) {
  for (int64_t b = 0; b < k / QK; ++b) {
    const float* xb = x + b * QK;
    float amax = 0.f, sum = 0.f;
    for (int i = 0; i < QK; ++i) { amax = std::fmax(amax, std::fabs(xb[i])); sum += xb[i]; }
    const float d = amax / 127.f, id = d > 0.f ? 1.f / d : 0.f;
    out.d[b] = d;
    out.s[b] = sum;
    for (int i = 0; i < QK; ++i) {
      const float v = xb[i] * id, q = std::nearbyint(v);
      out.q[b * QK + i] = (int8_t)q;
      out.r[b * QK + i] = (int8_t)std::fmax(-127.f, std::fmin(127.f, std::nearbyint((v - q) * 254.f)));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Block dot products (AVX2)

inline __m256i nibbles(const uint8_t* qs) {  // 32 x u8 in [0, 15]: low nibbles = 0..15, high = 16..31
  const __m128i raw = _mm_loadu_si128((const __m128i*)qs);
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

inline __m256 i32_to_ps_sum(__m256i p16) {  // pairs of int16 -> 8 floats
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}

constexpr int64_t PREFETCH_BYTES = 8192;

inline int64_t qs_bytes(int fmt) { return fmt == F_Q4_1 ? 16 : 32; }
inline int64_t row_bytes_of(int fmt, int64_t k) { return (k / QK) * (fmt == F_Q4_1 ? 20 : 34); }

// 8 fp16 values (fewer than 8: zero-padded) -> floats
inline __m256 load_h8(const uint16_t* p, int cnt) {
  if (cnt == 8) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
  alignas(16) uint16_t t[8] = {0};
  for (int i = 0; i < cnt; ++i) t[i] = p[i];
  return _mm256_cvtph_ps(_mm_load_si128((const __m128i*)t));
}
inline __m256 load_f8(const float* p, int cnt) {
  if (cnt == 8) return _mm256_loadu_ps(p);
  alignas(32) float t[8] = {0};
  for (int i = 0; i < cnt; ++i) t[i] = p[i];
  return _mm256_load_ps(t);
}

// R weight rows (R <= 4, consecutive, row_bytes apart) against one activation row: y[r] = row r . x.
// Per group of 8 blocks the R x 8 scale products d_w * d_x are made in one multiply and the q4_1
// min terms m_w * sum(x) in one FMA; per block, one integer dot product (maddubs) per row.
template <int FMT, int R>
inline void rows_dot(const uint8_t* w, int64_t row_bytes, int64_t nb, XRow x, float* y) {
  constexpr int64_t QB = FMT == F_Q4_1 ? 16 : 32;
  __m256 acc[R], macc[R];
  for (int r = 0; r < R; ++r) { acc[r] = _mm256_setzero_ps(); macc[r] = _mm256_setzero_ps(); }
  // Software prefetch PREFETCH_BYTES ahead of this row group (rows are contiguous, so this covers
  // the whole stream): one core keeps more misses in flight than its hardware prefetcher does with
  // the row's three regions; measured 5.4 -> 8.4 GB/s from DRAM on a 2-vCPU guest (docs/perf.md).
  // A prefetch past the end of the matrix is harmless (it never faults).
  for (int64_t o = 0; o < R * row_bytes; o += 64) _mm_prefetch((const char*)(w + PREFETCH_BYTES + o), _MM_HINT_T0);
  alignas(32) float sc[R][8];
  for (int64_t b0 = 0; b0 < nb; b0 += 8) {
    const int cnt = (int)std::min<int64_t>(8, nb - b0);
    const __m256 xd = load_f8(x.d + b0, cnt);
    for (int r = 0; r < R; ++r) {
      const uint16_t* d = (const uint16_t*)(w + r * row_bytes + nb * QB) + b0;
      _mm256_store_ps(sc[r], _mm256_mul_ps(load_h8(d, cnt), xd));
      if (FMT == F_Q4_1) macc[r] = _mm256_fmadd_ps(load_h8(d + nb, cnt), load_f8(x.s + b0, cnt), macc[r]);
    }
    for (int i = 0; i < cnt; ++i) {
      const int64_t b = b0 + i;
      const __m256i xq = _mm256_loadu_si256((const __m256i*)(x.q + b * QK));
      const __m256i xr = _mm256_loadu_si256((const __m256i*)(x.r + b * QK));
      for (int r = 0; r < R; ++r) {
        const uint8_t* qs = w + r * row_bytes + b * QB;
        __m256i p16, r16;
        if (FMT == F_Q4_1) {
          const __m256i wq = nibbles(qs);
          p16 = _mm256_maddubs_epi16(wq, xq);
          r16 = _mm256_maddubs_epi16(wq, xr);
        } else {  // maddubs wants one unsigned operand: |w| against x carrying w's sign
          const __m256i wq = _mm256_loadu_si256((const __m256i*)qs), aw = _mm256_sign_epi8(wq, wq);
          p16 = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xq, wq));
          r16 = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xr, wq));
        }
        // sum(w q) + sum(w r) / 254, in float: both integer sums are exact
        const __m256 dot = _mm256_fmadd_ps(i32_to_ps_sum(r16), _mm256_set1_ps(1.f / 254.f), i32_to_ps_sum(p16));
        acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(&sc[r][i]), dot, acc[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) y[r] = hsum(_mm256_add_ps(acc[r], macc[r]));
}

struct GemvJob {
  int fmt;
  const uint8_t* w;
  int64_t n, k, m;     // weight rows, inputs, activation rows
  const XRow* x;       // (m) quantized activation rows
  float* y;            // (m, n)
  int64_t rows_per_chunk;
};

template <int FMT>
void gemv_rows(const GemvJob& j, int64_t r0, int64_t r1) {
  const int64_t rb = row_bytes_of(FMT, j.k), nb = j.k / QK;
  for (int64_t i = 0; i < j.m; ++i) {
    float* y = j.y + i * j.n;
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) rows_dot<FMT, 4>(j.w + r * rb, rb, nb, j.x[i], y + r);
    for (; r < r1; ++r) rows_dot<FMT, 1>(j.w + r * rb, rb, nb, j.x[i], y + r);
  }
}

void gemv_chunk(const void* p, int64_t c) {
  const GemvJob& j = *(const GemvJob*)p;
  const int64_t r0 = c * j.rows_per_chunk, r1 = std::min(j.n, r0 + j.rows_per_chunk);
  if (j.fmt == F_Q4_1) gemv_rows<F_Q4_1>(j, r0, r1); else gemv_rows<F_Q8_0>(j, r0, r1);
}

// ---------------------------------------------------------------------------------------------
// Attention of one query token per head over S cached positions

struct AttnJob {
  const float* q;          // (H, D)
  const void* k;           // element (h, s, d) at k + h*k_hs + s*k_ps + d
  const void* v;
  int kv_f16;
  int64_t k_hs, k_ps, v_hs, v_ps;
  int H, Hkv, D, S, block;
  float scale;
  float* part;             // per (kv head, block, rep): [max, sum, acc(D)]
  int n_blocks;
};

// exp for x <= 0 (softmax after subtracting the max): Cephes-style range reduction and a degree-6
// polynomial, relative error ~2e-7 over the range used.
inline __m256 exp256(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
  const __m256 log2e = _mm256_set1_ps(1.44269504088896341f);
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

constexpr int MAX_REP = 16, MAX_REP_REG = 16, MAX_D = 256, MAX_BLOCK = 256;

// Sum each of 8 vectors: returns (sum(a[0]), ..., sum(a[7])).
inline __m256 reduce8(const __m256* a) {
  const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
}

inline __m256 load8(const void* base, int f16, int64_t off) {
  if (f16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)((const uint16_t*)base + off)));
  return _mm256_loadu_ps((const float*)base + off);
}

void attn_chunk(const void* p, int64_t c) {
  const AttnJob& j = *(const AttnJob*)p;
  const int h = (int)(c / j.n_blocks), blk = (int)(c % j.n_blocks);
  const int rep = j.H / j.Hkv, D = j.D;
  const int s0 = blk * j.block, s1 = std::min(j.S, s0 + j.block), n = s1 - s0;
  alignas(32) float scores[MAX_REP][MAX_BLOCK + 8];
  const float* q = j.q + (int64_t)h * rep * D;
  const int64_t kb = h * j.k_hs + (int64_t)s0 * j.k_ps, vb = h * j.v_hs + (int64_t)s0 * j.v_ps;
  // 1. scores = q . k * scale. Four positions at a time against every query of this KV head: each
  //    key chunk is converted from f16 once and used rep times, with rep x 4 accumulators in
  //    registers (rep <= 3 fits AVX2's 16; larger groups go through the same code in pieces).
  for (int s = 0; s < n; s += 4) {
    const int cnt = std::min(4, n - s);
    for (int r0 = 0; r0 < rep; r0 += 3) {
      const int nr = std::min(3, rep - r0);
      __m256 a[3][4];
      for (int r = 0; r < 3; ++r) for (int t = 0; t < 4; ++t) a[r][t] = _mm256_setzero_ps();
      if (r0 == 0) {  // the keys 32 positions ahead, one cache line per 64 bytes
        const int64_t esz = j.kv_f16 ? 2 : 4;
        for (int t = 0; t < 4; ++t)
          for (int64_t o = 0; o < D * esz; o += 64)
            _mm_prefetch((const char*)j.k + (kb + (int64_t)(s + 32 + t) * j.k_ps) * esz + o, _MM_HINT_T0);
      }
      for (int d = 0; d < D; d += 8) {
        __m256 kv[4];
        for (int t = 0; t < 4; ++t)
          kv[t] = t < cnt ? load8(j.k, j.kv_f16, kb + (int64_t)(s + t) * j.k_ps + d) : _mm256_setzero_ps();
        for (int r = 0; r < nr; ++r) {
          const __m256 qv = _mm256_loadu_ps(q + (r0 + r) * D + d);
          for (int t = 0; t < 4; ++t) a[r][t] = _mm256_fmadd_ps(qv, kv[t], a[r][t]);
        }
      }
      for (int r = 0; r < nr; ++r) {
        // horizontal sums of the 4 accumulators -> 4 scores
        const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a[r][0], a[r][1]), _mm256_hadd_ps(a[r][2], a[r][3]));
        const __m128 sum4 = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
        _mm_storeu_ps(&scores[r0 + r][s], _mm_mul_ps(sum4, _mm_set1_ps(j.scale)));
      }
    }
  }
  // 2. block-local softmax numerators, and the block's (max, sum)
  for (int r = 0; r < rep; ++r) {
    __m256 vmx = _mm256_set1_ps(-INFINITY);
    int s8 = 0;
    for (; s8 + 8 <= n; s8 += 8) vmx = _mm256_max_ps(vmx, _mm256_loadu_ps(&scores[r][s8]));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmx), _mm256_extractf128_ps(vmx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    float mx = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    for (; s8 < n; ++s8) mx = std::max(mx, scores[r][s8]);
    const __m256 vm = _mm256_set1_ps(mx);
    __m256 vs = _mm256_setzero_ps();
    int s = 0;
    for (; s + 8 <= n; s += 8) {
      const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(&scores[r][s]), vm));
      _mm256_storeu_ps(&scores[r][s], e);
      vs = _mm256_add_ps(vs, e);
    }
    float sum = hsum(vs);
    for (; s < n; ++s) { scores[r][s] = std::exp(scores[r][s] - mx); sum += scores[r][s]; }
    float* out = j.part + ((int64_t)(h * j.n_blocks + blk) * rep + r) * (D + 2);
    out[0] = mx; out[1] = sum;
  }
  // 3. acc = sum_s p_s v_s: 32 dims at a time for every query of this KV head, in registers
  for (int d0 = 0; d0 < D; d0 += 32) {
    const int nv = std::min(4, (D - d0) / 8);
    __m256 acc[MAX_REP_REG][4];
    for (int r = 0; r < rep; ++r) for (int i = 0; i < 4; ++i) acc[r][i] = _mm256_setzero_ps();
    for (int s = 0; s < n; ++s) {
      if (d0 == 0) {
        const int64_t esz = j.kv_f16 ? 2 : 4;
        for (int64_t o = 0; o < D * esz; o += 64)
          _mm_prefetch((const char*)j.v + (vb + (int64_t)(s + 32) * j.v_ps) * esz + o, _MM_HINT_T0);
      }
      __m256 vv[4];
      for (int i = 0; i < nv; ++i) vv[i] = load8(j.v, j.kv_f16, vb + (int64_t)s * j.v_ps + d0 + 8 * i);
      for (int r = 0; r < rep; ++r) {
        const __m256 ps = _mm256_set1_ps(scores[r][s]);
        for (int i = 0; i < nv; ++i) acc[r][i] = _mm256_fmadd_ps(ps, vv[i], acc[r][i]);
      }
    }
    for (int r = 0; r < rep; ++r) {
      float* out = j.part + ((int64_t)(h * j.n_blocks + blk) * rep + r) * (D + 2) + 2 + d0;
      for (int i = 0; i < nv; ++i) _mm256_storeu_ps(out + 8 * i, acc[r][i]);
    }
  }
}

struct DequantJob {
  static constexpr int64_t ROWS = 16;
  int fmt;
  const uint8_t* w;
  int64_t k;
  const int64_t* rows;
  int64_t n_rows;
  float* out;
};

void dequant_chunk(const void* p, int64_t c) {
  const DequantJob& j = *(const DequantJob*)p;
  const int64_t rb = row_bytes_of(j.fmt, j.k), nb = j.k / QK, qb = qs_bytes(j.fmt);
  const int64_t r0 = c * DequantJob::ROWS, r1 = std::min(j.n_rows, r0 + DequantJob::ROWS);
  for (int64_t i = r0; i < r1; ++i) {
    const uint8_t* src = j.w + (j.rows ? j.rows[i] : i) * rb;
    const uint16_t* ds = (const uint16_t*)(src + nb * qb);
    float* dst = j.out + i * j.k;
    for (int64_t b = 0; b < nb; ++b, dst += QK) {
      __m256i q;  // 32 x int8 weights of this block
      const __m256 d = _mm256_set1_ps(h2f(ds[b]));
      __m256 m = _mm256_setzero_ps();
      if (j.fmt == F_Q4_1) {
        q = nibbles(src + b * 16);
        m = _mm256_set1_ps(h2f(ds[nb + b]));
      } else {
        q = _mm256_loadu_si256((const __m256i*)(src + b * 32));
      }
      const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
      const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
      for (int t = 0; t < 4; ++t) {  // sign-extend (q8_0) or zero-extend (nibbles are < 16: same)
        const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[t]));
        _mm256_storeu_ps(dst + 8 * t, _mm256_fmadd_ps(d, f, m));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Shared implementations behind the C API

template <typename T>
T* grow(std::vector<T>& v, size_t n) {  // per-thread scratch that only ever grows
  if (v.size() < n) v.resize(n);
  return v.data();
}

thread_local std::vector<float> t_xf;
thread_local std::vector<int8_t> t_xq;
thread_local std::vector<float> t_part, t_f1, t_f2, t_f3;

constexpr int MAX_M = 64;  // activation rows per call (engine/kernels.py sends at most QUANT_MAX_ROWS)

void linear_impl(int fmt, const uint8_t* w, int64_t n, int64_t k, const float* x, int64_t m, float* y) {
  const int64_t nb = k / QK;
  float* f = grow(t_xf, (size_t)(2 * m * nb));
  int8_t* q = grow(t_xq, (size_t)(2 * m * k));
  XRow rows[MAX_M];
  for (int64_t i = 0; i < m; ++i) {
    rows[i] = XRow{f + 2 * i * nb, f + (2 * i + 1) * nb, q + 2 * i * k, q + (2 * i + 1) * k};
    quantize_row(x + i * k, k, rows[i]);
  }
  GemvJob j{fmt, w, n, k, m, rows, y, 32};
  pool().run(gemv_chunk, &j, (n + j.rows_per_chunk - 1) / j.rows_per_chunk);
}

void attention_impl(const float* q, const void* k, const void* v, int kv_f16, int64_t k_hs, int64_t k_ps,
                    int64_t v_hs, int64_t v_ps, int H, int Hkv, int D, int S, float scale, float* out) {
  const int block = MAX_BLOCK, n_blocks = (S + block - 1) / block, rep = H / Hkv;
  float* part = grow(t_part, (size_t)Hkv * n_blocks * rep * (D + 2));
  AttnJob j{q, k, v, kv_f16, k_hs, k_ps, v_hs, v_ps, H, Hkv, D, S, block, scale, part, n_blocks};
  pool().run(attn_chunk, &j, (int64_t)Hkv * n_blocks);
  for (int h = 0; h < Hkv; ++h) {  // merge the blocks' partial softmax states
    for (int r = 0; r < rep; ++r) {
      float mx = -INFINITY;
      for (int b = 0; b < n_blocks; ++b) mx = std::fmax(mx, part[((int64_t)(h * n_blocks + b) * rep + r) * (D + 2)]);
      float* o = out + (int64_t)(h * rep + r) * D;
      std::memset(o, 0, sizeof(float) * D);
      float total = 0.f;
      for (int b = 0; b < n_blocks; ++b) {
        const float* pp = part + ((int64_t)(h * n_blocks + b) * rep + r) * (D + 2);
        const float w = std::exp(pp[0] - mx);
        total += w * pp[1];
        for (int d = 0; d < D; ++d) o[d] += w * pp[2 + d];
      }
      const float inv = 1.f / total;
      for (int d = 0; d < D; ++d) o[d] *= inv;
    }
  }
}

void rms_norm(const float* x, const float* w, int64_t n, float eps, float* y) {
  double ss = 0.0;  // as F.rms_norm: mean of squares in fp32 accumulation is enough, double is free here
  for (int64_t i = 0; i < n; ++i) ss += (double)x[i] * x[i];
  const float r = 1.f / std::sqrt((float)(ss / n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * r * w[i];
}

// Rotate-half RoPE (as engine/model.py's apply_rope) of n_heads vectors of D, in place.
void rope(float* x, int n_heads, int D, const float* cos, const float* sin) {
  const int half = D / 2;
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + (int64_t)h * D;
    for (int i = 0; i < half; ++i) {
      const float a = v[i], b = v[i + half];
      v[i] = a * cos[i] - b * sin[i];
      v[i + half] = b * cos[i + half] + a * sin[i + half];
    }
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// C API (argument shapes in engine/native.py)

PB_API int pb_abi_version() { return 5; }

PB_API int pb_cpu_supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

PB_API void pb_set_threads(int n, int64_t spin_us) {
  if (n < 1) n = 1;
  pool().spin_us = spin_us;
  pool().resize(n - 1);
  g_threads = n;
}

PB_API int pb_get_threads() { return g_threads; }

// Pool counters since the last call (then reset): jobs run, stalls waiting on a preempted helper,
// oversubscribed windows, jobs run by the caller alone during a backoff.
PB_API void pb_pool_stats(uint64_t* out) {
  Pool& p = pool();
  out[0] = p.n_jobs; out[1] = p.n_stalls; out[2] = p.n_busy; out[3] = p.n_alone;
  p.n_jobs = p.n_stalls = p.n_busy = p.n_alone = 0;
}

// Tests only: make the helpers stall for sleep_us in every `every`-th job (0: never).
PB_API void pb_pool_test_stall(int64_t every, int64_t sleep_us) {
  pool().stall_every = every;
  pool().stall_sleep_us = sleep_us;
  pool().reset_policy();
}

// y (m, n) = x (m, k) @ dequant(w (n, k)).T. w: n rows of k/32 blocks in format fmt.
PB_API int pb_linear(int fmt, const uint8_t* w, int64_t n, int64_t k, const float* x, int64_t m, float* y) {
  if (m < 1 || m > MAX_M || k % QK) return -1;
  linear_impl(fmt, w, n, k, x, m, y);
  return 0;
}

// The activation quantization alone, for tests: d, s (k/32 floats each), q, r (k int8 each).
PB_API void pb_quantize_row(const float* x, int64_t k, float* d, float* s, int8_t* q, int8_t* r) {
  quantize_row(x, k, XRow{d, s, q, r});
}

// out (len(rows), k) float32 = dequant of the listed rows of w (rows == nullptr: rows 0..n_rows-1).
PB_API void pb_dequantize(int fmt, const uint8_t* w, int64_t k, const int64_t* rows, int64_t n_rows, float* out) {
  DequantJob j{fmt, w, k, rows, n_rows, out};
  const int64_t n_chunks = (n_rows + DequantJob::ROWS - 1) / DequantJob::ROWS;
  // On the caller alone: a whole matrix is dequantized for a prefill pass, between torch's GEMMs,
  // whose OpenMP workers hold the other core; a pool helper woken here then spins beside them
  // (2,048-token prefill: 505-524 tok/s alone against 445-468 with the helper). Embedding lookups
  // (a few rows) are too small to share anyway.
  for (int64_t c = 0; c < n_chunks; ++c) dequant_chunk(&j, c);
}

// Attention of one new token: q (H, D) float32 (already rotated), out (H, D) float32; K/V element
// (h, s, d) at base + h*hs + s*ps + d (in elements of their dtype: f16 if kv_f16 else f32); S
// positions; H a multiple of Hkv (grouped-query attention). Returns -1 for an unsupported shape.
PB_API int pb_attention_decode(const float* q, const void* k, const void* v, int kv_f16, int64_t k_hs, int64_t k_ps,
                               int64_t v_hs, int64_t v_ps, int H, int Hkv, int D, int S, float scale, float* out) {
  if (H % Hkv || H / Hkv > MAX_REP || D % 8 || D > MAX_D || S < 1) return -1;
  attention_impl(q, k, v, kv_f16, k_hs, k_ps, v_hs, v_ps, H, Hkv, D, S, scale, out);
  return 0;
}

// One decoder block for one token, in two halves around the KV cache update (which stays in
// Python: the cache's update(positions, k, v) contract is where patches such as int8 KV hook in).
// Same math as engine/model.py's Block.forward for T = 1.
struct LayerW {
  int32_t fmt_qkv, fmt_o, fmt_13, fmt_2;
  const uint8_t *wqkv, *wo, *w13, *w2;
  const float *attn_norm, *ffn_norm;
  float eps;
  int32_t dim, hidden, H, Hkv, D;
};

// q (H*D), k (Hkv*D), v (Hkv*D) of token x (dim): RMSNorm, the fused qkv product, RoPE on q and k.
PB_API void pb_block_pre(const LayerW* L, const float* x, const float* cos, const float* sin, float* q, float* k,
                         float* v) {
  const int q_out = L->H * L->D, kv_out = L->Hkv * L->D;
  float* xn = grow(t_f1, (size_t)L->dim);
  float* qkv = grow(t_f2, (size_t)(q_out + 2 * kv_out));
  rms_norm(x, L->attn_norm, L->dim, L->eps, xn);
  linear_impl(L->fmt_qkv, L->wqkv, q_out + 2 * kv_out, L->dim, xn, 1, qkv);
  rope(qkv, L->H, L->D, cos, sin);
  rope(qkv + q_out, L->Hkv, L->D, cos, sin);
  std::memcpy(q, qkv, sizeof(float) * q_out);
  std::memcpy(k, qkv + q_out, sizeof(float) * kv_out);
  std::memcpy(v, qkv + q_out + kv_out, sizeof(float) * kv_out);
}

// x (dim) += wo(attention(q, cache)); x += w2(silu(w1 h) * w3 h), h = RMSNorm(x). In place.
PB_API int pb_block_post(const LayerW* L, float* x, const float* q, const void* k, const void* v, int kv_f16,
                         int64_t k_hs, int64_t k_ps, int64_t v_hs, int64_t v_ps, int S) {
  if (L->H % L->Hkv || L->H / L->Hkv > MAX_REP || L->D % 8 || L->D > MAX_D || S < 1) return -1;
  const int q_out = L->H * L->D;
  float* att = grow(t_f1, (size_t)std::max<int64_t>(q_out, L->dim));
  float* tmp = grow(t_f2, (size_t)std::max<int64_t>(L->dim, L->hidden));
  float* gu = grow(t_f3, (size_t)(2 * L->hidden));
  attention_impl(q, k, v, kv_f16, k_hs, k_ps, v_hs, v_ps, L->H, L->Hkv, L->D, S, 1.f / std::sqrt((float)L->D), att);
  linear_impl(L->fmt_o, L->wo, L->dim, q_out, att, 1, tmp);
  for (int i = 0; i < L->dim; ++i) x[i] += tmp[i];
  rms_norm(x, L->ffn_norm, L->dim, L->eps, att);
  linear_impl(L->fmt_13, L->w13, 2 * L->hidden, L->dim, att, 1, gu);
  for (int i = 0; i < L->hidden; ++i) {
    const float g = gu[i];
    tmp[i] = g / (1.f + std::exp(-g)) * gu[L->hidden + i];  // silu(gate) * up
  }
  linear_impl(L->fmt_2, L->w2, L->dim, L->hidden, tmp, 1, att);
  for (int i = 0; i < L->dim; ++i) x[i] += att[i];
  return 0;
}
