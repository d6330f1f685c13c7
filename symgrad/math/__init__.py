"""The mathematics every stage shares: symgrad's SymPy functions with stable torch kernels
(:mod:`.functions`), removable singularities as Taylor series (:mod:`.series`), float
constants (:mod:`.numbers`), mpmath probes (:mod:`.probe`, :mod:`.accuracy`) and bounded
simplification (:mod:`.simplify`)."""
