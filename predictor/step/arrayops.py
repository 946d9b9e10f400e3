"""Small array helpers shared by the engine and the memory model."""
from __future__ import annotations

import numpy as np


def unique_rows(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(a, axis=0, return_inverse=True) for small non-negative integer rows, without the slow
    structured sort: rows are packed into one int64 key (falls back when they do not fit). One row (the
    common case of a single prediction) costs nothing."""
    a = np.asarray(a, dtype=np.int64)
    if a.size == 0:
        return a.reshape(0, a.shape[1] if a.ndim == 2 else 0), np.zeros(0, int)
    if len(a) == 1:
        return a, np.zeros(1, int)
    hi = a.max(axis=0) + 1
    if a.min() < 0 or float(np.prod(hi.astype(float))) >= 2 ** 62:
        u, inv = np.unique(a, axis=0, return_inverse=True)
        return u, inv.reshape(-1)
    key = np.zeros(len(a), np.int64)
    for j in range(a.shape[1]):
        key = key * hi[j] + a[:, j]
    _, first, inv = np.unique(key, return_index=True, return_inverse=True)
    return a[first], inv.reshape(-1)
