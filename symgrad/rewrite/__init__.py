"""Numerically stable rewrites, applied to forward expressions and derivatives alike.

A rewrite applied only to the forward comes back in the derivative (d/dx log1p(u) is
u'/(1+u) again), so :func:`~symgrad.rewrite.engine.stabilize` runs after differentiation and simplification too,
and its rules also match the forms ``simplify`` produces (``x*exp(x)/(exp(x) + 1)``,
``(x + exp(x) + 1)/(4*cosh(x/2)**2)``).

Every rule is an exact identity on the real numbers wherever the original expression is
defined (tests check this at random points with mpmath); the new forms are finite and
accurate in float32/float64 wherever the mathematics is. The engine (:mod:`.engine`) tries
the rules in the order of its registry, :data:`~symgrad.rewrite.engine.RULES`, which says
in a line each why a rule sits where it does; the families are modules of their own
(:mod:`.exp_log`, :mod:`.roots`, :mod:`.sums`, :mod:`.tails`, :mod:`.piecewise`,
:mod:`.removable`; :mod:`.cost` chooses cheaper forms). The rewrites, in order:

1. Bottom-up, on every node until nothing changes (our own rules, in place of
   ``sympy.codegen.rewriting``, whose ``log1p_opt``/``expm1_opt`` factor the whole
   expression: tens of seconds on a 40-term one):

   - ``log(1 + u)`` -> ``log1p(u)``; ``c*exp(u) - c`` -> ``c*expm1(u)`` (as SymPy's
     ``expm1_opt``: while the number term shrinks); ``c - c*cos(u)`` -> ``2c*sin(u/2)**2``.
   - ``log(c*exp(v)*(1+exp(w)))`` -> ``log(c) + v + softplus(w)``; ``log(exp(a)+exp(b))``
     -> ``logaddexp(a, b)`` (three or more: nested); ``log1p(exp(u))`` -> ``softplus(u)``;
     ``log(sigmoid(u))`` -> ``-softplus(-u)``; ``log(c*sinh(u))`` -> ``log(|c|) +
     log_sinh(+-u)`` (sinh overflows), and out of a ratio or a power (_log_sinh_ratio:
     ``log(x/sinh(x))``); ``log(c*tanh(u))`` -> ``log(|c|) - log1p(2/expm1(+-2u))``;
     ``log(p*exp(a) - p*exp(b))`` -> ``log(p) + a + log1mexp(b - a)``, and its derivatives'
     ratios ``exp(c)*(p*exp(a) - p*exp(b))**-k`` likewise (_rule_exp_difference_ratio).
   - sums: ``c - c*tanh(u)**2`` -> ``c/cosh(u)**2``, and ``c + k*tanh(u)**2`` with ``c + k``
     small next to ``k`` -> ``(c + k) - k/cosh(u)**2``; ``c + c*tanh(u)`` -> ``2c*sigmoid(2u)``;
     ``c + c*erf(u)`` -> ``2c*ndtr(sqrt(2)*u)`` (SymPy turns ``erfc(-u)`` back into
     ``2 - erfc(u)``, which cancels); ``c - c*sigmoid(u)`` -> ``c*sigmoid(-u)``;
     ``u - softplus(u)`` -> ``-softplus(-u)``; ``sigmoid(u) + sigmoid(-u)`` -> ``1``,
     ``sigmoid(u) - sigmoid(-u)`` -> ``tanh(u/2)``; ``c/tanh(u) - c`` -> ``2c/expm1(2u)``;
     ``v + softplus(-2v) - log(2)`` ->
     ``log(cosh(v))``; (a Float equal to a rational counts as it);
     ``c*sigmoid(a) - c*sigmoid(b)``, a number apart, -> a product (_rule_sigmoid_difference);
     a power minus its value at 0, ``A**p - B**p`` -> ``(A - B)*S`` for an integer p from 1
     to 8, ``S`` the sum of ``A**j*B**(p-1-j)``, ``-(A - B)/(A*B)`` for p = -1 (``c/(a + v) -
     c/a`` -> ``-c*v/(a*(a + v))``), in the forward's formulas for ``p = j + m/q`` with
     ``q`` 2 or 4 (or ``-m/q``) ``r**m - s**m`` of the roots ``r = A**(1/q)``, ``s =
     B**(1/q)``, with ``r - s = (A - B)/(r**(q-1) + ... + s**(q-1))``
     (_root_power_difference), for p < -1 the same of ``1/A`` and ``1/B``
     (_reciprocal_power_difference), else ``power_excess`` (the expm1 form near 0)
     (_rule_power_minus_value).
   - ratios of exponentials: a product with a factor ``(p1*exp(a1) + p2*exp(a2))**-k``,
     ``cosh(u)**-k`` or ``sigmoid(u)**k`` (next to an ``exp``) is rewritten term by term as
     ``exp(r) * sigmoid(w)**j * sigmoid(-w)**(k-j)``, with the exponent ``j`` taken from the
     numerator's exponentials, so no ``exp`` overflows: ``exp(x)/(1+exp(x)) -> sigmoid(x)``,
     ``1/(1+exp(-x)) -> sigmoid(x)``, ``(x + exp(x) + 1)/(4*cosh(x/2)**2) ->
     (1 + x*sigmoid(-x))*sigmoid(x)``. (``1/cosh(u)**2`` alone stays: it is accurate.)
   - ``exp(a)/(exp(a) + exp(b) + exp(c))`` -> ``exp(-logsumexp(0, b - a, c - a))``
     (softmax; logsumexp as nested ``logaddexp``); ``exp(a)*exp(b)`` -> ``exp(a + b)``;
     ``exp(c - logsumexp(a_i))`` -> ``exp(-logsumexp(a_i - c))``, so the large parts
     cancel exactly; ``exp(-k*softplus(u))`` -> ``sigmoid(-u)**k``;
     ``(1 + exp(v))**k/expm1(v)**k`` -> ``tanh(v/2)**-k`` and ``sigmoid(u)**k/sigmoid(-u)**k``
     -> ``exp(k*u)`` (_rule_coth_half).
   - ``sqrt(a**2 + b**2)`` (any non-integer power of it, any number of squares, numbers
     included: ``1/sqrt(x**2 + 1)``) -> ``hypot(a, b)``; then ``hypot(a, b) - b`` for a
     positive number ``b`` -> ``hypot_excess(a, b)``, a quotient without the cancellation
     (the pseudo-Huber loss).
   - ``x*log(y)`` -> ``xlogy(x, y)`` (finite at ``x = y = 0``).
   - the normal tails: ``log(c*ndtr(u))`` -> ``log(c) + log_ndtr(u)`` (for c = 2, below
     u = -1; ``log1p(erf(u/sqrt(2)))`` above), ``log(c*erfc(u))`` -> the same with
     ``2c*ndtr(-sqrt(2)*u)``, ``log(c*erf(u))`` -> ``log(c) + log_erf(u)``; and (after these rules, _normal_tail_products) a product of
     ``exp(v)`` with ``erfc(u)**k`` or ``ndtr(u)**k`` (integer k, ``|k| <= 4``) whose
     quadratic cancels -> ``erfcx`` in the tail: ``exp(u**2)*erfc(u)`` -> ``erfcx(u)``,
     ``exp(-u**2/2)/ndtr(u)`` -> ``2/erfcx(-u/sqrt(2))`` for u < 0.
   - ``atanh(tanh(u))`` and ``asinh(sinh(u))`` -> ``u`` (real ``u``): evaluated as written,
     tanh rounds to 1 and sinh overflows (atanh(tanh(-16.72)) is -16.7205 in float64).

   - ``acosh(1 + u)`` -> ``log1p(u + sqrt(u)*sqrt(u + 2))`` (1 + u rounds to 1).
   - a huge and a tiny factor kept apart: ``exp(a)*cosh(b)**k`` -> ``((exp(a/k + b) +
     exp(a/k - b))/2)**k``; ``r*sinh(u) -+ r*cosh(u)`` -> ``+-r*exp(+-u)``.

   Then, for a sum, ``factor_terms`` is tried and kept if it costs fewer operations. After
   these rules (which would undo them), in order: the normal tails' products (above); a
   root plus what it nearly cancels, ``hypot(u, b) + u`` for ``u`` of either sign and a
   number ``b`` (squareplus, ``sqrt(x**2 + 1) - x``, ``x/hypot(x, b) + 1``) ->
   ``hypot_plus(u, b)``, and ``hypot_plus(u, b) - hypot(u, b)`` -> ``u`` (_hypot_sums); a
   sum of sinh and cosh terms over ``cosh(u)**k``, distributed (_cosh_power_sums); these
   two run the rules again once where they changed something, which leave their results
   alone; then ``exp(k*v)*sigmoid(-c*exp(v))`` -> ``exp(k*v - c*exp(v))*sigmoid(c*exp(v))``
   (_sigmoid_exp_products), a sum with ``c*expm1(u)`` times ``exp(-u)`` or ``sinh(u/2)**-2``,
   distributed so that they meet; a sum with exps times an exp that falls doubly
   exponentially (``exp(-x - exp(-x))``), distributed so that the exps join; and
   ``expm1(v)**k*exp(u)`` -> ``where(k*v > 20, (-expm1(-v))**k*exp(u + k*v), ...)``
   (_expm1_partners); a difference of squares ``1 - x**2`` -> ``(1 - x)*(1 + x)``
   (_difference_of_squares); and powers that overflow where the log or ratio they feed does
   not, ``log(s*(c + k*u**p))`` -> ``log(s*c) + log1p((k/c)*u**p)``, ``log1p(k*u**p)`` and
   ``r*u**a*(c + k*u**p)**-m`` -> a where on |u| with the reciprocal power beyond
   (_overflowing_powers).
2. Removable singularities at 0 of a symbol (``sin(x)/x``, ``expm1(x)/x``, ``x/sin(x)``,
   ``log1p(x)/x`` and their derivatives), or at a dyadic point where a denominator
   vanishes (``log(x)/(x - 1)`` at 1): a :func:`~symgrad.symgrad.math.series.removable`
   function, printed as a Taylor polynomial near that point and the closed form at a
   guarded argument elsewhere.
3. Piecewise branches that are not polynomials get their symbols guarded (the "double
   where"), so the untaken branch is evaluated at a safe point and cannot leak inf/NaN
   into gradients.
"""
