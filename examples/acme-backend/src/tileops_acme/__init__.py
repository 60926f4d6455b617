"""acme: an example third-party tileops backend.

tileops imports this module through the entry point in pyproject.toml the first time an op is
constructed or the backend registry is queried; importing it is what registers acme's kernels.
Keep it cheap: nothing here compiles or touches a device, every kernel is built on first use.

Order matters: the protocol version and the hook come first, so that they are in place even
when someone imports this module directly, before tileops discovered it.
"""

from __future__ import annotations

from tileops.backend import (
    hookimpl,
    register_detector,
    register_kernel_builder,
    register_kernel_type,
)
from tileops.ops import RMSNormFwdOp, SoftmaxFwdOp

__version__ = "0.1.0"

TILEOPS_PROTOCOL = 1
"""The tileops backend protocol acme is written for; tileops refuses to load it elsewhere."""

TARGET = "acme"


@hookimpl
def tileops_backend_info() -> dict[str, object]:
    """What `tileops list` and `tileops.backend.backends()` show about acme."""
    return {"name": "acme-backend", "version": __version__, "devices": ["cpu"]}


# Imported after the hook on purpose (see the module docstring).
from .rms_norm import KEY as RMS_NORM_KEY  # noqa: E402
from .rms_norm import AcmeRMSNorm  # noqa: E402
from .softmax import build_softmax, claims_device  # noqa: E402

# 1. One more implementation of RMSNormFwdOp, competing with the op's own by its declarations.
register_kernel_type(RMSNormFwdOp, RMS_NORM_KEY, AcmeRMSNorm)

# 2. Target "acme": serves every call of SoftmaxFwdOp instances that settle on it.
register_detector(target=TARGET, detect=claims_device)
register_kernel_builder(op=SoftmaxFwdOp, target=TARGET, build_kernel=build_softmax)

__all__ = ["RMS_NORM_KEY", "TARGET", "TILEOPS_PROTOCOL", "AcmeRMSNorm", "build_softmax"]
