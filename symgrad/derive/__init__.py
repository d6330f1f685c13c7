"""Stage 2: gradients, bounded simplification, stability rewrites and sampling domains.

The modules, by job: :mod:`.gradients` (:func:`derive`), :mod:`.differentiate`,
:mod:`.second_order` (double backward), :mod:`.save_speed` (``--save speed``) and
:mod:`.domain` (sampling intervals). This package exports what the planner and the API use.
"""

from .derivation import Derivation as Derivation
from .gradients import derive as derive
from .save_speed import with_derivatives_as_outputs as with_derivatives_as_outputs
from .second_order import autograd_loses_second_derivatives as autograd_loses_second_derivatives
from .second_order import differentiable_form as differentiable_form
from .second_order import exact_second_derivatives as exact_second_derivatives
