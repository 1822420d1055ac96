// pairbench-engine native kernels: the CPU decode hot path in plain C++ (AVX2 + FMA + F16C, with
// AVX-VNNI / AVX-512 VNNI variants of the integer dot products chosen at run time).
//
// Built by engine/native.py with the system compiler into a cache directory keyed by this file's
// hash, and called through ctypes (no torch headers: it compiles in seconds and does not depend on
// torch's C++ ABI). Everything here has a pure-PyTorch reference in engine/kernels.py and a unit
// test against it (tests/engine/test_kernels.py).
//
// What is here, and where the idea comes from:
//  * products of a small batch of activation rows (one per sequence of a decode step, B <= 64)
//    with GGUF block-quantized weights, kept exactly as the GGUF stores them (Q4_1: 32 weights =
//    fp16 scale d, fp16 min m, 16 bytes of nibbles; Q8_0: fp16 d, 32 int8). Each weight block is
//    loaded and widened once and multiplied by every row of the batch while it is in registers, so
//    the weights stream through the core once per decode step, not once per sequence (the batched
//    GEMV of llama.cpp's server and vLLM's continuous batching). Each activation row is quantized
//    per 32-block (llama.cpp's q8_1 idea) to a 15-bit integer, 254 * q + r: q the int8 rounding
//    llama.cpp makes and r its remainder digit. A block's 32 products are summed exactly in integers
//    (vpmaddwd on AVX2, vpdpwssd on AVX-VNNI and AVX-512 VNNI), then scaled in float. Because every
//    block sum is exact, the result is bit-identical whatever the batch size, the grouping of rows
//    or the instruction set: a sequence decodes the same tokens alone and in a batch, on any path.
//  * dequantization of whole matrices to fp32 (prefill hands the result to MKL sgemm) and of single
//    embedding rows;
//  * single-query attention of each sequence of a batch over its own KV slot (f16 or f32), split
//    over positions in blocks whose partial softmax states are merged at the end (flash-decoding,
//    Dao et al. 2023);
//  * a tiny work-sharing pool: the calling thread and (threads - 1) helpers claim fixed-size chunks
//    from one atomic counter. There is no barrier to wait at: a helper that the OS has not scheduled
//    simply claims nothing and the caller does the work. A helper preempted in the middle of a chunk
//    still makes the caller wait until it runs again; the pool then works alone for a while while
//    that keeps costing more than the second core gives (Pool::run). (The OpenMP barriers of
//    multi-threaded ATen GEMVs stalled for whole time slices at every op, docs/perf.md.) Helpers
//    spin for a short while after each job, then sleep.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#define PB_API extern "C" __attribute__((visibility("default")))

// The AVX-512 policy passes __m512i between functions that all carry its target (and are inlined).
#pragma GCC diagnostic ignored "-Wpsabi"

// AVX-VNNI (vpdpwssd on 256-bit registers, VEX-encoded): GCC 11 and clang 12 know the target.
#if defined(__clang__) ? (__clang_major__ >= 12) : (__GNUC__ >= 11)
#define PB_HAVE_AVXVNNI 1
#else
#define PB_HAVE_AVXVNNI 0
#endif

namespace {

constexpr int QK = 32;  // weights per block, both formats
// In memory, a weight row of nb = k/32 blocks is "split": every block's quants first, then every
// block's fp16 scale d, then (q4_1) every block's fp16 min m:
//   q4_1: qs[nb][16] (element j in the low nibble of byte j, j + 16 in its high nibble), d[nb], m[nb]
//   q8_0: qs[nb][32] (int8), d[nb]
// The same bytes as GGUF's blocks (d, [m,] qs), regrouped by engine/kernels.py's ``split_rows`` at
// conversion time, so that 8 scales load and convert with one instruction. 20 / 34 bytes per block.
// An activation row is quantized per block too: XRow below.
struct XRow {
  float* d;    // (nb) int8 scales amax / 127: x ~= d * (q + r / 254) = d * x16 / 254
  float* s;    // (nb) sums of the 32 float inputs of each block (q4_1's min term: m * sum x)
  int16_t* x;  // (nb, 32) 254 * q + r, |x16| <= 32385: q = x / d rounded (the int8 rounding
               // llama.cpp's q8_1 makes), r = (x / d - q) * 254 rounded (its remainder, a second
               // digit), so decode's products stay within ~1e-4 of fp32
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

// When the pool's caller works alone (see Pool): a function of the timeline of its two-thread jobs
// only (start, end, the caller's wait for helpers; nanoseconds of one clock), so tests replay
// timelines through it (pb_pool_policy_replay) as well as running live jobs.
struct Policy {
  // The stall share is judged over about the last WINDOW_NS of two-thread jobs (sums decayed by
  // exp(-age / WINDOW_NS)), and only once the current streak of two-thread work (no gap between
  // jobs longer than WINDOW_NS) has lasted MIN_HISTORY_NS: a new helper's first jobs wait
  // milliseconds for it (on a VM, for the idle second vCPU to be scheduled again).
  static constexpr double WINDOW_NS = 100e6, MIN_HISTORY_NS = 50e6, STALL_SHARE = 0.25;
  static constexpr int64_t BACKOFF_MIN_NS = 100000000, BACKOFF_MAX_NS = 2000000000;
  double ew_wall_ns = 0, ew_wait_ns = 0;
  int64_t last_end = -1, streak_start = 0, alone_until = 0, backoff = 0;

  bool alone(int64_t now) const { return backoff && now < alone_until; }

  void back_off(int64_t now) {  // 100 ms, doubling to 2 s while it recurs
    backoff = std::min(BACKOFF_MAX_NS, std::max(BACKOFF_MIN_NS, backoff * 2));
    alone_until = now + backoff;
  }

  void job(int64_t start, int64_t end, double wait_ns) {
    // (a backoff in force keeps the streak: its history is what the backoff is about)
    if (last_end < 0 || ((double)(start - last_end) > WINDOW_NS && !backoff)) streak_start = start;
    const double keep = last_end < 0 ? 0.0 : std::exp(-(double)(end - last_end) / WINDOW_NS);
    last_end = end;
    ew_wall_ns = ew_wall_ns * keep + (double)(end - start);
    ew_wait_ns = ew_wait_ns * keep + wait_ns;
    if (wait_ns > 0 && (double)(end - streak_start) >= MIN_HISTORY_NS && ew_wait_ns > STALL_SHARE * ew_wall_ns) {
      back_off(end);
    } else if (backoff && end > alone_until + 4 * backoff) {
      backoff = 0;  // a quiet spell: forget the history
    }
  }
};

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
  //    second core is worth. So the caller keeps (Policy) decayed sums of its jobs' wall time and of their
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
  static int64_t now_ns() { return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count(); }
  int64_t stall_us = 50;
  static constexpr int CHECK_JOBS = 128;
  Policy policy;

  void reset_policy() { policy = Policy{}; }  // a new pool (or a test's new stall pattern) starts with no history
  uint64_t n_jobs = 0, n_stalls = 0, n_alone = 0, n_busy = 0;

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
  static double ns(Clock::duration d) { return std::chrono::duration<double, std::nano>(d).count(); }

  void check_oversubscribed() {
    static thread_local Window w;
    const Clock::time_point now = Clock::now();
    if (w.wait0 < 0) {
      w = Window{now, now, runqueue_wait_ns(), 0, 0};
      return;
    }
    const bool gap = now - w.last > std::chrono::milliseconds(5);
    w.last = now;
    if (!gap && ++w.jobs < CHECK_JOBS) return;
    // Every CHECK_JOBS jobs, and after a gap between jobs: a gap is either idle time (the caller
    // ran other code; the window starts afresh) or the caller itself waiting for a core, preempted
    // between two jobs, which is oversubscription as much as a wait inside a window is.
    const int64_t wait = runqueue_wait_ns();
    const double wall_ns = ns(now - w.t0);
    int busy_run = 0;
    if (wait >= 0 && wall_ns > 0 && (double)(wait - w.wait0) > 0.05 * wall_ns) {
      ++n_busy;
      busy_run = w.busy_run + 1;
      if (busy_run >= 2) policy.back_off(now_ns());
    } else if (gap) {
      busy_run = 0;  // idle: start afresh
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
    if (policy.alone(now_ns())) {
      ++n_alone;
      for (int64_t i = 0; i < n; ++i) f(c, i);
      return;
    }
    const int64_t start = now_ns();
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
    const Clock::time_point t_end = Clock::now();
    const double wait_ns = spins && !waking ? ns(t_end - t0) : 0.0;
    if (wait_ns > 1e3 * (double)stall_us) ++n_stalls;
    policy.job(start, std::chrono::duration_cast<std::chrono::nanoseconds>(t_end.time_since_epoch()).count(), wait_ns);
  }
};

Pool& pool() {
  static Pool p;
  return p;
}

int g_threads = 1;


// ---------------------------------------------------------------------------------------------
// Activation quantization (one row of k floats -> XRow of k/32 blocks)

// d (int8 scale), s (sum), x16 (254 q + r) of each block; q and r themselves too when asked (tests).
// Elementwise the arithmetic is the scalar definition (kernels.quantize_activation_ref): v = x / d
// as x * (1 / d), q = round half to even, r = round((v - q) * 254); the block sum adds 8-lane partials.
void quantize_row(const float* x, int64_t k, XRow out, int8_t* q_out = nullptr, int8_t* r_out = nullptr) {
  const __m256 sign = _mm256_set1_ps(-0.f), c254 = _mm256_set1_ps(254.f);
  const __m256 lo = _mm256_set1_ps(-127.f), hi = _mm256_set1_ps(127.f);
  constexpr int RN = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  for (int64_t b = 0; b < k / QK; ++b) {
    const float* xb = x + b * QK;
    __m256 v[4], amax = _mm256_setzero_ps();
    for (int t = 0; t < 4; ++t) {
      v[t] = _mm256_loadu_ps(xb + 8 * t);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[t]));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    const float mx = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    const float d = mx / 127.f, id = d > 0.f ? 1.f / d : 0.f;
    out.d[b] = d;
    out.s[b] = hsum(_mm256_add_ps(_mm256_add_ps(v[0], v[1]), _mm256_add_ps(v[2], v[3])));
    const __m256 vid = _mm256_set1_ps(id);
    __m256i x32[4];
    for (int t = 0; t < 4; ++t) {
      const __m256 y = _mm256_mul_ps(v[t], vid), q = _mm256_round_ps(y, RN);
      const __m256 r = _mm256_min_ps(hi, _mm256_max_ps(lo, _mm256_round_ps(_mm256_mul_ps(_mm256_sub_ps(y, q), c254), RN)));
      x32[t] = _mm256_cvtps_epi32(_mm256_fmadd_ps(q, c254, r));  // exact: |254 q + r| < 2^15
      if (q_out) {
        alignas(32) int32_t qi[8], ri[8];
        _mm256_store_si256((__m256i*)qi, _mm256_cvtps_epi32(q));
        _mm256_store_si256((__m256i*)ri, _mm256_cvtps_epi32(r));
        for (int i = 0; i < 8; ++i) { q_out[b * QK + 8 * t + i] = (int8_t)qi[i]; r_out[b * QK + 8 * t + i] = (int8_t)ri[i]; }
      }
    }
    // packs interleaves 128-bit halves: (a0-3 b0-3 a4-7 b4-7) -> permute to (a0-7 b0-7)
    for (int t = 0; t < 2; ++t)
      _mm256_storeu_si256((__m256i*)(out.x + b * QK + 16 * t),
                          _mm256_permute4x64_epi64(_mm256_packs_epi32(x32[2 * t], x32[2 * t + 1]), 0xD8));
  }
}

// ---------------------------------------------------------------------------------------------
// Block dot products: one policy per instruction set. A policy widens one weight block to 32 int16
// (W) and returns the exact integer products with one activation block as 8 int32 lanes, lane j
// holding elements 2j, 2j+1, 16+2j and 17+2j. Every policy yields the same lanes, so the float
// arithmetic after them, and hence every result, is the same on every path.

enum Isa : int { ISA_AVX2 = 0, ISA_AVXVNNI = 1, ISA_AVX512VNNI = 2, N_ISA = 3 };

inline __m128i nibbles_lo(__m128i raw) { return _mm_and_si128(raw, _mm_set1_epi8(0x0F)); }
inline __m128i nibbles_hi(__m128i raw) { return _mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0x0F)); }

struct W16 { __m256i lo, hi; };  // elements 0..15 and 16..31 of a block as int16

struct Avx2 {
  using W = W16;
  static W q4_1(const uint8_t* qs) {
    const __m128i raw = _mm_loadu_si128((const __m128i*)qs);
    return {_mm256_cvtepu8_epi16(nibbles_lo(raw)), _mm256_cvtepu8_epi16(nibbles_hi(raw))};
  }
  static W q8_0(const uint8_t* qs) {
    return {_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)qs)),
            _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(qs + 16)))};
  }
  static __m256i dot(const W& w, const int16_t* x) {
    return _mm256_add_epi32(_mm256_madd_epi16(w.lo, _mm256_loadu_si256((const __m256i*)x)),
                            _mm256_madd_epi16(w.hi, _mm256_loadu_si256((const __m256i*)(x + 16))));
  }
};

#if PB_HAVE_AVXVNNI
struct AvxVnni : Avx2 {  // the second half's multiply-add fused with the first's sum (vpdpwssd)
  __attribute__((target("avxvnni"))) static __m256i dot(const W& w, const int16_t* x) {
    return _mm256_dpwssd_avx_epi32(_mm256_madd_epi16(w.lo, _mm256_loadu_si256((const __m256i*)x)), w.hi,
                                   _mm256_loadu_si256((const __m256i*)(x + 16)));
  }
};
#endif

#define PB_AVX512 "avx512f,avx512bw,avx512vl,avx512vnni"
struct Avx512Vnni {  // a whole block per 512-bit register: one widening, one vpdpwssd, one fold
  using W = __m512i;
  __attribute__((target(PB_AVX512))) static W q4_1(const uint8_t* qs) {
    const __m128i raw = _mm_loadu_si128((const __m128i*)qs);
    return _mm512_cvtepu8_epi16(_mm256_set_m128i(nibbles_hi(raw), nibbles_lo(raw)));
  }
  __attribute__((target(PB_AVX512))) static W q8_0(const uint8_t* qs) {
    return _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)qs));
  }
  __attribute__((target(PB_AVX512))) static __m256i dot(const W& w, const int16_t* x) {
    const __m512i p = _mm512_dpwssd_epi32(_mm512_setzero_si512(), w, _mm512_loadu_si512(x));  // 16 pairs
    return _mm256_add_epi32(_mm512_castsi512_si256(p), _mm512_extracti64x4_epi64(p, 1));    // pair j + pair j+8
  }
};

constexpr int64_t PREFETCH_BYTES = 8192;

inline int64_t qs_bytes(int fmt) { return fmt == F_Q4_1 ? 16 : 32; }
inline int64_t row_bytes_of(int fmt, int64_t k) { return (k / QK) * (fmt == F_Q4_1 ? 20 : 34); }

// The first cnt (1..8) lanes set: a row's last group of blocks is loaded with a masked load, which
// never touches the memory beyond it (a copy through a stack buffer stalled on store forwarding:
// with 18 blocks per row, a third of the groups, it cost as much as the blocks themselves).
inline __m256i lanes(int cnt) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(cnt), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
// 8 fp16 values (fewer than 8: zero-padded) -> floats
inline __m256 load_h8(const uint16_t* p, int cnt) {
  if (cnt == 8) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
  if (cnt % 2 == 0)  // whole 32-bit pairs: a masked load reads none beyond p[cnt - 1]
    return _mm256_cvtph_ps(_mm_maskload_epi32((const int*)p, _mm256_castsi256_si128(lanes(cnt / 2))));
  alignas(16) uint16_t t[8] = {0};
  for (int i = 0; i < cnt; ++i) t[i] = p[i];
  return _mm256_cvtph_ps(_mm_load_si128((const __m128i*)t));
}
inline __m256 load_f8(const float* p, int cnt) {
  if (cnt == 8) return _mm256_loadu_ps(p);
  return _mm256_maskload_ps(p, lanes(cnt));
}

// R weight rows (consecutive, row_bytes apart) against G activation rows: y[i * ys + r] = row r . x[i].
// Per block: the weights are widened once, then each activation row adds its exact block sum,
// scaled by d_w * d_x, to its own 8 float lanes; per output, the lanes over 254 plus (q4_1) the
// min terms m_w * sum(x), summed. The lane-wise arithmetic of an output never depends on R or G.
template <class P, int FMT, int R, int G>
inline void dots(const uint8_t* w, int64_t row_bytes, int64_t nb, const XRow* x, float* y, int64_t ys,
                 bool prefetch) {
  constexpr int64_t QB = FMT == F_Q4_1 ? 16 : 32;
  __m256 acc[R][G];
  for (int r = 0; r < R; ++r) for (int i = 0; i < G; ++i) acc[r][i] = _mm256_setzero_ps();
  // Software prefetch PREFETCH_BYTES ahead of this row group (rows are contiguous, so this covers
  // the whole stream): one core keeps more misses in flight than its hardware prefetcher does with
  // the row's three regions; measured 5.4 -> 8.4 GB/s from DRAM on a 2-vCPU guest (docs/perf.md).
  // Into L2 (T1), not L1: a group's ~40 prefetches at once into L1 held its miss buffers, and the
  // demand loads queued behind them; with T1 the Q8_0 lm_head (30 MB, one row) took 1.2 ms instead
  // of 3.5, the 30 Q4_1 layers 6.1 instead of 6.5 (AMD EPYC Zen 4 guest, one thread, issue 35).
  // A prefetch past the end of the matrix is harmless (it never faults).
  if (prefetch)
    for (int64_t o = 0; o < R * row_bytes; o += 64) _mm_prefetch((const char*)(w + PREFETCH_BYTES + o), _MM_HINT_T1);
  __m256 macc[R][G];  // q4_1's min terms, per group of 8 blocks (kept beside the scales: one pass)
  for (int r = 0; r < R; ++r) for (int i = 0; i < G; ++i) macc[r][i] = _mm256_setzero_ps();
  alignas(32) float sc[R][G][8];
  for (int64_t b0 = 0; b0 < nb; b0 += 8) {
    const int cnt = (int)std::min<int64_t>(8, nb - b0);
    for (int r = 0; r < R; ++r) {
      const uint16_t* d = (const uint16_t*)(w + r * row_bytes + nb * QB) + b0;
      const __m256 dw = load_h8(d, cnt);
      for (int i = 0; i < G; ++i) _mm256_store_ps(sc[r][i], _mm256_mul_ps(dw, load_f8(x[i].d + b0, cnt)));
      if constexpr (FMT == F_Q4_1) {
        const __m256 mw = load_h8(d + nb, cnt);
        for (int i = 0; i < G; ++i) macc[r][i] = _mm256_fmadd_ps(mw, load_f8(x[i].s + b0, cnt), macc[r][i]);
      }
    }
    for (int t = 0; t < cnt; ++t) {
      const int64_t b = b0 + t;
      for (int r = 0; r < R; ++r) {
        const uint8_t* qs = w + r * row_bytes + b * QB;
        typename P::W wb;
        if constexpr (FMT == F_Q4_1) wb = P::q4_1(qs); else wb = P::q8_0(qs);
        for (int i = 0; i < G; ++i) {
          const __m256 dot = _mm256_cvtepi32_ps(P::dot(wb, x[i].x + b * QK));  // exact: |lane| < 2^24
          acc[r][i] = _mm256_fmadd_ps(dot, _mm256_broadcast_ss(&sc[r][i][t]), acc[r][i]);
        }
      }
    }
  }
  const __m256 c254 = _mm256_set1_ps(254.f);
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < G; ++i)  // a division, not * (1/254): exact when it can be
      y[i * ys + r] = hsum(_mm256_add_ps(_mm256_div_ps(acc[r][i], c254), macc[r][i]));
}

struct GemvJob {
  int fmt, isa;
  const uint8_t* w;
  int64_t n, k, m;     // weight rows, inputs, activation rows
  const XRow* x;       // (m) quantized activation rows
  float* y;            // (m, n)
  int64_t rows_per_chunk;
};

template <class P, int FMT, int R, int G>
void gemv_pass(const GemvJob& j, int64_t r0, int64_t r1, int64_t i0, bool prefetch) {
  const int64_t rb = row_bytes_of(FMT, j.k), nb = j.k / QK;
  int64_t r = r0;
  for (; r + R <= r1; r += R) dots<P, FMT, R, G>(j.w + r * rb, rb, nb, j.x + i0, j.y + i0 * j.n + r, j.n, prefetch);
  for (; r < r1; ++r) dots<P, FMT, 1, G>(j.w + r * rb, rb, nb, j.x + i0, j.y + i0 * j.n + r, j.n, prefetch);
}

// Weight rows r0..r1 against every activation row, in passes of up to 8 activation rows (one
// activation row: against 4 weight rows at a time). A pass of G rows widens each weight block once
// for all G; the first pass prefetches the weights, later ones (B > 8) find them in cache. A pass of
// 8 holds 16 accumulators (q4_1: sums and min terms) and spills a little, and still beats the passes
// of 4 + 2 + 1 this replaced (AVX2, Zen 3, one thread, min of 40 interleaved repetitions, time per
// product of the 3072 x 576 matrix: 8 rows 7% less, 7 rows 9%, 5 and 6 rows 16-17%, 3 rows 18%;
// 1, 2 and 4 rows the same; the 49152-row head at 8 rows 8% less). The outputs are bit-identical:
// an output's lane arithmetic never depends on G.
template <class P, int FMT>
void gemv_rows(const GemvJob& j, int64_t r0, int64_t r1) {
  for (int64_t i = 0; i < j.m;) {
    const int64_t g = std::min<int64_t>(8, j.m - i);
    const bool pf = i == 0;
    switch (g) {
      case 1: gemv_pass<P, FMT, 4, 1>(j, r0, r1, i, pf); break;
      case 2: gemv_pass<P, FMT, 1, 2>(j, r0, r1, i, pf); break;
      case 3: gemv_pass<P, FMT, 1, 3>(j, r0, r1, i, pf); break;
      case 4: gemv_pass<P, FMT, 1, 4>(j, r0, r1, i, pf); break;
      case 5: gemv_pass<P, FMT, 1, 5>(j, r0, r1, i, pf); break;
      case 6: gemv_pass<P, FMT, 1, 6>(j, r0, r1, i, pf); break;
      case 7: gemv_pass<P, FMT, 1, 7>(j, r0, r1, i, pf); break;
      default: gemv_pass<P, FMT, 1, 8>(j, r0, r1, i, pf); break;
    }
    i += g;
  }
}

// One compiled copy per instruction set: each wrapper carries its target, and `flatten` inlines the
// whole kernel into it, so the policy's instructions are compiled for that target only.
using RowsFn = void (*)(const GemvJob&, int64_t, int64_t);
__attribute__((flatten)) void rows_avx2_q4_1(const GemvJob& j, int64_t a, int64_t b) { gemv_rows<Avx2, F_Q4_1>(j, a, b); }
__attribute__((flatten)) void rows_avx2_q8_0(const GemvJob& j, int64_t a, int64_t b) { gemv_rows<Avx2, F_Q8_0>(j, a, b); }
#if PB_HAVE_AVXVNNI
__attribute__((target("avxvnni"), flatten)) void rows_avxvnni_q4_1(const GemvJob& j, int64_t a, int64_t b) {
  gemv_rows<AvxVnni, F_Q4_1>(j, a, b);
}
__attribute__((target("avxvnni"), flatten)) void rows_avxvnni_q8_0(const GemvJob& j, int64_t a, int64_t b) {
  gemv_rows<AvxVnni, F_Q8_0>(j, a, b);
}
#endif
__attribute__((target(PB_AVX512), flatten)) void rows_avx512_q4_1(const GemvJob& j, int64_t a, int64_t b) {
  gemv_rows<Avx512Vnni, F_Q4_1>(j, a, b);
}
__attribute__((target(PB_AVX512), flatten)) void rows_avx512_q8_0(const GemvJob& j, int64_t a, int64_t b) {
  gemv_rows<Avx512Vnni, F_Q8_0>(j, a, b);
}

const RowsFn ROWS[N_ISA][2] = {
    {rows_avx2_q4_1, rows_avx2_q8_0},
#if PB_HAVE_AVXVNNI
    {rows_avxvnni_q4_1, rows_avxvnni_q8_0},
#else
    {nullptr, nullptr},
#endif
    {rows_avx512_q4_1, rows_avx512_q8_0},
};

const char* const ISA_NAMES[N_ISA] = {"avx2", "avxvnni", "avx512vnni"};

bool isa_supported(int isa) {
  __builtin_cpu_init();
  switch (isa) {
    case ISA_AVX2: return true;  // the library's baseline (pb_cpu_supported)
    case ISA_AVXVNNI: return PB_HAVE_AVXVNNI && __builtin_cpu_supports("avxvnni");
    case ISA_AVX512VNNI:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
    default: return false;
  }
}

int best_isa() {
  for (int isa = N_ISA - 1; isa > 0; --isa)
    if (isa_supported(isa)) return isa;
  return ISA_AVX2;
}

int g_isa = -1;  // the dot-product path of every later product; -1: not chosen yet (best_isa())

int current_isa() {
  if (g_isa < 0) g_isa = best_isa();
  return g_isa;
}

void gemv_chunk(const void* p, int64_t c) {
  const GemvJob& j = *(const GemvJob*)p;
  const int64_t r0 = c * j.rows_per_chunk, r1 = std::min(j.n, r0 + j.rows_per_chunk);
  ROWS[j.isa][j.fmt == F_Q4_1 ? 0 : 1](j, r0, r1);
}

// ---------------------------------------------------------------------------------------------
// Attention of one query token per head over S cached positions, for each sequence of a batch

// One sequence: element (h, s, d) of its keys at k + h*k_hs + s*k_ps + d (its own KV slot).
struct AttnOne {
  const float* q;          // (H, D)
  const void* k;
  const void* v;
  int kv_f16;
  int64_t k_hs, k_ps, v_hs, v_ps;
  int H, Hkv, D, S, block;
  float scale;
  float* part;             // per (kv head, block, rep): [max, sum, acc(D)]
  int n_blocks;
};

constexpr int MAX_B = 64;  // sequences per decode step, activation rows per product

// A batch: the chunks of every sequence, numbered one after the other (sequence b owns chunks
// chunk0[b] .. chunk0[b + 1] - 1), so one pool job covers the whole step's attention.
struct AttnJob {
  int B;
  AttnOne seq[MAX_B];
  int64_t chunk0[MAX_B + 1];
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

inline __m256 load8(const void* base, int f16, int64_t off) {
  if (f16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)((const uint16_t*)base + off)));
  return _mm256_loadu_ps((const float*)base + off);
}

// One chunk (KV head h, block blk of positions) of one sequence. REP is the group size (query heads per
// KV head) when known at compile time, so the accumulators below are registers, not stack memory;
// 0 for any other group size. F16: the cache is f16 (attn_chunk compiles groups of 1-4 for f16 caches,
// the default; an f32 cache takes the generic form). Every variant does the same additions in the
// same order (a score lane over ascending d, a value lane over ascending s), so they give identical bits.
template <int REP, int F16>
void attn_one_chunk_t(const AttnOne& j, int64_t c) {
  const int h = (int)(c / j.n_blocks), blk = (int)(c % j.n_blocks);
  const int rep = REP ? REP : j.H / j.Hkv, D = j.D;
  const int s0 = blk * j.block, s1 = std::min(j.S, s0 + j.block), n = s1 - s0;
  const int64_t esz = F16 ? 2 : 4;
  alignas(32) float scores[MAX_REP][MAX_BLOCK + 8];
  const float* q = j.q + (int64_t)h * rep * D;
  const int64_t kb = h * j.k_hs + (int64_t)s0 * j.k_ps, vb = h * j.v_hs + (int64_t)s0 * j.v_ps;
  // 1. scores = q . k * scale. Four positions at a time against up to 3 queries of this KV head:
  //    each key chunk is converted from f16 once and used for every query, with 3 x 4 accumulators,
  //    3 query chunks and one key chunk in AVX2's 16 registers (larger groups go in pieces).
  auto four = [&](int s, auto full) {  // positions s .. s+3 (full) or s .. n-1
    const int cnt = decltype(full)::value ? 4 : n - s;
    for (int r0 = 0; r0 < rep; r0 += 3) {
      const int nr = std::min(3, rep - r0);
      __m256 a[3][4];
      for (int r = 0; r < 3; ++r) for (int t = 0; t < 4; ++t) a[r][t] = _mm256_setzero_ps();
      if (r0 == 0) {  // the keys 32 positions ahead, one cache line per 64 bytes
        for (int t = 0; t < 4; ++t)
          for (int64_t o = 0; o < D * esz; o += 64)
            _mm_prefetch((const char*)j.k + (kb + (int64_t)(s + 32 + t) * j.k_ps) * esz + o, _MM_HINT_T0);
      }
      for (int d = 0; d < D; d += 8) {
        __m256 qv[3];
        for (int r = 0; r < nr; ++r) qv[r] = _mm256_loadu_ps(q + (r0 + r) * D + d);
        for (int t = 0; t < 4; ++t) {
          const __m256 kv = t < cnt ? load8(j.k, F16, kb + (int64_t)(s + t) * j.k_ps + d) : _mm256_setzero_ps();
          for (int r = 0; r < nr; ++r) a[r][t] = _mm256_fmadd_ps(qv[r], kv, a[r][t]);
        }
      }
      for (int r = 0; r < nr; ++r) {
        // horizontal sums of the 4 accumulators -> 4 scores
        const __m256 hs = _mm256_hadd_ps(_mm256_hadd_ps(a[r][0], a[r][1]), _mm256_hadd_ps(a[r][2], a[r][3]));
        const __m128 sum4 = _mm_add_ps(_mm256_castps256_ps128(hs), _mm256_extractf128_ps(hs, 1));
        _mm_storeu_ps(&scores[r0 + r][s], _mm_mul_ps(sum4, _mm_set1_ps(j.scale)));
      }
    }
  };
  int s4 = 0;
  for (; s4 + 4 <= n; s4 += 4) four(s4, std::true_type{});
  if (s4 < n) four(s4, std::false_type{});
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
  // 3. acc = sum_s p_s v_s, NV x 8 dims at a time for every query of this KV head: with REP known,
  //    REP x NV accumulators, REP weights and one value chunk fit the 16 registers (REP <= 3: 32 dims,
  //    REP = 4: 16); otherwise 32 dims with up to MAX_REP_REG x 4 accumulators (on the stack).
  constexpr int NV = REP <= 3 ? 4 : 2;
  constexpr int RR = REP ? REP : MAX_REP_REG;
  for (int d0 = 0; d0 < D; d0 += 8 * NV) {
    const int nv = std::min(NV, (D - d0) / 8);
    __m256 acc[RR][NV];
    for (int r = 0; r < rep; ++r) for (int i = 0; i < NV; ++i) acc[r][i] = _mm256_setzero_ps();
    for (int s = 0; s < n; ++s) {
      if (d0 == 0)
        for (int64_t o = 0; o < D * esz; o += 64)
          _mm_prefetch((const char*)j.v + (vb + (int64_t)(s + 32) * j.v_ps) * esz + o, _MM_HINT_T0);
      __m256 ps[RR];
      for (int r = 0; r < rep; ++r) ps[r] = _mm256_set1_ps(scores[r][s]);
      for (int i = 0; i < nv; ++i) {
        const __m256 vv = load8(j.v, F16, vb + (int64_t)s * j.v_ps + d0 + 8 * i);
        for (int r = 0; r < rep; ++r) acc[r][i] = _mm256_fmadd_ps(ps[r], vv, acc[r][i]);
      }
    }
    for (int r = 0; r < rep; ++r) {
      float* out = j.part + ((int64_t)(h * j.n_blocks + blk) * rep + r) * (D + 2) + 2 + d0;
      for (int i = 0; i < nv; ++i) _mm256_storeu_ps(out + 8 * i, acc[r][i]);
    }
  }
}

void attn_chunk(const void* p, int64_t c) {
  const AttnJob& j = *(const AttnJob*)p;
  int b = 0;
  while (j.chunk0[b + 1] <= c) ++b;
  const AttnOne& one = j.seq[b];
  const int rep = one.H / one.Hkv;
  c -= j.chunk0[b];
  if (one.kv_f16) {
    switch (rep) {
      case 1: return attn_one_chunk_t<1, 1>(one, c);
      case 2: return attn_one_chunk_t<2, 1>(one, c);
      case 3: return attn_one_chunk_t<3, 1>(one, c);
      case 4: return attn_one_chunk_t<4, 1>(one, c);
      default: return attn_one_chunk_t<0, 1>(one, c);
    }
  }
  attn_one_chunk_t<0, 0>(one, c);
}

// ---------------------------------------------------------------------------------------------
// Dequantization (prefill's weights for sgemm, embedding rows)

inline __m256i nibbles(const uint8_t* qs) {  // 32 x u8 in [0, 15]: low nibbles = 0..15, high = 16..31
  const __m128i raw = _mm_loadu_si128((const __m128i*)qs);
  return _mm256_set_m128i(nibbles_hi(raw), nibbles_lo(raw));
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

// The same, 64-byte aligned: a row of k int16 is a whole number of cache lines (k % 32 == 0), so no
// load of an activation block (32 bytes on AVX2, a whole 64-byte block on AVX-512) straddles two
// lines. With malloc's 16-byte alignment, a scratch that started 16 or 48 bytes into a line split
// half of the 32-byte loads: ~7% of a batched product in a harness (8 rows, 3072 x 576, Zen 3, one
// thread), ~1.4% of a decode step (docs/perf.md, run 10).
template <typename T>
T* grow_aligned(std::vector<T>& v, size_t n) {
  T* p = grow(v, n + 64 / sizeof(T));
  return (T*)(((uintptr_t)p + 63) & ~(uintptr_t)63);
}

thread_local std::vector<float> t_xf;
thread_local std::vector<int16_t> t_x16;
thread_local std::vector<float> t_part, t_f1, t_f2, t_f3;

constexpr int MAX_M = MAX_B;  // activation rows per product

// y (m, n) = x (m, k) @ dequant(w (n, k)).T, every activation row against each weight block in one pass
void linear_impl(int fmt, const uint8_t* w, int64_t n, int64_t k, const float* x, int64_t m, float* y) {
  const int64_t nb = k / QK;
  float* f = grow(t_xf, (size_t)(2 * m * nb));
  int16_t* q = grow_aligned(t_x16, (size_t)(m * k));
  XRow rows[MAX_M];
  for (int64_t i = 0; i < m; ++i) {
    rows[i] = XRow{f + 2 * i * nb, f + (2 * i + 1) * nb, q + i * k};
    quantize_row(x + i * k, k, rows[i]);
  }
  GemvJob j{fmt, current_isa(), w, n, k, m, rows, y, 32};
  pool().run(gemv_chunk, &j, (n + j.rows_per_chunk - 1) / j.rows_per_chunk);
}

// Where sequence b's keys and values are: slot slots[b] of a cache whose element (slot, h, s, d)
// sits at base + slot*ss + h*hs + s*ps + d; its first lengths[b] positions are attended.
struct KvView {
  const void *k, *v;
  int kv_f16;
  int64_t k_ss, k_hs, k_ps, v_ss, v_hs, v_ps;
  const int64_t *slots, *lengths;
};

bool attention_shape_ok(int H, int Hkv, int D) { return Hkv > 0 && H % Hkv == 0 && H / Hkv <= MAX_REP && D % 8 == 0 && D <= MAX_D; }

// q (B, H, D) float32 (already rotated) -> out (B, H, D): each sequence over its own slot.
void attention_impl(const float* q, const KvView& kv, int H, int Hkv, int D, int B, float scale, float* out) {
  const int block = MAX_BLOCK, rep = H / Hkv;
  const int64_t esz = kv.kv_f16 ? 2 : 4;
  static thread_local AttnJob j;  // per calling thread: 6 KB, kept off the stack
  j.B = B;
  int64_t parts = 0;
  j.chunk0[0] = 0;
  for (int b = 0; b < B; ++b) {
    const int S = (int)kv.lengths[b], n_blocks = (S + block - 1) / block;
    const char* kb = (const char*)kv.k + kv.slots[b] * kv.k_ss * esz;
    const char* vb = (const char*)kv.v + kv.slots[b] * kv.v_ss * esz;
    j.seq[b] = AttnOne{q + (int64_t)b * H * D, kb, vb, kv.kv_f16, kv.k_hs, kv.k_ps, kv.v_hs, kv.v_ps, H, Hkv, D, S,
                       block, scale, nullptr, n_blocks};
    j.chunk0[b + 1] = j.chunk0[b] + (int64_t)Hkv * n_blocks;
    parts += (int64_t)Hkv * n_blocks * rep * (D + 2);
  }
  float* part = grow(t_part, (size_t)parts);
  for (int b = 0; b < B; ++b) {
    j.seq[b].part = part;
    part += (int64_t)Hkv * j.seq[b].n_blocks * rep * (D + 2);
  }
  pool().run(attn_chunk, &j, j.chunk0[B]);
  for (int b = 0; b < B; ++b) {  // merge each sequence's blocks' partial softmax states
    const AttnOne& s = j.seq[b];
    for (int h = 0; h < Hkv; ++h) {
      for (int r = 0; r < rep; ++r) {
        float mx = -INFINITY;
        for (int c = 0; c < s.n_blocks; ++c) mx = std::fmax(mx, s.part[((int64_t)(h * s.n_blocks + c) * rep + r) * (D + 2)]);
        float* o = out + (int64_t)b * H * D + (int64_t)(h * rep + r) * D;
        std::memset(o, 0, sizeof(float) * D);
        float total = 0.f;
        for (int c = 0; c < s.n_blocks; ++c) {
          const float* pp = s.part + ((int64_t)(h * s.n_blocks + c) * rep + r) * (D + 2);
          const float w = std::exp(pp[0] - mx);
          total += w * pp[1];
          for (int d = 0; d < D; ++d) o[d] += w * pp[2 + d];
        }
        const float inv = 1.f / total;
        for (int d = 0; d < D; ++d) o[d] *= inv;
      }
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

PB_API int pb_abi_version() { return 7; }

PB_API int pb_cpu_supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

// The integer dot-product path: 0 avx2, 1 avxvnni, 2 avx512vnni. pb_set_isa(-1) chooses the best
// this CPU runs; a path the CPU (or the compiler that built this library) lacks is refused (-1).
PB_API int pb_isa_supported(int isa) { return isa >= 0 && isa < N_ISA && ROWS[isa][0] && isa_supported(isa); }
PB_API int pb_set_isa(int isa) {
  if (isa < 0) isa = best_isa();
  if (!pb_isa_supported(isa)) return -1;
  g_isa = isa;
  return isa;
}
PB_API int pb_get_isa() { return current_isa(); }
PB_API const char* pb_isa_name(int isa) { return isa >= 0 && isa < N_ISA ? ISA_NAMES[isa] : ""; }

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

// Tests only: replay n jobs (start, end: ns; wait: the caller's wait for helpers, ns) through a fresh
// policy; alone[i] = 1 where job i would have run on the caller alone (its timing then not fed back).
PB_API void pb_pool_policy_replay(int64_t n, const int64_t* start, const int64_t* end, const double* wait,
                                  uint8_t* alone) {
  Policy p;
  for (int64_t i = 0; i < n; ++i) {
    alone[i] = p.alone(start[i]);
    if (!alone[i]) p.job(start[i], end[i], wait[i]);
  }
}

// y (m, n) = x (m, k) @ dequant(w (n, k)).T. w: n rows of k/32 blocks in format fmt.
PB_API int pb_linear(int fmt, const uint8_t* w, int64_t n, int64_t k, const float* x, int64_t m, float* y) {
  if (m < 1 || m > MAX_M || k % QK) return -1;
  linear_impl(fmt, w, n, k, x, m, y);
  return 0;
}

// The activation quantization alone, for tests: d, s (k/32 floats each), q, r (k int8 each), x16 (k int16).
PB_API void pb_quantize_row(const float* x, int64_t k, float* d, float* s, int8_t* q, int8_t* r, int16_t* x16) {
  quantize_row(x, k, XRow{d, s, x16}, q, r);
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

// Attention of one new token of each of B sequences: q (B, H, D) float32 (already rotated), out
// (B, H, D) float32. K/V element (slot, h, s, d) at base + slot*ss + h*hs + s*ps + d, in elements of
// their dtype (f16 if kv_f16 else f32); sequence b reads slot slots[b], positions 0..lengths[b]-1.
// H a multiple of Hkv (grouped-query attention). Returns -1 for an unsupported shape.
PB_API int pb_attention_decode(const float* q, const void* k, const void* v, int kv_f16, int64_t k_ss, int64_t k_hs,
                               int64_t k_ps, int64_t v_ss, int64_t v_hs, int64_t v_ps, int H, int Hkv, int D, int B,
                               const int64_t* slots, const int64_t* lengths, float scale, float* out) {
  if (!attention_shape_ok(H, Hkv, D) || B < 1 || B > MAX_B) return -1;
  for (int b = 0; b < B; ++b)
    if (lengths[b] < 1) return -1;
  attention_impl(q, KvView{k, v, kv_f16, k_ss, k_hs, k_ps, v_ss, v_hs, v_ps, slots, lengths}, H, Hkv, D, B, scale, out);
  return 0;
}

// t = silu(gate) * up for one row of the fused gate-up product g = (gate (n), up (n)). 8 lanes at a
// time: sigmoid(x) = 1 / (1 + e) for x >= 0 and e / (1 + e) below, e = exp(-|x|) (exp256's domain,
// relative error ~2e-7; a scalar expf per element cost ~0.4 ms of a SmolLM2 decode step, all of it
// on the calling thread while the pool's helpers wait).
static void swiglu(const float* g, int n, float* t) {
  const __m256 one = _mm256_set1_ps(1.f), sign = _mm256_set1_ps(-0.f), zero = _mm256_setzero_ps();
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(g + i), up = _mm256_loadu_ps(g + n + i);
    const __m256 e = exp256(_mm256_or_ps(x, sign));  // exp(-|x|)
    const __m256 inv = _mm256_div_ps(one, _mm256_add_ps(one, e));
    const __m256 sig = _mm256_blendv_ps(_mm256_mul_ps(e, inv), inv, _mm256_cmp_ps(x, zero, _CMP_GE_OQ));
    _mm256_storeu_ps(t + i, _mm256_mul_ps(_mm256_mul_ps(x, sig), up));
  }
  for (; i < n; ++i) t[i] = g[i] / (1.f + std::exp(-g[i])) * g[n + i];
}

// One decoder block for one token of each of B sequences, in two halves around the KV cache update
// (which stays in Python: the cache's update(slots, positions, k, v) contract is where patches such
// as int8 KV hook in). Same math as engine/model.py's Block.forward for T = 1.
struct LayerW {
  int32_t fmt_qkv, fmt_o, fmt_13, fmt_2;
  const uint8_t *wqkv, *wo, *w13, *w2;
  const float *attn_norm, *ffn_norm;
  float eps;
  int32_t dim, hidden, H, Hkv, D;
};

// q (B, H*D), k (B, Hkv*D), v (B, Hkv*D) of tokens x (B, dim): RMSNorm, the fused qkv product (all
// B rows in one pass over the weights), RoPE on q and k with each row's own cos/sin (B, D).
PB_API void pb_block_pre(const LayerW* L, const float* x, const float* cos, const float* sin, float* q, float* k,
                         float* v, int B) {
  const int q_out = L->H * L->D, kv_out = L->Hkv * L->D, qkv_out = q_out + 2 * kv_out;
  float* xn = grow(t_f1, (size_t)B * L->dim);
  float* qkv = grow(t_f2, (size_t)B * qkv_out);
  for (int b = 0; b < B; ++b) rms_norm(x + (int64_t)b * L->dim, L->attn_norm, L->dim, L->eps, xn + (int64_t)b * L->dim);
  linear_impl(L->fmt_qkv, L->wqkv, qkv_out, L->dim, xn, B, qkv);
  for (int b = 0; b < B; ++b) {
    float* row = qkv + (int64_t)b * qkv_out;
    rope(row, L->H, L->D, cos + (int64_t)b * L->D, sin + (int64_t)b * L->D);
    rope(row + q_out, L->Hkv, L->D, cos + (int64_t)b * L->D, sin + (int64_t)b * L->D);
    std::memcpy(q + (int64_t)b * q_out, row, sizeof(float) * q_out);
    std::memcpy(k + (int64_t)b * kv_out, row + q_out, sizeof(float) * kv_out);
    std::memcpy(v + (int64_t)b * kv_out, row + q_out + kv_out, sizeof(float) * kv_out);
  }
}

// x (B, dim) += wo(attention(q, each sequence's slot)); x += w2(silu(w1 h) * w3 h), h = RMSNorm(x).
// In place; every product runs all B rows in one pass over its weights.
PB_API int pb_block_post(const LayerW* L, float* x, const float* q, const void* k, const void* v, int kv_f16,
                         int64_t k_ss, int64_t k_hs, int64_t k_ps, int64_t v_ss, int64_t v_hs, int64_t v_ps, int B,
                         const int64_t* slots, const int64_t* lengths) {
  if (!attention_shape_ok(L->H, L->Hkv, L->D) || B < 1 || B > MAX_B) return -1;
  for (int b = 0; b < B; ++b)
    if (lengths[b] < 1) return -1;
  const int q_out = L->H * L->D, dim = L->dim, hidden = L->hidden;
  float* att = grow(t_f1, (size_t)B * std::max(q_out, dim));
  float* tmp = grow(t_f2, (size_t)B * std::max(dim, hidden));
  float* gu = grow(t_f3, (size_t)B * 2 * hidden);
  attention_impl(q, KvView{k, v, kv_f16, k_ss, k_hs, k_ps, v_ss, v_hs, v_ps, slots, lengths}, L->H, L->Hkv, L->D, B,
                 1.f / std::sqrt((float)L->D), att);
  linear_impl(L->fmt_o, L->wo, dim, q_out, att, B, tmp);
  for (int64_t i = 0; i < (int64_t)B * dim; ++i) x[i] += tmp[i];
  for (int b = 0; b < B; ++b) rms_norm(x + (int64_t)b * dim, L->ffn_norm, dim, L->eps, att + (int64_t)b * dim);
  linear_impl(L->fmt_13, L->w13, 2 * hidden, dim, att, B, gu);
  for (int b = 0; b < B; ++b) swiglu(gu + (int64_t)b * 2 * hidden, hidden, tmp + (int64_t)b * hidden);
  linear_impl(L->fmt_2, L->w2, dim, hidden, tmp, B, att);
  for (int64_t i = 0; i < (int64_t)B * dim; ++i) x[i] += att[i];
  return 0;
}

// Where one layer's cache is: element (slot, h, s, d) of K at k + slot*k_ss + h*k_hs + s*k_ps + d (and V
// likewise), f16 if kv_f16 else f32: engine/model.py's KVCache, its k and v tensors (N, H_kv, S, D).
struct KvW {
  void *k, *v;
  int32_t kv_f16;
  int64_t k_ss, k_hs, k_ps, v_ss, v_hs, v_ps;
};

// KVCache.update for one token of each of B sequences: row b's new key/value (H_kv, D) into slot
// slots[b] at position positions[b]; an f16 cache rounds to nearest even, as torch's copy_ does.
static void write_kv(const KvW& c, const float* k, const float* v, int B, int Hkv, int D, const int64_t* slots,
                     const int64_t* positions) {
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < Hkv; ++h) {
      const float* ks = k + ((int64_t)b * Hkv + h) * D;
      const float* vs = v + ((int64_t)b * Hkv + h) * D;
      const int64_t ko = slots[b] * c.k_ss + h * c.k_hs + positions[b] * c.k_ps;
      const int64_t vo = slots[b] * c.v_ss + h * c.v_hs + positions[b] * c.v_ps;
      if (c.kv_f16) {
        uint16_t* kd = (uint16_t*)c.k + ko;
        uint16_t* vd = (uint16_t*)c.v + vo;
        int d = 0;
        for (; d + 8 <= D; d += 8) {
          _mm_storeu_si128((__m128i*)(kd + d), _mm256_cvtps_ph(_mm256_loadu_ps(ks + d), _MM_FROUND_TO_NEAREST_INT));
          _mm_storeu_si128((__m128i*)(vd + d), _mm256_cvtps_ph(_mm256_loadu_ps(vs + d), _MM_FROUND_TO_NEAREST_INT));
        }
        for (; d < D; ++d) {
          kd[d] = _cvtss_sh(ks[d], _MM_FROUND_TO_NEAREST_INT);
          vd[d] = _cvtss_sh(vs[d], _MM_FROUND_TO_NEAREST_INT);
        }
      } else {
        std::memcpy((float*)c.k + ko, ks, sizeof(float) * D);
        std::memcpy((float*)c.v + vo, vs, sizeof(float) * D);
      }
    }
}

// Every decoder block of one decode step (one token of each of B sequences) in one call: per block,
// pb_block_pre, the KV write (write_kv: what KVCache.update does for one token), pb_block_post. x (B,
// dim) float32 in place; q (B, H*D), k, v (B, H_kv*D) scratch; cos, sin (B, D); slots, positions (B)
// int64, lengths[b] = positions[b] + 1. Same arithmetic as the per-block calls around a Python
// KVCache.update, so the same bits; used where engine/model.py's KVCache is the recorded code
// (engine/fastpaths.py). Returns -1 for an unsupported shape (before writing anything).
PB_API int pb_decode_layers(const LayerW* L, const KvW* kv, int n_layers, float* x, const float* cos, const float* sin,
                            float* q, float* k, float* v, int B, const int64_t* slots, const int64_t* positions,
                            const int64_t* lengths) {
  if (B < 1 || B > MAX_B) return -1;
  for (int l = 0; l < n_layers; ++l)
    if (!attention_shape_ok(L[l].H, L[l].Hkv, L[l].D)) return -1;
  for (int b = 0; b < B; ++b)
    if (lengths[b] != positions[b] + 1) return -1;
  for (int l = 0; l < n_layers; ++l) {
    const KvW& c = kv[l];
    pb_block_pre(&L[l], x, cos, sin, q, k, v, B);
    write_kv(c, k, v, B, L[l].Hkv, L[l].D, slots, positions);
    pb_block_post(&L[l], x, q, c.k, c.v, c.kv_f16, c.k_ss, c.k_hs, c.k_ps, c.v_ss, c.v_hs, c.v_ps, B, slots, lengths);
  }
  return 0;
}
