"""Small pattern helpers that the rule families share: numbers, exponential terms, affine
forms, and the limits on how far a rule may expand an expression.
"""

from __future__ import annotations

import contextvars

import sympy

from ..math.functions import sigmoid


_MAX_PASSES = 12


# Whether _rule_power_minus_value may write a power minus its value as sums of roots or of
# reciprocals (stabilize's root_sums): set for the forward's formulas only.

_ROOT_SUMS = contextvars.ContextVar("root_sums", default=False)


_EXPAND_MAX_OPS = 40


def _expand(e: sympy.Expr) -> sympy.Expr:
    """``expand`` on small expressions only (exponents, arguments): bounded time."""
    return sympy.expand(e) if sympy.count_ops(e) <= _EXPAND_MAX_OPS else e


def _number(e: sympy.Expr) -> bool:
    return e.is_number and e.is_extended_real is True


def _exp_term(term: sympy.Expr):
    """``p*exp(a)`` -> (p, a); a number ``p`` -> (p, 0); else None."""
    coeff, rest = term.as_coeff_Mul()
    if rest == 1:
        return (coeff, sympy.Integer(0)) if _number(coeff) else None
    if isinstance(rest, sympy.exp):
        return coeff, rest.args[0]
    if rest.is_Pow and isinstance(rest.base, sympy.exp) and _number(rest.exp):
        return coeff, rest.exp * rest.base.args[0]
    return None


def _normalize_denominator(base: sympy.Expr):
    """``base`` as ``c*exp(v)*(1 + exp(w))`` with a positive number ``c``: (c, v, w) or None."""
    if isinstance(base, sympy.cosh):
        u = base.args[0]
        return sympy.S.Half, -u, 2 * u
    if isinstance(base, sympy.exp) or not base.is_Add or len(base.args) != 2:
        return None
    first, second = (_exp_term(t) for t in base.args)
    if first is None or second is None:
        return None
    if first[1] == 0 and second[1] == 0:
        return None
    if second[1] == 0:  # the constant first, so 1 + exp(w) keeps the user's sign of w
        first, second = second, first
    (p1, a1), (p2, a2) = first, second
    if not (p1.is_positive and p2.is_positive):
        return None
    return p1, a1, _expand(a2 - a1 + sympy.log(p2 / p1))


def _split_exponent(exponent: sympy.Expr, w: sympy.Expr, k: sympy.Expr):
    """``exponent = j*w + r`` with ``0 <= j <= k`` chosen to cancel ``w``'s terms."""
    w_terms = _expand(w).as_coefficients_dict()
    keys = sorted((m for m in w_terms if not m.is_number), key=sympy.default_sort_key)
    if not keys:
        return sympy.Integer(0), exponent
    m0 = keys[0]
    j = _expand(exponent).as_coefficients_dict().get(m0, sympy.Integer(0)) / w_terms[m0]
    if not _number(j):
        j = sympy.Integer(0)
    j = sympy.Min(sympy.Max(j, 0), k)
    return j, _expand(exponent - j * w)


def _exp_factors(term: sympy.Expr):
    """Split a product into the sum of its exponentials' exponents and the other factors."""
    exponent, others = sympy.Integer(0), []
    for f in sympy.Mul.make_args(term):
        if isinstance(f, sympy.exp):
            exponent += f.args[0]
        elif f.is_Pow and isinstance(f.base, sympy.exp) and _number(f.exp):
            exponent += f.exp * f.base.args[0]
        else:
            others.append(f)
    return exponent, sympy.Mul(*others)


def _has_exp(e: sympy.Expr) -> bool:
    return e.has(sympy.exp)


def _denominator_factor(f: sympy.Expr):
    """A factor as ``c**-k * exp(-k*v) * (1 + exp(w))**-k``: (kind, c, v, w, k) or None.

    ``kind`` is "sum" for a power of a sum of exponentials, "cosh" or "sigmoid".
    """
    if isinstance(f, sigmoid) or (f.is_Pow and isinstance(f.base, sigmoid) and _number(f.exp) and f.exp.is_positive):
        base, power = (f, sympy.Integer(1)) if isinstance(f, sigmoid) else (f.base, f.exp)
        return "sigmoid", sympy.Integer(1), sympy.Integer(0), _expand(-base.args[0]), power
    if f.is_Pow and _number(f.exp) and f.exp.is_negative:
        norm = _normalize_denominator(f.base)
        if norm is not None:
            kind = "cosh" if isinstance(f.base, sympy.cosh) else "sum"
            return (kind, *norm, -f.exp)
    return None


def _replace_each(expr: sympy.Expr, kind: type, rule) -> sympy.Expr:
    """``expr`` with each node of ``kind`` that ``rule`` rewrites (a result, not None)
    replaced, in one bottom-up pass, each distinct node tried once: the passes after the
    bottom-up rules."""
    made: dict[sympy.Expr, sympy.Expr | None] = {}

    def rewritten(node: sympy.Expr) -> sympy.Expr | None:
        if node not in made:
            made[node] = rule(node)
        return made[node]

    return expr.replace(lambda node: isinstance(node, kind) and rewritten(node) is not None, rewritten)


def _size(e: sympy.Expr) -> int:
    return int(sympy.count_ops(e)) + sum(1 for a in sympy.preorder_traversal(e) if a.is_Symbol)


_SQRT2 = sympy.sqrt(2)


_LOG2 = sympy.log(2)


def same_number(a: sympy.Expr, b: sympy.Expr) -> bool:
    """``a == b`` for numbers, a Float equal to a Rational included: SymPy's Float(0.5) is
    not S.Half, and ``sigmoid(x) - 0.5`` should meet the rule ``sigmoid(x) - 1/2`` does."""
    if a == b:
        return True
    if (a.is_Float or b.is_Float) and all(n.is_Rational or n.is_Float for n in (a, b)):
        return sympy.Rational(a) == sympy.Rational(b)
    return False


def _affine(v: sympy.Expr) -> bool:
    """Whether ``v`` is a sum of numbers times symbols: it overflows only where its inputs
    are near the largest float. (k*v/(a + v) is inf/inf = nan where v overflows, and the sum
    it replaces was k: 1/(1 + x**2) - 1 from |x| = 1.9e19 in float32, 1/(1 + sinh(x)) - 1
    from x = 89.)"""
    terms = sympy.Add.make_args(v)
    return all(t.as_coeff_Mul()[1].is_Symbol for t in terms)


def _positive_part(f: sympy.Expr) -> sympy.Expr | None:
    """``u`` where ``f`` is Max(u, 0), else None."""
    if isinstance(f, sympy.Max) and len(f.args) == 2 and sympy.S.Zero in f.args:
        return f.args[1] if f.args[0] == 0 else f.args[0]
    return None


def _minus_abs(u: sympy.Expr) -> sympy.Expr:
    """-|u| as where(u > 0, -u, u) (see _rule_large_part for why not abs)."""
    return sympy.Piecewise((-u, u > 0), (u, True))


def _is_minus_abs(u: sympy.Expr) -> bool:
    return isinstance(u, sympy.Piecewise) and len(u.args) == 2 and u.args[0][0] == -u.args[1][0]
