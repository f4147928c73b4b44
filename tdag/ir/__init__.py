"""The data model: types, symbols, op records and their registry, nodes, TDAGs, Programs, the
verifier, the interpreter, the text form and files; the one node emitter (``emit``) and the
one name minter (``names``)."""
# the printer installs str() of TDAG and Program (the data model does not import its printer)
from tdag.ir import printer  # noqa: F401
