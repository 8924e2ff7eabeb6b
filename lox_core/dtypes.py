"""The dtype of a key whose events came with different dtypes.

A key logged as ``3`` and later as ``5e-07`` (int32 then float32 events, as
Python numbers become) is one series. Its dtype is NumPy's common dtype of the
events' dtypes (`numpy.result_type`), where that dtype holds every value of
both exactly: int32 and float32 give float64, bool and int32 give int32, int8
and float16 give float16. Only bool, integer and floating dtypes (NumPy's and
the narrow ``ml_dtypes`` ones) mix, and not every pair of them: float64 holds
integers exactly only up to 2**53, so int64 and uint64 events do not mix with
floats; complex values do not mix with real ones.

>>> import numpy as np
>>> common_dtype(np.int32, np.float32), common_dtype(np.bool_, np.int32), common_dtype(np.int8, np.float16)
(dtype('float64'), dtype('int32'), dtype('float16'))
>>> common_dtype(np.int64, np.float64), common_dtype(np.float32, np.complex64)
(None, None)
"""

from __future__ import annotations

import ml_dtypes
import numpy as np


def common_dtype(a, b) -> np.dtype | None:
    """The dtype that holds the events of dtypes `a` and `b` (see the module
    docstring), or None where they do not mix."""
    a, b = np.dtype(a), np.dtype(b)
    if a == b:
        return a
    if _kind(a) is None or _kind(b) is None:
        return None
    try:
        common = np.result_type(a, b)
    except TypeError:  # no common dtype, e.g. bfloat16 with int32
        return None
    return common if _holds(common, a) and _holds(common, b) else None


def _kind(dtype: np.dtype) -> str | None:
    """"bool", "int" or "float"; None for the dtypes that do not mix (complex, strings...)."""
    if dtype == np.bool_:
        return "bool"
    if dtype.kind not in "iufV":
        return None
    for kind, info in (("int", ml_dtypes.iinfo), ("float", ml_dtypes.finfo)):
        try:
            info(dtype)
            return kind
        except (ValueError, TypeError):
            pass
    return None


def _holds(common: np.dtype, dtype: np.dtype) -> bool:
    """Whether every value of `dtype` is one of `common`."""
    if _kind(dtype) == "int" and _kind(common) == "float":
        info = ml_dtypes.iinfo(dtype)
        return info.bits - (info.min < 0) <= ml_dtypes.finfo(common).nmant + 1  # NumPy's casts allow more
    return bool(np.can_cast(dtype, common, "safe"))
