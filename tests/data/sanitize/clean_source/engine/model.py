"""Toy model file of the clean source used by the sanitize tests."""


def matmul_dtype():
    return "float32"


def kv_cache_bytes(layers, tokens, width):
    return layers * tokens * width * 2 * 4
