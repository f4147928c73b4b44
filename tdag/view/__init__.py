"""view: the program for people and graph tools: ``to_networkx`` and the HTML page
(``tdag show FILE -o graph.html``)."""
from tdag.view.digraph import to_networkx

__all__ = ["to_networkx"]
