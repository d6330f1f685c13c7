"""Stage 3, the plan: every name, body, saved tensor and helper of a generated module,
decided as data before anything is printed.

- :mod:`.ir`: the data (Plan, Method and its statements; expressions are syntax trees), printed to lines once;
- :mod:`.names`: the names of a plan's values;
- :mod:`.saved`: what backward saves, and setup_context;
- :mod:`.bodies`: forward, backward and jvp;
- :mod:`.second_derivative`: double backward's own Function;
- :mod:`.fused`: --fuse's pure functions;
- :mod:`.inplace`: eager bodies reusing their temporaries' buffers;
- :mod:`.dtype`: the float16 policy;
- :mod:`.operations`: counting a body's kernels;
- :mod:`.docs`: the docstring, the saved comment and the metadata;
- :mod:`.assemble`: all of it put together (:func:`make_plan`).
"""

from .assemble import make_plan
from .fused import INDUCTOR_INACCURATE, INDUCTOR_LESS_ACCURATE_HELPERS
from .ir import Fused, Method, Plan, SecondDerivative
from .operations import eager_operations, one_elementwise_operation

__all__ = [
    "INDUCTOR_INACCURATE",
    "INDUCTOR_LESS_ACCURATE_HELPERS",
    "Fused",
    "Method",
    "Plan",
    "SecondDerivative",
    "eager_operations",
    "make_plan",
    "one_elementwise_operation",
]
