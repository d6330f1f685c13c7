"""Stage 1, the frontend: the grammar of supported functions (:mod:`.grammar`) and the safe
parser that turns a spec's text into SymPy expressions (:mod:`.parse`)."""
