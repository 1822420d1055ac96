"""The engine's native kernels (``engine/csrc/kernels.cpp``): built once, loaded through ctypes.

Why ctypes and not ``torch.utils.cpp_extension``: the kernels need no torch headers (they take raw
pointers), so the build is one ``g++`` call of about a second instead of a minute of compiling
torch's headers, and the library does not depend on torch's C++ ABI.

Where the library lives: the engine runs from each arm's exported source tree
(``results/<label>/src/<arm>/engine``), so the build is keyed by what it is built from: the sha256
of the C++ source, the compiler's version line and the flags. It goes to
``$PAIRBENCH_NATIVE_CACHE`` or ``~/.cache/pairbench/engine-native/<key>/``. A patch that changes the
C++ source therefore gets its own build, and identical sources share one. ``./install.sh`` builds it
(``python -m engine build-kernels``); otherwise the first load builds it, under a file lock.

Without a compiler, on a CPU without AVX2/FMA/F16C, or with ``PAIRBENCH_ENGINE_NATIVE=0``, ``lib()``
returns None, one warning names the reason, and the engine uses its PyTorch fp16 path.

Instruction sets: the integer dot products have an AVX2 path and, chosen at run time when the CPU
has them, AVX-VNNI and AVX-512 VNNI paths (``isa()``). Every path gives bit-identical results (the
block sums are exact integers), so ``PAIRBENCH_ENGINE_ISA=avx2|avxvnni|avx512vnni`` (or
``set_isa``) forces one, e.g. to compare them; a path this CPU lacks is refused with a warning.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import torch

SOURCE = Path(__file__).resolve().parent / "csrc" / "kernels.cpp"
FLAGS = ["-O3", "-std=c++17", "-fPIC", "-shared", "-pthread", "-fvisibility=hidden",
         "-mavx2", "-mfma", "-mf16c", "-fno-math-errno"]
ABI_VERSION = 7
FORMATS = {"q4_1": 0, "q8_0": 1}
#: the integer dot-product paths of kernels.cpp, in its numbering
ISAS = ("avx2", "avxvnni", "avx512vnni")
#: sequences per decode step (and activation rows per product) the kernels take
MAX_BATCH = 64
#: bytes per block of 32 weights
BLOCK_BYTES = {"q4_1": 20, "q8_0": 34}
#: how long (microseconds) pool helpers spin for the next job before they sleep
SPIN_US = 2000

_lock = threading.Lock()
_state: dict = {}


def cache_root() -> Path:
    env = os.environ.get("PAIRBENCH_NATIVE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "pairbench" / "engine-native"


def compiler() -> str | None:
    cxx = os.environ.get("CXX")
    if cxx:
        return shutil.which(shlex.split(cxx)[0]) and cxx
    return next((c for c in ("g++", "c++", "clang++") if shutil.which(c)), None)


def build_key(cxx: str) -> str:
    try:
        version = subprocess.run([*shlex.split(cxx), "--version"], capture_output=True, text=True,
                                 timeout=60).stdout.splitlines()[:1]
    except (OSError, subprocess.SubprocessError):
        version = []
    h = hashlib.sha256()
    for part in (SOURCE.read_bytes(), "\n".join(version).encode(), " ".join(FLAGS).encode()):
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()[:20]


def build(verbose: bool = False) -> Path:
    """Compile the library if this source/compiler/flags has no build yet; return its path.

    Raises RuntimeError naming the reason (no compiler, compile error)."""
    if not SOURCE.is_file():
        raise RuntimeError(f"kernel source {SOURCE} is missing")
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler found (tried $CXX, g++, c++, clang++)")
    out_dir = cache_root() / build_key(cxx)
    lib = out_dir / "libpairbench_kernels.so"
    if lib.is_file():
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two servers starting at once build it once
        if lib.is_file():
            return lib
        tmp = out_dir / f".build-{os.getpid()}.so"
        cmd = [*shlex.split(cxx), *FLAGS, str(SOURCE), "-o", str(tmp)]
        if verbose:
            print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise RuntimeError(f"compiling {SOURCE.name} failed ({cxx}, exit {r.returncode}): "
                               f"{r.stderr.strip()[-1500:]}")
        os.replace(tmp, lib)
    return lib


class LayerW(ctypes.Structure):
    """kernels.cpp's LayerW: one decoder block's weights for the fused decode step."""

    _fields_ = [("fmt_qkv", ctypes.c_int32), ("fmt_o", ctypes.c_int32), ("fmt_13", ctypes.c_int32),
                ("fmt_2", ctypes.c_int32), ("wqkv", ctypes.c_void_p), ("wo", ctypes.c_void_p),
                ("w13", ctypes.c_void_p), ("w2", ctypes.c_void_p), ("attn_norm", ctypes.c_void_p),
                ("ffn_norm", ctypes.c_void_p), ("eps", ctypes.c_float), ("dim", ctypes.c_int32),
                ("hidden", ctypes.c_int32), ("H", ctypes.c_int32), ("Hkv", ctypes.c_int32), ("D", ctypes.c_int32)]


class KvW(ctypes.Structure):
    """kernels.cpp's KvW: where one layer's KV cache is (base pointers, element strides, dtype)."""

    _fields_ = [("k", ctypes.c_void_p), ("v", ctypes.c_void_p), ("kv_f16", ctypes.c_int32),
                ("k_ss", ctypes.c_int64), ("k_hs", ctypes.c_int64), ("k_ps", ctypes.c_int64),
                ("v_ss", ctypes.c_int64), ("v_hs", ctypes.c_int64), ("v_ps", ctypes.c_int64)]


def _bind(path: Path) -> ctypes.CDLL:
    L = ctypes.CDLL(str(path))
    i64, i32, p, f32 = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_float
    sig = {
        "pb_abi_version": (i32, []),
        "pb_cpu_supported": (i32, []),
        "pb_set_threads": (None, [i32, i64]),
        "pb_get_threads": (i32, []),
        "pb_pool_stats": (None, [p]),
        "pb_pool_test_stall": (None, [i64, i64]),
        "pb_pool_policy_replay": (None, [i64, p, p, p, p]),
        "pb_isa_supported": (i32, [i32]),
        "pb_set_isa": (i32, [i32]),
        "pb_get_isa": (i32, []),
        "pb_linear": (i32, [i32, p, i64, i64, p, i64, p]),
        "pb_quantize_row": (None, [p, i64, p, p, p, p, p]),
        "pb_dequantize": (None, [i32, p, i64, p, i64, p]),
        "pb_attention_decode": (i32, [p, p, p, i32, i64, i64, i64, i64, i64, i64, i32, i32, i32, i32, p, p, f32, p]),
        "pb_block_pre": (None, [ctypes.POINTER(LayerW), p, p, p, p, p, p, i32]),
        "pb_block_post": (i32, [ctypes.POINTER(LayerW), p, p, p, p, i32, i64, i64, i64, i64, i64, i64, i32, p, p]),
        "pb_decode_layers": (i32, [p, p, i32, p, p, p, p, p, p, i32, p, p, p]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(L, name)
        fn.restype, fn.argtypes = res, args
    return L


def lib() -> ctypes.CDLL | None:
    """The loaded library, building it on first use; None (after one warning) if unavailable. Its
    dot-product path is ``PAIRBENCH_ENGINE_ISA``'s, else this CPU's cached choice (``engine.isa``),
    else the widest this CPU runs until a model load measures one."""
    if "lib" in _state:
        return _state["lib"]
    with _lock:
        if "lib" in _state:
            return _state["lib"]
        L, why = None, None
        if os.environ.get("PAIRBENCH_ENGINE_NATIVE", "1") == "0":
            why = "disabled by PAIRBENCH_ENGINE_NATIVE=0"
        else:
            try:
                path = build()
                L = _bind(path)
                _state["path"] = path
                if L.pb_abi_version() != ABI_VERSION:
                    L, why = None, f"library ABI {L.pb_abi_version()} != {ABI_VERSION}"
                elif not L.pb_cpu_supported():
                    L, why = None, "this CPU lacks AVX2/FMA/F16C"
            except (RuntimeError, OSError) as e:
                L, why = None, str(e)
        if L is None:
            print(f"pairbench-engine: warning: native kernels unavailable ({why}); using the PyTorch "
                  "fp16 path (slower decode, same API)", file=sys.stderr, flush=True)
        _state["lib"], _state["why"] = L, why  # published first: what follows calls lib() again
        if L is not None:
            _first_isa(L, os.environ.get("PAIRBENCH_ENGINE_ISA", ""))
        return L


def _first_isa(L: ctypes.CDLL, name: str) -> None:
    """The environment's path if this CPU runs it, else the cached choice (``engine.isa.choose``
    without measuring); a forced path that cannot be had is a warning naming the one used."""
    problem = None
    if name and name not in ISAS:
        problem = f"PAIRBENCH_ENGINE_ISA={name!r} is not one of {', '.join(ISAS)}"
    elif name and L.pb_set_isa(ISAS.index(name)) < 0:
        problem = f"PAIRBENCH_ENGINE_ISA={name}: this CPU (or the compiler) lacks it"
    _state["forced"] = bool(name) and problem is None
    if not _state["forced"]:
        from . import isa

        isa.choose(None)
    if problem:
        print(f"pairbench-engine: warning: {problem}; using {ISAS[L.pb_get_isa()]}", file=sys.stderr, flush=True)


def isa_forced() -> bool:
    """Whether ``PAIRBENCH_ENGINE_ISA`` named a path this CPU runs (which then stays in force)."""
    lib()
    return bool(_state.get("forced"))


def library_path() -> Path | None:
    """The loaded library's file (its folder holds what is cached per build); None without one."""
    return _state.get("path") if lib() is not None else None


def kernels_sha256() -> str | None:
    """sha256 of the kernels' C++ source in this tree (what a patch to the kernels changes)."""
    try:
        return hashlib.sha256(SOURCE.read_bytes()).hexdigest()
    except OSError:
        return None


def isa() -> str | None:
    """The dot-product path of the block products (``ISAS``): the widest this CPU runs unless forced."""
    L = lib()
    return ISAS[L.pb_get_isa()] if L is not None else None


def isa_supported(name: str) -> bool:
    L = lib()
    return L is not None and name in ISAS and bool(L.pb_isa_supported(ISAS.index(name)))


def set_isa(name: str | None) -> bool:
    """Use the path ``name`` for every later product (None: the engine's choice, ``engine.isa``'s
    measured or cached one once made, else the widest this CPU runs); False (and no change) when
    this CPU or the compiler lacks it."""
    L = lib()
    if L is None or (name is not None and name not in ISAS):
        return False
    if name is None:
        name = _state.get("default_isa")
    return L.pb_set_isa(-1 if name is None else ISAS.index(name)) >= 0


def set_default_isa(name: str) -> bool:
    """Make ``name`` the engine's choice (what ``set_isa(None)`` returns to) and use it."""
    if not set_isa(name):
        return False
    _state["default_isa"] = name
    return True


def available() -> bool:
    return lib() is not None


def unavailable_reason() -> str | None:
    lib()
    return _state.get("why")


def set_threads(n: int) -> None:
    """Threads of the native pool (the caller plus n - 1 helpers) for every later kernel call."""
    L = lib()
    if L is not None and L.pb_get_threads() != n:
        L.pb_set_threads(int(n), SPIN_US)


def pool_stats() -> dict:
    """The pool's counters since the last call: jobs; stalls (the caller waited > 50 us for a
    preempted helper); busy (windows in which the caller itself waited > 5 % of the time for a
    core); alone (jobs the caller ran by itself in a backoff, which follows when waits for helpers
    pass 25 % of the recent jobs' wall time, or after two busy windows in a row)."""
    L = lib()
    if L is None:
        return {"jobs": 0, "stalls": 0, "busy": 0, "alone": 0}
    buf = (ctypes.c_uint64 * 4)()
    L.pb_pool_stats(buf)
    return {"jobs": buf[0], "stalls": buf[1], "busy": buf[2], "alone": buf[3]}


def test_stall(every: int, sleep_us: int) -> None:
    """Tests only: pool helpers sleep ``sleep_us`` inside every ``every``-th job (0: never), as a
    helper preempted mid-chunk would; the pool's backoff policy is tested against it."""
    L = lib()
    if L is not None:
        L.pb_pool_test_stall(int(every), int(sleep_us))


def pool_policy_replay(start_ns: list[int], end_ns: list[int], wait_ns: list[float]) -> list[bool]:
    """Tests only: which of these two-thread jobs (start and end times, the caller's wait for
    helpers, in ns) the pool's policy would have run on the caller alone, from a fresh history."""
    n = len(start_ns)
    assert len(end_ns) == len(wait_ns) == n
    start, end = torch.tensor(start_ns, dtype=torch.int64), torch.tensor(end_ns, dtype=torch.int64)
    wait, alone = torch.tensor(wait_ns, dtype=torch.float64), torch.zeros(n, dtype=torch.uint8)
    lib().pb_pool_policy_replay(n, start.data_ptr(), end.data_ptr(), wait.data_ptr(), alone.data_ptr())
    return [bool(a) for a in alone.tolist()]


def threads() -> int:
    L = lib()
    return L.pb_get_threads() if L is not None else 1


# ------------------------------------------------------------------------------------------------
# Tensor-level wrappers (the shape contracts of kernels.cpp)

def linear(x: torch.Tensor, fmt: str, blocks: torch.Tensor, out_features: int) -> torch.Tensor:
    """x (..., k) float32 @ dequant(blocks).T -> (..., out_features) float32, at most MAX_BATCH rows,
    all in one pass over the weights.

    blocks: (out_features, k/32 * BLOCK_BYTES[fmt]) uint8, contiguous, in the split row layout
    (``engine.kernels.split_rows``)."""
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    if x2.dtype != torch.float32 or not x2.is_contiguous():
        x2 = x2.float().contiguous()
    y = torch.empty((*x.shape[:-1], out_features), dtype=torch.float32)
    if lib().pb_linear(FORMATS[fmt], blocks.data_ptr(), out_features, k, x2.data_ptr(), x2.shape[0], y.data_ptr()):
        raise ValueError(f"native.linear: {x2.shape[0]} rows of {k} inputs (at most 64 rows, a multiple of 32 inputs)")
    return y


def quantize_row(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The kernels' two-digit int8 form of one activation row x (k,): (d, s, q, r, x16) = per-32
    scales, block sums, the int8 rounding, its scaled remainder (``kernels.quantize_activation_ref``)
    and the 15-bit integer the products use, 254 * q + r (int16)."""
    x = x.float().contiguous()
    k = x.numel()
    d, s = torch.empty(k // 32), torch.empty(k // 32)
    q, r = torch.empty(k, dtype=torch.int8), torch.empty(k, dtype=torch.int8)
    x16 = torch.empty(k, dtype=torch.int16)
    lib().pb_quantize_row(x.data_ptr(), k, d.data_ptr(), s.data_ptr(), q.data_ptr(), r.data_ptr(), x16.data_ptr())
    return d, s, q, r, x16


def dequantize(fmt: str, blocks: torch.Tensor, k: int, rows: torch.Tensor | None = None,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """(len(rows) or all rows, k) float32 of the block matrix in the split row layout (rows: int64
    row indices), written into ``out`` (a contiguous float32 tensor of at least that many elements)
    when given."""
    if rows is not None:
        rows = rows.reshape(-1).to(torch.int64).contiguous()
        n = rows.numel()
    else:
        n = blocks.shape[0]
    if out is None:
        out = torch.empty((n, k), dtype=torch.float32)
    else:
        assert out.dtype == torch.float32 and out.is_contiguous() and out.numel() >= n * k
        out = out.view(-1)[:n * k].view(n, k)
    lib().pb_dequantize(FORMATS[fmt], blocks.data_ptr(), k, None if rows is None else rows.data_ptr(), n,
                        out.data_ptr())
    return out


def _kv_args(k: torch.Tensor, v: torch.Tensor) -> tuple:
    """(kv_f16, k slot/head/position strides, v strides) of a cache (N, H_kv, S, D) or a view of it."""
    assert k.dim() == v.dim() == 4 and k.dtype == v.dtype and k.dtype in (torch.float16, torch.float32) and (
        k.stride(3) == v.stride(3) == 1), f"KV: {k.dtype} {tuple(k.shape)} {tuple(k.stride())}, v {tuple(v.stride())}"
    return (int(k.dtype == torch.float16), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2))


def attention_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor | None = None,
                     lengths: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of one new token of each of B sequences over its own KV slot. q (B, H, 1, D) float32;
    k, v (N, H_kv, S, D) float16 or float32 with unit stride along D (the cache, or views of it);
    slots, lengths (B,) int64: sequence b attends to positions 0..lengths[b]-1 of slot slots[b]
    (default: slot b, all S positions). Returns (B, 1, H*D) float32."""
    B, H, _, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    if slots is None:
        slots = torch.arange(B)
    if lengths is None:
        lengths = torch.full((B,), S, dtype=torch.int64)
    assert slots.dtype == lengths.dtype == torch.int64 and slots.shape == lengths.shape == (B,)
    q = q.reshape(B, H * D).contiguous().float()
    out = torch.empty((B, 1, H * D), dtype=torch.float32)
    rc = lib().pb_attention_decode(q.data_ptr(), k.data_ptr(), v.data_ptr(), *_kv_args(k, v), H, Hkv, D, B,
                                   slots.contiguous().data_ptr(), lengths.contiguous().data_ptr(), D ** -0.5,
                                   out.data_ptr())
    if rc != 0:
        raise ValueError(f"attention_decode: unsupported shape B={B} H={H} H_kv={Hkv} D={D} lengths={lengths.tolist()}")
    return out


def attention_supported(n_heads: int, n_kv_heads: int, head_dim: int) -> bool:
    return n_heads % n_kv_heads == 0 and n_heads // n_kv_heads <= 16 and head_dim % 8 == 0 and head_dim <= 256


def layer_weights(fmts: tuple[str, str, str, str], blocks: tuple, attn_norm: torch.Tensor, ffn_norm: torch.Tensor,
                  eps: float, dim: int, hidden: int, n_heads: int, n_kv_heads: int, head_dim: int) -> LayerW:
    """The LayerW of one block (qkv, o, gate-up, down blocks; fp32 norms). The tensors must outlive it."""
    for t in (*blocks, attn_norm, ffn_norm):
        assert t.is_contiguous(), "layer_weights: tensors must be contiguous"
    assert attn_norm.dtype == ffn_norm.dtype == torch.float32
    return LayerW(*(FORMATS[f] for f in fmts), *(b.data_ptr() for b in blocks), attn_norm.data_ptr(),
                  ffn_norm.data_ptr(), eps, dim, hidden, n_heads, n_kv_heads, head_dim)


def block_pre(L: LayerW, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor) -> None:
    """Fill q (B, H*D), k, v (B, H_kv*D) float32 for tokens x (B, dim): RMSNorm, qkv product, RoPE
    with each token's cos/sin rows (B, D). All tensors contiguous float32."""
    lib().pb_block_pre(ctypes.byref(L), x.data_ptr(), cos.data_ptr(), sin.data_ptr(), q.data_ptr(), k.data_ptr(),
                       v.data_ptr(), x.shape[0])


def block_post(L: LayerW, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor,
               lengths: torch.Tensor) -> None:
    """x (B, dim) float32, in place: += wo(attention(q, each sequence's KV slot)), then += the SwiGLU
    MLP of its RMSNorm. k, v: the cache (N, H_kv, S, D) float16/float32 with unit stride along D;
    slots, lengths (B,) int64 contiguous: sequence b attends to positions 0..lengths[b]-1 of slot slots[b]."""
    rc = lib().pb_block_post(ctypes.byref(L), x.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr(), *_kv_args(k, v),
                             x.shape[0], slots.data_ptr(), lengths.data_ptr())
    if rc != 0:
        raise ValueError(f"block_post: unsupported shape (B={x.shape[0]}, lengths {lengths.tolist()})")


def kv_weights(k: torch.Tensor, v: torch.Tensor) -> KvW:
    """The KvW of one layer's cache tensors k, v (N, H_kv, S, D), f16 or f32, unit stride along D.
    The tensors must outlive it."""
    f16, *strides = _kv_args(k, v)
    return KvW(k.data_ptr(), v.data_ptr(), f16, *strides)


def decode_layers(layers, kvs, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, q: torch.Tensor,
                  k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor,
                  lengths: torch.Tensor) -> None:
    """Every block of one decode step in one call (kernels.cpp's pb_decode_layers): ``layers`` a
    ctypes array of LayerW, ``kvs`` one of KvW (as many); x (B, dim) float32 in place; q (B, H*D), k,
    v (B, H_kv*D) float32 scratch; cos, sin (B, D); slots, positions, lengths (B,) int64, all
    contiguous, lengths = positions + 1."""
    rc = lib().pb_decode_layers(ctypes.addressof(layers), ctypes.addressof(kvs), len(layers), x.data_ptr(),
                                cos.data_ptr(), sin.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr(), x.shape[0],
                                slots.data_ptr(), positions.data_ptr(), lengths.data_ptr())
    if rc != 0:
        raise ValueError(f"decode_layers: unsupported shape (B={x.shape[0]}, positions {positions.tolist()}, "
                         f"lengths {lengths.tolist()})")
