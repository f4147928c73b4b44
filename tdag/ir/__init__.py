"""The data model: types, symbols, op records and their registry, nodes, TDAGs, Programs, the
verifier, the interpreter, the text form and files."""
